"""Chunked pipeline-parallel prefill end to end: long prompts prefilled by two prefill workers at
once (each a range of layers, chunks of the prompt flowing from the first to the second) give
the answers, and the logprobs, of a prefill on one worker, token for token; short prompts are
not pipelined; a stage that cannot reach the next one, or is cancelled, fails at once and frees
its KV.

Both models: SmolLM2 (30 global layers) and Gemma 3 (sliding-window layers, prompts past their
512-token window). Each server: 1 thread per worker, --no-local-prefill.
"""
import json
import re
import threading
import time
import unittest
import urllib.error
import urllib.request

import cluster_auth
from disagg_util import (GEMMA, TEST_CLUSTER_TOKEN, Server, call_internal, metric, post,
                         worker_endpoints)

MAX_TOKENS = 8


def server(model, prefill_workers, *extra):
    return Server("--mode", "disaggregated", "--prefill-workers", str(prefill_workers),
                  "--decode-workers", "1", "--no-local-prefill", "--block-tokens", "16", *extra,
                  threads=1, max_model_len=2048, kv_cache_tokens=8192, model=model,
                  env={"TANDEM_CLUSTER_TOKEN": TEST_CLUSTER_TOKEN})


def pipelined(model, min_tokens, chunk):
    return server(model, 2, "--pipeline-min-tokens", str(min_tokens), "--pipeline-chunk-tokens",
                  str(chunk))


