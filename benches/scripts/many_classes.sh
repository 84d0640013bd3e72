#!/usr/bin/env bash
# Calls through pointers at scale (issue 33): a C++ program whose 92 MB library holds
# CLASSES classes of 8 virtual methods (benches/gen/many_classes.py), recorded from
# `scale_root`, which calls 20 virtual methods and 10 functions through a table each
# round. Prints how long `tendril record` took to say it records, how many of the 30
# targets appear below the root with exactly 1,000 calls, and how many functions were
# instrumented. Extra arguments go to `tendril record` (e.g. --pointer-candidates).
#
# Usage: [TENDRIL=path] [CLASSES=20000] benches/scripts/many_classes.sh [ARGS...]
#        (from the repository, after cargo build --release; g++ takes about 4 minutes
#        for 20,000 classes, and the build is kept in /tmp/tendril-many-classes)
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
tendril="${TENDRIL:-$here/target/release/tendril}"
dir=/tmp/tendril-many-classes
classes=${CLASSES:-20000}
if [ ! -x "$dir/many_classes" ] || [ "$(cat "$dir/classes" 2>/dev/null)" != "$classes" ]; then
    python3 "$here/benches/gen/many_classes.py" "$dir" "$classes" 8
    (cd "$dir" && sh build.sh && echo "$classes" > classes)
fi
python3 - "$tendril" "$dir" "$@" <<'PY'
import json, subprocess, sys, time
tendril, dir, extra = sys.argv[1], sys.argv[2], sys.argv[3:]
target = subprocess.Popen([f"{dir}/many_classes"], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True, bufsize=1)
target.stdout.readline()
def ask(command):
    target.stdin.write(command + "\n"); target.stdin.flush()
    return target.stdout.readline()
ask("run 10")
began = time.time()
record = subprocess.Popen([tendril, "record", str(target.pid), "--root", "scale_root",
                           "-o", f"{dir}/p.json"] + extra, stderr=subprocess.PIPE, text=True)
said = []
while True:
    line = record.stderr.readline(); said.append(line)
    if not line or line.startswith("tendril: recording"): break
started = time.time() - began
ask("run 1000")
record.send_signal(2)
said.append(record.communicate()[1])
target.stdin.close(); target.wait()
profile = json.load(open(f"{dir}/p.json"))
root = next(n for n in profile["merged"]["roots"] if n["name"].startswith("scale_root"))
exact = sum(1 for child in root["children"] if child["calls"] == 1000)
stats = profile["stats"]
print(f"record started in {started * 1000:.0f} ms; {exact} of 30 targets below the root "
      f"with 1,000 calls; {stats['instrumented_functions']} functions instrumented")
for line in "".join(said).splitlines():
    if line.startswith(("tendril: not instrumented", "tendril: calls through")):
        print(line)
PY
