"""bench/elastic_compare.py: its command line, figures and tables end to end against a fake
`tandem serve` (fake_tandem.py: known busy-time counters, --elastic listed unless
FAKE_TANDEM_NO_ELASTIC=1) -- no build needed.

    cd tests/bench && python3 -m unittest -v test_elastic_compare
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.environ.get("TANDEM_SOURCE_DIR", os.path.abspath(os.path.join(HERE, "..", "..")))
SCRIPT = os.path.join(SOURCE_DIR, "bench", "elastic_compare.py")
FAKE = os.path.join(HERE, "fake_tandem.py")
sys.path.insert(0, os.path.join(SOURCE_DIR, "bench"))

import elastic_compare as ec  # noqa: E402


def driver(*args, env=None, timeout=300):
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([sys.executable, SCRIPT, "--tandem", FAKE, "--model", "/dev/null", *args],
                          capture_output=True, text=True, timeout=timeout, env=e)


def _point(rate, attainment, util=None):
    return {"rate": rate, "summary": {"slo_attainment": attainment, "goodput_rps": rate * attainment,
                                      "utilisation": None if util is None else {
                                          "utilisation": util, "useful_utilisation": util / 2,
                                          "core_s_per_request_within_slo": 1 / util}}}


class Figures(unittest.TestCase):
    def test_capacity_and_figures_at_it(self):
        run = {"sweep": {"points": [_point(4.0, 0.5, 0.9), _point(1.0, 1.0, 0.3), _point(2.0, 0.95, 0.6)]}}
        f = ec.run_figures(run, 0.9)
        self.assertEqual((f["capacity"], f["rate"], f["below"]), (2.0, 2.0, False))
        self.assertEqual((f["goodput"], f["utilisation"], f["useful_utilisation"]), (1.9, 0.6, 0.3))
        self.assertEqual(f["attainment_by_rate"], {"1": 1.0, "2": 0.95, "4": 0.5})
        none = ec.run_figures({"sweep": {"points": [_point(2.0, 0.5), _point(1.0, 0.8)]}}, 0.9)
        self.assertEqual((none["capacity"], none["rate"], none["below"], none["utilisation"]),
                         (None, 1.0, True, None))
        # Medians over rounds; a round that met no rate counts as capacity 0.
        m = ec.summarize_runs([run, run, {"sweep": {"points": [_point(1.0, 0.5, 0.2), _point(2.0, 0.4, 0.2),
                                                                _point(4.0, 0.1, 0.2)]}}], 0.9)
        self.assertEqual((m["capacity"], m["utilisation"], m["rounds"], m["below"]), (2.0, 0.6, 3, False))
        self.assertIsNone(ec.summarize_runs([], 0.9))

    def test_arguments(self):
        a = ec.parse_args([])
        self.assertEqual((a.config_list, a.workload_list, a.rates, a.tbt_list, a.phase_requests),
                         (list(ec.CONFIGS), list(ec.WORKLOADS), [0.25, 0.5, 1.0, 2.0], [50.0, 1000.0], 12))
        self.assertEqual(ec.phases_spec(a), "n=12,in=1024,out=16,rate=1;n=12,in=64,out=256,rate=1;"
                                            "n=12,in=1024,out=16,rate=1")
        q = ec.parse_args(["--quick", "--configs", "elastic,static", "--rates", "3,1"])
        self.assertEqual((q.config_list, q.rates, q.trace_requests), (["static", "elastic"], [1.0, 3.0], 4))
        self.assertEqual(ec.config_args("elastic", 2)[-1], "--elastic")
        self.assertEqual(ec.config_args("colocated", 4), ["--mode", "colocated", "--threads", "4"])
        for args, msg in ((["--configs", "static,split"], "--configs must name"),
                          (["--rates", "0,1"], "--rates must be positive"),
                          (["--rounds", "0"], "--rounds must be >= 1"),
                          (["--target", "0"], "--target must be in (0, 1]")):
            p = driver(*args)
            self.assertEqual(p.returncode, 2, args)
            self.assertIn(msg, p.stderr, args)
            self.assertNotIn("Traceback", p.stderr)


class AgainstFakeTandem(unittest.TestCase):
    def test_quick_run_all_configurations(self):
        with tempfile.TemporaryDirectory() as d:
            p = driver("--quick", "--workloads", "shifting", "--tbt-slos", "1000", "--rates",
                       "10,20", "--scrape-interval-s", "0.2", "--out", d)
            self.assertEqual(p.returncode, 0, p.stderr[-3000:])
            with open(os.path.join(d, "results.json")) as f:
                res = json.load(f)
            r = res["results"]["shifting@1000"]
            self.assertEqual(res["skipped"], {})
            fig = r["figures"]
            self.assertEqual(sorted(fig), ["colocated", "elastic", "static"])
            # The fake admits 2 of every 3 (predictive admission): no rate reaches 90%. The
            # rejected requests cost nothing and every admitted one meets the SLOs, so all the
            # busy time is useful.
            for c, f in fig.items():
                self.assertEqual((f["capacity"], f["below"]), (0.0, True), c)
                self.assertGreater(f["utilisation"], 0, c)
                self.assertAlmostEqual(f["useful_utilisation"], f["utilisation"], msg=c)
            # Busy core-seconds of the fake: the same work, 1 thread per disaggregated worker and
            # 2 for the colocated one, so colocated reports twice the utilisation.
            ratio = fig["colocated"]["utilisation"] / fig["static"]["utilisation"]
            self.assertTrue(1.6 < ratio < 2.4, ratio)
            run = r["runs"]["elastic"][0]
            self.assertIn("--elastic", run["command"])
            self.assertEqual(run["command"][run["command"].index("--slo-tbt-ms") + 1], "1000")
            u = run["sweep"]["points"][0]["summary"]["utilisation"]
            self.assertIsNotNone(u["role_switches"])
            self.assertIsNone(r["runs"]["static"][0]["sweep"]["points"][0]["summary"]["utilisation"]
                              ["role_switches"])
            self.assertTrue(os.path.exists(os.path.join(d, "utilisation-shifting-tbt1000.png")))
            self.assertTrue(os.path.exists(os.path.join(
                d, "shifting", "elastic-tbt1000-round1", "rate_10", "metrics_timeseries.jsonl")))
            with open(os.path.join(d, "tables.md")) as f:
                tables = f.read()
            self.assertIn("## shifting: TTFT ≤ 5000 ms, TBT ≤ 1000 ms (loose)", tables)
            self.assertRegex(tables, r"\| elastic / colocated \| n/a \| [0-9.]+x \| 0\.[0-9]+x \|")
            self.assertIn("| elastic / static |", tables)
            self.assertIn("| static | 67% / ", tables)

    def test_elastic_skipped_without_the_flag(self):
        with tempfile.TemporaryDirectory() as d:
            p = driver("--quick", "--workloads", "shifting", "--tbt-slos", "50", "--rates", "10",
                       "--configs", "static,elastic", "--out", d,
                       env={"FAKE_TANDEM_NO_ELASTIC": "1"})
            self.assertEqual(p.returncode, 0, p.stderr[-3000:])
            self.assertIn("SKIPPING the elastic configuration", p.stderr)
            self.assertIn("| elastic | skipped: this tandem serve has no --elastic |", p.stdout)
            self.assertNotIn("| elastic / static |", p.stdout)
            self.assertFalse(os.path.exists(os.path.join(d, "shifting", "elastic-tbt50-round1")))


if __name__ == "__main__":
    unittest.main()
