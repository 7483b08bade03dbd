#!/bin/sh
# The Debian package as an admin meets it (CI runs this as root on its own
# machine): build it from BUILDDIR (make deb), install it, and check what
# it installed: the user, the conffile naming /var/lib/resnetd's weights,
# a clear exit 3 while they are missing, --check-config once they are
# there, the unit (systemd-analyze verify, enabled not started, no restart
# for exit 2 or 3), and the daemon serving /readyz as the resnetd user with
# the shipped config. Removes the package at the end (the conffile stays,
# as dpkg keeps it).
#   sh tools/deb-check.sh BUILDDIR WEIGHTS.safetensors
set -eu
builddir=$1 weights=$2
fail() { echo "deb-check: FAIL: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || fail "run as root (it installs the package)"
make -C "$builddir" deb >"$builddir/deb.log" 2>&1 || { tail -40 "$builddir/deb.log"; fail "make deb"; }
deb=$(ls "$builddir"/deb/resnetd_*.deb)
echo "deb-check: built $(basename "$deb") ($(du -k "$deb" | cut -f1) KB)"
dpkg -i "$deb" || { apt-get install -y -q -f; dpkg -i "$deb"; } || fail "dpkg -i"
trap 'dpkg -r resnetd >/dev/null 2>&1 || true; rm -f /var/lib/resnetd/resnet18.safetensors' EXIT
for f in /usr/bin/resnetd /usr/bin/resnetd-convert /usr/bin/resnetd-classify /etc/resnetd/resnetd.conf \
         /lib/systemd/system/resnetd.service /usr/lib/sysusers.d/resnetd.conf /usr/share/man/man8/resnetd.8.gz; do
    [ -e "$f" ] || fail "$f not installed"
done
dpkg-query -W -f='${Conffiles}\n' resnetd | grep -q '/etc/resnetd/resnetd.conf' || fail "resnetd.conf is not a conffile"
getent passwd resnetd >/dev/null || fail "no user resnetd"
[ "$(stat -c %U /var/lib/resnetd)" = resnetd ] || fail "/var/lib/resnetd is not resnetd's"
rm -f /var/lib/resnetd/resnet18.safetensors
set +e
msg=$(/usr/bin/resnetd --config /etc/resnetd/resnetd.conf --check-config 2>&1); rc=$?
set -e
[ "$rc" = 3 ] && echo "$msg" | grep -q '/etc/resnetd/resnetd.conf:[0-9]*: weights: /var/lib/resnetd/resnet18.safetensors' ||
    fail "without weights: exit $rc, '$msg'"
echo "deb-check: no weights yet: exit 3, '$msg'"
install -o resnetd -g resnetd -m 0640 "$weights" /var/lib/resnetd/resnet18.safetensors
/usr/bin/resnetd --config /etc/resnetd/resnetd.conf --check-config || fail "--check-config with the weights in place"
out=$(systemd-analyze verify /lib/systemd/system/resnetd.service 2>&1 || true)
[ -z "$out" ] || fail "systemd-analyze verify: $out"
grep -q '^RestartPreventExitStatus=2 3$' /lib/systemd/system/resnetd.service || fail "the unit restarts on 2 or 3"
state=$(systemctl is-enabled resnetd 2>/dev/null || true)
[ "$state" = enabled ] || echo "deb-check: note: systemctl is-enabled says '$state' (no systemd running here?)"
# The unit's ExecStart by hand, as its user, on a free port.
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
log=$(mktemp)
setpriv --reuid=resnetd --regid=resnetd --clear-groups /usr/bin/resnetd --config /etc/resnetd/resnetd.conf \
    --listen "127.0.0.1:$port" --device cpu >"$log" 2>&1 &
pid=$!
ok=0
for _ in $(seq 1 300); do
    if python3 -c "import urllib.request, sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:$port/readyz').status != 200)" \
        2>/dev/null; then ok=1; break; fi
    kill -0 $pid 2>/dev/null || break
    sleep 0.2
done
kill -TERM $pid 2>/dev/null || true
wait $pid || true
[ "$ok" = 1 ] || { cat "$log"; fail "the installed daemon did not become ready as user resnetd"; }
rm -f "$log"
echo "deb-check: PASS: installed, exit 3 without weights, --check-config with them, unit verified, ready as resnetd"
