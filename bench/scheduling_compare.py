#!/usr/bin/env python3
"""Scheduling of tandem serve on a Mooncake conversation-trace slice: prefill placement policies,
admission control under overload, and capacity of the default (disaggregated) mode against
colocated serving. Every configuration runs against a fresh `tandem serve`; the serving
benchmark (bench/serving/serve_bench.py) records each request, and the server's /metrics are
read before (after a warm-up) and after each run, so the counters cover the measured requests only.

Experiments (--experiment, default all):
  policies  --placement-policy random / load-balance / cache-aware / cache-load with 2 prefill and
            1 decode worker of one thread each and --admission none (every request served, so TTFT
            compares like with like), on a slice of whole conversations (later turns repeat the
            earlier turns' prefix; a contiguous slice of the trace shares only its first block).
            Lengths are scaled so that one 512-token trace block spans several KV blocks. Table:
            mean and p90 TTFT, SLO attainment, prefix-cache hit tokens, mean TTFT / load-balance's;
            and the cache-load TTFT / TBT prediction errors (median, p90 from the histograms).
  overload  --admission none / early / predictive with arrivals far above capacity and the SLOs
            given to the server: requests served and rejected, SLO attainment, and the prefill
            wasted on requests that missed their SLO, failed or were rejected.
  pool      (only when named, not part of "all") the cluster KV pool against per-worker prefix
            caches: the policies workload with small local caches (--pool-kv-tokens per
            worker), 2 prefill + 1 decode worker, under
            load-balance placement (a conversation's turns land on either prefill worker) and
            cache-load (turns follow their cache), each with --kv-pool off and on. Table: prefix
            hit ratio (hit / prompt tokens), tokens read from the pool, prompt tokens computed,
            TTFT mean / p50 / p90, and the ratios pool / local-only. Then, with load-balance, a
            DRAM pool too small for the workload (--pool-small-dram-mb per worker) without and
            with an SSD tier (--pool-ssd-gb per worker, in the output folder).
  capacity  a rate sweep (Poisson arrivals, fresh prompts per rate) of the default mode against
            --mode colocated on the same cores, at a tight and a loose TBT SLO with one TTFT SLO:
            the highest rate at which >= --target of the requests meet both SLOs, and the ratio
            default / colocated.

Each experiment prints a Markdown table and writes it, with JSON of every run and figure, under
--out/EXPERIMENT; --rounds N repeats every configuration N times (fresh servers, order rotated
each round) and reports medians.

    python3 bench/scheduling_compare.py --out bench/out/scheduling                 # all, 1 round
    python3 bench/scheduling_compare.py --experiment policies --rounds 3 --out bench/out/sched-policies
    python3 bench/scheduling_compare.py --experiment overload --out bench/out/sched-overload
    python3 bench/scheduling_compare.py --experiment capacity --capacity-modes colocated --quick
    python3 bench/scheduling_compare.py --quick --out bench/out/scheduling-quick   # smoke, minutes

Extra `tandem serve` flags go to every server with --serve-arg (e.g. --serve-arg=--max-num-seqs=16),
extra benchmark flags to every benchmark run with --bench-arg.
"""
import argparse
import collections
import json
import math
import os
import random
import re
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, ".."))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "serving"))

from compare_servers import free_port, make_logger, stop_server, wait_ready  # noqa: E402
from disagg_compare import fmt, loadavg  # noqa: E402
from servebench import prompts, workload  # noqa: E402

TRACE = os.path.join(ROOT, "..", "shared", "data", "mooncake-traces", "conversation_trace.jsonl")
MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
SERVE_BENCH = os.path.join(HERE, "serving", "serve_bench.py")
EXPERIMENTS = ("policies", "overload", "capacity")  # what --experiment all runs
OPT_IN_EXPERIMENTS = ("pool",)  # run only when named
POOL_CONFIGS = (("load-balance", "off"), ("load-balance", "on"), ("cache-load", "off"),
                ("cache-load", "on"), ("load-balance", "small"), ("load-balance", "small+ssd"))
# The pool settings of each POOL_CONFIGS entry: off, on (256 MiB of DRAM per worker), and a
# DRAM pool too small for the workload (--pool-small-dram-mb) without and with an SSD tier.
POOL_MODES = ("off", "on", "small", "small+ssd")
POLICIES = ("random", "load-balance", "cache-aware", "cache-load")
ADMISSIONS = ("none", "early", "predictive")
CAPACITY_MODES = ("default", "colocated")
PREFILL_OUTCOMES = ("slo_met", "slo_missed", "rejected", "failed")
TRACE_BLOCK_TOKENS = 512
# Pause before each /metrics read, for counters that workers report to the front door late.
SETTLE_S = 1.0

# Sizes of a full run and of a --quick smoke; any of them can be set on the command line.
# policies: 40 requests of 10 conversations (3 to 5 turns each, prompts up to 12,000 trace tokens)
# among the first 3,000 trace lines; at length scale 0.1 about 16,600 prompt tokens, two thirds of
# them a prefix of an earlier turn of the same conversation; their 15-minute span squeezed into
# 30 s. overload: the first 40 lines at length scale 0.02 in real time (~840 prompt tokens/s
# offered in bursts, six times the load at which disagg_compare found 2 cores' TTFT in seconds).
# capacity: the first 20 lines at length scale 0.02 (~290 prompt and ~39 output tokens each) with
# Poisson arrivals at each rate (the trace's own arrival times come in 3-second bursts, which
# would measure the bursts rather than the rate).
SIZES = {
    "full": {"policies_requests": 40, "policies_span_s": 30.0, "policies_max_turns": 5,
             "overload_requests": 40, "overload_time_scale": 1.0,
             "capacity_requests": 20, "capacity_rates": "0.5,1,2,4"},
    "quick": {"policies_requests": 9, "policies_span_s": 10.0, "policies_max_turns": 3,
              "overload_requests": 12, "overload_time_scale": 1.0,
              "capacity_requests": 6, "capacity_rates": "1,4"},
}


class RunError(RuntimeError):
    """One configuration could not be measured (server did not start, benchmark failed)."""


# ---------------------------------------------------------------------------------------------
# Prometheus text: samples, totals, histograms.

_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+-?\d+)?\s*$")
_LABEL = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')


