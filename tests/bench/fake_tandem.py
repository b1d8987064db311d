#!/usr/bin/env python3
"""A stand-in for `tandem serve` in the tests of bench/scheduling_compare.py: the fake OpenAI
server of fake_openai.py on --port, with /metrics counters that follow a fixed, known rule, so
that the driver's tables can be checked against it.

    fake_tandem.py [--log-level L] serve --port P [--placement-policy X] [--admission Y] ...
    fake_tandem.py serve --help       # lists the flags (without the scheduling ones when the
                                      # environment has FAKE_TANDEM_OLD=1)

The rule, for streamed (measured) requests; warm-up requests are not streamed and only answered:
- TTFT by policy: random 150 ms, load-balance 100, cache-aware and cache-load 50 (colocated 50);
  each output token 5 ms later; prompt tokens = the prompt's words.
- admission none, or no SLO given, admits all; early rejects every 2nd request (429, reason
  "ttft"); predictive every 3rd (429, reason "tbt"). Rejected requests compute no prefill.
- prefill tokens of admitted requests count as outcome "slo_met", except under admission none,
  where every 2nd admitted request counts as "slo_missed".
- cache-aware and cache-load: half the prompt tokens are prefix-cache hits; others none.
- cache-load: each request observes 0.08 in the TTFT and 0.3 in the TBT prediction-error
  histograms (buckets 0.05, 0.1, 0.2, 0.5, 1, +Inf).
- decode-only requests ("local prefill"): none.
- worker utilisation: each admitted request adds 1 ms of prefill busy time per prompt token
  (tandem_worker_busy_seconds_total, phase prefill) on prefill-0, and 2 ms of decode busy time
  per requested output token (phase decode) on decode-0, with the same token counts in
  tandem_worker_computed_tokens_total; in colocated mode both go to worker "colocated" (role
  mixed). tandem_worker_threads: --threads-per-worker, else --threads (default 2) divided among
  the workers (at least 1); colocated: --threads.
- --elastic (listed by --help unless FAKE_TANDEM_NO_ELASTIC=1): planner targets of 1 prefill and
  1 decode worker; every 4th admitted request counts a role switch prefill -> decode and a
  planner decision (action switch, reason decode_load), the others a decision (hold, balanced);
  the pools themselves stay 1 + 1.
"""
import argparse
import os
import signal
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fake_openai import FakeConfig, FakeServer  # noqa: E402

BOUNDS = (0.05, 0.1, 0.2, 0.5, 1.0)
OLD_FLAGS = ["--model", "--host", "--port", "--threads", "--block-tokens", "--mode",
             "--prefill-workers", "--decode-workers", "--threads-per-worker", "--max-num-seqs"]
NEW_FLAGS = ["--placement-policy", "--admission", "--slo-ttft-ms", "--slo-tbt-ms"]
ELASTIC_FLAGS = ["--elastic"]
PREFILL_S_PER_TOKEN = 0.001  # busy seconds per prompt token
DECODE_S_PER_TOKEN = 0.002   # busy seconds per output token
TTFT_MS = {"random": 150.0, "load-balance": 100.0, "cache-aware": 50.0, "cache-load": 50.0}


