#!/usr/bin/python3
"""Hostile traffic against a running resnetd, for tools/soak.sh and
tools/slowloris-p99.sh (benchmarks, not tests). Standard library only.

  hostile_load.py p99  --port P --jpeg F [--seconds S] [--slowloris N] [--aborts-per-s R]
                       [--idle N] [--attack-addr A] [--pid PID]
      N slowloris connections (a byte every 10 s, reconnecting when
      dropped), R aborted uploads a second and N idle sockets (connected,
      silent, reconnecting as dropped), all from address A (127.0.0.2),
      while one legitimate client on 127.0.0.1 sends POST /classify on a
      fresh connection, one at a time; prints the legitimate client's
      latency percentiles (and, with --pid, the daemon's fds before and
      after).

  hostile_load.py soak --port P --pid PID --jpeg F [--seconds S] [--sample-s T]
      Mixed traffic: good requests, bad ones (corrupt JPEG, unknown path,
      ambiguous framing, GET with a body), half-closed clients, aborted
      uploads and slow clients; every T seconds prints the daemon's RSS,
      open fds and connections, and the requests sent and answered. At the
      end: RSS growth after warm-up, the fd range, and sent = answered.
"""

import argparse
import random
import re
import socket
import sys
import threading
import time


def recv_response(s, limit_s):
    """One complete HTTP response (status, bytes), or (None, bytes)."""
    s.settimeout(limit_s)
    data = b""
    deadline = time.time() + limit_s
    while time.time() < deadline:
        try:
            b = s.recv(65536)
        except (socket.timeout, ConnectionResetError, BrokenPipeError):
            break
        if not b:
            break
        data += b
        head, sep, rest = data.partition(b"\r\n\r\n")
        m = re.search(rb"(?i)content-length: *(\d+)", head)
        if sep and m and len(rest) >= int(m.group(1)):
            st = re.match(rb"HTTP/1\.[01] (\d{3})", data)
            return (int(st.group(1)) if st else None), data
    return None, data


def post_jpeg(jpeg, path="/classify"):
    return (b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: image/jpeg\r\nConnection: close\r\n"
            b"Content-Length: %d\r\n\r\n" % (path.encode(), len(jpeg)) + jpeg)


def one_request(port, payload, half_close=False, limit_s=30):
    s = socket.create_connection(("127.0.0.1", port), timeout=limit_s)
    try:
        s.sendall(payload)
        if half_close:
            s.shutdown(socket.SHUT_WR)
        return recv_response(s, limit_s)
    finally:
        s.close()


class Stop:
    def __init__(self, seconds):
        self.end = time.time() + seconds

    def __bool__(self):
        return time.time() >= self.end


def idle_attack(port, n, stopped, stats, src):
    """n sockets from address src that connect and never send; each one
    the server answers or closes is replaced at once. stats counts "503"
    answers, "dropped" sockets and "connect_failed"."""
    import selectors
    sel = selectors.DefaultSelector()
    live = [0]

    def connect():
        s = socket.socket()
        s.setblocking(False)
        try:
            s.bind((src, 0))
            s.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        except OSError:
            s.close()
            stats["connect_failed"] += 1
            return False
        sel.register(s, selectors.EVENT_READ)
        live[0] += 1
        return True
    while not stopped():
        while live[0] < n and not stopped() and connect():
            pass
        for key, _ in sel.select(timeout=0.1):
            s = key.fileobj
            try:
                data = s.recv(4096)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if data.startswith(b"HTTP/1.1 503"):
                stats["503"] += 1
            sel.unregister(s)
            s.close()
            live[0] -= 1
            stats["dropped"] += 1
    for key in list(sel.get_map().values()):
        key.fileobj.close()
    sel.close()


def slowloris(port, n, stop, stats, lock, src):
    """n connections from src, each sending one header byte every 10 s; a
    dropped one is replaced."""
    socks = []

    def connect():
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(src, 0))
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            s.setblocking(False)
            return [s, time.time()]
        except OSError:
            with lock:
                stats["slow_connect_failed"] += 1
            return None
    while not stop and len(socks) < n:
        c = connect()
        if c:
            socks.append(c)
    while not stop:
        now = time.time()
        for i, c in enumerate(socks):
            if c is None:
                socks[i] = connect()
                continue
            s, last = c
            dropped = False
            try:
                if s.recv(4096) == b"":
                    dropped = True
            except BlockingIOError:
                pass
            except OSError:
                dropped = True
            if not dropped and now - last >= 10:
                try:
                    s.send(b"a")
                    c[1] = now
                except OSError:
                    dropped = True
            if dropped:
                s.close()
                with lock:
                    stats["slow_dropped"] += 1
                socks[i] = connect()
        time.sleep(0.05)
    for c in socks:
        if c:
            c[0].close()


