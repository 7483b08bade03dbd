#!/usr/bin/env python3
"""resnetd through the real Triton client (tritonclient.http): server and
model metadata and readiness, then infer with FP32 tensors (JSON and
binary), UINT8 pixels, JPEG BYTES and the classification extension, each
checked against /classify or torchvision's logits from tests/ref.

Run by tests/api/test_tritonclient.sh with a venv's python that has
tritonclient[http] and Debian's numpy.
"""

import os
import sys
import time

import numpy as np
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import daemon_client as dc  # noqa: E402

MODEL = "resnet18"


def client(d):
    return httpclient.InferenceServerClient("127.0.0.1:%d" % d.port)


def names(opts):
    with open(os.path.join(opts.ref, "jpegs.txt")) as f:
        return f.read().split()


def classification(result, name, k):
    """[(score, index, label)] per image from a classification output."""
    out = result.as_numpy(name)
    rows = []
    for row in out.reshape(-1, k):
        rows.append([(float(s), int(i), lab) for s, i, lab in
                     (e.decode().split(":", 2) for e in row)])
    return rows


def check_metadata(opts, d):
    c = client(d)
    assert c.is_server_live() and c.is_server_ready() and c.is_model_ready(MODEL)
    assert not c.is_model_ready("resnet50")
    assert not c.is_model_ready(MODEL, "2")
    meta = c.get_server_metadata()
    assert "classification" in meta["extensions"] and "binary_tensor_data" in meta["extensions"], meta
    m = c.get_model_metadata(MODEL, "1")
    assert {i["name"] for i in m["inputs"]} == {"input", "pixels", "jpeg"}, m
    try:
        c.get_model_metadata("resnet50")
        raise AssertionError("unknown model answered")
    except InferenceServerException as e:
        assert "resnet50" in e.message(), e
    return "live, ready, metadata; unknown model raises"


def check_fp32_json_and_binary(opts, d):
    c = client(d)
    ref = np.load(os.path.join(opts.ref, "logits.npy"))
    n = names(opts)
    rows = [0, 1]
    x = np.stack([np.load(os.path.join(opts.ref, "input", n[r] + ".npy")) for r in rows]).astype(np.float32)
    worst = 0.0
    for binary in (False, True):
        inp = httpclient.InferInput("input", list(x.shape), "FP32")
        inp.set_data_from_numpy(x, binary_data=binary)
        out = httpclient.InferRequestedOutput("logits", binary_data=binary)
        res = c.infer(MODEL, [inp], outputs=[out], request_id="fp32-%d" % binary)
        assert res.get_response()["id"] == "fp32-%d" % binary
        got = res.as_numpy("logits")
        assert got.shape == (2, ref.shape[1]), got.shape
        for i, r in enumerate(rows):
            e = float(np.linalg.norm(got[i] - ref[r]) / np.linalg.norm(ref[r]))
            worst = max(worst, e)
            assert e <= 1e-5, (binary, r, e)
            assert list(np.argsort(-got[i])[:5]) == list(np.argsort(-ref[r])[:5])
    return "torchvision tensors, JSON and binary: worst rel L2 %.2g" % worst


def check_jpeg_bytes_classification(opts, d):
    c = client(d)
    k = 5
    picks = ["s224x224", "s333x500", "photo_grace_hopper"]
    data = [dc.read_file(os.path.join(opts.ref, "jpeg", p + ".jpg")) for p in picks]
    inp = httpclient.InferInput("jpeg", [len(data)], "BYTES")
    inp.set_data_from_numpy(np.array(data, dtype=np.object_), binary_data=True)
    out = httpclient.InferRequestedOutput("probabilities", binary_data=True, class_count=k)
    res = c.infer(MODEL, [inp], outputs=[out], model_version="1")
    got = classification(res, "probabilities", k)
    for p, jpeg, rows in zip(picks, data, got):
        want = dc.ok_classify(d, jpeg, k)["results"][0]["predictions"]
        assert [r[1] for r in rows] == [w["index"] for w in want], (p, rows, want)
        assert [r[2] for r in rows] == [w["label"] for w in want], (p, rows, want)
        assert all(abs(r[0] - w["score"]) <= 2e-6 for r, w in zip(rows, want)), (p, rows, want)
    return "%d JPEGs as BYTES: top-%d equals /classify" % (len(picks), k)


def check_pixels(opts, d):
    c = client(d)
    try:
        from PIL import Image
    except ImportError:
        return "skipped: no PIL"
    p = os.path.join(opts.ref, "jpeg", "s333x500.jpg")
    px = np.asarray(Image.open(p).convert("RGB"))[None]
    inp = httpclient.InferInput("pixels", list(px.shape), "UINT8")
    inp.set_data_from_numpy(px, binary_data=True)
    res = c.infer(MODEL, [inp], outputs=[httpclient.InferRequestedOutput("probabilities", class_count=3)])
    want = dc.ok_classify(d, dc.read_file(p), 3)["results"][0]["predictions"]
    got = classification(res, "probabilities", 3)[0]
    assert [g[1] for g in got] == [w["index"] for w in want], (got, want)
    return "PIL pixels as UINT8: top-3 equals /classify"


def check_errors(opts, d):
    c = client(d)
    inp = httpclient.InferInput("input", [1, 3, 224, 223], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 3, 224, 223), np.float32))
    try:
        c.infer(MODEL, [inp])
        raise AssertionError("a wrong shape was accepted")
    except InferenceServerException as e:
        assert "shape" in e.message() and e.status() == "400", (e.status(), e.message())
    return "wrong shape: InferenceServerException 400"


