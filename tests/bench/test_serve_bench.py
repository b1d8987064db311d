"""`tandem bench serve` end to end: against a fake OpenAI server with injected delays (every
metric checked against the known schedule), with injected failures, for synthetic arrivals and
a rate sweep, and against a real `tandem serve`.

Environment: TANDEM_BIN (default build/tandem), TANDEM_SOURCE_DIR (default two levels up).
Without a built tandem the benchmark script is run directly with this Python (the same program
`tandem bench serve` runs), and the tests that need the real binary are skipped.
"""
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.environ.get("TANDEM_SOURCE_DIR", os.path.abspath(os.path.join(HERE, "..", "..")))
BIN = os.environ.get("TANDEM_BIN", os.path.join(SOURCE_DIR, "build", "tandem"))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(SOURCE_DIR, "bench", "serving"))
sys.path.insert(0, os.path.join(SOURCE_DIR, "tests", "server"))

from fake_openai import FakeConfig, FakeServer  # noqa: E402
from servebench import metrics, prompts, scrape, utilisation, workload  # noqa: E402
import fake_tandem  # noqa: E402

# Tolerance for one timing measured across two processes on a shared 2-core machine.
TOL_MS = 30.0


SCRIPT = os.path.join(SOURCE_DIR, "bench", "serving", "serve_bench.py")
HAVE_BIN = os.access(BIN, os.X_OK)
needs_bin = unittest.skipUnless(HAVE_BIN, f"no tandem binary at {BIN}")


def bench(*args, timeout=240, env=None):
    """Runs `tandem bench serve ARGS` (or the script it runs, without a binary); returns the
    CompletedProcess."""
    e = dict(os.environ)
    e.update(env or {})
    cmd = [BIN, "bench", "serve"] if HAVE_BIN else [sys.executable, SCRIPT]
    return subprocess.run([*cmd, *args, "--no-progress"], capture_output=True,
                          text=True, timeout=timeout, env=e)


def write_trace(path, rows):
    with open(path, "w") as f:
        for ts, n_in, n_out, ids in rows:
            f.write(json.dumps({"timestamp": ts, "input_length": n_in, "output_length": n_out,
                                "hash_ids": ids}) + "\n")


def load(out, name="results.json"):
    with open(os.path.join(out, name)) as f:
        return json.load(f)


def is_png(path):
    with open(path, "rb") as f:
        return f.read(8) == b"\x89PNG\r\n\x1a\n"


class PureFunctions(unittest.TestCase):
    def test_percentile_matches_linear_interpolation(self):
        v = [10.0, 20.0, 30.0, 40.0]
        self.assertEqual(metrics.percentile(v, 50), 25.0)
        self.assertAlmostEqual(metrics.percentile(v, 90), 37.0)
        self.assertEqual(metrics.percentile(v, 100), 40.0)
        self.assertIsNone(metrics.percentile([], 50))

    def test_tbt_is_mean_of_slowest_tenth(self):
        gaps = [10.0] * 18 + [100.0, 300.0]
        self.assertEqual(metrics.tbt_of(gaps), 200.0)           # 2 of 20 gaps
        self.assertEqual(metrics.tbt_of([5.0, 7.0, 9.0]), 9.0)  # at least one gap
        self.assertIsNone(metrics.tbt_of([]))

    def test_blocks_are_deterministic_and_prefix_stable(self):
        a = prompts.block_text("block-7", 50)
        self.assertEqual(a, prompts.block_text("block-7", 50))
        self.assertTrue(prompts.block_text("block-7", 80).startswith(a))
        self.assertNotEqual(a, prompts.block_text("block-8", 50))
        self.assertEqual(len(a.split()), 50)
        p = prompts.trace_prompt([1, 2, 3], 70, 30)
        self.assertEqual(len(p.split()), 70)
        self.assertTrue(p.startswith(prompts.block_text("block-1", 30) + prompts.block_text("block-2", 30)))

    def test_salted_blocks_keep_structure_and_differ_at_every_word(self):
        base = prompts.block_text("block-7", 60)
        self.assertEqual(prompts.block_text("block-7", 60, 0), base)
        salted = {s: prompts.block_text("block-7", 60, s).split()
                  for s in (1, 2, len(prompts.WORDS) - 1, len(prompts.WORDS), 3 * len(prompts.WORDS) + 5)}
        for s, w in salted.items():
            self.assertEqual(len(w), 60)
            self.assertEqual(" ".join(w), prompts.block_text("block-7", 60, s).strip())  # deterministic
            self.assertTrue(prompts.block_text("block-7", 90, s).startswith(" " + " ".join(w)))
        # Salts 0 .. len(WORDS) - 1 differ at every word, the first one included.
        for a in (0, 1, 2, len(prompts.WORDS) - 1):
            for b in (0, 1, 2, len(prompts.WORDS) - 1):
                if a < b:
                    wa = prompts.block_text("block-7", 60, a).split()
                    wb = prompts.block_text("block-7", 60, b).split()
                    self.assertTrue(all(x != y for x, y in zip(wa, wb)), (a, b))
        # Beyond the rotations the key changes: still not the unsalted or the rotated text.
        self.assertNotEqual(salted[len(prompts.WORDS)], base.split())
        self.assertNotEqual(salted[3 * len(prompts.WORDS) + 5], salted[1])
        # A salted trace prompt keeps the block structure of its ids.
        p1 = prompts.trace_prompt([1, 2, 3], 70, 30, salt=4)
        p2 = prompts.trace_prompt([1, 2, 9], 70, 30, salt=4)
        self.assertEqual(len(p1.split()), 70)
        self.assertEqual(p1.split()[:60], p2.split()[:60])
        self.assertNotEqual(p1.split()[60:], p2.split()[60:])
        self.assertNotEqual(p1.split()[0], prompts.trace_prompt([1, 2, 3], 70, 30).split()[0])
        with self.assertRaises(ValueError):
            prompts.block_text("x", 3, -1)


    def test_retime_keeps_gaps_or_spreads_simultaneous_requests(self):
        from servebench import workload
        reqs = [workload.Request(i, t, "", 1, 1) for i, t in enumerate([0.0, 1.0, 3.0])]
        # Two gaps at 2 req/s span 1 s; the gaps keep their 1:2 proportion.
        self.assertEqual([round(r.arrival_s, 9) for r in workload.retime(reqs, 2.0)],
                         [0.0, round(1 / 3, 9), 1.0])
        same = [workload.Request(i, 5.0, "", 1, 1) for i in range(3)]
        self.assertEqual([r.arrival_s for r in workload.retime(same, 4.0)], [0.0, 0.25, 0.5])


