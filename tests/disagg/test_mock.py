"""Mock engines (`--mock PROFILE`): worker processes with the real control protocol, KV
bookkeeping and transfers whose engines compute nothing and take their profile's step times.
Eight mock workers serve concurrent requests through the real conductor; the profile's instance
settings reach the workers; a forward pass never takes less than the profile says; the
colocated server mocks too; a bad profile is refused with a clear error."""
import json
import os
import subprocess
import tempfile
import threading
import time
import unittest

from disagg_util import Server, metric, post, stream
from server_util import BIN

# Step times long enough to be seen, short enough for a quick test: prefill 2 ms + 0.2 ms per
# token, a decode step 20 ms + 1 ms per sequence.
PROFILE = {
    "description": "test profile of the mock-worker test",
    "cost": {"prefill_base_s": 0.002, "prefill_per_token_s": 0.0002, "prefill_attention_s": 0,
             "decode_base_s": 0.02, "decode_per_seq_s": 0.001, "decode_per_context_token_s": 0},
    "instance": {"kv_capacity_tokens": 65536, "block_tokens": 16, "max_batch_tokens": 512,
                 "max_num_seqs": 64},
}
KV_BLOCKS = 65536 // 16


def write_profile(profile):
    f = tempfile.NamedTemporaryFile("w", prefix="tandem-mock-", suffix=".json", delete=False)
    json.dump(profile, f)
    f.close()
    return f.name


class MockWorkersTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.profile = write_profile(PROFILE)

    @classmethod
    def tearDownClass(cls):
        os.unlink(cls.profile)

    def test_eight_mock_workers_serve_concurrent_requests_through_the_conductor(self):
        s = Server("--mode", "disaggregated", "--prefill-workers", "4", "--decode-workers", "4",
                   "--no-local-prefill", "--mock", self.profile, threads=2)
        try:
            results = {}

            def run(i):
                n = 8 + 4 * i
                body = {"prompt": f"Request {i}: " + "tell me more " * (10 * i + 1),
                        "max_tokens": n}
                if i % 2:
                    results[i] = (n, stream(s, "/v1/completions", body))
                else:
                    results[i] = (n, post(s, "/v1/completions", body))

            threads = [threading.Thread(target=run, args=(i,)) for i in range(16)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=120)
            self.assertEqual(len(results), 16, s.log_text())
            for i, (n, r) in results.items():
                if i % 2:
                    text, finish, usage, error = r
                    self.assertIsNone(error, error)
                else:
                    text = r["choices"][0]["text"]
                    finish, usage = r["choices"][0]["finish_reason"], r["usage"]
                # Every mock sequence draws the same ordinary token, to max_tokens.
                self.assertEqual(usage["completion_tokens"], n)
                self.assertEqual(finish, "length")
                self.assertEqual(text, " the" * n)

            m = s.metrics()
            self.assertEqual(metric(m, "tandem_disaggregated_requests_total"), 16)
            workers = {k.split('worker="')[1].split('"')[0] for k in m
                       if k.startswith("tandem_worker_kv_blocks{")}
            self.assertEqual(len(workers), 8)
            for w in workers:
                role = "prefill" if w.startswith("prefill") else "decode"
                total = sum(metric(m, "tandem_worker_kv_blocks", worker=w, role=role, state=st)
                            for st in ("used", "cached", "free"))
                # The profile's KV capacity, not the --kv-cache-tokens the test server passes.
                self.assertEqual(total, KV_BLOCKS, w)
            # The longest request (68 tokens) needed 67 decode steps on one worker, each at
            # least the profile's 20 ms: the mock never runs faster than its profile.
            decode_busy = sum(v for k, v in m.items()
                              if k.startswith("tandem_worker_busy_seconds_total{")
                              and 'phase="decode"' in k)
            self.assertGreaterEqual(decode_busy, 67 * 0.02)
        finally:
            s.stop()

    def test_a_long_prompt_takes_its_prefill_time_and_colocated_mocks_too(self):
        s = Server("--mode", "colocated", "--mock", self.profile, threads=2)
        try:
            prompt = "hello " * 1500
            start = time.monotonic()
            r = post(s, "/v1/completions", {"prompt": prompt, "max_tokens": 1})
            took = time.monotonic() - start
            tokens = r["usage"]["prompt_tokens"]
            self.assertGreater(tokens, 1000)
            # Chunks of 512 tokens: each pays the base and 0.2 ms per token.
            chunks = -(-tokens // 512)
            self.assertGreaterEqual(took, chunks * 0.002 + tokens * 0.0002)
            self.assertEqual(r["choices"][0]["text"], " the")
        finally:
            s.stop()

    def test_a_bad_profile_is_refused_with_a_clear_error(self):
        bad = write_profile({"cost": {"prefill_base_s": 0.001}})
        try:
            def worker(*args):
                return subprocess.run([BIN, "worker", "--metadata", "http://127.0.0.1:9", *args],
                                      capture_output=True, text=True, timeout=60)
            out = worker("--mock", bad)
            self.assertEqual(out.returncode, 2, out.stderr)
            self.assertIn("--mock", out.stderr)
            self.assertIn("prefill_per_token_s", out.stderr)
            # A file that is not there: the command line's own error (CLI11's exit status).
            out = worker("--mock", "/nonexistent/profile.json")
            self.assertNotEqual(out.returncode, 0)
            self.assertIn("/nonexistent/profile.json", out.stderr)
        finally:
            os.unlink(bad)


if __name__ == "__main__":
    unittest.main()