def check_config_stats_index(opts, d):
    """What Triton's tools (perf_analyzer, model_analyzer, dashboards) ask
    for: the model configuration, the inference statistics and the
    repository index, in Triton's shapes."""
    c = client(d)
    cfg = c.get_model_config(MODEL)
    assert cfg["name"] == MODEL and cfg["max_batch_size"] >= 1, cfg
    ins = {i["name"]: i for i in cfg["input"]}
    assert ins["input"]["data_type"] == "TYPE_FP32" and ins["input"]["dims"] == [3, 224, 224], cfg
    assert ins["jpeg"]["data_type"] == "TYPE_STRING" and ins["pixels"]["dims"] == [-1, -1, 3], cfg
    outs = {o["name"]: o for o in cfg["output"]}
    assert outs["logits"]["dims"] == [1000] and outs["probabilities"]["data_type"] == "TYPE_FP32", cfg
    assert "max_queue_delay_microseconds" in cfg["dynamic_batching"], cfg
    assert cfg["instance_group"][0]["kind"] == "KIND_CPU", cfg
    assert c.get_model_config(MODEL, "1") == cfg
    before = c.get_inference_statistics(MODEL)["model_stats"][0]
    x = np.zeros((2, 3, 224, 224), np.float32)
    inp = httpclient.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    c.infer(MODEL, [inp])
    # A request is counted when it ends, just after its answer went out.
    want = before["inference_stats"]["success"]["count"] + 1
    for _ in range(100):
        st = c.get_inference_statistics(MODEL, "1")["model_stats"][0]
        if st["inference_stats"]["success"]["count"] >= want:
            break
        time.sleep(0.02)
    assert st["name"] == MODEL and st["version"] == "1", st
    ok = st["inference_stats"]["success"]
    assert ok["count"] == before["inference_stats"]["success"]["count"] + 1 and ok["ns"] > 0, (before, st)
    assert st["inference_count"] == before["inference_count"] + 2 and st["execution_count"] >= 1, st
    for k in ("queue", "compute_input", "compute_infer", "compute_output", "fail"):
        assert set(st["inference_stats"][k]) == {"count", "ns"}, st
    assert st["inference_stats"]["compute_infer"]["ns"] > 0 and st["last_inference"] > 1.7e12, st
    assert st["batch_stats"] and all(b["compute_infer"]["count"] > 0 for b in st["batch_stats"]), st
    # A failed inference counts as a fail; a request for the wrong method
    # is no inference and does not count.
    import http.client
    conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=30)
    conn.request("POST", "/classify", b"not a jpeg", {"Content-Type": "image/jpeg"})
    assert conn.getresponse().read() and True
    conn.request("GET", "/classify")
    r = conn.getresponse()
    r.read()
    assert r.status == 405, r.status
    conn.close()
    for _ in range(100):
        after = c.get_inference_statistics(MODEL)["model_stats"][0]["inference_stats"]["fail"]["count"]
        if after > st["inference_stats"]["fail"]["count"]:
            break
        time.sleep(0.02)
    time.sleep(0.1)   # the 405, had it counted, would be in by now
    after = c.get_inference_statistics(MODEL)["model_stats"][0]["inference_stats"]["fail"]["count"]
    assert after == st["inference_stats"]["fail"]["count"] + 1, (after, st["inference_stats"]["fail"])
    every = c.get_inference_statistics()["model_stats"]
    assert [m["name"] for m in every] == [MODEL], every
    index = c.get_model_repository_index()
    assert index == [{"name": MODEL, "version": "1", "state": "READY", "reason": ""}], index
    try:
        c.get_model_config("resnet50")
        raise AssertionError("an unknown model's config answered")
    except InferenceServerException as e:
        assert "resnet50" in e.message(), e
    return "config (%d inputs, max batch %d), stats (%d successes, %d batch sizes), index %s" % (
        len(cfg["input"]), cfg["max_batch_size"], ok["count"], len(st["batch_stats"]), index[0]["state"])


def check_readme_example(opts, d):
    """README.md's tritonclient example, run as written but for the port
    (and the sample photo, where python-matplotlib-data is missing)."""
    import contextlib
    import io
    import re
    readme = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "README.md")
    text = open(readme).read()
    block = re.search(r"```python\n(.*?)```", text[text.index("tritonclient[http]"):], re.S).group(1)
    code = block.replace("localhost:8080", "127.0.0.1:%d" % d.port)
    photo = "/usr/share/matplotlib/mpl-data/sample_data/grace_hopper.jpg"
    if not os.path.exists(photo):
        code = code.replace(photo, os.path.join(opts.ref, "jpeg", "s640x480.jpg"))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {})
    lines = out.getvalue().splitlines()
    assert lines and lines[0].count(":") >= 3 and int(lines[-1].split()[1]) >= 1, out.getvalue()
    return "README's tritonclient example: %d lines printed" % len(lines)


CHECKS = [
    ("triton_metadata", check_metadata, True),
    ("triton_fp32_json_and_binary", check_fp32_json_and_binary, True),
    ("triton_jpeg_bytes_classification", check_jpeg_bytes_classification, True),
    ("triton_pixels", check_pixels, True),
    ("triton_errors", check_errors, True),
    ("triton_config_stats_index", check_config_stats_index, True),
    ("triton_readme_example", check_readme_example, True),
]

if __name__ == "__main__":
    sys.exit(dc.main(CHECKS))
