"""`tandem simulate` end to end: a synthetic load and a trace file in the Mooncake format through
the command line, the results in the serving benchmark's format (and `tandem bench serve
--compare` over two simulated runs), the checked-in profiles, and clear errors for bad input.

    TANDEM_BIN=build/tandem python3 -m unittest -v test_simulate   (from tests/sim)
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.environ.get("TANDEM_SOURCE_DIR", os.path.abspath(os.path.join(HERE, "..", "..")))
TANDEM = os.environ.get("TANDEM_BIN", os.path.join(SOURCE_DIR, "build", "tandem"))
A800 = os.path.join(SOURCE_DIR, "profiles", "llama3-70b-8xa800.json")
CPU = os.path.join(SOURCE_DIR, "profiles", "smollm2-135m-cpu-1t.json")


def simulate(*args, check=True):
    p = subprocess.run([TANDEM, "simulate", *map(str, args)], capture_output=True, text=True, timeout=300)
    if check and p.returncode != 0:
        raise AssertionError(f"tandem simulate {' '.join(map(str, args))}: rc {p.returncode}\n{p.stderr}")
    return p


def write_trace(path, n, gap_ms, input_len, output_len, shared_blocks):
    """n requests; each shares its first `shared_blocks` hash ids with the others (one system
    prompt), the rest unique."""
    with open(path, "w") as f:
        for i in range(n):
            blocks = (input_len + 511) // 512
            ids = list(range(shared_blocks)) + [1000 + i * 100 + b for b in range(blocks - shared_blocks)]
            f.write(json.dumps({"timestamp": i * gap_ms, "input_length": input_len,
                                "output_length": output_len, "hash_ids": ids}) + "\n")


class SimulateTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def test_synthetic_load_writes_the_benchmark_format(self):
        out = os.path.join(self.dir, "run")
        p = simulate("--profile", A800, "--requests", 200, "--rate", 2, "--prefill", 2, "--decode", 2,
                     "--slo-ttft-ms", 30000, "--slo-tbt-ms", 100, "--out", out, "--utilisation-interval-s", 5)
        self.assertIn("requests 200", p.stdout)
        with open(os.path.join(out, "results.json")) as f:
            res = json.load(f)
        self.assertEqual(len(res["requests"]), 200)
        s = res["summary"]
        self.assertEqual(s["requests"], 200)
        self.assertEqual(s["completed"] + s["failed"], 200)
        self.assertGreater(s["completed"], 150)
        for r in res["requests"]:
            if r["ok"]:
                self.assertGreater(r["ttft_ms"], 0)
                self.assertLessEqual(r["ttft_ms"], r["e2e_ms"])
                self.assertEqual(r["output_tokens"], r["requested_output_tokens"])
        with open(os.path.join(out, "utilisation.json")) as f:
            util = json.load(f)
        self.assertEqual([i["role"] for i in util["instances"]], ["prefill"] * 2 + ["decode"] * 2)
        for inst in util["instances"]:
            self.assertTrue(all(0 <= b <= 1 + 1e-9 for b in inst["busy_share"]), inst["name"])
        self.assertTrue(os.path.exists(os.path.join(out, "summary.md")))

    def test_trace_shared_prefix_is_reused(self):
        trace = os.path.join(self.dir, "trace.jsonl")
        write_trace(trace, 50, 1000, 8192, 50, shared_blocks=12)
        p = simulate("--profile", A800, "--trace", trace, "--prefill", 2, "--decode", 2, "--json")
        s = json.loads(p.stdout)
        self.assertEqual(s["completed"], 50)
        # 12 of 16 blocks are shared: after the first request on each prefill node, 3/4 of
        # every prompt comes from the prefix cache.
        self.assertGreater(s["simulation"]["prefix_cache_hit_share"], 0.6)

    def test_colocated_and_disaggregated_compare(self):
        trace = os.path.join(self.dir, "trace.jsonl")
        write_trace(trace, 60, 500, 16000, 200, shared_blocks=0)
        runs = []
        for name, flags in (("disagg", ["--prefill", 1, "--decode", 1]), ("coloc", ["--mixed", 2])):
            out = os.path.join(self.dir, name)
            simulate("--profile", A800, "--trace", trace, "--slo-ttft-ms", 30000, "--slo-tbt-ms", 100,
                     "--out", out, *flags)
            runs.append(out)
        cmp_out = os.path.join(self.dir, "cmp")
        p = subprocess.run([TANDEM, "bench", "serve", "--compare", *runs, "--label", "disagg,coloc",
                            "--out", cmp_out, "--no-plots"], capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        with open(os.path.join(cmp_out, "compare.md")) as f:
            table = f.read()
        self.assertIn("| disagg |", table)
        self.assertIn("| coloc |", table)
        # Long prompts chunked into the colocated instances' steps stretch their streams' gaps.
        tbt = {}
        for name, out in zip(("disagg", "coloc"), runs):
            with open(os.path.join(out, "summary.json")) as f:
                tbt[name] = json.load(f)["tbt_ms"]["p90"]
        self.assertLess(tbt["disagg"], tbt["coloc"])

    def test_the_measured_cpu_profile_runs(self):
        p = simulate("--profile", CPU, "--requests", 30, "--rate", 0.5, "--input-tokens", 300,
                     "--output-tokens", 30, "--json")
        s = json.loads(p.stdout)
        self.assertEqual(s["completed"], 30)
        # One 300-token prompt takes about half a second on one core.
        self.assertGreater(s["ttft_ms"]["p50"], 100)
        self.assertLess(s["ttft_ms"]["p50"], 5000)

    def test_bad_input_is_a_clear_error(self):
        bad = os.path.join(self.dir, "bad.jsonl")
        with open(bad, "w") as f:
            f.write('{"timestamp": 0, "input_length": 10, "output_length": 2}\n{"timestamp": 1}\n')
        p = simulate("--profile", A800, "--trace", bad, check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("bad.jsonl:2", p.stderr)
        prof = os.path.join(self.dir, "prof.json")
        with open(prof, "w") as f:
            f.write('{"roofline": {"model": {"layers": 0}, "hardware": {}}}')
        p = simulate("--profile", prof, check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("roofline model", p.stderr)
        p = simulate("--profile", A800, "--prefill", 1, "--decode", 0, check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("decode", p.stderr)


if __name__ == "__main__":
    unittest.main()
