"""End-to-end tests of `tandem serve` with the real model: the openai SDK, curl, batching
invariance, the prefix cache, bad inputs, disconnects, auth, 429 and SIGTERM.

Run: python3 -m unittest -v tests/server/test_e2e.py   (after building build/tandem)
"""
import concurrent.futures
import json
import os
import subprocess
import sys
import threading
import time
import unittest
import uuid

import openai
import requests

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from server_util import MODEL_NAME, Server, sse_events  # noqa: E402

SERVER = None


def setUpModule():
    global SERVER
    SERVER = Server()


def tearDownModule():
    if SERVER is not None:
        rc = SERVER.stop()
        if rc != 0:
            print(SERVER.log_text(), file=sys.stderr)


def client(**kw):
    return openai.OpenAI(base_url=SERVER.base + "/v1", api_key="unused", max_retries=0, timeout=300, **kw)


def stream_completion(prompt, max_tokens, **extra):
    """Streams /v1/completions with requests; returns (text, finish_reason)."""
    body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, **extra}
    with requests.post(SERVER.base + "/v1/completions", json=body, stream=True, timeout=300) as r:
        assert r.status_code == 200, r.text
        text, finish = "", None
        for ev in sse_events(r.iter_lines()):
            if ev == "[DONE]":
                break
            text += ev["choices"][0]["text"]
            finish = ev["choices"][0]["finish_reason"] or finish
    return text, finish


class OpenAiSdkTest(unittest.TestCase):
    def test_models(self):
        models = client().models.list()
        self.assertEqual([m.id for m in models.data], [MODEL_NAME])

    def test_chat_non_streaming_and_streaming_agree(self):
        c = client()
        messages = [{"role": "system", "content": "You are concise."},
                    {"role": "user", "content": "What is the capital of France?"}]
        full = c.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=40, temperature=0)
        self.assertTrue(full.id.startswith("chatcmpl-"))
        self.assertEqual(full.object, "chat.completion")
        text = full.choices[0].message.content
        self.assertTrue(text)
        self.assertIn("Paris", text)
        self.assertIn(full.choices[0].finish_reason, ("stop", "length"))
        self.assertGreater(full.usage.prompt_tokens, 10)
        self.assertGreater(full.usage.completion_tokens, 0)
        self.assertEqual(full.usage.total_tokens, full.usage.prompt_tokens + full.usage.completion_tokens)

        chunks = list(c.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=40,
                                                temperature=0, stream=True,
                                                stream_options={"include_usage": True}))
        streamed = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        self.assertEqual(streamed, text)
        finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
        self.assertEqual(finishes, [full.choices[0].finish_reason])
        self.assertEqual(chunks[-1].choices, [])
        self.assertEqual(chunks[-1].usage.completion_tokens, full.usage.completion_tokens)
        self.assertEqual(chunks[-1].usage.prompt_tokens, full.usage.prompt_tokens)

    def test_completions_non_streaming_and_streaming_agree(self):
        c = client()
        full = c.completions.create(model=MODEL_NAME, prompt="Once upon a time", max_tokens=24,
                                    temperature=0, extra_body={"ignore_eos": True})
        self.assertTrue(full.id.startswith("cmpl-"))
        self.assertEqual(full.choices[0].finish_reason, "length")
        self.assertEqual(full.usage.completion_tokens, 24)
        chunks = list(c.completions.create(model=MODEL_NAME, prompt="Once upon a time", max_tokens=24,
                                           temperature=0, stream=True, extra_body={"ignore_eos": True}))
        self.assertEqual("".join(ch.choices[0].text for ch in chunks if ch.choices), full.choices[0].text)

    def test_stop_string_is_not_emitted(self):
        c = client()
        base = c.completions.create(model=MODEL_NAME, prompt="1, 2, 3, 4,", max_tokens=20, temperature=0)
        text = base.choices[0].text
        self.assertIn("7", text)
        cut = c.completions.create(model=MODEL_NAME, prompt="1, 2, 3, 4,", max_tokens=20, temperature=0,
                                   stop=["7"])
        self.assertEqual(cut.choices[0].text, text[:text.index("7")])
        self.assertEqual(cut.choices[0].finish_reason, "stop")
        streamed, finish = stream_completion("1, 2, 3, 4,", 20, stop=["7"])
        self.assertEqual(streamed, cut.choices[0].text)
        self.assertEqual(finish, "stop")

    def test_seeded_sampling_is_reproducible(self):
        c = client()
        kw = dict(model=MODEL_NAME, prompt="The weather today", max_tokens=16, temperature=0.9, top_p=0.95,
                  seed=1234)
        a = c.completions.create(**kw).choices[0].text
        b = c.completions.create(**kw).choices[0].text
        self.assertEqual(a, b)

    def test_errors_raise_sdk_exceptions(self):
        c = client()
        with self.assertRaises(openai.NotFoundError):
            c.chat.completions.create(model="gpt-4", messages=[{"role": "user", "content": "hi"}])
        with self.assertRaises(openai.BadRequestError) as cm:
            c.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "hi"}], n=100)
        self.assertIn("'n' must be between 1 and 16", str(cm.exception))


