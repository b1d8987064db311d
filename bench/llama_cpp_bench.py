#!/usr/bin/env python3
"""Benchmark llama.cpp (through llama-cpp-python) on a GGUF model.

Meant to be run side by side with tandem's own benchmark.  Measures, for each
thread count:

  * prefill tokens/s for each prompt length: a fixed, deterministic token
    sequence of that length evaluated in one llama_decode call up to 8,192 tokens
    (n_batch = prompt length, n_ubatch 512), in calls of 8,192 beyond, median over --repeats;
  * decode tokens/s at batch 1: after a 128-token prompt (--decode-context; evaluated once,
    each repeat rewinds to its end), --decode-tokens
    single-token steps through Llama.eval (logits of each step computed),
    median over --repeats;
  * decode tokens/s at batch 8 and 32 (--batches) with the low-level
    llama_batch / llama_decode API: B sequences, each with its own 128-token
    prompt (not timed), then --decode-tokens steps that each decode one token
    per sequence (B tokens per llama_decode, logits for all B), median over
    --repeats (prompts evaluated once; each repeat drops the decoded positions).  tokens/s counts all B sequences' tokens;
  * peak RSS of the process (resource.getrusage ru_maxrss); each thread count
    runs in its own process, so the figures do not carry over.

Input tokens are fixed (taken from a tokenized text), not sampled, so no
sampling cost is included in any figure.

Output (--json): one JSON object per line, e.g.
  {"engine": "llama.cpp", "threads": 2, "metric": "prefill", "prompt_len": 512, "tokens_per_s": ...}
  {"engine": "llama.cpp", "threads": 2, "metric": "decode", "batch": 8, "tokens_per_s": ...}
  {"engine": "llama.cpp", "threads": 2, "metric": "peak_rss", "rss_mb": ...}
"""

import argparse
import ctypes
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

import llama_cpp

DECODE_PROMPT_LEN = 128
MAX_N_BATCH = 8192

TEXT = (
    "A transformer language model processes text as a sequence of tokens. Each token is "
    "mapped to a vector by an embedding table, and the sequence of vectors passes through a "
    "stack of identical blocks, each with a self-attention layer and a feed-forward layer. "
    "Inference engines spend their time in two phases: prefill, where the whole prompt is "
    "processed at once and arithmetic throughput is the limit, and decode, where one token "
    "is produced at a time and every weight must be read from memory for each step. The "
    "key-value cache keeps the keys and values of past positions so that they need not be "
    "recomputed. Quantized formats store blocks of thirty-two weights with a scale and a "
    "minimum, which reduces memory traffic at the cost of a few extra instructions. "
)


def parse_int_list(s):
    return [int(x) for x in s.split(",") if x.strip()]


def token_stream(llm, n):
    """A deterministic token sequence of length >= n (numbered copies of TEXT)."""
    toks = []
    i = 0
    while len(toks) < n:
        i += 1
        toks += llm.tokenize(("Part %d. " % i + TEXT).encode(), add_bos=False, special=False)
    return [int(t) for t in toks]


def peak_rss_mb():
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return kb / 1024.0


class Emitter:
    def __init__(self, as_json):
        self.as_json = as_json

    def __call__(self, rec):
        if self.as_json:
            print(json.dumps(rec), flush=True)
        else:
            extra = ", ".join("%s=%s" % (k, v) for k, v in rec.items()
                              if k not in ("engine", "threads", "metric"))
            print("llama.cpp threads=%d %-8s %s" % (rec["threads"], rec["metric"], extra),
                  flush=True)


def bench_prefill(llm, toks, repeats, warmup):
    times = []
    for r in range(warmup + repeats):
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(toks)
        dt = time.perf_counter() - t0
        if r >= warmup:
            times.append(dt)
    llm.reset()
    return statistics.median(times), times


def bench_decode_b1(llm, prompt, steps_toks, repeats, warmup):
    # The prompt is evaluated once; each repeat rewinds to its end (Llama.eval drops the cache
    # past n_tokens first), so long decode contexts are not re-prefilled every repeat.
    times = []
    llm.reset()
    llm.eval(prompt)
    for r in range(warmup + repeats):
        llm.n_tokens = len(prompt)
        t0 = time.perf_counter()
        for t in steps_toks:
            llm.eval([t])
        dt = time.perf_counter() - t0
        if r >= warmup:
            times.append(dt)
    llm.reset()
    return statistics.median(times), times


