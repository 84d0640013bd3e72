#!/usr/bin/env bash
# Patching an entry that overwrites two instructions on a hostile target (issue 31):
# the `entry_race` fixture runs THREADS threads that nap 20 us and call `work_b` (a
# 3-byte and a 4-byte instruction at its entry, no padding within reach) 200,000 times,
# checking every result. Each round starts the fixture and runs `tendril count PID
# work_b --duration 0.05` RUNS times on it; each count installs the jump with a stop and
# restores it. Prints every count that failed and whether the fixture survived. A count
# whose pad is not free (an earlier count's pad not restored yet) overwrites both
# instructions; a thread preempted inside the earlier count's trampoline, which goes
# back to the second instruction, then resumed inside the new jump and crashed the
# fixture: 2 of 6 runs (fc1126c) and 1 of 27 (f385f4d). Now such a patch is refused
# with its reason while that pad waits to be restored: 0 of 50 runs crashed it.
#
# Usage: [TENDRIL=path] benches/scripts/entry_race.sh [ROUNDS] [RUNS] [THREADS]
#        (from the repository, after cargo build --release; needs gcc)
set -euo pipefail
rounds=${1:-2}
runs=${2:-25}
threads=${3:-1000}
here=$(cd "$(dirname "$0")/../.." && pwd)
tendril="${TENDRIL:-$here/target/release/tendril}"
work=$(mktemp -d)
target_pid=
cleanup() {
    [ -n "$target_pid" ] && kill -9 "$target_pid" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
gcc -O2 -g -pthread -o "$work/entry_race" "$here/fixtures/entry_race.c"
crashes=0
failures=0
total=0
for round in $(seq "$rounds"); do
    "$work/entry_race" "$threads" 2> "$work/target.err" &
    target_pid=$!
    sleep 2
    for run in $(seq "$runs"); do
        total=$((total + 1))
        if ! timeout 60 "$tendril" count "$target_pid" work_b --duration 0.05 > "$work/count.txt" 2>&1; then
            failures=$((failures + 1))
            echo "round $round run $run: $(tail -1 "$work/count.txt")"
        fi
        if ! kill -0 "$target_pid" 2>/dev/null || grep -q '^State:.*Z' "/proc/$target_pid/status"; then
            crashes=$((crashes + 1))
            echo "round $round run $run: the target died: $(cat "$work/target.err")"
            break
        fi
    done
    kill -9 "$target_pid" 2>/dev/null || true
    wait "$target_pid" 2>/dev/null || true
    target_pid=
done
echo "$total counts: $failures failed, the target died $crashes times"
