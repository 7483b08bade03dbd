#!/usr/bin/python3
"""Integration tests for resnetd: start the daemon on a free loopback port
with the CPU engine and the reference weights, and check the HTTP API end to
end (batching, every error status, body limits, timeouts, client_gone,
overload, drain). Standard library only; Daemon, the helpers and the check
runner are tests/lib/daemon_client.py's. Run by tests/daemon/test_daemon.sh.

Usage: daemon_checks.py --resnetd BIN --classify BIN --ref DIR --labels FILE
                        [--promtool-check SCRIPT] [--only NAME ...]
Prints one line per check; exits 0 when all pass, 1 otherwise.
"""

import ast
import hashlib
import json
import math
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import daemon_client  # noqa: E402
from daemon_client import (TIMEOUT, Daemon, check_each_error_status, concurrent, error_of, metric,  # noqa: E402
                           multipart, ok_classify, raw_http, read_file, reset_close, status_of, wait_metric)


def check_endpoints(opts, d):
    status, h, body = d.request("GET", "/healthz")
    assert status == 200, status
    status, h, body = d.request("GET", "/readyz")
    assert status == 200, (status, body)
    status, h, body = d.request("GET", "/v1/models/resnet18")
    assert status == 200, status
    m = json.loads(body)
    sha = hashlib.sha256(read_file(os.path.join(opts.ref, "weights.safetensors"))).hexdigest()
    assert m["weights"]["sha256"] == sha, (m["weights"], sha)
    assert m["device"] == "cpu" and m["precision"] == "fp32" and m["deterministic"] is True, m
    assert m["classes"] == m["label_count"] == m["labels"]["count"] == 1000, m
    assert m["labels"]["path"] == opts.labels and m["batching"]["max_batch_size"] >= 1, m
    text = d.metrics()
    assert metric(text, "resnetd_build_info", {"device": "cpu", "precision": "fp32"}) == 1, text[:500]
    # On the CPU engine there is no GPU telemetry (NVML) and no decode router.
    assert "resnetd_gpu_utilization_ratio" not in text and "resnetd_decode_cost" not in text, text[:300]
    if opts.promtool_check:
        rc = subprocess.run([opts.promtool_check, "-"], input=text.encode()).returncode
        assert rc in (0, 77), "promtool check metrics failed (%d)" % rc
        return "promtool %s" % ("clean" if rc == 0 else "missing, skipped")
    return ""


def check_matches_offline_classify(opts, d):
    names = ["s640x480", "photo_grace_hopper", "progressive_801x601", "gray_640x481", "s17x31"]
    paths = [os.path.join(opts.ref, "jpeg", n + ".jpg") for n in names]
    # The photo is in the reference only where python3-matplotlib-data is.
    paths = [p for p in paths if "photo_" not in p or os.path.exists(p)]
    out = subprocess.check_output([opts.classify, "--weights", os.path.join(opts.ref, "weights.safetensors"),
                                   "--labels", opts.labels, "--device", "cpu", "--json", "--top-k", "5"] + paths)
    offline = [json.loads(line)["predictions"] for line in out.decode().splitlines() if line.strip()]
    assert len(offline) == len(paths), out

    def same(got, want, what):
        assert len(got) == len(want) == 5, (what, got)
        for g, w in zip(got, want):
            # Batching may reorder float sums: scores agree to ~1e-6, and an
            # index may differ only between (near-)equal scores.
            assert abs(g["score"] - w["score"]) <= 1e-6 + 1e-4 * w["score"], (what, g, w)
            if g["index"] != w["index"]:
                assert abs(g["score"] - w["score"]) <= 1e-6, (what, g, w)
            else:
                assert g["label"] == w["label"], (what, g, w)

    for p, want in zip(paths, offline):
        res = ok_classify(d, read_file(p))
        assert len(res["results"]) == 1
        same(res["results"][0]["predictions"], want, "raw " + p)
        assert res["model"] == "resnet18" and "synthetic_weights" not in res, res
        t = res["timings_us"]
        assert t["total"] >= t["decode"] and t["total"] >= t["infer"], t
    body, headers = multipart([read_file(p) for p in paths])
    status, _, rbody = d.request("POST", "/classify", body, headers)
    assert status == 200, (status, rbody[:300])
    res = json.loads(rbody)
    assert len(res["results"]) == len(paths), res
    for p, got, want in zip(paths, res["results"], offline):
        same(got["predictions"], want, "multipart " + p)
    res = ok_classify(d, read_file(paths[0]), top_k=1000)
    scores = [p["score"] for p in res["results"][0]["predictions"]]
    assert len(scores) == 1000 and abs(sum(scores) - 1) < 1e-3 and scores == sorted(scores, reverse=True)
    return "%d files raw and multipart" % len(paths)


