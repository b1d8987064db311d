#!/usr/bin/env python3
"""TBT percentiles over time from serving-benchmark runs: every gap between two streamed tokens
of one request (the records' itl_ms, placed in time from sent_s + ttft_ms), grouped by the
window of wall time in which the gap ended; p50 and p99 of each window, per run. Writes a PNG
(two panels: p50 and p99) and prints the table.

    python3 bench/tbt_timeline.py --run colocated=bench/out/long/colocated-round1 \\
        --run disaggregated=bench/out/long/disaggregated-round1 --window-s 20 \\
        --out docs/images/long-context-tbt.png
"""
import argparse
import json
import os
import statistics


def gaps_in_time(records):
    """[(end time s, gap ms)] of every token gap of the completed requests."""
    out = []
    for r in records:
        if not r.get("ok") or r.get("ttft_ms") is None:
            continue
        t = r["sent_s"] + r["ttft_ms"] / 1000.0
        for gap in r.get("itl_ms") or []:
            t += gap / 1000.0
            out.append((t, gap))
    return out


def percentile(values, q):
    values = sorted(values)
    if not values:
        return None
    k = min(len(values) - 1, max(0, int(round(q / 100.0 * (len(values) - 1)))))
    return values[k]


def windows(gaps, window_s):
    """{window start s: [gap ms]}"""
    out = {}
    for t, gap in gaps:
        out.setdefault(int(t // window_s) * window_s, []).append(gap)
    return dict(sorted(out.items()))


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", action="append", required=True, metavar="LABEL=DIR",
                    help="a run directory holding results.json (repeat)")
    ap.add_argument("--window-s", type=float, default=20.0)
    ap.add_argument("--out", help="PNG to write (none: table only)")
    args = ap.parse_args()
    series = []
    for spec in args.run:
        label, path = spec.split("=", 1)
        with open(os.path.join(path, "results.json")) as f:
            series.append((label, windows(gaps_in_time(json.load(f)["requests"]), args.window_s)))
    print(f"| run | window start s | gaps | TBT p50 ms | TBT p99 ms |\n|---|---|---|---|---|")
    for label, w in series:
        for start, gaps in w.items():
            print(f"| {label} | {start:.0f} | {len(gaps)} | {statistics.median(gaps):.1f} | "
                  f"{percentile(gaps, 99):.1f} |")
    if not args.out:
        return
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(2, 1, figsize=(11, 7), sharex=True)
    for ax, q in zip(axes, (50, 99)):
        for label, w in series:
            xs = [s + args.window_s / 2 for s in w]
            ax.plot(xs, [percentile(g, q) for g in w.values()], "o-", label=label, markersize=4)
        ax.set_ylabel(f"TBT p{q} (ms)")
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[-1].set_xlabel(f"time from the start of the run (s), windows of {args.window_s:g} s")
    fig.suptitle("Gaps between streamed tokens over time")
    fig.tight_layout()
    fig.savefig(args.out, dpi=90)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