def parse_metrics(text):
    """{(name, ((label, value), ...) sorted): value} of a Prometheus text exposition; comments,
    blank and malformed lines are skipped."""
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        name, label_text, value = m.groups()
        labels = []
        if label_text:
            pos = 0
            while pos < len(label_text):
                lm = _LABEL.match(label_text, pos)
                if not lm or lm.end() == pos:
                    break
                raw = lm.group(2)
                labels.append((lm.group(1), raw.replace('\\"', '"').replace("\\n", "\n")
                               .replace("\\\\", "\\")))
                pos = lm.end()
        try:
            out[(name, tuple(sorted(labels)))] = float(value)
        except ValueError:
            continue
    return out


def metrics_delta(after, before):
    """after - before for every sample of `after` (counters and histogram buckets of one server;
    a sample absent before counts from 0)."""
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


def total(samples, name, **labels):
    """Sum of the samples called `name` whose labels include `labels`; None if there is none."""
    vals = [v for (n, ls), v in samples.items()
            if n == name and all(dict(ls).get(k) == want for k, want in labels.items())]
    return sum(vals) if vals else None


def by_label(samples, name, label):
    """{value of `label`: summed samples} of metric `name`."""
    out = collections.defaultdict(float)
    for (n, ls), v in samples.items():
        d = dict(ls)
        if n == name and label in d:
            out[d[label]] += v
    return dict(out)


def histogram_buckets(samples, base):
    """{upper bound: cumulative count} of histogram `base` (its _bucket samples, summed over any
    labels other than le); empty if the histogram is absent."""
    out = collections.defaultdict(float)
    for (n, ls), v in samples.items():
        if n != base + "_bucket":
            continue
        le = dict(ls).get("le")
        try:
            out[float(le)] += v
        except (TypeError, ValueError):
            continue
    return dict(out)


def add_buckets(a, b):
    out = dict(a)
    for le, c in b.items():
        out[le] = out.get(le, 0.0) + c
    return out


def histogram_quantile(buckets, q):
    """The q-quantile (0 < q < 1) of a histogram given as {upper bound: cumulative count}, by
    linear interpolation inside the bucket holding the rank (Prometheus' histogram_quantile):
    the first bucket is taken to start at 0 (or at its bound if that is <= 0); a rank in the
    +Inf bucket gives the highest finite bound. None without observations."""
    if not 0 < q < 1:
        raise ValueError("quantile must be in (0, 1)")
    items = sorted(buckets.items())
    if not items:
        return None
    count = items[-1][1]
    if count <= 0:
        return None
    rank = q * count
    prev_le, prev_count = None, 0.0
    for le, c in items:
        if c >= rank:
            if math.isinf(le):
                return prev_le
            lower = prev_le if prev_le is not None else min(0.0, le)
            if c == prev_count:
                return le
            return lower + (le - lower) * (rank - prev_count) / (c - prev_count)
        prev_le, prev_count = le, c
    return prev_le


def histogram_mean(samples, base):
    s, c = total(samples, base + "_sum"), total(samples, base + "_count")
    return s / c if s is not None and c else None


# ---------------------------------------------------------------------------------------------
# Workloads.

def _record(path, lineno, line):
    """One trace line (0-based lineno) as a dict of its four fields."""
    try:
        d = json.loads(line)
        return {"timestamp": float(d["timestamp"]), "input_length": int(d["input_length"]),
                "output_length": int(d["output_length"]),
                "hash_ids": [int(h) for h in d.get("hash_ids", [])]}
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise RunError(f"{path}:{lineno + 1}: not a trace record ({e})") from None


def conversation_slice(path, start, window, n_requests, max_input, min_turns, max_turns):
    """Trace rows of whole conversations: among lines [start, start + window), requests are
    grouped by their second hash id (the first block after the shared system prompt, so one
    group = one conversation, whose turns repeat the earlier turns' prefix); requests longer
    than max_input trace tokens are left out. Conversations with at least min_turns such turns
    are taken in order of first appearance, at most max_turns each, until n_requests; returned
    in arrival order."""
    groups = collections.OrderedDict()
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f):
            if lineno < start:
                continue
            if lineno >= start + window:
                break
            line = line.strip()
            if not line:
                continue
            d = _record(path, lineno, line)
            ids = d["hash_ids"]
            if len(ids) < 2 or d["input_length"] > max_input:
                continue
            groups.setdefault(ids[1], []).append(d)
    rows = []
    for turns in groups.values():
        if len(turns) < min_turns:
            continue
        rows.extend(turns[:max_turns])
        if len(rows) >= n_requests:
            break
    rows = rows[:n_requests]
    rows.sort(key=lambda d: d["timestamp"])
    return rows


def reusable_prompt_tokens(rows):
    """Trace prompt tokens that are a prefix (whole 512-token blocks) already seen in an earlier
    row: what an ideal prefix cache could serve."""
    seen, reuse = set(), 0
    for d in rows:
        k = 0
        for h in d["hash_ids"]:
            if h not in seen:
                break
            k += 1
        reuse += min(k * TRACE_BLOCK_TOKENS, int(d["input_length"]))
        seen.update(d["hash_ids"])
    return reuse


