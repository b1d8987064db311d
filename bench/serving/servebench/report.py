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
    if s.get("phases"):
        lines += ["", "| phase | requests | completed | SLO attainment | sent from s | sent until s | "
                      "TTFT p50 ms | TTFT p90 ms | TBT p90 ms |", "|---|---|---|---|---|---|---|---|---|"]
        for ph in s["phases"]:
            lines.append(f"| {ph['phase']} | {ph['requests']} | {ph['completed']} | "
                         f"{100 * ph['slo_attainment']:.1f}% | {_fmt(ph['first_sent_s'])} | "
                         f"{_fmt(ph['last_sent_s'])} | {_fmt(ph['ttft_ms']['p50'])} | "
                         f"{_fmt(ph['ttft_ms']['p90'])} | {_fmt(ph['tbt_ms']['p90'])} |")
    if s.get("utilisation"):
        lines += [""] + utilisation_markdown(s["utilisation"])
    if s["failures"]:
        lines += ["", "Failed requests (first 50):", ""]
        lines += [f"- #{f['index']}: {f['error']}" for f in s["failures"]]
    if s["short_output_requests"]:
        lines += ["", "Requests answered with fewer tokens than asked (first 50):", ""]
        lines += [f"- #{r['index']}: {r['returned']} of {r['requested']}" for r in s["short_output_requests"]]
    return "\n".join(lines) + "\n"


def _pct(v):
    return "n/a" if v is None else f"{100 * v:.1f}%"


def utilisation_markdown(u):
    """Lines describing a utilisation summary (utilisation.compute)."""
    cost = u["core_s_per_request_within_slo"]
    lines = [f"Utilisation of {u['cores']:g} cores over {u['duration_s']:.1f} s "
             f"({u['available_core_s']:.1f} core-s available, {u['scrapes']} scrapes of /metrics): "
             f"busy {u['busy_core_s']:.1f} core-s = **{_pct(u['utilisation'])}**; useful (on "
             f"requests within SLO) {u['useful_core_s']:.1f} core-s = **{_pct(u['useful_utilisation'])}**; "
             f"cost {'n/a' if cost is None else f'{cost:.2f}'} core-s per request within SLO "
             f"({u['requests_within_slo']} requests).",
             "",
             "Useful busy time is approximated by tokens: prefill busy core-s x (prompt tokens of "
             "requests within SLO / prompt tokens of all finished requests) + decode busy core-s x "
             f"(the same share of output tokens: here {_pct(u['prompt_token_share_within_slo'])} and "
             f"{_pct(u['output_token_share_within_slo'])})."
             + (" Some workers export no thread count: 1 thread assumed." if u["threads_assumed"] else ""),
             "", "| worker | role | threads | busy prefill s | busy decode s | core-s | utilisation | "
             "busy share of wall time |", "|---|---|---|---|---|---|---|---|"]
    for w, f in u["workers"].items():
        lines.append(f"| {w} | {f['role']} | {f['threads']:g} | {_fmt(f['busy_s'].get('prefill'), 2)} | "
                     f"{_fmt(f['busy_s'].get('decode'), 2)} | {f['core_s']:.2f} | {_pct(f['utilisation'])} | "
                     f"{_pct(f['busy_share'])} |")
    lines.append("")
    lines.append("By role: " + ", ".join(f"{r} {_pct(v['utilisation'])}" for r, v in u["by_role"].items())
                 + "; computed tokens: " + (", ".join(f"{p} {v:.0f}" for p, v in
                                                      sorted(u["computed_tokens"].items())) or "n/a"))
    for key, what in (("role_switches", "Role switches (from/to)"),
                      ("planner_decisions", "Planner decisions (action/reason)")):
        if u.get(key) is not None:
            lines.append(f"{what}: " + (", ".join(f"{k} {v:g}" for k, v in sorted(u[key].items()))
                                        or "none"))
    return lines


