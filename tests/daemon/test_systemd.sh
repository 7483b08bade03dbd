#!/bin/sh
# The generated systemd unit passes `systemd-analyze verify` with no output
# (its exit status is 0 for many errors, so the output is what counts), keeps
# the hardening the daemon is meant to run under, stops later than the drain,
# and its sysusers.d entry creates the user it runs as. A deliberately broken
# copy must produce output, so a verify that says nothing cannot pass blindly.
set -u
builddir=${RESNETD_BUILDDIR:-.}
srcdir=${RESNETD_SRCDIR:-.}

if ! command -v systemd-analyze >/dev/null 2>&1; then
    echo "SKIP: systemd-analyze not found"
    exit 77
fi
fail() { printf 'FAIL: %s\n' "$*"; exit 1; }

unit="$builddir/systemd/resnetd.service"
[ -f "$unit" ] || fail "$unit was not generated (make builds it)"
tmp=$(mktemp -d) || exit 99
trap 'rm -rf "$tmp"' EXIT

# ExecStart must name an existing executable: the built daemon when there
# is one, else a stand-in, since verify only checks that it exists.
bin="$builddir/resnetd"
if [ ! -x "$bin" ]; then
    echo "note: $bin not built; verifying with a stand-in executable"
    bin="$tmp/resnetd"
    printf '#!/bin/sh\nexit 0\n' >"$bin" && chmod +x "$bin" || exit 99
fi
sed "s|^ExecStart=[^ ]*/resnetd |ExecStart=$bin |" "$unit" >"$tmp/resnetd.service"
grep -q "^ExecStart=$bin --config .*/resnetd/resnetd.conf\$" "$tmp/resnetd.service" ||
    fail "ExecStart is not '<bindir>/resnetd --config <sysconfdir>/resnetd/resnetd.conf'"

# Documentation=man: entries are checked with man(1): give it ours.
mkdir -p "$tmp/man/man5" "$tmp/man/man8" || exit 99
cp "$builddir/man/resnetd.8" "$tmp/man/man8/" || fail "man/resnetd.8 not generated"
cp "$builddir/man/resnetd.conf.5" "$tmp/man/man5/" || fail "man/resnetd.conf.5 not generated"

verify() {
    MANPATH="$tmp/man" SYSTEMD_COLORS=0 systemd-analyze verify "$1" 2>&1
}
out=$(verify "$tmp/resnetd.service")
rc=$?
if [ $rc -ne 0 ] || [ -n "$out" ]; then
    printf '%s\n' "$out"
    fail "systemd-analyze verify: exit $rc, output above"
fi
echo "systemd-analyze verify: clean"

mkdir "$tmp/bad" || exit 99
sed 's/^Type=notify$/Tpye=notify/' "$tmp/resnetd.service" >"$tmp/bad/resnetd.service"
[ -n "$(verify "$tmp/bad/resnetd.service")" ] ||
    fail "verify said nothing about an unknown key: this check would not catch errors"

# The properties the issue asks for, as systemd itself parsed them.
for want in 'Type=notify' 'NotifyAccess=main' 'User=resnetd' 'ProtectSystem=strict' \
            'ProtectHome=yes' 'PrivateTmp=yes' 'NoNewPrivileges=yes' 'DevicePolicy=closed' \
            'DeviceAllow=char-nvidia\* rw' 'Restart=on-failure' \
            'RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX' 'LimitNOFILE=[0-9]'; do
    grep -q "^$want" "$tmp/resnetd.service" || fail "unit lacks $want"
done
grep -q '^PrivateDevices=yes' "$tmp/resnetd.service" && fail "PrivateDevices would hide /dev/nvidia*"

# systemd must wait longer than the daemon's own drain before SIGKILL.
stop_s=$(sed -n 's/^TimeoutStopSec=\([0-9]*\)s*$/\1/p' "$tmp/resnetd.service")
[ -n "$stop_s" ] || fail "no TimeoutStopSec in seconds"
drain_ms=30000
if [ -x "$builddir/resnetd" ]; then
    drain_ms=$("$builddir/resnetd" --help 2>&1 |
        sed -n '/--drain-timeout-ms/{n;s/.*(default: \([0-9]*\)).*/\1/p;}')
    [ -n "$drain_ms" ] || fail "cannot read drain_timeout_ms's default from resnetd --help"
fi
[ $((stop_s * 1000)) -gt "$drain_ms" ] ||
    fail "TimeoutStopSec=${stop_s}s does not exceed drain_timeout_ms=$drain_ms"
echo "TimeoutStopSec=${stop_s}s > drain_timeout_ms default ${drain_ms} ms"

if systemd-analyze security --help 2>/dev/null | grep -q -- '--offline'; then
    systemd-analyze security --offline=yes "$tmp/resnetd.service" 2>/dev/null |
        grep 'Overall exposure level' | sed 's/^→ //'
fi

# The sysusers.d entry creates the user and the home the unit expects.
if command -v systemd-sysusers >/dev/null 2>&1; then
    mkdir -p "$tmp/root/etc" || exit 99
    systemd-sysusers --root="$tmp/root" "$srcdir/systemd/resnetd-sysusers.conf" >/dev/null 2>&1 ||
        fail "systemd-sysusers rejected systemd/resnetd-sysusers.conf"
    home=$(sed -n 's/^WorkingDirectory=//p' "$tmp/resnetd.service")
    grep -q "^resnetd:x:[0-9]*:[0-9]*:[^:]*:$home:/usr/sbin/nologin\$" "$tmp/root/etc/passwd" ||
        fail "sysusers entry did not create user resnetd with home $home"
    grep -q '^resnetd:x:' "$tmp/root/etc/group" || fail "no group resnetd"
    echo "sysusers.d entry creates user and group resnetd"
fi
# A configuration error (2) or a file it names that cannot be loaded (3,
# e.g. no weights yet) is not restarted every RestartSec until the limit.
prevent=$(sed -n 's/^RestartPreventExitStatus=//p' "$tmp/resnetd.service")
for code in 2 3; do
    echo " $prevent " | grep -q " $code " || fail "RestartPreventExitStatus ($prevent) lacks $code"
done
echo "RestartPreventExitStatus=$prevent"
echo "PASS"
exit 0
