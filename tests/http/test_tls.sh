#!/bin/sh
# HTTPS on the daemon's own listener (tls_certificate, tls_key): the
# README's HTTPS commands as written (a self-signed certificate from
# openssl, curl --cacert), a JPEG classified over HTTPS, plain HTTP and an
# unknown CA refused on that port, and the start-up errors: one key without
# the other exits 2, a missing or non-PEM file 3 naming it.
set -u
bin=${RESNETD_BUILDDIR:?}
src=${RESNETD_SRCDIR:?}
ref=${RESNETD_REF_DIR:?}
for t in openssl curl; do
    command -v $t >/dev/null 2>&1 || { echo "SKIP: $t not installed"; exit 77; }
done
[ -f "$ref/weights.safetensors" ] || { echo "SKIP: reference data missing"; exit 77; }
tmp=$(mktemp -d) || exit 99
pid=
trap '[ -n "$pid" ] && kill $pid 2>/dev/null; rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; [ -f "$tmp/d.log" ] && tail -5 "$tmp/d.log"; exit 1; }

# The README's sh blocks that name https://localhost:8443 or openssl, in order.
/usr/bin/python3 - "$src/README.md" >"$tmp/blocks.sh" <<'PY' || exit 99
import re, sys
text = open(sys.argv[1]).read()
i = text.index("## HTTPS")
section = text[i:text.index("\n## ", i + 1)]
for b in re.findall(r"```sh\n(.*?)```", section, re.S):
    print(b.replace("\\\n", " "))
PY
grep -q openssl "$tmp/blocks.sh" && grep -q "https://localhost:8443" "$tmp/blocks.sh" ||
    fail "README's HTTPS section lost its commands"
cd "$tmp" || exit 99
grep openssl blocks.sh | sh >/dev/null 2>&1 || fail "the README's openssl command failed"
[ -s cert.pem ] && [ -s key.pem ] || fail "no cert.pem or key.pem"

"$bin/resnetd" --weights "$ref/weights.safetensors" --labels "$src/etc/imagenet-classes.txt" \
    --listen 127.0.0.1:0 --tls-certificate cert.pem --tls-key key.pem >d.log 2>&1 &
pid=$!
port=
for _ in $(seq 100); do
    port=$(sed -n 's/.*listening on https:.*(port \([0-9]*\)).*/\1/p' d.log)
    [ -n "$port" ] && grep -q "ready" d.log && break
    sleep 0.1
done
[ -n "$port" ] || fail "no 'listening on https://' line"
out=$(grep "https://localhost:8443" blocks.sh | sed "s/localhost:8443/localhost:$port/" | sh) ||
    fail "the README's curl command failed"
[ "$out" = '{"status":"ok"}' ] || fail "healthz over HTTPS printed '$out'"
code=$(curl -s -o body.json -w '%{http_code}' --cacert cert.pem --data-binary @"$ref/jpeg/s224x224.jpg" \
    -H 'Content-Type: image/jpeg' "https://localhost:$port/classify?top_k=3")
[ "$code" = 200 ] && grep -q '"predictions"' body.json || fail "classify over HTTPS: $code $(cat body.json)"
# A chunked body past max_body_bytes (16M): over HTTPS its 413 waits for the
# body's end (plain HTTP answers at once, which cannot be written here).
code=$(head -c 17000000 /dev/zero | curl -s -o big.json -w '%{http_code}' --cacert cert.pem \
    -H 'Transfer-Encoding: chunked' -H 'Content-Type: image/jpeg' --data-binary @- "https://localhost:$port/classify")
[ "$code" = 413 ] && grep -q '"too_large"' big.json || fail "17 MB chunked over HTTPS: $code $(cat big.json)"
# Plain HTTP on the HTTPS port: a plain 400 that says so, not a served request.
code=$(curl -s -m 5 -o plain.json -w '%{http_code}' "http://127.0.0.1:$port/healthz")
[ "$code" = 400 ] && grep -q '"not_http".*https://' plain.json ||
    fail "plain HTTP on the HTTPS port: $code $(cat plain.json)"
curl -s -m 5 -o /dev/null "https://localhost:$port/healthz" && fail "a client without the CA trusted the server"
curl -s --cacert cert.pem "https://localhost:$port/healthz" >/dev/null || fail "the daemon stopped serving"
kill -TERM $pid
wait $pid
rc=$?
pid=
[ $rc = 0 ] || fail "exit $rc after SIGTERM"

# Start-up errors: configuration 2, a file it names 3.
w="--weights $ref/weights.safetensors --labels $src/etc/imagenet-classes.txt --listen 127.0.0.1:0 --check-config"
"$bin/resnetd" $w --tls-certificate cert.pem >err.txt 2>&1
[ $? = 2 ] && grep -q "tls_key" err.txt || fail "a certificate without a key: $(cat err.txt)"
"$bin/resnetd" $w --tls-certificate missing.pem --tls-key key.pem >err.txt 2>&1
[ $? = 3 ] && grep -q "missing.pem" err.txt || fail "a missing certificate: $(cat err.txt)"
echo "not a key" >bad.pem
"$bin/resnetd" $w --tls-certificate cert.pem --tls-key bad.pem >err.txt 2>&1
[ $? = 3 ] && grep -q "tls.key: not a PEM file" err.txt || fail "a non-PEM key: $(cat err.txt)"
echo "HTTPS: README commands, classify, plain HTTP and unknown CA refused, exits 2 and 3"
