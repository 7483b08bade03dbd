#!/usr/bin/env python3
"""The PyTorch anchor for GPU JPEG decoding: torchvision.io.decode_jpeg on
the GPU (nvJPEG, batched lists) over a directory of JPEGs, decode only and
decode + Resize(256, antialias) + CenterCrop(224), as a torchvision user
would write it. Run it in the same call as tools/e2e-bench.sh on the GPU
machine; it prints one JSON object.

  tools/torchvision_decode_anchor.py DIR [--batch 128] [--passes 5]
"""
import argparse
import glob
import json
import os
import statistics
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--min-images", type=int, default=2048, help="images per timed pass (the set repeats)")
    a = ap.parse_args()
    try:
        import torch
        import torchvision
        from torchvision.io import decode_jpeg
        from torchvision.transforms.v2 import functional as F
    except ImportError as e:
        print(json.dumps({"error": f"no torch/torchvision: {e}"}))
        return 0
    if not torch.cuda.is_available():
        print(json.dumps({"error": "no CUDA device"}))
        return 0
    files = sorted(glob.glob(os.path.join(a.dir, "*.jpg")) + glob.glob(os.path.join(a.dir, "*.jpeg")))
    datas = [torchvision.io.read_file(f) for f in files]
    ok = []
    for d in datas:  # torchvision's GPU decoder refuses some files (progressive on some versions)
        try:
            decode_jpeg(d, device="cuda")
            ok.append(d)
        except RuntimeError:
            pass
    if not ok:
        print(json.dumps({"error": "torchvision decoded none of the files on the GPU"}))
        return 0
    per_pass = len(ok)
    while per_pass < a.min_images:
        per_pass += len(ok)
    seq = [ok[i % len(ok)] for i in range(per_pass)]

    def run(resize):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for i in range(0, per_pass, a.batch):
            imgs = decode_jpeg(seq[i:i + a.batch], device="cuda")
            if resize:
                imgs = [F.center_crop(F.resize(x, [256], antialias=True), [224]) for x in imgs]
        torch.cuda.synchronize()
        return per_pass / (time.perf_counter() - t0)

    out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "torchvision": torchvision.__version__, "files": len(files), "gpu_decodable": len(ok),
           "batch": a.batch, "images_per_pass": per_pass}
    for name, resize in (("decode_img_per_s", False), ("decode_resize_crop_img_per_s", True)):
        run(resize)  # warm-up
        out[name] = statistics.median(run(resize) for _ in range(a.passes))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
