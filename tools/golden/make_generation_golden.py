#!/usr/bin/env python3
"""Produce golden (reference) greedy-generation data from llama.cpp.

Uses llama-cpp-python (which vendors llama.cpp) to run the GGUF model and
records, for a fixed set of plain-completion and chat prompts:

  * the prompt tokens (as llama.cpp's tokenizer produces them),
  * the greedy output tokens (up to MAX_NEW_TOKENS, stopping after an
    end-of-generation token), computed token by token with the low-level API,
  * the top-1 minus top-2 logit margin at every generation step,
  * the full first-step logits (last prompt position) as raw float32.

Usage:
  pip install llama-cpp-python==<version>
  python3 tools/golden/make_generation_golden.py \
      --model models/SmolLM2-135M-Instruct.Q4_1.gguf --out tests/golden/smollm2

The output is deterministic: running the script twice yields byte-identical
files (checked with --check-determinism, which runs every case twice in a fresh
context and compares).
"""

import argparse
import ctypes
import hashlib
import json
import os
import platform
import re
import sys

import numpy as np

import jinja2
import jinja2.sandbox
import llama_cpp

MAX_NEW_TOKENS = 64
SEED = 1234
LLAMA_OPTIONS = dict(
    n_ctx=4096,
    n_batch=512,
    n_ubatch=512,
    n_threads=2,
    n_threads_batch=2,
    logits_all=False,
    seed=SEED,
    verbose=False,
    flash_attn=False,  # llama-cpp-python's default
    # KV cache types (type_k / type_v) left at their defaults (f16).
)

