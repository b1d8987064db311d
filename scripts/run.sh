#!/usr/bin/env bash
# Sets up (scripts/setup.sh) and runs the main job with default settings.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec build/tandem generate --chat --prompt "${1:-What is the capital of France? Answer in one sentence.}" --max-tokens 128
