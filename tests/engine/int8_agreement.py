#!/usr/bin/env python3
"""INT8 vs FP32 from two resnetd-classify --json --logits runs over the same
files: prints the top-1 agreement count and the logits' relative L2 error,
and fails below a minimum agreement or above a maximum rel L2.

Usage: int8_agreement.py FP32.jsonl INT8.jsonl LABEL MIN_AGREEMENT MAX_REL_L2
"""
import json
import sys

import numpy as np


def read(path):
    rows = [json.loads(line) for line in open(path)]
    return [r["file"] for r in rows], np.array([r["logits"] for r in rows], dtype=np.float64)


def main():
    f32_path, i8_path, label, min_agree, max_rel = sys.argv[1:6]
    files, f32 = read(f32_path)
    files8, i8 = read(i8_path)
    assert files == files8 and len(files) > 0, "the two runs classified different files"
    agree = int((f32.argmax(1) == i8.argmax(1)).sum())
    n = len(files)
    rel = float(np.linalg.norm(i8 - f32) / np.linalg.norm(f32))
    per = np.linalg.norm(i8 - f32, axis=1) / np.linalg.norm(f32, axis=1)
    print("INT8 vs FP32, %s: top-1 agreement %d/%d (%.1f%%) on held-out photos; logits rel L2 %.4f "
          "(per image: median %.4f, max %.4f)" % (label, agree, n, 100.0 * agree / n, rel,
                                                 float(np.median(per)), float(per.max())))
    if agree < float(min_agree) * n or rel > float(max_rel):
        print("FAIL: below %s agreement or above %s rel L2" % (min_agree, max_rel))
        sys.exit(1)


if __name__ == "__main__":
    main()
