"""How much of the machine the server used during a run, from the scraped worker counters
(scrape.py), and how much of that went to requests that met their SLOs.

- busy core-seconds: the increase of tandem_worker_busy_core_seconds_total (each forward
  pass's seconds times the threads it ran on, so exact when elastic pools resize a worker) of
  every worker and phase; from a server without it, the increase of
  tandem_worker_busy_seconds_total times the worker's engine threads (tandem_worker_threads)
  at the end of each scrape interval;
- utilisation: busy core-seconds / (cores x wall seconds of the run), i.e. busy over available
  core-seconds; per worker and per role the same numerator restricted to them, over the same
  denominator (so the workers' shares add up to the total);
- useful utilisation: the busy core-seconds spent on requests that met every SLO given. The
  server does not count busy time per request, so it is approximated by tokens: the prefill
  busy core-seconds times the share of prompt tokens (of the finished requests) that belong to
  requests within SLO, plus the decode busy core-seconds times the same share of output tokens,
  over the available core-seconds. A prefill spent on a request that then failed or was
  rejected is in the busy time but in neither token count, so it is spread over the finished
  requests: useful utilisation is an upper bound when requests fail after their prefill;
- cost: available core-seconds per request served within its SLOs;
- a time series: the utilisation of each scrape interval (busy core-seconds of the interval over
  cores x its length). Workers report their counters to the server now and then, so one
  interval can show more than 100% and the next less; the run's total is not affected.

Counters are read reset-aware (a value below the last one restarts from 0). A worker's counter
is summed over its role labels, so a worker moved to another pool (a new role label) keeps one
continuous count; an interval's busy time goes to the role the worker has at its end. A
(worker, phase) first seen after the first scrape counts from 0 (a worker started mid-run).
"""

BUSY = "tandem_worker_busy_seconds_total"
CORE_BUSY = "tandem_worker_busy_core_seconds_total"
TOKENS = "tandem_worker_computed_tokens_total"
THREADS = "tandem_worker_threads"
WORKERS = "tandem_workers"
TARGET = "tandem_planner_target_workers"
SWITCHES = "tandem_role_switches_total"
DECISIONS = "tandem_planner_decisions_total"


def _increase(prev, cur):
    """Reset-aware increase of a counter from prev to cur."""
    return cur - prev if cur >= prev else cur


def _worker_counters(samples, name):
    """{(worker, phase): value summed over role labels} and {(worker, phase): {role: value}}."""
    total, roles = {}, {}
    for s in samples:
        if s["name"] != name:
            continue
        ls = s["labels"]
        key = (ls.get("worker", ""), ls.get("phase", ""))
        total[key] = total.get(key, 0.0) + s["value"]
        roles.setdefault(key, {})[ls.get("role", "")] = s["value"]
    return total, roles


def _worker_state(samples):
    """{worker: (role, threads)} of the threads gauge (the largest if a worker has several)."""
    out = {}
    for s in samples:
        if s["name"] == THREADS:
            w = s["labels"].get("worker", "")
            if w not in out or s["value"] > out[w][1]:
                out[w] = (s["labels"].get("role", ""), s["value"])
    return out


def _gauge_by(samples, name, label, **match):
    """{value of `label`: summed samples of gauge `name` whose labels include `match`}."""
    out = {}
    for s in samples:
        ls = s["labels"]
        if s["name"] == name and label in ls and all(ls.get(k) == v for k, v in match.items()):
            out[ls[label]] = out.get(ls[label], 0.0) + s["value"]
    return out


def _counter_deltas(scrapes, name, labels):
    """{"a/b": increase over the run} of counter `name` per value of its `labels` (reset-aware,
    series first seen after the first scrape from 0); None if the counter was never seen."""
    last, out, seen = {}, {}, False
    for k, sc in enumerate(scrapes):
        for s in sc["samples"]:
            if s["name"] != name:
                continue
            seen = True
            key = "/".join(s["labels"].get(x, "") for x in labels)
            if key in last:
                out[key] = out.get(key, 0.0) + _increase(last[key], s["value"])
            elif k > 0:
                out[key] = out.get(key, 0.0) + s["value"]
            else:
                out.setdefault(key, 0.0)
            last[key] = s["value"]
    return out if seen else None


def token_shares(records):
    """(share of prompt tokens, share of output tokens) of the finished requests that belong to
    requests meeting every SLO (records as metrics.summarize leaves them); None for a share
    without tokens."""
    ok = [r for r in records if r["ok"]]

    def prompt(r):
        return r["prompt_tokens"] if r.get("prompt_tokens") is not None else r["input_tokens_target"]

    p_all = sum(prompt(r) for r in ok)
    o_all = sum(r["output_tokens"] or 0 for r in ok)
    p_met = sum(prompt(r) for r in ok if r.get("met_all_slos"))
    o_met = sum(r["output_tokens"] or 0 for r in ok if r.get("met_all_slos"))
    return (p_met / p_all if p_all else None), (o_met / o_all if o_all else None)