class CurlTest(unittest.TestCase):
    def curl(self, *args):
        # Bytes, decoded without newline translation (the headers end in CRLF).
        return subprocess.run(["curl", "-sS", "--max-time", "120", *args], capture_output=True,
                              check=True).stdout.decode()

    def test_curl_chat_and_stream(self):
        body = json.dumps({"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8})
        out = json.loads(self.curl("-H", "Content-Type: application/json", "-d", body,
                                   SERVER.base + "/v1/chat/completions"))
        self.assertEqual(out["object"], "chat.completion")
        stream_body = json.dumps({"prompt": "Hello", "max_tokens": 8, "stream": True})
        # Accept-Encoding must not make the event stream compressed (buffered).
        raw = self.curl("-N", "-D", "-", "-H", "Accept-Encoding: gzip", "-d", stream_body,
                        SERVER.base + "/v1/completions")
        headers, _, events = raw.partition("\r\n\r\n")
        self.assertIn("text/event-stream", headers)
        self.assertNotIn("Content-Encoding", headers)
        self.assertTrue(events.endswith("data: [DONE]\n\n"), events)
        self.assertEqual(self.curl(SERVER.base + "/health"), '{"status":"ok"}')


class BatchingTest(unittest.TestCase):
    def test_32_concurrent_streams_match_solo(self):
        prompts = [f"Write a short sentence about the number {i}." for i in range(32)]
        c = client()

        def chat_stream(p):
            chunks = c.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": p}],
                                               max_tokens=24, temperature=0, stream=True)
            return "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)

        solo = [chat_stream(p) for p in prompts]
        barrier = threading.Barrier(len(prompts))

        def together(p):
            barrier.wait()
            return chat_stream(p)

        with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
            batched = list(pool.map(together, prompts))
        for i, (a, b) in enumerate(zip(solo, batched)):
            self.assertEqual(b, a, f"prompt {i}")


class PrefixCacheTest(unittest.TestCase):
    def test_shared_prefix_is_cached_and_output_unchanged(self):
        nonce = uuid.uuid4().hex  # first, so that no earlier request shares any block
        prefix = nonce + " " + " ".join(f"Fact {i}: the sky is blue and water is wet." for i in range(40))
        c = client()

        def ask(q):
            r = c.completions.create(model=MODEL_NAME, prompt=prefix + "\n" + q, max_tokens=16, temperature=0)
            return r.choices[0].text, r.usage

        before = SERVER.metrics()["tandem_prefix_cache_hit_tokens_total"]
        cold_text, cold_usage = ask("Question: what colour is the sky? Answer:")
        self.assertGreater(cold_usage.prompt_tokens, 300)
        self.assertEqual(cold_usage.prompt_tokens_details.cached_tokens, 0)
        ask("Question: is water wet? Answer:")
        warm_text, warm_usage = ask("Question: what colour is the sky? Answer:")
        self.assertGreater(warm_usage.prompt_tokens_details.cached_tokens, 300)
        self.assertEqual(warm_text, cold_text)
        self.assertGreater(SERVER.metrics()["tandem_prefix_cache_hit_tokens_total"], before + 300)


BAD_INPUTS = [
    # (name, path, body bytes, expected status)
    ("empty body", "/v1/chat/completions", b"", 400),
    ("broken json", "/v1/chat/completions", b'{"messages": [', 400),
    ("trailing garbage", "/v1/chat/completions", b'{"messages": []} xyz', 400),
    ("not an object", "/v1/chat/completions", b"[1, 2]", 400),
    ("json string", "/v1/completions", b'"hello"', 400),
    ("missing messages", "/v1/chat/completions", b'{"model": "smol"}', 400),
    ("messages not a list", "/v1/chat/completions", b'{"messages": "hi"}', 400),
    ("empty messages", "/v1/chat/completions", b'{"messages": []}', 400),
    ("message not an object", "/v1/chat/completions", b'{"messages": ["hi"]}', 400),
    ("missing role", "/v1/chat/completions", b'{"messages": [{"content": "hi"}]}', 400),
    ("bad role", "/v1/chat/completions", b'{"messages": [{"role": "robot", "content": "hi"}]}', 400),
    ("content wrong type", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": 5}]}', 400),
    ("image content", "/v1/chat/completions",
     b'{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}', 400),
    ("invalid utf-8", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "\xff\xfe\xfd"}]}', 400),
    ("truncated utf-8", "/v1/completions", b'{"prompt": "caf\xc3"}', 400),
    ("unknown model", "/v1/chat/completions", b'{"model": "gpt-4", "messages": [{"role": "user", "content": "hi"}]}',
     404),
    ("model wrong type", "/v1/completions", b'{"model": 3, "prompt": "hi"}', 400),
    ("missing prompt", "/v1/completions", b'{"max_tokens": 4}', 400),
    ("prompt wrong type", "/v1/completions", b'{"prompt": {"a": 1}}', 400),
    ("too many prompts", "/v1/completions", json.dumps({"prompt": ["a"] * 17}).encode(), 400),
    ("token id out of vocab", "/v1/completions", b'{"prompt": [1, 99999999]}', 400),
    ("negative token id", "/v1/completions", b'{"prompt": [1, -1]}', 400),
    ("huge max_tokens", "/v1/completions", b'{"prompt": "hi", "max_tokens": 1000000000}', 400),
    ("zero max_tokens", "/v1/completions", b'{"prompt": "hi", "max_tokens": 0}', 400),
    ("negative max_tokens", "/v1/completions", b'{"prompt": "hi", "max_tokens": -1}', 400),
    ("max_tokens string", "/v1/completions", b'{"prompt": "hi", "max_tokens": "5"}', 400),
    ("prompt + max_tokens over context", "/v1/completions", b'{"prompt": "hi", "max_tokens": 2048}', 400),
    ("negative temperature", "/v1/completions", b'{"prompt": "hi", "temperature": -1}', 400),
    ("temperature too high", "/v1/completions", b'{"prompt": "hi", "temperature": 50}', 400),
    ("top_p zero", "/v1/completions", b'{"prompt": "hi", "top_p": 0}', 400),
    ("top_k negative", "/v1/completions", b'{"prompt": "hi", "top_k": -7}', 400),
    ("min_p above one", "/v1/completions", b'{"prompt": "hi", "min_p": 1.5}', 400),
    ("seed float", "/v1/completions", b'{"prompt": "hi", "seed": 1.5}', 400),
    ("n = 17", "/v1/completions", b'{"prompt": "hi", "n": 17}', 400),
    ("five stops", "/v1/completions", b'{"prompt": "hi", "stop": ["a", "b", "c", "d", "e"]}', 400),
    ("stop wrong type", "/v1/completions", b'{"prompt": "hi", "stop": 3}', 400),
    ("stream not bool", "/v1/completions", b'{"prompt": "hi", "stream": "yes"}', 400),
    ("stream_options without stream", "/v1/completions",
     b'{"prompt": "hi", "stream_options": {"include_usage": true}}', 400),
    ("top_logprobs over 20", "/v1/chat/completions",
     b'{"messages": [{"role": "user", "content": "hi"}], "logprobs": true, "top_logprobs": 21}', 400),
    ("unsupported schema keyword", "/v1/chat/completions",
     b'{"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_schema", '
     b'"json_schema": {"name": "x", "schema": {"type": "string", "format": "email", "pattern": "@"}}}}', 400),
    ("deep nesting", "/v1/completions", b"[" * 100000, 400),
    ("prompt longer than context", "/v1/completions",
     json.dumps({"prompt": "word " * 5000}).encode(), 400),
    ("10 MB body", "/v1/completions", b'{"prompt": "' + b"a" * (10 << 20) + b'"}', 413),
]


