#!/bin/sh
# Symbols at scale (issue 33, item 3): `tendril symbols` against a live rustc, which maps
# librustc_driver (150 MB) and libLLVM (200 MB), about 300,000 functions.
#
#   benches/scripts/symbols_scale.sh [RUNS] [BEFORE_BINARY]
#
# Starts rustc on a generated file (benches/gen/big_rust.py 10000, which it compiles
# for minutes), then times each binary (target/release/tendril, and BEFORE_BINARY when
# given, alternated run by run) with /usr/bin/time: cold (cache removed, parsed, index
# written), warm (index read), no cache, a miss (whose hints compare every name), and
# `count` of one function for 1 s with a cold cache. Prints one line a run; kills rustc.
set -eu
RUNS=${1:-3}
BEFORE=${2:-}
AFTER=${AFTER:-target/release/tendril}
WORK=$(mktemp -d /tmp/tendril-symbols-scale.XXXXXX)
python3 benches/gen/big_rust.py 10000 > "$WORK/big.rs"
rustc -O -C codegen-units=1 --crate-type=lib "$WORK/big.rs" --out-dir "$WORK" >/dev/null 2>&1 &
RUSTC=$!
trap 'kill $RUSTC 2>/dev/null; rm -rf "$WORK"' EXIT
# The rustup proxy execs the real compiler: wait until it has mapped LLVM.
P=
for _ in $(seq 100); do
    P=$(pgrep -n -f "$WORK/big.rs" || true)
    if [ -n "$P" ] && grep -q libLLVM "/proc/$P/maps" 2>/dev/null; then break; fi
    sleep 0.1
done
echo "rustc pid $P: $(grep -c . /proc/$P/maps) mappings"

timed() { # label binary args...
    label=$1; shift
    /usr/bin/time -f "$label %e s wall %U user %S sys %M KB" "$@" >/dev/null 2>"$WORK/err" || true
    tail -1 "$WORK/err"
}

one_binary() { # name binary
    cache="$WORK/cache-$1"
    rm -rf "$cache"
    timed "$1 cold" env TENDRIL_CACHE_DIR="$cache" "$2" symbols "$P" LLVMRunPasses
    timed "$1 warm" env TENDRIL_CACHE_DIR="$cache" "$2" symbols "$P" LLVMRunPasses
    timed "$1 off " env TENDRIL_CACHE_DIR=off "$2" symbols "$P" LLVMRunPasses
    timed "$1 miss (warm)" env TENDRIL_CACHE_DIR="$cache" "$2" symbols "$P" LLVMRunPasse
    echo "$1 index: $(du -sm "$cache" | cut -f1) MB"
    rm -rf "$cache"
    timed "$1 count 1 s, cold" env TENDRIL_CACHE_DIR="$cache" "$2" count "$P" LLVMRunPasses --duration 1
}

for run in $(seq "$RUNS"); do
    echo "run $run, load $(cut -d' ' -f1 /proc/loadavg)"
    one_binary after "$AFTER"
    if [ -n "$BEFORE" ]; then one_binary before "$BEFORE"; fi
done
