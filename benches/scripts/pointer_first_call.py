#!/usr/bin/env python3
"""The first call of a new target reached through a pointer, end to end (issue 33).

The `indirect` fixture times its own `time table 3` (three calls through a table, each
to a target not yet instrumented) right after `tendril record --root table_root` says
it records, then twice more; with `direct`, `time direct 3` under `--root direct_root`
(the same calls made directly, the callees patched ahead of the root). The difference
per target is what following it costs its first call.

    python3 benches/scripts/pointer_first_call.py [table|direct] [RUNS]
    (from the repository, after cargo build --release; needs gcc)
"""
import os, re, subprocess, sys, tempfile

here = os.path.dirname(os.path.abspath(__file__))
repo = os.path.dirname(os.path.dirname(here))
tendril = os.environ.get("TENDRIL", os.path.join(repo, "target/release/tendril"))
which = sys.argv[1] if len(sys.argv) > 1 else "table"
runs = int(sys.argv[2]) if len(sys.argv) > 2 else 5
work = tempfile.mkdtemp()
fixture = os.path.join(work, "indirect")
subprocess.run(["gcc", "-O2", "-g", "-pthread", "-o", fixture,
                os.path.join(repo, "fixtures/indirect.c"), "-ldl"], check=True)
ns = lambda line: int(re.search(r" ns (\d+)", line).group(1))
for run in range(runs):
    target = subprocess.Popen([fixture], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, bufsize=1)
    target.stdout.readline()

    def ask(command):
        target.stdin.write(command + "\n")
        target.stdin.flush()
        return target.stdout.readline()

    ask(f"time {which} 3")
    record = subprocess.Popen([tendril, "record", str(target.pid), "--root", f"{which}_root",
                               "-o", os.path.join(work, "p.json")],
                              stderr=subprocess.PIPE, text=True)
    while not record.stderr.readline().startswith("tendril: recording"):
        pass
    first, second, third = (ns(ask(f"time {which} 3")) for _ in range(3))
    print(f"first {which}_root(3): {first / 1000:.1f} us; then {second / 1000:.1f}, "
          f"{third / 1000:.1f} us")
    record.send_signal(2)
    record.wait()
    target.stdin.close()
    target.wait()
