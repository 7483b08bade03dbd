"""resnetd with the CUDA engine and GPU JPEG decoding (decode = gpu), on a
machine with a GPU: every error case of the CPU tests gets the same answer
(bad input is refused from its header, before the hardware sees it), every
reference JPEG gets 200 (progressive ones through the CPU fallback) with the
same top-1 as the same engine with decode = cpu, and the metrics count the
images of each backend. At INT8 (a calibration table made from the reference
JPEGs) the GPU daemon answers every JPEG as the CPU INT8 daemon does: the
CUDA INT8 engine computes engine/int8.h bit for bit. Run by
tests/gpu/test_gpu_daemon.sh."""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import daemon_client as dc  # noqa: E402


class GpuDaemon(dc.Daemon):
    def __init__(self, opts, decode):
        super().__init__(opts, "--device", "cuda", "--decode", decode)


def check_errors_as_on_cpu(opts):
    d = GpuDaemon(opts, "gpu")
    try:
        assert "JPEG decoding on the GPU" in d.text(), d.text()
        note = dc.check_each_error_status(opts, d)
    finally:
        rc = d.stop()
    assert rc == 0, rc
    return note


def check_reference_jpegs(opts):
    jdir = os.path.join(opts.ref, "jpeg")
    names = sorted(n for n in os.listdir(jdir) if n.endswith(".jpg"))
    gpu = GpuDaemon(opts, "gpu")
    try:
        cpu = GpuDaemon(opts, "cpu")
        try:
            agree, progressive = 0, 0
            for n in names:
                data = dc.read_file(os.path.join(jdir, n))
                progressive += "progressive" in n
                top = []
                for d in (gpu, cpu):
                    status, _, body = d.request("POST", "/classify?top_k=1", data, {"Content-Type": "image/jpeg"})
                    assert status == 200, (n, status, body[:300])
                    top.append(json.loads(body)["results"][0]["predictions"][0]["index"])
                agree += top[0] == top[1]
        finally:
            rc_c = cpu.stop()
        text = gpu.metrics()
    finally:
        rc_g = gpu.stop()
    assert rc_g == 0 and rc_c == 0, (rc_g, rc_c)
    # Every image decoded once, by the hardware or (refused by it) the CPU.
    hw = dc.metric(text, "resnetd_decoded_images_total", {"backend": "hardware"}) or 0
    on_cpu = dc.metric(text, "resnetd_decoded_images_total", {"backend": "cpu"}) or 0
    fb = dc.metric(text, "resnetd_decode_fallbacks_total", {"reason": "unsupported"}) or 0
    assert hw + on_cpu == len(names) and hw > 0, (hw, on_cpu, len(names))
    assert fb >= progressive, (fb, progressive)
    assert agree >= 0.99 * len(names), (agree, len(names))
    # The router's measured GPU cost is published (cpu_decode_assist = auto).
    cost = dc.metric(text, "resnetd_decode_cost_seconds_per_megapixel", {"path": "gpu"})
    assert cost is not None and 0 < cost < 1, cost
    # NVML telemetry of the GPU the engine runs on (daemon/api/gputel.c).
    watts = dc.metric(text, "resnetd_gpu_power_watts")
    total = dc.metric(text, "resnetd_gpu_device_memory_total_bytes")
    util = dc.metric(text, "resnetd_gpu_utilization_ratio")
    assert watts is not None and 0 < watts < 2000 and total > 1e9 and 0 <= util <= 1, (watts, total, util)
    return "%d JPEGs: 200 each, top-1 as with decode = cpu for %d; %d by the hardware, %d on the CPU " \
           "(%d unsupported, %d progressive)" % (len(names), agree, hw, on_cpu, fb, progressive)


def check_int8_as_on_the_cpu(opts):
    jdir = os.path.join(opts.ref, "jpeg")
    names = sorted(n for n in os.listdir(jdir) if n.endswith(".jpg"))
    table = tempfile.NamedTemporaryFile(prefix="resnetd-int8-", suffix=".json", delete=False).name
    try:
        return int8_against_cpu(opts, jdir, names, table)
    finally:
        os.unlink(table)


def int8_against_cpu(opts, jdir, names, table):
    calibrate = os.path.join(os.path.dirname(opts.resnetd), "resnetd-calibrate")
    subprocess.run([calibrate, "--weights", os.path.join(opts.ref, "weights.safetensors"), "--images", jdir,
                    "--out", table], check=True, stdout=subprocess.DEVNULL)
    int8 = ("--precision", "int8", "--calibration", table)
    gpu = dc.Daemon(opts, "--device", "cuda", "--decode", "cpu", *int8)
    try:
        cpu = dc.Daemon(opts, "--device", "cpu", *int8)
        try:
            assert "int8" in gpu.text(), gpu.text()
            worst = 0.0
            for n in names:
                data = dc.read_file(os.path.join(jdir, n))
                preds = []
                for d in (gpu, cpu):
                    status, _, body = d.request("POST", "/classify?top_k=5", data, {"Content-Type": "image/jpeg"})
                    assert status == 200, (n, status, body[:300])
                    preds.append(json.loads(body)["results"][0]["predictions"])
                assert [p["index"] for p in preds[0]] == [p["index"] for p in preds[1]], (n, preds)
                for a, b in zip(*preds):
                    worst = max(worst, abs(a["score"] - b["score"]) / max(b["score"], 1e-12))
            assert worst <= 1e-4, worst
        finally:
            rc_c = cpu.stop()
    finally:
        rc_g = gpu.stop()
    assert rc_g == 0 and rc_c == 0, (rc_g, rc_c)
    return "%d JPEGs at INT8: the same top-5 as the CPU INT8 daemon, scores within %.1e" % (len(names), worst)


CHECKS = [
    ("errors_as_on_cpu", check_errors_as_on_cpu, False),
    ("reference_jpegs", check_reference_jpegs, False),
    ("int8_as_on_the_cpu", check_int8_as_on_the_cpu, False),
]

if __name__ == "__main__":
    sys.exit(dc.main(CHECKS))
