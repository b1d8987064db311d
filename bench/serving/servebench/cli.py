"""Command line of the serving benchmark (`tandem bench serve` runs this)."""
import argparse
import asyncio
import json
import math
import os
import socket
import sys

from . import client, metrics, report, runner, scrape, utilisation, workload


class Config:
    """What the runner needs to know about how to send requests."""

    def __init__(self, args, model):
        self.base_url = args.base_url
        self.api_key = args.api_key
        self.endpoint = args.endpoint
        self.model = model
        self.temperature = args.temperature
        self.ignore_eos = not args.no_ignore_eos
        self.extra_body = args.extra_body
        self.request_timeout_s = args.request_timeout_s
        self.max_concurrency = args.max_concurrency
        self.closed_loop = args.closed_loop
        self.open_loop = not args.closed_loop
        self.warmup = args.warmup
        self.scrape_interval_s = args.scrape_metrics_interval_s


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="tandem bench serve",
        description="Replay a Mooncake trace or a synthetic workload against an OpenAI-compatible "
                    "server and report TTFT, TPOT, ITL, TBT, E2E, throughput, goodput and SLO "
                    "attainment (JSON, Markdown, PNG).")
    t = p.add_argument_group("target")
    t.add_argument("--base-url", help="server base URL, e.g. http://127.0.0.1:8000")
    t.add_argument("--endpoint", choices=("completions", "chat"), default="completions",
                   help="/v1/completions with a text prompt (default) or /v1/chat/completions")
    t.add_argument("--model", help="model name to send (default: the first of /v1/models)")
    t.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"), help="bearer token")
    t.add_argument("--request-timeout-s", type=float, default=600.0,
                   help="a request not finished in this time counts as failed (default 600)")
    t.add_argument("--max-concurrency", type=int, default=0,
                   help="open loop: at most this many requests in flight (0 = no limit)")
    t.add_argument("--closed-loop", type=int, default=0, metavar="C",
                   help="closed loop: C clients, each sends its next request when the last ends")
    t.add_argument("--temperature", type=float, default=0.0)
    t.add_argument("--no-ignore-eos", action="store_true",
                   help="do not send ignore_eos (for servers that reject unknown fields)")
    t.add_argument("--extra-body", type=json.loads, default={},
                   help="JSON object merged into every request body")
    t.add_argument("--warmup", type=int, default=0, help="unmeasured short requests sent first")
    w = p.add_argument_group("trace workload")
    w.add_argument("--trace", help="Mooncake trace (JSON lines); without it the workload is synthetic")
    w.add_argument("--trace-start", type=int, default=0, help="skip this many trace lines")
    w.add_argument("--max-requests", type=int, help="take at most this many requests")
    w.add_argument("--length-scale", type=float, default=1.0,
                   help="multiply input (and output) lengths; 512-token blocks shrink with it")
    w.add_argument("--output-scale", type=float, help="multiply output lengths (default: --length-scale)")
    w.add_argument("--time-scale", type=float, default=1.0,
                   help="multiply arrival times (2 = half the rate; 0 = all at once)")
    w.add_argument("--block-tokens", type=int, default=512, help="tokens per hash id in the trace")
    w.add_argument("--max-input-tokens", type=int, help="cap on scaled prompt lengths")
    w.add_argument("--prompt-salt", type=int, default=0,
                   help="build the prompt texts under this salt (trace and synthetic): the same "
                        "lengths and prefix sharing, in text that shares no prefix with other "
                        "salts, e.g. to rerun a workload against a server whose prefix cache "
                        "holds an earlier run (default 0)")
    s = p.add_argument_group("synthetic workload")
    s.add_argument("--num-requests", type=int, default=100)
    s.add_argument("--input-len", type=int, default=128)
    s.add_argument("--output-len", type=int, default=64)
    s.add_argument("--input-range", type=float, default=0.0,
                   help="lengths uniform in [len*(1-r), len*(1+r)] (0 = fixed)")
    s.add_argument("--output-range", type=float, default=0.0)
    s.add_argument("--request-rate", type=float, default=math.inf, help="requests/s (default inf)")
    s.add_argument("--burstiness", type=float, default=1.0,
                   help="gamma shape of the gaps: 1 = Poisson, < 1 burstier, > 1 more regular")
    s.add_argument("--shared-prefix-len", type=int, default=0,
                   help="tokens of shared prefix in front of each prompt")
    s.add_argument("--num-prefixes", type=int, default=1, help="distinct shared prefixes")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--phases", metavar="SPEC;SPEC;...",
                   help="a shifting workload: phases run back to back (each starts after the "
                        "previous one's last arrival); SPEC is comma-separated key=value with n "
                        "(requests), in and out (tokens), rate (req/s, default inf), e.g. "
                        "\"n=20,in=1024,out=16,rate=1;n=20,in=64,out=256,rate=1\". Replaces "
                        "--num-requests, --input-len, --output-len and --request-rate; the ranges, "
                        "--burstiness and shared prefixes apply to every phase; --sweep-rates "
                        "rescales all arrivals together (the phases' relative rates kept)")
    o = p.add_argument_group("SLOs and sweep")
    o.add_argument("--slo-ttft-ms", type=float)
    o.add_argument("--slo-tbt-ms", type=float)
    o.add_argument("--slo-tpot-ms", type=float)
    o.add_argument("--slo-e2e-ms", type=float)
    o.add_argument("--sweep-rates", help="comma-separated request rates: run the workload at each "
                                         "(trace arrivals rescaled) and find the highest rate "
                                         "meeting --sweep-target")
    o.add_argument("--sweep-target", type=float, default=0.9, help="SLO attainment to meet (0.9)")
    o.add_argument("--sweep-same-prompts", action="store_true",
                   help="send the same prompt texts at every rate of the sweep (later rates then "
                        "hit the prefix cache the earlier ones filled); by default each rate gets "
                        "fresh prompts (salt --prompt-salt + i for the i-th rate): the same "
                        "lengths and prefix sharing within a rate, nothing shared across rates")
    m = p.add_argument_group("server metrics and utilisation")
    m.add_argument("--scrape-metrics-interval-s", type=float, default=1.0,
                   help="read BASE_URL/metrics this often during the run into "
                        "metrics_timeseries.jsonl and report utilisation from the workers' busy "
                        "counters where the server exports them (0 = off; default 1)")
    m.add_argument("--cores", type=int, default=os.cpu_count() or 1,
                   help="cores available to the server, the denominator of utilisation "
                        "(default: this machine's, %(default)s)")
    r = p.add_argument_group("output")
    r.add_argument("--out", help="output directory (created)")
    r.add_argument("--label", help="name of this run in plots and comparisons")
    r.add_argument("--no-plots", action="store_true")
    r.add_argument("--no-progress", action="store_true")
    r.add_argument("--compare", nargs="+", metavar="RUN_DIR",
                   help="do not run: overlay the results of earlier runs into --out")
    args = p.parse_args(argv)
    if args.compare:
        if not args.out:
            p.error("--compare needs --out")
        return args
    if not args.base_url:
        p.error("--base-url is required")
    if not args.out:
        p.error("--out is required")
    try:
        client.split_url(args.base_url)
    except ValueError as e:
        p.error(str(e))
    if not isinstance(args.extra_body, dict):
        p.error("--extra-body must be a JSON object")
    for name in ("request_timeout_s",):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be > 0")
    if args.max_concurrency < 0 or args.closed_loop < 0 or args.warmup < 0:
        p.error("--max-concurrency, --closed-loop and --warmup must be >= 0")
    if args.closed_loop and args.sweep_rates:
        p.error("--sweep-rates needs an open loop (drop --closed-loop)")
    if args.prompt_salt < 0:
        p.error("--prompt-salt must be >= 0")
    if not args.scrape_metrics_interval_s >= 0:
        p.error("--scrape-metrics-interval-s must be >= 0")
    if args.cores < 1:
        p.error("--cores must be >= 1")
    args.phase_list = None
    if args.phases is not None:
        if args.trace:
            p.error("--phases is a synthetic workload: drop --trace")
        try:
            args.phase_list = workload.parse_phases(args.phases)
        except workload.WorkloadError as e:
            p.error(str(e))
    if args.sweep_same_prompts and not args.sweep_rates:
        p.error("--sweep-same-prompts needs --sweep-rates")
    if not 0 < args.sweep_target <= 1:
        p.error("--sweep-target must be in (0, 1]")
    for k in ("slo_ttft_ms", "slo_tbt_ms", "slo_tpot_ms", "slo_e2e_ms"):
        v = getattr(args, k)
        if v is not None and v <= 0:
            p.error(f"--{k.replace('_', '-')} must be > 0")
    if args.sweep_rates:
        try:
            args.rates = [float(x) for x in args.sweep_rates.split(",") if x.strip()]
        except ValueError:
            p.error("--sweep-rates must be comma-separated numbers")
        if not args.rates or any(x <= 0 for x in args.rates):
            p.error("--sweep-rates must be positive numbers")
    return args


