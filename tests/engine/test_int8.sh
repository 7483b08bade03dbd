#!/bin/sh
# INT8 end to end on real photographs (tools/make-photos): resnetd-calibrate
# is deterministic and writes a whole table by either method; INT8 and FP32
# resnetd-classify are compared on the held-out photos (top-1 agreement and
# logits rel L2, printed; with the reference's seeded random weights these
# check the pipeline, not accuracy: see README "INT8"); every refusal of a
# missing, unreadable, partial or mismatched table, and of INT8 on CUDA,
# gives its clear error in resnetd-classify and resnetd --check-config.
# resnetd-calibrate --check must print the same figures as the independent
# Python comparison of resnetd-classify's logits.
# RESNETD_REAL_WEIGHTS=model.safetensors adds the real-weights figure and
# requires >= 99% agreement there. Skips (77) without the reference data or
# when the photo packages cannot be fetched.
set -eu
ref=${RESNETD_REF_DIR:?}
bin=${RESNETD_BUILDDIR:?}
src=${RESNETD_SRCDIR:?}
if [ ! -f "$ref/int8/table.json" ] || [ -z "${TORCH_PYTHON:-}" ]; then
  echo "reference data or torch missing"
  [ "${RESNETD_REQUIRE_REFERENCE:-0}" = 1 ] && exit 1
  exit 77
fi
photos=$bin/tests/photos
set +e
"$TORCH_PYTHON" "$src/tools/make-photos" --out "$photos"
rc=$?
set -e
# Exit 2: the packages could not be fetched (no network or apt lists), a
# skip unless the reference is required (CI); anything else is a failure.
if [ "$rc" = 2 ] && [ "${RESNETD_REQUIRE_REFERENCE:-0}" != 1 ]; then
  echo "SKIP: tools/make-photos could not fetch the photo packages: no network or apt lists?"
  exit 77
