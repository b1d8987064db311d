"""Workloads: a list of requests, each with an arrival time (seconds from the start), a prompt,
the number of tokens to generate and, for traces, the hash ids the prompt was built from."""
import json
import math
import random
from dataclasses import dataclass, field

from . import prompts


class WorkloadError(ValueError):
    """Bad workload input (missing file, malformed line, impossible parameters)."""


@dataclass
class Request:
    index: int
    arrival_s: float          # when to send, seconds from the start (ignored in closed loop)
    prompt: str
    input_tokens: int         # target prompt length (the server's count is in the record)
    output_tokens: int        # tokens asked for (max_tokens)
    hash_ids: list = field(default_factory=list)
    phase: int = None         # index of the phase of a --phases workload (None otherwise)


def load_trace(path, start=0, max_requests=None, length_scale=1.0, output_scale=None,
               time_scale=1.0, block_tokens=512, max_input_tokens=None, salt=0):
    """Requests of a Mooncake trace (JSON lines with timestamp ms, input_length, output_length,
    hash_ids). Lines [start, start + max_requests) are taken; arrivals are rebased so that the
    first one is at 0 and multiplied by time_scale (2 = twice as slow); lengths are multiplied by
    length_scale (outputs by output_scale if given), each at least 1 token. Prompts are built
    with prompts.trace_prompt under `salt` (0: the unsalted text; another salt: the same
    prefix-sharing structure in text that shares nothing with other salts)."""
    if length_scale <= 0 or time_scale < 0 or (output_scale is not None and output_scale <= 0):
        raise WorkloadError("length and output scales must be > 0 and the time scale >= 0")
    if start < 0 or (max_requests is not None and max_requests <= 0):
        raise WorkloadError("--trace-start must be >= 0 and --max-requests > 0")
    if salt < 0:
        raise WorkloadError("--prompt-salt must be >= 0")
    out_scale = length_scale if output_scale is None else output_scale
    scaled_block = prompts.trace_block_tokens(length_scale, block_tokens)
    rows = []
    try:
        f = open(path, "r", encoding="utf-8")
    except OSError as e:
        raise WorkloadError(f"cannot read trace {path}: {e.strerror}") from None
    with f:
        for lineno, line in enumerate(f, 1):
            if lineno <= start:
                continue
            if max_requests is not None and len(rows) >= max_requests:
                break
            line = line.strip()
            if not line:
                continue
            try:
                d = json.loads(line)
                ts = float(d["timestamp"])
                n_in = int(d["input_length"])
                n_out = int(d["output_length"])
                ids = [int(h) for h in d.get("hash_ids", [])]
            except (ValueError, KeyError, TypeError) as e:
                raise WorkloadError(f"{path}:{lineno}: not a trace record ({e})") from None
            if n_in < 0 or n_out < 0 or ts < 0:
                raise WorkloadError(f"{path}:{lineno}: negative timestamp or length")
            rows.append((ts, n_in, n_out, ids))
    if not rows:
        raise WorkloadError(f"{path}: no requests in the slice (start {start})")
    t0 = min(r[0] for r in rows)
    reqs = []
    for i, (ts, n_in, n_out, ids) in enumerate(rows):
        target_in = max(1, int(round(n_in * length_scale)))
        if max_input_tokens is not None:
            target_in = min(target_in, max_input_tokens)
        reqs.append(Request(
            index=i, arrival_s=(ts - t0) / 1000.0 * time_scale,
            prompt=prompts.trace_prompt(ids, target_in, scaled_block, salt),
            input_tokens=target_in, output_tokens=max(1, int(round(n_out * out_scale))),
            hash_ids=ids))
    reqs.sort(key=lambda r: (r.arrival_s, r.index))
    return reqs


def _length(rng, mean, range_ratio):
    """A length uniform in [mean * (1 - r), mean * (1 + r)], at least 1."""
    if range_ratio <= 0:
        return max(1, int(mean))
    lo = max(1, int(math.floor(mean * (1 - range_ratio))))
    hi = max(lo, int(math.ceil(mean * (1 + range_ratio))))
    return rng.randint(lo, hi)


