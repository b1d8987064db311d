#!/usr/bin/env bash
# Sets up (scripts/setup.sh) and runs the main job with default settings: `tandem serve`, an
# OpenAI-compatible server for the bundled model on http://127.0.0.1:8000 (Ctrl-C to stop).
# Extra arguments go to `tandem serve` (e.g. --port 9000 --threads 2).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec build/tandem serve "$@"