def trace_rows(path, start, n):
    """Trace lines [start, start + n) as dicts."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f):
            if lineno < start or not line.strip():
                continue
            if len(rows) >= n:
                break
            rows.append(_record(path, lineno, line))
    if not rows:
        raise RunError(f"{path}: no requests from line {start}")
    return rows


def poisson_retimed(rows, seed=0):
    """The rows with Poisson arrivals of mean gap 1 s (the benchmark rescales them to each rate,
    or --time-scale T gives a rate of 1/T)."""
    times = workload.arrivals(len(rows), 1.0, 1.0, random.Random(seed))
    return [dict(d, timestamp=round(t * 1000.0, 3)) for d, t in zip(rows, times)]


def write_rows(path, rows):
    with open(path, "w") as f:
        for d in rows:
            f.write(json.dumps({"timestamp": d["timestamp"], "input_length": d["input_length"],
                                "output_length": d["output_length"], "hash_ids": d["hash_ids"]}) + "\n")


def slo_server_args(ttft_ms, tbt_ms):
    return ["--slo-ttft-ms", str(int(round(ttft_ms))), "--slo-tbt-ms", str(int(round(tbt_ms)))]


def slo_bench_args(ttft_ms, tbt_ms):
    return ["--slo-ttft-ms", f"{ttft_ms:g}", "--slo-tbt-ms", f"{tbt_ms:g}"]


# ---------------------------------------------------------------------------------------------
# Servers and runs.

def serve_flags(tandem):
    """The flags `tandem serve --help` lists (empty if it cannot be run)."""
    try:
        p = subprocess.run([tandem, "serve", "--help"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return set()
    return set(re.findall(r"(--[a-z][a-z0-9-]*)", p.stdout + p.stderr))


def scrape(url):
    """Parsed /metrics of the server; ({} , error text) if it cannot be read."""
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
            return parse_metrics(r.read().decode("utf-8", "replace")), None
    except OSError as e:
        return {}, str(e)


def model_id(url):
    try:
        with urllib.request.urlopen(url + "/v1/models", timeout=10) as r:
            data = json.loads(r.read()).get("data") or []
            return data[0].get("id") if data else None
    except (OSError, ValueError, AttributeError):
        return None


def warm_up(url, n, timeout_s=180):
    """n short completions, one after another, before the measured run (a worker busy starting
    may answer 503 or 429 for a while: retried until timeout_s)."""
    model = model_id(url)
    deadline = time.time() + timeout_s
    for i in range(n):
        body = {"prompt": prompts.block_text(f"scheduling-warmup-{i}", 24), "max_tokens": 4,
                "temperature": 0.0, "stream": False, "ignore_eos": True}
        if model:
            body["model"] = model
        req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        while True:
            try:
                with urllib.request.urlopen(req, timeout=timeout_s) as r:
                    r.read()
                break
            except urllib.error.HTTPError as e:
                if e.code in (429, 503) and time.time() < deadline:
                    time.sleep(1.0)
                    continue
                raise RunError(f"warm-up request failed: HTTP {e.code} {e.read()[:200]!r}") from None
            except OSError as e:
                raise RunError(f"warm-up request failed: {e}") from None


def _tail(path, n=3000):
    try:
        with open(path, errors="replace") as f:
            return f.read()[-n:]
    except OSError:
        return ""


def run_config(args, name, serve_args, bench_args, out_dir, log, sweep=False):
    """Starts `tandem serve`, warms it up, runs the serving benchmark once (or a rate sweep),
    reads /metrics before and after; returns the run (summary or sweep points, metric deltas)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [args.tandem, "--log-level", "warn", "serve", "--model", args.model, "--port", str(port),
           "--block-tokens", str(args.block_tokens), *serve_args, *args.serve_arg]
    bench_cmd = [sys.executable, SERVE_BENCH, "--base-url", url, *bench_args, *args.bench_arg,
                 "--label", name, "--out", out_dir, "--no-plots", "--no-progress"]
    os.makedirs(out_dir, exist_ok=True)
    log_path = os.path.join(out_dir, "server.log")
    load_before = loadavg()
    t0 = time.time()
    with open(log_path, "w") as server_log:
        proc = subprocess.Popen(cmd, stdout=server_log, stderr=subprocess.STDOUT)
        try:
            try:
                wait_ready(url, proc)
            except RuntimeError as e:
                raise RunError(f"{name}: {e}\ncommand: {' '.join(cmd)}\nserver log:\n{_tail(log_path)}") \
                    from None
            warm_up(url, args.warmup)
            time.sleep(SETTLE_S)
            before, err_before = scrape(url)
            bench = subprocess.run(bench_cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                   text=True, timeout=args.bench_timeout_s)
            if bench.returncode != 0:
                raise RunError(f"{name}: benchmark failed ({bench.returncode}): {bench.stderr[-2000:]}")
            time.sleep(SETTLE_S)
            after, err_after = scrape(url)
        except subprocess.TimeoutExpired:
            raise RunError(f"{name}: benchmark not done in {args.bench_timeout_s:g} s") from None
        finally:
            stop_server(proc)
    delta = metrics_delta(after, before)
    run = {"name": name, "command": cmd, "bench_command": bench_cmd[1:],
           "load_before": load_before, "load_after": loadavg(), "wall_s": time.time() - t0,
           "metrics_error": err_before or err_after,
           "metrics": [[n, list(map(list, ls)), v] for (n, ls), v in sorted(delta.items())]}
    if sweep:
        with open(os.path.join(out_dir, "sweep.json")) as f:
            sw = json.load(f)
        run["sweep"] = {"prompts": sw.get("prompts"), "target": sw.get("target"),
                        "points": [{"rate": p["rate"], "prompt_salt": p.get("prompt_salt"),
                                    "summary": p["summary"]} for p in sw["points"]]}
        done = f"{len(sw['points'])} rates, prompts {sw.get('prompts')}"
    else:
        with open(os.path.join(out_dir, "summary.json")) as f:
            run["summary"] = json.load(f)
        s = run["summary"]
        done = (f"{s['completed']}/{s['requests']} completed, {s['rejected']} rejected, "
                f"{s['failed'] - s['rejected']} other failures, {s['duration_s']:.1f} s")
    with open(os.path.join(out_dir, "server_metrics.json"), "w") as f:
        json.dump({"command": cmd, "delta": run["metrics"], "error": run["metrics_error"]}, f, indent=1)
    log(f"{name}: {done}; load {load_before} -> {run['load_after']}")
    return run


def run_metrics(run):
    """The run's metric deltas back as {(name, labels): value}."""
    return {(n, tuple(tuple(x) for x in ls)): v for n, ls, v in run.get("metrics", [])}


def rotated(items, rnd):
    k = rnd % len(items)
    return list(items[k:]) + list(items[:k])


def median_or_none(values):
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def pct(v):
    return "n/a" if v is None else f"{100 * v:.0f}%"


def num(v, digits=3):
    return "n/a" if v is None else fmt(v, digits)


# ---------------------------------------------------------------------------------------------
# Experiments.

def disagg_args(prefill, decode, threads):
    return ["--prefill-workers", str(prefill), "--decode-workers", str(decode),
            "--threads-per-worker", str(threads)]


