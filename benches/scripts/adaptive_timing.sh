#!/usr/bin/env bash
# Adaptive timing against bare runs of the tight-call fixture (issue 32), side by side in
# the same session: the roots `root` (10M calls of mid, each calling leaf twice) and
# `fib` (fib(30), ~1.35M calls of ~3 ns), recorded by `tendril run` with adaptive timing
# (the default) and with --time-all. Prints, per run, each root's recorded total against
# the bare one, its stated error, and whether the bare time lies within it.
#
# Usage: benches/scripts/adaptive_timing.sh [RUNS]   (from the repository, after
#        cargo build --release; needs gcc)
set -euo pipefail
runs=${1:-5}
here=$(cd "$(dirname "$0")/../.." && pwd)
tendril="$here/target/release/tendril"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
gcc -O2 -g -pthread -o "$work/tightcall" "$here/fixtures/tightcall.c"
printf 'run 10000000\nfib 30\n' > "$work/input"
bare_ns() { # $1: the fixture's output; $2: run|fib
    awk -v kind="$2" '$1 == kind { print $5 }' "$1"
}
echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-10s %-5s %12s %12s %12s %8s %s\n' mode root bare_ms recorded_ms error_ms ratio holds
for run in $(seq "$runs"); do
    "$work/tightcall" < "$work/input" > "$work/bare.out"
    for mode in adaptive --time-all; do
        flag=(); [ "$mode" = --time-all ] && flag=(--time-all)
        "$tendril" run --root root --root fib "${flag[@]}" -o "$work/p.json" -- \
            "$work/tightcall" < "$work/input" > "$work/rec.out" 2> "$work/rec.err"
        for root in root fib; do
            kind=run; [ "$root" = fib ] && kind=fib
            bare=$(bare_ns "$work/bare.out" "$kind")
            python3 - "$work/p.json" "$root" "$bare" "$mode" <<'PY'
import json, sys
profile = json.load(open(sys.argv[1]))
root, bare, mode = sys.argv[2], int(sys.argv[3]), sys.argv[4]
node = next(n for n in profile["merged"]["roots"] if n["name"] == root)
total, error = node["total_ns"], node.get("error_ns") or 0
holds = "yes" if abs(total - bare) <= error else "NO"
print(f"{mode:<10} {root:<5} {bare/1e6:12.3f} {total/1e6:12.3f} {error/1e6:12.3f} "
      f"{total/bare:8.2f} {holds}")
PY
        done
    done
done