def sweep_markdown(points, target, best_rate, prompts=None):
    """The sweep table; `prompts` says whether each rate had fresh prompts or the same ones."""
    lines = ["# Rate sweep", "",
             f"Highest rate with SLO attainment >= {100 * target:.0f}%: "
             f"{'none' if best_rate is None else f'{best_rate:g} req/s'}", ""]
    if prompts:
        why = (" (prompt texts share no prefix across rates)" if prompts == "fresh per rate" else
               " (later rates may hit what the earlier ones left in the prefix cache)")
        lines += [f"prompts: {prompts}{why}", ""]
    util = any(p["summary"].get("utilisation") for p in points)
    lines += [
             "| rate req/s | completed | failed | goodput req/s | SLO attainment | TTFT p90 ms | TBT p90 ms |"
             + (" utilisation | useful utilisation | core-s per request within SLO |" if util else ""),
             "|---|---|---|---|---|---|---|" + ("---|---|---|" if util else "")]
    for p in points:
        s = p["summary"]
        line = (f"| {p['rate']:g} | {s['completed']} | {s['failed']} | {s['goodput_rps']:.3f} | "
                f"{100 * s['slo_attainment']:.1f}% | {_fmt(s['ttft_ms']['p90'])} | "
                f"{_fmt(s['tbt_ms']['p90'])} |")
        if util:
            u = s.get("utilisation") or {}
            line += (f" {_pct(u.get('utilisation'))} | {_pct(u.get('useful_utilisation'))} | "
                     f"{_fmt(u.get('core_s_per_request_within_slo'), 2)} |")
        lines.append(line)
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


def _steps(series, value):
    """x, y of a post-step line: each scrape interval's value held from its start to its end."""
    x = [series[0]["t"] - series[0]["dt"]] + [row["t"] for row in series]
    y = [value(row) for row in series]
    return x, y + y[-1:]


def plot_utilisation(runs, path, phase_starts=None):
    """runs: [(label, utilisation summary)]. Writes `path` (PNG): utilisation over time (total,
    and by role for a single run), and below it the pool sizes (healthy workers by role, planner
    targets dotted; roles that stay empty are left out) where the server exports them.
    phase_starts: seconds where phases begin (vertical lines). Returns the path, or None if no
    run has a time series."""
    runs = [(label, u) for label, u in runs if u and u.get("series")]
    if not runs:
        return None
    plt = _plt()

    def roles(u, key):
        return sorted({r for row in u["series"] for r, v in row[key].items() if v})

    pools = any(roles(u, "workers") or roles(u, "target") for _, u in runs)
    fig, axes = plt.subplots(2 if pools else 1, 1, figsize=(11, 7 if pools else 4), sharex=True,
                             squeeze=False)
    ax = axes[0][0]
    for label, u in runs:
        ax.step(*_steps(u["series"], lambda row: 100 * (row["utilisation"] or 0)), where="post",
                label=f"{label}: all ({100 * (u['utilisation'] or 0):.0f}% overall)")
        if len(runs) == 1:
            for role in sorted({r for row in u["series"] for r in row["by_role"]}):
                ax.step(*_steps(u["series"], lambda row: 100 * (row["by_role"].get(role) or 0)),
                        where="post", linestyle="--", label=f"{label}: {role} workers")
    ax.set_ylabel(f"busy cores / {runs[0][1]['cores']:g} cores (%)")
    ax.set_title("Utilisation per scrape interval")
    if pools:
        ax2 = axes[1][0]
        for label, u in runs:
            for role in roles(u, "workers"):
                ax2.step(*_steps(u["series"], lambda row: row["workers"].get(role, 0)),
                         where="post", label=f"{label}: {role} workers")
            for role in roles(u, "target"):
                ax2.step(*_steps(u["series"], lambda row: row["target"].get(role, 0)),
                         where="post", linestyle=":", label=f"{label}: {role} target")
        ax2.set_ylim(bottom=0)
        ax2.set_ylabel("workers")
        ax2.set_title("Pool sizes")
    for (a,) in axes:
        for x in phase_starts or ():
            a.axvline(x, color="grey", linestyle="--", linewidth=0.8)
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
    axes[-1][0].set_xlabel("s from the start of the run (dashed: phase starts)"
                           if phase_starts else "s from the start of the run")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
