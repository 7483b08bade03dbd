#!/usr/bin/python3
"""Every curl example of README.md and protocol/API.md, run as written
against a live resnetd (CPU engine, the reference weights): only the port
changes (localhost:8080 -> the daemon's), cat.jpg and dog.jpg are test
JPEGs in the working directory, and the README's sample photo stands in by
a test JPEG where python-matplotlib-data is missing. A ```sh block takes
part when it has a curl command (HTTPS ones are tests/http/test_tls.sh's); its commands run one by one with sh, each
must exit 0 and, unless documented as silent, print something; where the
block shows a command's output ("$ " lines, then output), that output's
error code or header must be what the daemon printed. Run by
tests/api/test_doc_examples.sh."""
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import daemon_client as dc  # noqa: E402

SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
DOCS = ("README.md", "protocol/API.md")
SAMPLE = "/usr/share/matplotlib/mpl-data/sample_data/grace_hopper.jpg"


def sh_blocks(path):
    return re.findall(r"```sh\n(.*?)```", open(os.path.join(SRC, path)).read(), re.S)


def commands(block):
    """(prelude, [(command, expected output lines)]): assignments go to the
    prelude; backslash continuations and quoted strings over several lines
    are joined; with "$ " prompts, the
    lines after a command up to the next are its shown output."""
    lines, joined = block.splitlines(), []
    for line in lines:
        if joined and joined[-1].endswith("\\"):
            joined[-1] = joined[-1][:-1] + " " + line.strip()
        elif joined and joined[-1].count("'") % 2 == 1:   # a quoted string goes on
            joined[-1] += "\n" + line
        else:
            joined.append(line)
    prompt = any(line.startswith("$ ") for line in joined)
    prelude, cmds = [], []
    for line in joined:
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        if prompt and not line.startswith("$ "):
            if cmds:
                cmds[-1][1].append(s)
            continue
        s = s[2:] if s.startswith("$ ") else s
        if re.match(r"^[A-Za-z_]+=\S+$", s):
            prelude.append(s)
        else:
            cmds.append((s, []))
    return prelude, cmds


def check_documented_curl_examples(opts, d):
    ran = 0
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(os.path.join(opts.ref, "jpeg", "s640x480.jpg"), os.path.join(tmp, "cat.jpg"))
        shutil.copy(os.path.join(opts.ref, "jpeg", "sub422_333x501.jpg"), os.path.join(tmp, "dog.jpg"))
        for doc in DOCS:
            for block in sh_blocks(doc):
                if "curl" not in block or "https://" in block:   # HTTPS: tests/http/test_tls.sh
                    continue
                prelude, cmds = commands(block)
                for cmd, shown in cmds:
                    script = "\n".join(prelude + [cmd]).replace("localhost:8080", "127.0.0.1:%d" % d.port)
                    if not os.path.exists(SAMPLE):
                        script = script.replace(SAMPLE, os.path.join(tmp, "cat.jpg"))
                    p = subprocess.run(["sh", "-c", script], cwd=tmp, capture_output=True, text=True, timeout=60)
                    where = "%s: %s" % (doc, cmd[:100])
                    assert p.returncode == 0, (where, p.returncode, p.stdout[-300:], p.stderr[-300:])
                    silent = "/load" in cmd   # 200 with an empty body
                    assert silent or p.stdout.strip(), (where, "printed nothing")
                    for want in shown:
                        code = re.search(r'"code": "([a-z_]+)"', want)
                        if code:
                            assert '"code":"%s"' % code.group(1) in p.stdout.replace(" ", ""), (where, p.stdout)
                        elif ":" in want and not want.startswith("{"):
                            assert want.lower() in p.stdout.lower(), (where, want, p.stdout)
                    ran += 1
    # README: 4; API.md: classify (2), errors (2), probes, metrics, model,
    # reload, v2 infer.
    assert ran >= 13, ran
    return "%d documented curl commands ran against the daemon" % ran


CHECKS = [
    ("documented_curl_examples", check_documented_curl_examples, True),
]

if __name__ == "__main__":
    sys.exit(dc.main(CHECKS))