def conversation_workload(args, out, what):
    """The workload of the policies and pool experiments: a slice of whole conversations of the
    trace, written under `out`; returns its description and the benchmark arguments."""
    ls = args.length_scale if args.length_scale is not None else 0.1
    os_ = args.output_scale if args.output_scale is not None else 0.05
    rows = conversation_slice(args.trace, args.policies_start, args.policies_window,
                              args.policies_requests, args.policies_max_input,
                              args.policies_min_turns, args.policies_max_turns)
    if len(rows) < 2:
        raise RunError(f"{what}: only {len(rows)} request(s) of conversations with >= "
                       f"{args.policies_min_turns} turns in trace lines {args.policies_start}.."
                       f"{args.policies_start + args.policies_window}: widen --policies-window")
    slice_path = os.path.join(out, "trace_slice.jsonl")
    write_rows(slice_path, rows)
    span_ms = rows[-1]["timestamp"] - rows[0]["timestamp"]
    time_scale = args.policies_span_s * 1000.0 / span_ms if span_ms > 0 else 0.0
    per_block = prompts.trace_block_tokens(ls, TRACE_BLOCK_TOKENS)
    n_conv = len({d["hash_ids"][1] for d in rows})
    in_tokens = sum(max(1, round(d["input_length"] * ls)) for d in rows)
    reuse = reusable_prompt_tokens(rows) / max(1, sum(d["input_length"] for d in rows))
    desc = (f"{len(rows)} requests of {n_conv} conversations (trace lines {args.policies_start}.."
            f"{args.policies_start + args.policies_window}, >= {args.policies_min_turns} turns, "
            f"<= {args.policies_max_turns} each, prompts <= {args.policies_max_input} trace tokens); "
            f"length scale {ls:g}: {per_block} tokens per 512-token trace block = "
            f"{per_block / args.block_tokens:.1f} KV blocks of {args.block_tokens}; ~{in_tokens} "
            f"prompt tokens, {100 * reuse:.0f}% of them a prefix of an earlier turn; output scale "
            f"{os_:g}; {span_ms / 1000:.0f} s of trace squeezed into {args.policies_span_s:g} s "
            f"(time scale {time_scale:.4g})")
    bench_args = ["--trace", slice_path, "--length-scale", f"{ls:g}", "--output-scale", f"{os_:g}",
                  "--time-scale", f"{time_scale:.6g}",
                  *slo_bench_args(args.slo_ttft_ms, args.slo_tbt_ms)]
    return desc, bench_args


def experiment_policies(args, out, log, runs_failed):
    desc, bench_args = conversation_workload(args, out, "policies")
    desc += "; 2 prefill + 1 decode worker, 1 thread each, --admission none"
    log(f"policies: {desc}")
    base = disagg_args(2, 1, 1) + ["--admission", "none"] + \
        slo_server_args(args.slo_ttft_ms, args.slo_tbt_ms)
    runs = collections.defaultdict(list)
    for rnd in range(args.rounds):
        for policy in rotated(POLICIES, rnd):
            try:
                runs[policy].append(run_config(
                    args, policy, base + ["--placement-policy", policy], bench_args,
                    os.path.join(out, f"{policy}-round{rnd + 1}"), log))
            except RunError as e:
                log(f"FAILED {e}")
                runs_failed.append(str(e))

    figures, prediction = {}, {}
    for policy in POLICIES:
        per_round = []
        ttft_b, tbt_b = {}, {}
        for run in runs.get(policy, []):
            s, m = run["summary"], run_metrics(run)
            per_round.append({
                "completed": s["completed"], "failed": s["failed"],
                "ttft_mean": s["ttft_ms"]["mean"], "ttft_p90": s["ttft_ms"]["p90"],
                "tbt_p90": s["tbt_ms"]["p90"], "attainment": s["slo_attainment"],
                "hit_tokens": total(m, "tandem_prefix_cache_hit_tokens_total"),
                "computed_tokens": total(m, "tandem_prompt_tokens_computed_total"),
                "local_prefills": total(m, "tandem_local_prefill_requests_total")})
            ttft_b = add_buckets(ttft_b, histogram_buckets(m, "tandem_ttft_prediction_relative_error"))
            tbt_b = add_buckets(tbt_b, histogram_buckets(m, "tandem_tbt_prediction_relative_error"))
        keys = per_round[0].keys() if per_round else ()
        figures[policy] = {k: median_or_none(r[k] for r in per_round) for k in keys}
        figures[policy]["rounds"] = len(per_round)
        prediction[policy] = {
            name: {"count": max(b.values()) if b else None, "p50": histogram_quantile(b, 0.5),
                   "p90": histogram_quantile(b, 0.9)}
            for name, b in (("ttft", ttft_b), ("tbt", tbt_b))}
    lb = figures.get("load-balance", {}).get("ttft_mean")
    lines = [f"## Placement policies (median of {args.rounds} round(s))", "", f"Workload: {desc}.", "",
             f"| policy | mean TTFT ms | p90 TTFT ms | SLO attainment (TTFT ≤ {args.slo_ttft_ms:g} ms, "
             f"TBT ≤ {args.slo_tbt_ms:g} ms) | prefix-cache hit tokens | prompt tokens computed | "
             f"local prefills | completed / failed | mean TTFT / load-balance |",
             "|---|---|---|---|---|---|---|---|---|"]
    for policy in POLICIES:
        f = figures[policy]
        if not f.get("rounds"):
            lines.append(f"| {policy} | failed (see log) |  |  |  |  |  |  |  |")
            continue
        ratio = f"{f['ttft_mean'] / lb:.2f}x" if lb and f["ttft_mean"] is not None else "n/a"
        lines.append(f"| {policy} | {num(f['ttft_mean'], 4)} | {num(f['ttft_p90'], 4)} | "
                     f"{pct(f['attainment'])} | {num(f['hit_tokens'], 4)} | "
                     f"{num(f['computed_tokens'], 4)} | {num(f['local_prefills'])} | "
                     f"{num(f['completed'])} / {num(f['failed'])} | {ratio} |")
    lines += ["", "Prediction quality, |predicted - measured| / measured, from the server's "
                  "histograms (buckets of all rounds; quantiles interpolated inside buckets):", "",
              "| policy | TTFT predictions | TTFT error p50 | TTFT error p90 | TBT predictions | "
              "TBT error p50 | TBT error p90 |", "|---|---|---|---|---|---|---|"]
    for policy in ("cache-load",) + tuple(p for p in POLICIES if p != "cache-load"):
        pr = prediction[policy]
        if policy != "cache-load" and not pr["ttft"]["count"] and not pr["tbt"]["count"]:
            continue
        lines.append(f"| {policy} | {num(pr['ttft']['count'])} | {num(pr['ttft']['p50'])} | "
                     f"{num(pr['ttft']['p90'])} | {num(pr['tbt']['count'])} | "
                     f"{num(pr['tbt']['p50'])} | {num(pr['tbt']['p90'])} |")
    return "\n".join(lines), {"workload": desc, "bench_args": bench_args, "serve_args": base,
                              "figures": figures, "prediction": prediction, "runs": runs}