def _sample(name, value, **labels):
    return {"name": name, "labels": labels, "value": value}


def _busy(worker, role, phase, value):
    return _sample("tandem_worker_busy_seconds_total", value, worker=worker, role=role, phase=phase)


def _threads(worker, role, value):
    return _sample("tandem_worker_threads", value, worker=worker, role=role)


def _rec(prompt, out, met, ok=True):
    return {"ok": ok, "prompt_tokens": prompt, "input_tokens_target": prompt,
            "output_tokens": out if ok else None, "met_all_slos": met and ok}


class Phases(unittest.TestCase):
    def test_parse_phases(self):
        got = workload.parse_phases(" n=3,in=100,out=5,rate=2 ; n=2,in=10,out=50,rate=inf;n=1,in=7,out=1")
        self.assertEqual(got, [{"n": 3, "in": 100, "out": 5, "rate": 2.0},
                               {"n": 2, "in": 10, "out": 50, "rate": math.inf},
                               {"n": 1, "in": 7, "out": 1, "rate": math.inf}])
        for text, msg in (("", "--phases is empty"),
                          ("n=1,in=2,out=3;", "phase 2 (''): empty phase"),
                          ("n=1,in=2", "phase 1 ('n=1,in=2'): missing out"),
                          ("n=1,in=2,out=3,len=4", "unknown key 'len'"),
                          ("n=1,in=2,out=3,n=4", "n given twice"),
                          ("n=1.5,in=2,out=3", "n='1.5' is not an integer"),
                          ("n=1,in=2,out=3,rate=fast", "rate='fast' is not a number or inf"),
                          ("n=1,in=2,out=3,rate=0", "rate must be > 0"),
                          ("n=1,in=2,out=3,rate=nan", "rate must be > 0"),
                          ("n=0,in=2,out=3", "n, in and out must be > 0"),
                          ("n=1,in=2,out", "'out' is not key=value")):
            with self.assertRaises(workload.WorkloadError, msg=text) as cm:
                workload.parse_phases(text)
            self.assertIn(msg, str(cm.exception), text)

    def test_phases_run_back_to_back(self):
        phases = workload.parse_phases("n=5,in=40,out=4,rate=10;n=3,in=8,out=30,rate=inf;"
                                       "n=4,in=40,out=4,rate=2")
        reqs = workload.phased(phases, seed=1)
        self.assertEqual([r.index for r in reqs], list(range(12)))
        self.assertEqual([r.phase for r in reqs], [0] * 5 + [1] * 3 + [2] * 4)
        self.assertEqual([(r.input_tokens, r.output_tokens) for r in reqs],
                         [(40, 4)] * 5 + [(8, 30)] * 3 + [(40, 4)] * 4)
        t = [r.arrival_s for r in reqs]
        self.assertEqual(t[0], 0.0)
        self.assertTrue(all(a <= b for a, b in zip(t, t[1:])), t)
        self.assertEqual(t[5:8], [t[4]] * 3)        # rate inf: at the previous phase's last arrival
        self.assertGreater(t[8], t[7])               # then one gap at 2 req/s
        self.assertEqual(len({r.prompt for r in reqs}), 12)
        self.assertTrue(all(len(r.prompt.split()) == r.input_tokens for r in reqs))
        self.assertEqual([r.arrival_s for r in workload.phased(phases, seed=1)], t)  # deterministic
        # A sweep rate rescales all arrivals together, phases kept.
        retimed = workload.retime(reqs, 4.0)
        self.assertAlmostEqual(retimed[-1].arrival_s, 11 / 4.0)
        self.assertEqual([r.phase for r in retimed], [r.phase for r in reqs])


