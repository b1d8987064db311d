"""Elastic pools end to end: workers switch between prefill and decode while requests run, and
none is lost or changed (greedy outputs equal those of the same server before any switch)."""
import concurrent.futures
import json
import re
import time
import unittest
import urllib.error

from disagg_util import (MODEL_NAME, TEST_CLUSTER_TOKEN, call_internal, disaggregated, metric,
                         post, stream, text_of, wait_for, worker_endpoints)


def switch(endpoint, role):
    """Asks a worker to change role, as the conductor's planner would (a signed call)."""
    host, port = endpoint
    return json.loads(call_internal(host, port, "/v1/role", {"role": role, "reason": "test"}))


def resize(endpoint, threads):
    """Asks a worker to compute on `threads` engine threads, as the thread planner would."""
    host, port = endpoint
    return json.loads(call_internal(host, port, "/v1/threads",
                                    {"threads": threads, "reason": "test"}))


def metric_sum(m, name, **labels):
    """The sum of the samples of `name` whose labels include these (in any order)."""
    total = 0.0
    for key, value in m.items():
        if key.split("{", 1)[0] == name and all(f'{k}="{v}"' in key for k, v in labels.items()):
            total += value
    return total


def requests_mix(n):
    out = []
    for i in range(n):
        if i % 3 == 0:  # a longer prompt, a short answer
            prompt = " ".join(f"Line {k} of note {i} lists the number {k * 11 + i}." for k in range(40))
            max_tokens = 8
        else:  # a short prompt, a longer answer
            prompt = f"Request {i}: describe a quiet harbour at dawn."
            max_tokens = 48
        out.append({"model": MODEL_NAME, "prompt": prompt, "max_tokens": max_tokens,
                    "temperature": 0, "ignore_eos": True})
    return out


class RoleSwitchUnderLoad(unittest.TestCase):
    def test_switches_lose_no_request_and_change_no_output(self):
        server = disaggregated("--admission", "none", env={"TANDEM_CLUSTER_TOKEN": TEST_CLUSTER_TOKEN})
        try:
            bodies = requests_mix(18)
            baseline = [text_of(post(server, "/v1/completions", b)) for b in bodies]
            endpoints = worker_endpoints(server)
            self.assertEqual(set(endpoints), {"prefill-0", "decode-0"}, server.log_text()[-2000:])
            # Each worker in turn changes role while requests stream; the cluster always keeps
            # a decode-capable worker.
            plan = [("prefill-0", "decode"), ("decode-0", "prefill"), ("decode-0", "decode"),
                    ("prefill-0", "prefill")]
            answers, held = [], 0
            with concurrent.futures.ThreadPoolExecutor(6) as pool:
                futures = [pool.submit(stream, server, "/v1/completions", b, 180) for b in bodies]
                for name, role in plan:
                    time.sleep(0.7)
                    result = switch(endpoints[name], role)
                    self.assertEqual(result["role"], role)
                    held += result["prefills_in_flight"] + result["decodes_in_flight"]
                answers = [f.result(timeout=180) for f in futures]
            self.assertGreater(held, 0, "no switch happened while the worker held work")
            for i, (text, finish, usage, error) in enumerate(answers):
                self.assertIsNone(error, f"request {i}")
                self.assertEqual(finish, "length", f"request {i}")
                self.assertEqual(usage["completion_tokens"], bodies[i]["max_tokens"])
                self.assertEqual(text, baseline[i], f"request {i}")
            # The conductor follows the published roles.
            wait_for(lambda: metric(server.metrics(), "tandem_workers", role="prefill",
                                    state="healthy") == 1, 10, "the roles to settle")
            m = server.metrics()
            self.assertEqual(metric(m, "tandem_workers", role="decode", state="healthy"), 1)
            self.assertEqual(metric(m, "tandem_requests_total", outcome="error"), 0)
            # A role the worker does not know is refused clearly.
            with self.assertRaises(urllib.error.HTTPError) as bad:
                switch(endpoints["decode-0"], "boss")
            self.assertEqual(bad.exception.code, 400)
        finally:
            server.stop()


