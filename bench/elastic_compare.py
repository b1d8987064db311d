#!/usr/bin/env python3
"""Elastic pools against static disaggregation and colocated serving on the same cores:
capacity, goodput, utilisation, useful utilisation and cost per request within SLO.

Configurations (each on a fresh `tandem serve`, --threads = --cores):
  static     --mode disaggregated --prefill-workers 1 --decode-workers 1
  colocated  --mode colocated
  elastic    static + --elastic (the planner moves workers between the pools as the load
             shifts); skipped, with a message, when `tandem serve --help` lists no --elastic.
Workloads:
  shifting   synthetic phases back to back (servebench --phases): long prompts / short answers,
             short prompts / long answers, long prompts again; the phases' arrivals are
             rescaled together to each rate of the sweep;
  trace      a slice of the Mooncake conversation trace (lengths scaled, prompts capped,
             Poisson arrivals at each rate by default).
SLOs: TTFT <= --slo-ttft-ms (5000) and TBT <= each of --tbt-slos (50 "tight", 1000 "loose"),
given to the server as well. For every workload, SLO and configuration the serving benchmark
sweeps --rates; capacity is the highest rate at which >= --target (90%) of the requests meet
both SLOs. The other figures are those of the run at that rate (at the lowest rate, marked *,
where no rate meets the target), from the servers' /metrics scraped every second:
utilisation = busy core-seconds of the engines / (cores x wall seconds); useful utilisation =
the part of it spent on requests within SLO (token-weighted, see
bench/serving/servebench/utilisation.py); cost = available core-seconds per request within SLO.

    python3 bench/elastic_compare.py --out bench/out/elastic                   # 1 round, 1-1.5 h
    python3 bench/elastic_compare.py --rounds 3 --out bench/out/elastic-r3      # medians of 3
    python3 bench/elastic_compare.py --workloads shifting --tbt-slos 50 --configs static,elastic
    python3 bench/elastic_compare.py --quick --out bench/out/elastic-quick      # smoke, minutes

Writes --out/tables.md (one table per workload and SLO, printed too), results.json, log.txt,
utilisation-WORKLOAD-tbtX.png (utilisation and pool sizes over time of every configuration at a
common rate) and each run's servebench output under --out/WORKLOAD/CONFIG-tbtX-roundN.
"""
import argparse
import collections
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, ".."))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "serving"))

from compare_servers import make_logger  # noqa: E402
from disagg_compare import loadavg  # noqa: E402
from scheduling_compare import (TRACE, RunError, check_inputs, median_or_none, num, pct, poisson_retimed,  # noqa: E402
                                rotated, run_config, serve_flags, slo_bench_args,
                                slo_server_args, trace_rows, write_rows)
from servebench import report  # noqa: E402

CONFIGS = ("static", "colocated", "elastic")
WORKLOADS = ("shifting", "trace")

# Sizes of a full run and of a --quick smoke. Measured on 2 cores (SmolLM2-135M Q4_1, from the
# workers' busy counters): a prompt of 1,024 tokens costs ~1.6 core-seconds of prefill (~630
# prompt tokens/s per core); decoding gives ~100 tokens per busy core-second at batches of 1-4
# and ~250 at a batch of 8. Shifting: 3 phases of 12 requests, 72 s at 0.5 req/s (144 s at 0.25).
# Trace: 40 requests; at length scale 0.05 (prompts capped at 2,048) the prompts average ~600
# tokens, at output scale 0.25 the answers ~90 tokens.
SIZES = {
    "full": {"phase_requests": 12, "long_in": 1024, "long_out": 16, "short_in": 64,
             "short_out": 256, "trace_requests": 40, "length_scale": 0.05, "output_scale": 0.25,
             "max_input_tokens": 2048, "rates": "0.25,0.5,1,2"},
    "quick": {"phase_requests": 2, "long_in": 256, "long_out": 4, "short_in": 32,
              "short_out": 32, "trace_requests": 4, "length_scale": 0.02, "output_scale": 0.05,
              "max_input_tokens": 512, "rates": "1,4"},
}
FIGURES = ("capacity", "goodput", "utilisation", "useful_utilisation", "cost")