# --------------------------------------------------------------------------
# Fixed text used to build the long prompts.  Do not edit: the golden data
# depends on it byte for byte.
# --------------------------------------------------------------------------
PARAGRAPHS = [
    (
        "A transformer language model processes text as a sequence of tokens. "
        "Each token is first mapped to a dense vector by an embedding table, and "
        "the resulting sequence of vectors passes through a stack of identical "
        "blocks. Every block contains a self-attention layer, which lets each "
        "position gather information from earlier positions, and a feed-forward "
        "layer, which transforms each position independently. Residual "
        "connections add the input of each sub-layer to its output, and a "
        "normalization step keeps the scale of the activations under control. "
        "After the last block, a final normalization is applied and the vectors "
        "are projected back onto the vocabulary to produce one score, or logit, "
        "for every possible next token."
    ),
    (
        "Inference engines spend most of their time in two phases. During "
        "prefill, the whole prompt is processed at once: the matrix "
        "multiplications are large and the processor is usually limited by "
        "arithmetic throughput. During decode, the model produces one token at "
        "a time, and each step must read every weight of the network from "
        "memory while doing comparatively little arithmetic per byte. For that "
        "reason decode speed is usually bounded by memory bandwidth, and "
        "quantizing the weights to four or eight bits makes generation faster "
        "even though it adds a few instructions to unpack the values. Batching "
        "several independent requests together amortizes the cost of reading "
        "the weights across many sequences."
    ),
    (
        "The key-value cache stores, for every layer and every past position, "
        "the key and value vectors computed by the attention layer. Without the "
        "cache, generating each new token would require recomputing the keys "
        "and values of the entire prefix, so the total cost would grow "
        "quadratically with the length of the output. With grouped-query "
        "attention, several query heads share a single key-value head, which "
        "shrinks the cache by the same factor and reduces the memory traffic "
        "of long contexts. Rotary position embeddings rotate pairs of "
        "dimensions of the queries and keys by an angle that depends on the "
        "position, so that the dot product between a query and a key depends "
        "only on their relative distance."
    ),
    (
        "Quantization formats such as Q4_1 split each row of a weight matrix "
        "into blocks of thirty-two values. Every block stores a scale and a "
        "minimum in half precision, followed by sixteen bytes that hold the "
        "thirty-two four-bit codes. To reconstruct a weight, the code is "
        "multiplied by the scale and the minimum is added. A dot product "
        "between a quantized row and an activation vector can be computed "
        "block by block: the activations are often quantized to eight bits on "
        "the fly, integer multiply-accumulate instructions compute the partial "
        "sums, and the scales are applied once per block. Careful kernels keep "
        "the data in registers and process several rows at the same time."
    ),
    (
        "Testing a numerical engine against a reference implementation "
        "requires some care. Two correct programs may add the same numbers in "
        "a different order and therefore obtain slightly different results, "
        "because floating-point addition is not associative. When the model "
        "chooses the next token greedily, a tiny difference matters only if "
        "the two best candidates have almost the same score. A robust test "
        "therefore records the gap between the best and the second-best logit "
        "at each step, and treats a disagreement at a step with a very small "
        "gap as a near-tie rather than as a bug. Comparing the full vector of "
        "logits at the first step, with a tolerance, catches most real errors."
    ),
    (
        "Scheduling matters as much as kernels. A server that receives many "
        "requests must decide which sequences to run in each forward pass, how "
        "to split long prompts into chunks so that they do not stall the "
        "generation of other users, and when to evict finished sequences from "
        "the cache. Paged allocation of the key-value cache avoids "
        "fragmentation by storing each sequence in fixed-size pages that need "
        "not be contiguous. Continuous batching admits new requests as soon as "
        "space is available instead of waiting for a whole batch to finish, "
        "which keeps the hardware busy and reduces the average latency seen by "
        "clients."
    ),
    (
        "Tokenizers based on byte-pair encoding start from individual bytes and "
        "repeatedly merge the most frequent adjacent pair into a new symbol. "
        "Before the merges are applied, a pre-tokenizer splits the text with a "
        "regular expression into words, numbers, punctuation and whitespace, "
        "so that merges never cross those boundaries. Special tokens such as "
        "the markers that delimit chat messages are matched first and are "
        "never split. Because every byte has its own token, any string can be "
        "encoded, and decoding simply concatenates the byte sequences of the "
        "tokens, which may temporarily produce incomplete UTF-8 characters in "
        "the middle of a stream."
    ),
    (
        "Measuring performance honestly means fixing as many variables as "
        "possible. The same prompt, the same number of threads, the same "
        "context size and the same model file should be used for every engine "
        "being compared. Each measurement should be repeated several times and "
        "summarized with the median, which is less sensitive to outliers than "
        "the mean. The first run is often slower because pages of the model "
        "file are still being loaded from disk, so a warm-up run is useful. "
        "Finally, it is good practice to report the peak memory used by the "
        "process, since a faster engine that needs twice the memory may not be "
        "the better choice."
    ),
]


def long_text(order, sep="\n\n", numbered=False):
    parts = []
    for n, idx in enumerate(order):
        p = PARAGRAPHS[idx]
        if numbered:
            p = "Section %d. %s" % (n + 1, p)
        parts.append(p)
    return sep.join(parts)


# ~1,000-token and ~1,500-token texts (paragraphs are ~125 tokens each).
LONG_A = long_text([0, 1, 2, 3, 4, 5, 6, 7])
LONG_B = long_text([7, 5, 3, 1, 6, 4, 2, 0], numbered=True)
LONG_C = long_text([0, 1, 2, 3, 4, 5, 6, 7, 3, 2, 1], numbered=True)
LONG_D = long_text([2, 4, 6, 1, 3, 5, 7, 0])


