"""Tests for resnetd-load against tests/client/fake_server on loopback: exact
accounting of 503s and dropped connections (checked against the server's own
counts), open-loop latency that includes time spent waiting to be sent,
timeouts and drain, multipart, warm-up, and clear failures for bad arguments,
an unreachable server and an empty corpus. Standard library only; every run
is bounded (a few seconds each)."""
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import unittest

BUILD = os.environ.get("RESNETD_BUILDDIR", ".")
LOAD = os.path.join(BUILD, "resnetd-load")
FAKE = os.path.join(BUILD, "tests", "client", "fake_server")
RUN_TIMEOUT = 60


class FakeServer:
    """fake_server with the given options; .stats after the block."""

    def __init__(self, *args):
        self.args = [FAKE, *args]
        self.stats = None

    def __enter__(self):
        self.proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, text=True)
        self.port = int(self.proc.stdout.readline())
        return self

    def __exit__(self, *exc):
        self.proc.send_signal(signal.SIGTERM)
        out, _ = self.proc.communicate(timeout=10)
        self.stats = {k: int(v) for k, v in (line.split("=") for line in out.split())}
        return False

    def url(self):
        return "http://127.0.0.1:%d/classify" % self.port


def make_corpus(directory, n=8, size=6000):
    """Files that start and end like JPEGs: the fake server reads no pixels."""
    for i in range(n):
        body = bytes((i * 7 + j * 13) % 256 for j in range(size + 500 * i))
        with open(os.path.join(directory, "img%02d.jpg" % i), "wb") as f:
            f.write(b"\xff\xd8\xff\xe0" + body + b"\xff\xd9")


def run_load(*args, expect_rc=0):
    p = subprocess.run([LOAD, "--json", "--quiet", *args], capture_output=True, text=True, timeout=RUN_TIMEOUT)
    if p.returncode != expect_rc:
        raise AssertionError("resnetd-load %s: exit %d, expected %d\n%s%s"
                             % (" ".join(args), p.returncode, expect_rc, p.stdout, p.stderr))
    return json.loads(p.stdout) if expect_rc == 0 else p


class LoadTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.corpus = cls.tmp.name
        make_corpus(cls.corpus)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def assert_accounted(self, r):
        req = r["requests"]
        self.assertEqual(req["sent"], req["answered"], "every sent request ends exactly once")
        self.assertEqual(req["lost"], 0)
        answered = sum(r["http_status"].values()) + sum(r["transport_errors"].values())
        self.assertEqual(answered, req["answered"], "statuses and errors add up to the answers")

    def assert_percentiles_ordered(self, lat):
        keys = ["min", "p50", "p90", "p99", "p99.9", "max"]
        for k in keys:
            self.assertIn(k, lat)
        values = [lat[k] for k in keys]
        self.assertEqual(values, sorted(values), "percentiles out of order: %s" % lat)
        self.assertGreater(lat["min"], 0)

    def test_503_and_dropped_connections_counted_exactly(self):
        with FakeServer("--503-every", "7", "--close-every", "11", "--batch-size", "4") as srv:
            r = run_load("-u", srv.url(), "-c", "4", "-t", "2", "-n", "3000", self.corpus)
        self.assert_accounted(r)
        st = srv.stats
        self.assertEqual(r["requests"]["sent"], 3000)
        self.assertEqual(st["requests"], 3000, "the server saw exactly what was sent")
        self.assertEqual(r["http_status"].get("503", 0), st["status_503"])
        self.assertEqual(r["http_status"].get("200", 0), st["ok"])
        self.assertEqual(r["requests"]["ok"], st["ok"])
        dropped = r["transport_errors"]["closed"] + r["transport_errors"]["reset"]
        self.assertEqual(dropped, st["closed"])
        self.assertGreater(st["closed"], 200)
        self.assertGreater(st["status_503"], 200)
        self.assert_percentiles_ordered(r["latency_ms"])
        # the server's view, from /metrics before and after
        self.assertAlmostEqual(r["server"]["mean_batch_size"], 4.0)
        self.assertAlmostEqual(r["server"]["mean_queue_ms"], 2.0, places=3)
        self.assertEqual(r["server"]["rejected"]["queue_full"], st["status_503"])
        self.assertEqual(r["server"]["images"], st["images"])
        self.assertGreaterEqual(r["client_cpu"]["cores"], 0)

    def test_open_loop_latency_includes_waiting_to_be_sent(self):
        # the server answers one request per 5 ms (200/s); offered 400/s on one
        # connection, requests queue in the client and their latency must show it
        with FakeServer("--stall-ms", "5") as srv:
            closed = run_load("-u", srv.url(), "-c", "1", "-d", "1", self.corpus)
            opened = run_load("-u", srv.url(), "-c", "1", "-r", "400", "--arrival", "uniform", "-d", "1",
                              self.corpus)
        for r in (closed, opened):
            self.assert_accounted(r)
            self.assert_percentiles_ordered(r["latency_ms"])
        # closed loop only ever sees the service time
        self.assertLess(closed["latency_ms"]["p50"], 15)
        self.assertGreater(closed["latency_ms"]["p50"], 4)
        # open loop: the backlog grows to ~0.5 s; the median request waited long
        self.assertEqual(opened["requests"]["sent"], 400)
        self.assertEqual(opened["requests"]["unsent"], 0)
        self.assertLess(opened["service_ms"]["p50"], 15)
        self.assertGreater(opened["latency_ms"]["p50"], 150)
        self.assertGreater(opened["latency_ms"]["max"], 350)
        self.assertGreater(opened["latency_ms"]["p50"], 10 * opened["service_ms"]["p50"])

    def test_open_loop_arrivals_follow_the_rate(self):
        with FakeServer() as srv:
            uni = run_load("-u", srv.url(), "-r", "300", "--arrival", "uniform", "-d", "1", "-t", "2",
                           self.corpus)
            poi = run_load("-u", srv.url(), "-r", "300", "--arrival", "poisson", "-d", "1", "-t", "2",
                           self.corpus)
            fixed = run_load("-u", srv.url(), "-r", "500", "-n", "250", self.corpus)
        self.assertIn(uni["requests"]["sent"], (299, 300, 301))
        self.assertTrue(230 <= poi["requests"]["sent"] <= 370, poi["requests"])
        self.assertEqual(fixed["requests"]["sent"], 250)
        for r in (uni, poi, fixed):
            self.assert_accounted(r)
            self.assertEqual(r["requests"]["ok"], r["requests"]["sent"])

    def test_request_timeout_and_drain_timeout_are_counted(self):
        with FakeServer("--stall-ms", "3000") as srv:
            # one connection; its first request is stuck for 3 s > 0.3 s timeout
            t = run_load("-u", srv.url(), "-c", "1", "-d", "0.5", "--timeout", "0.3", self.corpus)
        self.assert_accounted(t)
        self.assertGreaterEqual(t["transport_errors"]["timeout"], 1)
        self.assertEqual(t["requests"]["ok"], 0)
        with FakeServer("--stall-ms", "3000") as srv:
            d = run_load("-u", srv.url(), "-c", "3", "-d", "0.2", "--drain-timeout", "0.3", self.corpus)
        self.assert_accounted(d)
        self.assertEqual(d["requests"]["sent"], 3)
        self.assertEqual(d["transport_errors"]["drain_timeout"], 3)

    def test_multipart_sends_k_images_per_request(self):
        with FakeServer() as srv:
            r = run_load("-u", srv.url(), "-k", "3", "-n", "200", "-c", "4", self.corpus)
        self.assert_accounted(r)
        self.assertTrue(r["multipart"])
        self.assertEqual(srv.stats["images"], 600)
        self.assertAlmostEqual(r["throughput"]["img_per_s"] / r["throughput"]["req_per_s"], 3.0, places=6)

    def test_warmup_is_reported_apart(self):
        with FakeServer() as srv:
            r = run_load("-u", srv.url(), "-c", "2", "--warmup", "0.3", "-n", "500", self.corpus)
        self.assert_accounted(r)
        self.assertEqual(r["requests"]["sent"], 500)
        self.assertGreater(r["requests"]["warmup_sent"], 0)
        self.assertEqual(srv.stats["requests"], 500 + r["requests"]["warmup_sent"])

    def test_unreachable_server_is_a_clear_error(self):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()   # nothing listens there now
        p = run_load("-u", "http://127.0.0.1:%d/classify" % port, "-n", "5", self.corpus, expect_rc=1)
        self.assertIn("cannot reach", p.stderr)
        self.assertIn("refused", p.stderr)

    def test_empty_corpus_is_a_clear_error(self):
        with tempfile.TemporaryDirectory() as empty, FakeServer() as srv:
            p = run_load("-u", srv.url(), "-n", "5", empty, expect_rc=1)
            self.assertIn("no JPEG", p.stderr)
            with open(os.path.join(empty, "x.jpg"), "wb") as f:
                f.write(b"not a jpeg")
            p = run_load("-u", srv.url(), "-n", "5", empty, expect_rc=1)
            self.assertIn("not a JPEG", p.stderr)
        self.assertEqual(srv.stats["requests"], 0)

    def test_bad_arguments_exit_2_with_a_message(self):
        for args in (["-c", "0"], ["--arrival", "bursty", "-r", "5"], ["-d", "1", "-n", "5"], ["--frobnicate"],
                     ["-r", "-3"], ["-k", "999"], ["-u", "https://127.0.0.1:1/"], ["-u", "http://127.0.0.1:99999/"],
                     ["-t", "8", "-c", "4"]):
            p = run_load(*args, self.corpus, expect_rc=2)
            self.assertIn("resnetd-load", p.stderr, args)


if __name__ == "__main__":
    for path in (LOAD, FAKE):
        if not os.access(path, os.X_OK):
            sys.exit("missing %s: build first" % path)
    unittest.main(verbosity=2)
