"""bench/scheduling_compare.py: its /metrics parsing and histogram quantiles, the conversation
slice, the command line, and every experiment end to end against a fake `tandem serve`
(fake_tandem.py, whose counters follow a known rule) -- no build needed.

    cd tests/bench && python3 -m unittest -v test_scheduling_compare
"""
import json
import math
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.environ.get("TANDEM_SOURCE_DIR", os.path.abspath(os.path.join(HERE, "..", "..")))
SCRIPT = os.path.join(SOURCE_DIR, "bench", "scheduling_compare.py")
FAKE = os.path.join(HERE, "fake_tandem.py")
sys.path.insert(0, os.path.join(SOURCE_DIR, "bench"))

import scheduling_compare as sc  # noqa: E402


TRACE_FILE = None  # a small synthetic trace in the Mooncake format (setUpModule)


def setUpModule():
    """10 conversations of 4 turns, interleaved: each turn's hash_ids extend the previous turn's
    (as a conversation's do in Mooncake's trace), so the driver finds multi-turn conversations
    without the shared data folder."""
    global TRACE_FILE
    f = tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False)
    line = 0
    for turn in range(4):
        for conv in range(10):
            ids = [1000 * conv + i for i in range(3 * (turn + 1))]
            f.write(json.dumps({"timestamp": 500 * line, "input_length": 512 * len(ids),
                                "output_length": 100, "hash_ids": ids}) + "\n")
            line += 1
    f.close()
    TRACE_FILE = f.name


def tearDownModule():
    os.unlink(TRACE_FILE)


def driver(*args, env=None, timeout=300):
    e = dict(os.environ)
    e.update(env or {})
    if "--trace" not in args:
        args = (*args, "--trace", TRACE_FILE)
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True,
                          timeout=timeout, env=e)


class Histograms(unittest.TestCase):
    def test_quantile_interpolates_inside_buckets(self):
        b = {0.1: 2.0, 1.0: 3.0, math.inf: 4.0}
        self.assertAlmostEqual(sc.histogram_quantile(b, 0.25), 0.05)   # rank 1 of 2 in [0, 0.1]
        self.assertAlmostEqual(sc.histogram_quantile(b, 0.5), 0.1)
        self.assertAlmostEqual(sc.histogram_quantile(b, 0.6), 0.1 + 0.9 * 0.4)  # rank 2.4
        self.assertEqual(sc.histogram_quantile(b, 0.9), 1.0)   # in +Inf: the highest finite bound
        self.assertAlmostEqual(sc.histogram_quantile({0.5: 0.0, 1.0: 10.0, math.inf: 10.0}, 0.5), 0.75)

    def test_quantile_edge_cases(self):
        self.assertIsNone(sc.histogram_quantile({}, 0.5))
        self.assertIsNone(sc.histogram_quantile({0.1: 0.0, math.inf: 0.0}, 0.5))
        self.assertEqual(sc.histogram_quantile({0.0: 5.0, 1.0: 10.0, math.inf: 10.0}, 0.2), 0.0)
        self.assertEqual(sc.histogram_quantile({math.inf: 3.0}, 0.5), None)
        with self.assertRaises(ValueError):
            sc.histogram_quantile({1.0: 1.0}, 1.0)

    def test_parse_total_delta_and_buckets(self):
        text = "\n".join([
            "# HELP tandem_rejections_total Rejected requests.",
            "# TYPE tandem_rejections_total counter",
            'tandem_rejections_total{reason="ttft"} 3',
            'tandem_rejections_total{reason="tbt"} 2',
            'tandem_prefill_tokens_total{outcome="slo_met"} 1200',
            'tandem_prefill_tokens_total{outcome="slo_missed"} 300 1700000000000',
            'odd{a="x\\"y",b="c"} 1.5',
            "tandem_prefix_cache_hit_tokens_total 64",
            'err_bucket{worker="p0",le="0.1"} 1', 'err_bucket{worker="p0",le="+Inf"} 2',
            'err_bucket{worker="p1",le="0.1"} 3', 'err_bucket{worker="p1",le="+Inf"} 3',
            "err_sum 0.9", "err_count 5",
            "not a sample line", ""])
        m = sc.parse_metrics(text)
        self.assertEqual(sc.total(m, "tandem_rejections_total"), 5)
        self.assertEqual(sc.total(m, "tandem_rejections_total", reason="tbt"), 2)
        self.assertIsNone(sc.total(m, "tandem_rejections_total", reason="other"))
        self.assertIsNone(sc.total(m, "tandem_local_prefill_requests_total"))
        self.assertEqual(sc.total(m, "tandem_prefill_tokens_total", outcome="slo_missed"), 300)
        self.assertEqual(sc.total(m, "odd", a='x"y'), 1.5)
        self.assertEqual(sc.by_label(m, "tandem_rejections_total", "reason"), {"ttft": 3, "tbt": 2})
        self.assertEqual(sc.histogram_buckets(m, "err"), {0.1: 4.0, math.inf: 5.0})
        self.assertAlmostEqual(sc.histogram_mean(m, "err"), 0.18)
        self.assertEqual(sc.histogram_buckets(m, "absent"), {})
        before = sc.parse_metrics('tandem_rejections_total{reason="ttft"} 1\nerr_count 2\n')
        d = sc.metrics_delta(m, before)
        self.assertEqual(sc.total(d, "tandem_rejections_total", reason="ttft"), 2)
        self.assertEqual(sc.total(d, "err_count"), 3)
        self.assertEqual(sc.total(d, "tandem_prefix_cache_hit_tokens_total"), 64)
        self.assertEqual(sc.add_buckets({0.1: 1.0}, {0.1: 2.0, 1.0: 3.0}), {0.1: 3.0, 1.0: 3.0})


