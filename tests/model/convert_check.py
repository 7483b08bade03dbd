"""tools/resnetd-convert against torchvision: a fine-tuned ResNet-18 (10
classes, seeded random weights and BN statistics) saved as a DataParallel
training checkpoint converts to safetensors whose logits in resnetd equal
torchvision's on the same input tensors; its SHA-256 is the one printed;
resnetd names a .pth it is given and points to the converter; a checkpoint
missing a tensor is refused with its name. Run by tests/model/test_convert.sh
with Debian's python3 (torch, torchvision, numpy)."""
import hashlib
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torchvision


def main():
    src, build, ref = sys.argv[1], sys.argv[2], sys.argv[3]
    conv = os.path.join(src, "tools", "resnetd-convert")
    torch.manual_seed(7)
    m = torchvision.models.resnet18(num_classes=10).eval()
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, torch.nn.BatchNorm2d):
                mod.running_mean.uniform_(-0.2, 0.2)
                mod.running_var.uniform_(0.5, 1.5)
                mod.weight.uniform_(0.5, 1.5)
                mod.bias.uniform_(-0.2, 0.2)
    names = ["photo_grace_hopper", "s640x480", "sub422_333x501"]
    with tempfile.TemporaryDirectory() as tmp:
        pth = os.path.join(tmp, "finetune.pth")
        torch.save({"epoch": 3, "state_dict": {"module." + k: v for k, v in m.state_dict().items()}}, pth)
        out = os.path.join(tmp, "finetune.safetensors")
        p = subprocess.run([sys.executable, conv, pth, out], capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        digest = hashlib.sha256(open(out, "rb").read()).hexdigest()
        assert "10 classes" in p.stdout and digest in p.stdout, (p.stdout, digest)
        names = [n for n in names if os.path.exists(os.path.join(ref, "input", n + ".npy"))]
        jpegs = [os.path.join(ref, "jpeg", n + ".jpg") for n in names]
        labels = os.path.join(tmp, "labels.txt")
        with open(labels, "w") as f:
            f.write("".join("class %d\n" % i for i in range(10)))
        p = subprocess.run([os.path.join(build, "resnetd-classify"), "--weights", out, "--labels", labels, "--device",
                            "cpu", "--json", "--logits"] + jpegs, capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        got = [json.loads(line)["logits"] for line in p.stdout.splitlines() if line.strip()]
        worst = 0.0
        for n, lg in zip(names, got):
            x = torch.from_numpy(np.load(os.path.join(ref, "input", n + ".npy"))).unsqueeze(0)
            with torch.no_grad():
                want = m(x)[0].numpy()
            rel = float(np.linalg.norm(np.array(lg) - want) / np.linalg.norm(want))
            worst = max(worst, rel)
            assert rel < 1e-4 and int(np.argmax(lg)) == int(np.argmax(want)), (n, rel)
        # resnetd given the .pth: exit 3, says what it is and how to convert it
        p = subprocess.run([os.path.join(build, "resnetd"), "--weights", pth, "--device", "cpu", "--check-config"],
                           capture_output=True, text=True)
        assert p.returncode == 3 and "PyTorch checkpoint" in p.stderr and "resnetd-convert" in p.stderr, \
            (p.returncode, p.stderr)
        # a checkpoint missing a tensor: refused, naming it
        sd = m.state_dict()
        del sd["layer3.1.bn2.running_var"]
        bad = os.path.join(tmp, "bad.pth")
        torch.save(sd, bad)
        p = subprocess.run([sys.executable, conv, bad, os.path.join(tmp, "bad.safetensors")], capture_output=True,
                           text=True)
        assert p.returncode == 1 and "layer3.1.bn2.running_var missing" in p.stderr, (p.returncode, p.stderr)
    print("resnetd-convert: a 10-class DataParallel checkpoint; resnetd's logits vs torchvision's on %d inputs: "
          "worst rel L2 %.1e; a .pth given to resnetd is named; a missing tensor is named" % (len(names), worst))
    return 0


if __name__ == "__main__":
    sys.exit(main())
