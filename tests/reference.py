#!/usr/bin/env python3
"""Independent reference for resnetd: torchvision on the same weights and inputs.

Writes into --out:
  weights.safetensors        seeded torchvision resnet18, BN statistics and
                             affine parameters randomised so folding is exercised
  weights-f16.safetensors    the same tensors stored as F16
  weights-bf16.safetensors   ... and as BF16
  jpegs.txt                  names of the generated test JPEGs, one a line
  jpeg/NAME.jpg              test JPEGs: sizes 1x1..4000x3000, odd sizes,
                             4:4:4/4:2:2/4:2:0, progressive, grayscale,
                             restart markers, and real photos Debian ships;
                             also sample{4x2,3x1,1x4,2x4}_333x501 (luma
                             sampling factors), not listed in jpegs.txt
  crop/NAME.npy              uint8 [224,224,3]: PIL Resize(256) + CenterCrop(224)
  input/NAME.npy             float32 [3,224,224]: what torchvision feeds the model
  logits.npy                 float32 [N,1000]: FP32 logits of input/*, jpegs.txt order
  random_u8.npy              uint8 [R,224,224,3] random images
  random_logits*.npy         float32 [R,1000] for F32, F16- and BF16-rounded weights
  bad/not_jpeg.png, bad/cmyk.jpg
  ft10/                      a fine-tune: the same backbone with fc replaced by a
                             seeded Linear(512, 10)
    weights.safetensors      its F32 weights (fc.weight [10,512], fc.bias [10])
    labels.txt               its 10 class names, one a line
    logits.npy               float32 [N,10]: logits of input/*, jpegs.txt order
    random_logits.npy        float32 [R,10]: logits of random_u8.npy
  int8/                      engine/int8.h emulated (forward_int8)
    table.json               a calibration table: max |x| / 255 (after a ReLU)
                             or / 127 (elsewhere) over input/*
    logits.npy               float32 [N,1000]: INT8 logits of input/*
    random_logits.npy        float32 [R,1000]: INT8 logits of random_u8.npy
    random_logits_float_{stem,layer1.0,layer1,...,layer3}.npy
                             ... at each precision mix (engine/calib.h), its
                             float prefix in FP32 as the CPU engine runs it
    random_logits_float_*_fp16.npy
                             ... the float prefix in FP16 as the CUDA engine does

With --bench, times PyTorch on the CPU instead (the anchor for resnetd-bench);
with --bench --int8, PyTorch's quantized INT8 resnet18 on the same weights.
Runs under Debian's python3-torch / python3-torchvision (/usr/bin/python3).
"""
import argparse
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import torchvision
from PIL import Image
from torchvision import transforms as T

SEED = 20261122
FT_CLASSES = 10
FT_LABELS = ["tabby cat", "beagle", "red fox", "sea otter", "crème brûlée", "espresso cup", "road bike",
             "lighthouse", "paper kite", "mossy rock"]  # one non-ASCII name: served as UTF-8
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
REAL_PHOTOS = ["/usr/share/matplotlib/mpl-data/sample_data/grace_hopper.jpg"]


def make_model(seed=SEED):
    """torchvision resnet18 with seeded weights. BN running statistics are
    measured on photo-like images (so every channel is normalised and the
    output depends on the input, unlike a raw random init where every image
    gets the same top-1), then perturbed along with the affine parameters so
    that folding BN is really exercised."""
    torch.manual_seed(seed)
    m = torchvision.models.resnet18()
    g = torch.Generator().manual_seed(seed + 1)
    rng = np.random.default_rng(seed + 3)
    calib = normalise_u8(np.stack([np.asarray(photo_like(224, 224, rng)) for _ in range(16)]))
    bns = [mod for mod in m.modules() if isinstance(mod, torch.nn.BatchNorm2d)]
    with torch.no_grad():
        for bn in bns:
            bn.weight.uniform_(0.5, 1.5, generator=g)
            bn.bias.normal_(0.0, 0.3, generator=g)
            bn.reset_running_stats()
            bn.momentum = None  # cumulative average: exactly the calibration batch's statistics
        m.train()
        m(calib)
        for bn in bns:
            bn.running_var.mul_(torch.empty_like(bn.running_var).uniform_(0.8, 1.25, generator=g))
            bn.running_mean.add_(0.1 * bn.running_var.sqrt() * torch.randn(bn.running_mean.shape, generator=g))
            bn.num_batches_tracked.fill_(1234)
        m.fc.bias.normal_(0.0, 0.05, generator=g)
    return m.eval()