class ConversationSlice(unittest.TestCase):
    def test_groups_turns_of_conversations(self):
        rows = [  # (timestamp, input, ids): conversations keyed by the second id
            (0, 1500, [0, 10, 11]), (0, 900, [0, 20]), (1000, 2000, [0, 10, 11, 12]),
            (1500, 600, [0, 30]), (2000, 2600, [0, 10, 11, 12, 13]), (2500, 1000, [0, 20, 21]),
            (3000, 50000, [0, 10] + list(range(100, 198))), (3500, 1200, [0, 20, 21, 22]),
            (4000, 700, [5]), (4500, 3100, [0, 10, 11, 12, 13, 14])]
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
            for ts, n, ids in rows:
                f.write(json.dumps({"timestamp": ts, "input_length": n, "output_length": 10,
                                    "hash_ids": ids}) + "\n")
        try:
            got = sc.conversation_slice(f.name, 0, 100, 10, 10000, 3, 3)
            # Conversation 10 (4 short turns, the 50,000-token one left out) gives its first 3,
            # conversation 20 its 3, conversation 30 (1 turn) and the one-id line none.
            self.assertEqual([(d["timestamp"], d["hash_ids"][1]) for d in got],
                             [(0, 10), (0, 20), (1000, 10), (2000, 10), (2500, 20), (3500, 20)])
            self.assertEqual(len(sc.conversation_slice(f.name, 0, 100, 4, 10000, 3, 3)), 4)
            self.assertEqual(sc.conversation_slice(f.name, 0, 100, 10, 10000, 5, 5), [])
            self.assertEqual(len(sc.conversation_slice(f.name, 2, 100, 10, 10000, 2, 3)), 5)
            # Reusable: whole 512-token blocks seen before (block 0 of every row after the first,
            # and the conversation's earlier blocks), capped at each row's length.
            first = sc.conversation_slice(f.name, 0, 100, 10, 10000, 3, 3)
            self.assertEqual(sc.reusable_prompt_tokens(first),
                             0 + 512 + 1536 + 2048 + min(1024, 1000) + min(1536, 1200))
        finally:
            os.unlink(f.name)

    def test_capacity_slice_gets_poisson_arrivals(self):
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
            for i in range(30):
                f.write(json.dumps({"timestamp": 3000 * (i // 10), "input_length": 100 + i,
                                    "output_length": 5, "hash_ids": [0, i]}) + "\n")
        try:
            rows = sc.trace_rows(f.name, 5, 20)
            self.assertEqual([d["input_length"] for d in rows], list(range(105, 125)))
            self.assertEqual(len(set(d["timestamp"] for d in rows)), 3)    # bursts
            retimed = sc.poisson_retimed(rows)
            ts = [d["timestamp"] for d in retimed]
            self.assertEqual(ts[0], 0.0)
            self.assertTrue(all(a < b for a, b in zip(ts, ts[1:])), ts)
            self.assertTrue(5000 < ts[-1] < 40000, ts[-1])                 # 19 gaps of mean 1 s
            self.assertEqual([(d["input_length"], d["hash_ids"]) for d in retimed],
                             [(d["input_length"], d["hash_ids"]) for d in rows])
            self.assertEqual(sc.poisson_retimed(rows), retimed)            # deterministic
            with self.assertRaisesRegex(sc.RunError, "no requests from line 40"):
                sc.trace_rows(f.name, 40, 5)
        finally:
            os.unlink(f.name)

    def test_bad_trace_line_is_reported(self):
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
            f.write('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [0, 1]}\n')
            f.write('{"timestamp": 0}\n')
        try:
            with self.assertRaisesRegex(sc.RunError, r":2: not a trace record"):
                sc.conversation_slice(f.name, 0, 10, 5, 1000, 1, 2)
        finally:
            os.unlink(f.name)


class CommandLine(unittest.TestCase):
    def test_bad_arguments_give_clear_errors(self):
        for args, msg in ((["--capacity-rates", "1,x"], "--capacity-rates must be comma-separated"),
                          (["--capacity-rates", "0,1"], "--capacity-rates must be positive"),
                          (["--capacity-modes", "default,split"], "--capacity-modes must name"),
                          (["--rounds", "0"], "--rounds must be >= 1"),
                          (["--target", "1.5"], "--target must be in (0, 1]"),
                          (["--experiment", "speed"], "invalid choice"),
                          (["--policies-min-turns", "6", "--policies-max-turns", "5"],
                           "--policies-min-turns must be <=")):
            p = driver(*args)
            self.assertEqual(p.returncode, 2, args)
            self.assertIn(msg, p.stderr, args)
            self.assertNotIn("Traceback", p.stderr)

    def test_defaults_and_quick_sizes(self):
        a = sc.parse_args([])
        self.assertEqual((a.experiments, a.rounds, a.policies_requests, a.rates, a.tbt_slos),
                         (list(sc.EXPERIMENTS), 1, 40, [0.5, 1.0, 2.0, 4.0], [50.0, 1000.0]))
        q = sc.parse_args(["--quick", "--experiment", "capacity", "--capacity-requests", "3"])
        self.assertEqual((q.experiments, q.policies_requests, q.capacity_requests, q.rates),
                         (["capacity"], 9, 3, [1.0, 4.0]))
        self.assertTrue(q.tandem.endswith(os.path.join("build", "tandem")))

    def test_missing_binary_and_flags_are_reported(self):
        p = driver("--tandem", "/nonexistent/tandem", "--model", "/dev/null")
        self.assertEqual(p.returncode, 2)
        self.assertIn("no tandem binary at /nonexistent/tandem", p.stderr)
        p = driver("--tandem", FAKE, "--model", "/nonexistent.gguf")
        self.assertEqual(p.returncode, 2)
        self.assertIn("no model at /nonexistent.gguf", p.stderr)
        with tempfile.TemporaryDirectory() as d:
            p = driver("--tandem", FAKE, "--model", "/dev/null", "--out", d,
                       env={"FAKE_TANDEM_OLD": "1"})
            self.assertEqual(p.returncode, 2)
            self.assertIn("experiment policies needs tandem serve --placement-policy", p.stderr)
            self.assertIn("experiment overload needs tandem serve --admission", p.stderr)


class AgainstFakeTandem(unittest.TestCase):
    def test_all_experiments(self):
        with tempfile.TemporaryDirectory() as d:
            p = driver("--tandem", FAKE, "--model", "/dev/null", "--quick", "--policies-span-s", "1",
                       "--capacity-rates", "10,20", "--out", d)
            self.assertEqual(p.returncode, 0, p.stderr[-3000:])
            with open(os.path.join(d, "tables.md")) as f:
                tables = f.read()
            for title in ("## Placement policies", "## Admission under overload", "## Capacity"):
                self.assertIn(title, tables)
                self.assertIn(title, p.stdout)
            self.assertIn("length scale 0.1: 51 tokens per 512-token trace block = 3.2 KV blocks of 16",
                          tables)

            with open(os.path.join(d, "policies", "results.json")) as f:
                pol = json.load(f)
            fig = pol["figures"]
            # Every policy's mean TTFT was measured (values are timings: not asserted here).
            for policy in sc.POLICIES:
                self.assertGreater(fig[policy]["ttft_mean"], 0, policy)
            self.assertIn("| load-balance |", tables)
            self.assertRegex(tables, r"\| load-balance \|[^\n]*\| 1\.00x \|")
            # Hits and computed tokens as the fake counts them, from the measured requests only.
            with open(os.path.join(d, "policies", "trace_slice.jsonl")) as f:
                n_slice = sum(1 for _ in f)
            for policy in sc.POLICIES:
                self.assertEqual((fig[policy]["completed"], fig[policy]["failed"]), (n_slice, 0))
            self.assertEqual(fig["random"]["hit_tokens"], 0)
            self.assertGreater(fig["cache-aware"]["hit_tokens"], 0)
            self.assertAlmostEqual(fig["cache-aware"]["hit_tokens"] + fig["cache-aware"]["computed_tokens"],
                                   fig["random"]["computed_tokens"])
            # Prediction errors: every observation 0.08 (bucket 0.05..0.1) and 0.3 (0.2..0.5).
            pr = pol["prediction"]["cache-load"]
            self.assertEqual(pr["ttft"]["count"], n_slice)
            self.assertAlmostEqual(pr["ttft"]["p50"], 0.075)
            self.assertAlmostEqual(pr["ttft"]["p90"], 0.095)
            self.assertAlmostEqual(pr["tbt"]["p50"], 0.35)
            self.assertAlmostEqual(pr["tbt"]["p90"], 0.47)
            self.assertIsNone(pol["prediction"]["random"]["ttft"]["p50"])
            self.assertIn(f"| cache-load | {n_slice} | 0.075 | 0.095 | {n_slice} | 0.35 | 0.47 |", tables)
            # Every policy's server got its policy, admission none and the shared topology.
            for policy in sc.POLICIES:
                cmd = pol["runs"][policy][0]["command"]
                self.assertEqual(cmd[cmd.index("--placement-policy") + 1], policy)
                self.assertEqual(cmd[cmd.index("--admission") + 1], "none")
                self.assertEqual(cmd[cmd.index("--prefill-workers") + 1], "2")

            with open(os.path.join(d, "overload", "results.json")) as f:
                ov = json.load(f)["figures"]
            # 12 requests: early rejects every 2nd, predictive every 3rd; none misses half.
            self.assertEqual((ov["none"]["served"], ov["none"]["rejected"]), (12, 0))
            self.assertEqual((ov["early"]["served"], ov["early"]["rejected"]), (6, 6))
            self.assertEqual((ov["predictive"]["served"], ov["predictive"]["rejected"]), (8, 4))
            self.assertAlmostEqual(ov["early"]["attainment"], 0.5)
            self.assertEqual(ov["early"]["wasted_prefill"], 0.0)
            self.assertEqual(ov["early"]["rejections"], {"ttft": 6})
            self.assertEqual(ov["predictive"]["rejections"], {"tbt": 4})
            self.assertAlmostEqual(ov["none"]["wasted_prefill"],
                                   ov["none"]["prefill_slo_missed"] / ov["none"]["prefill_tokens"])
            self.assertTrue(0.2 < ov["none"]["wasted_prefill"] < 0.8)
            self.assertRegex(tables, r"\| early \| 12 \| 6 \| 6 \| 0 \| 50% \| 100% \|"
                                     r"[^\n]*\| 0% \| ttft 6 \|")

            with open(os.path.join(d, "capacity", "results.json")) as f:
                cap = json.load(f)
            # The fake's default admission (predictive) rejects 1 in 3: 4 of 6 meet the SLOs.
            for key, f in cap["figures"].items():
                self.assertEqual(f["attainment_by_rate"], {"10": 4 / 6, "20": 4 / 6}, key)
                self.assertIsNone(f["max_rate"])
            for runs in cap["runs"].values():
                self.assertEqual(runs[0]["sweep"]["prompts"], "fresh per rate")
                self.assertEqual([pt["prompt_salt"] for pt in runs[0]["sweep"]["points"]], [0, 1])
            with open(os.path.join(d, "capacity", "trace_slice.jsonl")) as f:
                ts = [json.loads(line)["timestamp"] for line in f]
            self.assertEqual(len(ts), 6)
            self.assertTrue(all(a < b for a, b in zip(ts, ts[1:])), ts)      # Poisson, not bursts
            colo = cap["runs"]["colocated@50"][0]["command"]
            self.assertEqual(colo[colo.index("--mode") + 1], "colocated")
            self.assertEqual(colo[colo.index("--slo-tbt-ms") + 1], "50")
            self.assertIn("| 50 | none (< 10) | none (< 10) | n/a |", tables)

    def test_capacity_with_loose_target_and_old_server(self):
        # A server without the scheduling flags still runs the capacity comparison, without
        # server SLOs (the fake then admits everything): every rate meets the target.
        with tempfile.TemporaryDirectory() as d:
            p = driver("--tandem", FAKE, "--model", "/dev/null", "--quick", "--experiment",
                       "capacity", "--capacity-rates", "10,20", "--capacity-tbt-slos", "1000",
                       "--serve-arg=--max-num-seqs=8", "--out", d, env={"FAKE_TANDEM_OLD": "1"})
            self.assertEqual(p.returncode, 0, p.stderr[-3000:])
            self.assertIn("no --slo-ttft-ms/--slo-tbt-ms", p.stderr)
            with open(os.path.join(d, "capacity", "results.json")) as f:
                cap = json.load(f)
            self.assertEqual(cap["figures"]["default@1000"]["max_rate"], 20.0)
            self.assertEqual(cap["figures"]["colocated@1000"]["max_rate"], 20.0)
            cmd = cap["runs"]["default@1000"][0]["command"]
            self.assertNotIn("--slo-tbt-ms", cmd)
            self.assertIn("--max-num-seqs=8", cmd)
            self.assertIn("| 1000 | 20 | 20 | 1.00x |", p.stdout)


if __name__ == "__main__":
    unittest.main()