class BadInputTest(unittest.TestCase):
    def test_bad_inputs_get_4xx_and_server_keeps_serving(self):
        self.assertGreaterEqual(len(BAD_INPUTS), 30)
        for name, path, body, status in BAD_INPUTS:
            with self.subTest(name):
                r = requests.post(SERVER.base + path, data=body, headers={"Content-Type": "application/json"},
                                  timeout=60)
                self.assertEqual(r.status_code, status, r.text[:500])
                err = r.json()["error"]
                self.assertTrue(err["message"])
                for key in ("type", "param", "code"):
                    self.assertIn(key, err)
        r = requests.post(SERVER.base + "/v1/completions", json={"prompt": "word " * 5000}, timeout=60)
        msg = r.json()["error"]["message"]
        self.assertIn("2048", msg)  # the context
        self.assertRegex(msg, r"has \d{4,} tokens")  # the prompt's length
        # Other routes and methods.
        self.assertEqual(requests.get(SERVER.base + "/v1/nothing", timeout=10).status_code, 404)
        self.assertEqual(requests.get(SERVER.base + "/v1/completions", timeout=10).status_code, 405)
        self.assertEqual(requests.delete(SERVER.base + "/v1/models", timeout=10).status_code, 405)
        # Still serving.
        ok = requests.post(SERVER.base + "/v1/completions", json={"prompt": "Hello", "max_tokens": 4}, timeout=60)
        self.assertEqual(ok.status_code, 200)
        self.assertGreater(SERVER.metrics()['tandem_requests_total{outcome="bad_request"}'], 30)


