#!/bin/sh
# End to end, JPEG -> logits: resnetd-classify --json --logits on every
# reference JPEG agrees with torchvision (relative L2 <= 1e-3, equal top-1),
# and --dump-input writes the tensors torchvision feeds its model.
set -eu
ref=${RESNETD_REF_DIR:?}
if [ ! -f "$ref/weights.safetensors" ] || [ -z "${TORCH_PYTHON:-}" ]; then
  echo "reference data or numpy missing"
  [ "${RESNETD_REQUIRE_REFERENCE:-0}" = 1 ] && exit 1
  exit 77
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
mkdir "$out/dump"
files=$(sed "s|.*|$ref/jpeg/&.jpg|" "$ref/jpegs.txt")
# shellcheck disable=SC2086
"$RESNETD_BUILDDIR/resnetd-classify" --weights "$ref/weights.safetensors" --device cpu \
  --json --logits --top-k 5 --dump-input "$out/dump" $files > "$out/classify.jsonl"
"$TORCH_PYTHON" "$RESNETD_SRCDIR/tests/engine/compare_classify.py" "$ref" "$out/classify.jsonl" "$out/dump"

# Errors: a bad file is reported and the others still classified.
printf 'not a jpeg' > "$out/text.jpg"
set +e
"$RESNETD_BUILDDIR/resnetd-classify" --weights "$ref/weights.safetensors" --device cpu --json \
  "$out/text.jpg" "$ref/jpeg/s640x480.jpg" > "$out/mixed.jsonl" 2> "$out/mixed.err"
rc=$?
set -e
[ "$rc" = 1 ] || { echo "expected exit 1 with a bad file, got $rc"; exit 1; }
grep -q '"code":"not_jpeg"' "$out/mixed.jsonl" || { echo "no not_jpeg error:"; cat "$out/mixed.jsonl"; exit 1; }
grep -q '"predictions"' "$out/mixed.jsonl" || { echo "good file not classified"; exit 1; }
grep -q 'text.jpg' "$out/mixed.err" || { echo "no error line on stderr"; exit 1; }
# Bad weights: one line naming the file, non-zero exit, no crash.
if "$RESNETD_BUILDDIR/resnetd-classify" --weights "$out/text.jpg" "$ref/jpeg/s640x480.jpg" 2> "$out/w.err"; then
  echo "bad weights accepted"; exit 1
fi
grep -q "$out/text.jpg" "$out/w.err" || { echo "weights error does not name the file:"; cat "$out/w.err"; exit 1; }
# A directory: its JPEGs in name order, the same answers as naming them.
mkdir "$out/dir" "$out/empty"
cp "$ref/jpeg/s640x480.jpg" "$out/dir/b.jpg"
cp "$ref/jpeg/s333x500.jpg" "$out/dir/a.JPEG"
printf 'x' > "$out/dir/notes.txt"
"$RESNETD_BUILDDIR/resnetd-classify" --weights "$ref/weights.safetensors" --device cpu --json "$out/dir" \
  > "$out/dir.jsonl"
"$RESNETD_BUILDDIR/resnetd-classify" --weights "$ref/weights.safetensors" --device cpu --json \
  "$out/dir/a.JPEG" "$out/dir/b.jpg" > "$out/named.jsonl"
cmp -s "$out/dir.jsonl" "$out/named.jsonl" || { echo "a directory differs from its files named:"; cat "$out/dir.jsonl"; exit 1; }
[ "$(wc -l < "$out/dir.jsonl")" = 2 ] || { echo "expected 2 answers for the directory"; exit 1; }
if "$RESNETD_BUILDDIR/resnetd-classify" --weights "$ref/weights.safetensors" "$out/empty" 2> "$out/e.err"; then
  echo "a directory without JPEGs was accepted"; exit 1
fi
grep -q "no .jpg or .jpeg files" "$out/e.err" || { echo "empty directory not explained:"; cat "$out/e.err"; exit 1; }
echo "classify: ok"