fi
[ "$rc" = 0 ] || { echo "FAIL: tools/make-photos exited $rc"; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
w=$ref/weights.safetensors
fail() { echo "FAIL: $*"; exit 1; }

# --- calibration: deterministic, every method -------------------------------
"$bin/resnetd-calibrate" --weights "$w" --images "$photos/calib" --out "$out/a.json"
"$bin/resnetd-calibrate" --weights "$w" --images "$photos/calib" --method entropy --out "$out/b.json"
cmp "$out/a.json" "$out/b.json" || fail "two calibrations of the same inputs differ"
"$bin/resnetd-calibrate" --weights "$w" --images "$photos/calib" --method percentile --percentile 99.99 \
  --out "$out/p.json"
"$bin/resnetd-calibrate" --weights "$w" --images "$photos/calib" --method mse --out "$out/m.json"
"$TORCH_PYTHON" - "$out/a.json" "$out/p.json" "$out/m.json" "$w" <<'PY'
import hashlib, json, sys
a, p, m = (json.load(open(f)) for f in sys.argv[1:4])
digest = hashlib.sha256(open(sys.argv[4], "rb").read()).hexdigest()
for t, method in ((a, "entropy"), (p, "percentile"), (m, "mse")):
    assert t["format"] == "resnetd-int8-calibration" and t["version"] == 3 and t["mix"] == "int8", t
    assert t["weights_sha256"] == digest and t["method"] == method and t["images"] > 100, t
    assert len(t["scales"]) == 20 and all(s > 0 for s in t["scales"].values()), t["scales"]
assert p["percentile"] == 99.99
print("calibrate: deterministic; entropy, percentile and mse tables of %d images" % a["images"])
PY
if "$bin/resnetd-calibrate" --weights "$w" --images "$out/none" --out "$out/x.json" 2>"$out/err"; then
  fail "calibrate without images succeeded"
fi
grep -q "$out/none" "$out/err" || fail "calibrate error does not name the directory: $(cat "$out/err")"

# --- INT8 vs FP32 on the held-out photos ------------------------------------
fp32() {    # weights: FP32 logits of the held-out photos into $out/f32.jsonl
  "$bin/resnetd-classify" --weights "$1" --device cpu --json --logits "$photos"/heldout/*.jpg >"$out/f32.jsonl"
}
# figures FILE: the agreement count and the rel L2 figures of a check's line.
figures() {
  sed -n 's/.*\(agreement [0-9]*\/[0-9]*\).*\(rel L2 [0-9.]*\) (per image: \(.*\))$/\1 \2 \3/p' "$1"
}
# agree weights table label min-agreement max-rel-l2, against $out/f32.jsonl:
# the Python figure from resnetd-classify's logits, and resnetd-calibrate
# --check's own, which must print the same count and errors.
agree() {
  "$bin/resnetd-classify" --weights "$1" --device cpu --precision int8 --calibration "$2" --json --logits \
    "$photos"/heldout/*.jpg >"$out/i8.jsonl"
  rc=0
  "$TORCH_PYTHON" "$src/tests/engine/int8_agreement.py" "$out/f32.jsonl" "$out/i8.jsonl" "$3" "$4" "$5" >"$out/py" || rc=$?
  cat "$out/py"
  [ "$rc" = 0 ] || fail "$3: agreement or rel L2 out of bounds"
  "$bin/resnetd-calibrate" --weights "$1" --table "$2" --check "$photos/heldout" >"$out/tool"
  cat "$out/tool"
  py=$(figures "$out/py")
  tool=$(figures "$out/tool")
  [ -n "$py" ] && [ "$py" = "$tool" ] || fail "resnetd-calibrate --check says '$tool', the Python check '$py'"
}
fp32 "$w"
agree "$w" "$out/a.json" "seeded random weights, entropy" 0.75 0.15
agree "$w" "$out/p.json" "seeded random weights, percentile 99.99" 0.75 0.15
agree "$w" "$out/m.json" "seeded random weights, mse" 0.75 0.15
# --min-agreement: exit 3 below it, 0 at or above it; --table needs --check.
set +e
"$bin/resnetd-calibrate" --weights "$w" --table "$out/a.json" --check "$photos/heldout" --min-agreement 100 \
  >/dev/null 2>"$out/err"
rc=$?
set -e
[ "$rc" = 3 ] && grep -q "below --min-agreement 100%" "$out/err" || fail "--min-agreement 100: exit $rc, $(cat "$out/err")"
"$bin/resnetd-calibrate" --weights "$w" --table "$out/a.json" --check "$photos/heldout" --min-agreement 50 >/dev/null ||
  fail "--min-agreement 50 refused"
if "$bin/resnetd-calibrate" --weights "$w" --table "$out/a.json" 2>"$out/err"; then fail "--table without --check"; fi
grep -q "needs --check" "$out/err" || fail "--table without --check: $(cat "$out/err")"

# --target-agreement: every mix timed on this machine, then the mixes
# fastest first, each with every method from one set of histograms, until
# one meets the target; the chosen table written with its mix and the check
# it passed, whose figures are those a --check of it prints; below the
# target: the most agreeing written all the same, exit 3. Each run's
# printed speeds, candidates and choice must follow that rule
# (search_rule). On 60 calibration and 60 held-out photos, to keep the test
# short on two cores.
mkdir -p "$out/held60" "$out/calib60"
for f in $(ls "$photos/heldout" | head -n 60); do ln -s "$photos/heldout/$f" "$out/held60/$f"; done
for f in $(ls "$photos/calib" | head -n 60); do ln -s "$photos/calib/$f" "$out/calib60/$f"; done
# search NAME TARGET [OPTION...]: a search into $out/NAME.json, its output
# in $out/NAME.txt and its exit status in $out/NAME.rc.
search() {
  name=$1 target=$2
  shift 2
  set +e
  "$bin/resnetd-calibrate" --weights "$w" --images "$out/calib60" --check "$out/held60" \
    --target-agreement "$target" --out "$out/$name.json" "$@" >"$out/$name.txt" 2>"$out/$name.err"
  echo $? >"$out/$name.rc"
  set -e
  cat "$out/$name.txt"
}
# search_rule NAME TARGET MIXES: NAME's output, table and exit status follow
# the search's rule over MIXES (comma-separated); prints the chosen mix and
# the best agreement of the first mix tried.
cat >"$out/search_rule.py" <<'PY'
import json, re, sys
out, name, target, mixes = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4].split(",")
text, rc = open("%s/%s.txt" % (out, name)).read(), int(open("%s/%s.rc" % (out, name)).read())
table = json.load(open("%s/%s.json" % (out, name)))
speed = re.search(r"^speed: INT8 on cpu, batch 8 of random pixels, 1 s per mix, fastest first: (.*)$", text, re.M)
assert speed, text
order = [(m, float(s)) for m, s in re.findall(r"([a-z0-9:.]+) ([0-9.]+) img/s", speed.group(1))]
assert sorted(m for m, _ in order) == sorted(mixes), (order, mixes)
assert all(a[1] >= b[1] for a, b in zip(order, order[1:])), order
rows = [(meth, mix, int(a), int(n), float(rel), float(s)) for meth, mix, a, n, rel, s in re.findall(
    r"^(entropy|mse|percentile \S+) +(\S+) +(\d+)/(\d+) +([0-9.]+) +([0-9.]+)$", text, re.M)]
methods = ["entropy", "mse", "percentile 99.9", "percentile 99.99", "percentile 99.999", "percentile 100"]
want, first_best, tried = None, None, 0
for mix, img_s in order:
    group = rows[tried:tried + len(methods)]
    assert [(r[0], r[1], r[5], r[3]) for r in group] == [(m, mix, img_s, 60) for m in methods], (mix, group)
    tried += len(methods)
    best = max(group, key=lambda r: (r[2], -r[4]))
    first_best = best[2] if first_best is None else first_best
    ties = [r for r in group if (r[2], r[4]) == (best[2], best[4])]
    if 100.0 * best[2] / 60 >= target:
        want = (ties, True)
        break
if want is None:   # none meets: the most agreeing of all, the faster mix first
    best = max(rows, key=lambda r: (r[2], -r[4]))
    want = ([r for r in rows if (r[2], r[4]) == (best[2], best[4])], False)
assert len(rows) == tried, ("candidates after the chosen mix", rows[tried:])
chosen = re.search(r"^chosen: mix (\S+), (.+) \((\d+) of (\d+) candidates tried\): top-1 agreement (\d+)/60 "
                   r"\([0-9.]+%\), rel L2 ([0-9.]+), ([0-9.]+) img/s; (meets|is below) the target", text, re.M)
assert chosen, text
mix, method, agree, rel = chosen.group(1), chosen.group(2), int(chosen.group(5)), float(chosen.group(6))
assert int(chosen.group(3)) == tried and int(chosen.group(4)) == len(methods) * len(mixes), chosen.group(0)
assert (method, mix, agree, rel) in [(r[0], r[1], r[2], r[4]) for r in want[0]], (chosen.group(0), want)
assert (chosen.group(8) == "meets") == want[1] and rc == (0 if want[1] else 3), (chosen.group(0), rc)
# The table: version 3, that mix, that method, the check it passed.
assert table["mix"] == mix and table["version"] == 3, table
label = table["method"] + (" %g" % table["percentile"] if table["method"] == "percentile" else "")
assert label == method, (label, method)
c = table["check"]
assert c["images"] == 60 and abs(c["top1_agreement"] - 100.0 * agree / 60) < 1e-9 and abs(c["rel_l2"] - rel) < 6e-5, c
print(mix, first_best)
PY
rule() {
  "$TORCH_PYTHON" "$out/search_rule.py" "$out" "$@" ||
    { echo "FAIL: search $1 does not follow the rule: $(cat "$out/$1.err")" >&2; exit 1; }
}
all=int8,float:stem,float:layer1.0,float:layer1,float:layer2.0,float:layer2,float:layer3.0,float:layer3
search t 0
r=$(rule t 0 "$all")
fastest=${r% *} best=${r#* }
echo "search, target 0: the fastest mix ($fastest) chosen with its most agreeing method ($best/60)"
"$bin/resnetd-calibrate" --weights "$w" --table "$out/t.json" --check "$out/held60" >"$out/tcheck"
cat "$out/tcheck"
"$TORCH_PYTHON" - "$out/t.json" "$out/tcheck" "$fastest" <<'PY'
import json, re, sys
t, check = json.load(open(sys.argv[1])), open(sys.argv[2]).read()
c = t["check"]
assert "(mix %s, INT8 on cpu)" % sys.argv[3] in check, check
agree, images = map(int, re.search(r"agreement (\d+)/(\d+)", check).groups())
assert c["images"] == images == 60 and abs(c["top1_agreement"] - 100.0 * agree / images) < 1e-9, (c, check)
rel = float(re.search(r"rel L2 ([0-9.]+)", check).group(1))
assert abs(c["rel_l2"] - rel) < 1e-4, (c, rel)
PY
# A target just above the fastest mix's best, between it and the slowest:
# the search goes past the fastest (and stops at the slowest, or writes
# the most agreeing with exit 3).
slowest=$(sed -n 's/^speed: .*, \([a-z0-9:.]*\) [0-9.]* img\/s$/\1/p' "$out/t.txt")
if [ "$best" -lt 60 ]; then
  target=$("$TORCH_PYTHON" -c "print(100.0 * ($best + 1) / 60)")
  search two "$target" --mix "$fastest,$slowest"
  r=$(rule two "$target" "$fastest,$slowest")
  echo "search, target $target% over $fastest and $slowest: ${r% *} chosen (exit $(cat "$out/two.rc"))"
  # Below the target: the fastest mix alone cannot reach 100%.
  search t100 100 --mix "$fastest"
  rule t100 100 "$fastest" >/dev/null
  [ "$(cat "$out/t100.rc")" = 3 ] && grep -q "is below the target 100%" "$out/t100.txt" && [ -s "$out/t100.json" ] ||
    fail "--target-agreement 100 at $fastest: exit $(cat "$out/t100.rc"), $(cat "$out/t100.txt")"
  cp "$out/two.json" "$out/served.json"
else
  cp "$out/t.json" "$out/served.json"
fi
# --mix without --target-agreement: the made table's mix, checked at it.
"$bin/resnetd-calibrate" --weights "$w" --images "$out/calib60" --mix float:stem --check "$out/held60" \
  --out "$out/stem.json" >"$out/stem.txt" || fail "--mix float:stem: exit $?"
grep -q "^check: INT8 vs FP32 on 60 images of .* (mix float:stem, INT8 on cpu): top-1 agreement" "$out/stem.txt" &&
  "$TORCH_PYTHON" -c 'import json, sys; t = json.load(open(sys.argv[1])); sys.exit(not (t["version"] == 3 and t["mix"] == "float:stem" and t["check"]["images"] == 60))' "$out/stem.json" ||
  fail "--mix float:stem: $(cat "$out/stem.txt") $(cat "$out/stem.json")"
# The daemon serves a searched table and reports its method, mix and check
# in the model metadata and /metrics.
rc=0
"$TORCH_PYTHON" - "$bin/resnetd" "$ref" "$src" "$out/served.json" <<'PY' || rc=$?
import json, os, sys, types
resnetd, ref, src, table = sys.argv[1], sys.argv[2], sys.argv[3], json.load(open(sys.argv[4]))
sys.path.insert(0, os.path.join(src, "tests", "lib"))
from daemon_client import Daemon, metric
d = Daemon(types.SimpleNamespace(resnetd=resnetd, ref=ref, labels=os.path.join(src, "etc", "imagenet-classes.txt")),
           "--precision", "int8", "--calibration", sys.argv[4])
mix = table.get("mix", "int8")
try:
    status, _, body = d.request("GET", "/v1/models/resnet18")
    assert status == 200, status
    meta = json.loads(body)
    i8, c = meta["int8"], table["check"]
    assert meta["precision"] == "int8" and i8["mix"] == mix, (meta, mix)
    if table["method"] != "percentile":
        assert i8["calibration"] == table["method"], i8
    else:
        assert i8["calibration"].split()[0] == "percentile" and float(i8["calibration"].split()[1]) == table["percentile"], i8
    # The daemon writes reals with 9 significant digits.
    assert i8["check"]["images"] == c["images"] and abs(i8["check"]["top1_agreement"] - c["top1_agreement"]) < 1e-6, i8
    assert abs(i8["check"]["rel_l2"] - c["rel_l2"]) < 1e-9, i8
    text = d.metrics()
    m = {n: metric(text, n) for n in ("resnetd_int8_check_top1_agreement_ratio", "resnetd_int8_check_logits_rel_l2",
                                      "resnetd_int8_check_images")}
    assert abs(m["resnetd_int8_check_top1_agreement_ratio"] - c["top1_agreement"] / 100) < 1e-6, m
    assert abs(m["resnetd_int8_check_logits_rel_l2"] - c["rel_l2"]) < 1e-8 and m["resnetd_int8_check_images"] == 60, m
    assert metric(text, "resnetd_int8_mix_info", {"mix": mix}) == 1 and text.count("resnetd_int8_mix_info{") == 1, text
finally:
    d.stop()
print("daemon: int8 metadata and /metrics report the table's mix %s, %s calibration, %d/%d agreement" %
      (mix, i8["calibration"], round(c["top1_agreement"] * c["images"] / 100), c["images"]))
PY
[ "$rc" = 0 ] || fail "the daemon's int8 report"
if "$bin/resnetd-calibrate" --weights "$w" --images "$photos/calib" --target-agreement 99 --out "$out/x.json" \
  2>"$out/err"; then fail "--target-agreement without --check"; fi
grep -q "need --check" "$out/err" || fail "--target-agreement without --check: $(cat "$out/err")"
if "$bin/resnetd-calibrate" --weights "$w" --images "$photos/calib" --check "$out/held60" --target-agreement 99 \
  --method percentile --out "$out/x.json" 2>"$out/err"; then fail "--target-agreement with --method"; fi
grep -q "no --table, --method" "$out/err" || fail "--target-agreement with --method: $(cat "$out/err")"
if [ -n "${RESNETD_REAL_WEIGHTS:-}" ]; then
  "$bin/resnetd-calibrate" --weights "$RESNETD_REAL_WEIGHTS" --images "$photos/calib" --out "$out/real.json"
  fp32 "$RESNETD_REAL_WEIGHTS"
  agree "$RESNETD_REAL_WEIGHTS" "$out/real.json" "real weights $RESNETD_REAL_WEIGHTS, entropy" 0.99 1
else
  echo "real weights: not measured (set RESNETD_REAL_WEIGHTS=model.safetensors)"
fi

# --- refusals -----------------------------------------------------------------
"$TORCH_PYTHON" - "$out/a.json" "$out/partial.json" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))
del t["scales"]["layer3.0.downsample.0"]
json.dump(t, open(sys.argv[2], "w"))
PY
printf '{"format": "resnetd-int8-calibration", "version": 1,' >"$out/truncated.json"
ft=$ref/ft10/weights.safetensors
img=$photos/heldout/$(ls "$photos/heldout" | head -n 1)
# expect_refusal WHAT EXPECTED-TEXT COMMAND...: non-zero exit, the text on stderr.
expect_refusal() {
  what=$1 want=$2
  shift 2
  if "$@" >"$out/stdout" 2>"$out/stderr"; then fail "$what: accepted"; fi
  grep -qF -- "$want" "$out/stderr" || fail "$what: error lacks '$want': $(cat "$out/stderr")"
  echo "refused, $what: $(grep -F -- "$want" "$out/stderr" | head -n 1)"
}
expect_refusal "calibrate --check, table of other weights" "was made for weights with SHA-256" \
  "$bin/resnetd-calibrate" --weights "$ft" --table "$out/a.json" --check "$photos/heldout"
expect_refusal "calibrate --check, truncated table" "$out/truncated.json:1: not JSON" \
  "$bin/resnetd-calibrate" --weights "$w" --table "$out/truncated.json" --check "$photos/heldout"
for bad in float:layer4 int8, int8,int8 ",int8"; do
  expect_refusal "calibrate --mix '$bad'" "--mix must be int8, float:stem" \
    "$bin/resnetd-calibrate" --weights "$w" --images "$out/calib60" --out "$out/never.json" \
    --check "$out/held60" --target-agreement 99 --mix "$bad"
done
for tool in classify daemon; do
  if [ $tool = classify ]; then
    run() { "$bin/resnetd-classify" --device cpu "$@" "$img"; }
  else
    run() { "$bin/resnetd" --device cpu --check-config "$@"; }
  fi
  expect_refusal "$tool int8 without a table" "needs" run --weights "$w" --precision int8
  expect_refusal "$tool missing table" "$out/absent.json: cannot read" \
    run --weights "$w" --precision int8 --calibration "$out/absent.json"
  expect_refusal "$tool truncated table" "$out/truncated.json:1: not JSON" \
    run --weights "$w" --precision int8 --calibration "$out/truncated.json"
  expect_refusal "$tool table of other weights" "was made for weights with SHA-256" \
    run --weights "$ft" --labels "$ref/ft10/labels.txt" --precision int8 --calibration "$out/a.json"
  expect_refusal "$tool table missing a tensor" "has no scale for tensor layer3.0.downsample.0" \
    run --weights "$w" --precision int8 --calibration "$out/partial.json"
done

# The config-file form works, and --check-config says int8.
printf 'weights = %s\ndevice = cpu\nprecision = int8\ncalibration = %s\n' "$w" "$out/a.json" >"$out/resnetd.conf"
"$bin/resnetd" --config "$out/resnetd.conf" --check-config >"$out/ok" 2>"$out/stderr" ||
  fail "config with a good table refused: $(cat "$out/stderr")"
grep -q "int8" "$out/ok" || fail "--check-config does not report int8: $(cat "$out/ok")"
# --- reload of an INT8 daemon: SIGHUP reads the table again, checked against
# the weights; a bad one leaves the running model serving; one of another
# mix is served with that mix, which the metadata and /metrics then report.
cp "$out/a.json" "$out/live.json"
printf 'weights = %s\nlabels = %s\ndevice = cpu\nprecision = int8\ncalibration = %s\nlisten = 127.0.0.1:0\n' \
  "$w" "$src/etc/imagenet-classes.txt" "$out/live.json" >"$out/live.conf"
"$bin/resnetd" --config "$out/live.conf" 2>"$out/daemon.log" &
pid=$!
"$TORCH_PYTHON" - "$pid" "$out" "$img" <<'PY' || { kill "$pid" 2>/dev/null; cat "$out/daemon.log"; fail "int8 reload"; }
import json, os, re, shutil, signal, sys, time, urllib.request
pid, out, img = int(sys.argv[1]), sys.argv[2], sys.argv[3]
log = os.path.join(out, "daemon.log")

def wait_log(pattern, after=0, limit=60):
    deadline = time.time() + limit
    while time.time() < deadline:
        text = open(log).read()
        m = re.search(pattern, text[after:])
        if m:
            return text, m
        time.sleep(0.1)
    raise AssertionError("no %r in the log:\n%s" % (pattern, open(log).read()[-2000:]))

text, m = wait_log(r"\(port (\d+)\)")
port = int(m.group(1))
wait_log(r"ready")

def classify():
    req = urllib.request.Request("http://127.0.0.1:%d/classify?top_k=3" % port, data=open(img, "rb").read(),
                                 headers={"Content-Type": "image/jpeg"})
    with urllib.request.urlopen(req, timeout=60) as r:
        body = json.load(r)
    assert body["precision"] == "int8", body
    return [p["index"] for p in body["results"][0]["predictions"]], body["model_version"]

before, v1 = classify()
mark = len(open(log).read())
os.kill(pid, signal.SIGHUP)
wait_log(r"reload: now serving", mark)
after, v2 = classify()
assert v2 == v1 + 1 and after == before, (v1, v2, before, after)
# A table missing a tensor: refused, the model stays.
shutil.copy(os.path.join(out, "partial.json"), os.path.join(out, "live.json"))
mark = len(open(log).read())
os.kill(pid, signal.SIGHUP)
wait_log(r"reload failed, the running model keeps serving: .*layer3\.0\.downsample\.0", mark)
still, v3 = classify()
assert v3 == v2 and still == before, (v3, still)

def get(path):
    with urllib.request.urlopen("http://127.0.0.1:%d%s" % (port, path), timeout=60) as r:
        return r.read().decode()

def mix_info(text):
    return re.findall(r'^resnetd_int8_mix_info\{mix="([^"]*)"\} 1$', text, re.M)

assert json.loads(get("/v1/models/resnet18"))["int8"]["mix"] == "int8" and mix_info(get("/metrics")) == ["int8"]
shutil.copy(os.path.join(out, "stem.json"), os.path.join(out, "live.json"))
mark = len(open(log).read())
os.kill(pid, signal.SIGHUP)
wait_log(r"reload: now serving", mark)
meta = json.loads(get("/v1/models/resnet18"))
assert meta["version"] == v3 + 1 and meta["int8"]["mix"] == "float:stem", meta
assert mix_info(get("/metrics")) == ["float:stem"], get("/metrics")
os.kill(pid, signal.SIGTERM)
print("int8 reload: SIGHUP rebuilt the INT8 engine with the table (version %d -> %d, same answers); "
      "a table missing a tensor refused, version %d kept serving; a float:stem table reloaded, reported as "
      "float:stem in the metadata and /metrics" % (v1, v2, v3))
PY
wait "$pid" || fail "the INT8 daemon did not exit 0"

# --- tools/int8-proxy.sh: train-proxy's weights load, search and check -----
# A few small training steps on the CPU (the real run takes a GPU): enough
# for BN's running statistics to settle, so that the logits are finite.
# What is checked is the path, torchvision-named weights through the
# search (two mixes, to keep it short), the chosen table's turned check
# and the fully INT8 table's two checks, not the figures.
TRAIN_ARGS="--device cpu --steps 30 --batch 8 --lr 0.02" TORCH_PYTHON=$TORCH_PYTHON DEVICE=cpu \
  MIXES=int8,float:stem BENCH=0 EMULATE=0 \
  bash "$src/tools/int8-proxy.sh" "$photos" "$out/proxy" "$bin" >"$out/proxy.txt" 2>&1 ||
  fail "tools/int8-proxy.sh: $(tail -20 "$out/proxy.txt")"
[ "$(grep -c '^chosen: mix ' "$out/proxy.txt")" = 1 ] &&
  [ "$(grep -c '^check: INT8 vs FP32 on 357 images.*rel L2 [0-9]' "$out/proxy.txt")" = 1 ] &&
  [ "$(grep -c '^check: INT8 vs FP32 on 1428 images.*rel L2 [0-9]' "$out/proxy.txt")" = 2 ] &&
  grep -q '^train-proxy: 260 calibration crops of 11 photos, 44 classes' "$out/proxy.txt" ||
  fail "tools/int8-proxy.sh did not train, search and check as it should: $(cat "$out/proxy.txt")"
echo "int8-proxy: 30 small training steps on the CPU, the search, held-out and turned checks ran"

# --- weights that overflow: refused with the reason, no table, no figure -------
# The seeded weights with layer4.1.bn2 scaled: by 1e5, the pooled features
# pass FP16's 65504 (the INT8 engine's FC input) while FP32 stays finite;
# by 1e30 with fc.weight by 1e10, FP32's logits overflow too.
mkdir "$out/few"
for f in $(ls "$photos/calib" | head -8); do cp "$photos/calib/$f" "$out/few/"; done
"$TORCH_PYTHON" - "$w" "$out" <<'PY'
import json, struct, sys
import numpy as np
src, out = sys.argv[1:3]
raw = open(src, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
head = json.loads(raw[8:8 + n])
for factors, name in (((1e5, 1e5, 1), "fp16"), ((1e30, 1e30, 1e10), "fp32")):
    data = bytearray(raw[8 + n:])
    for t, factor in zip(("layer4.1.bn2.weight", "layer4.1.bn2.bias", "fc.weight"), factors):
        a, b = head[t]["data_offsets"]
        assert head[t]["dtype"] == "F32"
        scaled = np.frombuffer(bytes(data[a:b]), np.float32) * np.float32(factor)
        data[a:b] = scaled.astype(np.float32).tobytes()
    open("%s/overflow-%s.safetensors" % (out, name), "wb").write(raw[:8 + n] + bytes(data))
PY
"$bin/resnetd-calibrate" --weights "$out/overflow-fp16.safetensors" --images "$out/few" --out "$out/o16.json" >/dev/null ||
  fail "calibrating weights whose FP32 logits are finite failed"
if "$bin/resnetd-calibrate" --weights "$out/overflow-fp16.safetensors" --table "$out/o16.json" --check "$out/few" \
    >"$out/o16.out" 2>"$out/o16.err"; then
  fail "--check of weights whose INT8 logits overflow succeeded: $(cat "$out/o16.out")"
fi
grep -q "the INT8 logits are not finite where FP32's are" "$out/o16.err" || fail "INT8 overflow: $(cat "$out/o16.err")"
if "$bin/resnetd-calibrate" --weights "$out/overflow-fp32.safetensors" --images "$out/few" --out "$out/o32.json" \
    2>"$out/o32.err"; then
  fail "calibrating weights whose FP32 logits overflow succeeded"
fi
grep -q "the FP32 logits are not finite" "$out/o32.err" && [ ! -e "$out/o32.json" ] ||
  fail "FP32 overflow: $(cat "$out/o32.err")"
echo "overflow: INT8's FP16 features and FP32's logits beyond range are refused, with their reason"

echo "int8: ok"
