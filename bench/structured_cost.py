#!/usr/bin/env python3
"""What structured output (constrained decoding) costs per token, against the time per output
token, at a batch of --concurrency streams.

One `tandem serve` (colocated, default settings apart from --threads); for each format — plain
text, json_object, json_schema (a person: strings, an integer, an enum, an array) — --concurrency
chat requests at once (sampled, seeded, --max-tokens each), --rounds times. From /metrics around
each batch: the sampler's seconds per generated token (tandem_worker_sampling_seconds_total over
tandem_generation_tokens_total) and its share of the engine's time (sampling / (forward passes +
sampling)); from the streams: TPOT (mean over requests of (last token - first token) / (tokens -
1)). The ratio that matters: sampler seconds per step (concurrency x per token, the loop draws
the batch's tokens one after the other) / TPOT. Medians over the rounds.

    python3 bench/structured_cost.py --out bench/out/structured     # ~3 minutes on 2 cores

Writes --out/results.json and prints a markdown table.
"""
import argparse
import concurrent.futures
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import time

import requests

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer"},
        "city": {"enum": ["Paris", "Rome", "Oslo", "Lima"]},
        "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 24}, "maxItems": 4},
    },
    "required": ["name", "age", "city", "hobbies"],
    "additionalProperties": False,
}
FORMATS = {
    "text": None,
    "json_object": {"type": "json_object"},
    "json_schema": {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}},
}
TOPICS = ["a teacher", "a sailor", "a painter", "a farmer", "a doctor", "a pilot", "a baker", "a poet"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metric_sum(text, name):
    total = 0.0
    for m in re.finditer(r"^" + re.escape(name) + r"(\{[^}]*\})? ([0-9.e+-]+)$", text, re.M):
        total += float(m.group(2))
    return total


def snapshot(base):
    text = requests.get(base + "/metrics", timeout=30).text
    return {
        "sampling": metric_sum(text, "tandem_worker_sampling_seconds_total"),
        "busy": metric_sum(text, "tandem_worker_busy_seconds_total"),
        "tokens": metric_sum(text, "tandem_generation_tokens_total"),
    }


def one(base, i, fmt, max_tokens):
    body = {"messages": [{"role": "user", "content": f"Describe {TOPICS[i % len(TOPICS)]} in a few words."}],
            "max_tokens": max_tokens, "temperature": 0.7, "seed": i, "stream": True}
    if fmt is not None:
        body["response_format"] = fmt
    times = []
    with requests.post(base + "/v1/chat/completions", json=body, stream=True, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if ev["choices"] and ev["choices"][0]["delta"].get("content"):
                times.append(time.monotonic())
    return (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None


def batch(base, fmt, concurrency, max_tokens):
    before = snapshot(base)
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        tpots = [t for t in pool.map(lambda i: one(base, i, fmt, max_tokens), range(concurrency)) if t]
    after = snapshot(base)
    d = {k: after[k] - before[k] for k in before}
    per_token = d["sampling"] / d["tokens"] if d["tokens"] else 0.0
    tpot = statistics.mean(tpots)
    return {"sampling_s_per_token": per_token,
            "sampling_share": d["sampling"] / (d["busy"] + d["sampling"]) if d["busy"] else 0.0,
            "tpot_s": tpot,
            "step_sampling_over_tpot": concurrency * per_token / tpot,
            "tokens": d["tokens"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "tandem"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "out", "structured"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = open(os.path.join(args.out, "serve.log"), "w")
    proc = subprocess.Popen([args.bin, "serve", "--model", args.model, "--port", str(port),
                             "--threads", str(args.threads), "--max-num-seqs", str(max(args.concurrency, 1))],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(600):
            try:
                if requests.get(base + "/health", timeout=1).ok:
                    break
            except requests.RequestException:
                pass
            time.sleep(0.2)
        results = {name: [] for name in FORMATS}
        for r in range(args.rounds):
            for name, fmt in FORMATS.items():
                results[name].append(batch(base, fmt, args.concurrency, args.max_tokens))
                print(f"round {r + 1} {name}: {results[name][-1]}", file=sys.stderr)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    med = {name: {k: statistics.median(x[k] for x in runs) for k in runs[0]} for name, runs in results.items()}
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"args": vars(args), "rounds": results, "median": med}, f, indent=2)
    print(f"| format | sampler ms/token | sampler share of engine time | TPOT ms at {args.concurrency} streams "
          f"| sampler per step / TPOT |")
    print("|---|---|---|---|---|")
    for name, m in med.items():
        print(f"| {name} | {m['sampling_s_per_token'] * 1e3:.3f} | {m['sampling_share'] * 100:.1f}% "
              f"| {m['tpot_s'] * 1e3:.1f} | {m['step_sampling_over_tpot'] * 100:.1f}% |")


if __name__ == "__main__":
    main()