class DisconnectTest(unittest.TestCase):
    def test_disconnects_free_kv_blocks(self):
        prompt = "Tell me a very long story about a dragon."
        # Warm: whatever the prefix cache keeps of this prompt is kept from here on.
        requests.post(SERVER.base + "/v1/completions", json={"prompt": prompt, "max_tokens": 2}, timeout=60)
        baseline = SERVER.wait_idle()
        cancelled_before = baseline['tandem_requests_total{outcome="cancelled"}']
        for _ in range(3):
            responses = []
            for _ in range(4):
                r = requests.post(SERVER.base + "/v1/completions", stream=True, timeout=60,
                                  json={"prompt": prompt, "max_tokens": 1000, "stream": True, "ignore_eos": True})
                self.assertEqual(r.status_code, 200)
                responses.append(r)
            for r in responses:
                lines = r.iter_lines()
                for _ in range(3):
                    next(lines)
                r.close()  # the client goes away mid-stream
        m = SERVER.wait_idle(timeout=60)
        deadline = time.time() + 30
        while m["tandem_kv_blocks_used"] != baseline["tandem_kv_blocks_used"] and time.time() < deadline:
            time.sleep(0.1)
            m = SERVER.metrics()
        self.assertEqual(m["tandem_kv_blocks_used"], baseline["tandem_kv_blocks_used"])
        self.assertEqual(m['tandem_requests_total{outcome="cancelled"}'] - cancelled_before, 12)


