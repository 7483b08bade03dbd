#!/bin/sh
# Scale-out: two resnetd daemons behind a real nginx running
# etc/nginx/resnetd.conf; one is SIGTERM'd under load and no request may be
# lost (tests/daemon/scaleout_client.py does the work). Skips (77) without nginx
# (Debian's nginx package), or fails then under RESNETD_REQUIRE_NGINX=1 as
# in CI; run_client.sh skips without the reference data.
set -eu
nginx=${RESNETD_NGINX:-}
if [ -z "$nginx" ]; then
  nginx=$(command -v nginx || true)
  [ -z "$nginx" ] && [ -x /usr/sbin/nginx ] && nginx=/usr/sbin/nginx
fi
if [ -z "$nginx" ]; then
  if [ "${RESNETD_REQUIRE_NGINX:-0}" = 1 ]; then
    echo "FAIL: nginx not found and RESNETD_REQUIRE_NGINX=1 (apt-get install nginx)"
    exit 1
  fi
  echo "SKIP: nginx not found (apt-get install nginx)"
  exit 77
fi
RESNETD_NGINX=$nginx
export RESNETD_NGINX
exec sh "$RESNETD_SRCDIR/tests/lib/run_client.sh" daemon/scaleout_client.py "$@"
