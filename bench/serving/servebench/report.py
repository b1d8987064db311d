"""Markdown summary and PNG plots (matplotlib, Agg backend)."""
import os


def _fmt(v, digits=1):
    return "n/a" if v is None else f"{v:.{digits}f}"


def markdown(summary, config, title="Serving benchmark"):
    s = summary
    lines = [f"# {title}", "",
             f"- target: `{config.get('base_url')}` ({config.get('endpoint')}), model `{config.get('model')}`",
             f"- workload: {config.get('workload_desc')}",
             f"- requests: {s['requests']}, completed {s['completed']}, failed {s['failed']} "
             f"(rejected {s['rejected']}, timed out {s['timed_out']}), fewer tokens than asked: "
             f"{s['short_outputs']}",
             f"- duration {s['duration_s']:.2f} s; throughput {s['request_throughput_rps']:.3f} req/s, "
             f"{s['input_throughput_tps']:.1f} input tok/s, {s['output_throughput_tps']:.1f} output tok/s",
             f"- SLOs: {', '.join(f'{k} <= {v:g}' for k, v in s['slo'].items()) or 'none given'}; "
             f"goodput {s['goodput_rps']:.3f} req/s; SLO attainment (TTFT and TBT) "
             f"{100 * s['slo_attainment']:.1f}%", "",
             "| metric | mean | p50 | p90 | p99 | count |", "|---|---|---|---|---|---|"]
    for k in ("ttft_ms", "tpot_ms", "itl_ms", "tbt_ms", "e2e_ms"):
        st = s[k]
        lines.append(f"| {k} | {_fmt(st['mean'])} | {_fmt(st['p50'])} | {_fmt(st['p90'])} | "
                     f"{_fmt(st['p99'])} | {st['count']} |")
    if s["failures"]:
        lines += ["", "Failed requests (first 50):", ""]
        lines += [f"- #{f['index']}: {f['error']}" for f in s["failures"]]
    if s["short_output_requests"]:
        lines += ["", "Requests answered with fewer tokens than asked (first 50):", ""]
        lines += [f"- #{r['index']}: {r['returned']} of {r['requested']}" for r in s["short_output_requests"]]
    return "\n".join(lines) + "\n"


def sweep_markdown(points, target, best_rate, prompts=None):
    """The sweep table; `prompts` says whether each rate had fresh prompts or the same ones."""
    lines = ["# Rate sweep", "",
             f"Highest rate with SLO attainment >= {100 * target:.0f}%: "
             f"{'none' if best_rate is None else f'{best_rate:g} req/s'}", ""]
    if prompts:
        why = (" (prompt texts share no prefix across rates)" if prompts == "fresh per rate" else
               " (later rates may hit what the earlier ones left in the prefix cache)")
        lines += [f"prompts: {prompts}{why}", ""]
    lines += [
             "| rate req/s | completed | failed | goodput req/s | SLO attainment | TTFT p90 ms | TBT p90 ms |",
             "|---|---|---|---|---|---|---|"]
    for p in points:
        s = p["summary"]
        lines.append(f"| {p['rate']:g} | {s['completed']} | {s['failed']} | {s['goodput_rps']:.3f} | "
                     f"{100 * s['slo_attainment']:.1f}% | {_fmt(s['ttft_ms']['p90'])} | "
                     f"{_fmt(s['tbt_ms']['p90'])} |")
    return "\n".join(lines) + "\n"


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _cdf(ax, values, label):
    v = sorted(x for x in values if x is not None)
    if not v:
        return
    n = len(v)
    ax.step(v, [(i + 1) / n for i in range(n)], where="post", label=label)


def plot_runs(runs, out_dir, slo=None):
    """runs: [(label, records)]. Writes latency_cdf.png and timeline.png; returns the paths."""
    plt = _plt()
    slo = slo or {}
    paths = []
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    for ax, key, name in zip(axes.flat, ("ttft_ms", "tbt_ms", "tpot_ms", "e2e_ms"),
                             ("TTFT", "TBT (slowest 10% of gaps)", "TPOT", "E2E latency")):
        for label, recs in runs:
            _cdf(ax, [r[key] for r in recs if r["ok"]], label)
        if slo.get(key):
            ax.axvline(slo[key], color="red", linestyle="--", linewidth=1, label="SLO")
        ax.set_xlabel(f"{name} (ms)")
        ax.set_ylabel("share of completed requests")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Latency CDFs")
    fig.tight_layout()
    paths.append(os.path.join(out_dir, "latency_cdf.png"))
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)

    fig, axes = plt.subplots(2, 1, figsize=(11, 7), sharex=True)
    for ax, key, name in zip(axes, ("ttft_ms", "tbt_ms"), ("TTFT (ms)", "TBT (ms)")):
        for label, recs in runs:
            ok = [r for r in recs if r["ok"] and r[key] is not None]
            ax.plot([r["sent_s"] for r in ok], [r[key] for r in ok], ".", label=label, markersize=5)
            bad = [r for r in recs if not r["ok"]]
            if bad:
                ax.plot([r["sent_s"] for r in bad], [0] * len(bad), "x", color="red",
                        label=f"{label}: failed")
        if slo.get(key):
            ax.axhline(slo[key], color="red", linestyle="--", linewidth=1, label="SLO")
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[-1].set_xlabel("request sent at (s from start)")
    fig.suptitle("TTFT and TBT over time")
    fig.tight_layout()
    paths.append(os.path.join(out_dir, "timeline.png"))
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)
    return paths


def plot_sweeps(sweeps, out_dir, target):
    """sweeps: [(label, [{"rate", "summary"}])]. Writes attainment_vs_rate.png."""
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for label, points in sweeps:
        rates = [p["rate"] for p in points]
        axes[0].plot(rates, [100 * p["summary"]["slo_attainment"] for p in points], "o-", label=label)
        axes[1].plot(rates, [p["summary"]["goodput_rps"] for p in points], "o-", label=label)
    axes[0].axhline(100 * target, color="red", linestyle="--", linewidth=1, label=f"{100 * target:.0f}%")
    axes[0].set_ylabel("SLO attainment (%)")
    axes[1].set_ylabel("goodput (req/s)")
    for ax in axes:
        ax.set_xlabel("request rate (req/s)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path = os.path.join(out_dir, "attainment_vs_rate.png")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
