#!/usr/bin/env bash
# `record` on a busy thousand-thread target (issue 31): the `many_threads` fixture runs
# THREADS threads, each calling `thread_root` RATE times a second (1000 × 250 =
# 250,000 calls/s), and reports every 100 ms the calls made, the longest time any
# thread fell behind its pace, and the longest one call took. Per run, this prints the
# target's call rate, those two (`behind_ms`, `call_ms`) before, during and after a
# `tendril record --duration 3`, the recording's wall
# time, its lost events, how many threads have a tree, and the pauses tendril caused
# summed over the threads (`pause_ns`), with three of their causes.
#
# Usage: [TENDRIL=path] benches/scripts/many_threads.sh [RUNS] [THREADS] [RATE]   (from the repository,
#        after cargo build --release; needs gcc)
set -euo pipefail
runs=${1:-3}
threads=${2:-1000}
rate=${3:-250}
here=$(cd "$(dirname "$0")/../.." && pwd)
tendril="${TENDRIL:-$here/target/release/tendril}"
work=$(mktemp -d)
target_pid=
cleanup() {
    [ -n "$target_pid" ] && kill "$target_pid" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
gcc -O2 -g -pthread -o "$work/many_threads" "$here/fixtures/many_threads.c"
now_ms() { date +%s%3N; }
echo "load: $(cut -d' ' -f1-3 /proc/loadavg); $threads threads × $rate calls/s"
printf '%-4s %-7s %10s %10s %8s   %s\n' run phase calls/s behind_ms call_ms "recording"
for run in $(seq "$runs"); do
    # Each tick line carries its own wall-clock time (at_ms), to split the ticks into
    # phases; the target's stderr gets what tendril's agent may print there.
    "$work/many_threads" "$threads" "$rate" > "$work/ticks" 2> "$work/target.err" &
    sleep 0.5
    target_pid=$(pgrep -n -f "$work/many_threads")
    until grep -q '^tick 20 ' "$work/ticks"; do sleep 0.1; done
    rm -f "$work/p.json"
    began=$(now_ms)
    "$tendril" record "$target_pid" --root thread_root --duration 3 -o "$work/p.json" \
        2> "$work/record.err" || echo "run $run: record failed: $(tail -n 1 "$work/record.err")"
    ended=$(now_ms)
    sleep 2
    kill "$target_pid"
    target_pid=
    wait || true
    [ -s "$work/p.json" ] || echo '{"stats":{"lost_events":"no profile"},"threads":[]}' > "$work/p.json"
    summary="$((ended - began)) ms, $(python3 -c '
import json, sys
p = json.load(open(sys.argv[1]))
trees = sum(any(r["name"] == "thread_root" and r["calls"] > 0 for r in t["roots"])
            for t in p["threads"])
s = p["stats"]
lost = s["lost_events"]
d = p.get("discovery") or {}
waits = d.get("waits", 0) * d.get("mean_wait_ns", 0) / 1e9
paused, full, faults = (s.get(k, 0) / 1e9 for k in ("pause_ns", "ring_wait_ns", "ring_fault_ns"))
pauses = (f"paused {paused:.0f} s: ring full {full:.0f} s, ring faults {faults:.0f} s, "
          f"discovery waits {waits:.0f} s")
print(f"lost {lost}, {trees} threads with a tree; {pauses}")
' "$work/p.json")"
    awk -v run="$run" -v began="$began" -v ended="$ended" -v summary="$summary" '
        $1 == "tick" && $2 > 5 {
            phase = $12 < began ? "before" : ($12 <= ended + 100 ? "during" : "after")
            calls[phase] += $4; ticks[phase]++
            if ($8 > longest[phase]) longest[phase] = $8
            if ($10 > call[phase]) call[phase] = $10
        }
        END {
            split("before during after", order, " ")
            for (i = 1; i <= 3; i++) {
                p = order[i]
                printf "%-4s %-7s %10d %10.1f %8.1f   %s\n", run, p, calls[p] * 10 / ticks[p],
                    longest[p] / 1000, call[p] / 1000, p == "during" ? summary : ""
            }
        }' "$work/ticks"
done