def config_args(config, cores):
    """`tandem serve` flags of a configuration on `cores` cores."""
    disagg = ["--mode", "disaggregated", "--prefill-workers", "1", "--decode-workers", "1",
              "--threads", str(cores)]
    return {"static": disagg, "colocated": ["--mode", "colocated", "--threads", str(cores)],
            "elastic": disagg + ["--elastic"]}[config]


def phases_spec(args):
    long = f"n={args.phase_requests},in={args.long_in},out={args.long_out},rate=1"
    short = f"n={args.phase_requests},in={args.short_in},out={args.short_out},rate=1"
    return f"{long};{short};{long}"


def workload_args(args, name, out):
    """(description, servebench arguments) of a workload; the trace slice is written under out."""
    if name == "shifting":
        spec = phases_spec(args)
        return (f"shifting phases `{spec}` (equal rates within the run; all arrivals rescaled to "
                f"each rate)", ["--phases", spec, "--seed", "0"])
    rows = trace_rows(args.trace, args.trace_start, args.trace_requests)
    if args.trace_arrivals == "poisson":
        rows = poisson_retimed(rows)
    path = os.path.join(out, "trace_slice.jsonl")
    write_rows(path, rows)
    return (f"Mooncake trace lines {args.trace_start}..{args.trace_start + len(rows)}, length "
            f"scale {args.length_scale:g} (prompts <= {args.max_input_tokens} tokens), output scale "
            f"{args.output_scale:g}, {args.trace_arrivals} arrivals rescaled to each rate",
            ["--trace", path, "--length-scale", f"{args.length_scale:g}", "--output-scale",
             f"{args.output_scale:g}", "--max-input-tokens", str(args.max_input_tokens)])


def run_figures(run, target):
    """Capacity (highest rate meeting target) and the figures of the run at that rate (else at
    the lowest rate, `below` True) of one sweep."""
    points = sorted(run["sweep"]["points"], key=lambda p: p["rate"])
    ok = [p for p in points if p["summary"]["slo_attainment"] >= target]
    at = ok[-1] if ok else points[0]
    s, u = at["summary"], at["summary"].get("utilisation") or {}
    return {"capacity": at["rate"] if ok else None, "rate": at["rate"], "below": not ok,
            "goodput": s["goodput_rps"], "utilisation": u.get("utilisation"),
            "useful_utilisation": u.get("useful_utilisation"),
            "cost": u.get("core_s_per_request_within_slo"),
            "attainment_by_rate": {f"{p['rate']:g}": p["summary"]["slo_attainment"] for p in points},
            "utilisation_by_rate": {f"{p['rate']:g}": (p["summary"].get("utilisation") or {})
                                    .get("utilisation") for p in points}}


def summarize_runs(runs, target):
    """Medians over rounds of run_figures (rounds that met no rate count as capacity 0)."""
    per_round = [run_figures(r, target) for r in runs]
    if not per_round:
        return None
    f = {k: median_or_none(r[k] for r in per_round) for k in FIGURES if k != "capacity"}
    caps = [r["capacity"] or 0.0 for r in per_round]
    f["capacity"] = median_or_none(caps)
    f["below"] = all(r["below"] for r in per_round)
    f["rounds"] = len(per_round)
    f["per_round"] = per_round
    f["attainment_by_rate"] = {k: median_or_none(r["attainment_by_rate"].get(k) for r in per_round)
                               for k in per_round[0]["attainment_by_rate"]}
    f["utilisation_by_rate"] = {k: median_or_none(r["utilisation_by_rate"].get(k) for r in per_round)
                                for k in per_round[0]["utilisation_by_rate"]}
    return f


