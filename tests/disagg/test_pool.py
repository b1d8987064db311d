"""The cluster KV pool end to end: a conversation's second turn reads what its first turn left
in the pool (the decode worker offers prompt + answer when the turn ends), so the prefill
worker computes less, and every answer equals the one computed without the pool. With Gemma 3
(sliding-window layers) the pool carries the windows behind each offered end as well."""
import unittest

from disagg_util import GEMMA, MODEL_NAME, disaggregated, metric, post, text_of


def conversation(server):
    """Two greedy turns; returns [(answer, cached_tokens)], the prompt tokens of the first turn
    and the /metrics samples."""
    question = " ".join(f"Fact {k}: the river number {k} is {k * 3 + 1} km long." for k in range(40))
    messages = [{"role": "user", "content": question + " Which river is the longest?"}]
    out, first_prompt = [], None
    for follow_up in [None, "Now name the shortest one."]:
        if follow_up:
            messages.append({"role": "user", "content": follow_up})
        r = post(server, "/v1/chat/completions",
                 {"model": MODEL_NAME, "messages": messages, "max_tokens": 48, "temperature": 0})
        answer = text_of(r)
        first_prompt = first_prompt or r["usage"]["prompt_tokens"]
        out.append((answer, r["usage"]["prompt_tokens_details"]["cached_tokens"]))
        messages.append({"role": "assistant", "content": answer})
    return out, first_prompt, server.metrics()


class KvPoolServesTheNextTurn(unittest.TestCase):
    def run_with(self, pool, model=None):
        server = disaggregated("--no-local-prefill", "--kv-pool", pool, model=model)
        try:
            return conversation(server)
        finally:
            server.stop()

    def test_second_turn_reads_the_first_turns_answer_from_the_pool(self):
        self.check_second_turn(None)

    def test_gemma_second_turn_reads_blocks_and_windows_from_the_pool(self):
        first_prompt, m_on = self.check_second_turn(GEMMA)
        self.assertGreater(first_prompt, 512)  # past the sliding window
        self.assertEqual(metric(m_on, "tandem_kv_pool_window_misses_total"), 0)

    def check_second_turn(self, model):
        without, _, m_off = self.run_with("off", model)
        with_pool, first_prompt, m_on = self.run_with("on", model)
        # Same answers, token for token (greedy), with and without the pool.
        self.assertEqual([a for a, _ in with_pool], [a for a, _ in without])
        # Turn 1: nothing cached anywhere. Turn 2: the prefill worker's own cache holds turn 1's
        # prompt; only the pool holds the blocks of turn 1's answer (written by the decode
        # worker), so more of turn 2 is cached with the pool.
        self.assertEqual(with_pool[0][1], 0)
        self.assertGreater(with_pool[1][1], without[1][1])
        hit = metric(m_on, "tandem_kv_pool_hit_tokens_total")
        self.assertEqual(hit, with_pool[1][1] - without[1][1])
        self.assertGreater(metric(m_on, "tandem_kv_pool_hit_blocks_total", role="prefill"), 0)
        self.assertGreater(
            metric(m_on, "tandem_kv_pool_put_blocks_total", role="decode", outcome="stored"), 0)
        self.assertEqual(metric(m_on, "tandem_kv_pool_fetch_failures_total", role="prefill"), 0)
        self.assertEqual(metric(m_off, "tandem_kv_pool_hit_tokens_total"), 0)
        used = sum(v for k, v in m_on.items() if k.startswith("tandem_kv_pool_segment_used_bytes"))
        self.assertGreater(used, 0)
        return first_prompt, m_on


if __name__ == "__main__":
    unittest.main()
