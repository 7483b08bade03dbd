#!/usr/bin/python3
"""Hot reload of a live resnetd (daemon/pipeline/reload.h): SIGHUP and the Open
Inference Protocol's POST /v2/repository/models/resnet18/load, under
64-client load. Standard library only. Usage:
  reload_client.py --resnetd BIN --ref DIR --labels FILE [--only NAME ...]
"""

import json
import os
import signal
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import daemon_client  # noqa: E402
from daemon_client import Daemon, metric, read_file, wait_metric  # noqa: E402

JPG = {"Content-Type": "image/jpeg"}
LOAD = "/v2/repository/models/resnet18/load"


def model_meta(d):
    """GET /v1/models/resnet18's JSON as a dict."""
    _, _, data = d.request("GET", "/v1/models/resnet18")
    return json.loads(data)


def write_config(path, weights, labels, extra=""):
    with open(path + ".tmp", "w") as f:
        f.write("weights = %s\nlabels = %s\n%s" % (weights, labels, extra))
    os.rename(path + ".tmp", path)   # a reload never reads half a file


def reference_daemon(opts, *args):
    """A daemon whose configuration file (in a fresh temp dir) names the
    reference weights and labels: (daemon, config path, temp dir)."""
    tmp = tempfile.mkdtemp(prefix="resnetd-reload-")
    cfg = os.path.join(tmp, "resnetd.conf")
    write_config(cfg, os.path.join(opts.ref, "weights.safetensors"), opts.labels)
    return Daemon(opts, *args, config=cfg), cfg, tmp


def answer_key(res):
    """What identifies a model's answer: version, marker and predictions."""
    preds = res["results"][0]["predictions"]
    return (res["model_version"], bool(res.get("synthetic_weights")),
            tuple((p["index"], p["label"], round(p["score"], 5)) for p in preds))


class Load:
    """n clients posting one JPEG in a loop on kept-alive connections."""

    def __init__(self, d, body, n):
        self.d, self.body, self.stop = d, body, threading.Event()
        self.results = [[] for _ in range(n)]   # per client: (status, answer or error)
        self.threads = [threading.Thread(target=self.run, args=(i,)) for i in range(n)]
        for t in self.threads:
            t.start()

    def run(self, i):
        c = None
        while not self.stop.is_set():
            try:
                if c is None:
                    c = self.d.conn()
                    c.timeout = 120
                c.request("POST", "/classify", self.body, JPG)
                r = c.getresponse()
                data = r.read()
                self.results[i].append((r.status, json.loads(data) if r.status == 200 else data[:300]))
            except Exception as e:  # noqa: BLE001 - every failure is recorded and fails the check
                self.results[i].append((0, repr(e)))
                c = None
        if c is not None:
            c.close()

    def wait_for(self, pred, limit_s):
        deadline = time.time() + limit_s
        while time.time() < deadline:
            if any(r and r[-1][0] == 200 and pred(r[-1][1]) for r in self.results):
                return True
            time.sleep(0.05)
        return False

    def finish(self):
        self.stop.set()
        for t in self.threads:
            t.join(180)
        return [x for r in self.results for x in r]


def check_reload_under_load(opts):
    # 64 clients; SIGHUP to synthetic weights, then the load endpoint back
    # to the reference weights: every request answered 200, each client's
    # answers move from version 1 to 2 to 3 and never back, and each
    # version's answers are its weights' (v1 == v3 == the reference's).
    ref_weights = os.path.join(opts.ref, "weights.safetensors")
    d, cfg, _ = reference_daemon(opts, "--max-batch-size", "8", "--max-queue-delay-us", "2000")
    body = read_file(os.path.join(opts.ref, "jpeg", "s224x224.jpg"))
    load = None
    try:
        status, _, data = d.request("POST", "/classify", body, JPG)
        assert status == 200, data[:300]
        v1 = answer_key(json.loads(data))
        assert v1[0] == 1 and not v1[1], v1
        load = Load(d, body, 64)
        assert load.wait_for(lambda a: True, 60), "no answer under load"
        write_config(cfg, "synthetic", opts.labels)
        d.proc.send_signal(signal.SIGHUP)
        assert load.wait_for(lambda a: a["model_version"] == 2, 120), d.text()[-1500:]
        write_config(cfg, ref_weights, opts.labels)
        status, h, data = d.request("POST", LOAD, b"", {"Content-Type": "application/json"})
        assert status == 200, (status, data[:300])
        assert load.wait_for(lambda a: a["model_version"] == 3, 120), d.text()[-1500:]
        time.sleep(0.5)
        results = [r[:] for r in load.results]
        answers = load.finish()
        load = None
        bad = [a for a in answers if a[0] != 200]
        assert not bad, ("%d of %d requests not 200" % (len(bad), len(answers)), bad[:3])
        keys = {}
        for per_client in results:
            versions = [a[1]["model_version"] for a in per_client if a[0] == 200]
            assert versions == sorted(versions), versions   # never back to an older model
            for _, a in per_client:
                keys.setdefault(a["model_version"], set()).add(answer_key(a))
        assert set(keys) == {1, 2, 3}, sorted(keys)
        assert keys[1] == {v1}, keys[1]
        assert len(keys[2]) == 1 and next(iter(keys[2]))[1], keys[2]          # synthetic, marked
        assert next(iter(keys[2]))[2] != v1[2], "the synthetic weights answered like the reference"
        assert {k[1:] for k in keys[3]} == {v1[1:]}, keys[3]                    # back to the reference's
        text = d.metrics()
        assert metric(text, "resnetd_model_version") == 3, text
        assert metric(text, "resnetd_model_reloads_total", {"result": "ok"}) == 2, text
        assert not metric(text, "resnetd_requests_total", {"code": "500"}), text
        meta = model_meta(d)
        assert meta["version"] == 3 and meta["weights"]["path"] == ref_weights, meta
        assert meta["weights"]["loaded_at_unix_ms"] > 0, meta
    finally:
        if load:
            load.finish()
        rc = d.stop()
    assert rc == 0, rc
    return "%d requests from 64 clients, all 200; answers moved v1 -> v2 (synthetic) -> v3 (reference)" % len(answers)


