"""resnetd with the CUDA engine and GPU JPEG decoding (decode = gpu), on a
machine with a GPU: every error case of the CPU tests gets the same answer
(bad input is refused from its header, before the hardware sees it), every
reference JPEG gets 200 (progressive ones through the CPU fallback) with the
same top-1 as the same engine with decode = cpu, and the metrics count the
images of each backend. Run by tests/test_gpu_daemon.sh."""
import json
import os
import sys

import daemon_client as dc


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
    return "%d JPEGs: 200 each, top-1 as with decode = cpu for %d; %d by the hardware, %d on the CPU " \
           "(%d unsupported, %d progressive)" % (len(names), agree, hw, on_cpu, fb, progressive)


CHECKS = [
    ("errors_as_on_cpu", check_errors_as_on_cpu, False),
    ("reference_jpegs", check_reference_jpegs, False),
]

if __name__ == "__main__":
    sys.exit(dc.main(CHECKS))
