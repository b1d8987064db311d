#!/usr/bin/env python3
"""The simulator's study of scheduling at scale (docs/simulation.md): `tandem simulate` over the
Mooncake traces at full scale on simulated LLaMA3-70B-shaped nodes (profiles/), the conductor's
own policies deciding.

Experiments (--experiment, default all):
  capacity  effective request capacity: the highest arrival rate (the trace's, sped up; found by
            bisection) at which >= 90% of the requests meet TTFT <= 30 s and TBT <= 100 / 200 /
            300 ms, for 16 nodes
            disaggregated (the best of several prefill:decode splits) and 16 colocated nodes
            (chunked prefill and prefix caching; the better of two chunk sizes).
  policies  mean TTFT of the placement policies on the conversation trace at its own rate (8P+8D,
            no admission control, so every request is served and TTFTs compare like with like;
            no local prefill, so that only the prefill placement differs).
  overload  admission none / early / predictive at twice the trace's speed on 8P+8D.
  ratio     prefill:decode split at 16 nodes and a fixed rate.
  elastic   elastic pools (the conductor's planner switching instances between prefill and
            decode) against fixed splits, 16 nodes: capacity on a load whose mix shifts (long
            prompts, then long answers, then long prompts) and on the conversation trace, started
            from each split.
  scale     the full conversation trace on 16P+16D (wall time) and 1,000 instances on a
            synthetic load (wall time, events per second).

Writes Markdown tables (and, with matplotlib, PNG plots) under --out, and prints the tables.

    python3 bench/simulation_study.py --out bench/out/simulation          # all, ~10 minutes
    python3 bench/simulation_study.py --experiment policies --out bench/out/simulation
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, ".."))
TRACES = {
    "conversation": os.path.join(ROOT, "..", "shared", "data", "mooncake-traces", "conversation_trace.jsonl"),
    "synthetic": os.path.join(ROOT, "..", "shared", "data", "mooncake-traces", "synthetic_trace.jsonl"),
}
PROFILES = {"A800": os.path.join(ROOT, "profiles", "llama3-70b-8xa800.json"),
            "H200": os.path.join(ROOT, "profiles", "llama3-70b-8xh200.json")}
EXPERIMENTS = ("capacity", "policies", "overload", "ratio", "elastic", "scale")
TTFT_SLO_MS = 30000


def simulate(args, *flags):
    """Summary (dict) of one `tandem simulate` run."""
    cmd = [args.tandem, "simulate", "--json", *map(str, flags)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {p.stderr.strip()}")
    return json.loads(p.stdout)


def trace_rate(path):
    """Mean arrival rate of a trace (requests/s)."""
    first = last = None
    n = 0
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            t = json.loads(line)["timestamp"]
            first = t if first is None else first
            last = t
            n += 1
    return n / max(1e-9, (last - first) / 1000.0)


def plt():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as p
        return p
    except ImportError:
        return None


def max_speed(attainment_at, lo=0.125, hi=32.0, steps=6, target=0.9):
    """The highest speed-up in [lo, hi] at which attainment_at(speed) >= target (attainment
    falls as the rate rises): doubling from lo to find the bracket, then `steps` bisections on
    a log scale. Returns (speed or 0, {speed: attainment})."""
    seen = {}

    def att(sp):
        if sp not in seen:
            seen[sp] = attainment_at(sp)
        return seen[sp]

    if att(lo) < target:
        return 0.0, seen
    good, bad = lo, None
    sp = lo * 2
    while sp <= hi:
        if att(sp) >= target:
            good = sp
        else:
            bad = sp
            break
        sp *= 2
    if bad is None:
        return good, seen
    for _ in range(steps):
        mid = (good * bad) ** 0.5
        if att(mid) >= target:
            good = mid
        else:
            bad = mid
    return good, seen


def capacity(args, out):
    splits = [(8, 8), (10, 6), (12, 4), (14, 2)] if not args.quick else [(10, 6)]
    chunks = [512, 2048] if not args.quick else [512]
    tbt_slos = [100, 200, 300]
    lines = ["## Effective request capacity (16 nodes, TTFT <= 30 s)", "",
             "Highest arrival rate (requests/s: the trace's own rate times a speed-up found by "
             "bisection) at which at least 90% of the requests meet both SLOs (rejected ones count as "
             "misses). Disaggregated: the best of the prefill:decode splits "
             f"{', '.join(f'{p}:{d}' for p, d in splits)}; colocated: the better of chunked-prefill "
             f"chunks of {' and '.join(map(str, chunks))} tokens. Profile: LLaMA3-70B-shaped model on "
             "8x A800 nodes (profiles/llama3-70b-8xa800.json); placement cache-load, admission "
             "predictive for both.", "",
             "| trace | TBT SLO | disaggregated req/s (split) | colocated req/s (chunk) | "
             "disaggregated / colocated |", "|---|---|---|---|---|"]
    curves, data = {}, {}
    for trace in ("conversation", "synthetic"):
        base = trace_rate(TRACES[trace])
        for tbt in tbt_slos:
            best = {"disaggregated": (0.0, None), "colocated": (0.0, None)}
            for kind, configs in (("disaggregated", [("--prefill", p, "--decode", d) for p, d in splits]),
                                  ("colocated", [("--mixed", 16, "--max-batch-tokens", c) for c in chunks])):
                for cfg in configs:
                    label = f"{cfg[1]}:{cfg[3]}" if kind == "disaggregated" else f"chunk {cfg[3]}"

                    def attainment_at(sp, cfg=cfg):
                        return simulate(args, "--profile", PROFILES["A800"], "--trace", TRACES[trace],
                                        "--speed", sp, "--slo-ttft-ms", TTFT_SLO_MS, "--slo-tbt-ms", tbt,
                                        *cfg)["slo_attainment"]

                    sp, seen = max_speed(attainment_at)
                    curves[(trace, tbt, kind, label)] = sorted((k * base, v) for k, v in seen.items())
                    if sp * base > best[kind][0]:
                        best[kind] = (sp * base, label)
            d, c = best["disaggregated"], best["colocated"]
            data[f"{trace}/{tbt}"] = {"disaggregated": d, "colocated": c}
            ratio = f"{d[0] / c[0]:.2f}x" if c[0] else ("inf" if d[0] else "n/a")
            lines.append(f"| {trace} | {tbt} ms | {d[0]:.2f} ({d[1]}) | {c[0]:.2f} ({c[1]}) | {ratio} |")
            print(lines[-1], flush=True)
    p = plt()
    if p:
        fig, axes = p.subplots(2, 3, figsize=(14, 7), sharey=True)
        for ax, (trace, tbt) in zip(axes.flat, [(t, s) for t in ("conversation", "synthetic") for s in tbt_slos]):
            for (tr, sl, kind, label), pts in sorted(curves.items()):
                if tr == trace and sl == tbt:
                    ax.plot([x for x, _ in pts], [100 * y for _, y in pts], marker="o",
                            linestyle="-" if kind == "disaggregated" else "--", label=f"{kind} {label}")
            ax.axhline(90, color="grey", linewidth=0.8)
            ax.set_xscale("log")
            ax.set_title(f"{trace}, TBT <= {tbt} ms")
            ax.set_xlabel("requests/s")
            ax.set_ylabel("SLO attainment %")
        axes.flat[0].legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(os.path.join(out, "capacity.png"), dpi=80)
    return "\n".join(lines), {k: {m: list(v) for m, v in d.items()} for k, d in data.items()}


def policies(args, out):
    speed = 1.0
    lines = [f"## Placement policies (conversation trace at {speed:g}x, 8P+8D, admission none, no "
             "local prefill; last row: cache-load with conditional disaggregation)", "",
             "| policy | mean TTFT s | p90 TTFT s | prefix-cache hit share | of which from the pool "
             "| TBT p90 ms |", "|---|---|---|---|---|---|"]
    data = {}
    # With a KV pool: 1 TB of DRAM per node (the profile's host cache), pooled over the 8
    # prefill nodes; the conductor knows what the pool holds (global cache awareness).
    pool = ["--kv-pool-gb", "8000"]
    for pol, extra in (("random", ["--no-local-prefill"]), ("load-balance", ["--no-local-prefill"]),
                       ("cache-aware", ["--no-local-prefill"]), ("cache-load", ["--no-local-prefill"]),
                       ("cache-load + local prefill", []),
                       ("load-balance + KV pool", ["--no-local-prefill"] + pool),
                       ("cache-load + KV pool", ["--no-local-prefill"] + pool)):
        s = simulate(args, "--profile", PROFILES["A800"], "--trace", TRACES["conversation"], "--speed", speed,
                     "--prefill", 8, "--decode", 8, "--admission", "none", "--placement-policy",
                     pol.split()[0], *extra)
        data[pol] = s
        lines.append(f"| {pol} | {s['ttft_ms']['mean'] / 1000:.2f} | {s['ttft_ms']['p90'] / 1000:.2f} | "
                     f"{s['simulation']['prefix_cache_hit_share']:.3f} | "
                     f"{s['simulation'].get('pool_hit_share', 0):.3f} | {s['tbt_ms']['p90']:.0f} |")
        print(lines[-1], flush=True)
    return "\n".join(lines), {k: {"ttft_mean_ms": v["ttft_ms"]["mean"]} for k, v in data.items()}


def overload(args, out):
    speed = 2.0
    lines = [f"## Overload (conversation trace at {speed:g}x, 8P+8D, TTFT <= 30 s, TBT <= 100 ms)", "",
             "| admission | rejected | completed | met both SLOs | SLO attainment | TTFT p90 s |",
             "|---|---|---|---|---|---|"]
    data = {}
    for adm in ("none", "early", "predictive"):
        s = simulate(args, "--profile", PROFILES["A800"], "--trace", TRACES["conversation"], "--speed", speed,
                     "--prefill", 8, "--decode", 8, "--admission", adm, "--slo-ttft-ms", TTFT_SLO_MS,
                     "--slo-tbt-ms", 100)
        data[adm] = {"rejected": s["rejected"], "met": s["met_all_slos"], "completed": s["completed"]}
        lines.append(f"| {adm} | {s['rejected']} | {s['completed']} | {s['met_all_slos']} | "
                     f"{100 * s['slo_attainment']:.1f}% | {s['ttft_ms']['p90'] / 1000:.1f} |")
        print(lines[-1], flush=True)
    return "\n".join(lines), data


def ratio(args, out):
    speed = 3.0
    lines = [f"## Prefill:decode split (16 nodes, conversation trace at {speed:g}x, TTFT <= 30 s, "
             "TBT <= 100 ms)", "", "| prefill:decode | SLO attainment | goodput req/s | TTFT p90 s | "
             "TBT p90 ms | prefill busy | decode busy |", "|---|---|---|---|---|---|---|"]
    data = {}
    for p in (4, 6, 8, 10, 12, 14):
        s = simulate(args, "--profile", PROFILES["A800"], "--trace", TRACES["conversation"], "--speed", speed,
                     "--prefill", p, "--decode", 16 - p, "--slo-ttft-ms", TTFT_SLO_MS, "--slo-tbt-ms", 100)
        u = s["simulation"]["utilisation"]
        data[f"{p}:{16 - p}"] = s["slo_attainment"]
        ttft90 = s["ttft_ms"]["p90"]
        lines.append(f"| {p}:{16 - p} | {100 * s['slo_attainment']:.1f}% | {s['goodput_rps']:.2f} | "
                     f"{'-' if ttft90 is None else f'{ttft90 / 1000:.1f}'} | "
                     f"{'-' if s['tbt_ms']['p90'] is None else round(s['tbt_ms']['p90'])} | "
                     f"{100 * u.get('prefill', 0):.0f}% | {100 * u.get('decode', 0):.0f}% |")
        print(lines[-1], flush=True)
    plot_utilisation(args, out, speed)
    return "\n".join(lines), data


def plot_utilisation(args, out, speed, split=(12, 4)):
    """Busy share over time of each role's instances (mean and range) for one split: what the
    planner of elastic pools would act on."""
    run_dir = os.path.join(out, f"utilisation-{split[0]}p{split[1]}d")
    simulate(args, "--profile", PROFILES["A800"], "--trace", TRACES["conversation"], "--speed", speed,
             "--prefill", split[0], "--decode", split[1], "--slo-ttft-ms", TTFT_SLO_MS,
             "--slo-tbt-ms", 100, "--utilisation-interval-s", 30, "--out", run_dir)
    p = plt()
    if not p:
        return
    with open(os.path.join(run_dir, "utilisation.json")) as f:
        util = json.load(f)
    dt = util["interval_s"]
    fig, ax = p.subplots(figsize=(9, 3.5))
    for role, color in (("prefill", "tab:blue"), ("decode", "tab:orange")):
        series = [i["busy_share"] for i in util["instances"] if i["role"] == role]
        n = max(len(x) for x in series)
        cols = [[x[k] if k < len(x) else 0.0 for x in series] for k in range(n)]
        t = [k * dt / 60 for k in range(n)]
        ax.plot(t, [100 * sum(c) / len(c) for c in cols], color=color,
                label=f"{role} ({len(series)} instances), mean")
        ax.fill_between(t, [100 * min(c) for c in cols], [100 * max(c) for c in cols], color=color,
                        alpha=0.2)
    ax.set_xlabel("minutes")
    ax.set_ylabel("busy %")
    ax.set_title(f"{split[0]}P+{split[1]}D, conversation trace at {speed:g}x: busy share per 30 s "
                 "(mean, min-max band)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "utilisation.png"), dpi=80)


def shifting_phases(rate):
    """Long prompts / short answers, then short prompts / long answers at three times the
    arrival rate, then long prompts again (requests/s of the first phase: `rate`)."""
    n = 400 if ARGS_QUICK else 1200
    return (f"n={n},in=8000,out=20,rate={rate:g};n={int(2.5 * n)},in=300,out=1500,rate={3 * rate:g};"
            f"n={n},in=8000,out=20,rate={rate:g}")


ARGS_QUICK = False


def elastic(args, out):
    global ARGS_QUICK
    ARGS_QUICK = args.quick
    splits = [(4, 12), (8, 8), (12, 4)]
    slo = ["--slo-ttft-ms", 10000, "--slo-tbt-ms", 100]
    lines = ["## Elastic pools against fixed splits (16 nodes, A800 profile)", "",
             "Capacity: the highest rate (shifting load: requests/s of its first phase; trace: the "
             "trace's speed-up) at which >= 90% of the requests meet TTFT <= 10 s (shifting) / 30 s "
             "(trace) and TBT <= 100 ms. Elastic starts from the split named and the planner "
             "(default settings: high 0.7, low 0.35, dwell 10 s, every 1 s) moves instances.", "",
             "| load | start split | fixed capacity | elastic capacity | elastic / fixed | "
             "elastic / best fixed | switches at that rate |", "|---|---|---|---|---|---|---|"]
    data = {}
    loads = {
        "shifting": lambda speed, extra: simulate(
            args, "--profile", PROFILES["A800"], "--phases", shifting_phases(speed), "--range", 0.5,
            *slo, *extra),
        "conversation": lambda speed, extra: simulate(
            args, "--profile", PROFILES["A800"], "--trace", TRACES["conversation"], "--speed", speed,
            "--slo-ttft-ms", TTFT_SLO_MS, "--slo-tbt-ms", 100, *extra),
    }
    for load, run in loads.items():
        results = {}
        for p, d in splits:
            for mode in ("fixed", "elastic"):
                extra = ["--prefill", p, "--decode", d] + (["--elastic"] if mode == "elastic" else [])
                cap, _ = max_speed(lambda sp: run(sp, extra)["slo_attainment"], lo=0.5, hi=32.0,
                                   steps=4 if args.quick else 5)
                switches = run(cap, extra)["simulation"].get("role_switches", 0) if cap > 0 else 0
                results[(p, d, mode)] = (cap, switches)
        best = max(results[(p, d, "fixed")][0] for p, d in splits)
        for p, d in splits:
            fixed, _ = results[(p, d, "fixed")]
            el, switches = results[(p, d, "elastic")]
            ratio = f"{el / fixed:.2f}" if fixed > 0 else "-"
            lines.append(f"| {load} | {p}:{d} | {fixed:.2f} | {el:.2f} | {ratio} | "
                         f"{el / best if best > 0 else 0:.2f} | {switches} |")
            data[f"{load} {p}:{d}"] = {"fixed": fixed, "elastic": el, "switches": switches}
            print(lines[-1], flush=True)
    return "\n".join(lines), data


def scale(args, out):
    lines = ["## Speed of the simulator (2 cores)", "", "| run | requests | instances | simulated s | "
             "wall s | events | events/s |", "|---|---|---|---|---|---|---|"]
    runs = [("conversation trace, 16P+16D, A800", ["--trace", TRACES["conversation"], "--prefill", 16,
                                                    "--decode", 16], 32)]
    n = 5000 if args.quick else 20000
    runs.append((f"synthetic {n} requests at 200/s, 500P+500D, A800",
                 ["--requests", n, "--rate", 200, "--input-tokens", 4096, "--output-tokens", 256,
                  "--range", 0.5, "--prefill", 500, "--decode", 500], 1000))
    data = {}
    for name, flags, inst in runs:
        t0 = time.time()
        s = simulate(args, "--profile", PROFILES["A800"], *flags)
        wall = time.time() - t0
        ev = s["simulation"]["events"]
        data[name] = {"wall_s": wall, "events": ev}
        lines.append(f"| {name} | {s['requests']} | {inst} | {s['duration_s']:.0f} | {wall:.1f} | {ev} | "
                     f"{ev / max(wall, 1e-9):.0f} |")
        print(lines[-1], flush=True)
    return "\n".join(lines), data


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tandem", default=os.path.join(ROOT, "build", "tandem"))
    ap.add_argument("--experiment", choices=EXPERIMENTS + ("all",), default="all")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "out", "simulation"))
    ap.add_argument("--quick", action="store_true", help="fewer points (a smoke run)")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    chosen = EXPERIMENTS if args.experiment == "all" else (args.experiment,)
    fns = {"capacity": capacity, "policies": policies, "overload": overload, "ratio": ratio, "elastic": elastic,
           "scale": scale}
    tables, data = [], {}
    for name in chosen:
        table, d = fns[name](args, args.out)
        tables.append(table)
        data[name] = d
        with open(os.path.join(args.out, f"{name}.md"), "w") as f:
            f.write(table + "\n")
    with open(os.path.join(args.out, "study.json"), "w") as f:
        json.dump(data, f, indent=1)
    print("\n\n".join(tables))
    return 0


if __name__ == "__main__":
    sys.exit(main())