def ratio(a, b):
    return f"{a / b:.2f}x" if a is not None and b else "n/a"


def table(title, desc, figures, configs, skipped, args):
    """Markdown: one row per configuration, then the elastic ratios, then attainment by rate."""
    lines = [f"## {title}", "", f"Workload: {desc}.", "",
             f"| configuration | capacity req/s (≥ {100 * args.target:.0f}% within SLO) | goodput "
             f"req/s | utilisation | useful utilisation | core-s per request within SLO |",
             "|---|---|---|---|---|---|"]
    for c in configs:
        f = figures.get(c)
        if c in skipped:
            lines.append(f"| {c} | skipped: {skipped[c]} |  |  |  |  |")
        elif not f:
            lines.append(f"| {c} | failed (see log.txt) |  |  |  |  |")
        else:
            star = "*" if f["below"] else ""
            cap = f"{f['capacity']:g}" if f["capacity"] else f"none (< {min(args.rates):g})"
            lines.append(f"| {c} | {cap} | {num(f['goodput'])}{star} | {pct(f['utilisation'])}{star} | "
                         f"{pct(f['useful_utilisation'])}{star} | {num(f['cost'])}{star} |")
    e = figures.get("elastic")
    for other in ("colocated", "static"):
        o = figures.get(other)
        if e and o:
            lines.append(f"| elastic / {other} | " + " | ".join(
                ratio(e[k] or None, o[k] or None) for k in FIGURES) + " |")
    starred = any(figures[c]["below"] for c in configs if figures.get(c))
    lines += ["", ("\\* no rate met the target: figures at the lowest rate. " if starred else "")
              + f"Figures are medians over {args.rounds} round(s), each at that round's capacity "
                "rate. Useful utilisation: prefill busy core-s x share of prompt tokens within SLO "
                "+ decode busy core-s x share of output tokens within SLO, over available core-s.", "",
              "| configuration | " + " | ".join(f"{r:g} req/s: within SLO / utilisation"
                                                for r in args.rates) + " |",
              "|---|" + "---|" * len(args.rates)]
    for c in configs:
        f = figures.get(c)
        if f:
            lines.append(f"| {c} | " + " | ".join(
                f"{pct(f['attainment_by_rate'].get(f'{r:g}'))} / {pct(f['utilisation_by_rate'].get(f'{r:g}'))}"
                for r in args.rates) + " |")
    return "\n".join(lines)


