#!/usr/bin/env bash
# Checks the lock annotations (common/thread_annotations.h) with clang's -Wthread-safety: every
# translation unit that uses them, compiled for syntax only with the flags of the main build
# (build/compile_commands.json). Fails on the first warning. Needs clang++ and a configured build/.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v clang++ >/dev/null || { echo "check_thread_safety: clang++ not installed"; exit 1; }
python3 - <<'PY'
import json, os, re, shlex, subprocess, sys
from concurrent.futures import ThreadPoolExecutor

root = os.getcwd()
entries = json.load(open("build/compile_commands.json"))
def uses_annotations(path):
    text = open(path, errors="replace").read()
    header = os.path.splitext(path)[0] + ".h"
    if os.path.exists(header):
        text += open(header, errors="replace").read()
    # A component's internal headers (an implementation split over several files).
    for inc in re.findall(r'#include "([^"]+_internal\.h)"', text):
        if os.path.exists(os.path.join(root, "src", inc)):
            text += open(os.path.join(root, "src", inc), errors="replace").read()
    return "TANDEM_GUARDED_BY" in text or "TANDEM_REQUIRES" in text or "common/mutex.h" in text

jobs = []
for e in entries:
    src = e["file"]
    if not src.startswith(root) or "/build" in src[len(root):] or not uses_annotations(src):
        continue
    args = shlex.split(e["command"])[1:]
    drop = {"-o"}  # flags with a value to drop; warnings other than thread-safety are gcc's job
    out, skip = [], False
    for a in args:
        if skip: skip = False; continue
        if a in drop: skip = True; continue
        if a in ("-c", "-Werror", "-Wall", "-Wextra"): continue
        out.append(a)
    jobs.append((src, e["directory"], ["clang++", "-fsyntax-only", "-Wthread-safety", "-Werror=thread-safety",
                       "-Wno-unknown-warning-option", "-Wno-unused-command-line-argument"] + out))

def run(job):
    src, directory, cmd = job
    r = subprocess.run(cmd, cwd=directory, capture_output=True, text=True)
    return src, r.returncode, r.stderr

failed = 0
with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
    for src, rc, err in pool.map(run, jobs):
        if rc != 0:
            failed += 1
            sys.stderr.write(f"--- {os.path.relpath(src)}\n{err}\n")
print(f"check_thread_safety: {len(jobs)} translation units, {failed} with errors")
sys.exit(1 if failed else 0)
PY