class AuthLimitsAndShutdownTest(unittest.TestCase):
    """A second server with an API key, one running sequence and one waiting slot."""

    def wait_for(self, server, running, waiting, timeout=30):
        deadline = time.time() + timeout
        while True:
            m = server.metrics()
            if m["tandem_requests_running"] == running and m["tandem_requests_waiting"] == waiting:
                return
            self.assertLess(time.time(), deadline, f"expected running={running} waiting={waiting}: {m}")
            time.sleep(0.02)

    def test_api_key_429_and_sigterm(self):
        # The drain deadline is generous: this test checks completion, not speed.
        server = Server("--api-key", "s3cret", "--max-num-seqs", "1", "--max-waiting", "1", "--drain-timeout-s", "600")
        try:
            auth = {"Authorization": "Bearer s3cret"}
            body = {"prompt": "Count: one, two,", "max_tokens": 4}
            self.assertEqual(requests.post(server.base + "/v1/completions", json=body, timeout=60).status_code, 401)
            self.assertEqual(requests.post(server.base + "/v1/completions", json=body, timeout=60,
                                           headers={"Authorization": "Bearer nope"}).status_code, 401)
            sdk = openai.OpenAI(base_url=server.base + "/v1", api_key="s3cret", max_retries=0)
            self.assertTrue(sdk.completions.create(model=MODEL_NAME, **body).choices[0].text)
            with self.assertRaises(openai.AuthenticationError):
                openai.OpenAI(base_url=server.base + "/v1", api_key="bad", max_retries=0).models.list()

            # One running, one waiting, the third is refused with 429.
            long_body = {"prompt": "Once upon a time", "max_tokens": 300, "ignore_eos": True, "stream": True}
            running = requests.post(server.base + "/v1/completions", json=long_body, headers=auth, stream=True,
                                    timeout=120)
            lines = running.iter_lines()
            next(lines)  # it is running
            self.wait_for(server, running=1, waiting=0)
            waiting = requests.post(server.base + "/v1/completions", json=long_body, headers=auth, stream=True,
                                    timeout=120)
            self.assertEqual(waiting.status_code, 200, waiting.text if waiting.status_code != 200 else "")
            self.wait_for(server, running=1, waiting=1)
            third = requests.post(server.base + "/v1/completions", json=body, headers=auth, timeout=60)
            self.assertEqual(third.status_code, 429, third.text)
            self.assertTrue(third.json()["error"]["message"])
            waiting.close()

            # SIGTERM while `running` streams: new requests get 503, it completes, exit 0.
            server.terminate()
            deadline = time.time() + 10
            status = None
            while time.time() < deadline:
                try:
                    status = requests.post(server.base + "/v1/completions", json=body, headers=auth,
                                           timeout=10).status_code
                except requests.ConnectionError:
                    status = "refused"
                if status == 503:
                    break
                time.sleep(0.05)
            self.assertEqual(status, 503)
            text, finish = "", None
            for ev in sse_events(lines):
                if ev == "[DONE]":
                    break
                self.assertIn("choices", ev, f"an error event instead of output: {ev}")
                if ev["choices"]:
                    text += ev["choices"][0]["text"]
                    finish = ev["choices"][0]["finish_reason"] or finish
            self.assertEqual(finish, "length")
            self.assertTrue(text)
            self.assertEqual(server.proc.wait(timeout=600), 0, server.log_text())
        finally:
            server.stop()


if __name__ == "__main__":
    unittest.main(verbosity=2)