PLAIN_CASES = [
    ("plain_story", "Once upon a time, in a small village at the edge of a great forest,"),
    ("plain_code_fib", "def fibonacci(n):"),
    ("plain_list", "Here is a list of the five largest planets in the solar system:\n1."),
    ("plain_question", "Q: What is the boiling point of water at sea level?\nA:"),
    # The model answers this one with <|endoftext|> right away: an edge case
    # where the only output token is an end-of-generation token.
    ("plain_question_eog", "Question: What is the capital of France?\nAnswer:"),
    ("plain_math", "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,"),
    ("plain_arith", "12 + 7 = 19\n45 - 13 = 32\n6 * 8 = 48\n81 / 9 ="),
    ("plain_french", "La tour Eiffel est un monument situé à Paris. Elle a été construite"),
    ("plain_chinese_german", "机器学习是人工智能的一个分支。 Auf Deutsch: Maschinelles Lernen ist"),
    ("plain_json", '{"name": "Alice", "age": 30, "languages": ["English", "French"], "address": {'),
    ("plain_c_code",
     "#include <stdio.h>\n\nint main(void) {\n    int sum = 0;\n    for (int i = 0; i < 10; i++) {\n"),
    ("plain_long_1k",
     LONG_A + "\n\nIn summary, the most important idea in the text above is that"),
    ("plain_long_1k_b",
     LONG_B + "\n\nQuestion: Which section explains why decode speed is limited by memory bandwidth?\nAnswer:"),
    ("plain_long_1500",
     LONG_C + "\n\nThe following paragraph summarizes all eleven sections in plain words:\n"),
]

SYS_CONCISE = "You are a concise assistant. Answer in one or two sentences."

CHAT_CASES = [
    ("chat_hello", [{"role": "user", "content": "Hello! How are you today?"}]),
    ("chat_capital", [{"role": "user", "content": "What is the capital of Japan?"}]),
    ("chat_sys_concise", [
        {"role": "system", "content": SYS_CONCISE},
        {"role": "user", "content": "Why is the sky blue?"},
    ]),
    ("chat_sys_pirate", [
        {"role": "system", "content": "You are a pirate. Always talk like a pirate."},
        {"role": "user", "content": "Tell me about your ship."},
    ]),
    ("chat_code", [
        {"role": "user", "content": "Write a Python function that checks whether a number is prime."},
    ]),
    ("chat_math", [
        {"role": "user", "content": "What is 15 multiplied by 4? Explain briefly."},
    ]),
    ("chat_list", [
        {"role": "system", "content": "You are a helpful assistant that answers with bullet lists."},
        {"role": "user", "content": "Give me three tips for sleeping better."},
    ]),
    ("chat_multiturn", [
        {"role": "user", "content": "My name is Sam and I like astronomy."},
        {"role": "assistant", "content": "Nice to meet you, Sam! Astronomy is a fascinating hobby. What do you enjoy observing the most?"},
        {"role": "user", "content": "Mostly the planets. Which planet is easiest to see?"},
    ]),
    ("chat_multiturn_sys", [
        {"role": "system", "content": SYS_CONCISE},
        {"role": "user", "content": "Translate 'good morning' into Spanish."},
        {"role": "assistant", "content": "Buenos días."},
        {"role": "user", "content": "And into German?"},
    ]),
    ("chat_multiturn_3", [
        {"role": "user", "content": "Let's count. I say 1."},
        {"role": "assistant", "content": "2"},
        {"role": "user", "content": "3"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "5"},
    ]),
    ("chat_french", [
        {"role": "user", "content": "Peux-tu m'expliquer ce qu'est la photosynthèse ?"},
    ]),
    ("chat_long_1k", [
        {"role": "system", "content": "You are an expert in machine learning systems. Answer using the document provided by the user."},
        {"role": "user", "content": "Here is a document:\n\n" + LONG_D
         + "\n\nBased on the document, what is the purpose of the key-value cache?"},
    ]),
]

EOG_CANDIDATES = (0, 2)


def llama_version():
    try:
        v = llama_cpp.llama_version()
        return v.decode() if isinstance(v, bytes) else str(v)
    except Exception:  # not exposed by every llama-cpp-python version
        return None


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def render_chat(template, messages):
    # Same environment settings as HF transformers / llama-cpp-python.
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        loader=jinja2.BaseLoader(), trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template).render(
        messages=messages, add_generation_prompt=True,
        bos_token="<|im_start|>", eos_token="<|im_end|>")


def last_logits(llm):
    ptr = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
    n_vocab = llm.n_vocab()
    arr = np.ctypeslib.as_array(ptr, shape=(n_vocab,))
    return np.array(arr, dtype=np.float32, copy=True)


def top2_margin(logits):
    top = np.partition(logits, -2)[-2:]
    return float(top[1] - top[0])


