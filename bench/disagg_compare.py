#!/usr/bin/env python3
"""Disaggregated against colocated tandem serve on the same cores and the same trace slice.

Each configuration runs against a fresh server; the main pair (colocated `--threads 2` against
disaggregated 1 prefill + 1 decode worker with one thread each) alternates for --rounds rounds,
then a smaller knob sweep runs once per point (chunk size, threads, P:D ratio). Every run records
each request once (the serving benchmark's per-request records, results.json); goodput and SLO
attainment are then evaluated from those records at several TBT SLOs with one fixed TTFT SLO, so
one run serves every SLO. Prints Markdown tables (medians over rounds, ratios disaggregated /
colocated) and writes them, with every run's records and the server's /metrics, under --out.

    python3 bench/disagg_compare.py --out bench/out/disagg            # main pair + sweep
    python3 bench/disagg_compare.py --quick --out bench/out/disagg-quick   # smoke (1 round)

Benchmark arguments after `--` replace the default workload (see DEFAULT_BENCH).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "serving"))

from compare_servers import free_port, make_logger, stop_server, wait_ready  # noqa: E402
from servebench import metrics  # noqa: E402

TRACE = os.path.join(ROOT, "..", "shared", "data", "mooncake-traces", "conversation_trace.jsonl")
# The conversation trace scaled down: prompts x0.02 (10-token blocks per hash id; the first 40
# requests have 46 to 1,743 prompt tokens, 10,123 in all), outputs x0.1 (1 to 93 tokens, 1,495 in
# all), arrivals stretched x6 (five bursts, 18 s apart, over 72 s: ~140 prompt tokens/s offered),
# which is near what 2 shared cores compute, where the two designs differ.
DEFAULT_BENCH = ["--trace", TRACE, "--max-requests", "40", "--length-scale", "0.02",
                 "--output-scale", "0.1", "--time-scale", "6", "--warmup", "2"]
QUICK_BENCH = ["--trace", TRACE, "--max-requests", "12", "--length-scale", "0.02",
               "--output-scale", "0.1", "--time-scale", "6", "--warmup", "1"]
METRIC_PREFIXES = ("tandem_disaggregated_requests_total", "tandem_colocated_fallback_requests_total",
                   "tandem_ttft_prefill_seconds_sum", "tandem_ttft_prefill_seconds_count",
                   "tandem_ttft_kv_transfer_seconds_sum", "tandem_ttft_kv_transfer_seconds_count",
                   "tandem_first_decode_step_seconds_sum", "tandem_first_decode_step_seconds_count",
                   "tandem_kv_transfer_failures_total", "tandem_kv_transfer_timeouts_total",
                   "tandem_kv_wait_timeouts_total", "tandem_prefill_retries_total",
                   "tandem_worker_failures_total", "tandem_worker_restarts_total",
                   "tandem_placement_rejections_total", "tandem_preemptions_total",
                   "tandem_prefix_cache_hit_tokens_total", "tandem_prompt_tokens_computed_total",
                   "tandem_prompt_tokens_total", "tandem_requests_total",
                   "tandem_kv_transfer_bytes_total")


def loadavg():
    try:
        with open("/proc/loadavg") as f:
            return float(f.read().split()[0])
    except OSError:
        return None


def scrape_metrics(url):
    """The counters and sums of /metrics worth keeping (name with labels -> value)."""
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
            text = r.read().decode("utf-8", "replace")
    except OSError as e:
        return {"error": str(e)}
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, _, value = line.rpartition(" ")
        if name.startswith(METRIC_PREFIXES):
            try:
                out[name] = float(value)
            except ValueError:
                pass
    return out


def configurations(threads):
    """(name, serve arguments, sweep-only) of every configuration."""
    half = max(1, threads // 2)
    colo = ["--mode", "colocated", "--threads", str(threads)]
    disagg = ["--mode", "disaggregated", "--prefill-workers", "1", "--decode-workers", "1",
              "--threads-per-worker", str(half)]
    main = [("colocated", colo), ("disaggregated", disagg)]
    sweep = [
        ("colocated chunk 64", colo + ["--max-batch-tokens", "64"]),
        ("colocated chunk 1024", colo + ["--max-batch-tokens", "1024"]),
        ("disaggregated chunk 64", disagg + ["--max-batch-tokens", "64"]),
        ("disaggregated chunk 1024", disagg + ["--max-batch-tokens", "1024"]),
        (f"colocated {half} thread", ["--mode", "colocated", "--threads", str(half)]),
        ("disaggregated 1P+2D", ["--mode", "disaggregated", "--prefill-workers", "1",
                                 "--decode-workers", "2", "--threads-per-worker", str(half)]),
    ]
    return main, sweep


def run_config(args, name, serve_args, bench_args, out_dir, log):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [args.tandem, "--log-level", "warn", "serve", "--model", args.model, "--port", str(port),
           *serve_args, *args.serve_arg]
    os.makedirs(out_dir, exist_ok=True)
    err = open(os.path.join(out_dir, "server.log"), "w")
    load_before = loadavg()
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdout=err, stderr=subprocess.STDOUT, start_new_session=False)
    try:
        wait_ready(url, proc)
        bench = subprocess.run([sys.executable, os.path.join(HERE, "serving", "serve_bench.py"),
                                "--base-url", url, *bench_args, "--label", name, "--out", out_dir,
                                "--no-plots", "--no-progress"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               timeout=3600)
        if bench.returncode != 0:
            raise RuntimeError(f"{name}: benchmark failed ({bench.returncode}): {bench.stderr[-2000:]}")
        server_metrics = scrape_metrics(url)
    finally:
        stop_server(proc)
        err.close()
    load_after = loadavg()
    with open(os.path.join(out_dir, "results.json")) as f:
        res = json.load(f)
    run = {"name": name, "command": " ".join(cmd), "load_before": load_before,
           "load_after": load_after, "wall_s": time.time() - t0, "server_metrics": server_metrics,
           "records": res["requests"], "duration_s": res["summary"]["duration_s"],
           "summary": res["summary"]}
    with open(os.path.join(out_dir, "server_metrics.json"), "w") as f:
        json.dump({"command": cmd, "load_before": load_before, "load_after": load_after,
                   "metrics": server_metrics}, f, indent=1)
    log(f"{name}: {run['summary']['completed']}/{run['summary']['requests']} completed, "
        f"{run['summary']['failed']} failed, {run['duration_s']:.1f} s, load {load_before} -> "
        f"{load_after}")
    return run


def evaluate(run, ttft_slo, tbt_slos):
    """Figures of one run, with goodput and attainment at each TBT SLO (from the records)."""
    recs = run["records"]
    dur = max(run["duration_s"], 1e-9)
    ok = [r for r in recs if r["ok"]]
    st = {k: metrics.stats(r[k] for r in ok) for k in ("ttft_ms", "tbt_ms", "tpot_ms")}
    st["itl_ms"] = metrics.stats(g for r in ok for g in r["itl_ms"])
    out = {"completed": len(ok), "failed": len(recs) - len(ok),
           "short": sum(1 for r in ok if r["output_tokens"] is not None
                        and r["output_tokens"] < r["requested_output_tokens"]),
           "throughput_rps": len(ok) / dur,
           "output_tps": sum(r["output_tokens"] or 0 for r in ok) / dur,
           "duration_s": dur}
    for k in ("ttft_ms", "tbt_ms"):
        for p in ("p50", "p90", "p99"):
            out[f"{k}.{p}"] = st[k][p]
    out["tpot_ms.p50"] = st["tpot_ms"]["p50"]
    out["itl_ms.p50"] = st["itl_ms"]["p50"]
    out["ttft_attainment"] = sum(1 for r in ok if r["ttft_ms"] <= ttft_slo) / max(1, len(recs))
    for tbt in tbt_slos:
        slo = {"ttft_ms": ttft_slo, "tbt_ms": tbt}
        met = sum(1 for r in recs if r["ok"] and all(metrics.slo_checks(r, slo).values()))
        out[f"goodput@{tbt:g}"] = met / dur
        out[f"attainment@{tbt:g}"] = met / max(1, len(recs))
    return out


def fmt(v, digits=3):
    if v is None:
        return "–"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.{digits}g}"


def median_of(evals, key):
    vals = [e[key] for e in evals if e.get(key) is not None]
    return statistics.median(vals) if vals else None


def table(names, evals_by_name, ttft_slo, tbt_slos, ratio_pair=None, title="configuration"):
    rows = []
    for tbt in tbt_slos:
        rows.append((f"goodput@{tbt:g}", f"goodput req/s (TTFT ≤ {ttft_slo:g} ms, TBT ≤ {tbt:g} ms)"))
        rows.append((f"attainment@{tbt:g}", f"SLO attainment (TBT ≤ {tbt:g} ms)"))
    rows += [("ttft_attainment", f"TTFT ≤ {ttft_slo:g} ms alone"),
             ("ttft_ms.p50", "TTFT p50 ms"), ("ttft_ms.p90", "TTFT p90 ms"),
             ("ttft_ms.p99", "TTFT p99 ms"), ("tbt_ms.p50", "TBT p50 ms"),
             ("tbt_ms.p90", "TBT p90 ms"), ("tbt_ms.p99", "TBT p99 ms"),
             ("tpot_ms.p50", "TPOT p50 ms"), ("itl_ms.p50", "ITL p50 ms"),
             ("throughput_rps", "throughput req/s"), ("output_tps", "output tok/s"),
             ("completed", "completed"), ("failed", "failed"), ("short", "short outputs"),
             ("duration_s", "run duration s")]
    head = f"| {title} | " + " | ".join(names)
    sep = "|---|" + "---|" * len(names)
    if ratio_pair:
        head += f" | {ratio_pair[1]} / {ratio_pair[0]}"
        sep += "---|"
    lines = [head + " |", sep]
    for key, label in rows:
        vals = [median_of(evals_by_name[n], key) for n in names]
        cells = []
        for v in vals:
            if v is not None and key.startswith(("attainment", "ttft_attainment")):
                cells.append(f"{100 * v:.0f}%")
            else:
                cells.append(fmt(v))
        line = f"| {label} | " + " | ".join(cells)
        if ratio_pair:
            a = median_of(evals_by_name[ratio_pair[0]], key)
            b = median_of(evals_by_name[ratio_pair[1]], key)
            line += " | " + (f"{b / a:.2f}x" if a and b is not None else "–")
        lines.append(line + " |")
    return "\n".join(lines)


def metrics_table(names, runs_by_name):
    keys = [("tandem_disaggregated_requests_total", "disaggregated requests"),
            ("tandem_colocated_fallback_requests_total", "colocated fallbacks"),
            ("tandem_prefill_retries_total", "prefill retries"),
            ("tandem_kv_transfer_failures_total", "KV transfer failures"),
            ("tandem_kv_transfer_timeouts_total", "KV transfer timeouts"),
            ("tandem_worker_failures_total", "worker failures"),
            ("tandem_preemptions_total", "preemptions")]
    lines = ["| server counter (round 1) | " + " | ".join(names) + " |",
             "|---|" + "---|" * len(names)]

    def total(m, prefix):
        vals = [v for k, v in m.items() if k == prefix or k.startswith(prefix + "{")]
        return sum(vals) if vals else None

    for key, label in keys:
        cells = [fmt(total(runs_by_name[n][0]["server_metrics"], key)) for n in names]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    for base, label in (("tandem_ttft_prefill_seconds", "mean TTFT: prefill ms"),
                        ("tandem_ttft_kv_transfer_seconds", "mean TTFT: KV transfer ms"),
                        ("tandem_first_decode_step_seconds", "mean first decode step ms")):
        cells = []
        for n in names:
            m = runs_by_name[n][0]["server_metrics"]
            s, c = total(m, base + "_sum"), total(m, base + "_count")
            cells.append(fmt(1000 * s / c) if s is not None and c else "–")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--tandem", default=os.path.join(ROOT, "build", "tandem"))
    ap.add_argument("--threads", type=int, default=2,
                    help="cores given to each configuration (colocated --threads; disaggregated: "
                         "half per worker)")
    ap.add_argument("--serve-arg", action="append", default=[],
                    help="one more argument of every `tandem serve` (repeatable; "
                         "--serve-arg=--max-model-len --serve-arg=32768)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sweep-rounds", type=int, default=1)
    ap.add_argument("--no-sweep", action="store_true")
    ap.add_argument("--quick", action="store_true", help="smoke: 1 round, 12 requests, no sweep")
    ap.add_argument("--slo-ttft-ms", type=float, default=5000.0)
    ap.add_argument("--slo-tbt-ms", default="50,200,1000",
                    help="comma-separated TBT SLOs (tight, medium, loose)")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "out", "disagg"))
    ap.add_argument("--evaluate-only", action="store_true",
                    help="do not run: evaluate the runs recorded in --out (e.g. at other SLOs)")
    ap.add_argument("bench_args", nargs="*", help="benchmark arguments (after --)")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.no_sweep = 1, True
    bench_args = args.bench_args or (QUICK_BENCH if args.quick else DEFAULT_BENCH)
    tbt_slos = [float(x) for x in args.slo_tbt_ms.split(",") if x.strip()]
    os.makedirs(args.out, exist_ok=True)
    log = make_logger(args.out)

    main_cfgs, sweep_cfgs = configurations(args.threads)
    runs = {}
    runs_path = os.path.join(args.out, "runs.json")
    if args.evaluate_only:
        with open(runs_path) as f:
            saved = json.load(f)
        runs, bench_args = saved["runs"], saved["bench_args"]
        args.rounds, args.sweep_rounds = saved["rounds"], saved["sweep_rounds"]
        args.no_sweep = not any(n in runs for n, _ in sweep_cfgs)
    else:
        log(f"start, load average {loadavg()}, bench args: {' '.join(bench_args)}")
    for rnd in range(0 if args.evaluate_only else args.rounds):
        order = main_cfgs if rnd % 2 == 0 else list(reversed(main_cfgs))
        for name, serve_args in order:
            out = os.path.join(args.out, f"{name.replace(' ', '-')}-round{rnd + 1}")
            runs.setdefault(name, []).append(run_config(args, name, serve_args, bench_args, out, log))
    if not args.no_sweep and not args.evaluate_only:
        for rnd in range(args.sweep_rounds):
            for name, serve_args in sweep_cfgs:
                out = os.path.join(args.out, f"{name.replace(' ', '-')}-round{rnd + 1}")
                runs.setdefault(name, []).append(run_config(args, name, serve_args, bench_args, out,
                                                            log))
    if not args.evaluate_only:
        log(f"end, load average {loadavg()}")
        with open(runs_path, "w") as f:
            json.dump({"runs": runs, "bench_args": bench_args, "rounds": args.rounds,
                       "sweep_rounds": args.sweep_rounds}, f)

    evals = {n: [evaluate(r, args.slo_ttft_ms, tbt_slos) for r in rs] for n, rs in runs.items()}
    main_names = [n for n, _ in main_cfgs]
    loads = [x for rs in runs.values() for r in rs for x in (r["load_before"], r["load_after"])
             if x is not None]
    parts = [f"Workload: {' '.join(bench_args)}",
             f"TTFT SLO {args.slo_ttft_ms:g} ms; TBT SLOs {', '.join(f'{t:g}' for t in tbt_slos)} ms "
             f"(TBT = mean of a request's slowest 10% of gaps)",
             f"1-minute load average over the runs: {min(loads):.1f} to {max(loads):.1f}" if loads else "",
             "", f"Main pair (median of {args.rounds} rounds, alternating):", "",
             table(main_names, evals, args.slo_ttft_ms, tbt_slos, ratio_pair=tuple(main_names)),
             "", metrics_table(main_names, runs)]
    if not args.no_sweep:
        sweep_names = ["colocated"] + [n for n, _ in sweep_cfgs[:2]] + \
                      [f"colocated {max(1, args.threads // 2)} thread"] + ["disaggregated"] + \
                      [n for n, _ in sweep_cfgs[2:4]] + ["disaggregated 1P+2D"]
        parts += ["", f"Knob sweep ({args.sweep_rounds} round(s); the default-chunk points (256) "
                      f"are the medians of the main pair):", "",
                  table(sweep_names, evals, args.slo_ttft_ms, tbt_slos), "",
                  metrics_table(sweep_names, runs)]
    text = "\n".join(parts) + "\n"
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(text)
    with open(os.path.join(args.out, "evals.json"), "w") as f:
        json.dump({"evals": evals, "commands": {n: rs[0]["command"] for n, rs in runs.items()},
                   "loads": {n: [(r["load_before"], r["load_after"]) for r in rs]
                             for n, rs in runs.items()}}, f, indent=1)
    print(text)


if __name__ == "__main__":
    main()
