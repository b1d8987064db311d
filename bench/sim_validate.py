#!/usr/bin/env python3
"""Validation of the simulator against this machine: the same Mooncake-trace slice served for
real by `tandem serve` (default disaggregated mode: 1 prefill + 1 decode worker of one thread;
and --mode colocated with 2 threads) and simulated by `tandem simulate` with this machine's
measured profiles (`tandem profile --threads 1` and `--threads 2`, taken at the start of the
run). The simulated workload is the real run's: each request's arrival, the prompt tokens the
server counted, the tokens it generated and the trace's hash ids. Table: TTFT and TBT p50 / p90,
real and simulated, and simulated / real (the goal: within 10%).

What an engine's step times leave out (the front door, the hand-off's calls, sampling and
streaming) is calibrated first, per mode, on a separate idle run (one client, short prompts):
the median of real - simulated TTFT becomes the profile's ttft_overhead_s and that of real -
simulated TPOT its step_overhead_s. The table shows the simulation without and with them.

    python3 bench/sim_validate.py --out bench/out/sim-validate            # ~5 minutes
    python3 bench/sim_validate.py --quick --out bench/out/sim-validate-quick
    python3 bench/sim_validate.py --resimulate --rounds 3 --out bench/out/sim-validate  # sim only

With --mock PROFILE the served side is `tandem serve --mock PROFILE` instead: worker processes
whose engines compute nothing and sleep per the profile (e.g. a GPU node's roofline profile),
so that the real conductor, protocol and KV hand-off meet the simulator's model of them:

    python3 bench/sim_validate.py --mock profiles/llama3-70b-8xa800.json --prefill-workers 4 \\
        --decode-workers 4 --length-scale 1 --output-scale 1 --rate 1 --requests 100
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

import scheduling_compare as sc  # noqa: E402
from compare_servers import make_logger  # noqa: E402

CPU_PROFILE_TEMPLATE = os.path.join(ROOT, "profiles", "smollm2-135m-cpu-1t.json")
MODES = {
    # name: (tandem serve flags, tandem simulate flags, profile threads)
    "default": (sc.disagg_args(1, 1, 1), ["--prefill", "1", "--decode", "1"], 1),
    "colocated": (["--mode", "colocated", "--threads", "2"], ["--mixed", "1"], 2),
}


def measured_profile(tandem, model, threads, out_dir):
    """This machine's profile for `threads` engine threads, in the simulator's format (the
    instance fields from the checked-in CPU profile)."""
    cost_path = os.path.join(out_dir, f"cost-{threads}t.json")
    subprocess.run([tandem, "profile", "--model", model, "--threads", str(threads), "--out",
                    cost_path], check=True, capture_output=True, timeout=600)
    with open(cost_path) as f:
        cost = json.load(f)
    with open(CPU_PROFILE_TEMPLATE) as f:
        prof = json.load(f)
    prof["cost"] = cost
    prof["description"] = f"SmolLM2-135M on {threads} thread(s) of this machine (measured now)"
    path = os.path.join(out_dir, f"profile-{threads}t.json")
    with open(path, "w") as f:
        json.dump(prof, f, indent=1)
    return path


def simulated_trace(results_path, rows, path):
    """The real run's requests as a trace for the simulator: when they were sent, prompt tokens
    counted by the server, tokens generated, hash ids (rows: the workload's, None for a
    synthetic one); failed requests are left out. Returns the real records kept, in order."""
    with open(results_path) as f:
        res = json.load(f)
    kept = sorted((r for r in res["requests"] if r["ok"]), key=lambda r: r["sent_s"])
    with open(path, "w") as f:
        for r in kept:
            f.write(json.dumps({"timestamp": r["sent_s"] * 1000.0,
                                "input_length": r["prompt_tokens"] or r["input_tokens_target"],
                                "output_length": r["output_tokens"],
                                "hash_ids": rows[r["index"]]["hash_ids"] if rows else []}) + "\n")
    return kept


def run_simulation(args, profile, trace, block_tokens, sim_args, out_dir, overheads=(0.0, 0.0)):
    """`tandem simulate` of `trace`: (summary, request records in arrival order)."""
    subprocess.run([args.tandem, "simulate", "--profile", profile, "--trace", trace,
                    "--trace-block-tokens", str(block_tokens), "--out", out_dir,
                    "--ttft-overhead-ms", f"{overheads[0]:.3f}", "--step-overhead-ms",
                    f"{overheads[1]:.3f}", *sim_args],
                   capture_output=True, text=True, check=True, timeout=600)
    with open(os.path.join(out_dir, "results.json")) as f:
        res = json.load(f)
    return res["summary"], res["requests"]


def calibrate(args, mode, serve_args, sim_args, profile, out_dir, log):
    """(ttft_overhead_ms, step_overhead_ms) of `mode` from an idle run: one client, short
    prompts, real against simulated without overheads."""
    bench_args = ["--num-requests", "12", "--input-len", "64", "--output-len", "16",
                  "--closed-loop", "1"]
    if not args.resimulate:
        sc.run_config(args, f"{mode}-calibration", serve_args, bench_args, out_dir, log)
    trace = os.path.join(out_dir, "sim_trace.jsonl")
    real = simulated_trace(os.path.join(out_dir, "results.json"), None, trace)
    _, sim = run_simulation(args, profile, trace, 16, sim_args, os.path.join(out_dir, "sim"))
    ttft = statistics.median(r["ttft_ms"] - s["ttft_ms"] for r, s in zip(real, sim))
    step = statistics.median(r["tpot_ms"] - s["tpot_ms"] for r, s in zip(real, sim)
                             if r["tpot_ms"] is not None and s["tpot_ms"] is not None)
    log(f"{mode}: calibrated overheads: TTFT {ttft:.1f} ms, decode step {step:.2f} ms")
    return max(0.0, ttft), max(0.0, step)


def paired_ratios(real_path, sim_path):
    """{metric: [calibrated simulated / real per request]} for TTFT and TPOT, requests matched
    by index: percentiles of a small slice move with one request near them, the ratio of each
    request's own figures does not."""
    with open(real_path) as f:
        real = {r["index"]: r for r in json.load(f)["requests"]}
    with open(sim_path) as f:
        sim = json.load(f)["requests"]
    out = {"ttft": [], "tpot": []}
    for s in sim:
        r = real.get(s["index"])
        for m in out:
            if r and r.get(m + "_ms") and s.get(m + "_ms"):
                out[m].append(s[m + "_ms"] / r[m + "_ms"])
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tandem", default=os.path.join(ROOT, "build", "tandem"))
    ap.add_argument("--model", default=sc.MODEL)
    ap.add_argument("--trace", default=sc.TRACE)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "out", "sim-validate"))
    ap.add_argument("--quick", action="store_true", help="a smoke run (a minute)")
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--length-scale", type=float, default=0.02)
    ap.add_argument("--output-scale", type=float, default=0.1)
    ap.add_argument("--rate", type=float, default=0.5, help="Poisson arrivals, requests/s")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--modes", default="default,colocated")
    ap.add_argument("--mock", metavar="PROFILE",
                    help="instead of the modes: `tandem serve --mock PROFILE` (engines that sleep "
                         "per the profile, e.g. profiles/llama3-70b-8xa800.json) with "
                         "--prefill-workers + --decode-workers workers through the real "
                         "conductor, against the simulator on the same profile")
    ap.add_argument("--prefill-workers", type=int, default=4)
    ap.add_argument("--decode-workers", type=int, default=4)
    ap.add_argument("--resimulate", action="store_true",
                    help="simulate again the real runs already in --out (no servers started; "
                         "the profiles measured then)")
    args = ap.parse_args(argv)
    if args.quick:
        args.requests = min(args.requests, 8)
    # What scheduling_compare.run_config reads.
    args.block_tokens, args.serve_arg, args.bench_arg, args.warmup = 16, [], [], 2
    args.bench_timeout_s = 1800.0
    os.makedirs(args.out, exist_ok=True)
    log = make_logger(args.out)
    rows = sc.poisson_retimed(sc.trace_rows(args.trace, args.start, args.requests))
    slice_path = os.path.join(args.out, "trace_slice.jsonl")
    sc.write_rows(slice_path, rows)
    per_block = sc.prompts.trace_block_tokens(args.length_scale, sc.TRACE_BLOCK_TOKENS)
    bench_args = ["--trace", slice_path, "--length-scale", f"{args.length_scale:g}",
                  "--output-scale", f"{args.output_scale:g}", "--time-scale", f"{1.0 / args.rate:.6g}"]
    keys = ("ttft_p50", "ttft_p90", "tbt_p50", "tbt_p90")
    figures, overheads, paired = {}, {}, {}
    modes = dict(MODES)
    if args.mock:
        args.mock = os.path.abspath(args.mock)
        p, d = args.prefill_workers, args.decode_workers
        modes = {"mock": (["--prefill-workers", str(p), "--decode-workers", str(d), "--threads", "2",
                           "--mock", args.mock], ["--prefill", str(p), "--decode", str(d)], 0)}
        args.modes = "mock"
    for mode in [m for m in args.modes.split(",") if m]:
        serve_args, sim_args, threads = modes[mode]
        per_round = {k: [] for k in keys}
        pairs = {"ttft": [], "tpot": []}
        for rnd in range(args.rounds):
            out_dir = os.path.join(args.out, f"{mode}-round{rnd + 1}")
            os.makedirs(out_dir, exist_ok=True)
            if args.mock:  # the mock engines' own profile: nothing to measure
                profile = args.mock
            elif args.resimulate:  # the real runs of an earlier invocation, simulated again
                profile = os.path.join(out_dir, f"profile-{threads}t.json")
                if not os.path.exists(profile):  # made by an older version of this script
                    profile = os.path.join(args.out, f"profile-{threads}t.json")
            else:
                profile = measured_profile(args.tandem, args.model, threads, out_dir)
            over = calibrate(args, mode, serve_args, sim_args, profile,
                             os.path.join(out_dir, "calibration"), log)
            overheads.setdefault(mode, []).append(over)
            if args.resimulate:
                with open(os.path.join(out_dir, "summary.json")) as f:
                    run = {"summary": json.load(f)}
            else:
                run = sc.run_config(args, mode, serve_args, bench_args, out_dir, log)
            sim_trace = os.path.join(out_dir, "sim_trace.jsonl")
            n = len(simulated_trace(os.path.join(out_dir, "results.json"), rows, sim_trace))
            s_raw, _ = run_simulation(args, profile, sim_trace, per_block, sim_args,
                                      os.path.join(out_dir, "sim-raw"))
            s_cal, _ = run_simulation(args, profile, sim_trace, per_block, sim_args,
                                      os.path.join(out_dir, "sim"), over)
            s_real = run["summary"]
            for m, v in paired_ratios(os.path.join(out_dir, "results.json"),
                                      os.path.join(out_dir, "sim", "results.json")).items():
                pairs[m].extend(v)
            for k in keys:
                metric, q = k.split("_")
                per_round[k].append((s_real[metric + "_ms"][q], s_raw[metric + "_ms"][q],
                                     s_cal[metric + "_ms"][q]))
            log(f"{mode} round {rnd + 1}: {n} requests; TTFT p50 real {s_real['ttft_ms']['p50']:.0f} ms, "
                f"simulated {s_raw['ttft_ms']['p50']:.0f} ms, calibrated {s_cal['ttft_ms']['p50']:.0f} ms")
        figures[mode] = {k: tuple(statistics.median(x[i] for x in v) for i in range(3))
                         for k, v in per_round.items()}
        paired[mode] = {m: (len(v), *[statistics.quantiles(v, n=10)[i] for i in (0, 4, 8)])
                        for m, v in pairs.items() if len(v) >= 2}
    what = (f"mock engines ({os.path.relpath(args.mock, ROOT)}, {args.prefill_workers} prefill + "
            f"{args.decode_workers} decode workers through the real conductor)" if args.mock
            else "the real system")
    lines = [f"## Simulator against {what} (median of {args.rounds} round(s))", "",
             f"Workload: trace lines {args.start}..{args.start + args.requests}, length scale "
             f"{args.length_scale:g}, output scale {args.output_scale:g}, Poisson arrivals at "
             f"{args.rate:g}/s; simulated with the profiles measured at the start of each round, "
             "without and with the overheads calibrated on an idle run of the mode ("
             + "; ".join(f"{m}: TTFT +{statistics.median(o[0] for o in v):.0f} ms, step "
                         f"+{statistics.median(o[1] for o in v):.1f} ms" for m, v in overheads.items())
             + ").", "",
             "| mode | metric | real ms | simulated ms | simulated / real | calibrated ms | "
             "calibrated / real |", "|---|---|---|---|---|---|---|"]
    for mode, f in figures.items():
        for k in keys:
            real, raw, cal = f[k]
            r1 = f"{raw / real:.2f}" if real else "n/a"
            r2 = f"{cal / real:.2f}" if real else "n/a"
            lines.append(f"| {mode} | {k.replace('_', ' ')} | {real:.1f} | {raw:.1f} | {r1} | "
                         f"{cal:.1f} | {r2} |")
    lines += ["", "Request by request (all rounds; calibrated simulated / real of each request's own "
              "figure):", "", "| mode | metric | requests | p10 | median | p90 |", "|---|---|---|---|---|---|"]
    for mode, f in paired.items():
        for m, (n, p10, p50, p90) in f.items():
            lines.append(f"| {mode} | {m} | {n} | {p10:.2f} | {p50:.2f} | {p90:.2f} |")
    table = "\n".join(lines)
    with open(os.path.join(args.out, "validation.md"), "w") as f:
        f.write(table + "\n")
    with open(os.path.join(args.out, "validation.json"), "w") as f:
        json.dump({"figures": figures, "paired": paired, "args": vars(args)}, f, indent=1, default=str)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
