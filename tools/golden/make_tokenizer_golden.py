#!/usr/bin/env python3
"""Produce the tokenizer golden data under tests/golden/tokenizer/.

Three outputs, each from its own subcommand (`all` runs the three in order):

  vocab   smollm2_vocab.json: the tokenizer.* metadata of the GGUF file
          (tokens, token types, merges, special ids, chat template), read with
          the `gguf` pip package. The C++ tests build their Tokenizer from it,
          so they need neither Python nor the (uncommitted) model file.
  chat    chat_template_golden.json: the SmolLM2 chat template rendered with
          jinja2 for a few conversations (expected ChatTemplate::Apply output).
  tokens  llama_cpp_tokens.json: token ids produced by llama.cpp (through
          llama-cpp-python, vocab_only=True, add_bos=False) for ~60 varied
          texts, with and without special-token parsing, for the model's own
          pre-tokenizer ("smollm") and for the same vocabulary with
          tokenizer.ggml.pre overridden to "gpt-2" and "llama-bpe" (temporary
          metadata-only GGUF copies); plus per-token detokenized pieces.

Usage (from the repository root):
  python3 tools/golden/make_tokenizer_golden.py all \
      --model models/SmolLM2-135M-Instruct.Q4_1.gguf --out tests/golden/tokenizer

The output is deterministic (sorted, fixed texts, no timestamps).
"""

import argparse
import base64
import json
import os
import sys


def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=None, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {path} ({os.path.getsize(path)} bytes)")


# ----------------------------------------------------------------------------- vocab
def make_vocab(model, out):
    from gguf import GGUFReader

    r = GGUFReader(model)

    def get(key, default=None):
        f = r.fields.get(key)
        return default if f is None else f.contents()

    vocab = {
        "model": get("tokenizer.ggml.model"),
        "pre": get("tokenizer.ggml.pre", ""),
        "tokens": get("tokenizer.ggml.tokens"),
        "token_types": [int(t) for t in get("tokenizer.ggml.token_type")],
        "merges": get("tokenizer.ggml.merges"),
        "bos_id": int(get("tokenizer.ggml.bos_token_id", -1)),
        "eos_id": int(get("tokenizer.ggml.eos_token_id", -1)),
        "unk_id": int(get("tokenizer.ggml.unknown_token_id", -1)),
        "pad_id": int(get("tokenizer.ggml.padding_token_id", -1)),
        "add_bos": bool(get("tokenizer.ggml.add_bos_token", False)),
        "add_eos": bool(get("tokenizer.ggml.add_eos_token", False)),
        "chat_template": get("tokenizer.chat_template", ""),
    }
    write_json(os.path.join(out, "smollm2_vocab.json"), vocab)


# ----------------------------------------------------------------------------- chat
CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}],
    [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3+3?\nExplain."},
    ],
    [
        {"role": "system", "content": ""},
        {"role": "user", "content": "日本語で答えて 🙂"},
        {"role": "assistant", "content": "はい。"},
    ],
    [],
]


def make_chat(model, out):
    import jinja2
    import jinja2.sandbox

    with open(os.path.join(out, "smollm2_vocab.json"), encoding="utf-8") as f:
        template_text = json.load(f)["chat_template"]
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    template = env.from_string(template_text)
    cases = []
    for messages in CONVERSATIONS:
        for agp in (False, True):
            rendered = template.render(messages=messages, add_generation_prompt=agp)
            cases.append({"messages": messages, "add_generation_prompt": agp, "expected": rendered})
    write_json(os.path.join(out, "chat_template_golden.json"),
               {"jinja2_version": jinja2.__version__, "template": template_text, "cases": cases})


# ----------------------------------------------------------------------------- tokens
def long_text():
    words = ("the quick brown fox jumps over the lazy dog while 42 engineers debug "
             "tokenizers, caches and schedulers; isn't it fun? ").split(" ")
    parts, i = [], 0
    while sum(len(p) + 1 for p in parts) < 5000:
        parts.append(words[i % len(words)] + (str(i) if i % 17 == 0 else ""))
        if i % 23 == 0:
            parts.append("\n\n")
        i += 1
    return " ".join(parts)


