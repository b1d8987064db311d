#!/usr/bin/env bash
# Builds the libFuzzer harnesses of fuzz/ (clang, ASan + UBSan, in build-fuzz/) and runs each
# for a while, two at a time; prints executions per harness and in total, and fails when a
# harness finds a crash, a leak, a sanitizer report or a broken property (the input is then in
# build-fuzz/crashes/). Every run first replays the checked-in seeds (fuzz/corpus/<name>) and
# regressions (fuzz/regressions/<name>: inputs that once failed).
#   scripts/fuzz.sh                   # 10 s per harness (the default test run's short form)
#   scripts/fuzz.sh --seconds 3600    # the long run (opt-in)
#   scripts/fuzz.sh --seconds 60 fuzz_gguf fuzz_tokenizer
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=10
jobs=2
harnesses=()
while (($#)); do
  case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    -h|--help) sed -n 2,10p "$0"; exit 0 ;;
    *) harnesses+=("$1"); shift ;;
  esac
done
all=(fuzz_openai_request fuzz_worker_protocol fuzz_metadata_http fuzz_tcp_listener fuzz_gguf
     fuzz_tokenizer fuzz_chat_template fuzz_json_schema fuzz_pool_master fuzz_ssd_tier)
((${#harnesses[@]})) || harnesses=("${all[@]}")

B=build-fuzz
if [ ! -f "$B/CMakeCache.txt" ]; then
  cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
    -DTANDEM_FUZZ=ON -DTANDEM_BUILD_TESTS=OFF -DTANDEM_BUILD_BENCH=OFF >/dev/null
fi
if ! cmake --build "$B" --target fuzzers -j"$(nproc)" >"$B/build.log" 2>&1; then
  tail -50 "$B/build.log"
  echo "fuzz: the harnesses did not build (log: $B/build.log)" >&2
  exit 1
fi

mkdir -p "$B/seeds/gguf" "$B/seeds/worker_protocol" "$B/seeds/tcp_listener" "$B/seeds/ssd_tier" \
  "$B/crashes" "$B/logs"
"$B/fuzz/make_fuzz_seeds" "$B/seeds"

run_one() {
  local h="$1" name="${1#fuzz_}"
  local dirs=("$B/corpus/$name")
  mkdir -p "$B/corpus/$name"
  for d in "fuzz/corpus/$name" "fuzz/regressions/$name" "$B/seeds/$name"; do
    [ -d "$d" ] && dirs+=("$d")
  done
  local dict=()
  case "$name" in
    openai_request|worker_protocol|metadata_http|json_schema|pool_master) dict=(-dict=fuzz/json.dict) ;;
    chat_template) dict=(-dict=fuzz/jinja.dict) ;;
  esac
  # -rss_limit_mb: the tokenizer harness holds Gemma's 262k-token vocabulary under ASan.
  "$B/fuzz/$h" "${dict[@]}" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=6144 \
    -max_len=65536 -print_final_stats=1 -artifact_prefix="$B/crashes/$name-" "${dirs[@]}" \
    >"$B/logs/$name.log" 2>&1
}
export -f run_one
export B seconds

status=0
printf '%s\n' "${harnesses[@]}" | xargs -P "$jobs" -I{} bash -c 'run_one {}' || status=1

total=0
printf '%-24s %14s %10s  %s\n' harness executions exec/s result
for h in "${harnesses[@]}"; do
  name="${h#fuzz_}"
  log="$B/logs/$name.log"
  execs=$(grep -oP 'stat::number_of_executed_units:\s*\K[0-9]+' "$log" | tail -1 || true)
  rate=$(grep -oP 'stat::average_exec_per_sec:\s*\K[0-9]+' "$log" | tail -1 || true)
  result=ok
  if grep -qE '^==[0-9]+==ERROR|runtime error:|fuzz: property failed|Test unit written' "$log" ||
     [ -z "$execs" ]; then
    result="FAILED (see $log)"
    status=1
  fi
  total=$((total + ${execs:-0}))
  printf '%-24s %14s %10s  %s\n' "$h" "${execs:-?}" "${rate:-?}" "$result"
done
printf '%-24s %14s\n' total "$total"
if ((status)); then
  for h in "${harnesses[@]}"; do
    log="$B/logs/${h#fuzz_}.log"
    if grep -qE '^==[0-9]+==ERROR|runtime error:|fuzz: property failed|Test unit written' "$log"; then
      echo "--- $log"; grep -B2 -A25 -m1 -E '^==[0-9]+==ERROR|runtime error:|fuzz: property failed' "$log" || tail -30 "$log"
    fi
  done
fi
exit $status
