#!/usr/bin/env python3
"""Produce tests/golden/tokenizer/gemma3_tokens.json: llama.cpp's SentencePiece ("llama")
tokenization and detokenization of the Gemma 3 270M vocabulary, through llama-cpp-python
(vocab_only=True).

  cases     token ids of llama_tokenize for a varied corpus (the SmolLM2 golden texts and
            ill-formed byte strings of make_tokenizer_golden.py, Gemma's special and
            user-defined tokens, <0x..>-looking text, whitespace runs, code, scripts, long and
            ~100 KB inputs, and deterministic pseudo-random strings), each with add_bos
            (add_special) true/false and parse_special true/false.
  pieces    llama_token_to_piece (lstrip 0) with special true and false, for every id that
            occurs in the cases plus the ids around Gemma's special, user-defined and byte
            tokens and a stride through the vocabulary.
  decodes   llama_detokenize(remove_special=False, unparse_special=True/False) of every 5th
            case's ids.
  eog_ids / control_ids
            llama_vocab_is_eog, and the ids whose attributes have the CONTROL or UNKNOWN bit
            (llama_vocab_get_attr), over the whole vocabulary.

Usage (from the repository root):
  python3 tools/golden/make_gemma_tokenizer_golden.py \
      --model models/gemma-3-270m-q4_k_m.gguf --out tests/golden/tokenizer

The output is deterministic (fixed texts, a seeded generator, no timestamps).
"""

import argparse
import base64
import ctypes
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_tokenizer_golden import BYTE_TEXTS as SMOL_BYTE_TEXTS  # noqa: E402
from make_tokenizer_golden import TEXTS as SMOL_TEXTS  # noqa: E402
from make_tokenizer_golden import long_text, write_json  # noqa: E402

PYTHON_SNIPPET = '''import json, sys

class Cache:
    """LRU cache."""
    def __init__(self, capacity: int = 128) -> None:
        self._items: dict[str, bytes] = {}
        self.capacity = capacity

    def get(self, key):
        if key not in self._items:
            return None  # miss
        value = self._items.pop(key)
        self._items[key] = value
        return value

if __name__ == "__main__":
\tprint(json.dumps({"ok": True}, indent=2))
'''

CPP_SNIPPET = '''#include <vector>
template <typename T>
T Sum(const std::vector<T>& v) {
  T acc{};
  for (const T& x : v) acc += x;  // O(n)
  return acc;
}
int main() { return Sum<int>({1, 2, 3}) == 6 ? 0 : 1; }
'''

SHELL_SNIPPET = "for f in *.txt; do\n    echo \"$f\" | tr 'a-z' 'A-Z' >> out.log 2>&1\ndone\n"

MARKDOWN = ("# Title\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n* item\n  * nested\n\n```py\nx = 1\n```\n"
            "> quote -- em—dash … ellipsis “quotes” ‘single’\n")

