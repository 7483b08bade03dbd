#!/usr/bin/env python3
"""Compares resnetd-classify's JSON output and dumped inputs with torchvision's
reference (tests/reference.py). Used by tests/engine/test_classify.sh; exits 1 on
any mismatch, printing per-file figures."""
import json
import os
import sys

import numpy as np

ref, jsonl, dump = sys.argv[1:4]
names = open(os.path.join(ref, "jpegs.txt")).read().split()
want = np.load(os.path.join(ref, "logits.npy"))
got = [json.loads(line) for line in open(jsonl)]
bad = 0
if len(got) != len(names):
    print(f"expected {len(names)} results, got {len(got)}")
    sys.exit(1)
worst_l2 = worst_in = 0.0
for i, (n, r) in enumerate(zip(names, got)):
    assert r["file"].endswith("/" + n + ".jpg"), (r["file"], n)
    logits = np.array(r["logits"], dtype=np.float64)
    rel = np.linalg.norm(logits - want[i]) / np.linalg.norm(want[i])
    top1_ok = int(np.argmax(logits)) == int(np.argmax(want[i])) == r["predictions"][0]["index"]
    scores = [p["score"] for p in r["predictions"]]
    sorted_ok = scores == sorted(scores, reverse=True) and len(scores) == 5
    x = np.load(os.path.join(dump, n + ".npy"))
    tv = np.load(os.path.join(ref, "input", n + ".npy"))
    din = float(np.abs(x.astype(np.float64) - tv).max()) if x.shape == tv.shape else float("inf")
    worst_l2, worst_in = max(worst_l2, rel), max(worst_in, din)
    ok = rel <= 1e-3 and top1_ok and sorted_ok and din <= 1.0 / 255 / 0.224 + 1e-6
    bad += not ok
    print(f"{'ok ' if ok else 'BAD'} {n:32s} rel_l2 {rel:.2e} top1 {top1_ok} input max|d| {din:.2e}")
print(f"{len(names)} files, worst rel L2 {worst_l2:.2e}, worst input diff {worst_in:.2e}, {bad} bad")
sys.exit(1 if bad else 0)
