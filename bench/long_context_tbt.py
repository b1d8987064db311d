#!/usr/bin/env python3
"""Do other users' streams keep their TBT while a long prompt is prefilled?

For each mode (default: the disaggregated default, 1 prefill + 1 decode worker of one thread
each, and colocated with 2 threads, on the same 2 cores) against a fresh server:
  1. `alone`: --streams concurrent streaming chats (OpenAI SDK, ignore_eos) run for --alone-s
     seconds; every gap between two streamed tokens of one request is recorded.
  2. `with long`: the same streams keep running while one prompt of --long-tokens token ids is
     sent (max_tokens 1); gaps are recorded until it completes. Its TTFT, and the server's split
     of it (the request's log line: queue, prefill, KV transfer, first decode step), too.
Prints a Markdown table: TBT p50 / p99 of the gaps in each phase and the ratio with / alone (the
issue's goal: p99 ratio <= 1.5 in the default mode), per mode, medians over --rounds; writes
every gap under --out.

    python3 bench/long_context_tbt.py --out bench/out/long-tbt                  # Gemma, 8k
    python3 bench/long_context_tbt.py --long-tokens 32000 --out bench/out/long-tbt-32k
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "serving"))

from compare_servers import free_port, make_logger, stop_server, wait_ready  # noqa: E402
from servebench.metrics import percentile  # noqa: E402

GEMMA = os.path.join(ROOT, "models", "gemma-3-270m-q4_k_m.gguf")


def server_command(args, mode, port):
    cmd = [os.path.join(ROOT, "build", "tandem"), "serve", "--model", args.model, "--port",
           str(port), "--mode", mode, "--max-model-len", str(args.long_tokens + 64),
           "--max-num-seqs", str(args.streams + 2), "--served-model-name", "tandem"]
    if mode == "colocated":
        cmd += ["--threads", "2"]
    else:
        cmd += ["--prefill-workers", "1", "--decode-workers", "1", "--threads-per-worker", "1"]
    return cmd + args.server_arg


def scrape(base):
    with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        key, value = line.rsplit(" ", 1)
        try:
            out[key] = float(value)
        except ValueError:
            pass
    return out


class Streams:
    """args.streams threads, each sending streaming chats back to back until stop(); records
    (arrival time s, gap ms) of every token after a request's first."""

    def __init__(self, client, args):
        self.client, self.args = client, args
        self.gaps, self.errors = [], []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self.run, args=(i,)) for i in range(args.streams)]
        for t in self.threads:
            t.start()

    def run(self, i):
        n = 0
        while not self.stopping.is_set():
            n += 1
            try:
                stream = self.client.chat.completions.create(
                    model="tandem", stream=True, max_tokens=self.args.stream_tokens,
                    temperature=0, extra_body={"ignore_eos": True},
                    messages=[{"role": "user",
                               "content": f"User {i}, question {n}: describe a harbour."}])
                last = None
                for chunk in stream:
                    if not chunk.choices or not chunk.choices[0].delta.content:
                        continue
                    now = time.monotonic()
                    if last is not None:
                        with self.lock:
                            self.gaps.append((now, (now - last) * 1000))
                    last = now
            except Exception as e:  # noqa: BLE001 (recorded and reported)
                with self.lock:
                    self.errors.append(repr(e))
                self.stopping.wait(1.0)

    def between(self, t0, t1):
        with self.lock:
            return sorted(g for t, g in self.gaps if t0 <= t <= t1)

    def stop(self):
        self.stopping.set()
        for t in self.threads:
            t.join()