def sweep_salts(args):
    """The prompt salt of each rate of the sweep: fresh prompts per rate unless
    --sweep-same-prompts."""
    if args.sweep_same_prompts:
        return [args.prompt_salt] * len(args.rates)
    return [args.prompt_salt + i for i in range(len(args.rates))]


def sweep_prompts_note(args):
    return "same at every rate" if args.sweep_same_prompts else "fresh per rate"


def build_workload(args, rate=None, salt=None):
    salt = args.prompt_salt if salt is None else salt
    salt_desc = f", prompt salt {salt}" if salt else ""
    if args.trace:
        reqs = workload.load_trace(args.trace, args.trace_start, args.max_requests, args.length_scale,
                                   args.output_scale, args.time_scale, args.block_tokens,
                                   args.max_input_tokens, salt)
        desc = (f"trace {os.path.basename(args.trace)} lines {args.trace_start}.."
                f"{args.trace_start + len(reqs)}, length scale {args.length_scale:g}"
                f"{'' if args.output_scale is None else f', output scale {args.output_scale:g}'}, "
                f"time scale {args.time_scale:g}")
        if rate is not None:
            reqs = workload.retime(reqs, rate)
            desc += f", arrivals rescaled to {rate:g} req/s"
        return reqs, desc + salt_desc
    if args.phase_list:
        reqs = workload.phased(args.phase_list, args.input_range, args.output_range,
                               args.burstiness, args.shared_prefix_len, args.num_prefixes,
                               args.seed, salt)
        desc = (f"{len(args.phase_list)} phases back to back: "
                + "; ".join(f"{ph['n']} requests, input {ph['in']}, output {ph['out']}, rate "
                            f"{ph['rate']:g} req/s" for ph in args.phase_list)
                + f" (ranges +-{args.input_range:g} / +-{args.output_range:g}, burstiness "
                  f"{args.burstiness:g})")
        if args.max_requests is not None:
            reqs = reqs[:args.max_requests]
            desc += f", first {len(reqs)} requests"
        if args.closed_loop:
            desc += f", closed loop at {args.closed_loop}"
        if rate is not None:
            reqs = workload.retime(reqs, rate)
            desc += f", arrivals rescaled to {rate:g} req/s"
        return reqs, desc + salt_desc
    r = args.request_rate if rate is None else rate
    n = args.num_requests if args.max_requests is None else min(args.num_requests, args.max_requests)
    reqs = workload.synthetic(n, args.input_len, args.output_len, args.input_range,
                              args.output_range, r, args.burstiness, args.shared_prefix_len,
                              args.num_prefixes, args.seed, salt)
    desc = (f"synthetic {n} requests, input {args.input_len} (+-{args.input_range:g}), output "
            f"{args.output_len} (+-{args.output_range:g}), "
            + (f"closed loop at {args.closed_loop}" if args.closed_loop else
               f"rate {r:g} req/s, burstiness {args.burstiness:g}")
            + (f", {args.num_prefixes} shared prefixes of {args.shared_prefix_len} tokens"
               if args.shared_prefix_len else "") + salt_desc)
    return reqs, desc


