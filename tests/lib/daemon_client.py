"""The live-daemon tests' shared library: Daemon (resnetd on a free loopback
port with the CPU engine and the reference weights), HTTP and metrics
helpers, and main, the check runner every test program (daemon_checks.py,
reload_client.py, ...) calls with its own list of checks. Standard library
only (http.client, socket, threading).

A test program, run through tests/lib/run_client.sh, takes
  --resnetd BIN --classify BIN --ref DIR --labels FILE
  [--promtool-check SCRIPT] [--only NAME ...]
and prints one line per check; it exits 0 when all pass, 1 otherwise.
"""

import argparse
import http.client
import json
import os
import re
import signal
import socket
import struct
import subprocess
import tempfile
import threading
import time

TIMEOUT = 60  # seconds; any single HTTP exchange


class Daemon:
    """A resnetd process on 127.0.0.1 with an ephemeral port."""

    def __init__(self, opts, *extra, env=None, config=None):
        """config: a configuration file that names the weights and labels
        (then not given as flags, which would override it on a reload)."""
        self.log = tempfile.NamedTemporaryFile(prefix="resnetd-", suffix=".log", delete=False)
        model = ["--config", config] if config else [
            "--weights", os.path.join(opts.ref, "weights.safetensors"), "--labels", opts.labels]
        args = [opts.resnetd] + model + ["--device", "cpu", "--listen", "127.0.0.1:0",
                                         "--engine-threads", "2", "--request-timeout-ms", "120000"] + list(extra)
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT,
                                     env=dict(os.environ, **(env or {})))
        self.port = None
        deadline = time.time() + 60
        while time.time() < deadline:
            text = self.text()
            m = re.search(r"\(port (\d+)\)", text)
            if m and "ready" in text:
                self.port = int(m.group(1))
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.stop(signal.SIGKILL)
        raise AssertionError("resnetd did not become ready:\n" + self.text())

    def text(self):
        with open(self.log.name, "r", errors="replace") as f:
            return f.read()

    def conn(self):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=TIMEOUT)

    def request(self, method, path, body=None, headers=None):
        c = self.conn()
        try:
            c.request(method, path, body=body, headers=headers or {})
            r = c.getresponse()
            data = r.read()
            return r.status, dict((k.lower(), v) for k, v in r.getheaders()), data
        finally:
            c.close()

    def metrics(self):
        status, _, body = self.request("GET", "/metrics")
        assert status == 200, status
        return body.decode()

    def stop(self, sig=signal.SIGTERM, timeout=60):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
            raise AssertionError("resnetd did not exit within %d s after %s" % (timeout, sig))
        finally:
            os.unlink(self.log.name)
        return rc


def metric(text, name, labels=None):
    """The value of one sample in Prometheus text, or None."""
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)", line)
        if not m or m.group(1) != name:
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        if labels is None or all(got.get(k) == v for k, v in labels.items()):
            return float(m.group(3))
    return None


def wait_metric(d, name, labels, at_least, limit_s):
    """The metric once it reaches at_least, or its value after limit_s:
    counters taken when an answer has been sent can lag the client."""
    deadline = time.time() + limit_s
    v = None
    while time.time() < deadline:
        v = metric(d.metrics(), name, labels)
        if v is not None and v >= at_least:
            return v
        time.sleep(0.1)
    return v


def multipart(files, field="image", boundary="resnetd-test-boundary-7Q2"):
    parts = []
    for i, data in enumerate(files):
        parts.append(b"--" + boundary.encode() + b"\r\n"
                     b'Content-Disposition: form-data; name="' + field.encode() +
                     b'"; filename="img%d.jpg"\r\n' % i + b"Content-Type: image/jpeg\r\n\r\n" + data + b"\r\n")
    body = b"".join(parts) + b"--" + boundary.encode() + b"--\r\n"
    return body, {"Content-Type": "multipart/form-data; boundary=" + boundary}


def read_file(path):
    with open(path, "rb") as f:
        return f.read()


def ok_classify(d, data, top_k=5):
    status, _, body = d.request("POST", "/classify?top_k=%d" % top_k, data, {"Content-Type": "image/jpeg"})
    assert status == 200, (status, body[:300])
    # A newline at the end; scores with at most 9 significant digits (an
    # FP32 value's round trip), not 17.
    assert body.endswith(b"\n"), body[-40:]
    for num in re.findall(rb"[0-9.]+(?:e[-+]?[0-9]+)?", body):
        if b"." in num:
            assert len(num.split(b"e")[0].replace(b".", b"").lstrip(b"0")) <= 9, num
    return json.loads(body)


def raw_http(port, payload, read_timeout=30):
    """Sends raw bytes, returns everything the server sends until it closes
    the connection or read_timeout passes."""
    s = socket.create_connection(("127.0.0.1", port), timeout=read_timeout)
    try:
        s.sendall(payload)
        chunks = []
        while True:
            try:
                b = s.recv(65536)
            except (ConnectionResetError, socket.timeout):
                break
            if not b:
                break
            chunks.append(b)
            if b"\r\n\r\n" in b"".join(chunks) and b"Content-Length" in b"".join(chunks):
                head, _, rest = b"".join(chunks).partition(b"\r\n\r\n")
                m = re.search(rb"Content-Length: (\d+)", head)
                if m and len(rest) >= int(m.group(1)):
                    break
        return b"".join(chunks)
    finally:
        s.close()


def reset_close(s):
    """Closes with a TCP reset (SO_LINGER 0): a client gone for good. A plain
    close() looks like shutdown(SHUT_WR) to the server, and a half-closed
    client still wants its answer."""
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()


def status_of(raw):
    m = re.match(rb"HTTP/1\.[01] (\d{3})", raw)
    return int(m.group(1)) if m else None


