"""Long prompts on a memory budget, in both modes: more long prompts arrive at once than the KV
cache can hold (it holds two), every one completes with the answer it gets alone, no process
is killed, and every engine process stays within its --memory-budget-mb (+10%).

Sizes (environment; the defaults are the short form of the default run, past Gemma's 512-token
window; the `long` label runs TANDEM_LONG_PROMPT_TOKENS=32000, the issue's 32k form):
TANDEM_LONG_PROMPT_TOKENS (768), TANDEM_LONG_PROMPTS (8), TANDEM_LONG_MAX_TOKENS (8),
TANDEM_LONG_BUDGET_MB (the memory budget of each engine process, 500).
"""
import concurrent.futures
import os
import time
import unittest
import urllib.error

from disagg_util import GEMMA, Server, metric, post

PROMPT_TOKENS = int(os.environ.get("TANDEM_LONG_PROMPT_TOKENS", "768"))
PROMPTS = int(os.environ.get("TANDEM_LONG_PROMPTS", "8"))
MAX_TOKENS = int(os.environ.get("TANDEM_LONG_MAX_TOKENS", "8"))
BUDGET_MB = int(os.environ.get("TANDEM_LONG_BUDGET_MB", "500"))
BLOCK_TOKENS = 16
# The context the servers allow: one prompt and its answer, and a little more.
MAX_MODEL_LEN = min(32768, PROMPT_TOKENS + MAX_TOKENS + 64)
# A KV cache that holds two prompts with their answers, never three prompts.
KV_TOKENS = 2 * (PROMPT_TOKENS + MAX_TOKENS + 2 * BLOCK_TOKENS)
assert KV_TOKENS < 3 * PROMPT_TOKENS
TIMEOUT_S = 120 + PROMPTS * PROMPT_TOKENS / 20  # a pessimistic 20 prompt tokens/s


def server_args(mode):
    # Requests wait for KV far longer than the default deadline (600 s) in the 32k form.
    extra = ["--mode", mode, "--memory-budget-mb", str(BUDGET_MB), "--max-num-seqs",
             str(PROMPTS), "--block-tokens", str(BLOCK_TOKENS), "--request-timeout-s",
             str(int(TIMEOUT_S))]
    if mode == "disaggregated":
        # Each worker lends the KV pool 16 MiB of its budget (the default 256 would not fit).
        extra += ["--prefill-workers", "1", "--decode-workers", "1", "--no-local-prefill",
                  "--pool-dram-mb", "16"]
    return extra


def prompts(server):
    """PROMPTS prompts of exactly PROMPT_TOKENS token ids, distinct from their second token on
    (no shared prefix): prose from /tokenize, cut to length."""
    sentences = " ".join(f"Entry {k}: the harbour tide at dawn was {k * 37 % 211} cm, the wind "
                         f"{k * 13 % 29} knots from bearing {k * 71 % 360}."
                         for k in range(PROMPT_TOKENS // 8 + 16))
    out = []
    for i in range(PROMPTS):
        ids = post(server, "/tokenize", {"prompt": f"Log {i} of the survey. " + sentences})["tokens"]
        assert len(ids) >= PROMPT_TOKENS, len(ids)
        out.append(ids[:PROMPT_TOKENS])
    return out


def complete(server, prompt):
    r = post(server, "/v1/completions",
             {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True},
             timeout=TIMEOUT_S)
    assert r["usage"]["prompt_tokens"] == PROMPT_TOKENS, r["usage"]
    return r["choices"][0]["text"]


def all_at_once(server, prompts_):
    """(answers, the most requests seen waiting in /metrics while they ran)."""
    with concurrent.futures.ThreadPoolExecutor(len(prompts_)) as pool:
        futures = [pool.submit(complete, server, p) for p in prompts_]
        most_waiting = 0
        while not all(f.done() for f in futures):
            most_waiting = max(most_waiting, metric(server.metrics(), "tandem_requests_waiting"))
            time.sleep(0.2)
        return [f.result() for f in futures], most_waiting


def peaks(server):
    """{process: (peak resident bytes, budget bytes)} of every engine process, from /metrics
    once the workers' latest heartbeats are in; the front process of a disaggregated server
    under "front" (its budget: the same figure)."""
    time.sleep(3)  # a worker's stats reach the conductor with its next heartbeat (1 s)
    m = server.metrics()
    out = {}
    for key, value in m.items():
        if key.startswith("tandem_worker_peak_resident_bytes{"):
            labels = key[key.index("{"):]
            budget = m.get("tandem_worker_memory_budget_bytes" + labels, 0.0)
            out[labels] = (value, budget)
    out["front"] = (m["tandem_process_peak_resident_bytes"], BUDGET_MB * 2**20)
    return out, m


class LongPromptsOnAMemoryBudget(unittest.TestCase):
    def check_memory(self, mode, server):
        found, m = peaks(server)
        print(f"\n{mode}: peak resident MiB (budget {BUDGET_MB}): " +
              ", ".join(f"{k} {v[0] / 2**20:.0f}" for k, v in sorted(found.items())))
        self.assertGreater(len(found), 2 if mode == "disaggregated" else 1, found)
        for process, (peak, budget) in found.items():
            self.assertEqual(budget, BUDGET_MB * 2**20, process)
            self.assertLessEqual(peak, 1.1 * budget, f"{mode} {process}: {peak / 2**20:.0f} MiB")
        self.assertEqual(metric(m, "tandem_worker_restarts_total"), 0)
        return m

    def test_more_long_prompts_than_the_kv_cache_holds(self):
        answers = {}
        colocated = Server(*server_args("colocated"), model=GEMMA, max_model_len=MAX_MODEL_LEN,
                           kv_cache_tokens=KV_TOKENS)
        try:
            ids = prompts(colocated)
            answers["together"], most_waiting = all_at_once(colocated, ids)
            # The cache holds two: the others waited (admitted as the first ones finished).
            self.assertGreaterEqual(most_waiting, PROMPTS - 3)
            answers["alone"] = [complete(colocated, p) for p in ids]
            self.check_memory("colocated", colocated)
            # A prompt longer than the context: a clear 400, and the server carries on.
            with self.assertRaises(urllib.error.HTTPError) as too_long:
                complete(colocated, ids[0] + ids[1][: MAX_MODEL_LEN])
            self.assertEqual(too_long.exception.code, 400)
            self.assertIn("context", too_long.exception.read().decode())
        finally:
            self.assertEqual(colocated.stop(), 0)
        self.assertEqual(answers["together"], answers["alone"])

        disaggregated = Server(*server_args("disaggregated"), model=GEMMA,
                               max_model_len=MAX_MODEL_LEN, kv_cache_tokens=KV_TOKENS)
        try:
            answers["disaggregated"], _ = all_at_once(disaggregated, ids)
            m = self.check_memory("disaggregated", disaggregated)
            # The decode worker holds two: the others' KV waited for room there.
            self.assertGreater(metric(m, "tandem_kv_wait_requests_total"), 0)
            self.assertEqual(metric(m, "tandem_kv_wait_timeouts_total"), 0)
            self.assertEqual(metric(m, "tandem_colocated_fallback_requests_total"), 0)
        finally:
            self.assertEqual(disaggregated.stop(), 0)
        self.assertEqual(answers["disaggregated"], answers["alone"])


if __name__ == "__main__":
    unittest.main()