def plot(runs_by_config, path, target, log):
    """utilisation over time of every configuration (its round-1 sweep) at the highest rate all
    of them met the target at, else at the lowest rate."""
    sweeps = {c: {p["rate"]: p["summary"] for p in runs[0]["sweep"]["points"]}
              for c, runs in runs_by_config.items() if runs}
    if not sweeps:
        return None
    rates = sorted(set.intersection(*(set(s) for s in sweeps.values())))
    if not rates:
        return None
    good = [r for r in rates if all(s[r]["slo_attainment"] >= target for s in sweeps.values())]
    rate = good[-1] if good else rates[0]
    first = next(iter(sweeps.values()))[rate]
    starts = [ph["first_sent_s"] for ph in first.get("phases", [])[1:]]
    try:
        return report.plot_utilisation([(f"{c} @ {rate:g} req/s", s[rate].get("utilisation"))
                                        for c, s in sweeps.items()], path, starts)
    except ImportError as e:  # no matplotlib: the tables still stand
        log(f"no plot {path}: {e}")
        return None


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Sizes left unset take the full-run values, or the --quick ones.")
    ap.add_argument("--tandem", default=os.path.join(ROOT, "build", "tandem"), help="tandem binary")
    ap.add_argument("--model", help="GGUF model (default: the bundled SmolLM2-135M)")
    ap.add_argument("--trace", default=TRACE, help="Mooncake conversation trace (JSON lines)")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "out", "elastic"))
    ap.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run of minutes")
    ap.add_argument("--rounds", type=int, default=1, help="runs of every configuration (medians)")
    ap.add_argument("--cores", type=int, default=2, help="tandem serve --threads, and the "
                    "denominator of utilisation (default 2)")
    ap.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated subset of "
                    + ", ".join(CONFIGS))
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated subset of "
                    + ", ".join(WORKLOADS))
    ap.add_argument("--rates", help="comma-separated request rates of the sweep, req/s")
    ap.add_argument("--target", type=float, default=0.9, help="share of requests within SLO (0.9)")
    ap.add_argument("--slo-ttft-ms", type=float, default=5000.0)
    ap.add_argument("--tbt-slos", default="50,1000", help="comma-separated TBT SLOs, ms")
    ap.add_argument("--scrape-interval-s", type=float, default=1.0, help="/metrics scrape interval")
    ap.add_argument("--block-tokens", type=int, default=16, help="tandem serve --block-tokens (16)")
    ap.add_argument("--warmup", type=int, default=2, help="unmeasured requests per server")
    ap.add_argument("--bench-timeout-s", type=float, default=3600.0)
    ap.add_argument("--serve-arg", action="append", default=[],
                    help="extra tandem serve argument for every server (--serve-arg=--flag=value)")
    ap.add_argument("--bench-arg", action="append", default=[],
                    help="extra serve_bench.py argument for every run")
    g = ap.add_argument_group("workload sizes")
    g.add_argument("--phase-requests", type=int, help="requests per phase of the shifting workload")
    for k in ("long_in", "long_out", "short_in", "short_out"):
        g.add_argument(f"--{k.replace('_', '-')}", type=int, help="tokens (shifting workload)")
    g.add_argument("--trace-requests", type=int)
    g.add_argument("--trace-start", type=int, default=0)
    g.add_argument("--trace-arrivals", choices=("poisson", "trace"), default="poisson")
    g.add_argument("--length-scale", type=float)
    g.add_argument("--output-scale", type=float)
    g.add_argument("--max-input-tokens", type=int)
    args = ap.parse_args(argv)
    for k, v in SIZES["quick" if args.quick else "full"].items():
        if getattr(args, k) is None:
            setattr(args, k, v)

    def names(text, allowed, what):
        got = [x.strip() for x in text.split(",") if x.strip()]
        if not got or any(x not in allowed for x in got) or len(set(got)) != len(got):
            ap.error(f"{what} must name some of {', '.join(allowed)} once each, not {text!r}")
        return [x for x in allowed if x in got]

    def floats(text, what):
        try:
            vals = sorted({float(x) for x in text.split(",") if x.strip()})
        except ValueError:
            ap.error(f"{what} must be comma-separated numbers")
        if not vals or any(not v > 0 for v in vals):
            ap.error(f"{what} must be positive numbers")
        return vals

    args.config_list = names(args.configs, CONFIGS, "--configs")
    args.workload_list = names(args.workloads, WORKLOADS, "--workloads")
    args.rates = floats(args.rates, "--rates")
    args.tbt_list = floats(args.tbt_slos, "--tbt-slos")
    for k in ("rounds", "cores", "block_tokens", "phase_requests", "long_in", "long_out",
              "short_in", "short_out", "trace_requests", "max_input_tokens"):
        if getattr(args, k) < 1:
            ap.error(f"--{k.replace('_', '-')} must be >= 1")
    for k in ("length_scale", "output_scale", "slo_ttft_ms", "scrape_interval_s", "bench_timeout_s"):
        if not getattr(args, k) > 0:
            ap.error(f"--{k.replace('_', '-')} must be > 0")
    if args.trace_start < 0 or args.warmup < 0:
        ap.error("--trace-start and --warmup must be >= 0")
    if not 0 < args.target <= 1:
        ap.error("--target must be in (0, 1]")
    return args


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    error = check_inputs(args, need_trace="trace" in args.workload_list,
                         trace_hint="pass --trace, or --workloads shifting")
    if error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    log = make_logger(args.out)
    flags = serve_flags(args.tandem)
    skipped = {}
    if "elastic" in args.config_list and "--elastic" not in flags:
        skipped["elastic"] = "this tandem serve has no --elastic"
        log(f"SKIPPING the elastic configuration: `{args.tandem} serve --help` lists no --elastic "
            f"(a build from before elastic pools); the others run")
    with_slo = {"--slo-ttft-ms", "--slo-tbt-ms"} <= flags
    configs = [c for c in args.config_list if c not in skipped]
    log(f"start: {', '.join(configs)} x {', '.join(args.workload_list)} x TBT SLOs "
        f"{', '.join(f'{t:g}' for t in args.tbt_list)} ms, rates {args.rates}, {args.rounds} "
        f"round(s){', quick' if args.quick else ''}; load average {loadavg()}")
    tables, results, failed = [], {}, []
    for wl in args.workload_list:
        out = os.path.join(args.out, wl)
        os.makedirs(out, exist_ok=True)
        try:
            desc, wl_args = workload_args(args, wl, out)
        except RunError as e:
            log(f"FAILED {e}")
            failed.append(str(e))
            continue
        log(f"{wl}: {desc}")
        runs = collections.defaultdict(list)
        combos = [(c, tbt) for tbt in args.tbt_list for c in configs]
        for rnd in range(args.rounds):
            for c, tbt in rotated(combos, rnd):  # configurations interleaved within a round
                serve = config_args(c, args.cores) + (slo_server_args(args.slo_ttft_ms, tbt)
                                                      if with_slo else [])
                bench = [*wl_args, "--sweep-rates", ",".join(f"{r:g}" for r in args.rates),
                         "--sweep-target", f"{args.target:g}",
                         *slo_bench_args(args.slo_ttft_ms, tbt),
                         "--scrape-metrics-interval-s", f"{args.scrape_interval_s:g}",
                         "--cores", str(args.cores)]
                name = f"{c}-tbt{tbt:g}-round{rnd + 1}"
                try:
                    runs[(c, tbt)].append(run_config(args, f"{wl} {name}", serve, bench,
                                                     os.path.join(out, name), log, sweep=True))
                except RunError as e:
                    log(f"FAILED {e}")
                    failed.append(str(e))
        for tbt in args.tbt_list:
            figures = {c: summarize_runs(runs.get((c, tbt), []), args.target) for c in configs}
            figures = {c: f for c, f in figures.items() if f}
            title = (f"{wl}: TTFT ≤ {args.slo_ttft_ms:g} ms, TBT ≤ {tbt:g} ms "
                     f"({'tight' if tbt <= 100 else 'loose'})")
            png = plot({c: runs.get((c, tbt), []) for c in configs},
                       os.path.join(args.out, f"utilisation-{wl}-tbt{tbt:g}.png"), args.target, log)
            text = table(title, desc, figures, args.config_list, skipped, args)
            if png:
                text += f"\n\nUtilisation and pool sizes over time: {os.path.relpath(png, args.out)}"
            print(text + "\n", flush=True)
            tables.append(text)
            results[f"{wl}@{tbt:g}"] = {"workload": desc, "figures": figures, "plot": png,
                                        "runs": {c: runs.get((c, tbt), []) for c in configs}}
    with open(os.path.join(args.out, "tables.md"), "w") as f:
        f.write("\n\n".join(tables) + "\n")
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"argv": sys.argv[1:] if argv is None else argv, "rounds": args.rounds,
                   "quick": args.quick, "skipped": skipped, "server_slos": with_slo,
                   "results": results, "failed": failed}, f, indent=1)
    log(f"end, load average {loadavg()}")
    if failed:
        print(f"{len(failed)} run(s) failed; see {os.path.join(args.out, 'log.txt')}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
