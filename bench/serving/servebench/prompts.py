"""Deterministic prompt text.

A block of text is a function of a key only (a trace hash id, or a synthetic prefix / request
key), so equal keys give equal text and, because every word is one space-led token in byte-level
BPE vocabularies, equal token blocks wherever the block sits in a prompt. Each word of the list
below is one token (with its leading space) for SmolLM2/GPT-2 style tokenizers and close to one
for other common ones, so N words is about N tokens.

A salt gives a disjoint family of texts for the same keys (so that a workload can be replayed
against a server without hitting what its prefix cache kept of an earlier replay): salt s
rotates every word index by s (mod the list length), so texts of two salts that differ modulo
len(WORDS) differ at every word, the first included; equal keys under one salt still give equal
text. Salts of len(WORDS) or more also change the key. Salt 0 is the unsalted text.
"""
import hashlib

WORDS = (
    "the of and to in is was for on that with as by at from his her it an are were which this be "
    "or has had not but one all their they have new first its after who been two more other also "
    "can when time into only years some would there most such made over many may these city part "
    "later used about year both under between where three during while then since life known same "
    "well each than through high found small large work world name house water state group number"
).split()


def _word_indices(key, n):
    """n pseudo-random indices into WORDS, a fixed function of (key, n-prefix): the first k of
    _word_indices(key, n) equal _word_indices(key, k)."""
    out = []
    counter = 0
    while len(out) < n:
        digest = hashlib.sha256(f"{key}/{counter}".encode()).digest()
        counter += 1
        for b in digest:
            if len(out) == n:
                break
            out.append(b % len(WORDS))
    return out


def block_text(key, n_words, salt=0):
    """About n_words tokens of text for `key` (and `salt`, see above); starts with a space, so
    blocks concatenate on token boundaries. A shorter block of the same key and salt is a prefix
    of a longer one."""
    if salt < 0:
        raise ValueError("the prompt salt must be >= 0")
    if n_words <= 0:
        return ""
    turn, rotation = divmod(salt, len(WORDS))
    if turn:
        key = f"{key}~{turn}"
    return "".join(" " + WORDS[(i + rotation) % len(WORDS)] for i in _word_indices(key, n_words))


def trace_block_tokens(length_scale, block_tokens=512):
    """Tokens per hash-id block after scaling (at least 1)."""
    return max(1, int(round(block_tokens * length_scale)))


def trace_prompt(hash_ids, input_tokens, block_tokens, salt=0):
    """Prompt of about `input_tokens` tokens from the trace's hash ids: each id but the last gives
    a full block of `block_tokens` words keyed by the id; the last block is filled up to the
    input length (it is a prefix of that id's full block). Ids beyond what the length needs are
    dropped; a length beyond the ids is filled with the last id's words. Every block is salted
    with `salt`: prompts of salts that differ modulo len(WORDS) differ at every word."""
    if not hash_ids:
        return block_text("empty", input_tokens, salt)
    parts = []
    remaining = max(1, input_tokens)
    for i, h in enumerate(hash_ids):
        if remaining <= 0:
            break
        last = i == len(hash_ids) - 1
        n = remaining if last else min(block_tokens, remaining)
        parts.append(block_text(f"block-{h}", n, salt))
        remaining -= n
    return "".join(parts)