def batch_set(batch, entries):
    """entries: list of (token, pos, seq_id, want_logits)."""
    for i, (tok, pos, seq, lg) in enumerate(entries):
        batch.token[i] = tok
        batch.pos[i] = pos
        batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = seq
        batch.logits[i] = 1 if lg else 0
    batch.n_tokens = len(entries)


def bench_decode_batched(llm, B, threads, stream, n_steps, repeats, warmup,
                         prompt_len=DECODE_PROMPT_LEN, flash_attn=False, shared_prompt=False):
    """B sequences, prompt_len-token prompt each, then n_steps steps of B tokens.

    shared_prompt: evaluate sequence 0's prompt once and copy its KV to the others
    (llama_memory_seq_cp) instead of evaluating B prompts: B x 32k prompts would take most of
    an hour to prefill. Each sequence still attends over its own prompt_len positions."""
    cp = llama_cpp.llama_context_default_params()
    # llama.cpp pads n_ctx to a multiple of 256 and splits it evenly between
    # sequences; keep each sequence's share a multiple of 256.
    per_seq = 256 * ((prompt_len + n_steps + 1 + 255) // 256)
    cp.n_ctx = B * per_seq
    cp.n_batch = max(B, min(prompt_len, MAX_N_BATCH))
    cp.n_ubatch = min(512, cp.n_batch)
    cp.n_seq_max = B
    cp.n_threads = threads
    cp.n_threads_batch = threads
    cp.flash_attn_type = (llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn else
                          llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED)  # Llama() default: off
    cp.no_perf = True
    if hasattr(llama_cpp, "llama_init_from_model"):
        ctx = llama_cpp.llama_init_from_model(llm._model.model, cp)
    else:
        ctx = llama_cpp.llama_new_context_with_model(llm._model.model, cp)
    if not ctx:
        raise RuntimeError("failed to create context with n_seq_max=%d" % B)
    batch = llama_cpp.llama_batch_init(cp.n_batch, 0, B)
    mem = llama_cpp.llama_get_memory(ctx)
    times = []
    try:
        # Prompts (not timed), evaluated once: sequence s gets stream[s : s+prompt_len]. Each
        # repeat first drops the previous repeat's decoded positions (>= prompt_len).
        llama_cpp.llama_memory_clear(mem, True)
        for s in range(1 if shared_prompt else B):
            p = stream[s:s + prompt_len]
            # In chunks of n_batch tokens (prompts longer than one batch).
            for c0 in range(0, len(p), cp.n_batch):
                part = p[c0:c0 + cp.n_batch]
                batch_set(batch, [(t, c0 + i, s, c0 + i == len(p) - 1)
                                  for i, t in enumerate(part)])
                rc = llama_cpp.llama_decode(ctx, batch)
                if rc != 0:
                    raise RuntimeError("llama_decode (prompt) returned %d" % rc)
        if shared_prompt:
            for s in range(1, B):
                llama_cpp.llama_memory_seq_cp(mem, 0, s, -1, -1)
        for r in range(warmup + repeats):
            for s in range(B):
                llama_cpp.llama_memory_seq_rm(mem, s, prompt_len, -1)
            t0 = time.perf_counter()
            for k in range(n_steps):
                pos = prompt_len + k
                batch_set(batch, [(stream[prompt_len + s + k], pos, s, True)
                                  for s in range(B)])
                rc = llama_cpp.llama_decode(ctx, batch)
                if rc != 0:
                    raise RuntimeError("llama_decode (step) returned %d" % rc)
            # make sure the last step's logits are materialized
            llama_cpp.llama_get_logits_ith(ctx, B - 1)
            dt = time.perf_counter() - t0
            if r >= warmup:
                times.append(dt)
    finally:
        llama_cpp.llama_batch_free(batch)
        llama_cpp.llama_free(ctx)
    return statistics.median(times), times


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--threads", type=parse_int_list, default=[1, 2])
    ap.add_argument("--prompt-lengths", type=parse_int_list, default=[128, 512, 2048])
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--decode-context", type=int, default=DECODE_PROMPT_LEN,
                    help="prompt tokens in the cache before the timed decode steps")
    ap.add_argument("--flash-attn", action="store_true",
                    help="enable llama.cpp flash attention (default: off, as Llama())")
    ap.add_argument("--batches", type=parse_int_list, default=[8, 32],
                    help="batched-decode sizes (low-level API); empty string to skip")
    ap.add_argument("--shared-prompt", action="store_true",
                    help="batched decode: evaluate one prompt and copy its KV to every "
                         "sequence (for long contexts, where B prompts take too long)")
    ap.add_argument("--no-batch1", action="store_true", help="skip the batch-1 decode")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1, help="untimed runs before each measurement")
    ap.add_argument("--json", action="store_true", help="print JSON lines only")
    ap.add_argument("--no-header", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if len(args.threads) > 1:
        # One process per thread count so that each peak-RSS figure is its own.
        rc = 0
        for i, T in enumerate(args.threads):
            argv = [sys.executable, os.path.abspath(__file__), "--model", args.model,
                    "--threads", str(T),
                    "--prompt-lengths", ",".join(map(str, args.prompt_lengths)),
                    "--decode-tokens", str(args.decode_tokens),
                    "--decode-context", str(args.decode_context),
                    "--batches", ",".join(map(str, args.batches)),
                    "--repeats", str(args.repeats), "--warmup", str(args.warmup)]
            if args.flash_attn:
                argv.append("--flash-attn")
            if args.shared_prompt:
                argv.append("--shared-prompt")
            if args.no_batch1:
                argv.append("--no-batch1")
            if args.json:
                argv.append("--json")
            elif i > 0:
                argv.append("--no-header")
            rc |= subprocess.call(argv)
        sys.exit(rc)

    emit = Emitter(args.json)
    P = args.decode_context
    max_prompt = max(args.prompt_lengths + [P])
    n_ctx = max_prompt + args.decode_tokens + 64
    max_b = max(args.batches) if args.batches else 1

    base = {"engine": "llama.cpp"}
    if not args.json and not args.no_header:
        print("# llama-cpp-python %s, %s, system: %s" % (
            llama_cpp.__version__, platform.machine(),
            llama_cpp.llama_print_system_info().decode().strip()), flush=True)

    for T in args.threads:
        # n_batch bounds llama-cpp-python's logits buffer (n_batch x vocab floats): past 8,192
        # tokens a prompt goes in several llama_decode calls of 8,192 (each of 512-token ubatches).
        n_batch = min(max_prompt, MAX_N_BATCH)
        llm = llama_cpp.Llama(model_path=args.model, n_ctx=n_ctx, n_batch=n_batch,
                              n_ubatch=512, n_threads=T, n_threads_batch=T,
                              logits_all=False, verbose=False, seed=1234,
                              flash_attn=args.flash_attn)
        need = max(max_prompt, P + args.decode_tokens + max_b)
        stream = token_stream(llm, need)
        common = dict(base, threads=T)

        for L in args.prompt_lengths:
            med, all_t = bench_prefill(llm, stream[:L], args.repeats, args.warmup)
            emit(dict(common, metric="prefill", prompt_len=L,
                      tokens_per_s=round(L / med, 2), median_s=round(med, 5),
                      repeats=args.repeats, n_batch=n_batch, n_ubatch=512))

        if not args.no_batch1:
            prompt = stream[:P]
            steps = stream[P:P + args.decode_tokens]
            med, _ = bench_decode_b1(llm, prompt, steps, args.repeats, args.warmup)
            emit(dict(common, metric="decode", batch=1, prompt_len=P,
                      decode_tokens=args.decode_tokens,
                      tokens_per_s=round(args.decode_tokens / med, 2),
                      median_s=round(med, 5), repeats=args.repeats, api="Llama.eval"))
            emit(dict(common, metric="peak_rss", rss_mb=round(peak_rss_mb(), 1),
                      note="after prefill and batch-1 decode"))

        for B in args.batches:
            try:
                med, _ = bench_decode_batched(llm, B, T, stream, args.decode_tokens,
                                              args.repeats, args.warmup, P, args.flash_attn,
                                              args.shared_prompt)
                emit(dict(common, metric="decode", batch=B, prompt_len=P,
                          shared_prompt=args.shared_prompt,
                          decode_tokens=args.decode_tokens,
                          tokens_per_s=round(B * args.decode_tokens / med, 2),
                          median_s=round(med, 5), repeats=args.repeats,
                          api="llama_batch/llama_decode"))
            except Exception as e:  # report, keep going
                emit(dict(common, metric="decode", batch=B, tokens_per_s=None,
                          unavailable=str(e)))
        emit(dict(common, metric="peak_rss", rss_mb=round(peak_rss_mb(), 1),
                  note="process peak so far (includes batched-decode contexts)"))
        llm.close()


if __name__ == "__main__":
    main()