def long_prompt_ids(base, n):
    text = " ".join(f"Record {k}: the tide gauge read {k * 37 % 211} cm at {k % 24}:00."
                    for k in range(n // 6 + 64))
    req = urllib.request.Request(base + "/tokenize", data=json.dumps({"prompt": text}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        ids = json.loads(r.read())["tokens"]
    assert len(ids) >= n, (len(ids), n)
    return ids[:n]


def one_round(args, mode, k, log):
    import openai
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log_path = os.path.join(args.out, f"{mode}-{k}.log")
    with open(log_path, "w") as server_log:
        proc = subprocess.Popen(server_command(args, mode, port), stdout=server_log,
                                stderr=subprocess.STDOUT)
    try:
        wait_ready(base, proc)
        client = openai.OpenAI(base_url=base + "/v1", api_key="none", timeout=3600)
        ids = long_prompt_ids(base, args.long_tokens)
        streams = Streams(client, args)
        try:
            time.sleep(args.warmup_s)
            t0 = time.monotonic()
            time.sleep(args.alone_s)
            t1 = time.monotonic()
            before = scrape(base)
            client.completions.create(model="tandem", prompt=ids, max_tokens=1, temperature=0)
            t2 = time.monotonic()
            after = scrape(base)
        finally:
            streams.stop()
        alone, with_long = streams.between(t0, t1), streams.between(t1, t2)
        preempted = (after.get("tandem_preemptions_total", 0) -
                     before.get("tandem_preemptions_total", 0))
        split = ""
        with open(log_path, errors="replace") as f:
            for line in f:
                if f"prompt_tokens={args.long_tokens} " in line:
                    split = " ".join(w for w in line.split() if w.startswith(
                        ("queue=", "ttft=", "prefill=", "kv_transfer=", "first_decode=")))
        r = {"mode": mode, "long_split": split, "long_ttft_s": t2 - t1, "alone": alone, "with_long": with_long,
             "errors": streams.errors, "preemptions": preempted}
        log(f"{mode}: long prompt {args.long_tokens} tokens in {t2 - t1:.1f} s; gaps alone "
            f"{len(alone)} (p99 {percentile(alone, 99):.1f} ms), with long {len(with_long)} "
            f"(p99 {percentile(with_long, 99):.1f} ms); {len(streams.errors)} errors; "
            f"{preempted:.0f} preemptions; server: {split}")
        return r
    finally:
        stop_server(proc)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=GEMMA)
    p.add_argument("--long-tokens", type=int, default=8192)
    p.add_argument("--streams", type=int, default=8)
    p.add_argument("--stream-tokens", type=int, default=128)
    p.add_argument("--alone-s", type=float, default=30)
    p.add_argument("--warmup-s", type=float, default=5)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--modes", default="disaggregated,colocated")
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "out", "long-tbt"))
    p.add_argument("--server-arg", action="append", default=[],
                   help="one more argument of `tandem serve` (repeatable)")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    log = make_logger(args.out)
    runs = {m: [] for m in args.modes.split(",")}
    for k in range(args.rounds):
        for mode in runs:
            r = one_round(args, mode, k, log)
            runs[mode].append(r)
            with open(os.path.join(args.out, f"{mode}-{k}.json"), "w") as f:
                json.dump(r, f)

    def med(rs, fn):
        return statistics.median(fn(r) for r in rs)

    print(f"\n{args.streams} streams of {args.stream_tokens} tokens; one prompt of "
          f"{args.long_tokens} tokens; medians of {args.rounds} round(s)\n")
    print("| mode | TBT p50 / p99 alone ms | TBT p50 / p99 with the long prefill ms | "
          "p99 ratio | long prompt TTFT s | stream errors |")
    print("|---|---|---|---|---|---|")
    for mode, rs in runs.items():
        a50 = med(rs, lambda r: percentile(r["alone"], 50))
        a99 = med(rs, lambda r: percentile(r["alone"], 99))
        w50 = med(rs, lambda r: percentile(r["with_long"], 50))
        w99 = med(rs, lambda r: percentile(r["with_long"], 99))
        ratio = med(rs, lambda r: percentile(r["with_long"], 99) / percentile(r["alone"], 99))
        ttft = med(rs, lambda r: r["long_ttft_s"])
        errors = sum(len(r["errors"]) for r in rs)
        print(f"| {mode} | {a50:.1f} / {a99:.1f} | {w50:.1f} / {w99:.1f} | {ratio:.2f}x | "
              f"{ttft:.1f} | {errors} |")
    for mode, rs in runs.items():
        print(f"\n{mode}, the long prompt's log line: " + "; ".join(r["long_split"] for r in rs))


if __name__ == "__main__":
    main()