GEMMA_TEXTS = [
    # Chat markup (control tokens) and Gemma's other specials.
    "<start_of_turn>user\nHello!<end_of_turn>\n<start_of_turn>model\n",
    "<bos><start_of_turn>user\nWrite a haiku.<end_of_turn>\n<start_of_turn>model\nSure:<end_of_turn>",
    "<start_of_turn>user\n<start_of_image><end_of_image>[multimodal]<end_of_turn>",
    "<eos><pad><unk><mask><bos>",
    "text</s>more </s> end",
    "<unused0><unused6241> <unused99>",
    "<unused62410> <unused> <unused-1>",
    "<start_of_turn <start_of_turn>> start_of_turn> <<end_of_turn>>",
    "<end_of_turn>\n\n<start_of_turn>",
    " <start_of_turn> spaced <end_of_turn> ",
    "<start_of_turn>",
    "<end_of_turn>",
    "<image_soft_token>",
    # User-defined tokens: HTML tags, newline/space/tab runs.
    "<table><caption>c</caption><thead><tr><th>h</th></tr></thead><tbody><tr><td>1</td></tr></tbody></table>",
    "<h1>Title</h1><div class=\"x\"><span>hi</span><ul><li>a</li></ul></div>",
    "<table", "</tr", "<tr><td></td></tr>",
    "a  b   c    d     e",
    " " * 31, " " * 32, " " * 45, " " * 100,
    "\t" * 31, "\t" * 40, "\n" * 31, "\n" * 33, "\n" * 70,
    "a\n\n\n\nb\n\n\n\n\n\nc",
    "\t\tcode\n\t\t\tmore code",
    " \n \n \t \n",
    "   leading three",
    "trailing three   ",
    " x ", "x ", " x", "  x  ",
    "\r\n\r\n\r\n",
    "\u2581literal lower one eighth block\u2581\u2581x",
    "\u2581", "\u2581\u2581\u2581", " \u2581 ",
    # Byte-fallback lookalikes.
    "<0x41><0xFF><0x0A>",
    "<0x>", "<0xZZ>", "<0x4>", "<0x41", "0x41>", "<<0x41>>",
    "<0x0A>\n<0x20> ",
    # Code.
    PYTHON_SNIPPET,
    CPP_SNIPPET,
    SHELL_SNIPPET,
    MARKDOWN,
    "SELECT name, COUNT(*) AS n FROM t GROUP BY name HAVING n > 1 ORDER BY n DESC;",
    "/^([a-z0-9_\\.-]+)@([\\da-z\\.-]+)\\.([a-z\\.]{2,6})$/",
    "{\"a\":[{\"b\":null},{\"c\":[1,2,3]}],\"d\":\"e\\u00e9\"}",
    # Scripts and emoji.
    "ภาษาไทยไม่มีช่องว่างระหว่างคำ",
    "हिन्दी भाषा में लिखा गया वाक्य।",
    "עברית נכתבת מימין לשמאל",
    "Tiếng Việt có dấu: Xin chào thế giới",
    "English 中文 日本語 한국어 Русский العربية mixed in one line",
    "漢字かなカナ交じり文、そして한글도。",
    "👩🏾‍💻👨‍👩‍👧 🏳️‍🌈 ❤️‍🔥 1️⃣ #️⃣ 🫠🫶",
    "𝕳𝖊𝖑𝖑𝖔 𝐁𝐨𝐥𝐝 𝟙𝟚𝟛",
    "\u0000nul\u0001soh\u007fdel",
    "x\u00ady\u200ez\ufeffw",
]

GEMMA_BYTE_TEXTS = [
    b"\xff",
    b"\xc3",
    b"\xe2\x96",
    b"\xe2\x96 x",
    b"a\xf8\x88\x80\x80\x80b",
    b"\xc0\x80 \xed\xa0\x80 \xf4\x90\x80\x80",
    b"\x00 nul \x00",
    b"x\x80 \x80\x80y",
    b"<start_of_turn>\xff<end_of_turn>",
    b"\xf0\x9f\x98",
]


def mixed_long_text():
    """About 3,300 characters mixing prose, code, scripts, whitespace and chat markup."""
    parts = [long_text()[:1500], PYTHON_SNIPPET, "中文段落，包含标点。" * 20, MARKDOWN,
             "<start_of_turn>user\n" + "Résumé naïve café. " * 30 + "<end_of_turn>\n",
             "\t \n  \n\n\n" * 10, CPP_SNIPPET, "😀🤗🇫🇷 " * 40]
    return "".join(parts)


def huge_text():
    """~100 KB from a seeded generator: words, numbers, punctuation, whitespace runs, CJK,
    emoji and chat markup, so every code path of the tokenizer is exercised at scale."""
    rng = random.Random(20260412)
    words = ("the of and to in is that for it as was with be by on not he this are or his "
             "from at which but have an they you were her she there one all we their tokenizer "
             "Gemma llama inference server cache batch token model attention").split()
    extras = ["中文", "日本語", "한국어", "😀", "🤗", "Ωμέγα", "ñandú", "\t", "\n", "\n\n", "   ",
              "<start_of_turn>", "<end_of_turn>", "<0x41>", "</s>", "<td>", "1234", "3.14", "—"]
    out, size = [], 0
    while size < 100_000:
        piece = rng.choice(words) if rng.random() < 0.8 else rng.choice(extras)
        sep = " " if rng.random() < 0.9 else rng.choice([",  ", ". ", "\n", "  ", ""])
        out.append(piece + sep)
        size += len((piece + sep).encode("utf-8"))
    return "".join(out)


