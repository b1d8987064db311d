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
TTFT_MS = {"random": 150.0, "load-balance": 100.0, "cache-aware": 50.0, "cache-load": 50.0}


class Counters:
    def __init__(self, policy, admission):
        self.policy, self.admission = policy, admission
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
        return "\n".join(lines) + "\n"


def main():
    argv = sys.argv[1:]
    if argv[:1] == ["--log-level"]:
        argv = argv[2:]
    if argv[:1] != ["serve"]:
        print("fake tandem: only `serve` is faked", file=sys.stderr)
        return 2
    if "--help" in argv:
        flags = OLD_FLAGS + ([] if os.environ.get("FAKE_TANDEM_OLD") == "1" else NEW_FLAGS)
        print("Serve the model\nOptions:\n" + "\n".join(f"  {f} TEXT" for f in flags))
        return 0
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--placement-policy", default="cache-load")
    p.add_argument("--admission", default="predictive")
    p.add_argument("--mode", default="disaggregated")
    p.add_argument("--slo-ttft-ms", type=float, default=0.0)
    p.add_argument("--slo-tbt-ms", type=float, default=0.0)
    args, _ = p.parse_known_args(argv[1:])
    no_slo = args.slo_ttft_ms <= 0 and args.slo_tbt_ms <= 0
    counters = Counters(args.placement_policy, "none" if no_slo else args.admission)
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