def greedy(llm, prompt_tokens, eog_ids, max_new=MAX_NEW_TOKENS):
    llm.reset()
    llm.eval(prompt_tokens)
    logits = last_logits(llm)
    first = logits.copy()
    out, margins = [], []
    stop = "length"
    for _ in range(max_new):
        tok = int(np.argmax(logits))  # lowest index on ties
        out.append(tok)
        margins.append(round(top2_margin(logits), 4))
        if tok in eog_ids:
            stop = "eog"
            break
        if len(out) == max_new:
            break
        llm.eval([tok])
        logits = last_logits(llm)
    return first, out, margins, stop


def vocab_eog_ids(llm):
    ids = set()
    model = llm._model.model
    vocab = None
    if hasattr(llama_cpp, "llama_model_get_vocab"):
        vocab = llama_cpp.llama_model_get_vocab(model)
    for t in range(llm.n_vocab()):
        if vocab is not None and hasattr(llama_cpp, "llama_vocab_is_eog"):
            e = llama_cpp.llama_vocab_is_eog(vocab, t)
        else:
            e = llama_cpp.llama_token_is_eog(model, t)
        if e:
            ids.add(t)
    return ids


def detok(llm, toks, special):
    try:
        b = llm.detokenize(toks, special=special)
    except TypeError:
        b = llm.detokenize(toks)
    return b.decode("utf-8", errors="replace")