class Utilisation(unittest.TestCase):
    def test_arithmetic(self):
        # 4 cores, a 10 s run. prefill-0 (2 threads) and decode-0 (1 thread); at t=5 decode-0
        # moves to the prefill pool (same cumulative counter under a new role label), at t=10
        # prefill-0's counter resets (a restart) and worker extra-0 appears mid-run (from 0).
        scrapes = [
            {"t": 0.0, "samples": [_busy("prefill-0", "prefill", "prefill", 100.0),
                                   _busy("decode-0", "decode", "decode", 50.0),
                                   _threads("prefill-0", "prefill", 2), _threads("decode-0", "decode", 1),
                                   _sample("tandem_role_switches_total", 7, **{"from": "decode", "to": "prefill"}),
                                   _sample("tandem_workers", 1, role="prefill", state="healthy"),
                                   _sample("tandem_workers", 1, role="decode", state="healthy")]},
            {"t": 5.0, "samples": [_busy("prefill-0", "prefill", "prefill", 103.0),   # +3 s x 2
                                   _busy("decode-0", "prefill", "decode", 54.0),      # +4 s x 1
                                   _threads("prefill-0", "prefill", 2), _threads("decode-0", "prefill", 1),
                                   _sample("tandem_role_switches_total", 8, **{"from": "decode", "to": "prefill"}),
                                   _sample("tandem_workers", 2, role="prefill", state="healthy"),
                                   _sample("tandem_workers", 0, role="decode", state="healthy"),
                                   _sample("tandem_planner_target_workers", 2, role="prefill")]},
            {"t": 10.0, "samples": [_busy("prefill-0", "prefill", "prefill", 1.0),    # reset: +1 x 2
                                    _busy("decode-0", "prefill", "decode", 54.0),
                                    _busy("decode-0", "prefill", "prefill", 2.0),     # new: +2 x 1
                                    _busy("extra-0", "decode", "decode", 0.5),        # new worker
                                    _threads("prefill-0", "prefill", 2), _threads("decode-0", "prefill", 1),
                                    _threads("extra-0", "decode", 4),                 # +0.5 x 4
                                    _sample("tandem_planner_decisions_total", 3, action="grow", reason="ttft")]},
        ]
        records = [_rec(100, 10, True), _rec(300, 30, False), _rec(50, 60, True), _rec(999, 5, False, ok=False)]
        u = utilisation.compute(scrapes, records, 10.0, 4)
        busy = 6 + 4 + 2 + 2 + 2          # core-seconds
        self.assertAlmostEqual(u["busy_core_s"], busy)
        self.assertAlmostEqual(u["available_core_s"], 40.0)
        self.assertAlmostEqual(u["utilisation"], busy / 40)
        self.assertEqual(u["by_phase_core_s"], {"prefill": 6 + 2 + 2, "decode": 4 + 2})
        p_share, o_share = 150 / 450, 70 / 100     # the failed request counts in neither
        self.assertAlmostEqual(u["prompt_token_share_within_slo"], p_share)
        self.assertAlmostEqual(u["output_token_share_within_slo"], o_share)
        self.assertAlmostEqual(u["useful_core_s"], 10 * p_share + 6 * o_share)
        self.assertAlmostEqual(u["useful_utilisation"], (10 * p_share + 6 * o_share) / 40)
        self.assertEqual(u["requests_within_slo"], 2)
        self.assertAlmostEqual(u["core_s_per_request_within_slo"], 20.0)
        w = u["workers"]
        self.assertAlmostEqual(w["prefill-0"]["core_s"], 8.0)
        self.assertEqual(w["prefill-0"]["busy_s"], {"prefill": 4.0})
        self.assertAlmostEqual(w["decode-0"]["core_s"], 6.0)
        self.assertEqual((w["decode-0"]["role"], w["extra-0"]["threads"]), ("prefill", 4))
        self.assertAlmostEqual(w["extra-0"]["busy_share"], 0.05)
        # An interval's busy time goes to the worker's role at its end.
        self.assertAlmostEqual(u["by_role"]["prefill"]["core_s"], 14.0)
        self.assertAlmostEqual(u["by_role"]["decode"]["core_s"], 2.0)
        self.assertEqual([(r["t"], r["dt"]) for r in u["series"]], [(5.0, 5.0), (10.0, 5.0)])
        self.assertAlmostEqual(u["series"][0]["utilisation"], 10 / 20)
        self.assertAlmostEqual(u["series"][1]["utilisation"], 6 / 20)
        self.assertEqual(u["series"][0]["by_role"], {"prefill": 0.5})
        self.assertEqual(u["series"][0]["workers"], {"prefill": 2, "decode": 0})
        self.assertEqual(u["series"][0]["target"], {"prefill": 2})
        self.assertEqual(u["role_switches"], {"decode/prefill": 1.0})
        self.assertEqual(u["planner_decisions"], {"grow/ttft": 3.0})   # first seen mid-run
        self.assertFalse(u["threads_assumed"])

    def test_missing_families(self):
        recs = [_rec(10, 10, True)]
        self.assertIsNone(utilisation.compute([], recs, 1.0, 2))
        plain = [{"t": 0.0, "samples": []}, {"t": 1.0, "samples": []}]
        self.assertIsNone(utilisation.compute(plain, recs, 1.0, 2))
        # Busy time without a threads gauge: 1 thread assumed; no planner families: None.
        scrapes = [{"t": 0.0, "samples": [_busy("colocated", "mixed", "prefill", 1.0)]},
                   {"t": 2.0, "samples": [_busy("colocated", "mixed", "prefill", 2.0)]}]
        u = utilisation.compute(scrapes, recs, 2.0, 2)
        self.assertTrue(u["threads_assumed"])
        self.assertAlmostEqual(u["utilisation"], 0.25)
        self.assertEqual((u["role_switches"], u["planner_decisions"]), (None, None))
        self.assertIsNone(utilisation.compute(scrapes, [], 2.0, 2)["core_s_per_request_within_slo"])

    def test_parse_keeps_the_wanted_families(self):
        text = "\n".join([
            "# HELP tandem_worker_busy_seconds_total Busy.", "# TYPE tandem_worker_busy_seconds_total counter",
            'tandem_worker_busy_seconds_total{worker="p0",role="prefill",phase="prefill"} 1.5',
            "# TYPE tandem_workers gauge", 'tandem_workers{role="decode",state="healthy"} 2',
            "# TYPE tandem_requests_total counter", "tandem_requests_total 9",
            'tandem_role_switches_total{from="a\\"b",to="c"} 1', ""])
        want = [{"name": "tandem_worker_busy_seconds_total", "value": 1.5,
                 "labels": {"worker": "p0", "role": "prefill", "phase": "prefill"}},
                {"name": "tandem_workers", "labels": {"role": "decode", "state": "healthy"}, "value": 2.0},
                {"name": "tandem_role_switches_total", "labels": {"from": 'a"b', "to": "c"}, "value": 1.0}]
        self.assertEqual(scrape.parse(text), want)
        with self.assertRaises(ValueError):
            scrape.parse('tandem_workers{role="decode" 2')  # not Prometheus text