def check_failed_reload_keeps_serving(opts):
    # A weights file that is not there, then one that is not safetensors:
    # the load endpoint answers 400 naming the problem, SIGHUP logs it, and
    # the running model keeps answering as before. A changed option that a
    # reload cannot apply is named in the log.
    d, cfg, tmp = reference_daemon(opts)
    body = read_file(os.path.join(opts.ref, "jpeg", "s224x224.jpg"))
    try:
        status, _, data = d.request("POST", "/classify", body, JPG)
        before = answer_key(json.loads(data))
        missing = os.path.join(tmp, "missing.safetensors")
        write_config(cfg, missing, opts.labels)
        status, h, data = d.request("POST", LOAD, b"{}", {"Content-Type": "application/json"})
        assert status == 400, (status, data[:300])
        err = json.loads(data)["error"]
        assert "missing.safetensors" in err, err
        garbage = os.path.join(tmp, "garbage.safetensors")
        with open(garbage, "wb") as f:
            f.write(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}......")
        write_config(cfg, garbage, opts.labels, "max_batch_size = 3\n")
        d.proc.send_signal(signal.SIGHUP)
        deadline = time.time() + 60
        while d.text().count("reload failed") < 2 and time.time() < deadline:
            time.sleep(0.1)
        log = d.text()
        assert "reload failed, the running model keeps serving" in log and "garbage.safetensors" in log, log[-1500:]
        assert "max_batch_size need a restart" in log, log[-1500:]
        status, _, data = d.request("POST", LOAD, b'{"parameters": {"config": "{}"}}',
                                    {"Content-Type": "application/json"})
        assert status == 400 and "not supported" in json.loads(data)["error"], data
        status, _, data = d.request("POST", LOAD, b"[1, 2", {"Content-Type": "application/json"})
        assert status == 400 and "not JSON" in json.loads(data)["error"], data
        status, _, data = d.request("GET", LOAD)
        assert status == 405, status
        status, _, data = d.request("POST", "/classify", body, JPG)
        assert status == 200 and answer_key(json.loads(data)) == before, data[:300]
        assert wait_metric(d, "resnetd_model_reloads_total", {"result": "failed"}, 2, 10) == 2
        assert metric(d.metrics(), "resnetd_model_version") == 1
    finally:
        rc = d.stop()
    assert rc == 0, rc
    return "missing and corrupt weights: 400 / logged, version 1 kept serving; unapplied option named"


def check_reload_of_a_fifo_does_not_hang(opts):
    # Weights, then labels, that are FIFOs with no writer: each load answers
    # 400 at once ("not a regular file"); a later load of the real files
    # succeeds, and SIGTERM exits 0 promptly (issue 39, F4: at 2ca644f the
    # first load hung, every later one with it, and SIGTERM exited 1 after
    # 35 s).
    d, cfg, tmp = reference_daemon(opts)
    ref_weights = os.path.join(opts.ref, "weights.safetensors")
    try:
        fifo = os.path.join(tmp, "weights.fifo")
        os.mkfifo(fifo)
        for weights, labels in ((fifo, opts.labels), (ref_weights, fifo)):
            write_config(cfg, weights, labels)
            t0 = time.time()
            d_conn = d.conn()
            d_conn.timeout = 10
            d_conn.request("POST", LOAD, b"", {"Content-Type": "application/json"})
            r = d_conn.getresponse()
            data = r.read()
            d_conn.close()
            assert r.status == 400, (r.status, data[:300])
            err = json.loads(data)["error"]
            assert "weights.fifo" in err and "not a regular file" in err, err
            assert time.time() - t0 < 5, time.time() - t0
        write_config(cfg, ref_weights, opts.labels)
        status, _, data = d.request("POST", LOAD, b"", {"Content-Type": "application/json"})
        assert status == 200, (status, data[:300])
        assert metric(d.metrics(), "resnetd_model_version") == 2
        t0 = time.time()
        rc = d.stop()
        took = time.time() - t0
    finally:
        if d.proc.poll() is None:
            d.stop()
    assert rc == 0 and took < 10, (rc, took)
    return "weights and labels FIFOs: 400 'not a regular file' at once; the next load 200; SIGTERM exit 0 in %.2f s" % took