def error_of(body):
    e = json.loads(body)["error"]
    assert set(e) == {"status", "code", "message"}, e
    return e


def concurrent(n, fn):
    results = [None] * n
    def run(i):
        try:
            results[i] = fn(i)
        except Exception as e:  # recorded and checked by the caller
            results[i] = e
    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT * 2)
    return results


# ---- checks other test programs reuse ----------------------------------------

def check_each_error_status(opts, d):
    jpeg = read_file(os.path.join(opts.ref, "jpeg", "s224x224.jpg"))
    png = read_file(os.path.join(opts.ref, "bad", "not_jpeg.png"))
    # A JPEG whose frame header claims 20000x20000 pixels: over max_pixels.
    huge = bytearray(jpeg)
    i = 2
    while i < len(huge):
        marker, seglen = huge[i + 1], int.from_bytes(huge[i + 2:i + 4], "big")
        if marker in (0xC0, 0xC1, 0xC2):
            huge[i + 5:i + 9] = (20000).to_bytes(2, "big") + (20000).to_bytes(2, "big")
            break
        i += 2 + seglen
    jpg = {"Content-Type": "image/jpeg"}
    no_image, mp = multipart([jpeg], field="picture")
    cases = [
        ("empty body", "POST", "/classify", b"", jpg, 400, "empty_body"),
        ("truncated JPEG", "POST", "/classify", jpeg[:len(jpeg) // 3], jpg, 400, None),
        ("corrupt JPEG", "POST", "/classify", jpeg[:200] + b"\x00" * 50 + b"\xff\xd9", jpg, 400, None),
        ("top_k=0", "POST", "/classify?top_k=0", jpeg, jpg, 400, "bad_parameter"),
        ("top_k=abc", "POST", "/classify?top_k=abc", jpeg, jpg, 400, "bad_parameter"),
        ("top_k=1001", "POST", "/classify?top_k=1001", jpeg, jpg, 400, "bad_parameter"),
        ("unknown parameter", "POST", "/classify?topk=1", jpeg, jpg, 400, "bad_parameter"),
        ("multipart without image", "POST", "/classify", no_image, mp, 400, "missing_image"),
        ("broken multipart", "POST", "/classify", b"--x\r\nnot closed", {"Content-Type": "multipart/form-data; boundary=x"}, 400, "invalid_multipart"),
        ("pixels over limit", "POST", "/classify", bytes(huge), jpg, 413, "too_large"),
        ("text/plain", "POST", "/classify", b"hello", {"Content-Type": "text/plain"}, 415, "unsupported_media_type"),
        ("PNG bytes", "POST", "/classify", png, jpg, 415, "not_jpeg"),
        ("text bytes", "POST", "/classify", b"this is not an image", jpg, 415, "not_jpeg"),
        ("unknown path", "GET", "/nope", None, {}, 404, "not_found"),
        ("GET /classify", "GET", "/classify", None, {}, 405, "method_not_allowed"),
        ("POST /healthz", "POST", "/healthz", b"x", {}, 405, "method_not_allowed"),
    ]
    for name, method, path, body, headers, want, code in cases:
        status, h, rbody = d.request(method, path, body, headers)
        assert status == want, (name, status, rbody[:200])
        assert h.get("content-type") == "application/json", (name, h)
        e = error_of(rbody)
        assert e["status"] == want and e["message"], (name, e)
        if code:
            assert e["code"] == code, (name, e)
        if want == 405:
            assert h.get("allow") in ("POST", "GET, HEAD"), (name, h)
        ok_classify(d, jpeg)   # still serving
    # curl -d @FILE: form-urlencoded, the file's CR and LF bytes dropped. The
    # error says how to send it; the same bytes as image/jpeg get no hint.
    stripped = jpeg.replace(b"\r", b"").replace(b"\n", b"")
    assert stripped != jpeg
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    status, _, rbody = d.request("POST", "/classify", stripped, form)
    assert status == 400 and "--data-binary" in error_of(rbody)["message"], (status, rbody[:300])
    status, _, rbody = d.request("POST", "/classify", stripped, jpg)
    assert status == 400 and "--data-binary" not in error_of(rbody)["message"], (status, rbody[:300])
    text = d.metrics()
    assert metric(text, "resnetd_rejected_total", {"reason": "bad_input"}) >= 12, text
    return "%d error cases, 200 after each; curl -d's mangled upload hinted at --data-binary" % len(cases)


def main(checks):
    """Runs checks, (name, function, uses_shared) tuples, as the command
    line selects; each test program passes its own list. A check that uses
    the shared daemon is called with it, after opts."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--resnetd", required=True)
    ap.add_argument("--classify", required=True)
    ap.add_argument("--ref", required=True)
    ap.add_argument("--labels", required=True)
    ap.add_argument("--promtool-check")
    ap.add_argument("--only", nargs="*")
    opts = ap.parse_args()
    failed = 0
    shared = None
    for name, fn, uses_shared in checks:
        if opts.only and name not in opts.only:
            continue
        t0 = time.time()
        try:
            if uses_shared:
                if shared is None:
                    shared = Daemon(opts)
                note = fn(opts, shared)
            else:
                note = fn(opts)
            print("ok   %-34s %5.1fs  %s" % (name, time.time() - t0, note or ""), flush=True)
        except Exception as e:
            failed += 1
            print("FAIL %-34s %5.1fs  %r" % (name, time.time() - t0, e), flush=True)
            if os.environ.get("RESNETD_TEST_TRACE"):
                import traceback
                traceback.print_exc()
    if shared is not None:
        text = shared.text()
        rc = shared.stop()
        if rc != 0:
            failed += 1
            print("FAIL shared daemon exited %d:\n%s" % (rc, text))
    return 1 if failed else 0