def random_strings(n, seed):
    """Short random concatenations of fragments that stress the edges: specials and partial
    specials, whitespace, ▁, multi-byte characters and stray or truncated UTF-8 bytes."""
    rng = random.Random(seed)
    frags = [b"<start_of_turn>", b"<end_of_turn>", b"<start_of", b"_turn>", b"<eos>", b"<bos>",
             b"</s>", b"<td>", b"</td", b"<0x41>", b"<0x", b"[multimodal]", b" ", b"  ", b"   ",
             b"\t", b"\n", b"\n\n", b"\xe2\x96\x81", b"a", b"the", b"ing", b"Hello", b"42",
             b"\xe4\xb8\xad", b"\xf0\x9f\x98\x80", b"\xc3\xa9", b"\xff", b"\x80", b"\xe2\x96",
             b"\xf0\x9f", b"'s", b".", b"<", b">", b"_", b"-"]
    out = []
    for _ in range(n):
        out.append(b"".join(rng.choice(frags) for _ in range(rng.randint(1, 12))))
    return out


def text_field(raw):
    try:
        return {"text": raw.decode("utf-8")}
    except UnicodeDecodeError:
        return {"hex": raw.hex()}


def make(model, out):
    import llama_cpp

    llm = llama_cpp.Llama(model_path=model, vocab_only=True, verbose=False)
    vocab = llm._model.vocab
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)

    texts = [t.encode("utf-8") for t in SMOL_TEXTS + GEMMA_TEXTS + [mixed_long_text()]]
    texts += list(SMOL_BYTE_TEXTS) + GEMMA_BYTE_TEXTS
    cases = []
    for raw in texts:
        for add_bos in (False, True):
            for special in (True, False):
                case = text_field(raw)
                case.update(add_bos=add_bos, parse_special=special,
                            ids=llm.tokenize(raw, add_bos=add_bos, special=special))
                cases.append(case)
    # The 100 KB input: both special modes, BOS on (the raw-completion default).
    for special in (True, False):
        case = {"text": huge_text(), "add_bos": True, "parse_special": special}
        case["ids"] = llm.tokenize(case["text"].encode("utf-8"), add_bos=True, special=special)
        cases.append(case)
    for raw in random_strings(300, seed=7):
        for special in (True, False):
            case = text_field(raw)
            case.update(add_bos=False, parse_special=special,
                        ids=llm.tokenize(raw, add_bos=False, special=special))
            cases.append(case)

    buf = ctypes.create_string_buffer(1 << 20)

    def piece(i, special):
        n = llama_cpp.llama_token_to_piece(vocab, i, buf, len(buf), 0, special)
        assert n >= 0, (i, n)
        return base64.b64encode(buf.raw[:n]).decode("ascii")

    def detokenize(ids, unparse_special):
        arr = (llama_cpp.llama_token * len(ids))(*ids)
        n = llama_cpp.llama_detokenize(vocab, arr, len(ids), buf, len(buf), False, unparse_special)
        assert n >= 0, n
        return base64.b64encode(buf.raw[:n]).decode("ascii")

    ids = {i for c in cases for i in c["ids"]}
    ids |= set(range(0, 600)) | set(range(255960, 256010)) | set(range(n_vocab - 10, n_vocab))
    ids |= set(range(0, n_vocab, 997))
    pieces = {str(i): {"special": piece(i, True), "plain": piece(i, False)} for i in sorted(ids)}
    decodes = [{"ids": c["ids"], "special": detokenize(c["ids"], True),
                "plain": detokenize(c["ids"], False)} for c in cases[::5]]

    ctrl_bits = 1 | 8  # LLAMA_TOKEN_ATTR_UNKNOWN | LLAMA_TOKEN_ATTR_CONTROL
    eog_ids = [i for i in range(n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, i)]
    control_ids = [i for i in range(n_vocab) if llama_cpp.llama_vocab_get_attr(vocab, i) & ctrl_bits]

    write_json(os.path.join(out, "gemma3_tokens.json"), {
        "llama_cpp_python_version": llama_cpp.__version__,
        "model": os.path.basename(model),
        "n_vocab": n_vocab,
        "bos_id": llm.token_bos(),
        "eos_id": llm.token_eos(),
        "cases": cases,
        "pieces_b64": pieces,
        "decodes_b64": decodes,
        "eog_ids": eog_ids,
        "control_ids": control_ids,
    })


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="models/gemma-3-270m-q4_k_m.gguf")
    ap.add_argument("--out", default="tests/golden/tokenizer")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    make(args.model, args.out)


if __name__ == "__main__":
    sys.exit(main())
