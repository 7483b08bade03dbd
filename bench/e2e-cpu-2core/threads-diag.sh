#!/bin/sh
# Per-thread CPU ticks of resnetd over an 8 s closed-loop run (bench/e2e-cpu-2core).
# usage: threads-diag.sh BUILDDIR CONNECTIONS [resnetd options]; corpus in /tmp/corpus05
b=$1 c=$2; shift 2
$b/resnetd --weights synthetic --device cpu --listen 127.0.0.1:0 --labels /work/main/etc/imagenet-classes.txt "$@" 2>/tmp/td.log &
pid=$!
for i in $(seq 300); do grep -q '\bready\b' /tmp/td.log && break; sleep 0.2; done
port=$(sed -n 's/.*(port \([0-9]*\)).*/\1/p' /tmp/td.log)
snap() { for t in /proc/$pid/task/*; do echo "$(basename $t) $(cut -d' ' -f14,15 $t/stat | awk '{print $1+$2}') $(cat $t/comm)"; done | sort; }
$b/resnetd-load -q -u http://127.0.0.1:$port/classify -c $c -d 2 --no-metrics /tmp/corpus05 >/dev/null
snap >/tmp/ta
$b/resnetd-load -q -u http://127.0.0.1:$port/classify -c $c -d 8 --no-metrics /tmp/corpus05 | grep -E "img/s" | head -2
snap >/tmp/tb
echo "c=$c $*: per-thread CPU ticks (busiest first):"
join /tmp/ta /tmp/tb | awk '{d = $4 - $2; printf "%s:%d\n", $3, d}' | sort -t: -k2 -nr | tr '\n' ' '
echo
kill $pid; wait $pid
