#!/usr/bin/env bash
# Sets up (scripts/setup.sh; warnings are errors), checks formatting and lock annotations, runs
# the whole default test suite, then every fuzzer briefly (scripts/fuzz.sh, 10 s each).
# `ctest --test-dir build -L unit` is the quick loop.
set -euo pipefail
cd "$(dirname "$0")/.."
TANDEM_CMAKE_ARGS="-DTANDEM_WERROR=ON" scripts/setup.sh
scripts/check_format.sh
scripts/check_includes.sh
scripts/check_thread_safety.sh
# The label `long` (32k-token cases, 100 rounds of chaos) is opt-in: ctest --test-dir build -L long.
ctest --test-dir build --output-on-failure -j"$(nproc)" --timeout 600 -LE long
scripts/fuzz.sh --seconds 10