def arrivals(n, rate, burstiness, rng):
    """n arrival times: all at 0 for an infinite rate, else gaps drawn from a gamma distribution
    with shape `burstiness` and mean 1/rate (shape 1 = Poisson; below 1 burstier)."""
    if n <= 0:
        return []
    if math.isinf(rate):
        return [0.0] * n
    if rate <= 0 or burstiness <= 0:
        raise WorkloadError("--request-rate and --burstiness must be > 0")
    t = 0.0
    out = [0.0]
    for _ in range(n - 1):
        t += rng.gammavariate(burstiness, 1.0 / (burstiness * rate))
        out.append(t)
    return out


def synthetic(num_requests, input_len, output_len, input_range=0.0, output_range=0.0,
              rate=math.inf, burstiness=1.0, shared_prefix_len=0, num_prefixes=1, seed=0,
              salt=0):
    """Synthetic requests: input/output lengths fixed (range 0) or uniform within +-range of the
    given length; arrivals Poisson / gamma at `rate`; with shared_prefix_len > 0 each prompt
    starts with one of `num_prefixes` shared prefixes (round robin) followed by input_len unique
    tokens. `salt` changes the prompt texts only (as in load_trace), not lengths or arrivals."""
    if num_requests <= 0 or input_len <= 0 or output_len <= 0:
        raise WorkloadError("--num-requests, --input-len and --output-len must be > 0")
    if not (0 <= input_range < 1 and 0 <= output_range < 1):
        raise WorkloadError("length ranges must be in [0, 1)")
    if shared_prefix_len < 0 or num_prefixes <= 0:
        raise WorkloadError("--shared-prefix-len must be >= 0 and --num-prefixes > 0")
    if salt < 0:
        raise WorkloadError("--prompt-salt must be >= 0")
    rng = random.Random(seed)
    times = arrivals(num_requests, rate, burstiness, rng)
    reqs = []
    for i in range(num_requests):
        n_in = _length(rng, input_len, input_range)
        n_out = _length(rng, output_len, output_range)
        text, ids = _synthetic_prompt(f"request-{seed}-{i}", i, n_in, shared_prefix_len,
                                      num_prefixes, seed, salt)
        reqs.append(Request(index=i, arrival_s=times[i], prompt=text,
                            input_tokens=n_in + shared_prefix_len, output_tokens=n_out,
                            hash_ids=ids))
    return reqs


def _synthetic_prompt(key, i, n_in, shared_prefix_len, num_prefixes, seed, salt):
    """(prompt, hash ids) of synthetic request i: one of the shared prefixes (round robin), if
    any, then n_in tokens of its own text (`key` names that text)."""
    text, ids = "", []
    if shared_prefix_len > 0:
        g = i % num_prefixes
        text = prompts.block_text(f"prefix-{seed}-{g}", shared_prefix_len, salt)
        ids = [f"prefix-{g}"]
    return text + prompts.block_text(key, n_in, salt), ids


PHASE_KEYS = ("n", "in", "out", "rate")


