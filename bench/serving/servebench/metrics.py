"""Per-request measurements and the run summary.

Definitions follow vLLM's benchmark_serving so that numbers compare with the field:
- TTFT: from sending the request to the first streamed chunk that carries output;
- ITL: the gaps between consecutive output chunks (pooled over all requests);
- TPOT: (E2E - TTFT) / (output tokens - 1), for requests with more than one output token;
- E2E: from sending the request to the end of the stream;
- goodput: requests per second meeting every SLO given (TTFT, TBT, TPOT, E2E).
And Mooncake's:
- TBT of a request: the mean of its slowest 10% of gaps (at least one gap);
- SLO attainment: the share of all requests (failed ones included, as misses) meeting both the
  TTFT and the TBT SLO (those of the two that are given).
Failed requests (HTTP errors, rejections, timeouts, broken streams) are counted as failed, count
against attainment and goodput, and are listed in the records; their latencies are not mixed
into the latency statistics.
"""
import math

STAT_KEYS = ("ttft_ms", "tpot_ms", "itl_ms", "tbt_ms", "e2e_ms")


def percentile(sorted_values, q):
    """Linear interpolation between closest ranks (numpy's default), q in [0, 100]."""
    if not sorted_values:
        return None
    if len(sorted_values) == 1:
        return float(sorted_values[0])
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(sorted_values) - 1)
    frac = pos - lo
    return float(sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * frac)


def stats(values):
    v = sorted(x for x in values if x is not None)
    if not v:
        return {"count": 0, "mean": None, "p50": None, "p90": None, "p99": None, "min": None,
                "max": None}
    return {"count": len(v), "mean": sum(v) / len(v), "p50": percentile(v, 50),
            "p90": percentile(v, 90), "p99": percentile(v, 99), "min": v[0], "max": v[-1]}


def tbt_of(gaps_ms, share=0.10):
    """Mean of the slowest `share` of gaps (at least one); None without gaps."""
    if not gaps_ms:
        return None
    k = max(1, int(math.ceil(share * len(gaps_ms))))
    top = sorted(gaps_ms, reverse=True)[:k]
    return sum(top) / k


def finish_record(rec):
    """Fills the derived fields of a request record from its raw timings (in place)."""
    if not rec["ok"]:
        for k in ("ttft_ms", "tpot_ms", "tbt_ms", "e2e_ms"):
            rec.setdefault(k, None)
        return rec
    gaps = rec["itl_ms"]
    n_out = rec["output_tokens"]
    rec["tpot_ms"] = ((rec["e2e_ms"] - rec["ttft_ms"]) / (n_out - 1)
                      if n_out is not None and n_out > 1 and rec["ttft_ms"] is not None else None)
    rec["tbt_ms"] = tbt_of(gaps)
    return rec


def slo_checks(rec, slo):
    """{name: met} for every given SLO; a failed request meets none. A latency that does not
    exist for the request (TBT or TPOT of a one-token output) cannot be violated."""
    out = {}
    for name, limit in slo.items():
        if limit is None:
            continue
        if not rec["ok"]:
            out[name] = False
            continue
        value = rec.get(name)
        out[name] = value is None or value <= limit
    return out


def summarize(records, duration_s, slo):
    """The run summary. slo: {"ttft_ms": x or None, "tbt_ms": ..., "tpot_ms": ..., "e2e_ms": ...}."""
    n = len(records)
    ok = [r for r in records if r["ok"]]
    failed = [r for r in records if not r["ok"]]
    for r in records:
        r["slo"] = slo_checks(r, slo)
        r["met_all_slos"] = r["ok"] and all(r["slo"].values())
        r["met_ttft_tbt"] = r["ok"] and all(v for k, v in r["slo"].items()
                                            if k in ("ttft_ms", "tbt_ms"))
    met_all = sum(1 for r in records if r["met_all_slos"])
    met_pair = sum(1 for r in records if r["met_ttft_tbt"])
    short = [r for r in ok if r["output_tokens"] is not None
             and r["output_tokens"] < r["requested_output_tokens"]]
    prompt_counted = [r for r in ok if r["prompt_tokens"] is not None]
    in_tokens = sum(r["prompt_tokens"] if r["prompt_tokens"] is not None
                    else r["input_tokens_target"] for r in ok)
    out_tokens = sum(r["output_tokens"] or 0 for r in ok)
    dur = max(duration_s, 1e-9)
    s = {
        "requests": n,
        "completed": len(ok),
        "failed": len(failed),
        "rejected": sum(1 for r in failed if r.get("status") in (429, 503)),
        "timed_out": sum(1 for r in failed if r.get("error_kind") == "timeout"),
        "failures": [{"index": r["index"], "status": r.get("status"), "error": r.get("error")}
                     for r in failed][:50],
        "short_outputs": len(short),
        "short_output_requests": [{"index": r["index"], "requested": r["requested_output_tokens"],
                                   "returned": r["output_tokens"]} for r in short][:50],
        "duration_s": duration_s,
        "request_throughput_rps": len(ok) / dur,
        "input_throughput_tps": in_tokens / dur,
        "output_throughput_tps": out_tokens / dur,
        "total_input_tokens": in_tokens,
        "total_output_tokens": out_tokens,
        "prompt_tokens_counted_by_server": len(prompt_counted),
        "output_tokens_from_usage": sum(1 for r in ok if r["output_tokens_source"] == "usage"),
        "slo": {k: v for k, v in slo.items() if v is not None},
        "met_all_slos": met_all,
        "goodput_rps": met_all / dur,
        "slo_attainment": met_pair / n if n else 0.0,
        "all_slo_attainment": met_all / n if n else 0.0,
    }
    s["ttft_ms"] = stats(r["ttft_ms"] for r in ok)
    s["tpot_ms"] = stats(r["tpot_ms"] for r in ok)
    s["itl_ms"] = stats(g for r in ok for g in r["itl_ms"])
    s["tbt_ms"] = stats(r["tbt_ms"] for r in ok)
    s["e2e_ms"] = stats(r["e2e_ms"] for r in ok)
    s["client_wait_ms"] = stats(r.get("client_wait_ms") for r in records)
    if any(r.get("phase") is not None for r in records):
        s["phases"] = phase_summaries(records)
    return s


def phase_summaries(records):
    """Per phase of a --phases workload (records already through summarize): requests, SLO
    attainment (TTFT and TBT), TTFT and TBT percentiles, and when its requests were sent
    (seconds from the start)."""
    out = []
    for k in sorted({r["phase"] for r in records if r.get("phase") is not None}):
        rs = [r for r in records if r.get("phase") == k]
        ok = [r for r in rs if r["ok"]]
        sent = [r["sent_s"] for r in rs if r.get("sent_s") is not None]
        out.append({"phase": k, "requests": len(rs), "completed": len(ok),
                    "failed": len(rs) - len(ok),
                    "slo_attainment": sum(1 for r in rs if r["met_ttft_tbt"]) / len(rs),
                    "first_sent_s": min(sent) if sent else None,
                    "last_sent_s": max(sent) if sent else None,
                    "ttft_ms": stats(r["ttft_ms"] for r in ok),
                    "tbt_ms": stats(r["tbt_ms"] for r in ok)})
    return out