def _check_reachable(base_url, timeout_s=5.0):
    _, host, port, _ = client.split_url(base_url)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return None
    except OSError as e:
        return f"cannot connect to {host}:{port}: {e.strerror or e}"


def _write_json(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)


def run_once(args, cfg, out_dir, rate=None, salt=None):
    salt = args.prompt_salt if salt is None else salt
    reqs, desc = build_workload(args, rate, salt)
    os.makedirs(out_dir, exist_ok=True)
    scraper = None
    if args.scrape_metrics_interval_s > 0 and scrape.UNAVAILABLE:
        print(f"note: {scrape.UNAVAILABLE}", file=sys.stderr)
    elif args.scrape_metrics_interval_s > 0:
        scraper = scrape.Scraper(cfg.base_url, cfg.api_key, args.scrape_metrics_interval_s,
                                 os.path.join(out_dir, "metrics_timeseries.jsonl"))
    records, duration = asyncio.run(runner.run_workload(reqs, cfg, not args.no_progress, scraper))
    slo = {"ttft_ms": args.slo_ttft_ms, "tbt_ms": args.slo_tbt_ms, "tpot_ms": args.slo_tpot_ms,
           "e2e_ms": args.slo_e2e_ms}
    summary = metrics.summarize(records, duration, slo)
    summary["utilisation"] = None
    if scraper is not None:
        summary["metrics_scrape"] = {"interval_s": args.scrape_metrics_interval_s,
                                     "scrapes": len(scraper.scrapes), "errors": scraper.errors,
                                     "last_error": scraper.last_error}
        summary["utilisation"] = utilisation.compute(scraper.scrapes, records, duration, args.cores)
    config = {"base_url": cfg.base_url, "endpoint": cfg.endpoint, "model": cfg.model,
              "workload_desc": desc, "label": args.label or cfg.base_url, "rate": rate,
              "prompt_salt": salt, "argv": sys.argv[1:]}
    _write_json(os.path.join(out_dir, "summary.json"), summary)
    _write_json(os.path.join(out_dir, "results.json"),
                {"config": config, "summary": summary, "requests": records})
    with open(os.path.join(out_dir, "summary.md"), "w") as f:
        f.write(report.markdown(summary, config))
    if not args.no_plots:
        report.plot_runs([(config["label"], records)], out_dir, summary["slo"])
        if summary["utilisation"]:
            report.plot_utilisation([(config["label"], summary["utilisation"])],
                                    os.path.join(out_dir, "utilisation.png"),
                                    [ph["first_sent_s"] for ph in summary.get("phases", [])[1:]])
    return summary, config