def parse_phases(text):
    """The phases of `--phases "SPEC;SPEC;..."`: each SPEC is comma-separated key=value with
    n (requests, required), in and out (input and output tokens, required) and rate (requests/s,
    Poisson or gamma arrivals; "inf" = all at once; default inf). Returns a list of dicts
    {"n", "in", "out", "rate"}; raises WorkloadError naming the bad phase."""
    specs = [s.strip() for s in (text or "").split(";")]
    if not any(specs):
        raise WorkloadError("--phases is empty: give n=..,in=..,out=..[,rate=..] per phase")
    phases = []
    for k, spec in enumerate(specs):
        where = f"--phases phase {k + 1} ({spec!r})"
        if not spec:
            raise WorkloadError(f"{where}: empty phase (a stray ';'?)")
        d = {}
        for item in spec.split(","):
            key, eq, value = (x.strip() for x in item.partition("="))
            if not eq or not key:
                raise WorkloadError(f"{where}: {item.strip()!r} is not key=value")
            if key not in PHASE_KEYS:
                raise WorkloadError(f"{where}: unknown key {key!r} (keys: {', '.join(PHASE_KEYS)})")
            if key in d:
                raise WorkloadError(f"{where}: {key} given twice")
            try:
                d[key] = float(value) if key == "rate" else int(value)
            except ValueError:
                kind = "a number or inf" if key == "rate" else "an integer"
                raise WorkloadError(f"{where}: {key}={value!r} is not {kind}") from None
        missing = [key for key in ("n", "in", "out") if key not in d]
        if missing:
            raise WorkloadError(f"{where}: missing {', '.join(missing)}")
        if min(d["n"], d["in"], d["out"]) <= 0:
            raise WorkloadError(f"{where}: n, in and out must be > 0")
        d.setdefault("rate", math.inf)
        if not d["rate"] > 0:  # also rejects nan
            raise WorkloadError(f"{where}: rate must be > 0 (or inf)")
        phases.append({key: d[key] for key in PHASE_KEYS})
    return phases


def phased(phases, input_range=0.0, output_range=0.0, burstiness=1.0, shared_prefix_len=0,
           num_prefixes=1, seed=0, salt=0):
    """Synthetic requests in phases run back to back: phase k's requests (lengths as in
    `synthetic`, arrivals at its own rate) start one gap (at phase k's rate; none for inf) after
    phase k-1's last arrival. Every request carries its phase index; indices run on across
    phases."""
    if not (0 <= input_range < 1 and 0 <= output_range < 1):
        raise WorkloadError("length ranges must be in [0, 1)")
    if shared_prefix_len < 0 or num_prefixes <= 0:
        raise WorkloadError("--shared-prefix-len must be >= 0 and --num-prefixes > 0")
    if burstiness <= 0:
        raise WorkloadError("--burstiness must be > 0")
    if salt < 0:
        raise WorkloadError("--prompt-salt must be >= 0")
    rng = random.Random(seed)
    reqs, t_end = [], None
    for k, ph in enumerate(phases):
        # n + 1 arrivals, the first dropped: the gap from the last phase's last arrival.
        times = arrivals(ph["n"] + 1, ph["rate"], burstiness, rng)[1:]
        offset = 0.0 if t_end is None else t_end
        if t_end is None:  # the first phase starts at 0
            times = [t - times[0] for t in times]
        for j, t in enumerate(times):
            i = len(reqs)
            n_in = _length(rng, ph["in"], input_range)
            n_out = _length(rng, ph["out"], output_range)
            text, ids = _synthetic_prompt(f"request-{seed}-phase{k}-{j}", i, n_in,
                                          shared_prefix_len, num_prefixes, seed, salt)
            reqs.append(Request(index=i, arrival_s=offset + t, prompt=text,
                                input_tokens=n_in + shared_prefix_len, output_tokens=n_out,
                                hash_ids=ids, phase=k))
        t_end = reqs[-1].arrival_s
    return reqs


def retime(reqs, rate):
    """A copy of reqs with arrivals rescaled so that the mean rate is `rate` requests/s (order
    and relative gaps kept). Requests that all arrive at once (no gaps to keep) are spread
    evenly, 1/rate apart."""
    span = max(r.arrival_s for r in reqs) - min(r.arrival_s for r in reqs)
    t0 = min(r.arrival_s for r in reqs)
    ordered = sorted(reqs, key=lambda r: (r.arrival_s, r.index))
    out = []
    for i, r in enumerate(ordered):
        if math.isinf(rate):
            t = 0.0
        elif span <= 0:
            t = i / rate
        else:
            t = (r.arrival_s - t0) * (len(reqs) - 1) / rate / span
        out.append(Request(r.index, t, r.prompt, r.input_tokens, r.output_tokens, r.hash_ids,
                           r.phase))
    return out
