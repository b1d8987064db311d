#!/usr/bin/env bash
# Installs what tandem needs to build and test on a fresh Debian 12 machine, fetches the default
# model into models/, and builds. Idempotent: a second run installs and downloads nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(build-essential cmake pkg-config git python3 python3-pip
  libgtest-dev libgmock-dev libbenchmark-dev nlohmann-json3-dev libcli11-dev libspdlog-dev
  libfmt-dev libpcre2-dev libxxhash-dev libcpp-httplib-dev libboost1.74-dev curl etcd-server etcd-client
  libucx-dev libssl-dev iperf3 iproute2 procps clang libclang-rt-dev clang-format chromium
  chromium-driver)
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi

# Python packages of the end-to-end tests and the benchmark reports: the OpenAI SDK, requests,
# plots, prometheus_client (parses the /metrics the serving benchmark scrapes), jsonschema
# (validates structured output), selenium (drives chromium through chromium-driver).
PY_PACKAGES=(openai requests matplotlib prometheus_client jsonschema selenium)
if ! python3 -c "import openai, requests, matplotlib, prometheus_client, jsonschema, selenium" \
    2>/dev/null; then
  echo "setup: installing the Python packages ${PY_PACKAGES[*]}"
  python3 -m pip install --quiet "${PY_PACKAGES[@]}" 2>/dev/null ||
    python3 -m pip install --quiet --break-system-packages "${PY_PACKAGES[@]}"
fi

scripts/fetch_model.sh
scripts/fetch_gemma.sh  # the 32k-context model (Gemma 3 270M), used by its tests

# TANDEM_CMAKE_ARGS adds configure options (scripts/test.sh: -DTANDEM_WERROR=ON).
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release ${TANDEM_CMAKE_ARGS:-} >/dev/null
cmake --build build -j"$(nproc)"