def compare(args):
    runs, sweeps, rows = [], [], []
    labels = args.label.split(",") if args.label else []
    for i, d in enumerate(args.compare):
        path = os.path.join(d, "results.json")
        sweep_path = os.path.join(d, "sweep.json")
        label = labels[i] if i < len(labels) else os.path.basename(os.path.normpath(d))
        if os.path.exists(path):
            with open(path) as f:
                res = json.load(f)
            runs.append((label, res["requests"]))
            rows.append((label, res["summary"]))
        elif os.path.exists(sweep_path):
            with open(sweep_path) as f:
                sweeps.append((label, json.load(f)["points"]))
        else:
            raise workload.WorkloadError(f"{d}: neither results.json nor sweep.json")
    os.makedirs(args.out, exist_ok=True)
    lines = ["# Comparison", "", "| run | completed | failed | req/s | out tok/s | goodput req/s | "
             "SLO attainment | TTFT p50 ms | TTFT p90 ms | TPOT p50 ms | TBT p90 ms | E2E p50 ms |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for label, s in rows:
        f = report._fmt
        lines.append(f"| {label} | {s['completed']} | {s['failed']} | {s['request_throughput_rps']:.3f} | "
                     f"{s['output_throughput_tps']:.1f} | {s['goodput_rps']:.3f} | "
                     f"{100 * s['slo_attainment']:.1f}% | {f(s['ttft_ms']['p50'])} | "
                     f"{f(s['ttft_ms']['p90'])} | {f(s['tpot_ms']['p50'])} | {f(s['tbt_ms']['p90'])} | "
                     f"{f(s['e2e_ms']['p50'])} |")
    with open(os.path.join(args.out, "compare.md"), "w") as fh:
        fh.write("\n".join(lines) + "\n")
    if not args.no_plots:
        if runs:
            report.plot_runs(runs, args.out, rows[0][1]["slo"] if rows else None)
        if sweeps:
            report.plot_sweeps(sweeps, args.out, args.sweep_target)
    print("\n".join(lines))
    return 0


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        if args.compare:
            return compare(args)
        build_workload(args)  # validate the workload before touching the server
        err = _check_reachable(args.base_url)
        if err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        model = args.model or asyncio.run(runner.discover_model(args.base_url, args.api_key))
        cfg = Config(args, model)
        if not args.sweep_rates:
            summary, _ = run_once(args, cfg, args.out)
            print(open(os.path.join(args.out, "summary.md")).read())
            return 0
        points = []
        note = sweep_prompts_note(args)
        for rate, salt in zip(args.rates, sweep_salts(args)):
            sub = os.path.join(args.out, f"rate_{rate:g}")
            summary, _ = run_once(args, cfg, sub, rate, salt)
            points.append({"rate": rate, "prompt_salt": salt, "dir": sub, "summary": summary})
            print(f"[bench] rate {rate:g} req/s (prompts {note}, salt {salt}): SLO attainment "
                  f"{100 * summary['slo_attainment']:.1f}%, goodput {summary['goodput_rps']:.3f} req/s",
                  file=sys.stderr)
        passing = [p["rate"] for p in points if p["summary"]["slo_attainment"] >= args.sweep_target]
        best = max(passing) if passing else None
        sweep = {"target": args.sweep_target, "max_rate_meeting_target": best, "prompts": note,
                 "points": points}
        _write_json(os.path.join(args.out, "sweep.json"), sweep)
        md = report.sweep_markdown(points, args.sweep_target, best, note)
        with open(os.path.join(args.out, "sweep.md"), "w") as f:
            f.write(md)
        if not args.no_plots:
            report.plot_sweeps([(args.label or args.base_url, points)], args.out, args.sweep_target)
        print(md)
        return 0
    except workload.WorkloadError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
