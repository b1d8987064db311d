#!/usr/bin/env python3
"""Side-by-side engine benchmark: tandem's engine_bench against llama.cpp (llama-cpp-python)
on the same model, threads, prompt lengths and batch sizes, alternating the two for several
rounds on the same machine. Prints a Markdown table of medians, the ratio tandem / llama.cpp,
and the ratio to the machine's measured limits.

    pip install llama-cpp-python          # builds llama.cpp from source
    python3 bench/compare_engine.py --rounds 3
"""
import argparse
import json
import statistics
import subprocess
import sys
from collections import defaultdict


def run_json_lines(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def key(rec):
    if rec["metric"] == "prefill":
        return (rec["threads"], "prefill", rec["prompt_len"])
    if rec["metric"] == "decode":
        return (rec["threads"], "decode", rec["batch"])
    return (rec["threads"], rec["metric"], 0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--prompt-lengths", default="128,512,2048")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--bench", default="build/bench/engine_bench")
    ap.add_argument("--json-out", default="")
    ap.add_argument("--decode-context", type=int, default=128,
                    help="tokens in each sequence's cache before the timed decode steps")
    ap.add_argument("--flash-attn", action="store_true", help="llama.cpp with flash attention")
    args = ap.parse_args()

    ours = defaultdict(list)
    peer = defaultdict(list)
    limits = defaultdict(list)
    gflops = defaultdict(list)
    for r in range(args.rounds):
        cmd = [args.bench, "--model", args.model, "--threads", args.threads,
               "--prompt-lengths", args.prompt_lengths, "--batches", args.batches,
               "--repeats", "3"]
        if args.decode_context != 128:
            cmd += ["--decode-context", str(args.decode_context)]
        if r > 0:
            cmd.append("--no-limits")
        for rec in run_json_lines(cmd):
            if rec["engine"] == "machine":
                limits[(rec["threads"], rec["metric"])].append(rec["value"])
            elif "tokens_per_s" in rec:
                ours[key(rec)].append(rec["tokens_per_s"])
                if "matmul_gops" in rec:
                    gflops[key(rec)].append(rec["matmul_gops"])
            else:
                ours[key(rec)].append(rec["value"])
        cmd = [sys.executable, "bench/llama_cpp_bench.py", "--model", args.model,
               "--threads", args.threads, "--prompt-lengths", args.prompt_lengths,
               "--batches", args.batches, "--repeats", "3", "--json",
               "--decode-context", str(args.decode_context)]
        if args.flash_attn:
            cmd.append("--flash-attn")
        for rec in run_json_lines(cmd):
            if "tokens_per_s" in rec and rec["tokens_per_s"] is not None:
                peer[key(rec)].append(rec["tokens_per_s"])
            elif "value" in rec:
                peer[key(rec)].append(rec["value"])
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)

    model_bytes = __import__("os").path.getsize(args.model)
    isas = sorted({v for (t, m), vs in limits.items() if m == "isa" for v in vs})
    print(f"tandem kernels: {', '.join(isas) or 'unknown'} (TANDEM_ISA or engine_bench --isa "
          "chooses)\n")
    print("| threads | measurement | tandem | llama.cpp | tandem / llama.cpp | vs limit "
          "| tandem min-max | llama.cpp min-max |")
    print("|---|---|---|---|---|---|---|---|")
    rng = lambda v: f"{min(v):.1f}-{max(v):.1f}" if v else "n/a"
    rows = []
    for k in sorted(ours):
        threads, metric, size = k
        a = statistics.median(ours[k])
        b = statistics.median(peer[k]) if peer.get(k) else None
        limit = ""
        if metric == "decode" and size == 1 and limits.get((threads, "read_bandwidth_gbps")):
            # Decode batch 1 streams every weight once per token: its ceiling is the read
            # bandwidth of a weights-sized working set (from L3 where it fits), and DRAM's.
            bw = statistics.median(limits[(threads, "read_bandwidth_gbps")])
            limit = f"{a / (bw * 1e9 / model_bytes):.2f} of {bw * 1e9 / model_bytes:.0f} tok/s (DRAM {bw:.1f} GB/s)"
            if limits.get((threads, "model_read_bandwidth_gbps")):
                bwm = statistics.median(limits[(threads, "model_read_bandwidth_gbps")])
                limit = (f"{a / (bwm * 1e9 / model_bytes):.2f} of {bwm * 1e9 / model_bytes:.0f} "
                         f"tok/s (weights-sized read {bwm:.1f} GB/s); {limit}")
        if metric == "prefill" and limits.get((threads, "peak_int8_gops")) and gflops.get(k):
            peak = statistics.median(limits[(threads, "peak_int8_gops")])
            g = statistics.median(gflops[k])
            if peak > 0:
                limit = (f"matmuls {g:.0f} GOPS = {g / peak:.2f} of int8 dot-product peak "
                         f"{peak:.0f} GOPS")
        name = {"prefill": f"prefill {size} tok/s",
                "decode": f"decode batch {size} ctx {args.decode_context} tok/s"}.get(
            metric, metric)
        ratio = f"{a / b:.2f}x" if b else "n/a"
        bs = f"{b:.1f}" if b else "n/a"
        print(f"| {threads} | {name} | {a:.1f} | {bs} | {ratio} | {limit} "
              f"| {rng(ours[k])} | {rng(peer.get(k))} |")
        rows.append({"threads": threads, "metric": metric, "size": size, "tandem": a, "llama_cpp": b,
                     "tandem_rounds": ours[k], "llama_cpp_rounds": peer.get(k, [])})
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"rows": rows, "limits": {f"{k[0]}:{k[1]}": v for k, v in limits.items()}}, f, indent=1)


if __name__ == "__main__":
    main()
