"""Disaggregated serving gives the colocated mode's answers, token for token, and reports
where each request's time to first token went."""
import concurrent.futures
import re
import unittest

from disagg_util import (GEMMA, Server, colocated, disaggregated, fifty_prompts, metric, post,
                         stream, text_of)

CLIENTS = 16


def run_all(server, requests, streaming):
    def one(item):
        path, body = item
        if streaming:
            text, finish, usage, error = stream(server, path, body)
            assert error is None, error
            return text, finish, usage["completion_tokens"]
        r = post(server, path, body)
        return text_of(r), r["choices"][0]["finish_reason"], r["usage"]["completion_tokens"]
    with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
        return list(pool.map(one, requests))


_EXPECTED = {}


def expected_answers(requests):
    """The colocated mode's answers to `requests` (computed once per module)."""
    if "answers" not in _EXPECTED:
        server = colocated()
        try:
            _EXPECTED["answers"] = run_all(server, requests, streaming=False)
        finally:
            server.stop()
    return _EXPECTED["answers"]


class DisaggregatedEqualsColocated(unittest.TestCase):
    """Every request through the hand-off (no conditional disaggregation)."""
    @classmethod
    def setUpClass(cls):
        cls.requests = fifty_prompts()
        cls.expected = expected_answers(cls.requests)
        cls.server = disaggregated("--no-local-prefill")

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def check(self, got):
        self.assertEqual(len(got), len(self.expected))
        for i, (g, e) in enumerate(zip(got, self.expected)):
            self.assertEqual(g, e, f"request {i}: {self.requests[i][0]}")

    def test_1_non_streaming_under_16_clients(self):
        self.check(run_all(self.server, self.requests, streaming=False))

    def test_2_streaming_under_16_clients(self):
        self.check(run_all(self.server, self.requests, streaming=True))

    def test_3_one_at_a_time(self):
        got = [run_all(self.server, [r], streaming=i % 2 == 1)[0]
               for i, r in enumerate(self.requests[:10])]
        self.assertEqual(got, self.expected[:10])

    def test_4_metrics_and_log_show_the_hand_off(self):
        m = self.server.wait_idle()
        self.assertGreaterEqual(metric(m, "tandem_disaggregated_requests_total"), 100)
        self.assertEqual(metric(m, "tandem_colocated_fallback_requests_total"), 0)
        self.assertEqual(metric(m, "tandem_kv_transfer_failures_total"), 0)
        self.assertEqual(metric(m, "tandem_kv_transfer_timeouts_total"), 0)
        self.assertGreater(metric(m, "tandem_kv_transfer_bytes_total"), 0)
        self.assertEqual(metric(m, "tandem_workers", role="prefill", state="healthy"), 1)
        self.assertEqual(metric(m, "tandem_workers", role="decode", state="healthy"), 1)
        for h in ("tandem_ttft_prefill_seconds", "tandem_ttft_kv_transfer_seconds",
                  "tandem_first_decode_step_seconds", "tandem_queue_time_seconds"):
            self.assertGreaterEqual(metric(m, h + "_count"), 100, h)
        # Every block reservation was claimed and freed.
        self.assertEqual(metric(m, "tandem_kv_blocks_reserved"), 0)
        self.assertEqual(metric(m, "tandem_kv_reservations_expired_total"), 0)
        lines = [l for l in self.server.log_text().splitlines() if " finish=" in l]
        self.assertTrue(lines)
        pattern = re.compile(r"queue=[\d.]+s ttft=[\d.]+s prefill=[\d.]+s kv_transfer=[\d.]+s "
                             r"first_decode=[\d.]+s")
        self.assertTrue(all(pattern.search(l) for l in lines[-20:]), lines[-1])


class ConditionalDisaggregationEqualsColocated(unittest.TestCase):
    """The default mode: the conductor may compute a prompt on its decode worker (cheaper than
    the prefill queue plus the transfer); the answers are the same either way."""
    def test_default_mode_under_16_clients(self):
        requests = fifty_prompts()
        expected = expected_answers(requests)
        server = disaggregated()
        try:
            got = run_all(server, requests, streaming=True)
            self.assertEqual(got, expected)
            m = server.wait_idle()
            disaggregated_n = metric(m, "tandem_disaggregated_requests_total")
            local_n = metric(m, "tandem_local_prefill_requests_total")
            # Every request went one way or the other, none fell back after a failure.
            self.assertEqual(disaggregated_n + local_n, len(requests))
            self.assertGreater(disaggregated_n, 0)
            self.assertEqual(metric(m, "tandem_colocated_fallback_requests_total"), 0)
            self.assertEqual(metric(m, "tandem_kv_blocks_reserved"), 0)
        finally:
            server.stop()



class SlidingWindowModelEqualsColocated(unittest.TestCase):
    """Gemma 3 (sliding-window layers): prompts past its 512-token window hand off only the
    window's KV for those layers, and the answers still equal the colocated mode's."""

    def test_long_and_short_prompts(self):
        lines = " ".join(f"Line {i} of the harbour survey." for i in range(100))
        requests = [("/v1/completions", {"prompt": p, "max_tokens": 12, "temperature": 0,
                                         "ignore_eos": True})
                    for p in ["The tide tables say", lines, lines[: len(lines) // 2] + " Then"]]
        answers = {}
        for mode in ("colocated", "disaggregated"):
            extra = ("--mode", mode) + (("--no-local-prefill",) if mode == "disaggregated" else ())
            server = Server(*extra, model=GEMMA, max_model_len=4096, kv_cache_tokens=8192)
            try:
                answers[mode] = [run_all(server, requests, streaming=s) for s in (False, True)]
                usage = post(server, *requests[1])["usage"]
                self.assertGreater(usage["prompt_tokens"], 600)  # past the window
                self.assertGreater(metric(server.metrics(), "tandem_kv_window_blocks_free"), 0)
            finally:
                self.assertEqual(server.stop(), 0)
        self.assertEqual(answers["disaggregated"], answers["colocated"])
        self.assertEqual(answers["colocated"][0], answers["colocated"][1])  # streaming or not


if __name__ == "__main__":
    unittest.main()
