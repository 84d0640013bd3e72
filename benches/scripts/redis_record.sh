#!/usr/bin/env bash
# A stock redis-server under redis-benchmark, bare and recorded (issue 32, item 5):
# PAIRS pairs of runs, each pair a bare run then one while `tendril record --root call`
# records it, on one server started once (loopback, no persistence). Prints each run's
# SET and GET throughput and, per pair, the recorded run's loss against the bare one.
#
# Usage: [TENDRIL=path] benches/scripts/redis_record.sh [PAIRS] [REQUESTS] [PIPELINE]
#        (from the repository, after cargo build --release; needs redis-server and
#        redis-tools: apt-get install redis-server redis-tools)
set -euo pipefail
pairs=${1:-5}
requests=${2:-200000}
# Requests each client sends before it reads the answers (redis-benchmark -P): 1, the
# default, leaves the server waiting on the loopback; 16 keeps it busy.
pipeline=${3:-1}
here=$(cd "$(dirname "$0")/../.." && pwd)
tendril="${TENDRIL:-$here/target/release/tendril}"
port=6391
work=$(mktemp -d)
server_pid=
record_pid=
cleanup() {
    [ -n "$record_pid" ] && kill -INT "$record_pid" 2>/dev/null && wait "$record_pid" || true
    [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
redis-server --port "$port" --save "" --appendonly no --daemonize no \
    --dir "$work" > "$work/server.log" 2>&1 &
server_pid=$!
until redis-cli -p "$port" ping > /dev/null 2>&1; do sleep 0.1; done
# One run: "SET GET" requests per second.
bench() {
    redis-benchmark -p "$port" -n "$requests" -c 50 -P "$pipeline" -t set,get -q 2> /dev/null |
        tr '\r' '\n' | awk '/^SET:/ {set = $2} /^GET:/ {get = $2} END {print set, get}'
}
bench > /dev/null # warm the server up
echo "load: $(cut -d' ' -f1-3 /proc/loadavg); $requests requests a run, 50 clients, pipeline $pipeline"
printf '%-5s %12s %12s %12s %12s %8s %8s\n' pair "bare SET/s" "bare GET/s" "rec SET/s" \
    "rec GET/s" "SET loss" "GET loss"
for pair in $(seq "$pairs"); do
    read -r bare_set bare_get < <(bench)
    "$tendril" record "$server_pid" --root call -o "$work/p.json" 2> "$work/record.err" &
    record_pid=$!
    until grep -q "^tendril: recording" "$work/record.err"; do
        kill -0 "$record_pid" 2>/dev/null || { cat "$work/record.err"; exit 1; }
        sleep 0.05
    done
    read -r rec_set rec_get < <(bench)
    kill -INT "$record_pid"
    wait "$record_pid" || true
    record_pid=
    awk -v p="$pair" -v bs="$bare_set" -v bg="$bare_get" -v rs="$rec_set" -v rg="$rec_get" \
        'BEGIN { printf "%-5s %12.0f %12.0f %12.0f %12.0f %7.1f%% %7.1f%%\n", p, bs, bg, rs, rg,
                 100 * (1 - rs / bs), 100 * (1 - rg / bg) }'
done
tail -n 3 "$work/record.err"