def high_level_tokens(llm, prompt_tokens, eog_ids, max_new):
    """Greedy generation through llama-cpp-python's high-level generator."""
    out = []
    for tok in llm.generate(prompt_tokens, top_k=1, top_p=1.0, min_p=0.0,
                            temp=0.0, repeat_penalty=1.0, reset=True):
        out.append(int(tok))
        if tok in eog_ids or len(out) >= max_new:
            break
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--out", default="tests/golden/smollm2")
    ap.add_argument("--check-determinism", action="store_true",
                    help="run every case a second time and assert identical results")
    args = ap.parse_args()

    llm = llama_cpp.Llama(model_path=args.model, **LLAMA_OPTIONS)
    assert llm.n_vocab() == 49152, llm.n_vocab()

    template = llm.metadata["tokenizer.chat_template"]
    eog = vocab_eog_ids(llm)
    eos = llm.token_eos()
    assert eos == 2, eos
    # The golden data stops on the model's end-of-generation tokens.  We
    # expect llama.cpp to report exactly {0 (<|endoftext|>), 2 (<|im_end|>)}.
    eog_ids = set(EOG_CANDIDATES) | eog
    print("EOG tokens (llama.cpp vocab):", sorted(eog), "eos:", eos, file=sys.stderr)

    logits_dir = os.path.join(args.out, "logits")
    os.makedirs(logits_dir, exist_ok=True)

    cases_in = [(n, "plain", p, None) for n, p in PLAIN_CASES]
    for n, msgs in CHAT_CASES:
        cases_in.append((n, "chat", render_chat(template, msgs), msgs))

    names = [c[0] for c in cases_in]
    assert len(names) == len(set(names))

    cases = []
    for name, kind, text, msgs in cases_in:
        special = kind == "chat"
        ptoks = [int(t) for t in llm.tokenize(text.encode("utf-8"), add_bos=False, special=special)]
        first, out, margins, stop = greedy(llm, ptoks, eog_ids)
        if args.check_determinism:
            first2, out2, margins2, stop2 = greedy(llm, ptoks, eog_ids)
            assert np.array_equal(first.view(np.uint32), first2.view(np.uint32)), name
            assert out == out2 and margins == margins2, name
        text_toks = [t for t in out if t not in eog_ids]
        rel = "logits/%s.f32" % name
        first.astype("<f4").tofile(os.path.join(args.out, rel))
        case = {
            "name": name,
            "kind": kind,
            "prompt": text,
        }
        if msgs is not None:
            case["messages"] = msgs
        case.update({
            "n_prompt_tokens": len(ptoks),
            "prompt_tokens": ptoks,
            "output_tokens": out,
            "stop_reason": stop,
            "margins": margins,
            "min_margin": min(margins),
            "output_text": detok(llm, text_toks, special=False),
            "logits_file": rel,
            "first_step_argmax": int(np.argmax(first)),
        })
        cases.append(case)
        print("%-22s %-5s prompt=%5d out=%3d stop=%-6s min_margin=%.4f  %r" % (
            name, kind, len(ptoks), len(out), stop, min(margins),
            case["output_text"][:60]), file=sys.stderr)

    # Cross-check with the high-level llama-cpp-python path for two cases.
    hl_checked = []
    for name in ("plain_code_fib", "chat_capital"):
        c = next(c for c in cases if c["name"] == name)
        hl = high_level_tokens(llm, c["prompt_tokens"], eog_ids, MAX_NEW_TOKENS)
        assert hl == c["output_tokens"], (name, hl, c["output_tokens"])
        # And create_completion (greedy, temperature 0): same text.
        n_text = len([t for t in c["output_tokens"] if t not in eog_ids])
        llm.reset()
        r = llm.create_completion(c["prompt_tokens"], max_tokens=n_text, temperature=0.0,
                                  top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0,
                                  seed=SEED)
        ctext = r["choices"][0]["text"]
        assert ctext == c["output_text"], (name, ctext, c["output_text"])
        hl_checked.append(name)

    sysinfo = llama_cpp.llama_print_system_info()
    if isinstance(sysinfo, bytes):
        sysinfo = sysinfo.decode("utf-8", "replace")
    opts = dict(LLAMA_OPTIONS)
    opts.update({"type_k": "f16 (default)", "type_v": "f16 (default)"})
    doc = {
        "generator": {
            "script": "tools/golden/make_generation_golden.py",
            "llama_cpp_python_version": llama_cpp.__version__,
            "llama_cpp_system_info": sysinfo.strip(),
            "libllama_version": llama_version(),
            "python": platform.python_version(),
            "numpy": np.__version__,
            "jinja2": jinja2.__version__,
            "machine": platform.machine(),
            "llama_options": opts,
            "decoding": {
                "method": "greedy, argmax over raw logits, lowest index on ties",
                "max_new_tokens": MAX_NEW_TOKENS,
                "stop": "after emitting an end-of-generation token (recorded in output_tokens)",
                "eog_token_ids": sorted(eog_ids),
                "llama_vocab_eog_ids": sorted(eog),
                "plain_tokenize": "llm.tokenize(text, add_bos=False, special=False)",
                "chat_tokenize": "llm.tokenize(rendered, add_bos=False, special=True)",
                "chat_render": "jinja2 ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True), "
                               "template from GGUF tokenizer.chat_template, add_generation_prompt=True",
                "margins": "top1 logit - top2 logit at each generation step, rounded to 4 decimals",
                "output_text": "detokenize(output_tokens without EOG tokens, special=False), "
                               "UTF-8 decoded with errors='replace'",
            },
            "high_level_crosscheck": hl_checked,
        },
        "model": {
            "file": os.path.basename(args.model),
            "sha256": sha256_file(args.model),
            "n_vocab": llm.n_vocab(),
            "chat_template": template,
        },
        "logits_format": "raw little-endian float32, n_vocab values, logits of the last prompt position",
        "cases": cases,
    }
    text = json.dumps(doc, indent=1, ensure_ascii=False)
    # Keep numeric lists (tokens, margins) on a single line.
    text = re.sub(r"\[\n\s*(-?[0-9][-0-9.eE+]*(?:,\n\s*-?[0-9][-0-9.eE+]*)*)\n\s*\]",
                  lambda m: "[" + re.sub(r",\n\s*", ", ", m.group(1)) + "]", text)
    assert json.loads(text) == json.loads(json.dumps(doc))
    with open(os.path.join(args.out, "cases.json"), "w", encoding="utf-8") as f:
        f.write(text + "\n")
    print("wrote %d cases to %s" % (len(cases), args.out), file=sys.stderr)


if __name__ == "__main__":
    main()
