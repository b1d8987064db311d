#!/usr/bin/env python3
"""Produce golden greedy-generation data for Gemma 3 270M from llama.cpp.

Uses llama-cpp-python (which vendors llama.cpp) on models/gemma-3-270m-q4_k_m.gguf and records,
for prompts of about 16 tokens and of exactly 1,024, 8,192 and 32,704 tokens:

  * the prompt tokens (llama.cpp's tokenizer, BOS added as the file asks),
  * the greedy output tokens (MAX_NEW_TOKENS, or until an end-of-generation token),
  * the top-1 minus top-2 logit margin at every step,
  * the first step's 256 largest logits (ids and values) and the mean of all first-step logits,
    so that a test can compare centred logits without storing 262,144 floats per case.

Long prompts are cut, as token ids, from a deterministic text of numbered sections built from
the paragraphs of make_generation_golden.py, each section carrying a pseudo-random code that the
model can only predict by attending far back (the sections repeat, their codes do not).

Usage:
  pip install llama-cpp-python==0.3.36
  python3 tools/golden/make_gemma_golden.py --out tests/golden/gemma3            # 16, 1k, 8k
  python3 tools/golden/make_gemma_golden.py --out tests/golden/gemma3 --long     # the 32k case

The default run writes cases.json; --long writes cases_32k.json (minutes on 2 cores).
"""

import argparse
import json
import os
import platform
import random
import sys

import numpy as np

import llama_cpp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_generation_golden import (  # noqa: E402  (fixed text and helpers, shared)
    PARAGRAPHS, last_logits, sha256_file, top2_margin)

MAX_NEW_TOKENS = 32
TOP_LOGITS = 256
THREADS = 2

SHORT_CASES = [
    ("short_story", "Once upon a time, in a small village at the edge of a great forest,"),
    ("short_code", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"),
    ("short_fact", "The capital of France is Paris. The capital of Germany is"),
    ("short_list", "Three primary colors are red, blue and"),
    ("short_cjk", "机器学习是人工智能的一个分支，它"),
    ("short_count", "1, 2, 3, 4, 5, 6, 7, 8,"),
]
LONG_LENGTHS = [("long_1k", 1024), ("long_8k", 8192)]
LONGEST = ("long_32k", 32768 - 64)


def section_text(n_sections, seed):
    rng = random.Random(seed)
    parts = []
    for i in range(n_sections):
        code = rng.randrange(10000, 99999)
        p = PARAGRAPHS[rng.randrange(len(PARAGRAPHS))]
        parts.append("Section %d (reference code %d). %s The reference code of section %d is %d."
                     % (i + 1, code, p, i + 1, code))
    return "\n\n".join(parts)


def eog_ids(llm):
    vocab = llama_cpp.llama_model_get_vocab(llm._model.model)
    return {t for t in range(llm.n_vocab()) if llama_cpp.llama_vocab_is_eog(vocab, t)}


def greedy(llm, prompt_tokens, eog):
    llm.reset()
    llm.eval(prompt_tokens)
    logits = last_logits(llm)
    first = logits.copy()
    out, margins = [], []
    for _ in range(MAX_NEW_TOKENS):
        tok = int(np.argmax(logits))  # lowest index on ties
        out.append(tok)
        margins.append(round(top2_margin(logits), 4))
        if tok in eog or len(out) == MAX_NEW_TOKENS:
            break
        llm.eval([tok])
        logits = last_logits(llm)
    return first, out, margins


def make_case(llm, eog, name, prompt_tokens, prompt_text):
    first, out, margins = greedy(llm, prompt_tokens, eog)
    top = np.argsort(-first, kind="stable")[:TOP_LOGITS]
    case = {"name": name, "n_prompt_tokens": len(prompt_tokens)}
    if prompt_text is not None:
        case["prompt"] = prompt_text
    case.update({
        "prompt_tokens": prompt_tokens,
        "output_tokens": out,
        "margins": margins,
        "min_margin": min(margins),
        "first_logits_mean": float(np.mean(first.astype(np.float64))),
        "first_top_ids": [int(i) for i in top],
        "first_top_logits": [round(float(first[i]), 5) for i in top],
        "output_text": llm.detokenize(out).decode("utf-8", errors="replace"),
    })
    print("%-12s prompt=%6d out=%2d min_margin=%.3f %r" % (
        name, len(prompt_tokens), len(out), min(margins), case["output_text"][:50]),
        file=sys.stderr)
    return case


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="models/gemma-3-270m-q4_k_m.gguf")
    ap.add_argument("--out", default="tests/golden/gemma3")
    ap.add_argument("--long", action="store_true", help="the 32k-token case only")
    args = ap.parse_args()

    n_ctx = 32768 if args.long else 8192 + 64
    llm = llama_cpp.Llama(model_path=args.model, n_ctx=n_ctx, n_batch=512, n_ubatch=512,
                          n_threads=THREADS, n_threads_batch=THREADS, logits_all=False,
                          verbose=False)
    assert llm.n_vocab() == 262144, llm.n_vocab()
    eog = eog_ids(llm)
    text = section_text(400, seed=7)  # ~70k tokens, cut below
    text_tokens = [int(t) for t in llm.tokenize(text.encode("utf-8"), add_bos=True,
                                                special=False)]
    cases = []
    if args.long:
        name, n = LONGEST
        assert len(text_tokens) > n
        cases.append(make_case(llm, eog, name, text_tokens[:n], None))
    else:
        for name, prompt in SHORT_CASES:
            toks = [int(t) for t in llm.tokenize(prompt.encode("utf-8"), add_bos=True,
                                                 special=False)]
            cases.append(make_case(llm, eog, name, toks, prompt))
        for name, n in LONG_LENGTHS:
            cases.append(make_case(llm, eog, name, text_tokens[:n], None))

    doc = {
        "generator": {
            "tool": "tools/golden/make_gemma_golden.py",
            "llama_cpp_python": llama_cpp.__version__,
            "system_info": llama_cpp.llama_print_system_info().decode(),
            "python": platform.python_version(),
            "numpy": np.__version__,
            "options": {"n_ctx": n_ctx, "n_batch": 512, "n_ubatch": 512, "n_threads": THREADS,
                        "kv_type": "f16 (default)",
                        "flash_attn": "disabled (llama-cpp-python default)"},
        },
        "model": {"file": os.path.basename(args.model), "sha256": sha256_file(args.model)},
        "max_new_tokens": MAX_NEW_TOKENS,
        "eog_ids": sorted(eog),
        "cases": cases,
    }
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "cases_32k.json" if args.long else "cases.json")
    with open(path, "w") as f:
        json.dump(doc, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print("wrote", path, file=sys.stderr)


if __name__ == "__main__":
    main()