class AgainstFakeServer(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="bench-test-")
        self.dir = self.tmp.name
        self.server = None

    def tearDown(self):
        if self.server:
            self.server.close()
        self.tmp.cleanup()

    def start(self, **kw):
        self.server = FakeServer(FakeConfig(**kw))
        return self.server

    def assertNear(self, got, want, tol=TOL_MS, what=""):
        self.assertIsNotNone(got, what)
        self.assertLessEqual(abs(got - want), tol, f"{what}: measured {got:.2f}, expected {want:.2f}")

    def test_trace_replay_metrics_match_injected_delays(self):
        # 19 gaps per request: 17 of 40 ms and 2 of 200 ms (the slowest 10%, so TBT = 200).
        gaps_cycle = [40.0] * 8 + [200.0]
        srv = self.start(ttft_ms=300.0, gaps_ms=gaps_cycle)
        trace = os.path.join(self.dir, "trace.jsonl")
        write_trace(trace, [(1000, 1024, 200, [1, 2]), (1400, 1024, 200, [1, 2]),
                            (1800, 700, 200, [1, 3]), (2200, 2000, 200, [4, 5, 6, 7]),
                            (9000, 100, 100, [9])])  # beyond --max-requests
        out = os.path.join(self.dir, "run")
        p = bench("--base-url", srv.base, "--trace", trace, "--length-scale", "0.1",
                  "--time-scale", "0.5", "--max-requests", "4", "--slo-ttft-ms", "400",
                  "--slo-tbt-ms", "260", "--out", out)
        self.assertEqual(p.returncode, 0, p.stderr)
        s = load(out, "summary.json")
        n_out = 20
        gaps = [gaps_cycle[i % len(gaps_cycle)] for i in range(n_out - 1)]
        self.assertEqual(metrics.tbt_of(gaps), 200.0)
        # TPOT = (E2E - TTFT) / 19 is 56.8 ms; E2E / 20 would be 69 ms and is told apart by the
        # tighter tolerance (a late chunk moves only the gap sum's ends, divided by 19).
        want = {"ttft_ms": (300.0, TOL_MS), "e2e_ms": (300.0 + sum(gaps), TOL_MS),
                "tpot_ms": (sum(gaps) / (n_out - 1), 5.0), "tbt_ms": (200.0, TOL_MS)}
        self.assertEqual((s["completed"], s["failed"], s["short_outputs"]), (4, 0, 0))
        for key, (value, tol) in want.items():
            for stat in ("mean", "p50", "p90", "p99"):
                # p90 and p99 of 4 requests are the slowest one: a loaded machine may have
                # stalled one chunk of it, so the tail gets twice the tolerance.
                t = tol if stat in ("mean", "p50") else 2 * tol
                self.assertNear(s[key][stat], value, t, what=f"{key} {stat}")
        self.assertNear(s["itl_ms"]["mean"], sum(gaps) / len(gaps), 5.0, what="itl mean")
        self.assertNear(s["itl_ms"]["p50"], 40.0, 10.0, what="itl p50")
        self.assertNear(s["itl_ms"]["max"], 200.0, what="itl max")
        self.assertEqual(s["itl_ms"]["count"], 4 * (n_out - 1))
        # Arrivals: trace gaps of 400 ms at time scale 0.5, so 200 ms apart at the server.
        arrivals = sorted(e["t"] for e in srv.log)
        for a, b in zip(arrivals, arrivals[1:]):
            self.assertNear((b - a) * 1000.0, 200.0, tol=50.0, what="arrival gap")
        self.assertNear(s["duration_s"] * 1000.0, 600.0 + want["e2e_ms"][0], tol=60.0, what="duration")
        self.assertEqual(s["slo_attainment"], 1.0)
        self.assertAlmostEqual(s["goodput_rps"], 4 / s["duration_s"], places=6)
        self.assertAlmostEqual(s["output_throughput_tps"], 4 * n_out / s["duration_s"], places=6)
        # Request bodies: exactly 20 tokens asked for, EOS ignored, streamed, prompts from ids.
        bodies = [e["body"] for e in sorted(srv.log, key=lambda e: e["t"])]
        for b in bodies:
            self.assertEqual((b["max_tokens"], b["ignore_eos"], b["stream"], b["model"]),
                             (20, True, True, "fake-model"))
        words = [b["prompt"].split() for b in bodies]
        self.assertEqual([len(w) for w in words], [102, 102, 70, 200])
        self.assertEqual(bodies[0]["prompt"], bodies[1]["prompt"])       # same ids
        self.assertEqual(words[2][:51], words[0][:51])                    # shared first block
        self.assertNotEqual(words[2][51:70], words[0][51:70])
        self.assertNotEqual(words[3][:51], words[0][:51])
        res = load(out)
        self.assertEqual([r["prompt_tokens"] for r in res["requests"]], [102, 102, 70, 200])
        self.assertTrue(all(r["output_tokens_source"] == "usage" for r in res["requests"]))
        for name in ("latency_cdf.png", "timeline.png"):
            self.assertTrue(is_png(os.path.join(out, name)), name)
        with open(os.path.join(out, "summary.md")) as f:
            self.assertIn("| ttft_ms |", f.read())
        # A tighter TTFT SLO is missed by every request: attainment and goodput drop to 0.
        out2 = os.path.join(self.dir, "tight")
        p = bench("--base-url", srv.base, "--trace", trace, "--length-scale", "0.1", "--time-scale",
                  "0", "--max-requests", "2", "--slo-ttft-ms", "200", "--out", out2, "--no-plots")
        self.assertEqual(p.returncode, 0, p.stderr)
        s2 = load(out2, "summary.json")
        self.assertEqual((s2["completed"], s2["slo_attainment"], s2["goodput_rps"]), (2, 0.0, 0.0))
        # Two runs overlaid.
        cmp_dir = os.path.join(self.dir, "cmp")
        p = bench("--compare", out, out2, "--label", "first,second", "--out", cmp_dir)
        self.assertEqual(p.returncode, 0, p.stderr)
        with open(os.path.join(cmp_dir, "compare.md")) as f:
            text = f.read()
        self.assertIn("| first | 4 | 0 |", text)
        self.assertIn("| second | 2 | 0 |", text)
        self.assertTrue(is_png(os.path.join(cmp_dir, "latency_cdf.png")))

    def test_phases_and_utilisation_from_scraped_metrics(self):
        # The fake tandem's rule: 1 ms of prefill busy time per prompt word on prefill-0 and 2 ms
        # of decode busy time per output token on decode-0, each 1 thread (2 threads / 2).
        counters = fake_tandem.Counters("cache-load", "none", elastic=True)
        self.server = FakeServer(FakeConfig(ttft_ms=20.0, gaps_ms=[5.0]), admit=counters.admit,
                                 metrics=counters.text)
        out = os.path.join(self.dir, "run")
        p = bench("--base-url", self.server.base, "--phases",
                  "n=4,in=200,out=4,rate=20;n=3,in=20,out=40,rate=inf;n=2,in=100,out=8,rate=10",
                  "--scrape-metrics-interval-s", "0.2", "--cores", "4", "--slo-ttft-ms", "1000",
                  "--slo-tbt-ms", "1000", "--warmup", "1", "--out", out)
        self.assertEqual(p.returncode, 0, p.stderr)
        res = load(out)
        s = res["summary"]
        self.assertEqual((s["completed"], s["failed"]), (9, 0))
        self.assertEqual([r["phase"] for r in res["requests"]], [0] * 4 + [1] * 3 + [2] * 2)
        self.assertEqual([(ph["phase"], ph["requests"], ph["slo_attainment"]) for ph in s["phases"]],
                         [(0, 4, 1.0), (1, 3, 1.0), (2, 2, 1.0)])
        self.assertIn("3 phases back to back", res["config"]["workload_desc"])
        with open(os.path.join(out, "metrics_timeseries.jsonl")) as f:
            rows = [json.loads(line) for line in f]
        self.assertGreaterEqual(len(rows), 3)
        self.assertEqual(rows[0]["t"], min(r["t"] for r in rows))
        self.assertTrue(all(a["t"] < b["t"] for a, b in zip(rows, rows[1:])))
        names = {smp["name"] for smp in rows[-1]["samples"]}
        self.assertEqual(names, set(scrape.FAMILIES))
        u = s["utilisation"]
        # Warm-up (one streamed request) happened before the first scrape: not counted.
        prefill_s = 0.001 * (4 * 200 + 3 * 20 + 2 * 100)
        decode_s = 0.002 * (4 * 4 + 3 * 40 + 2 * 8)
        self.assertAlmostEqual(u["busy_core_s"], prefill_s + decode_s, places=6)
        self.assertAlmostEqual(u["available_core_s"], 4 * s["duration_s"], places=6)
        self.assertAlmostEqual(u["utilisation"], (prefill_s + decode_s) / (4 * s["duration_s"]), places=6)
        self.assertAlmostEqual(u["useful_utilisation"], u["utilisation"], places=6)   # all within SLO
        self.assertAlmostEqual(u["core_s_per_request_within_slo"], 4 * s["duration_s"] / 9, places=6)
        self.assertEqual(u["computed_tokens"], {"prefill": 1060.0, "decode": 152.0})
        self.assertEqual(sorted(u["workers"]), ["decode-0", "prefill-0"])
        self.assertAlmostEqual(u["by_role"]["decode"]["core_s"], decode_s, places=6)
        self.assertEqual(u["role_switches"], {"prefill/decode": 2.0})    # every 4th of 9 requests
        self.assertEqual(u["planner_decisions"], {"hold/balanced": 7.0, "switch/decode_load": 2.0})
        self.assertEqual(u["series"][-1]["workers"], {"prefill": 1, "decode": 1, "mixed": 0})
        self.assertEqual(u["series"][-1]["target"], {"prefill": 1, "decode": 1})
        self.assertTrue(is_png(os.path.join(out, "utilisation.png")))
        with open(os.path.join(out, "summary.md")) as f:
            md = f.read()
        self.assertIn("Utilisation of 4 cores", md)
        self.assertIn("approximated by tokens", md)
        self.assertIn("| 2 | 2 | 2 | 100.0% |", md)          # the phase table
        self.assertIn("Role switches (from/to): prefill/decode 2", md)

    def test_server_without_metrics_and_scraping_off(self):
        srv = self.start(ttft_ms=5.0, gaps_ms=[5.0])   # GET /metrics answers a JSON model list
        out = os.path.join(self.dir, "plain")
        p = bench("--base-url", srv.base, "--num-requests", "3", "--input-len", "10",
                  "--output-len", "3", "--scrape-metrics-interval-s", "0.1", "--out", out)
        self.assertEqual(p.returncode, 0, p.stderr)
        s = load(out, "summary.json")
        self.assertIsNone(s["utilisation"])
        # Its /metrics is not Prometheus text: every scrape is counted as failed, the run goes on.
        self.assertGreaterEqual(s["metrics_scrape"]["errors"], 2)
        self.assertEqual(s["metrics_scrape"]["scrapes"], 0)
        self.assertFalse(os.path.exists(os.path.join(out, "utilisation.png")))
        self.assertNotIn("phases", s)
        out = os.path.join(self.dir, "off")
        p = bench("--base-url", srv.base, "--num-requests", "2", "--input-len", "10",
                  "--output-len", "3", "--scrape-metrics-interval-s", "0", "--out", out, "--no-plots")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertNotIn("metrics_scrape", load(out, "summary.json"))
        self.assertFalse(os.path.exists(os.path.join(out, "metrics_timeseries.jsonl")))

    def test_failures_rejections_timeouts_and_short_outputs_are_counted(self):
        srv = self.start(ttft_ms=20.0, gaps_ms=[10.0], reject_tokens=5, short_tokens=6, hang_tokens=7)
        trace = os.path.join(self.dir, "trace.jsonl")
        write_trace(trace, [(0, 40, 4, [1]), (0, 40, 5, [2]), (0, 40, 6, [3]), (0, 40, 7, [4]),
                            (0, 40, 4, [5])])
        out = os.path.join(self.dir, "run")
        p = bench("--base-url", srv.base, "--trace", trace, "--request-timeout-s", "1.5",
                  "--slo-ttft-ms", "1000", "--slo-tbt-ms", "1000", "--out", out, "--no-plots")
        self.assertEqual(p.returncode, 0, p.stderr)
        s = load(out, "summary.json")
        self.assertEqual((s["requests"], s["completed"], s["failed"], s["rejected"], s["timed_out"]),
                         (5, 3, 2, 1, 1))
        self.assertEqual(s["short_output_requests"], [{"index": 2, "requested": 6, "returned": 2}])
        self.assertAlmostEqual(s["slo_attainment"], 3 / 5)
        self.assertAlmostEqual(s["goodput_rps"], 3 / s["duration_s"], places=6)
        self.assertEqual(sorted(f["index"] for f in s["failures"]), [1, 3])
        recs = {r["index"]: r for r in load(out)["requests"]}
        self.assertEqual((recs[1]["ok"], recs[1]["status"]), (False, 503))
        self.assertIn("overloaded", recs[1]["error"])
        self.assertEqual((recs[3]["ok"], recs[3]["error_kind"]), (False, "timeout"))
        self.assertEqual(s["ttft_ms"]["count"], 3)  # failed requests are not in the latencies
        with open(os.path.join(out, "summary.md")) as f:
            md = f.read()
        self.assertIn("failed 2", md)
        self.assertIn("#2: 2 of 6", md)

    def test_synthetic_arrivals_closed_loop_and_shared_prefix(self):
        srv = self.start(ttft_ms=5.0, gaps_ms=[5.0])
        out = os.path.join(self.dir, "poisson")
        p = bench("--base-url", srv.base, "--num-requests", "30", "--input-len", "20",
                  "--output-len", "2", "--request-rate", "20", "--seed", "3", "--out", out,
                  "--no-plots")
        self.assertEqual(p.returncode, 0, p.stderr)
        recs = load(out)["requests"]
        sched = [r["scheduled_s"] for r in recs]
        mean_gap = (sched[-1] - sched[0]) / (len(sched) - 1)
        self.assertTrue(0.03 < mean_gap < 0.08, mean_gap)   # Poisson at 20/s: about 0.05 s
        arrivals = sorted(e["t"] for e in srv.log)
        # Each arrival on schedule: typically within a few ms; a loaded machine may delay one.
        # Deviations are taken around their median (a constant offset is not a schedule error).
        raw = sorted(((a - arrivals[0]) - s) * 1000.0 for s, a in zip(sched, arrivals))
        offset = raw[len(raw) // 2]
        self.assertLess(abs(offset), 100.0, raw)
        dev = sorted(abs(x - offset) for x in raw)
        self.assertLess(dev[len(dev) // 2], 15.0, raw)
        self.assertLess(dev[-1], 100.0, raw)
        srv.log.clear()
        srv.max_in_flight = 0
        srv.config.ttft_ms = 100.0
        out = os.path.join(self.dir, "closed")
        p = bench("--base-url", srv.base, "--num-requests", "9", "--input-len", "10",
                  "--output-len", "3", "--closed-loop", "3", "--shared-prefix-len", "40",
                  "--num-prefixes", "2", "--out", out, "--no-plots")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(srv.max_in_flight, 3)
        self.assertEqual(load(out, "summary.json")["completed"], 9)
        words = [e["body"]["prompt"].split() for e in srv.log]
        self.assertEqual(len(words), 9)
        groups = {}
        for w in words:
            self.assertEqual(len(w), 50)
            groups.setdefault(tuple(w[:40]), []).append(w)
        self.assertEqual(sorted(len(g) for g in groups.values()), [4, 5])
        self.assertEqual(len({tuple(w[40:]) for w in words}), 9)

    def test_http_429_counts_as_rejected(self):
        srv = self.start(ttft_ms=10.0, gaps_ms=[5.0], reject_tokens=3, reject_status=429)
        trace = os.path.join(self.dir, "trace.jsonl")
        write_trace(trace, [(0, 40, 3, [1]), (0, 40, 4, [2]), (0, 40, 3, [3])])
        out = os.path.join(self.dir, "run")
        p = bench("--base-url", srv.base, "--trace", trace, "--slo-ttft-ms", "1000",
                  "--out", out, "--no-plots")
        self.assertEqual(p.returncode, 0, p.stderr)
        s = load(out, "summary.json")
        self.assertEqual((s["requests"], s["completed"], s["failed"], s["rejected"], s["timed_out"]),
                         (3, 1, 2, 2, 0))
        self.assertAlmostEqual(s["slo_attainment"], 1 / 3)
        recs = {r["index"]: r for r in load(out)["requests"]}
        self.assertEqual([recs[i]["status"] for i in (0, 2)], [429, 429])
        self.assertEqual(recs[0]["error_kind"], "http")

    def _sweep_prompts(self, *extra):
        """Runs a two-rate sweep of a four-request trace; returns (sweep.json, sweep.md, stdout,
        {rate index: {trace row: prompt words}})."""
        srv = self.start(ttft_ms=5.0, gaps_ms=[2.0])
        trace = os.path.join(self.dir, "trace.jsonl")
        # Rows told apart by their output lengths (2..5 tokens, --output-scale 1). Rows 0 and 1:
        # the same ids; row 2 shares the first block with them; row 3 shares nothing.
        write_trace(trace, [(0, 1024, 2, [1, 2]), (100, 1024, 3, [1, 2]),
                            (200, 700, 4, [1, 3]), (300, 1000, 5, [4, 5])])
        out = os.path.join(self.dir, "sweep")
        p = bench("--base-url", srv.base, "--trace", trace, "--length-scale", "0.1",
                  "--output-scale", "1", "--sweep-rates", "20,40", "--out", out, "--no-plots", *extra)
        self.assertEqual(p.returncode, 0, p.stderr)
        log = sorted(srv.log, key=lambda e: e["t"])
        self.assertEqual(len(log), 8)
        by_rate = {}
        for k, e in enumerate(log):  # the sweep runs its rates one after the other
            by_rate.setdefault(k // 4, {})[e["body"]["max_tokens"] - 2] = e["body"]["prompt"].split()
        self.assertEqual([sorted(v) for v in by_rate.values()], [[0, 1, 2, 3]] * 2)
        with open(os.path.join(out, "sweep.md")) as f:
            md = f.read()
        return load(out, "sweep.json"), md, p.stdout, by_rate

    def test_rate_sweep_sends_fresh_prompts_per_rate(self):
        sweep, md, stdout, by_rate = self._sweep_prompts()
        self.assertEqual(sweep["prompts"], "fresh per rate")
        self.assertEqual([pt["prompt_salt"] for pt in sweep["points"]], [0, 1])
        self.assertIn("prompts: fresh per rate", md)
        self.assertIn("prompts: fresh per rate", stdout)
        for words in by_rate.values():
            # Within a rate the trace's prefix sharing is kept (51-word blocks at scale 0.1).
            self.assertEqual([len(words[i]) for i in range(4)], [102, 102, 70, 100])
            self.assertEqual(words[0], words[1])
            self.assertEqual(words[2][:51], words[0][:51])
            self.assertNotEqual(words[2][51:], words[0][51:70])
            self.assertNotEqual(words[3][:51], words[0][:51])
        # Across rates nothing is shared: a row's prompt differs from its prompt at the other
        # rate at every position, starting with the first word, and no 8-word run of any
        # prompt of one rate appears in any prompt of the other.
        for i in range(4):
            self.assertTrue(all(x != y for x, y in zip(by_rate[0][i], by_rate[1][i])), i)

        def runs(words):
            return {tuple(words[k:k + 8]) for k in range(len(words) - 7)}

        first = set().union(*(runs(w) for w in by_rate[0].values()))
        second = set().union(*(runs(w) for w in by_rate[1].values()))
        self.assertEqual(first & second, set())
        # The first rate's prompts are those of a plain (unswept) run.
        self.assertEqual(by_rate[0][0], prompts.trace_prompt([1, 2], 102, 51).split())

    def test_rate_sweep_same_prompts_on_request(self):
        sweep, md, stdout, by_rate = self._sweep_prompts("--sweep-same-prompts")
        self.assertEqual(sweep["prompts"], "same at every rate")
        self.assertEqual([pt["prompt_salt"] for pt in sweep["points"]], [0, 0])
        self.assertIn("prompts: same at every rate", md)
        self.assertIn("prompts: same at every rate", stdout)
        self.assertEqual(by_rate[0], by_rate[1])
        self.assertEqual(by_rate[0][0], by_rate[0][1])

    def test_rate_sweep_finds_highest_rate_meeting_slo(self):
        # Capacity one request at a time, 100 + 5 * 20 = 200 ms each: fine at 2 req/s, a queue at 25.
        srv = self.start(ttft_ms=100.0, gaps_ms=[20.0], serial=True)
        out = os.path.join(self.dir, "sweep")
        p = bench("--base-url", srv.base, "--num-requests", "8", "--input-len", "10",
                  "--output-len", "6", "--burstiness", "100", "--sweep-rates", "2,25",
                  "--slo-ttft-ms", "250", "--out", out)
        self.assertEqual(p.returncode, 0, p.stderr)
        sweep = load(out, "sweep.json")
        att = {pt["rate"]: pt["summary"]["slo_attainment"] for pt in sweep["points"]}
        self.assertGreaterEqual(att[2.0], 0.9)
        self.assertLess(att[25.0], 0.9)
        self.assertEqual(sweep["max_rate_meeting_target"], 2.0)
        self.assertTrue(is_png(os.path.join(out, "attainment_vs_rate.png")))
        self.assertTrue(os.path.exists(os.path.join(out, "rate_2", "summary.json")))


class CommandLine(unittest.TestCase):
    def test_help_passes_through(self):
        p = bench("--help")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("usage: tandem bench serve", p.stdout)
        self.assertIn("--slo-tbt-ms", p.stdout)

    def test_bad_input_gives_clear_errors(self):
        p = bench("--base-url", "http://127.0.0.1:9", "--trace", "/nonexistent/trace.jsonl", "--out", "/tmp/x")
        self.assertEqual(p.returncode, 2)
        self.assertIn("cannot read trace", p.stderr)
        self.assertNotIn("Traceback", p.stderr)
        p = bench("--base-url", "ftp://x", "--out", "/tmp/x")
        self.assertEqual(p.returncode, 2)
        self.assertIn("not an http(s) URL", p.stderr)
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl") as f:
            f.write("{\"timestamp\": 0}\n")
            f.flush()
            p = bench("--base-url", "http://127.0.0.1:9", "--trace", f.name, "--out", "/tmp/x")
        self.assertEqual(p.returncode, 2)
        self.assertIn("not a trace record", p.stderr)
        p = bench("--base-url", "http://127.0.0.1:9", "--out", "/tmp/x", "--prompt-salt", "-1")
        self.assertEqual(p.returncode, 2)
        self.assertIn("--prompt-salt must be >= 0", p.stderr)
        p = bench("--base-url", "http://127.0.0.1:9", "--out", "/tmp/x", "--sweep-same-prompts")
        self.assertEqual(p.returncode, 2)
        self.assertIn("--sweep-same-prompts needs --sweep-rates", p.stderr)
        for extra, msg in ((["--phases", "n=2,in=8"], "--phases phase 1 ('n=2,in=8'): missing out"),
                           (["--phases", "n=2,in=8,out=2", "--trace", "t.jsonl"], "drop --trace"),
                           (["--scrape-metrics-interval-s", "-1"], "--scrape-metrics-interval-s must be >= 0"),
                           (["--cores", "0"], "--cores must be >= 1")):
            p = bench("--base-url", "http://127.0.0.1:9", "--out", "/tmp/x", *extra)
            self.assertEqual(p.returncode, 2, extra)
            self.assertIn(msg, p.stderr, extra)
            self.assertNotIn("Traceback", p.stderr)

    @needs_bin
    def test_missing_script_is_reported_by_the_binary(self):
        p = bench("--x", env={"TANDEM_BENCH_SCRIPT": "/nonexistent/serve_bench.py"})
        self.assertEqual(p.returncode, 2)
        self.assertIn("benchmark script not found", p.stderr)


@needs_bin
class AgainstTandem(unittest.TestCase):
    """The real server: exact output lengths (usage), real prefix reuse, chat streaming."""

    @classmethod
    def setUpClass(cls):
        from server_util import Server
        cls.server = Server(max_model_len=2048)

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def test_trace_slice_against_tandem(self):
        with tempfile.TemporaryDirectory() as d:
            trace = os.path.join(d, "trace.jsonl")
            write_trace(trace, [(0, 1024, 64, [1, 2]), (300, 1300, 64, [1, 2, 3]),
                                (600, 1024, 64, [1, 4]), (900, 600, 48, [5, 6])])
            before = self.server.metrics()["tandem_prefix_cache_hit_tokens_total"]
            out = os.path.join(d, "run")
            p = bench("--base-url", self.server.base, "--trace", trace, "--length-scale", "0.25",
                      "--time-scale", "1", "--max-requests", "4", "--slo-ttft-ms", "60000",
                      "--slo-tbt-ms", "60000", "--out", out, "--no-plots")
            self.assertEqual(p.returncode, 0, p.stderr)
            s = load(out, "summary.json")
            self.assertEqual((s["completed"], s["failed"], s["short_outputs"]), (4, 0, 0), s["failures"])
            recs = load(out)["requests"]
            self.assertEqual([r["completion_tokens"] for r in recs], [16, 16, 16, 12])
            for r in recs:
                # Prompt lengths as the server counted them: within 10% of the target.
                self.assertLess(abs(r["prompt_tokens"] - r["input_tokens_target"]),
                                0.1 * r["input_tokens_target"] + 2, r)
                self.assertLess(r["ttft_ms"], r["e2e_ms"])
                self.assertEqual(len(r["itl_ms"]), r["chunks"] - 1)
            self.assertEqual(s["slo_attainment"], 1.0)
            hits = self.server.metrics()["tandem_prefix_cache_hit_tokens_total"] - before
            self.assertGreaterEqual(hits, 128)  # the shared first block (128 tokens) was reused

    def test_chat_closed_loop_against_tandem(self):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "chat")
            p = bench("--base-url", self.server.base, "--endpoint", "chat", "--num-requests", "4",
                      "--input-len", "64", "--output-len", "12", "--closed-loop", "2", "--out", out,
                      "--no-plots")
            self.assertEqual(p.returncode, 0, p.stderr)
            s = load(out, "summary.json")
            self.assertEqual((s["completed"], s["failed"], s["short_outputs"]), (4, 0, 0))
            self.assertEqual(s["output_tokens_from_usage"], 4)
            self.assertEqual(s["total_output_tokens"], 48)
            self.assertGreater(s["tpot_ms"]["p50"], 0)


if __name__ == "__main__":
    unittest.main()