def check_reload_to_a_fine_tune(opts):
    # From the 1000-class reference to reference.py's 10-class fine-tune and
    # its labels, under 16 clients: all 200, and the answers switch to the
    # fine-tune's classes (the top_k bound with them).
    d, cfg, _ = reference_daemon(opts, "--max-batch-size", "8")
    body = read_file(os.path.join(opts.ref, "jpeg", "s224x224.jpg"))
    ft = os.path.join(opts.ref, "ft10")
    with open(os.path.join(ft, "labels.txt"), encoding="utf-8") as f:
        ft_names = set(f.read().splitlines())
    load = None
    try:
        load = Load(d, body, 16)
        assert load.wait_for(lambda a: True, 60), "no answer under load"
        write_config(cfg, os.path.join(ft, "weights.safetensors"), os.path.join(ft, "labels.txt"))
        status, _, data = d.request("POST", LOAD, b"", {"Content-Type": "application/json"})
        assert status == 200, (status, data[:300])
        assert load.wait_for(lambda a: a["model_version"] == 2, 120), d.text()[-1500:]
        answers = load.finish()
        load = None
        bad = [a for a in answers if a[0] != 200]
        assert not bad, ("%d of %d requests not 200" % (len(bad), len(answers)), bad[:3])
        v2 = {answer_key(a) for _, a in answers if a["model_version"] == 2}
        assert len(v2) == 1, v2
        labels = {p[1] for p in next(iter(v2))[2]}
        assert labels <= ft_names, (labels, ft_names)
        v1 = {answer_key(a) for _, a in answers if a["model_version"] == 1}
        assert len(v1) == 1 and not {p[1] for p in next(iter(v1))[2]} & ft_names, v1
        meta = model_meta(d)
        assert meta["classes"] == 10 and meta["labels"]["count"] == 10, meta
        status, _, data = d.request("POST", "/classify?top_k=11", body, JPG)
        assert status == 400, status
    finally:
        if load:
            load.finish()
        rc = d.stop()
    assert rc == 0, rc
    return "%d requests from 16 clients, all 200; answers moved to the 10-class fine-tune's labels" % len(answers)


def check_drain_answers_waiting_loads(opts):
    # Two load requests, the second waiting behind the first's reload, then
    # SIGTERM: the waiting one is answered 503 at once (the drain does not
    # run another reload for it), the running one finishes (200), exit 0.
    d, _, _ = reference_daemon(opts, "--max-batch-size", "32")   # a slow warm-up: the reload takes a while
    out = {}

    def load(name):
        st, _, data = d.request("POST", LOAD, b"", {"Content-Type": "application/json"})
        out[name] = (st, data)
    try:
        first = threading.Thread(target=load, args=("first",))
        first.start()
        deadline = time.time() + 30
        while "reload: loading" not in d.text() and time.time() < deadline:
            time.sleep(0.01)
        second = threading.Thread(target=load, args=("second",))
        second.start()
        time.sleep(0.2)
        t0 = time.time()
        d.proc.send_signal(signal.SIGTERM)
        second.join(60)
        first.join(60)
        rc = d.proc.wait(60)
        took = time.time() - t0
    finally:
        log = d.text()
        d.stop()
    assert rc == 0, (rc, log[-1500:])
    assert out["second"][0] == 503 and "shutting down" in json.loads(out["second"][1])["error"], out
    assert out["first"][0] in (200, 503), out
    assert log.count("reload: loading") == 1, log[-1500:]   # no second reload for the refused one
    return "running load %d, waiting load 503 at the drain; one reload; exit 0 in %.1f s" % (out["first"][0], took)


CHECKS = [
    ("reload_under_load", check_reload_under_load, False),
    ("failed_reload_keeps_serving", check_failed_reload_keeps_serving, False),
    ("reload_of_a_fifo_does_not_hang", check_reload_of_a_fifo_does_not_hang, False),
    ("reload_to_a_fine_tune", check_reload_to_a_fine_tune, False),
    ("drain_answers_waiting_loads", check_drain_answers_waiting_loads, False),
]


if __name__ == "__main__":
    sys.exit(daemon_client.main(CHECKS))