def check_concurrent_requests_are_batched(opts, d):
    jpeg = read_file(os.path.join(opts.ref, "jpeg", "s640x480.jpg"))
    before = d.metrics()
    res = concurrent(32, lambda i: ok_classify(d, jpeg))
    errors = [r for r in res if isinstance(r, Exception)]
    assert not errors, errors[:3]
    text = d.metrics()
    total = metric(text, "resnetd_batch_size_count") - (metric(before, "resnetd_batch_size_count") or 0)
    ones = metric(text, "resnetd_batch_size_bucket", {"le": "1"}) - \
        (metric(before, "resnetd_batch_size_bucket", {"le": "1"}) or 0)
    images = metric(text, "resnetd_batch_size_sum") - (metric(before, "resnetd_batch_size_sum") or 0)
    assert images == 32, images
    assert total - ones > 0, "no batch larger than 1 (%d batches)" % total
    sizes = sorted(r["batch_size"] for r in res)
    assert sizes[-1] > 1, sizes
    return "32 requests in %d batches, mean %.1f, largest %d" % (total, images / total, sizes[-1])


def check_oversize_bodies_get_413(opts, d):
    # Announced 100 MB: refused from the headers, before any body is sent.
    raw = raw_http(d.port, b"POST /classify HTTP/1.1\r\nHost: x\r\nContent-Type: image/jpeg\r\n"
                           b"Content-Length: 104857600\r\n\r\n", read_timeout=10)
    assert status_of(raw) == 413, raw[:300]
    assert error_of(raw.partition(b"\r\n\r\n")[2])["code"] == "too_large"
    # Chunked, no length: counted as it arrives (limit 16 MiB, send 17 MiB).
    s = socket.create_connection(("127.0.0.1", d.port), timeout=30)
    s.sendall(b"POST /classify HTTP/1.1\r\nHost: x\r\nContent-Type: image/jpeg\r\n"
              b"Transfer-Encoding: chunked\r\n\r\n")
    chunk = b"\xff" * (1 << 20)
    sent = 0
    try:
        for _ in range(17):
            s.sendall(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
            sent += len(chunk)
        s.sendall(b"0\r\n\r\n")
    except (BrokenPipeError, ConnectionResetError):
        pass   # the server may stop reading once past the limit
    data = b""
    try:
        while True:
            b = s.recv(65536)
            if not b:
                break
            data += b
    except (ConnectionResetError, socket.timeout):
        pass
    s.close()
    assert status_of(data) == 413, data[:300]
    ok_classify(d, read_file(os.path.join(opts.ref, "jpeg", "s224x224.jpg")))
    return "100 MB Content-Length and %d MiB chunked" % (sent >> 20)


def read_npy_f32(path):
    """A float32 C-order .npy as (shape, flat list), without numpy."""
    data = read_file(path)
    assert data[:6] == b"\x93NUMPY", path
    if data[6] == 1:
        hlen, off = struct.unpack("<H", data[8:10])[0], 10
    else:
        hlen, off = struct.unpack("<I", data[8:12])[0], 12
    header = ast.literal_eval(data[off:off + hlen].decode("latin1"))
    assert header["descr"] == "<f4" and not header["fortran_order"], header
    shape = header["shape"]
    count = math.prod(shape)
    return shape, list(struct.unpack("<%df" % count, data[off + hlen:off + hlen + 4 * count]))


def softmax(row):
    m = max(row)
    e = [math.exp(v - m) for v in row]
    s = sum(e)
    return [v / s for v in e]


def fine_tune_paths(opts):
    d = os.path.join(opts.ref, "ft10")
    return os.path.join(d, "weights.safetensors"), os.path.join(d, "labels.txt"), os.path.join(d, "logits.npy")


def check_fine_tuned_head(opts):
    """reference.py's 10-class fine-tune with its own labels: the metadata
    says 10 classes, every answer carries those labels, and the scores are
    the softmax of torchvision's logits for the same JPEGs (our crops equal
    PIL's, so the daemon sees torchvision's input)."""
    weights, labels, logits = fine_tune_paths(opts)
    with open(labels, encoding="utf-8") as f:
        names = f.read().splitlines()
    assert len(names) == 10, names
    shape, flat = read_npy_f32(logits)
    with open(os.path.join(opts.ref, "jpegs.txt")) as f:
        listed = f.read().split()
    assert shape == (len(listed), 10), (shape, len(listed))
    rows = {n: flat[i * 10:(i + 1) * 10] for i, n in enumerate(listed)}
    picked = [n for n in ("s640x480", "progressive_801x601", "gray_640x481", "s17x31", "sub444_333x501",
                          "restart1_501x333", "photo_grace_hopper") if n in rows]
    d = Daemon(opts, "--weights", weights, "--labels", labels)
    try:
        status, _, body = d.request("GET", "/v1/models/resnet18")
        m = json.loads(body)
        assert status == 200 and m["classes"] == m["label_count"] == m["labels"]["count"] == 10, m
        assert m["labels"]["path"] == labels, m
        assert m["weights"]["sha256"] == hashlib.sha256(read_file(weights)).hexdigest(), m
        assert "10 classes" in d.text(), d.text()

        def expect(preds, name, k):
            want = softmax(rows[name])
            order = sorted(range(10), key=lambda i: (-want[i], i))
            assert len(preds) == k, (name, preds)
            for rank, p in enumerate(preds):
                assert p["label"] == names[p["index"]], (name, p)
                assert abs(p["score"] - want[p["index"]]) <= 1e-4, (name, p, want[p["index"]])
                if p["index"] != order[rank]:   # only between (near-)equal scores
                    assert abs(want[p["index"]] - want[order[rank]]) <= 1e-4, (name, rank, p, order)

        worst = 0.0
        for n in picked:
            jpeg = read_file(os.path.join(opts.ref, "jpeg", n + ".jpg"))
            res = ok_classify(d, jpeg, top_k=10)
            preds = res["results"][0]["predictions"]
            expect(preds, n, 10)
            assert abs(sum(p["score"] for p in preds) - 1) < 1e-4, preds
            worst = max([worst] + [abs(p["score"] - softmax(rows[n])[p["index"]]) for p in preds])
        # The default is still 5; multipart answers in order.
        body, headers = multipart([read_file(os.path.join(opts.ref, "jpeg", n + ".jpg")) for n in picked])
        status, _, rbody = d.request("POST", "/classify", body, headers)
        assert status == 200, (status, rbody[:300])
        res = json.loads(rbody)
        for n, r in zip(picked, res["results"]):
            expect(r["predictions"], n, 5)
        # top_k is bounded by this model's classes, not ImageNet's.
        jpeg = read_file(os.path.join(opts.ref, "jpeg", picked[0] + ".jpg"))
        status, _, rbody = d.request("POST", "/classify?top_k=11", jpeg, {"Content-Type": "image/jpeg"})
        e = error_of(rbody)
        assert status == 400 and e["code"] == "bad_parameter" and "1 to 10" in e["message"], (status, e)
    finally:
        assert d.stop() == 0
    # resnetd-classify serves the same labels.
    out = subprocess.check_output([opts.classify, "--weights", weights, "--labels", labels, "--device", "cpu",
                                   "--json", "--top-k", "10", os.path.join(opts.ref, "jpeg", picked[0] + ".jpg")])
    expect(json.loads(out)["predictions"], picked[0], 10)
    p = subprocess.run([opts.classify, "--weights", weights, "--labels", labels, "--device", "cpu", "--top-k", "11",
                        os.path.join(opts.ref, "jpeg", picked[0] + ".jpg")], capture_output=True, text=True)
    assert p.returncode != 0 and "10 classes" in p.stderr, (p.returncode, p.stderr)
    return "%d JPEGs, worst score error %.1e; classify agrees" % (len(picked), worst)


def check_labels_must_match_the_model(opts):
    """A labels file whose line count is not the model's class count is a
    start-up error naming the file and both counts."""
    ft_weights, ft_labels, _ = fine_tune_paths(opts)
    imagenet_weights = os.path.join(opts.ref, "weights.safetensors")
    cases = [(ft_weights, opts.labels, 1000, 10), (imagenet_weights, ft_labels, 10, 1000)]
    for weights, labels, lines, classes in cases:
        want = ["%s: has %d lines" % (labels, lines), "model has %d classes" % classes]
        for extra in (["--check-config"], ["--listen", "127.0.0.1:0"]):
            p = subprocess.run([opts.resnetd, "--weights", weights, "--labels", labels, "--device", "cpu"] + extra,
                               capture_output=True, text=True, timeout=60)
            assert p.returncode != 0 and all(w in p.stderr for w in want), (extra, p.returncode, p.stderr)
            assert "ready" not in p.stderr, p.stderr
        p = subprocess.run([opts.classify, "--weights", weights, "--labels", labels, "--device", "cpu",
                            os.path.join(opts.ref, "jpeg", "s224x224.jpg")], capture_output=True, text=True,
                           timeout=60)
        assert p.returncode != 0 and all(w in p.stderr for w in want), (p.returncode, p.stderr)
        assert p.stdout == "", p.stdout
    return "1000 names for 10 classes and 10 for 1000: resnetd (and --check-config) and classify refuse"


def check_timeout_and_client_gone(opts):
    # Batches wait 2 s for company, requests time out after 0.5 s: a lone
    # request gets 504 from our own deadline.
    d = Daemon(opts, "--max-queue-delay-us", "2000000", "--request-timeout-ms", "500")
    try:
        jpeg = read_file(os.path.join(opts.ref, "jpeg", "s224x224.jpg"))
        t0 = time.time()
        status, h, body = d.request("POST", "/classify", jpeg, {"Content-Type": "image/jpeg"})
        waited = time.time() - t0
        assert status == 504 and error_of(body)["code"] == "timeout", (status, body)
        assert 0.4 < waited < 1.9, waited
        assert metric(d.metrics(), "resnetd_rejected_total", {"reason": "timeout"}) == 1
    finally:
        assert d.stop() == 0
    # A client that leaves while its image is queued (1 s batch delay).
    d = Daemon(opts, "--max-queue-delay-us", "1000000", "--request-timeout-ms", "10000")
    try:
        s = socket.create_connection(("127.0.0.1", d.port), timeout=10)
        s.sendall(b"POST /classify HTTP/1.1\r\nHost: x\r\nContent-Type: image/jpeg\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(jpeg) + jpeg)
        time.sleep(0.3)
        reset_close(s)
        deadline = time.time() + 10
        gone = 0
        while time.time() < deadline:
            text = d.metrics()
            gone = metric(text, "resnetd_rejected_total", {"reason": "client_gone"})
            if gone:
                break
            time.sleep(0.1)
        assert gone == 1, text
        assert metric(text, "resnetd_images_total") == 0, "the gone client's image was still run"
        assert metric(text, "resnetd_queue_depth") == 0
        ok_classify(d, jpeg)
    finally:
        assert d.stop() == 0
    return "504 after %.2f s; client_gone counted, image not run" % waited


def check_queue_overflow(opts):
    d = Daemon(opts, "--queue-capacity", "8", "--max-batch-size", "4", "--max-queue-delay-us", "1000")
    try:
        jpeg = read_file(os.path.join(opts.ref, "jpeg", "s224x224.jpg"))
        res = concurrent(48, lambda i: d.request("POST", "/classify", jpeg, {"Content-Type": "image/jpeg"}))
        errors = [r for r in res if isinstance(r, Exception)]
        assert not errors, errors[:3]
        statuses = [r[0] for r in res]
        assert set(statuses) <= {200, 503}, statuses
        n503 = statuses.count(503)
        assert n503 > 0 and statuses.count(200) > 0, statuses
        for status, h, body in res:
            if status == 503:
                assert int(h["retry-after"]) >= 1, h
                assert error_of(body)["code"] == "queue_full"
            else:
                assert len(json.loads(body)["results"]) == 1
        assert wait_metric(d, "resnetd_requests_total", {"code": "200"}, 48 - n503, 5) == 48 - n503
        assert metric(d.metrics(), "resnetd_rejected_total", {"reason": "queue_full"}) == n503
        ok_classify(d, jpeg)
    finally:
        assert d.stop() == 0
    return "48 at once into 8 slots: %d x 200, %d x 503 + Retry-After" % (48 - n503, n503)


def check_sigterm_under_load(opts):
    d = Daemon(opts, "--max-queue-delay-us", "5000")
    jpeg = read_file(os.path.join(opts.ref, "jpeg", "s224x224.jpg"))
    stop_at = [None]
    outcomes = []   # (sent_at, status or exception name, established)
    lock = threading.Lock()

    def client(i):
        c = d.conn()
        established = False
        while True:
            sent = time.time()
            try:
                c.request("POST", "/classify", jpeg, {"Content-Type": "image/jpeg"})
                r = c.getresponse()
                r.read()
                out = r.status
            except Exception as e:
                out = type(e).__name__
            with lock:
                outcomes.append((sent, out, established))
            if out != 200:
                break
            established = True   # this keep-alive connection was accepted
            if stop_at[0] and sent > stop_at[0] + 5:
                break
        c.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    # Load until every client has had a few answers (slow under sanitizers).
    deadline = time.time() + 120
    while time.time() < deadline:
        with lock:
            if sum(1 for o in outcomes if o[1] == 200) >= 32:
                break
        time.sleep(0.05)
    stop_at[0] = time.time()
    d.proc.send_signal(signal.SIGTERM)
    rc = d.proc.wait(60)
    drained = time.time() - stop_at[0]
    for t in threads:
        t.join(TIMEOUT)
    log = d.text()
    d.stop()
    assert rc == 0, (rc, log)
    # Every request sent on an accepted connection before SIGTERM got 200.
    before = [o for o in outcomes if o[0] < stop_at[0] - 0.05 and o[2]]
    lost = [o for o in before if o[1] != 200]
    assert not lost, lost[:5]
    assert len(before) >= 16, len(before)
    # Afterwards: answered (200, or 503 while draining) or refused, never 5xx otherwise.
    after = [o[1] for o in outcomes if o[0] >= stop_at[0] - 0.05]
    assert all(o in (200, 503) or isinstance(o, str) for o in after), after
    assert "draining" in log and "stopped" in log, log
    return "%d answered before SIGTERM, none lost; drained in %.2f s" % (len(before), drained)


def check_synthetic_marks_responses(opts):
    # Marked, and the same synthetic weights as resnetd-classify's: the same
    # scores for the same JPEG.
    path = os.path.join(opts.ref, "jpeg", "s224x224.jpg")
    d = Daemon(opts, "--weights", "synthetic")
    try:
        res = ok_classify(d, read_file(path))
        assert res.get("synthetic_weights") is True, res
        assert "synthetic" in d.text() and "warning" in d.text()
    finally:
        assert d.stop() == 0
    classify = os.path.join(os.path.dirname(opts.resnetd), "resnetd-classify")
    p = subprocess.run([classify, "--weights", "synthetic", "--device", "cpu", "--json", "--top-k", "5", path],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    want = [q["index"] for q in json.loads(p.stdout)["predictions"]]
    got = [q["index"] for q in res["results"][0]["predictions"]]
    assert got == want, (got, want)
    return "top-5 as resnetd-classify --weights synthetic"


def check_drain_details(opts):
    # A request queued for a 1.5 s batch when SIGTERM arrives is sent at
    # once and answered; readiness turns 503; new connections are refused.
    d = Daemon(opts, "--max-queue-delay-us", "1500000")
    jpeg = read_file(os.path.join(opts.ref, "jpeg", "s224x224.jpg"))
    # An upload that stalls halfway keeps the drain going while we look.
    stall = socket.create_connection(("127.0.0.1", d.port), timeout=10)
    stall.sendall(b"POST /classify HTTP/1.1\r\nHost: x\r\nContent-Type: image/jpeg\r\n"
                  b"Content-Length: 1000\r\n\r\n" + jpeg[:100])
    probe, other = d.conn(), d.conn()
    for c in (probe, other):
        c.request("GET", "/healthz")
        assert c.getresponse().read() == b'{"status":"ok"}\n'
    result = []
    t = threading.Thread(target=lambda: result.append(
        d.request("POST", "/classify", jpeg, {"Content-Type": "image/jpeg"})))
    t.start()
    time.sleep(0.3)
    t0 = time.time()
    d.proc.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    probe.request("GET", "/readyz")
    r = probe.getresponse()
    assert r.status == 503 and error_of(r.read())["code"] == "not_ready", r.status
    other.request("POST", "/classify", jpeg, {"Content-Type": "image/jpeg"})
    r = other.getresponse()
    assert r.status == 503 and error_of(r.read())["code"] == "shutting_down", r.status
    t.join(TIMEOUT)
    assert result and result[0][0] == 200, result
    try:
        socket.create_connection(("127.0.0.1", d.port), timeout=5).close()
        refused = False
    except ConnectionRefusedError:
        refused = True
    assert d.proc.poll() is None, "exited with an upload unfinished"
    stall.close()
    rc = d.proc.wait(30)
    took = time.time() - t0
    d.stop()
    assert rc == 0 and refused, (rc, refused)

    # A client stuck mid-upload holds the drain until drain_timeout_ms; the
    # daemon then closes it and still exits 0.
    d = Daemon(opts, "--drain-timeout-ms", "700")
    s = socket.create_connection(("127.0.0.1", d.port), timeout=10)
    s.sendall(b"POST /classify HTTP/1.1\r\nHost: x\r\nContent-Type: image/jpeg\r\n"
              b"Content-Length: 1000\r\n\r\n" + jpeg[:100])
    time.sleep(0.2)
    t1 = time.time()
    d.proc.send_signal(signal.SIGTERM)
    rc = d.proc.wait(30)
    stuck = time.time() - t1
    s.close()
    log = d.text()
    d.stop()
    assert rc == 0 and 0.6 < stuck < 5, (rc, stuck, log)
    assert "drain timeout" in log, log

    # The same, but a second SIGTERM: exit at once, non-zero.
    d = Daemon(opts, "--drain-timeout-ms", "30000")
    s = socket.create_connection(("127.0.0.1", d.port), timeout=10)
    s.sendall(b"POST /classify HTTP/1.1\r\nHost: x\r\nContent-Type: image/jpeg\r\n"
              b"Content-Length: 1000\r\n\r\n" + jpeg[:100])
    time.sleep(0.2)
    d.proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    assert d.proc.poll() is None, "exited while a request was still open"
    t2 = time.time()
    d.proc.send_signal(signal.SIGTERM)
    rc = d.proc.wait(30)
    fast = time.time() - t2
    s.close()
    d.stop()
    assert rc == 1 and fast < 1, (rc, fast)
    return "queued request answered, exit %.2f s after SIGTERM; stuck upload cut after %.2f s; 2nd signal exit in %.2f s" % (
        took, stuck, fast)


def thread_cpu(pid, name):
    """CPU ticks (user + system) of each of pid's threads called name."""
    ticks = []
    for tid in os.listdir("/proc/%d/task" % pid):
        try:
            with open("/proc/%d/task/%s/comm" % (pid, tid)) as f:
                comm = f.read().strip()
            with open("/proc/%d/task/%s/stat" % (pid, tid)) as f:
                fields = f.read().rpartition(")")[2].split()
        except FileNotFoundError:
            continue   # a thread that just ended
        if comm == name:
            ticks.append(int(fields[11]) + int(fields[12]))
    return ticks


def check_decode_pool_serves_every_connection(opts):
    # One HTTP thread, three decode threads: the decode threads, not the
    # HTTP thread, decode, and more than one of them works on the requests
    # that one HTTP thread received.
    d = Daemon(opts, "--threads", "1", "--decode-threads", "3")
    try:
        assert "1 HTTP threads, 3 decode threads" in d.text(), d.text()
        assert len(thread_cpu(d.proc.pid, "resnetd-decode")) == 3, thread_cpu(d.proc.pid, "resnetd-decode")
        big = read_file(os.path.join(opts.ref, "jpeg", "s1920x1080.jpg"))
        small = read_file(os.path.join(opts.ref, "jpeg", "s224x224.jpg"))
        want_big = ok_classify(d, big, 1)["results"][0]["predictions"][0]["index"]
        want_small = ok_classify(d, small, 1)["results"][0]["predictions"][0]["index"]
        before = thread_cpu(d.proc.pid, "resnetd-decode")
        mp, mph = multipart([small, big, small])

        def one(i):
            if i % 3 == 2:
                return d.request("POST", "/classify?top_k=1", mp, mph)
            return d.request("POST", "/classify?top_k=1", big, {"Content-Type": "image/jpeg"})
        res = concurrent(24, one)
        for i, r in enumerate(res):
            assert not isinstance(r, Exception), r
            assert r[0] == 200, (i, r[0], r[2][:200])
            got = [x["predictions"][0]["index"] for x in json.loads(r[2])["results"]]
            assert got == ([want_small, want_big, want_small] if i % 3 == 2 else [want_big]), (i, got)
        after = thread_cpu(d.proc.pid, "resnetd-decode")
        busy = sum(1 for a, b in zip(after, before) if a > b)
        assert busy >= 2, (before, after)
        text = d.metrics()
        assert metric(text, "resnetd_decode_duration_seconds_count") == 2 + 16 + 8 * 3, text
    finally:
        assert d.stop() == 0
    return "24 requests through 1 HTTP thread, %d of 3 decode threads busy (CPU ticks %s)" % (
        busy, [a - b for a, b in zip(after, before)])


def check_waiting_for_decoder(opts):
    # One decode thread, kept busy by a request of large (12 MP) images
    # while other requests wait for it. How long those take to decode
    # depends on the machine and its load (6 took ~1 s where this test was
    # written, 0.3 s on a faster machine, which failed it), so each scenario
    # reads the decode count from the metrics to know that the slow request
    # was still being decoded when it acted, and runs again with twice the
    # images if it was not.
    big = read_file(os.path.join(opts.ref, "jpeg", "s4000x3000.jpg"))
    small = read_file(os.path.join(opts.ref, "jpeg", "s224x224.jpg"))
    jpg = {"Content-Type": "image/jpeg"}
    args = ("--decode-threads", "1", "--max-body-bytes", "256M")

    def start(d, body, headers, out):
        t = threading.Thread(target=lambda: out.append(d.request("POST", "/classify", body, headers)))
        t.start()
        return t

    def decoded(d):
        return metric(d.metrics(), "resnetd_decode_duration_seconds_count") or 0

    def busy(d):
        # The slow request's first image is decoded: the decoder is on the rest.
        deadline = time.time() + TIMEOUT
        while decoded(d) < 1:
            assert time.time() < deadline, "the slow request was not decoded"
            time.sleep(0.01)

    # A client that leaves while waiting for the decoder: counted as
    # client_gone, its image never decoded, the slow request still served.
    def client_gone(count):
        slow, slow_h = multipart([big] * count)
        d = Daemon(opts, *args)
        try:
            a = []
            ta = start(d, slow, slow_h, a)
            busy(d)
            s = socket.create_connection(("127.0.0.1", d.port), timeout=10)
            s.sendall(b"POST /classify HTTP/1.1\r\nHost: x\r\nContent-Type: image/jpeg\r\n"
                      b"Content-Length: %d\r\n\r\n" % len(small) + small)
            time.sleep(0.1)
            late = decoded(d) <= count // 2  # the slow request's decode outlasts the reset
            reset_close(s)
            ta.join(TIMEOUT)
            assert a and a[0][0] == 200, a
            if not late:
                return False
            deadline = time.time() + 10
            while time.time() < deadline:
                text = d.metrics()
                if metric(text, "resnetd_rejected_total", {"reason": "client_gone"}):
                    break
                time.sleep(0.1)
            assert metric(text, "resnetd_rejected_total", {"reason": "client_gone"}) == 1, text
            assert metric(text, "resnetd_decode_duration_seconds_count") == count, \
                "the gone client's image was decoded"
            assert metric(text, "resnetd_images_total") == count, text
            ok_classify(d, small)
        finally:
            assert d.stop() == 0
        return True

    # SIGTERM while requests wait for the decoder: they are decoded and
    # answered before the daemon exits.
    def sigterm(count):
        slow, slow_h = multipart([big] * count)
        d = Daemon(opts, *args)
        a, b = [], []
        ta = start(d, slow, slow_h, a)
        busy(d)
        tb = [start(d, small, jpg, b) for _ in range(3)]
        time.sleep(0.2)
        d.proc.send_signal(signal.SIGTERM)
        rc = d.proc.wait(60)
        for t in [ta] + tb:
            t.join(TIMEOUT)
        log = d.text()
        d.stop()
        assert rc == 0, (rc, log)
        assert [r[0] for r in a + b] == [200] * 4, [(r[0], r[2][:120]) for r in a + b]
        return True

    # Drain timeout 0: the request still waiting for the decoder gets 503
    # shutting_down, and so does the one being decoded, before its next
    # image (a long decode must not hold the exit past the timeout).
    def drain_now(count):
        slow, slow_h = multipart([big] * count)
        d = Daemon(opts, *(args + ("--drain-timeout-ms", "0")))
        a, b = [], []
        ta = start(d, slow, slow_h, a)
        busy(d)
        tb = start(d, small, jpg, b)
        time.sleep(0.2)
        late = decoded(d) <= count // 2  # SIGTERM comes while the slow request is decoded
        d.proc.send_signal(signal.SIGTERM)
        rc = d.proc.wait(60)
        ta.join(TIMEOUT)
        tb.join(TIMEOUT)
        log = d.text()
        d.stop()
        assert rc == 0, (rc, log)
        if not late:
            return False
        got = a + b
        assert [r[0] for r in got] == [503, 503], [(r[0], r[2][:120]) for r in got]
        for r in got:
            e = error_of(r[2])
            assert e["code"] == "shutting_down" and int(r[1]["retry-after"]) >= 1, r
        assert "requests waiting for a decoder" in log, log
        return True

    used = []
    for scenario in (client_gone, sigterm, drain_now):
        for count in (6, 12, 24, 48):
            if scenario(count):
                used.append(count)
                break
        else:
            raise AssertionError("%s: 48 large images were decoded before the test could act" % scenario.__name__)
    return ("client_gone while waiting: not decoded; SIGTERM: 4 waiting answered 200; drain timeout: 503 + 503 "
            "(%s large images)" % "/".join(map(str, used)))


def check_systemd_notify(opts):
    # An abstract AF_UNIX datagram socket stands in for systemd.
    name = "@resnetd-test-%d" % os.getpid()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name[1:])
    sock.settimeout(30)
    d = Daemon(opts, env={"NOTIFY_SOCKET": name, "WATCHDOG_USEC": "200000"})
    try:
        got = []
        deadline = time.time() + 10
        while time.time() < deadline and (got.count(b"WATCHDOG=1") < 2 or b"READY=1" not in got):
            got.append(sock.recv(4096))
        assert got[0] == b"READY=1", got
        assert got.count(b"WATCHDOG=1") >= 2, got
        d.proc.send_signal(signal.SIGTERM)
        while True:
            m = sock.recv(4096)
            if m != b"WATCHDOG=1":
                break
        assert m == b"STOPPING=1", m
        assert d.proc.wait(30) == 0
    finally:
        d.stop()
        sock.close()
    return "READY=1, WATCHDOG=1 every 0.1 s, STOPPING=1"


def check_access_log(opts):
    """access_log: one JSON line per request, the client's X-Request-Id or
    the daemon's own, every field; all written by the time it exits."""
    jpeg = read_file(os.path.join(opts.ref, "jpeg", "s640x480.jpg"))
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "access.log")
        d = Daemon(opts, "--access-log", path)
        try:
            status, _, body = d.request("POST", "/classify?top_k=1", jpeg,
                                        {"Content-Type": "image/jpeg", "X-Request-Id": "abc-123"})
            assert status == 200, (status, body)
            answer_len = len(body)
            status, _, _ = d.request("GET", "/nowhere")
            assert status == 404
            status, _, _ = d.request("GET", "/healthz")
            assert status == 200
            # Not UTF-8 once percent-decoded, and an id that is not either:
            # the line is still written, the bytes shown as \xNN.
            status, _, _ = d.request("GET", "/%FF", headers={"X-Request-Id": "id\udcff".encode(
                "utf-8", "surrogateescape").decode("latin-1")})
            assert status == 404
        finally:
            assert d.stop() == 0
        lines = [json.loads(line) for line in open(path)]
    # One line each; a request's line is written when it ends, which may
    # come after the next request's on another HTTP thread.
    assert len(lines) == 4, lines
    by_path = {line["path"].lower(): line for line in lines}
    cl, nf, hz, bad = (by_path[p] for p in ("/classify", "/nowhere", "/healthz", "/\\xff"))
    assert bad["status"] == 404 and bad["path"].lower() == "/\\xff" and bad["id"].lower() == "id\\xff", bad
    assert cl["method"] == "POST" and cl["path"] == "/classify" and cl["status"] == 200, cl
    assert cl["bytes_in"] == len(jpeg) and cl["bytes_out"] == answer_len and cl["images"] == 1, (cl, answer_len)
    assert cl["id"] == "abc-123" and cl["latency_ms"] > 0 and re.match(r"127\.0\.0\.1:\d+$", cl["peer"]), cl
    assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$", cl["time"]), cl
    assert nf["status"] == 404 and nf["path"] == "/nowhere" and nf["id"].startswith("resnetd-"), nf
    assert hz["status"] == 200 and hz["id"] != nf["id"] and hz["images"] == 0, hz
    return "4 requests, 4 JSON lines: %s" % json.dumps(cl, sort_keys=True)[:160]


def check_config_file_and_check_config(opts):
    weights = os.path.join(opts.ref, "weights.safetensors")
    with tempfile.TemporaryDirectory() as tmp:
        good = os.path.join(tmp, "good.conf")
        with open(good, "w") as f:
            f.write("# test\nweights = %s\nlabels = %s\ndevice = cpu\nmax_batch_size = 4\n" % (weights, opts.labels))
        p = subprocess.run([opts.resnetd, "--config", good, "--check-config"], capture_output=True, text=True)
        assert p.returncode == 0 and "configuration OK" in p.stdout, (p.returncode, p.stdout, p.stderr)
        bad = os.path.join(tmp, "bad.conf")
        with open(bad, "w") as f:
            f.write("weights = %s\n\nqueue_capacity = lots\n" % weights)
        p = subprocess.run([opts.resnetd, "--config", bad, "--check-config"], capture_output=True, text=True)
        # Exit 2: the configuration is wrong; 3: a file it names cannot be
        # loaded (the unit restarts for neither).
        assert p.returncode == 2 and "%s:3: queue_capacity: 'lots'" % bad in p.stderr, (p.returncode, p.stderr)
        p = subprocess.run([opts.resnetd, "--weights", os.path.join(tmp, "missing.safetensors"), "--check-config"],
                           capture_output=True, text=True)
        assert p.returncode == 3 and "--weights: " in p.stderr and "missing.safetensors" in p.stderr, p.stderr
        # From the file: the error names the file, the line and the key.
        missing = os.path.join(tmp, "missing.conf")
        with open(missing, "w") as f:
            f.write("device = cpu\nweights = %s\n" % os.path.join(tmp, "missing.safetensors"))
        p = subprocess.run([opts.resnetd, "--config", missing, "--check-config"], capture_output=True, text=True)
        assert p.returncode == 3 and "%s:2: weights: " % missing in p.stderr, p.stderr
        p = subprocess.run([opts.resnetd, "--device", "cpu"], capture_output=True, text=True)
        assert p.returncode == 2 and "weights: required" in p.stderr, p.stderr
        # Bytes that are not UTF-8 in the file are quoted as \xNN, not
        # passed to the terminal or journal raw (issue 39, F8).
        latin = os.path.join(tmp, "latin1.conf")
        with open(latin, "wb") as f:
            f.write(b"weights = %s\n\xff\xfebogus = 1\n" % weights.encode())
        p = subprocess.run([opts.resnetd, "--config", latin, "--check-config"], capture_output=True)
        err = p.stderr.decode("utf-8")   # raises on raw bytes
        assert p.returncode == 2 and "unknown option '\\xFF\\xFEbogus'" in err, (p.returncode, err)
        # The shipped config names the packaged weights path: without the
        # file there, a clear error naming its line, exit 3.
        sample = os.path.join(os.path.dirname(opts.labels), "resnetd.conf")
        shipped = "/var/lib/resnetd/resnet18.safetensors"
        if not os.path.exists(shipped):
            p = subprocess.run([opts.resnetd, "--config", sample, "--check-config"], capture_output=True, text=True)
            line = [i + 1 for i, t in enumerate(open(sample)) if t.startswith("weights = ")]
            assert p.returncode == 3 and "%s:%d: weights: " % (sample, line[0]) in p.stderr and shipped in p.stderr, \
                (p.returncode, p.stderr)
        # The file sets max batch 4; the flag overrides it.
        d = Daemon(opts, "--config", good, "--max-batch-size", "2")
        try:
            _, _, body = d.request("GET", "/v1/models/resnet18")
            assert json.loads(body)["batching"]["max_batch_size"] == 2, body
        finally:
            assert d.stop() == 0
    p = subprocess.run([opts.resnetd, "--version"], capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout.startswith("resnetd "), p.stdout
    return ""


CHECKS = [
    ("endpoints", check_endpoints, True),
    ("matches_offline_classify", check_matches_offline_classify, True),
    ("concurrent_requests_are_batched", check_concurrent_requests_are_batched, True),
    ("each_error_status", check_each_error_status, True),
    ("oversize_bodies_get_413", check_oversize_bodies_get_413, True),
    ("fine_tuned_head", check_fine_tuned_head, False),
    ("labels_must_match_the_model", check_labels_must_match_the_model, False),
    ("timeout_and_client_gone", check_timeout_and_client_gone, False),
    ("queue_overflow", check_queue_overflow, False),
    ("sigterm_under_load", check_sigterm_under_load, False),
    ("drain_details", check_drain_details, False),
    ("decode_pool_serves_every_connection", check_decode_pool_serves_every_connection, False),
    ("waiting_for_decoder", check_waiting_for_decoder, False),
    ("synthetic_marks_responses", check_synthetic_marks_responses, False),
    ("systemd_notify", check_systemd_notify, False),
    ("config_file_and_check_config", check_config_file_and_check_config, False),
    ("access_log", check_access_log, False),
]


if __name__ == "__main__":
    sys.exit(daemon_client.main(CHECKS))