def experiment_pool(args, out, log, runs_failed):
    desc, bench_args = conversation_workload(args, out, "pool")
    kv = args.pool_kv_tokens
    desc += (f"; 2 prefill + 1 decode worker, 1 thread each, {kv} KV tokens each, --admission "
             f"none, every prompt on a prefill worker (--no-local-prefill); the pool: 256 MiB of "
             f"DRAM per worker")
    log(f"pool: {desc}")
    base = disagg_args(2, 1, 1) + ["--admission", "none", "--no-local-prefill",
                                   "--kv-cache-tokens", str(kv), "--max-model-len", str(kv)] + \
        slo_server_args(args.slo_ttft_ms, args.slo_tbt_ms)
    def pool_args(pool, run_dir):
        if pool in ("off", "on"):
            return ["--kv-pool", pool]
        small = ["--kv-pool", "on", "--pool-dram-mb", str(args.pool_small_dram_mb)]
        if pool == "small":
            return small
        return small + ["--pool-ssd-dir", os.path.join(run_dir, "ssd"),
                        "--pool-ssd-gb", f"{args.pool_ssd_gb:g}"]

    runs = collections.defaultdict(list)
    for rnd in range(args.rounds):
        for placement, pool in rotated(POOL_CONFIGS, rnd):
            name = f"{placement}-pool-{pool}"
            run_dir = os.path.join(out, f"{name}-round{rnd + 1}")
            try:
                runs[name].append(run_config(
                    args, name, base + ["--placement-policy", placement] + pool_args(pool, run_dir),
                    bench_args, run_dir, log))
            except RunError as e:
                log(f"FAILED {e}")
                runs_failed.append(str(e))
    figures = {}
    for placement, pool in POOL_CONFIGS:
        name = f"{placement}-pool-{pool}"
        per_round = []
        for run in runs.get(name, []):
            s, m = run["summary"], run_metrics(run)
            # Every prompt is computed on a prefill worker (--no-local-prefill): the share of
            # prompt tokens not computed there is the prefix hit ratio (decode-side reuse of
            # the pushed KV is not counted).
            prompt_total = total(m, "tandem_prompt_tokens_total")
            computed = total(m, "tandem_prompt_tokens_computed_total")
            hit = prompt_total - computed
            per_round.append({
                "completed": s["completed"], "failed": s["failed"],
                "ttft_mean": s["ttft_ms"]["mean"], "ttft_p50": s["ttft_ms"]["p50"],
                "ttft_p90": s["ttft_ms"]["p90"], "hit_tokens": hit, "computed_tokens": computed,
                "pool_tokens": total(m, "tandem_kv_pool_hit_tokens_total"),
                "ssd_blocks": total(m, "tandem_kv_pool_ssd_hit_blocks_total"),
                "hit_ratio": hit / prompt_total if prompt_total > 0 else None})
        keys = per_round[0].keys() if per_round else ()
        figures[name] = {k: median_or_none(r[k] for r in per_round) for k in keys}
        figures[name]["rounds"] = len(per_round)
    lines = [f"## KV pool against local prefix caches (median of {args.rounds} round(s))", "",
             f"Workload: {desc}.", "",
             "| placement | KV pool | prefix hit ratio | tokens from the pool | blocks from SSD | "
             "prompt tokens computed | mean TTFT ms | p50 TTFT ms | p90 TTFT ms | completed / failed "
             "| hit ratio / off | computed / off |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for placement, pool in POOL_CONFIGS:
        f = figures[f"{placement}-pool-{pool}"]
        if not f.get("rounds"):
            lines.append(f"| {placement} | {pool} | failed (see log) |" + "  |" * 9)
            continue
        off = figures.get(f"{placement}-pool-off", {})
        def ratio(key):
            a, b = f.get(key), off.get(key)
            return f"{a / b:.2f}x" if a is not None and b else "n/a"
        lines.append(f"| {placement} | {pool} | {pct(f['hit_ratio'])} | {num(f['pool_tokens'], 4)} | "
                     f"{num(f['ssd_blocks'], 4)} | {num(f['computed_tokens'], 4)} | {num(f['ttft_mean'], 4)} | "
                     f"{num(f['ttft_p50'], 4)} | {num(f['ttft_p90'], 4)} | {num(f['completed'])} / "
                     f"{num(f['failed'])} | {ratio('hit_ratio')} | {ratio('computed_tokens')} |")
    return "\n".join(lines), {"workload": desc, "bench_args": bench_args, "serve_args": base,
                              "figures": figures, "runs": runs}


def experiment_overload(args, out, log, runs_failed):
    ls = args.length_scale if args.length_scale is not None else 0.02
    os_ = args.output_scale if args.output_scale is not None else 0.1
    desc = (f"trace lines {args.overload_start}..{args.overload_start + args.overload_requests}, "
            f"length scale {ls:g}, output scale {os_:g}, time scale {args.overload_time_scale:g}; "
            f"1 prefill + 1 decode worker, 1 thread each; SLOs TTFT ≤ {args.slo_ttft_ms:g} ms, "
            f"TBT ≤ {args.slo_tbt_ms:g} ms (given to the server)")
    log(f"overload: {desc}")
    bench_args = ["--trace", args.trace, "--trace-start", str(args.overload_start),
                  "--max-requests", str(args.overload_requests), "--length-scale", f"{ls:g}",
                  "--output-scale", f"{os_:g}", "--time-scale", f"{args.overload_time_scale:g}",
                  *slo_bench_args(args.slo_ttft_ms, args.slo_tbt_ms)]
    base = disagg_args(1, 1, 1) + slo_server_args(args.slo_ttft_ms, args.slo_tbt_ms)
    runs = collections.defaultdict(list)
    for rnd in range(args.rounds):
        for adm in rotated(ADMISSIONS, rnd):
            try:
                runs[adm].append(run_config(args, f"admission {adm}", base + ["--admission", adm],
                                            bench_args, os.path.join(out, f"{adm}-round{rnd + 1}"), log))
            except RunError as e:
                log(f"FAILED {e}")
                runs_failed.append(str(e))
    figures = {}
    for adm in ADMISSIONS:
        per_round = []
        for run in runs.get(adm, []):
            s, m = run["summary"], run_metrics(run)
            outcome = {o: total(m, "tandem_prefill_tokens_total", outcome=o) for o in PREFILL_OUTCOMES}
            known = [v for v in outcome.values() if v is not None]
            all_prefill = total(m, "tandem_prefill_tokens_total")
            wasted = None
            if known and all_prefill:
                wasted = sum(outcome[o] or 0.0 for o in ("slo_missed", "failed", "rejected")) / all_prefill
            met = s["slo_attainment"] * s["requests"]
            per_round.append({
                "requests": s["requests"], "served": s["completed"], "rejected": s["rejected"],
                "other_failed": s["failed"] - s["rejected"], "attainment": s["slo_attainment"],
                "attainment_of_served": met / s["completed"] if s["completed"] else None,
                "goodput_rps": s["goodput_rps"], "ttft_p90": s["ttft_ms"]["p90"],
                "prefill_tokens": all_prefill, "wasted_prefill": wasted,
                **{f"prefill_{o}": outcome[o] for o in PREFILL_OUTCOMES},
                "rejections": by_label(m, "tandem_rejections_total", "reason")})
        keys = [k for k in (per_round[0].keys() if per_round else ()) if k != "rejections"]
        f = {k: median_or_none(r[k] for r in per_round) for k in keys}
        f["rounds"] = len(per_round)
        f["rejections"] = per_round[0]["rejections"] if per_round else {}
        figures[adm] = f
    lines = [f"## Admission under overload (median of {args.rounds} round(s))", "",
             f"Workload: {desc}.", "",
             f"| admission | requests | served | rejected | other failures | SLO attainment | "
             f"attainment of served | goodput req/s | TTFT p90 ms (served) | prefill tokens | "
             f"wasted prefill | rejections by reason (round 1) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for adm in ADMISSIONS:
        f = figures[adm]
        if not f.get("rounds"):
            lines.append(f"| {adm} | failed (see log) |" + "  |" * 10)
            continue
        reasons = ", ".join(f"{k} {v:g}" for k, v in sorted(f["rejections"].items())) or "n/a"
        lines.append(f"| {adm} | {num(f['requests'])} | {num(f['served'])} | {num(f['rejected'])} | "
                     f"{num(f['other_failed'])} | {pct(f['attainment'])} | "
                     f"{pct(f['attainment_of_served'])} | {num(f['goodput_rps'])} | "
                     f"{num(f['ttft_p90'], 4)} | {num(f['prefill_tokens'], 4)} | "
                     f"{pct(f['wasted_prefill'])} | {reasons} |")
    lines += ["", "Wasted prefill: prompt tokens the server computed for requests that then missed "
                  "their SLO, failed or were rejected, over all prompt tokens computed "
                  "(tandem_prefill_tokens_total by outcome)."]
    return "\n".join(lines), {"workload": desc, "bench_args": bench_args, "serve_args": base,
                              "figures": figures, "runs": runs}


def max_rate_meeting(att_by_rate, target):
    """The highest rate whose attainment is >= target, or None."""
    ok = [r for r, a in att_by_rate.items() if a is not None and a >= target]
    return max(ok) if ok else None


def experiment_capacity(args, out, log, runs_failed, flags):
    ls = args.length_scale if args.length_scale is not None else 0.02
    os_ = args.output_scale if args.output_scale is not None else 0.1
    half = max(1, args.cores // 2)
    mode_args = {"default": disagg_args(1, 1, half),
                 "colocated": ["--mode", "colocated", "--threads", str(args.cores)]}
    with_slo = {"--slo-ttft-ms", "--slo-tbt-ms"} <= flags
    if not with_slo:
        log("capacity: this tandem serve has no --slo-ttft-ms/--slo-tbt-ms; the servers run "
            "without SLOs (no SLO-aware admission)")
    rows = trace_rows(args.trace, args.capacity_start, args.capacity_requests)
    if args.capacity_arrivals == "poisson":
        rows = poisson_retimed(rows)
    slice_path = os.path.join(out, "trace_slice.jsonl")
    write_rows(slice_path, rows)
    desc = (f"trace lines {args.capacity_start}..{args.capacity_start + len(rows)}, "
            f"length scale {ls:g}, output scale {os_:g}, "
            f"{'Poisson arrivals' if args.capacity_arrivals == 'poisson' else 'the trace arrivals'} "
            f"rescaled to each rate ({', '.join(f'{r:g}' for r in args.rates)} req/s), fresh "
            f"prompts per rate; "
            + "; ".join({"default": f"default mode: 1 prefill + 1 decode worker, {half} thread(s) each",
                         "colocated": f"colocated: {args.cores} threads"}[m]
                        for m in args.capacity_modes)
            + f"; TTFT SLO {args.slo_ttft_ms:g} ms; SLO-aware admission "
            f"{'on (server told the SLOs)' if with_slo else 'off (server has no SLO flags)'}")
    log(f"capacity: {desc}")
    runs = collections.defaultdict(list)
    combos = [(mode, tbt) for tbt in args.tbt_slos for mode in args.capacity_modes]
    for rnd in range(args.rounds):
        for mode, tbt in rotated(combos, rnd):
            key = f"{mode}@{tbt:g}"
            serve = mode_args[mode] + (slo_server_args(args.slo_ttft_ms, tbt) if with_slo else [])
            bench_args = ["--trace", slice_path, "--length-scale", f"{ls:g}",
                          "--output-scale", f"{os_:g}",
                          "--sweep-rates", ",".join(f"{r:g}" for r in args.rates),
                          "--sweep-target", f"{args.target:g}",
                          *slo_bench_args(args.slo_ttft_ms, tbt)]
            try:
                runs[key].append(run_config(args, f"{mode} TBT SLO {tbt:g} ms", serve, bench_args,
                                            os.path.join(out, f"{mode}-tbt{tbt:g}-round{rnd + 1}"),
                                            log, sweep=True))
            except RunError as e:
                log(f"FAILED {e}")
                runs_failed.append(str(e))
    figures = {}
    for mode in args.capacity_modes:
        for tbt in args.tbt_slos:
            key = f"{mode}@{tbt:g}"
            att = {r: median_or_none(next((p["summary"]["slo_attainment"] for p in run["sweep"]["points"]
                                           if p["rate"] == r), None) for run in runs.get(key, []))
                   for r in args.rates}
            per_round = [max_rate_meeting({p["rate"]: p["summary"]["slo_attainment"]
                                           for p in run["sweep"]["points"]}, args.target)
                         for run in runs.get(key, [])]
            figures[key] = {"attainment_by_rate": {f"{r:g}": a for r, a in att.items()},
                            "max_rate": max_rate_meeting(att, args.target),
                            "max_rate_per_round": per_round, "rounds": len(runs.get(key, []))}
    lines = [f"## Capacity: default mode against colocated (attainment: median of {args.rounds} "
             f"round(s))", "", f"Workload: {desc}.", "",
             f"| TBT SLO ms | " + " | ".join(f"{m}: highest rate ≥ {100 * args.target:.0f}% req/s"
                                             for m in args.capacity_modes)
             + (" | default / colocated |" if len(args.capacity_modes) == 2 else " |"),
             "|---|" + "---|" * len(args.capacity_modes) + ("---|" if len(args.capacity_modes) == 2 else "")]
    for tbt in args.tbt_slos:
        cells = []
        for mode in args.capacity_modes:
            f = figures[f"{mode}@{tbt:g}"]
            if not f["rounds"]:
                cells.append("failed (see log)")
            elif f["max_rate"] is None:
                cells.append(f"none (< {min(args.rates):g})")
            else:
                cells.append(f"{f['max_rate']:g}")
        line = f"| {tbt:g} | " + " | ".join(cells)
        if len(args.capacity_modes) == 2:
            a = figures[f"default@{tbt:g}"]["max_rate"]
            b = figures[f"colocated@{tbt:g}"]["max_rate"]
            line += " | " + (f"{a / b:.2f}x" if a is not None and b else "n/a")
        lines.append(line + " |")
    lines += ["", "SLO attainment (TTFT and TBT) by rate:", "",
              "| configuration | " + " | ".join(f"{r:g} req/s" for r in args.rates) + " |",
              "|---|" + "---|" * len(args.rates)]
    for mode in args.capacity_modes:
        for tbt in args.tbt_slos:
            att = figures[f"{mode}@{tbt:g}"]["attainment_by_rate"]
            lines.append(f"| {mode}, TBT ≤ {tbt:g} ms | " +
                         " | ".join(pct(att[f"{r:g}"]) for r in args.rates) + " |")
    return "\n".join(lines), {"workload": desc, "mode_args": mode_args, "server_slos": with_slo,
                              "figures": figures, "runs": runs}


# ---------------------------------------------------------------------------------------------

REQUIRED_FLAGS = {"policies": ("--placement-policy", "--admission", "--slo-ttft-ms", "--slo-tbt-ms"),
                  "overload": ("--admission", "--slo-ttft-ms", "--slo-tbt-ms"),
                  "capacity": (),
                  "pool": ("--placement-policy", "--admission", "--kv-pool", "--pool-dram-mb",
                           "--pool-ssd-dir", "--pool-ssd-gb")}


def parse_args(argv):
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Sizes left unset take the full-run values, or the --quick ones with --quick.")
    ap.add_argument("--experiment", choices=EXPERIMENTS + OPT_IN_EXPERIMENTS + ("all",),
                    default="all", help="all: policies, overload, capacity (pool only when named)")
    ap.add_argument("--tandem", default=os.path.join(ROOT, "build", "tandem"), help="tandem binary")
    ap.add_argument("--model", help=f"GGUF model (default {os.path.relpath(MODEL, ROOT)}, else the "
                                    f"only .gguf in models/)")
    ap.add_argument("--trace", default=TRACE, help="Mooncake conversation trace (JSON lines)")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "out", "scheduling"))
    ap.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run of minutes")
    ap.add_argument("--rounds", type=int, default=1, help="runs of every configuration (medians)")
    ap.add_argument("--cores", type=int, default=2,
                    help="cores of the capacity comparison: colocated --threads, default mode half "
                         "per worker (default 2)")
    ap.add_argument("--block-tokens", type=int, default=16, help="tandem serve --block-tokens (16)")
    ap.add_argument("--length-scale", type=float,
                    help="trace length scale (default: policies 0.1, overload and capacity 0.02)")
    ap.add_argument("--output-scale", type=float,
                    help="trace output scale (default: policies 0.05, overload and capacity 0.1)")
    ap.add_argument("--slo-ttft-ms", type=float, default=5000.0, help="TTFT SLO (all experiments)")
    ap.add_argument("--slo-tbt-ms", type=float, default=200.0, help="TBT SLO of policies and overload")
    ap.add_argument("--warmup", type=int, default=2, help="unmeasured requests per server")
    ap.add_argument("--bench-timeout-s", type=float, default=3600.0)
    ap.add_argument("--serve-arg", action="append", default=[],
                    help="extra tandem serve argument for every server (repeatable; "
                         "--serve-arg=--flag=value)")
    ap.add_argument("--bench-arg", action="append", default=[],
                    help="extra serve_bench.py argument for every run (repeatable)")
    g = ap.add_argument_group("policies")
    g.add_argument("--policies-requests", type=int)
    g.add_argument("--policies-span-s", type=float, help="seconds the slice's arrivals are squeezed into")
    g.add_argument("--policies-start", type=int, default=0, help="first trace line searched")
    g.add_argument("--policies-window", type=int, default=3000, help="trace lines searched")
    g.add_argument("--policies-max-input", type=int, default=12000,
                   help="leave out requests longer than this (trace tokens, before scaling)")
    g.add_argument("--policies-min-turns", type=int, default=3)
    g.add_argument("--policies-max-turns", type=int)
    g = ap.add_argument_group("pool")
    g.add_argument("--pool-kv-tokens", type=int, default=2048,
                   help="KV cache of each worker in the pool experiment (small: local caches evict)")
    g.add_argument("--pool-small-dram-mb", type=int, default=4,
                   help="DRAM per worker of the too-small pool (with and without an SSD tier)")
    g.add_argument("--pool-ssd-gb", type=float, default=1.0, help="SSD tier per worker")
    g = ap.add_argument_group("overload")
    g.add_argument("--overload-requests", type=int)
    g.add_argument("--overload-start", type=int, default=0)
    g.add_argument("--overload-time-scale", type=float,
                   help="trace time scale (smaller = faster arrivals; default 1 = real time)")
    g = ap.add_argument_group("capacity")
    g.add_argument("--capacity-requests", type=int, help="requests at each rate")
    g.add_argument("--capacity-start", type=int, default=0)
    g.add_argument("--capacity-rates", help="comma-separated request rates")
    g.add_argument("--capacity-tbt-slos", default="50,1000", help="comma-separated TBT SLOs, ms")
    g.add_argument("--capacity-arrivals", choices=("poisson", "trace"), default="poisson",
                   help="Poisson arrivals (default) or the trace's own (bursty) arrival times, "
                        "rescaled to each rate")
    g.add_argument("--capacity-modes", default="default,colocated",
                   help="comma-separated: default (disaggregated) and/or colocated")
    g.add_argument("--target", type=float, default=0.9, help="SLO attainment to meet (0.9)")
    args = ap.parse_args(argv)

    for k, v in SIZES["quick" if args.quick else "full"].items():
        if getattr(args, k) is None:
            setattr(args, k, v)

    def floats(text, what):
        try:
            vals = [float(x) for x in text.split(",") if x.strip()]
        except ValueError:
            ap.error(f"{what} must be comma-separated numbers")
        if not vals or any(not v > 0 for v in vals):
            ap.error(f"{what} must be positive numbers")
        return vals

    args.rates = sorted(set(floats(args.capacity_rates, "--capacity-rates")))
    args.tbt_slos = floats(args.capacity_tbt_slos, "--capacity-tbt-slos")
    args.capacity_modes = [m.strip() for m in args.capacity_modes.split(",") if m.strip()]
    bad = [m for m in args.capacity_modes if m not in CAPACITY_MODES]
    if bad or not args.capacity_modes or len(set(args.capacity_modes)) != len(args.capacity_modes):
        ap.error(f"--capacity-modes must name default and/or colocated once each, not {bad}")
    for name in ("rounds", "cores", "block_tokens", "policies_requests", "policies_window",
                 "policies_min_turns", "policies_max_turns", "overload_requests", "capacity_requests",
                 "policies_max_input"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    for name in ("policies_start", "overload_start", "capacity_start", "warmup"):
        if getattr(args, name) < 0:
            ap.error(f"--{name.replace('_', '-')} must be >= 0")
    for name in ("length_scale", "output_scale"):
        if getattr(args, name) is not None and getattr(args, name) <= 0:
            ap.error(f"--{name.replace('_', '-')} must be > 0")
    for name in ("slo_ttft_ms", "slo_tbt_ms", "policies_span_s", "bench_timeout_s"):
        if getattr(args, name) <= 0:
            ap.error(f"--{name.replace('_', '-')} must be > 0")
    if args.overload_time_scale < 0:
        ap.error("--overload-time-scale must be >= 0")
    if not 0 < args.target <= 1:
        ap.error("--target must be in (0, 1]")
    if args.policies_min_turns > args.policies_max_turns:
        ap.error("--policies-min-turns must be <= --policies-max-turns")
    args.experiments = list(EXPERIMENTS) if args.experiment == "all" else [args.experiment]
    return args


def resolve_model(path):
    """The model file: the given path, else the default, else the only .gguf in models/."""
    if path:
        return path if os.path.exists(path) else None
    if os.path.exists(MODEL):
        return MODEL
    d = os.path.join(ROOT, "models")
    found = sorted(f for f in os.listdir(d) if f.endswith(".gguf")) if os.path.isdir(d) else []
    return os.path.join(d, found[0]) if len(found) == 1 else None


def check_inputs(args, need_trace=True, trace_hint="pass --trace"):
    """Resolves args.model and checks the binary and the trace: an error message, or None."""
    model = resolve_model(args.model)
    if model is None:
        return (f"no model {'at ' + args.model if args.model else 'in models/'} (pass --model "
                f"FILE.gguf)")
    args.model = model
    if not (os.path.isfile(args.tandem) and os.access(args.tandem, os.X_OK)):
        return f"no tandem binary at {args.tandem} (build it, or pass --tandem)"
    if need_trace and not os.path.exists(args.trace):
        return f"no trace at {args.trace} ({trace_hint})"
    return None


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    error = check_inputs(args)
    if error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    flags = serve_flags(args.tandem)
    missing = {e: [f for f in REQUIRED_FLAGS[e] if f not in flags] for e in args.experiments}
    missing = {e: m for e, m in missing.items() if m}
    if missing:
        for e, m in missing.items():
            print(f"error: experiment {e} needs tandem serve {', '.join(m)}, which {args.tandem} "
                  f"does not have (`tandem serve --help`)", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    log = make_logger(args.out)

    log(f"start: experiments {', '.join(args.experiments)}, {args.rounds} round(s)"
        f"{', quick' if args.quick else ''}; tandem {args.tandem}, model {args.model}; load "
        f"average {loadavg()}")
    tables, failed = [], []
    for exp in args.experiments:
        out = os.path.join(args.out, exp)
        os.makedirs(out, exist_ok=True)
        try:
            if exp == "policies":
                table, data = experiment_policies(args, out, log, failed)
            elif exp == "overload":
                table, data = experiment_overload(args, out, log, failed)
            elif exp == "pool":
                table, data = experiment_pool(args, out, log, failed)
            else:
                table, data = experiment_capacity(args, out, log, failed, flags)
        except RunError as e:
            log(f"FAILED {e}")
            failed.append(str(e))
            continue
        with open(os.path.join(out, "table.md"), "w") as f:
            f.write(table + "\n")
        with open(os.path.join(out, "results.json"), "w") as f:
            json.dump({"experiment": exp, "argv": sys.argv[1:] if argv is None else argv,
                       "rounds": args.rounds, "quick": args.quick, "table": table, **data}, f, indent=1)
        print(table + "\n", flush=True)
        tables.append(table)
    log(f"end, load average {loadavg()}")
    with open(os.path.join(args.out, "tables.md"), "w") as f:
        f.write("\n\n".join(tables) + "\n")
    if failed:
        print(f"{len(failed)} run(s) failed; see {os.path.join(args.out, 'log.txt')}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
