"""resnetd-load against the real resnetd (CPU engine, reference weights) on
loopback for ~3 s per run: nothing is lost (sent = answered = ok), the
percentiles are present and ordered, and the server's own count of images
over the run equals the client's. With a small body limit the daemon answers
413 before reading the body and closes; those answers are counted as 413s,
not as transport errors."""
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import unittest

BUILD = os.environ.get("RESNETD_BUILDDIR", ".")
SRC = os.environ.get("RESNETD_SRCDIR", ".")
REF = os.environ.get("RESNETD_REF_DIR", "")


class Daemon:
    def __init__(self, *args):
        self.args = list(args)

    def __enter__(self):
        self.log = tempfile.NamedTemporaryFile("w+", suffix=".log")
        self.proc = subprocess.Popen(
            [os.path.join(BUILD, "resnetd"), "--weights", os.path.join(REF, "weights.safetensors"),
             "--labels", os.path.join(SRC, "etc", "imagenet-classes.txt"), "--device", "cpu",
             "--listen", "127.0.0.1:0", *self.args], stderr=self.log)
        deadline = time.time() + 120
        while time.time() < deadline:
            with open(self.log.name) as f:
                text = f.read()
            m = re.search(r"\(port (\d+)\)", text)
            if m and re.search(r"\bready\b", text):
                self.port = int(m.group(1))
                return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        self.proc.kill()
        with open(self.log.name) as f:
            raise AssertionError("resnetd did not become ready:\n" + f.read())

    def __exit__(self, *exc):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            self.log.close()
        return False


def run_load(port, *args):
    p = subprocess.run([os.path.join(BUILD, "resnetd-load"), "--json", "--quiet",
                        "-u", "http://127.0.0.1:%d/classify" % port, *args, os.path.join(REF, "jpeg")],
                       capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        raise AssertionError("resnetd-load exit %d: %s" % (p.returncode, p.stderr))
    return json.loads(p.stdout)


class LoadDaemonTest(unittest.TestCase):
    def check_run(self, r, images_per_request):
        req = r["requests"]
        self.assertGreater(req["sent"], 0)
        self.assertEqual(req["sent"], req["answered"])
        self.assertEqual(req["sent"], req["ok"], r)
        self.assertEqual(sum(r["transport_errors"].values()), 0)
        lat = r["latency_ms"]
        values = [lat[k] for k in ("min", "p50", "p90", "p99", "p99.9", "max")]
        self.assertEqual(values, sorted(values))
        self.assertGreater(values[0], 0)
        self.assertEqual(r["server"]["images"], req["ok"] * images_per_request)
        self.assertGreaterEqual(r["server"]["mean_batch_size"], 1.0)
        self.assertEqual(sum(r["server"]["rejected"].values()), 0)

    def test_nothing_lost_raw_and_multipart(self):
        with Daemon() as d:
            self.check_run(run_load(d.port, "-c", "8", "-d", "3"), 1)
            self.check_run(run_load(d.port, "-c", "2", "-k", "3", "-d", "3"), 3)

    def test_early_413_answers_are_counted_as_413(self):
        big = [f for f in os.listdir(os.path.join(REF, "jpeg")) if os.path.getsize(os.path.join(REF, "jpeg", f)) > 65536]
        self.assertTrue(big, "the reference JPEGs include some over 64 KiB")
        with Daemon("--max-body-bytes=64K") as d:
            # raw: the big images get 413; multipart with 8 images: every request does
            for r in (run_load(d.port, "-c", "4", "-d", "2"), run_load(d.port, "-c", "2", "-k", "8", "-d", "1")):
                req = r["requests"]
                self.assertEqual(req["sent"], req["answered"])
                self.assertEqual(sum(r["transport_errors"].values()), 0, r["transport_errors"])
                self.assertGreater(r["http_status"].get("413", 0), 0)
                self.assertEqual(r["http_status"].get("413", 0) + req["ok"], req["sent"])
                self.assertEqual(r["server"]["rejected"]["too_large"], r["http_status"]["413"])


if __name__ == "__main__":
    unittest.main(verbosity=2)
