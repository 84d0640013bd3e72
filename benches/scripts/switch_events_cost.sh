#!/usr/bin/env bash
# What the kernel's context-switch records cost a target that switches often (issue 31):
# the `many_threads` fixture (1000 threads × RATE calls/s, default 250: about 285,000
# switches a second) runs bare, then while `perf record --switch-events` watches its switches with
# one event per core (`-a`, as tendril's off-CPU watch does for a target of 64 threads
# or more), then with one event per thread (`-p`, as for fewer). Prints the target's CPU
# time (user + system, in clock ticks of 10 ms) over the same 3 s of each, RUNS times.
#
# Usage: benches/scripts/switch_events_cost.sh [RUNS] [RATE]   (from the repository; needs gcc
#        and perf, as root)
set -euo pipefail
runs=${1:-2}
rate=${2:-250}
here=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
target_pid=
cleanup() {
    [ -n "$target_pid" ] && kill "$target_pid" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
gcc -O2 -g -pthread -o "$work/many_threads" "$here/fixtures/many_threads.c"
"$work/many_threads" 1000 "$rate" > /dev/null &
target_pid=$!
sleep 3
ticks() { awk '{print $14 + $15}' "/proc/$target_pid/stat"; }
over_3s() { local a b; a=$(ticks); sleep 3; b=$(ticks); echo $((b - a)); }
printf '%-4s %8s %16s %18s\n' run bare "per core (-a)" "per thread (-p)"
for run in $(seq "$runs"); do
    bare=$(over_3s)
    perf record -q -e dummy --switch-events -a -m 1024 -o "$work/cores.data" -- sleep 5 \
        > /dev/null 2>&1 &
    perf_pid=$!
    sleep 1
    cores=$(over_3s)
    wait "$perf_pid" || true
    perf record -q -e dummy --switch-events -p "$target_pid" -m 16 -o "$work/threads.data" \
        -- sleep 7 > /dev/null 2>&1 &
    perf_pid=$!
    sleep 3
    threads=$(over_3s)
    wait "$perf_pid" || true
    printf '%-4s %8s %16s %18s\n' "$run" "$bare" "$cores" "$threads"
done
