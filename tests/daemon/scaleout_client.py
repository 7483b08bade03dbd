#!/usr/bin/python3
"""Scale-out test: two resnetd daemons (CPU engine, reference weights)
behind a real nginx running etc/nginx/resnetd.conf, with that file's
backend addresses and listen port changed to loopback ones and nothing
else. Under steady load through nginx one backend gets SIGTERM: every
request must get a 200, the SIGTERM'd daemon must exit 0, and the other
backend must take the load. A control run of the same file with
proxy_next_upstream off must lose requests, which shows that the first run
would notice if the retry policy stopped covering a drain.

nginx runs in the foreground on 127.0.0.1 with every file it writes (pid,
logs, temporary bodies) in a temporary directory; as root it runs as
nobody. Run through tests/daemon/test_scaleout.sh (via tests/lib/run_client.sh), which
passes the daemon options and skips without nginx or reference data.
"""

import http.client
import json
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import daemon_client  # noqa: E402
from daemon_client import Daemon, read_file  # noqa: E402

SHIPPED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "etc", "nginx", "resnetd.conf")
CLIENTS = 24            # concurrent clients posting through nginx
SETTLE_ANSWERS = 48     # 200s through nginx before the SIGTERM
AFTER_EXIT_S = 3.0      # load kept up after the SIGTERM'd daemon has exited
IMAGES = ["s224x224", "s256x300", "s300x256", "s333x500"]
TIMEOUT = 120           # seconds; any single exchange or wait, generous for a loaded 2-core CI machine
NGINX = os.environ.get("RESNETD_NGINX", "nginx")
RETRY_LINE = "proxy_next_upstream error timeout http_502 http_503 non_idempotent;"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def nginx_conf(tmp, listen_port, backends, retry="shipped"):
    """The shipped file inside a minimal main/http context, with the
    backends and listen port swapped for loopback ones. Each substitution
    must match exactly, so a change to the shipped file breaks this test
    instead of silently testing something else."""
    with open(SHIPPED) as f:
        text = f.read()
    servers = re.findall(r"^(\s*server\s+)192\.0\.2\.\d+:8080(\s[^;\n]*)?;", text, re.M)
    assert len(servers) == 2, "expected two example 'server 192.0.2.x:8080' lines: %r" % servers
    ports = iter(backends)
    text = re.sub(r"^(\s*server\s+)192\.0\.2\.\d+:8080((?:\s[^;\n]*)?);",
                  lambda m: "%s127.0.0.1:%d%s;" % (m.group(1), next(ports), m.group(2)), text, flags=re.M)
    text, n = re.subn(r"^(\s*)listen 80;", r"\g<1>listen 127.0.0.1:%d;" % listen_port, text, flags=re.M)
    assert n == 1, "expected one 'listen 80;' in %s" % SHIPPED
    assert text.count(RETRY_LINE) == 1, "expected '%s' once in %s" % (RETRY_LINE, SHIPPED)
    # The controls: no retries at all, or no retries of a POST once sent.
    if retry == "off":
        text = text.replace(RETRY_LINE, "proxy_next_upstream off;")
    elif retry == "idempotent_only":
        text = text.replace(RETRY_LINE, RETRY_LINE.replace(" non_idempotent", ""))
    paths = "\n".join("    %s_temp_path %s/%s;" % (k, tmp, k) for k in
                      ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    return """daemon off;
master_process on;
worker_processes 1;
pid %(tmp)s/nginx.pid;
error_log %(tmp)s/error.log notice;
events { worker_connections 512; }
http {
%(paths)s
    log_format scaleout '$msec $request_time $status $request_method $uri "$upstream_addr" "$upstream_status"';
    access_log %(tmp)s/access.log scaleout;
%(text)s
}
""" % {"tmp": tmp, "paths": paths, "text": text}


class Nginx:
    """nginx in the foreground on 127.0.0.1, unprivileged: as root it is
    started as nobody, and everything it writes is under its own temporary
    directory."""

    def __init__(self, binary, backends, retry="shipped"):
        self.tmp = tempfile.mkdtemp(prefix="resnetd-nginx-")
        os.chmod(self.tmp, 0o755)
        self.port = free_port()
        conf = os.path.join(self.tmp, "nginx.conf")
        with open(conf, "w") as f:
            f.write(nginx_conf(self.tmp, self.port, backends, retry))
        cmd = [binary, "-p", self.tmp + "/", "-c", conf, "-e", os.path.join(self.tmp, "error.log")]
        if os.geteuid() == 0:
            nobody = pwd.getpwnam("nobody")
            os.chown(self.tmp, nobody.pw_uid, nobody.pw_gid)
            cmd = ["setpriv", "--reuid=%d" % nobody.pw_uid, "--regid=%d" % nobody.pw_gid,
                   "--clear-groups", "--inh-caps=-all"] + cmd
        t = subprocess.run(cmd + ["-t", "-q"], capture_output=True, text=True)
        assert t.returncode == 0, "nginx -t: %s%s" % (t.stdout, t.stderr)
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        deadline = time.time() + TIMEOUT
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=5).close()
                return
            except OSError:
                if self.proc.poll() is not None:
                    break
                time.sleep(0.05)
        self.proc.kill()
        self.proc.wait()
        raise AssertionError("nginx did not start:\n" + self.error_log())

    def error_log(self):
        try:
            with open(os.path.join(self.tmp, "error.log"), errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def stop(self):
        """Graceful stop (SIGQUIT), which also flushes the access log;
        returns nginx's exit status and the access log's lines."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)
        try:
            rc = self.proc.wait(TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        try:
            with open(os.path.join(self.tmp, "access.log")) as f:
                lines = f.read().splitlines()
        except OSError:
            lines = []
        return rc, lines

    def cleanup(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.tmp, ignore_errors=True)


def parse_access(lines):
    """(answered at, status, method, uri, [upstream addrs], [upstream
    statuses], received at) for each line, times as time.time()'s."""
    def split(s):
        return [x.strip() for x in re.split(r"[,:]\s", s) if x.strip()] if s != "-" else []
    out = []
    for line in lines:
        m = re.match(r'(\S+) (\S+) (\d+) (\S+) (\S+) "([^"]*)" "([^"]*)"$', line)
        assert m, "access log line: %r" % line
        end = float(m.group(1))
        out.append((end, int(m.group(3)), m.group(4), m.group(5), split(m.group(6)), split(m.group(7)),
                    end - float(m.group(2))))
    return out


def top1(res):
    return [r["predictions"][0]["index"] for r in res["results"]]


def tear_down(ngx, a, b):
    """After a scenario, passed or failed: nginx gone, backend b (None once
    stopped) killed, backend a killed if still running, else its log removed."""
    if ngx:
        ngx.cleanup()
    if b:
        b.stop(signal.SIGKILL)
    if a.proc.poll() is None:
        a.stop(signal.SIGKILL)
    elif os.path.exists(a.log.name):
        os.unlink(a.log.name)


def scenario(opts, retry):
    """Two daemons behind nginx, load, SIGTERM to the first. Returns what
    the clients saw, the access log and the daemons' exit details."""
    images = [(n, read_file(os.path.join(opts.ref, "jpeg", n + ".jpg"))) for n in IMAGES]
    a = Daemon(opts)
    b = None
    ngx = None
    try:
        b = Daemon(opts)
        # Each image's answer straight from a backend, to check every answer
        # that comes back through nginx.
        want = {}
        for name, data in images:
            want[name] = top1(daemon_client.ok_classify(b, data))
        ngx = Nginx(NGINX, [a.port, b.port], retry)

        outcomes = []   # (sent_at, done_at, status or exception name, body ok, retry-after)
        lock = threading.Lock()
        stop = threading.Event()

        def client(i):
            c = http.client.HTTPConnection("127.0.0.1", ngx.port, timeout=TIMEOUT)
            k = i
            while not stop.is_set():
                name, data = images[k % len(images)]
                k += 1
                sent = time.time()
                ok, retry_after = False, None
                try:
                    c.request("POST", "/classify", data, {"Content-Type": "image/jpeg"})
                    r = c.getresponse()
                    body = r.read()
                    out = r.status
                    retry_after = r.getheader("Retry-After")
                    if out == 200:
                        ok = top1(json.loads(body)) == want[name]
                    else:
                        ok = json.loads(body)["error"]["status"] == out
                except Exception as e:  # counted as lost, and the connection renewed
                    out = type(e).__name__
                    c.close()
                    c = http.client.HTTPConnection("127.0.0.1", ngx.port, timeout=TIMEOUT)
                with lock:
                    outcomes.append((sent, time.time(), out, ok, retry_after))
            c.close()

        threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
        for t in threads:
            t.start()

        def answered():
            with lock:
                return sum(1 for o in outcomes if o[2] == 200)

        deadline = time.time() + TIMEOUT
        while answered() < SETTLE_ANSWERS and time.time() < deadline:
            time.sleep(0.05)
        t_term = time.time()
        a.proc.send_signal(signal.SIGTERM)
        try:
            rc_a = a.proc.wait(TIMEOUT)
        except subprocess.TimeoutExpired:
            rc_a = "no exit within %d s" % TIMEOUT
        t_exit = time.time()
        log_a = a.text()
        # The survivor alone for a while: enough answers to show it.
        n_exit = answered()
        deadline = time.time() + TIMEOUT
        while time.time() < deadline and (time.time() < t_exit + AFTER_EXIT_S or answered() < n_exit + 2 * CLIENTS):
            time.sleep(0.05)
        stop.set()
        for t in threads:
            t.join(TIMEOUT)
        hung = sum(1 for t in threads if t.is_alive())
        rc_ngx, access = ngx.stop()
        ngx_errors = ngx.error_log()
        rc_b = b.stop()
        b = None
        return {"outcomes": outcomes, "access": parse_access(access), "rc_a": rc_a, "rc_b": rc_b,
                "rc_nginx": rc_ngx, "log_a": log_a, "t_term": t_term, "t_exit": t_exit, "hung": hung,
                "a": "127.0.0.1:%d" % a.port, "nginx_errors": ngx_errors}
    finally:
        tear_down(ngx, a, b)


def kept_alive_during_drain(opts, retry):
    """nginx holds idle kept-alive connections to both backends; the first
    is SIGTERM'd while a stalled upload keeps its drain going, so it still
    answers requests that arrive on those connections: 503 shutting_down.
    Then a few requests through nginx. Returns their (status, body,
    Retry-After), the access log's /classify lines, the first backend's
    address; both daemons must have exited 0."""
    jpeg = read_file(os.path.join(opts.ref, "jpeg", "s224x224.jpg"))
    a = Daemon(opts)
    b = ngx = stall = None
    try:
        b = Daemon(opts)
        ngx = Nginx(NGINX, [a.port, b.port], retry)

        def post():
            c = http.client.HTTPConnection("127.0.0.1", ngx.port, timeout=TIMEOUT)
            try:
                c.request("POST", "/classify", jpeg, {"Content-Type": "image/jpeg"})
                r = c.getresponse()
                return r.status, r.read(), r.getheader("Retry-After")
            finally:
                c.close()

        # Sequential requests: least_conn alternates between two idle
        # backends, and each leaves its upstream connection in nginx's cache
        # (for keepalive_timeout, 5 s; the daemon keeps it for 10 s).
        warm = [post()[0] for _ in range(4)]
        assert warm == [200] * 4, warm
        t_warm = time.time()
        stall = socket.create_connection(("127.0.0.1", a.port), timeout=TIMEOUT)
        stall.sendall(b"POST /classify HTTP/1.1\r\nHost: x\r\nContent-Type: image/jpeg\r\n"
                      b"Content-Length: %d\r\n\r\n" % len(jpeg) + jpeg[:100])
        time.sleep(0.2)
        a.proc.send_signal(signal.SIGTERM)
        deadline = time.time() + TIMEOUT
        while "draining" not in a.text() and time.time() < deadline:
            time.sleep(0.02)
        assert "draining" in a.text(), a.text()
        assert time.time() - t_warm < 4, "nginx's idle upstream connections expire after 5 s: too slow to test"
        got = [post() for _ in range(4)]
        assert a.proc.poll() is None, "the first backend stopped draining too soon: the check proved nothing"
        stall.close()
        stall = None
        rc_a = a.proc.wait(TIMEOUT)
        _, access = ngx.stop()
        rc_b = b.stop()
        b = None
        assert rc_a == 0 and rc_b == 0, (rc_a, rc_b, a.text())
        return got, [x for x in parse_access(access) if x[3] == "/classify"], "127.0.0.1:%d" % a.port
    finally:
        if stall:
            stall.close()
        tear_down(ngx, a, b)


def check_draining_backend_503_is_retried(opts):
    got, access, a = kept_alive_during_drain(opts, "shipped")
    assert [g[0] for g in got] == [200] * 4, [(g[0], g[1][:200]) for g in got]
    after = access[4:]
    retried = [x for x in after if x[4][0] == a]
    assert retried and all(x[5] == ["503", "200"] and x[4][-1] != a for x in retried), after
    return "4 of 4 answered 200; %d sent on a kept-alive connection to the draining backend, " \
           "its 503 retried on the other" % len(retried)


def check_without_non_idempotent_the_503_reaches_the_client(opts):
    got, access, a = kept_alive_during_drain(opts, "idempotent_only")
    lost = [g for g in got if g[0] != 200]
    assert lost, "without non_idempotent every request still got 200: the previous check proves nothing"
    for status, body, retry_after in lost:
        e = json.loads(body)["error"]
        assert status == 503 and e["code"] == "shutting_down" and retry_after == "1", (status, body)
    return "%d of 4 got the draining backend's 503 shutting_down (Retry-After: 1)" % len(lost)


def check_nginx_config_loads(opts):
    t = subprocess.run([NGINX, "-v"], capture_output=True, text=True)
    ngx = Nginx(NGINX, [free_port(), free_port()])
    try:
        # No backend listens: nginx's own error, in the daemon's format.
        c = http.client.HTTPConnection("127.0.0.1", ngx.port, timeout=TIMEOUT)
        c.request("POST", "/classify", b"\xff\xd8", {"Content-Type": "image/jpeg"})
        r = c.getresponse()
        body = r.read()
        c.close()
        assert r.status == 503 and r.getheader("Retry-After") == "1", (r.status, r.getheaders(), body)
        e = json.loads(body)["error"]
        assert e["status"] == 503 and e["code"] == "no_backend", e
        # Bodies over the daemon's max_body_bytes (16 MiB) stop at nginx.
        c = http.client.HTTPConnection("127.0.0.1", ngx.port, timeout=TIMEOUT)
        c.putrequest("POST", "/classify")
        c.putheader("Content-Type", "image/jpeg")
        c.putheader("Content-Length", str((16 << 20) + 1))
        c.endheaders()
        r = c.getresponse()
        r.read()
        c.close()
        assert r.status == 413, r.status
    finally:
        rc, _ = ngx.stop()
        ngx.cleanup()
    assert rc == 0, "nginx exited %s" % rc
    return "%s: 503 no_backend + Retry-After with no backend, 413 over 16 MiB" % (t.stderr.strip() or t.stdout.strip())


def check_sigterm_one_backend_loses_nothing(opts):
    r = scenario(opts, "shipped")
    out, access = r["outcomes"], [x for x in r["access"] if x[3] == "/classify"]
    a = r["a"]
    assert r["hung"] == 0, "%d clients still waiting for an answer" % r["hung"]
    assert r["rc_a"] == 0, "SIGTERM'd daemon: %r\n%s" % (r["rc_a"], r["log_a"])
    assert "draining" in r["log_a"] and "stopped" in r["log_a"], r["log_a"]
    assert r["rc_b"] == 0, "surviving daemon exited %r" % r["rc_b"]
    assert r["rc_nginx"] == 0, "nginx exited %r:\n%s" % (r["rc_nginx"], r["nginx_errors"])
    statuses = {}
    for o in out:
        statuses[o[2]] = statuses.get(o[2], 0) + 1
    bad = [o for o in out if o[2] != 200 or not o[3]]
    assert not bad, "sent %d, not answered 200 with the right classes: %d, e.g. %r; statuses %r" % (
        len(out), len(bad), bad[:5], statuses)
    # nginx logged each request once, 200, as the clients saw them.
    assert len(access) == len(out), "clients sent %d, nginx logged %d" % (len(out), len(access))
    assert all(x[1] == 200 and x[2] == "POST" for x in access), [x for x in access if x[1] != 200][:5]
    # Both backends served before the SIGTERM (least_conn spreads the load).
    final = [(x[0], x[4][-1]) for x in access]
    before = [u for t, u in final if t < r["t_term"]]
    n_a, n_b = sum(1 for u in before if u == a), sum(1 for u in before if u != a)
    assert n_a > 0 and n_b > 0, "before SIGTERM: %d answered by the first backend, %d by the second" % (n_a, n_b)
    # Requests nginx received once the first one had exited (times in
    # milliseconds) all went to the survivor.
    after = [x[4][-1] for x in access if x[6] > r["t_exit"] + 0.002]
    assert len(after) >= CLIENTS and all(u != a for u in after), "after exit: %d answers, %d from the exited backend" % (
        len(after), sum(1 for u in after if u == a))
    # The requests nginx had to send twice: what the first backend said.
    retried = [x for x in access if len(x[4]) > 1]
    firsts = {}
    for x in retried:
        assert x[4][0] == a and x[4][-1] != a and x[5][-1] == "200", x
        firsts[x[5][0]] = firsts.get(x[5][0], 0) + 1
    during = sum(1 for t, _ in final if r["t_term"] <= t <= r["t_exit"])
    return ("sent %d, answered %d, all 200 (%d of them while the first backend drained); "
            "before SIGTERM %d+%d, after its exit %d all by the survivor; "
            "retried on the survivor %d (first answer: %s); drain %.1f s" % (
                len(out), sum(1 for o in out if o[2] == 200), during, n_a, n_b, len(after), len(retried),
                ", ".join("%s x%d" % kv for kv in sorted(firsts.items())) or "none",
                r["t_exit"] - r["t_term"]))


def check_without_retries_requests_are_lost(opts):
    r = scenario(opts, "off")
    out = r["outcomes"]
    assert r["hung"] == 0, "%d clients still waiting for an answer" % r["hung"]
    assert r["rc_a"] == 0 and r["rc_b"] == 0, (r["rc_a"], r["rc_b"], r["log_a"])
    statuses = {}
    for o in out:
        statuses[o[2]] = statuses.get(o[2], 0) + 1
    failed = [o for o in out if o[2] != 200]
    assert failed, ("with proxy_next_upstream off all %d requests still got 200: "
                    "this test could not tell whether the retries work" % len(out))
    # What was lost is a retryable 503 (the daemon's shutting_down, or
    # nginx's no_backend for a refused connection), with Retry-After.
    assert all(o[2] == 503 and o[3] and o[4] for o in failed), failed[:5]
    return "sent %d: %s" % (len(out), ", ".join("%s x%d" % kv for kv in sorted(statuses.items(), key=str)))


CHECKS = [
    ("nginx_config_loads", check_nginx_config_loads, False),
    ("sigterm_one_backend_loses_nothing", check_sigterm_one_backend_loses_nothing, False),
    ("without_retries_requests_are_lost", check_without_retries_requests_are_lost, False),
    ("draining_backend_503_is_retried", check_draining_backend_503_is_retried, False),
    ("without_non_idempotent_the_503_reaches_the_client",
     check_without_non_idempotent_the_503_reaches_the_client, False),
]

if __name__ == "__main__":
    sys.exit(daemon_client.main(CHECKS))
