#!/usr/bin/env python3
"""Serving throughput and latency, tandem against llama.cpp's OpenAI server, same model, same
threads, same client: closed loop at several concurrencies with fixed prompt and output lengths.

    pip install 'llama-cpp-python[server]' requests
    python3 bench/serve_compare.py --concurrency 1,8,32 --prompt-tokens 128 --output-tokens 64

For each server and concurrency it sends max(2 * c, 8) streaming completions (distinct prompts,
so no prefix is shared) with c in flight at once, and reports output tokens/s over the whole run,
median TTFT and median TPOT ((e2e - ttft) / (tokens - 1)). Both servers are made to produce
exactly --output-tokens tokens: tandem with `ignore_eos`, llama.cpp with a -100 logit bias on
the end-of-generation tokens (ids 0, 2, 4 of SmolLM2).
"""
import argparse
import concurrent.futures as cf
import json
import os
import socket
import statistics
import subprocess
import sys
import time

import requests

WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november "
         "oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu").split()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prompt(i, n_words):
    # Deterministic, distinct per request from the first word on (no shared prefix).
    return " ".join(WORDS[(i * 7 + j * (i % 5 + 1)) % len(WORDS)] for j in range(n_words)) + f" {i}"


def wait_ready(url, proc, timeout=120):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if requests.get(url + "/v1/models", timeout=1).ok:
                return
        except requests.RequestException:
            pass
        time.sleep(0.5)
    raise RuntimeError("server did not start")


def one_request(url, body):
    t0 = time.perf_counter()
    ttft = None
    n = 0
    with requests.post(url + "/v1/completions", json=body, stream=True, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices") and chunk["choices"][0].get("text"):
                n += 1
                if ttft is None:
                    ttft = time.perf_counter() - t0
    e2e = time.perf_counter() - t0
    return {"ttft": ttft or e2e, "e2e": e2e, "chunks": n}


def run_level(url, extra, concurrency, n_requests, prompt_words, output_tokens):
    bodies = [dict(prompt=prompt(i + 1000 * concurrency, prompt_words), max_tokens=output_tokens,
                   temperature=0, stream=True, **extra) for i in range(n_requests)]
    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(lambda b: one_request(url, b), bodies))
    wall = time.perf_counter() - t0
    tokens = n_requests * output_tokens
    tpot = [(r["e2e"] - r["ttft"]) / max(1, output_tokens - 1) for r in results]
    return {"concurrency": concurrency, "requests": n_requests, "wall_s": wall,
            "output_tok_s": tokens / wall, "ttft_ms_p50": 1000 * statistics.median(r["ttft"] for r in results),
            "tpot_ms_p50": 1000 * statistics.median(tpot),
            "min_chunks": min(r["chunks"] for r in results)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--tandem", default="build/tandem")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--prompt-tokens", type=int, default=128, help="approximate (words ~ tokens)")
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--json-out", default="")
    ap.add_argument("--tandem-mode", default="colocated", choices=["colocated", "disaggregated"],
                    help="tandem serve --mode (the recorded figures are colocated)")
    args = ap.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    n_words = max(1, args.prompt_tokens * 3 // 4)
    servers = {
        "tandem": ([args.tandem, "serve", "--mode", args.tandem_mode, "--model", args.model,
                    "--threads", str(args.threads), "--port", "{port}"], {"ignore_eos": True}),
        "llama.cpp": ([sys.executable, "-m", "llama_cpp.server", "--model", args.model,
                       "--n_threads", str(args.threads), "--n_threads_batch", str(args.threads),
                       "--n_ctx", "8192", "--port", "{port}",
                       # By default a new request interrupts the one streaming: queue instead.
                       "--interrupt_requests", "False"],
                      {"logit_bias": {"0": -100, "2": -100, "4": -100}}),
    }
    out = {}
    for name, (cmd, extra) in servers.items():
        port = free_port()
        cmd = [c.replace("{port}", str(port)) for c in cmd]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_ready(url, proc)
            run_level(url, extra, 1, 2, n_words, 8)  # warm-up
            out[name] = [run_level(url, extra, c, max(2 * c, 8), n_words, args.output_tokens)
                         for c in levels]
        finally:
            proc.terminate()
            proc.wait(timeout=60)
        for r in out[name]:
            print(f"{name}: {r}", file=sys.stderr)
    print("| concurrency | tandem tok/s | llama.cpp tok/s | ratio | tandem TTFT p50 ms | llama.cpp TTFT p50 ms | tandem TPOT p50 ms | llama.cpp TPOT p50 ms |")
    print("|---|---|---|---|---|---|---|---|")
    for a, b in zip(out["tandem"], out["llama.cpp"]):
        print(f"| {a['concurrency']} | {a['output_tok_s']:.1f} | {b['output_tok_s']:.1f} | "
              f"{a['output_tok_s'] / b['output_tok_s']:.2f}x | {a['ttft_ms_p50']:.0f} | {b['ttft_ms_p50']:.0f} | "
              f"{a['tpot_ms_p50']:.1f} | {b['tpot_ms_p50']:.1f} |")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