def aborter(port, per_s, stop, stats, lock, src):
    """Headers and 1 KB of a 50 KB body, then close, per_s times a second,
    from src."""
    head = (b"POST /classify HTTP/1.1\r\nHost: x\r\nContent-Type: image/jpeg\r\n"
            b"Content-Length: 50000\r\n\r\n" + b"\xff" * 1024)
    t = time.time()
    while not stop:
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(src, 0))
            s.sendall(head)
            s.close()
            with lock:
                stats["aborted"] += 1
        except OSError:
            with lock:
                stats["abort_connect_failed"] += 1
        t += 1.0 / per_s
        time.sleep(max(0, t - time.time()))


def percentile(sorted_values, q):
    if not sorted_values:
        return float("nan")
    i = min(len(sorted_values) - 1, max(0, int(round(q * (len(sorted_values) - 1)))))
    return sorted_values[i]


def run_p99(a):
    jpeg = open(a.jpeg, "rb").read()
    stop = Stop(a.seconds + a.warmup)
    lock = threading.Lock()
    stats = dict(slow_dropped=0, slow_connect_failed=0, aborted=0, abort_connect_failed=0)
    idle = {"503": 0, "dropped": 0, "connect_failed": 0}
    fds_before = proc_fds(a.pid) if a.pid else None
    threads = [threading.Thread(target=slowloris, args=(a.port, a.slowloris, stop, stats, lock, a.attack_addr)),
               threading.Thread(target=aborter, args=(a.port, a.aborts_per_s, stop, stats, lock, a.attack_addr)),
               threading.Thread(target=idle_attack, args=(a.port, a.idle, lambda: bool(stop), idle, a.attack_addr))]
    for t in threads:
        t.start()
    time.sleep(a.warmup)   # the attack's connections are all open by now
    lat, failed = [], []
    while not stop:
        t0 = time.time()
        try:
            status, data = one_request(a.port, post_jpeg(jpeg), limit_s=30)
        except OSError as e:
            status, data = None, repr(e).encode()
        dt = time.time() - t0
        if status == 200:
            lat.append(dt)
        else:
            failed.append((status, data[:80]))
        time.sleep(0.05)
    for t in threads:
        t.join()
    lat.sort()
    print("legitimate client: %d answered 200, %d failed %s" % (len(lat), len(failed), failed[:3]))
    print("latency s: p50 %.3f  p90 %.3f  p99 %.3f  max %.3f" % (
        percentile(lat, 0.5), percentile(lat, 0.9), percentile(lat, 0.99), lat[-1] if lat else float("nan")))
    print("attack: %d slowloris (%d dropped by the server and reopened, %d connects failed); "
          "%d aborted uploads (%d connects failed)" % (a.slowloris, stats["slow_dropped"],
                                                       stats["slow_connect_failed"], stats["aborted"],
                                                       stats["abort_connect_failed"]))
    print("attack: %d idle sockets (%d answered 503, %d dropped by the server and reopened, %d connects "
          "failed), all from %s" % (a.idle, idle["503"], idle["dropped"], idle["connect_failed"], a.attack_addr))
    if a.pid:
        time.sleep(5)   # the server's side of the attack's last connections
        print("daemon fds: %d before the attack, %d 5 s after it" % (fds_before, proc_fds(a.pid)))
    share = len(lat) / max(1, len(lat) + len(failed))
    ok = lat and share >= 0.99 and percentile(lat, 0.99) < 1.0
    print("legitimate: %.1f%% answered 200, p99 %.3f s: %s" % (100 * share, percentile(lat, 0.99),
                                                                 "yes (>= 99%, < 1 s)" if ok else "NO"))
    return 0 if ok else 1


# ---- soak ------------------------------------------------------------------------

def proc_rss_kb(pid):
    with open("/proc/%d/status" % pid) as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))


def proc_fds(pid):
    import os
    return len(os.listdir("/proc/%d/fd" % pid))


def metric(port, name):
    try:
        status, data = one_request(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                                   limit_s=10)
    except OSError:
        return None
    m = re.search(rb"(?m)^" + name.encode() + rb" (\S+)$", data)
    return float(m.group(1)) if m else None