def make_fine_tune(classes=FT_CLASSES):
    """The reference backbone with its head replaced by Linear(512, classes),
    as a user fine-tuning on their own classes does; the head's weights are
    seeded, its bias spread so that it matters."""
    m = make_model()
    torch.manual_seed(SEED + 10)
    m.fc = torch.nn.Linear(512, classes)
    g = torch.Generator().manual_seed(SEED + 11)
    with torch.no_grad():
        m.fc.bias.normal_(0.0, 0.5, generator=g)
    return m.eval()


def write_safetensors(path, state, dtype, meta=None):
    """safetensors by hand: u64 LE header length, JSON header, raw data."""
    header, blobs, off = {"__metadata__": meta or {"format": "pt", "seed": str(SEED)}}, [], 0
    for name, t in state.items():
        t = t.detach().cpu().contiguous()
        if t.dtype == torch.int64:
            code, raw = "I64", t.numpy().tobytes()
        elif dtype == "F32":
            code, raw = "F32", t.float().numpy().tobytes()
        elif dtype == "F16":
            code, raw = "F16", t.half().numpy().tobytes()
        else:
            code, raw = "BF16", t.bfloat16().view(torch.int16).numpy().tobytes()
        header[name] = {"dtype": code, "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def rounded_model(model, dtype):
    """A copy whose float tensors went through dtype, as a loader reading that file sees them."""
    m = make_model()
    sd = {k: (v.to(dtype).float() if v.is_floating_point() else v) for k, v in model.state_dict().items()}
    m.load_state_dict(sd)
    return m.eval()


def photo_like(w, h, rng, gray=False):
    """Smooth gradients, waves, hard edges and noise: exercises every filter tap."""
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    sx, sy = max(w, 1), max(h, 1)
    chans = []
    for c in range(1 if gray else 3):
        fx, fy = rng.uniform(2, 12, size=2)
        ph = rng.uniform(0, 6.28)
        v = 128 + 60 * np.sin(fx * 6.28 * x / sx + ph) * np.cos(fy * 6.28 * y / sy)
        v += 50 * (x / sx - 0.5) * (c - 1) + 40 * (y / sy - 0.5)
        v += np.where((x // max(sx // 7, 1) + y // max(sy // 5, 1)) % 2 == 0, 25, -25)
        v += rng.normal(0, 12, size=v.shape)
        chans.append(v)
    a = np.clip(np.stack(chans, -1), 0, 255).astype(np.uint8)
    return Image.fromarray(a[..., 0] if gray else a, "L" if gray else "RGB")


def cjpeg(img, dst, args):
    """Encodes with libjpeg-turbo's cjpeg, for options Pillow 9 lacks (restart markers)."""
    with tempfile.NamedTemporaryFile(suffix=".ppm" if img.mode == "RGB" else ".pgm") as f:
        img.save(f.name)
        subprocess.run(["cjpeg", *args, "-outfile", dst, f.name], check=True)


def make_jpegs(out):
    rng = np.random.default_rng(SEED)
    os.makedirs(os.path.join(out, "jpeg"), exist_ok=True)
    cases = []  # (name, w, h, how)
    for w, h in [(1, 1), (2, 3), (7, 5), (17, 31), (224, 224), (256, 256), (256, 300), (300, 256),
                 (255, 257), (333, 500), (500, 333), (640, 480), (1023, 767), (31, 1000), (1000, 31),
                 (1920, 1080), (4000, 3000)]:
        cases.append((f"s{w}x{h}", w, h, "q90_420"))
    for sub, tag in [(0, "444"), (1, "422"), (2, "420")]:
        cases.append((f"sub{tag}_333x501", 333, 501, f"q95_{tag}"))
    cases += [("progressive_801x601", 801, 601, "progressive"), ("gray_640x481", 640, 481, "gray"),
              ("gray_progressive_97x300", 97, 300, "gray_progressive"),
              ("restart1_501x333", 501, 333, "restart1"), ("restart_rows_640x480", 640, 480, "restart_rows"),
              ("restart_progressive_400x300", 400, 300, "restart_progressive"),
              ("q50_420_2000x1500", 2000, 1500, "q50_420")]
    # Sampling factors TurboJPEG 2 has no name for; libjpeg and PIL decode
    # them. Kept out of jpegs.txt (their crops are written, nothing else), so
    # the tests that walk every reference JPEG with TurboJPEG or the GPU
    # decoder do not meet them; test_preprocess names them.
    for hv in ("4x2", "3x1", "1x4", "2x4"):
        cases.append((f"sample{hv}_333x501", 333, 501, "sample" + hv))
    # CMYK with PIL's Adobe marker, as print workflows write: also an extra
    # (the GPU decoder and TurboJPEG's RGB path refuse it).
    cases.append(("cmyk_adobe_333x501", 333, 501, "cmyk"))
    names, extra = [], []
    for name, w, h, how in cases:
        dst = os.path.join(out, "jpeg", name + ".jpg")
        img = photo_like(w, h, rng, gray=how.startswith("gray"))
        if how.startswith("q"):
            q, tag = how[1:].split("_")
            img.save(dst, quality=int(q), subsampling={"444": 0, "422": 1, "420": 2}[tag])
        elif how == "progressive":
            img.save(dst, quality=90, progressive=True)
        elif how == "gray":
            img.save(dst, quality=90)
        elif how == "gray_progressive":
            img.save(dst, quality=90, progressive=True)
        elif how == "restart1":
            cjpeg(img, dst, ["-quality", "90", "-restart", "1B"])
        elif how == "restart_rows":
            cjpeg(img, dst, ["-quality", "90", "-restart", "2"])
        elif how == "restart_progressive":
            cjpeg(img, dst, ["-quality", "90", "-progressive", "-restart", "3B"])
        elif how.startswith("sample"):
            cjpeg(img, dst, ["-quality", "90", "-sample", how[len("sample"):] + ",1x1,1x1"])
        elif how == "cmyk":
            img.convert("CMYK").save(dst, quality=90)
        (extra if how.startswith(("sample", "cmyk")) else names).append(name)
    for p in REAL_PHOTOS:
        if os.path.exists(p):
            name = "photo_" + os.path.splitext(os.path.basename(p))[0]
            shutil.copyfile(p, os.path.join(out, "jpeg", name + ".jpg"))
            names.append(name)
        else:
            print(f"reference: real photo {p} not installed (python-matplotlib-data); skipped", file=sys.stderr)
    bad = os.path.join(out, "bad")
    os.makedirs(bad, exist_ok=True)
    photo_like(64, 48, rng).save(os.path.join(bad, "not_jpeg.png"))
    Image.new("CMYK", (64, 48), (10, 200, 30, 5)).save(os.path.join(bad, "cmyk.jpg"), quality=90)
    return names, extra


def preprocess(path):
    img = Image.open(path).convert("RGB")
    crop = T.CenterCrop(224)(T.Resize(256)(img))
    tensor = T.Normalize(MEAN, STD)(T.ToTensor()(crop))
    return np.asarray(crop, dtype=np.uint8).copy(), tensor


def normalise_u8(u8):
    """uint8 NHWC -> normalised NCHW float, exactly as ToTensor + Normalize."""
    t = torch.from_numpy(u8).permute(0, 3, 1, 2).float().div(255)
    return T.Normalize(MEAN, STD)(t)


def run_logits(model, x):
    with torch.inference_mode():
        return torch.cat([model(x[i:i + 8]) for i in range(0, len(x), 8)]).numpy().astype(np.float32)


def generate(out):
    torch.set_num_threads(os.cpu_count() or 1)
    os.makedirs(out, exist_ok=True)
    model = make_model()
    sd = model.state_dict()
    for dtype, fname in [("F32", "weights.safetensors"), ("F16", "weights-f16.safetensors"),
                         ("BF16", "weights-bf16.safetensors")]:
        write_safetensors(os.path.join(out, fname), sd, dtype)

    names, extra = make_jpegs(out)
    for d in ("crop", "input"):
        os.makedirs(os.path.join(out, d), exist_ok=True)
    for n in extra:
        np.save(os.path.join(out, "crop", n + ".npy"), preprocess(os.path.join(out, "jpeg", n + ".jpg"))[0])
    inputs = []
    for n in names:
        crop, tensor = preprocess(os.path.join(out, "jpeg", n + ".jpg"))
        np.save(os.path.join(out, "crop", n + ".npy"), crop)
        np.save(os.path.join(out, "input", n + ".npy"), tensor.numpy().astype(np.float32))
        inputs.append(tensor)
    np.save(os.path.join(out, "logits.npy"), run_logits(model, torch.stack(inputs)))
    with open(os.path.join(out, "jpegs.txt"), "w") as f:
        f.write("".join(n + "\n" for n in names))

    rng = np.random.default_rng(SEED + 2)
    noise = rng.integers(0, 256, size=(4, 224, 224, 3), dtype=np.uint8)
    smooth = np.stack([np.asarray(photo_like(224, 224, rng)) for _ in range(4)])
    rand = np.concatenate([noise, smooth]).astype(np.uint8)
    np.save(os.path.join(out, "random_u8.npy"), rand)
    x = normalise_u8(rand)
    np.save(os.path.join(out, "random_logits.npy"), run_logits(model, x))
    np.save(os.path.join(out, "random_logits_f16w.npy"), run_logits(rounded_model(model, torch.float16), x))
    np.save(os.path.join(out, "random_logits_bf16w.npy"), run_logits(rounded_model(model, torch.bfloat16), x))

    write_int8(out, model, torch.stack(inputs), x)

    ft = make_fine_tune()
    ft_dir = os.path.join(out, "ft10")
    os.makedirs(ft_dir, exist_ok=True)
    write_safetensors(os.path.join(ft_dir, "weights.safetensors"), ft.state_dict(), "F32")
    assert len(FT_LABELS) == FT_CLASSES
    with open(os.path.join(ft_dir, "labels.txt"), "w", encoding="utf-8") as f:
        f.write("".join(n + "\n" for n in FT_LABELS))
    np.save(os.path.join(ft_dir, "logits.npy"), run_logits(ft, torch.stack(inputs)))
    np.save(os.path.join(ft_dir, "random_logits.npy"), run_logits(ft, x))
    print(f"reference: {len(names)} JPEGs, {len(rand)} random images, {FT_CLASSES}-class fine-tune -> {out}",
          file=sys.stderr)


# --- INT8: an independent emulation of engine/int8.h -------------------------
# Every step is the header's, in torch: BN folded in float64 as the loader
# does, int8 values held in float64 (integer convolutions are exact there),
# the epilogue in float32 one operation at a time, torch.round (half to
# even). Only the average pool and the FC (float64 here) differ in order
# from the C engine. A precision mix's float prefix is the float engines'
# arithmetic, whose sums' order is not fixed: there the emulation is close,
# not exact (tests/engine/test_engine_int8.c says how close).

def resnet18_convs():
    """(name, bn, stride, pad, src, residual, relu) in resnet18.c's order;
    src/residual: a conv index, "image" or "pool"."""
    t = [("conv1", "bn1", 2, 3, "image", None, True)]
    prev = "pool"
    for layer in range(1, 5):
        for b in range(2):
            p = f"layer{layer}.{b}"
            stride = 2 if layer > 1 and b == 0 else 1
            t.append((p + ".conv1", p + ".bn1", stride, 1, prev, None, True))
            c1 = len(t) - 1
            res = prev
            if layer > 1 and b == 0:
                t.append((p + ".downsample.0", p + ".downsample.1", 2, 0, prev, None, False))
                res = len(t) - 1
            t.append((p + ".conv2", p + ".bn2", 1, 1, c1, res, True))
            prev = len(t) - 1
    return t


def fold(sd, conv, bn):
    g, b, mean, var = (sd[f"{bn}.{k}"].double() for k in ("weight", "bias", "running_mean", "running_var"))
    scale = g / torch.sqrt(var + 1e-5)
    w = (sd[f"{conv}.weight"].double() * scale[:, None, None, None]).float()
    return w, (b - mean * scale).float()


def tensor_names():
    """Calibration tensor i: 0 the input, i >= 1 the output of conv i-1."""
    return ["input"] + [c[0] for c in resnet18_convs()[:-1]]


def post_relu():
    """Per calibration tensor: whether it follows a ReLU (never negative)."""
    return [False] + [c[6] for c in resnet18_convs()[:-1]]


def quant(x, s, u8=False):
    """int8.h's q(x): int8, or (u8) 0..255 for a tensor that follows a ReLU."""
    inv = torch.tensor(1.0, dtype=torch.float32) / torch.tensor(s, dtype=torch.float32)
    return torch.round(x.float() * inv).nan_to_num(0.0).clamp(0 if u8 else -127, 255 if u8 else 127).double()


# The precision mixes (engine/calib.h's calib_mix, in its order): a prefix
# of the network in float, the rest at INT8.
MIXES = ["int8", "float:stem", "float:layer1.0", "float:layer1", "float:layer2.0", "float:layer2",
         "float:layer3.0", "float:layer3"]


def mix_float_convs(mix):
    """How many convs (resnet18_convs order) mix runs in float: the stem
    (conv1, its pool after it), or everything through the last conv of a
    block (layerN.0) or of a stage (layerN)."""
    if mix == "int8":
        return 0
    if mix == "float:stem":
        return 1
    stage = mix[len("float:"):] + "."
    return 1 + max(i for i, c in enumerate(resnet18_convs()) if c[0].startswith(stage))


def forward_float_prefix(sd, x, nfloat, half, pool=True):
    """Convs [0, nfloat) on folded weights in float, the max pool after the
    stem; returns the prefix's last tensor (the pool's output when nfloat
    is 1, unless pool is False), float32. half=False: the CPU FP32 engine
    (float32 throughout);
    half=True: the CUDA FP16 engine (the input, the weights and every conv's
    output rounded to float16, sums, bias, residual and ReLU in float32).
    Only the conv sums' order differs from the engines' (and on the GPU a
    downsample fused into its conv2, whose output is then not rounded on
    its own)."""
    import torch.nn.functional as F
    r = (lambda t: t.half().float()) if half else (lambda t: t)
    convs = resnet18_convs()
    t = {"image": r(x.float())}
    for i, (name, bn, stride, pad, src, res, relu) in enumerate(convs[:nfloat]):
        w, b = fold(sd, name, bn)
        v = F.conv2d(t[src], r(w), stride=stride, padding=pad) + b[None, :, None, None]
        if res is not None:
            v = v + t[res]
        if relu:
            v = v.clamp_min(0)
        t[i] = r(v)
        if i == 0:
            t["pool"] = F.max_pool2d(t[0], 3, 2, 1)
    return t["pool"] if nfloat == 1 and pool else t[nfloat - 1]


def per_channel(s):
    """A [C] tensor of per-channel scales, shaped to multiply NCHW."""
    return s[None, :, None, None]


def forward_int8(sd, x, scales, nfloat=0, half=False, stem_chan=None):
    """x: normalised float32 NCHW. scales: float32 per calibration tensor
    (a version 3 table's: a 255th of the threshold after a ReLU, whose
    tensors are u8, a 127th elsewhere). nfloat: the mix's float convs
    (mix_float_convs); its boundary tensor is quantised with scale nfloat
    (the pool's is the stem output's, 1) and read by the INT8 convs after
    it as any u8 tensor. stem_chan (an experiment, tools/int8-emulate; no
    engine does it): float32 [64] scales for the stem's u8 output, one a
    channel, folded into the weights of the convs that read it and applied
    per channel to a residual. Returns float32 logits."""
    import torch.nn.functional as F
    convs = resnet18_convs()
    pos = post_relu()
    sc = [torch.tensor(s, dtype=torch.float32) for s in scales]
    if nfloat == 0:
        q = {"image": quant(x, scales[0])}
        qs = {"image": sc[0]}
    else:
        boundary = "pool" if nfloat == 1 else nfloat - 1
        q = {boundary: quant(forward_float_prefix(sd, x, nfloat, half), scales[nfloat], pos[nfloat])}
        qs = {boundary: sc[nfloat]}
    last = None
    for i, (name, bn, stride, pad, src, res, relu) in enumerate(convs):
        if i < nfloat:
            continue
        w, b = fold(sd, name, bn)
        s_in = qs[src]
        if s_in.ndim == 1:  # per-channel input scales: into the weights
            w, s_in = w * per_channel(s_in), torch.tensor(1.0)
        m = w.abs().amax(dim=(1, 2, 3))
        sw = torch.where(m > 0, m / 127, torch.ones_like(m))
        qw = torch.round(w / sw[:, None, None, None]).clamp(-127, 127).double()
        acc = F.conv2d(q[src], qw, stride=stride, padding=pad).float()
        mult = s_in * sw
        v = acc * mult[None, :, None, None]
        v = v + b[None, :, None, None]
        if res is not None:
            v = v + q[res].float() * (per_channel(qs[res]) if qs[res].ndim == 1 else qs[res])
        if relu:
            v = torch.where(v < 0, torch.zeros_like(v), v)
        if i == len(convs) - 1:
            last = v
            break
        if i == 0 and stem_chan is not None:
            c = stem_chan.to(v.device)
            q[i] = torch.round(v.float() * per_channel(1.0 / c)).nan_to_num(0.0).clamp(0, 255).double()
            qs[i] = c
        else:
            q[i] = quant(v, scales[i + 1], pos[i + 1])
            qs[i] = sc[i + 1]
        if i == 0:
            q["pool"] = F.max_pool2d(q[0], 3, 2, 1)
            qs["pool"] = qs[0]
    # int8.h's head: float64 sums, the mean rounded to float32 then FP16;
    # FP16-rounded FC weights; the products and sums in float64 here.
    hw = last.shape[2] * last.shape[3]
    feat = (last.double().sum(dim=(2, 3)) / hw).float().half().double()
    fc_w = sd["fc.weight"].float().half().double()
    return (feat @ fc_w.T + sd["fc.bias"].double()).float()


def forward_fp32_activations(sd, x):
    """max |x| of every calibration tensor, from a folded float64 forward."""
    import torch.nn.functional as F
    convs = resnet18_convs()
    t = {"image": x.double()}
    amax = [x.abs().max().item()]
    for i, (name, bn, stride, pad, src, res, relu) in enumerate(convs[:-1]):
        w, b = fold(sd, name, bn)
        v = F.conv2d(t[src], w.double(), b.double(), stride=stride, padding=pad)
        if res is not None:
            v = v + t[res]
        if relu:
            v = v.clamp_min(0)
        t[i] = v
        amax.append(v.abs().max().item())
        if i == 0:
            t["pool"] = F.max_pool2d(v, 3, 2, 1)
    return amax


def write_int8(out, model, inputs, random_x):
    sd = {k: v.detach() for k, v in model.state_dict().items()}
    with torch.inference_mode():
        amax = forward_fp32_activations(sd, inputs)
        scales = [float(np.float32(a / (255.0 if u else 127.0))) for a, u in zip(amax, post_relu())]
        with open(os.path.join(out, "weights.safetensors"), "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        os.makedirs(os.path.join(out, "int8"), exist_ok=True)
        table = {"format": "resnetd-int8-calibration", "version": 3, "mix": "int8", "weights_sha256": digest,
                 "method": "percentile", "percentile": 100.0, "images": len(inputs), "histogram_bins": 2048,
                 "scales": dict(zip(tensor_names(), scales))}
        with open(os.path.join(out, "int8", "table.json"), "w") as f:
            json.dump(table, f, indent=2)
        np.save(os.path.join(out, "int8", "logits.npy"),
                torch.cat([forward_int8(sd, inputs[i:i + 8], scales) for i in range(0, len(inputs), 8)]).numpy())
        np.save(os.path.join(out, "int8", "random_logits.npy"), forward_int8(sd, random_x, scales).numpy())
        # The mixes on the random images only: on their 4 noise images a
        # mix's logits stand furthest from every other mix's (on the photos
        # an FP16 prefix's own roundings move them about as far as another
        # mix does), and on the 28 JPEGs they would more than double this
        # script's time.
        for mix in MIXES[1:]:
            for half, suffix in ((False, ""), (True, "_fp16")):
                np.save(os.path.join(out, "int8", f"random_logits_{mix.replace(':', '_')}{suffix}.npy"),
                        forward_int8(sd, random_x, scales, mix_float_convs(mix), half).numpy())


def quantized_model(calib_images=16):
    """The same network as PyTorch serves it at INT8 on a CPU: torchvision's
    quantizable resnet18 with make_model's weights, conv + BN + ReLU fused,
    the x86 backend's default qconfig (per-channel weights, histogram
    observers), calibrated on photo-like images, converted."""
    from torchvision.models.quantization import resnet18 as quantizable_resnet18
    engines = torch.backends.quantized.supported_engines
    qengine = next((e for e in ("x86", "fbgemm", "onednn") if e in engines), None)
    if qengine is None:
        raise SystemExit(f"reference.py: no x86 quantized engine in this torch (it has {engines})")
    torch.backends.quantized.engine = qengine
    model = quantizable_resnet18(weights=None, quantize=False)
    model.load_state_dict(make_model().state_dict())
    model.eval()
    model.fuse_model()
    model.qconfig = torch.ao.quantization.get_default_qconfig(qengine)
    torch.ao.quantization.prepare(model, inplace=True)
    rng = np.random.default_rng(SEED + 3)
    u8 = np.stack([np.asarray(photo_like(224, 224, rng)) for _ in range(calib_images)]).astype(np.uint8)
    with torch.inference_mode():
        model(normalise_u8(u8))
    torch.ao.quantization.convert(model, inplace=True)
    return model, qengine


def bench(batches, threads, iters, int8=False):
    """PyTorch CPU img/s per batch size: median of repeats after warm-up."""
    torch.set_num_threads(threads)
    res = {"torch": torch.__version__, "threads": threads, "precision": "int8" if int8 else "fp32"}
    if int8:
        model, res["qengine"] = quantized_model()
    else:
        model = make_model()
    with torch.inference_mode():
        for b in batches:
            x = torch.randn(b, 3, 224, 224)
            model(x)
            times = []
            for _ in range(iters):
                t0 = time.perf_counter()
                model(x)
                times.append(time.perf_counter() - t0)
            ms = sorted(times)[len(times) // 2] * 1000
            res[f"b{b}"] = {"ms_per_batch": ms, "img_per_s": b * 1000 / ms}
    print(json.dumps(res))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/ref")
    ap.add_argument("--bench", action="store_true", help="time PyTorch on the CPU instead")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--int8", action="store_true", help="with --bench: PyTorch's quantized INT8 resnet18")
    a = ap.parse_args()
    if a.bench:
        bench([int(b) for b in a.batches.split(",")], a.threads, a.iters, a.int8)
    else:
        generate(a.out)


if __name__ == "__main__":
    main()