def compute(scrapes, records, duration_s, cores):
    """The utilisation summary of a run (see the module docstring); None unless at least two
    scrapes were taken and one of them has the busy counter."""
    scrapes = sorted(scrapes, key=lambda sc: sc["t"])
    if len(scrapes) < 2 or not any(s["name"] == BUSY for sc in scrapes for s in sc["samples"]):
        return None
    available = cores * duration_s            # core-seconds the run had
    last_busy, last_core, last_tokens = {}, {}, {}
    workers = {}                              # worker -> figures
    by_phase = {}                             # phase -> busy core-seconds
    tokens = {}                               # phase -> computed tokens
    series = []
    threads_assumed = False
    for k, sc in enumerate(scrapes):
        busy, busy_roles = _worker_counters(sc["samples"], BUSY)
        core_busy, _ = _worker_counters(sc["samples"], CORE_BUSY)
        tok, _ = _worker_counters(sc["samples"], TOKENS)
        state = _worker_state(sc["samples"])
        interval_core_s, interval_roles = 0.0, {}
        for key, v in busy.items():
            w, phase = key
            inc = _increase(last_busy[key], v) if key in last_busy else (v if k > 0 else 0.0)
            last_busy[key] = v
            if w in state:
                role, threads = state[w]
            else:  # no threads gauge: 1 thread, the role of its busiest series
                threads_assumed = True
                role, threads = max(busy_roles[key].items(), key=lambda kv: kv[1])[0], 1.0
            core_s = inc * threads
            if key in core_busy:  # the worker counts its cores itself (exact across resizes)
                v_core = core_busy[key]
                core_s = (_increase(last_core[key], v_core) if key in last_core
                          else (v_core if k > 0 else 0.0))
                last_core[key] = v_core
            f = workers.setdefault(w, {"busy_s": {}, "core_s": 0.0})
            f["role"], f["threads"] = role, threads
            f["busy_s"][phase] = f["busy_s"].get(phase, 0.0) + inc
            f["core_s"] += core_s
            by_phase[phase] = by_phase.get(phase, 0.0) + core_s
            interval_core_s += core_s
            interval_roles[role] = interval_roles.get(role, 0.0) + core_s
        for key, v in tok.items():
            inc = _increase(last_tokens[key], v) if key in last_tokens else (v if k > 0 else 0.0)
            last_tokens[key] = v
            tokens[key[1]] = tokens.get(key[1], 0.0) + inc
        if k == 0:
            continue
        dt = sc["t"] - scrapes[k - 1]["t"]
        room = cores * dt if dt > 0 else None
        series.append({
            "t": sc["t"], "dt": dt,
            "utilisation": interval_core_s / room if room else None,
            "by_role": {r: v / room if room else None for r, v in sorted(interval_roles.items())},
            "workers": _gauge_by(sc["samples"], WORKERS, "role", state="healthy")
                       or _gauge_by(sc["samples"], WORKERS, "role"),
            "target": _gauge_by(sc["samples"], TARGET, "role")})
    busy_core_s = sum(f["core_s"] for f in workers.values())
    by_role = {}
    for f in workers.values():
        by_role[f["role"]] = by_role.get(f["role"], 0.0) + f["core_s"]
    p_share, o_share = token_shares(records)
    useful_core_s = (by_phase.get("prefill", 0.0) * (p_share or 0.0)
                     + by_phase.get("decode", 0.0) * (o_share or 0.0))
    met = sum(1 for r in records if r.get("met_all_slos"))

    def share(x):
        return x / available if available > 0 else None

    return {
        "cores": cores, "duration_s": duration_s, "available_core_s": available,
        "window_s": scrapes[-1]["t"] - scrapes[0]["t"], "scrapes": len(scrapes),
        "busy_core_s": busy_core_s, "utilisation": share(busy_core_s),
        "useful_core_s": useful_core_s, "useful_utilisation": share(useful_core_s),
        "prompt_token_share_within_slo": p_share, "output_token_share_within_slo": o_share,
        "requests_within_slo": met,
        "core_s_per_request_within_slo": available / met if met else None,
        "by_phase_core_s": by_phase, "computed_tokens": tokens,
        "by_role": {r: {"core_s": v, "utilisation": share(v)} for r, v in sorted(by_role.items())},
        "workers": {w: dict(f, utilisation=share(f["core_s"]),
                            busy_share=sum(f["busy_s"].values()) / duration_s if duration_s > 0 else None)
                    for w, f in sorted(workers.items())},
        "threads_assumed": threads_assumed,
        "role_switches": _counter_deltas(scrapes, SWITCHES, ("from", "to")),
        "planner_decisions": _counter_deltas(scrapes, DECISIONS, ("action", "reason")),
        "series": series,
    }