TEXTS = [
    "",
    " ",
    "  ",
    "Hello",
    "Hello world",
    " Hello world",
    "Hello, world! How are you doing today?",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure it's fine, they're here, we've seen, you'll see, he'd go, don't",
    "IT'S LOUD, WE'RE HERE, I'M SURE",
    "'s 't 're 've 'm 'll 'd ''s 'x",
    "1234567",
    "3.14159",
    "The year 2024 had 365 days and 8760 hours.",
    " 1 22 333 4444",
    "$1,000,000.00 and -5e-10",
    "0x1F 0b1010 1e9",
    "def add(a, b):\n    return a + b\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += v[i];\n}",
    "#include <stdio.h>\nint main() { printf(\"hi\\n\"); }",
    "    indented\n        more\n",
    "x = [1, 2, 3]  # comment\n\n\ny = {'a': 1}",
    "line1\nline2\r\nline3\rline4",
    "tabs\tand\t\ttabs\t",
    "trailing spaces   ",
    "   leading spaces",
    "multiple     internal     spaces",
    "\n\n\n",
    "\t\n \t\n",
    "emoji: 😀 👍🏽 👨‍👩‍👧‍👦 🇫🇷",
    "🤗🤗🤗",
    "中文测试：你好，世界！",
    "日本語のテキストです。カタカナも。",
    "한국어 문장입니다.",
    "مرحبا بالعالم",
    "Привет, мир! Ёжик.",
    "Ελληνικά κείμενα",
    "café naïve résumé façade jalapeño Ångström",
    "Zürich Straße Œuvre",
    "math: ∑ x² ≤ ∞, α+β=γ, ½ ¾ ⅓",
    "Ⅻ ① ٣ ४ 五",
    "non\u00a0breaking\u2009thin\u3000ideographic",
    "zero\u200bwidth\u200djoiner",
    "a\u180eb a\u0085b a\u2028b",
    "ctrl \x04\x06\x13 chars \x1d end",
    "planes \U00050000 \U000E0001 \U0010FFFD",
    "<|im_start|>user\nhi<|im_end|>",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nWhat's 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more text",
    "<|im_start|><|im_end|><|endoftext|>",
    "a<|im_start|b <|im_end| c|im_end|>",
    "<repo_name>tandem<file_sep>src/main.cc<filename>x",
    "<jupyter_code>print(1)<jupyter_output>1<empty_output>",
    "https://example.com/path?query=1&b=two#frag",
    "user@example.com, +1 (555) 123-4567",
    "!!!???...,,,;;;:::",
    "a\u0301 e\u0300 combining",
    "CamelCaseIdentifier snake_case_identifier kebab-case-id",
    "<html><body class=\"main\">Hi &amp; bye</body></html>",
    "{\"key\": [1, 2.5, null, true], \"nested\": {\"k\": \"v\"}}",
    "SELECT * FROM users WHERE id = 42;",
    "A" * 100,
    "ab" * 50 + " " + "12" * 30,
    long_text(),
]

# Raw byte strings (invalid UTF-8), stored as hex in the JSON.
BYTE_TEXTS = [
    b"bad \xff byte",
    b"truncated \xe2\x82",
    b"\xe2\x82 lead",
    b"stray \x80\x80 continuation",
    b"ok \xf0\x9f\x98\x80 then \xf0\x9f",
]


def write_pre_variant(model, pre, path):
    """Copies the GGUF metadata (no tensors) with tokenizer.ggml.pre replaced by `pre`."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    r = GGUFReader(model)
    w = GGUFWriter(path, arch=r.fields["general.architecture"].contents())
    for key, field in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value = pre if key == "tokenizer.ggml.pre" else field.contents()
        if field.types[0] == GGUFValueType.ARRAY:
            w.add_key_value(key, value, field.types[0], sub_type=field.types[-1])
        else:
            w.add_key_value(key, value, field.types[0])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# Pre-tokenizers checked besides the model's own ("smollm"): the same vocabulary loaded by
# llama.cpp with tokenizer.ggml.pre overridden, to pin down tandem's other regex lists.
PRE_VARIANTS = ["gpt-2", "llama-bpe"]


def make_tokens(model, out):
    import tempfile

    import llama_cpp

    def tokenize_all(llm, pre, cases):
        for raw, text_field in [(t.encode("utf-8"), {"text": t}) for t in TEXTS] + \
                               [(b, {"hex": b.hex()}) for b in BYTE_TEXTS]:
            for special in (True, False):
                case = dict(text_field)
                case["pre"] = pre
                case["parse_special"] = special
                case["ids"] = llm.tokenize(raw, add_bos=False, special=special)
                cases.append(case)

    cases = []
    llm = llama_cpp.Llama(model_path=model, vocab_only=True, verbose=False)
    tokenize_all(llm, "smollm", cases)
    with tempfile.TemporaryDirectory() as tmp:
        for pre in PRE_VARIANTS:
            path = os.path.join(tmp, f"vocab-{pre}.gguf")
            write_pre_variant(model, pre, path)
            tokenize_all(llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False), pre, cases)

    # Per-token pieces (raw bytes, base64) for every token id that occurs, plus the control
    # tokens; llama.cpp renders control tokens only with special=True.
    ids_seen = sorted({i for c in cases for i in c["ids"]} | set(range(17)))
    pieces = {}
    for i in ids_seen:
        pieces[str(i)] = base64.b64encode(llm.detokenize([i], special=True)).decode("ascii")
    # A few whole-sequence decodes, to check Decode == concatenation.
    decodes = []
    for c in cases[::7]:
        decodes.append({"ids": c["ids"],
                        "b64": base64.b64encode(llm.detokenize(c["ids"], special=True)).decode("ascii")})
    write_json(os.path.join(out, "llama_cpp_tokens.json"), {
        "llama_cpp_python_version": llama_cpp.__version__,
        "model": os.path.basename(model),
        "cases": cases,
        "pieces_b64": pieces,
        "decodes": decodes,
    })


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["vocab", "chat", "tokens", "all"])
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--out", default="tests/golden/tokenizer")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.what in ("vocab", "all"):
        make_vocab(args.model, args.out)
    if args.what in ("chat", "all"):
        make_chat(args.model, args.out)
    if args.what in ("tokens", "all"):
        make_tokens(args.model, args.out)


if __name__ == "__main__":
    sys.exit(main())