class Counters:
    def __init__(self, policy, admission, mode="disaggregated", threads=2,
                 threads_per_worker=None, elastic=False):
        self.policy, self.admission = policy, admission
        self.elastic = elastic
        if mode == "colocated":
            self.workers = {"colocated": ("mixed", threads)}
            self.prefill_worker = self.decode_worker = "colocated"
        else:
            per = threads_per_worker or max(1, threads // 2)
            self.workers = {"prefill-0": ("prefill", per), "decode-0": ("decode", per)}
            self.prefill_worker, self.decode_worker = "prefill-0", "decode-0"
        # (worker, phase) -> [busy seconds, computed tokens]
        self.busy = {(w, ph): [0.0, 0.0] for w in self.workers for ph in ("prefill", "decode")}
        self.switches = self.holds = 0
        self.lock = threading.Lock()
        self.seen = self.admitted = 0
        self.prompt = self.hits = 0.0
        self.prefill = {"slo_met": 0.0, "slo_missed": 0.0, "rejected": 0.0, "failed": 0.0}
        self.rejections = {}
        self.ttft_err, self.tbt_err = [], []

    def admit(self, body):
        if not body.get("stream"):
            return None
        words = float(len(body.get("prompt", "").split()))
        with self.lock:
            self.seen += 1
            self.prompt += words
            every = {"early": 2, "predictive": 3}.get(self.admission)
            if every and self.seen % every == 0:
                reason = "ttft" if self.admission == "early" else "tbt"
                self.rejections[reason] = self.rejections.get(reason, 0) + 1
                return 429
            self.admitted += 1
            out = float(body.get("max_tokens", 16))
            for w, ph, tokens, per in ((self.prefill_worker, "prefill", words, PREFILL_S_PER_TOKEN),
                                       (self.decode_worker, "decode", out, DECODE_S_PER_TOKEN)):
                self.busy[(w, ph)][0] += tokens * per
                self.busy[(w, ph)][1] += tokens
            if self.admitted % 4 == 0:
                self.switches += 1
            else:
                self.holds += 1
            missed = self.admission == "none" and self.admitted % 2 == 0
            self.prefill["slo_missed" if missed else "slo_met"] += words
            if self.policy in ("cache-aware", "cache-load"):
                self.hits += words // 2
            if self.policy == "cache-load":
                self.ttft_err.append(0.08)
                self.tbt_err.append(0.3)
        return None

    def text(self):
        with self.lock:
            lines = ["# TYPE tandem_prompt_tokens_total counter",
                     f"tandem_prompt_tokens_total {self.prompt:g}",
                     f"tandem_prefix_cache_hit_tokens_total {self.hits:g}",
                     f"tandem_prompt_tokens_computed_total {self.prompt - self.hits:g}",
                     "tandem_local_prefill_requests_total 0"]
            lines += [f'tandem_prefill_tokens_total{{outcome="{o}"}} {v:g}'
                      for o, v in self.prefill.items()]
            lines += [f'tandem_rejections_total{{reason="{r}"}} {v}'
                      for r, v in sorted(self.rejections.items())]
            for name, obs in (("tandem_ttft_prediction_relative_error", self.ttft_err),
                              ("tandem_tbt_prediction_relative_error", self.tbt_err)):
                lines.append(f"# TYPE {name} histogram")
                for b in BOUNDS:
                    lines.append(f'{name}_bucket{{le="{b:g}"}} {sum(1 for x in obs if x <= b)}')
                lines += [f'{name}_bucket{{le="+Inf"}} {len(obs)}', f"{name}_sum {sum(obs):g}",
                          f"{name}_count {len(obs)}"]
            lines += self.worker_lines()
        return "\n".join(lines) + "\n"


    def worker_lines(self):
        """The utilisation and pool families (called with the lock held)."""
        lines = ["# TYPE tandem_worker_busy_seconds_total counter"]
        for (w, ph), (busy, _) in sorted(self.busy.items()):
            lines.append(f'tandem_worker_busy_seconds_total{{worker="{w}",role="{self.workers[w][0]}",'
                         f'phase="{ph}"}} {busy:.6f}')
        lines.append("# TYPE tandem_worker_computed_tokens_total counter")
        for (w, ph), (_, tokens) in sorted(self.busy.items()):
            lines.append(f'tandem_worker_computed_tokens_total{{worker="{w}",'
                         f'role="{self.workers[w][0]}",phase="{ph}"}} {tokens:g}')
        lines.append("# TYPE tandem_worker_threads gauge")
        lines += [f'tandem_worker_threads{{worker="{w}",role="{role}"}} {n}'
                  for w, (role, n) in sorted(self.workers.items())]
        lines.append("# TYPE tandem_workers gauge")
        for role in ("prefill", "decode", "mixed"):
            n = sum(1 for r, _ in self.workers.values() if r == role)
            lines += [f'tandem_workers{{role="{role}",state="healthy"}} {n}',
                      f'tandem_workers{{role="{role}",state="unhealthy"}} 0']
        if self.elastic:
            lines += ["# TYPE tandem_planner_target_workers gauge",
                      'tandem_planner_target_workers{role="prefill"} 1',
                      'tandem_planner_target_workers{role="decode"} 1',
                      "# TYPE tandem_role_switches_total counter",
                      f'tandem_role_switches_total{{from="prefill",to="decode"}} {self.switches}',
                      "# TYPE tandem_planner_decisions_total counter",
                      f'tandem_planner_decisions_total{{action="switch",reason="decode_load"}} '
                      f"{self.switches}",
                      f'tandem_planner_decisions_total{{action="hold",reason="balanced"}} {self.holds}']
        return lines


def main():
    argv = sys.argv[1:]
    if argv[:1] == ["--log-level"]:
        argv = argv[2:]
    if argv[:1] != ["serve"]:
        print("fake tandem: only `serve` is faked", file=sys.stderr)
        return 2
    if "--help" in argv:
        flags = OLD_FLAGS + ([] if os.environ.get("FAKE_TANDEM_OLD") == "1" else NEW_FLAGS)
        flags += [] if os.environ.get("FAKE_TANDEM_NO_ELASTIC") == "1" else ELASTIC_FLAGS
        print("Serve the model\nOptions:\n" + "\n".join(f"  {f} TEXT" for f in flags))
        return 0
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--placement-policy", default="cache-load")
    p.add_argument("--admission", default="predictive")
    p.add_argument("--mode", default="disaggregated")
    p.add_argument("--slo-ttft-ms", type=float, default=0.0)
    p.add_argument("--slo-tbt-ms", type=float, default=0.0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--threads-per-worker", type=int)
    p.add_argument("--elastic", action="store_true")
    args, _ = p.parse_known_args(argv[1:])
    no_slo = args.slo_ttft_ms <= 0 and args.slo_tbt_ms <= 0
    counters = Counters(args.placement_policy, "none" if no_slo else args.admission, args.mode,
                        args.threads, args.threads_per_worker, args.elastic)
    ttft = 50.0 if args.mode == "colocated" else TTFT_MS[args.placement_policy]
    FakeServer(FakeConfig(ttft_ms=ttft, gaps_ms=[5.0]), port=args.port, admit=counters.admit,
               metrics=counters.text)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    while not stop.wait(0.2):
        pass
    time.sleep(0.05)
    return 0


if __name__ == "__main__":
    sys.exit(main())
