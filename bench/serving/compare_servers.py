#!/usr/bin/env python3
"""tandem serve against llama.cpp's server (llama-cpp-python) on the same trace slice, same model,
same threads: starts each server in turn, runs the serving benchmark against it, alternating the
two for --rounds rounds, and prints the median of each figure with the ratio tandem / llama.cpp.

    pip install 'llama-cpp-python[server]' matplotlib
    python3 bench/serving/compare_servers.py --rounds 3 --out bench/out/serve-trace

Benchmark arguments after `--` replace the default workload (see docs/benchmarks.md).
Both servers generate exactly the asked number of tokens: tandem through `ignore_eos`, llama.cpp
through a -100 logit bias on SmolLM2's end-of-generation tokens (ids 0, 2, 4).
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
DEFAULT_BENCH = ["--trace", os.path.join(ROOT, "..", "shared", "data", "mooncake-traces",
                                         "conversation_trace.jsonl"),
                 "--max-requests", "12", "--length-scale", "0.02", "--output-scale", "0.1",
                 "--time-scale", "2", "--slo-ttft-ms", "2000", "--slo-tbt-ms", "200",
                 "--warmup", "2"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url, proc, timeout_s=180):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/v1/models", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"server at {url} not ready in {timeout_s} s")


def stop_server(proc, timeout_s=60):
    """SIGTERM, then SIGKILL if the server has not exited within timeout_s."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def make_logger(out_dir):
    """log(msg): a timestamped line on stderr and appended to out_dir/log.txt."""
    logf = open(os.path.join(out_dir, "log.txt"), "a")

    def log(msg):
        line = f"[{time.strftime('%H:%M:%S')}] {msg}"
        print(line, file=sys.stderr, flush=True)
        logf.write(line + "\n")
        logf.flush()
    return log


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--tandem", default=os.path.join(ROOT, "build", "tandem"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tandem-mode", default="colocated", choices=["colocated", "disaggregated"],
                    help="tandem serve --mode (the recorded figures are colocated)")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "out", "serve-trace"))
    ap.add_argument("bench_args", nargs="*", help="benchmark arguments (after --)")
    args = ap.parse_args()
    bench_args = args.bench_args or DEFAULT_BENCH
    servers = {
        "tandem": ([args.tandem, "--log-level", "warn", "serve", "--mode", args.tandem_mode,
                    "--model", args.model, "--threads", str(args.threads), "--port", "{port}"], []),
        "llama.cpp": ([sys.executable, "-m", "llama_cpp.server", "--model", args.model,
                       "--n_threads", str(args.threads), "--n_threads_batch", str(args.threads),
                       "--n_ctx", "8192", "--port", "{port}", "--interrupt_requests", "False"],
                      ["--extra-body", json.dumps({"logit_bias": {"0": -100, "2": -100, "4": -100}})]),
    }
    keys = [("completed", "completed"), ("failed", "failed"), ("short_outputs", "short outputs"),
            ("request_throughput_rps", "req/s"), ("output_throughput_tps", "output tok/s"),
            ("goodput_rps", "goodput req/s"), ("slo_attainment", "SLO attainment"),
            ("ttft_ms.p50", "TTFT p50 ms"), ("ttft_ms.p90", "TTFT p90 ms"),
            ("tpot_ms.p50", "TPOT p50 ms"), ("itl_ms.p50", "ITL p50 ms"),
            ("tbt_ms.p50", "TBT p50 ms"), ("tbt_ms.p90", "TBT p90 ms"), ("e2e_ms.p50", "E2E p50 ms")]
    results = {name: [] for name in servers}
    for rnd in range(args.rounds):
        for name, (cmd, extra) in servers.items():
            port = free_port()
            cmd = [c.replace("{port}", str(port)) for c in cmd]
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            url = f"http://127.0.0.1:{port}"
            out = os.path.join(args.out, f"{name}-round{rnd + 1}")
            try:
                wait_ready(url, proc)
                subprocess.run([sys.executable, os.path.join(HERE, "serve_bench.py"), "--base-url", url,
                                *bench_args, *extra, "--label", name, "--out", out], check=True,
                               timeout=3600)
            finally:
                stop_server(proc)
            with open(os.path.join(out, "summary.json")) as f:
                results[name].append(json.load(f))

    def get(s, key):
        for part in key.split("."):
            s = s[part]
        return s

    print(f"| measurement (median of {args.rounds}) | tandem | llama.cpp | tandem / llama.cpp |")
    print("|---|---|---|---|")
    for key, label in keys:
        a = statistics.median(get(s, key) for s in results["tandem"])
        b = statistics.median(get(s, key) for s in results["llama.cpp"])
        ratio = f"{a / b:.2f}x" if b else "n/a"
        print(f"| {label} | {a:.3g} | {b:.3g} | {ratio} |")
    subprocess.run([sys.executable, os.path.join(HERE, "serve_bench.py"), "--compare",
                    os.path.join(args.out, "tandem-round1"), os.path.join(args.out, "llama.cpp-round1"),
                    "--label", "tandem,llama.cpp", "--out", os.path.join(args.out, "compare")],
                   check=True, stdout=subprocess.DEVNULL, timeout=600)


if __name__ == "__main__":
    main()