class ThreadResizeUnderLoad(unittest.TestCase):
    def test_resizes_lose_no_request_and_change_no_output(self):
        # Elastic pools on 2 cores: each worker may grow to both. The planner is kept out of the
        # way (one plan an hour) so that the test alone resizes.
        server = disaggregated("--admission", "none", "--elastic", "--cores", "2",
                               "--threads-per-worker", "1", "--planner-interval-s", "3600",
                               env={"TANDEM_CLUSTER_TOKEN": TEST_CLUSTER_TOKEN})
        try:
            bodies = requests_mix(12)
            baseline = [text_of(post(server, "/v1/completions", b)) for b in bodies]
            endpoints = worker_endpoints(server)
            plan = [("decode-0", 2), ("prefill-0", 2), ("decode-0", 1), ("prefill-0", 1),
                    ("decode-0", 2)]
            with concurrent.futures.ThreadPoolExecutor(6) as pool:
                futures = [pool.submit(stream, server, "/v1/completions", b, 180) for b in bodies]
                previous = {"prefill-0": 1, "decode-0": 1}
                for name, threads in plan:
                    time.sleep(0.5)
                    result = resize(endpoints[name], threads)
                    self.assertEqual(result, {"threads": threads, "previous": previous[name]})
                    previous[name] = threads
                answers = [f.result(timeout=180) for f in futures]
            for i, (text, finish, usage, error) in enumerate(answers):
                self.assertIsNone(error, f"request {i}")
                self.assertEqual(usage["completion_tokens"], bodies[i]["max_tokens"])
                self.assertEqual(text, baseline[i], f"request {i}")
            # The conductor reads the counts back from the workers' stats.
            wait_for(lambda: metric_sum(server.metrics(), "tandem_worker_threads",
                                        worker="decode-0") == 2, 10, "decode-0's threads")
            m = server.metrics()
            self.assertEqual(metric_sum(m, "tandem_worker_threads", worker="prefill-0"), 1)
            self.assertEqual(metric(m, "tandem_planner_core_budget"), 2)
            # Busy core-seconds count the threads each step ran on: at least the busy seconds.
            for worker in ("prefill-0", "decode-0"):
                busy = metric_sum(m, "tandem_worker_busy_seconds_total", worker=worker)
                core = metric_sum(m, "tandem_worker_busy_core_seconds_total", worker=worker)
                self.assertGreater(busy, 0, worker)
                self.assertGreaterEqual(core, busy * 0.999, worker)
            self.assertIn("threads 1 -> 2 (test)", server.log_text())
            # Outside [1, --max-threads] is refused clearly, and the count stays.
            for bad in (0, 3):
                with self.assertRaises(urllib.error.HTTPError) as refused:
                    resize(endpoints["decode-0"], bad)
                self.assertEqual(refused.exception.code, 400)
            self.assertEqual(resize(endpoints["decode-0"], 2), {"threads": 2, "previous": 2})
        finally:
            server.stop()


class PlannerMovesAWorker(unittest.TestCase):
    def test_decode_heavy_load_takes_the_prefill_worker(self):
        # A TBT SLO of 5 ms: any decode batch on one thread is above it, so the decode pool is
        # loaded and the idle prefill worker goes to decode. Admission none: nothing rejected.
        server = disaggregated("--admission", "none", "--elastic", "--slo-tbt-ms", "5",
                               "--planner-interval-s", "0.25", "--planner-dwell-s", "2")
        try:
            # 48 answers of 48 tokens: enough decode to outlast the planner's dwell (16 were
            # done in about 2 s once decode got faster, before the planner moved anything).
            bodies = [b for b in requests_mix(72) if b["max_tokens"] > 8]
            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                answers = list(pool.map(lambda b: stream(server, "/v1/completions", b, 180),
                                        bodies))
            for text, finish, usage, error in answers:
                self.assertIsNone(error)
                self.assertEqual(usage["completion_tokens"], 48)
            m = server.metrics()
            self.assertGreaterEqual(metric(m, "tandem_role_switches_total", **{"from": "prefill",
                                                                              "to": "decode"}), 1)
            self.assertGreaterEqual(metric(m, "tandem_planner_decisions_total",
                                           action="to_decode", reason="decode_load"), 1)
            self.assertEqual(metric(m, "tandem_planner_target_workers", role="prefill"), 0)
            self.assertEqual(metric(m, "tandem_workers", role="decode", state="healthy"), 2)
            self.assertIn("planner: prefill-0 to decode", server.log_text())
            # Both workers computed: their busy seconds are exported per worker.
            for worker in ("prefill-0", "decode-0"):
                self.assertGreater(metric(m, "tandem_worker_busy_seconds_total", worker=worker,
                                          role="decode", phase="decode")
                                   + metric(m, "tandem_worker_busy_seconds_total", worker=worker,
                                            role="decode", phase="prefill"), 0, worker)
        finally:
            server.stop()


class IdlePrefillWorkerIsStopped(unittest.TestCase):
    def test_an_idle_prefill_worker_gives_its_cores_back(self):
        # Two prefill workers and one decode worker, all idle: the planner offers a prefill
        # worker, the server stops it (its cores back within --cores); the decode pool stays,
        # and requests are still served.
        server = disaggregated("--elastic", "--prefill-workers", "2", "--threads-per-worker", "1",
                               "--cores", "3", "--planner-interval-s", "0.25",
                               "--planner-dwell-s", "1", "--planner-remove-idle-s", "2")
        try:
            # Either prefill worker may go: the planner offers the first idle one that has been in
            # the cluster for the dwell time, and which joined first depends on start-up order.
            stopped = re.compile(r"elastic pools: stopping idle worker prefill-[01] ")
            wait_for(lambda: stopped.search(server.log_text()), 60,
                     "an idle prefill worker to be stopped")
            wait_for(lambda: metric(server.metrics(), "tandem_workers", role="prefill",
                                    state="healthy") == 1, 60, "one prefill worker left")
            m = server.metrics()
            self.assertEqual(metric(m, "tandem_workers", role="decode", state="healthy"), 1)
            self.assertEqual(metric(m, "tandem_worker_restarts_total"), 0)  # stopped, not restarted
            # The core it gave back goes to a worker still running (the thread planner), and the
            # workers' threads fill the budget again.
            wait_for(lambda: metric(server.metrics(), "tandem_thread_changes_total",
                                    reason="spare_cores", direction="grow") >= 1, 30,
                     "the spare core to be given")
            wait_for(lambda: metric_sum(server.metrics(), "tandem_worker_threads") == 3, 30,
                     "the workers' threads to add up to --cores")
            body = requests_mix(2)[1]
            self.assertTrue(text_of(post(server, "/v1/completions", body)))
        finally:
            server.stop()


if __name__ == "__main__":
    unittest.main()
