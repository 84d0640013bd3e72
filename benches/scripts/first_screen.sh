#!/bin/bash
# Seconds from starting `tendril attach` (or `top`) until its screen names one of the
# target's functions (a line matching NAME_RE), polled every 50 ms in a detached tmux.
#
#   benches/scripts/first_screen.sh BINARY PID CACHE_DIR [attach|top] [NAME_RE]
#
# CACHE_DIR is the symbol cache to use (remove it first for a cold run). For rustc
# (benches/scripts/symbols_scale.sh starts one) the default NAME_RE fits.
set -eu
B=$1; P=$2; C=$3; COMMAND=${4:-attach}; NAME_RE=${5:-"rustc_|LLVM"}
S=tendril-first-screen-$$
start=$(date +%s.%N)
tmux new-session -d -s "$S" -x 200 -y 50 "env TENDRIL_CACHE_DIR=$C $B $COMMAND $P"
trap 'tmux send-keys -t "$S" q 2>/dev/null; sleep 0.5; tmux kill-session -t "$S" 2>/dev/null' EXIT
for _ in $(seq 400); do
    if tmux capture-pane -p -t "$S" 2>/dev/null | grep -qE "$NAME_RE"; then
        end=$(date +%s.%N)
        echo "$COMMAND: $(echo "$end - $start" | bc) s"
        exit 0
    fi
    sleep 0.05
done
echo "$COMMAND: no function named on screen within 20 s"