def run_soak(a):
    jpeg = open(a.jpeg, "rb").read()
    corrupt = jpeg[:len(jpeg) // 2]
    bad = [
        post_jpeg(corrupt),
        post_jpeg(b"not a jpeg at all"),
        b"GET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        b"POST /classify HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello",
        b"POST /classify HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\n\r\n",
    ]
    stop = Stop(a.seconds)
    lock = threading.Lock()
    stats = dict(sent=0, answered=0, status={}, slow_dropped=0, slow_connect_failed=0, aborted=0,
                 abort_connect_failed=0)

    def exchange(payload, half_close=False):
        with lock:
            stats["sent"] += 1
        try:
            status, _ = one_request(a.port, payload, half_close=half_close, limit_s=60)
        except OSError:
            status = None
        with lock:
            if status is not None:
                stats["answered"] += 1
            stats["status"][status] = stats["status"].get(status, 0) + 1

    def good():
        rnd = random.Random()
        while not stop:
            exchange(post_jpeg(jpeg), half_close=rnd.random() < 0.2)
            time.sleep(rnd.uniform(0, 0.2))

    def bad_client():
        rnd = random.Random(1)
        while not stop:
            exchange(rnd.choice(bad))
            time.sleep(rnd.uniform(0, 0.1))

    threads = [threading.Thread(target=good) for _ in range(a.good_clients)]
    threads += [threading.Thread(target=bad_client) for _ in range(2)]
    threads.append(threading.Thread(target=aborter, args=(a.port, a.aborts_per_s, stop, stats, lock, a.attack_addr)))
    threads.append(threading.Thread(target=slowloris, args=(a.port, a.slowloris, stop, stats, lock, a.attack_addr)))
    for t in threads:
        t.start()
    samples = []
    t0 = time.time()
    print("%7s %9s %6s %6s %9s %9s  statuses" % ("t_s", "rss_kb", "fds", "conns", "sent", "answered"),
          flush=True)
    while not stop:
        time.sleep(min(a.sample_s, max(0.1, stop.end - time.time())))
        rss, fds, conns = proc_rss_kb(a.pid), proc_fds(a.pid), metric(a.port, "resnetd_connections")
        with lock:
            sent, answered, st = stats["sent"], stats["answered"], dict(stats["status"])
        samples.append((time.time() - t0, rss, fds))
        print("%7.0f %9d %6d %6s %9d %9d  %s" % (time.time() - t0, rss, fds,
                                                 "?" if conns is None else "%d" % conns, sent, answered,
                                                 " ".join("%s:%d" % kv for kv in sorted(st.items(), key=str))),
              flush=True)
    for t in threads:
        t.join()
    # After the load stops: every connection closes, fds back to idle.
    time.sleep(2)
    rss_end, fds_end = proc_rss_kb(a.pid), proc_fds(a.pid)
    warm = [s for s in samples if s[0] >= a.warmup_s] or samples
    rss0 = warm[0][1]
    rss_max = max(s[1] for s in warm)
    growth = 100.0 * (samples[-1][1] - rss0) / rss0
    growth_max = 100.0 * (rss_max - rss0) / rss0
    fds_seen = [s[2] for s in warm]
    print("after warm-up (%d s): RSS %d -> %d kB (%+.1f%%; peak %+.1f%%); fds %d..%d under load, %d idle after"
          % (a.warmup_s, rss0, samples[-1][1], growth, growth_max, min(fds_seen), max(fds_seen), fds_end))
    print("sent %d, answered %d (%s); %d aborted uploads, %d slow clients dropped by the server"
          % (stats["sent"], stats["answered"], "equal" if stats["sent"] == stats["answered"] else "NOT EQUAL",
             stats["aborted"], stats["slow_dropped"]))
    ok = stats["sent"] == stats["answered"] and growth_max <= 5.0
    print("soak: %s" % ("PASS" if ok else "FAIL"))
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["p99", "soak"])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--jpeg", required=True)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--warmup", type=float, default=5, help="p99: seconds of attack before measuring")
    ap.add_argument("--slowloris", type=int, default=1100)
    ap.add_argument("--aborts-per-s", type=float, default=100)
    ap.add_argument("--idle", type=int, default=0, help="p99: idle sockets")
    ap.add_argument("--attack-addr", default="127.0.0.2", help="the attack's source address")
    ap.add_argument("--pid", type=int)
    ap.add_argument("--sample-s", type=float, default=10)
    ap.add_argument("--warmup-s", type=float, default=60, help="soak: RSS growth is measured from here")
    ap.add_argument("--good-clients", type=int, default=4)
    a = ap.parse_args()
    return run_p99(a) if a.mode == "p99" else run_soak(a)


if __name__ == "__main__":
    sys.exit(main())