def prompts(n_tokens):
    """Prompts of about n_tokens tokens each (the last one short), distinct from the start."""
    out = []
    for i, tokens in enumerate(n_tokens):
        words = " ".join(f"Note {k}: the ferry {i} left pier {k * 7 % 31} at {k % 12 + 1} o'clock."
                         for k in range(tokens // 16 + 1))
        out.append(f"Log {i}. {words}")
    return out


def worker_stats(host, port):
    """A worker's /stats, asked as a member of the cluster."""
    header, _ = cluster_auth.sign_call(TEST_CLUSTER_TOKEN, "GET", "/stats", b"")
    req = urllib.request.Request(f"http://{host}:{port}/stats", headers={"X-Tandem-Auth": header})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def full_log(srv):
    with open(srv.log.name, errors="replace") as f:
        return f.read()


def answers(srv, texts):
    """Greedy completions with two logprobs per token: [(text, tokens, token_logprobs, usage)]."""
    out = []
    for text in texts:
        r = post(srv, "/v1/completions",
                 {"prompt": text, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True,
                  "logprobs": 2})
        c = r["choices"][0]
        out.append((c["text"], c["logprobs"]["tokens"], c["logprobs"]["token_logprobs"],
                    r["usage"]["prompt_tokens"]))
    return out


class PipelineTest(unittest.TestCase):
    def check_model(self, model, dim, sizes, min_tokens, chunk):
        texts = prompts(sizes)
        ref = server(model, 1)
        try:
            expected = answers(ref, texts)
        finally:
            self.assertEqual(ref.stop(), 0)
        srv = pipelined(model, min_tokens, chunk)
        try:
            got = answers(srv, texts)
            m = srv.metrics()
            log = full_log(srv)
        finally:
            self.assertEqual(srv.stop(), 0)
        long = [n for (_, _, _, n) in expected if n >= min_tokens]
        self.assertGreaterEqual(len(long), 2, expected)
        self.assertLess(len(long), len(texts), "one prompt must stay below the threshold")
        for e, g in zip(expected, got):
            self.assertEqual(g[3], e[3])
            self.assertEqual(g[0], e[0], f"{e[3]}-token prompt")
            self.assertEqual(g[1], e[1])
            self.assertEqual(g[2], e[2], "logprobs differ")
        self.assertEqual(metric(m, "tandem_pipelined_prefills_total"), len(long))
        self.assertEqual(metric(m, "tandem_pipelined_prefill_failures_total"), 0)
        # Each pipelined prompt's residual stream crossed once: tokens x width x 4 bytes.
        self.assertEqual(metric(m, "tandem_pipeline_stage_bytes_total"), sum(long) * dim * 4)
        for stage in (0, 1):
            self.assertEqual(len(re.findall(rf"pipeline stage {stage} of 2 \(layers", log)),
                             len(long), log[-3000:])

    def test_smollm2_outputs_equal_one_worker(self):
        # 40-token chunks: chunks end inside 16-token blocks (a block is sent again, whole).
        self.check_model(None, 576, [300, 520, 830, 40], min_tokens=200, chunk=40)

    def test_gemma_sliding_windows_outputs_equal_one_worker(self):
        # Past the 512-token window: the second stage's sliding layers, and the window the decode
        # side keeps, come from chunks that left earlier windows behind.
        self.check_model(GEMMA, 640, [700, 600, 50], min_tokens=256, chunk=128)

    def test_failed_and_cancelled_stages_end_at_once_and_free_their_kv(self):
        srv = pipelined(None, 200, 40)
        try:
            self.check_failures(srv)
        finally:
            self.assertEqual(srv.stop(), 0)

    def check_failures(self, srv):
        ends = worker_endpoints(srv)
        log = full_log(srv)
        segment = re.search(r"worker decode-0 \(decode\).*KV segment (\S+) ", log).group(1)
        host, port = ends["prefill-0"]
        prompt = post(srv, "/tokenize", {"prompt": prompts([400])[0]})["tokens"]
        # SmolLM2's KV geometry: 30 layers; 16-token blocks of 3 KV heads x 64, fp16 K and V.
        target = {"segment": segment, "blocks": list(range(len(prompt) // 16 + 1)),
                  "block_tokens": 16, "n_layers": 30,
                  "layer_slice_bytes": 2 * 3 * 64 * 16 * 2, "decode_worker": "decode-0"}
        call = {"id": "direct", "prompt_tokens": prompt, "timeout_ms": 60000,
                "target": target,
                "stage": {"session": "direct/1", "index": 0, "stages": 2, "begin_layer": 0,
                          "end_layer": 15, "chunk_tokens": 40, "next_worker": "nobody",
                          "next_host": "127.0.0.1", "next_port": 1}}
        # The next stage cannot be reached: the first chunk's hand-over fails the stage.
        started = time.time()
        with self.assertRaises(urllib.error.HTTPError) as failed:
            call_internal(host, port, "/v1/prefill", call, timeout=60)
        self.assertLess(time.time() - started, 30)
        self.assertIn("pipeline stage nobody", failed.exception.read().decode())

        # A later stage waits for chunks; cancelling its session ends it.
        host1, port1 = ends["prefill-1"]
        waiting = dict(call, stage=dict(call["stage"], session="direct/2", index=1,
                                        begin_layer=15, end_layer=30))
        outcome = {}

        def run_stage():
            try:
                call_internal(host1, port1, "/v1/prefill", waiting, timeout=60)
                outcome["error"] = None
            except urllib.error.HTTPError as e:
                outcome["error"] = e.read().decode()
        t = threading.Thread(target=run_stage)
        t.start()
        time.sleep(1.0)
        self.assertTrue(t.is_alive(), "the stage must wait for its input")
        call_internal(host1, port1, "/v1/cancel", {"id": "direct/2"})
        t.join(timeout=10)
        self.assertFalse(t.is_alive(), "a cancelled stage must end at once")
        self.assertIn("cancel", outcome["error"])

        # Neither stage holds KV any more, and the pipeline still serves.
        for name in ("prefill-0", "prefill-1"):
            stats = worker_stats(*ends[name])
            self.assertEqual(stats["backend"]["kv_blocks_used"], 0, name)
        r = post(srv, "/v1/completions", {"prompt": prompts([400])[0], "max_tokens": 4,
                                          "temperature": 0, "ignore_eos": True})
        self.assertEqual(r["usage"]["completion_tokens"], 4)
        self.assertEqual(metric(srv.metrics(), "tandem_pipelined_prefills_total"), 1)


if __name__ == "__main__":
    unittest.main()
