#!/usr/bin/env bash
# `record` on CPython's json encoder (issue 32): a Python loop that calls
# `json.dumps` on a 200-key dict and prints the time every 50 dumps; `tendril record
# PID --root encoder_call --duration 3` of it. Per run this prints the bare time per
# dump (the loop's rate in the 1.5 s before the attach), the wall time per dump while recorded (the recording's
# calls of `encoder_call` over its duration), and `encoder_call`'s corrected time per
# call from the profile, which should be near the bare time.
#
# Usage: [TENDRIL=path] [PYTHON=python3] [EXTRA="--time-all"] \
#        benches/scripts/cpython_json.sh [RUNS]      (from the repository, after
#        cargo build --release; needs a CPython built with symbols, e.g. 3.11 from pyenv)
set -euo pipefail
runs=${1:-3}
here=$(cd "$(dirname "$0")/../.." && pwd)
tendril="${TENDRIL:-$here/target/release/tendril}"
python="${PYTHON:-python3}"
work=$(mktemp -d)
loop_pid=
cleanup() {
    [ -n "$loop_pid" ] && kill "$loop_pid" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
cat > "$work/loop.py" <<'PY'
import json, time
data = {"k%d" % i: [i, str(i), {"x": i * 1.5, "y": [1, 2, 3]}] for i in range(200)}
n = 0
while True:
    json.dumps(data)
    n += 1
    if n % 50 == 0:
        print(time.time(), n, flush=True)
PY
echo "load: $(cut -d' ' -f1-3 /proc/loadavg); $("$python" --version 2>&1)"
for run in $(seq "$runs"); do
    "$python" "$work/loop.py" > "$work/times" &
    loop_pid=$!
    # A second and a half of the bare loop first: its rate is the bare time.
    until [ -s "$work/times" ]; do sleep 0.1; done
    sleep 1.5
    began=$(date +%s.%N)
    # shellcheck disable=SC2086 # EXTRA holds options, split on purpose
    "$tendril" record "$loop_pid" --root encoder_call --duration 3 ${EXTRA:-} \
        -o "$work/p.json" 2> "$work/record.err" \
        || { echo "run $run: record failed: $(tail -n 1 "$work/record.err")"; }
    kill "$loop_pid"
    wait "$loop_pid" 2>/dev/null || true
    loop_pid=
    "$python" - "$work/times" "$work/p.json" "$run" "$began" <<'PY'
import json, sys
rows = [(float(t), int(n)) for t, n in (line.split() for line in open(sys.argv[1]))]
first = [r for r in rows if r[0] < float(sys.argv[4])]
bare = (first[-1][0] - first[0][0]) / (first[-1][1] - first[0][1]) * 1e6
profile = json.load(open(sys.argv[2]))
root = profile["merged"]["roots"][0]
seconds = profile["duration_ns"] / 1e9
wall = seconds * 1e6 / root["calls"]
corrected = root["total_ns"] / root["calls"] / 1e3
print(f"run {sys.argv[3]}: bare {bare:.0f} us a dump; recorded {root['calls']} calls in "
      f"{seconds:.2f} s, {wall:.0f} us each ({wall / bare:.1f}x bare); corrected "
      f"{corrected:.0f} us a call ({corrected / bare:.2f}x bare)")
PY
done
