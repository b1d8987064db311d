"""End-to-end tests of the OpenAI features beyond plain generation, with the real model and the
openai SDK: logprobs (chat and completions, streamed and not), n > 1, several prompts per call,
penalties, logit_bias, min_tokens, stop_token_ids, echo, /tokenize and /detokenize, and model
aliases.

Run: python3 -m unittest -v tests/server/test_api_features.py   (after building build/tandem)
"""
import concurrent.futures
import json
import math
import os
import re
import sys
import unittest

import jsonschema
import openai
import requests

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from server_util import MODEL_NAME, Server, sse_events  # noqa: E402

ALIAS = "tandem-test-alias"
SERVER = None


def setUpModule():
    global SERVER
    SERVER = Server("--served-model-name", MODEL_NAME, ALIAS)


def tearDownModule():
    if SERVER is not None:
        rc = SERVER.stop()
        if rc != 0:
            print(SERVER.log_text(), file=sys.stderr)


def client():
    return openai.OpenAI(base_url=SERVER.base + "/v1", api_key="unused", max_retries=0, timeout=300)


def tokenize(text, add_special_tokens=False):
    r = requests.post(SERVER.base + "/tokenize",
                      json={"model": MODEL_NAME, "prompt": text, "add_special_tokens": add_special_tokens},
                      timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def detokenize(ids):
    r = requests.post(SERVER.base + "/detokenize", json={"model": MODEL_NAME, "tokens": ids}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["prompt"]


def metric(name):
    text = requests.get(SERVER.base + "/metrics", timeout=30).text
    m = re.search(r"^" + re.escape(name) + r" ([0-9.e+]+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


CHAT = [{"role": "user", "content": "Name three colours."}]


class LogprobsTest(unittest.TestCase):
    def test_chat_logprobs_match_the_content_and_the_stream(self):
        c = client()
        full = c.chat.completions.create(model=MODEL_NAME, messages=CHAT, max_tokens=24, temperature=0,
                                         logprobs=True, top_logprobs=5)
        content = full.choices[0].logprobs.content
        self.assertEqual(len(content), full.usage.completion_tokens)
        # The end token (if any) is reported but shows no text.
        text = "".join(t.token for t in content if t.token != "<|im_end|>")
        self.assertEqual(text, full.choices[0].message.content)
        for t in content:
            self.assertLessEqual(t.logprob, 0.0)
            self.assertEqual(len(t.top_logprobs), 5)
            self.assertEqual(bytes(t.bytes).decode("utf-8", "replace"), t.token)
            # Greedy: the chosen token is the most likely one (raw logprobs).
            self.assertAlmostEqual(t.top_logprobs[0].logprob, t.logprob, places=4)
            self.assertLessEqual(sum(math.exp(a.logprob) for a in t.top_logprobs), 1.0 + 1e-4)
            lps = [a.logprob for a in t.top_logprobs]
            self.assertEqual(lps, sorted(lps, reverse=True))

        chunks = list(c.chat.completions.create(model=MODEL_NAME, messages=CHAT, max_tokens=24, temperature=0,
                                                logprobs=True, top_logprobs=5, stream=True))
        streamed = [t for ch in chunks if ch.choices and ch.choices[0].logprobs
                    for t in ch.choices[0].logprobs.content]
        self.assertEqual([t.token for t in streamed], [t.token for t in content])
        for a, b in zip(streamed, content):
            self.assertAlmostEqual(a.logprob, b.logprob, places=5)

    def test_logprobs_do_not_change_with_temperature_or_penalties(self):
        # Raw logprobs of the first token depend on the prompt only.
        c = client()
        kw = dict(model=MODEL_NAME, prompt="The capital of France is", max_tokens=1, logprobs=5)
        a = c.completions.create(temperature=0, **kw).choices[0].logprobs
        b = c.completions.create(temperature=1.5, seed=3, frequency_penalty=1.0, **kw).choices[0].logprobs
        # The maps hold the drawn token and the five most likely; the five are the same.
        top_a = sorted(a.top_logprobs[0].items(), key=lambda kv: -kv[1])[:5]
        for token, lp in top_a:
            self.assertIn(token, b.top_logprobs[0])
            self.assertAlmostEqual(lp, b.top_logprobs[0][token], places=5)

    def test_completion_logprobs_arrays(self):
        c = client()
        r = c.completions.create(model=MODEL_NAME, prompt="1, 2, 3, 4,", max_tokens=12, temperature=0,
                                 logprobs=3, extra_body={"ignore_eos": True})
        lp = r.choices[0].logprobs
        self.assertEqual("".join(lp.tokens), r.choices[0].text)
        self.assertEqual(len(lp.token_logprobs), 12)
        self.assertEqual(lp.text_offset[0], 0)
        offsets = [0]
        for tok in lp.tokens[:-1]:
            offsets.append(offsets[-1] + len(tok.encode()))
        self.assertEqual(lp.text_offset, offsets)
        for tok, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
            self.assertIn(tok, top)
            self.assertAlmostEqual(top[tok], value, places=5)
            self.assertLessEqual(len(top), 4)  # the token and three alternatives

    def test_echo_prepends_the_prompt(self):
        c = client()
        plain = c.completions.create(model=MODEL_NAME, prompt="Once upon a time", max_tokens=8, temperature=0)
        echo = c.completions.create(model=MODEL_NAME, prompt="Once upon a time", max_tokens=8, temperature=0,
                                    echo=True)
        self.assertEqual(echo.choices[0].text, "Once upon a time" + plain.choices[0].text)

    def test_echo_with_logprobs_scores_the_prompt(self):
        # What evaluation harnesses send: echo, logprobs, max_tokens 0.
        c = client()
        prompt = "The capital of France is Paris"
        r = c.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=0, echo=True, logprobs=2,
                                 temperature=0)
        lp = r.choices[0].logprobs
        ids = tokenize(prompt)
        self.assertEqual(r.choices[0].text, prompt)
        self.assertEqual("".join(lp.tokens), prompt)
        self.assertEqual(len(lp.tokens), len(ids))
        self.assertIsNone(lp.token_logprobs[0])
        self.assertIsNone(lp.top_logprobs[0])
        self.assertEqual(r.usage.completion_tokens, 0)
        # Each value is the log-probability the model gives that token after the ones before it:
        # forced by logit_bias, a generated token reports its raw logprob (before the bias).
        for k in (1, len(ids) // 2, len(ids) - 1):
            forced = c.completions.create(model=MODEL_NAME, prompt=ids[:k], max_tokens=1, temperature=0,
                                          logprobs=0, logit_bias={str(ids[k]): 100})
            self.assertEqual(forced.choices[0].logprobs.tokens[0], lp.tokens[k])
            self.assertAlmostEqual(forced.choices[0].logprobs.token_logprobs[0], lp.token_logprobs[k], places=3)
        # With generated tokens: the prompt's entries, then the output's.
        r2 = c.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=4, echo=True, logprobs=1,
                                  temperature=0, extra_body={"ignore_eos": True})
        self.assertEqual(len(r2.choices[0].logprobs.tokens), len(ids) + 4)
        self.assertEqual(r2.choices[0].logprobs.token_logprobs[:len(ids)], lp.token_logprobs)
        self.assertTrue(r2.choices[0].text.startswith(prompt))
        streamed_tokens = []
        for ch in c.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=4, echo=True, logprobs=1,
                                       temperature=0, stream=True, extra_body={"ignore_eos": True}):
            if ch.choices and ch.choices[0].logprobs:
                streamed_tokens += ch.choices[0].logprobs.tokens
        self.assertEqual(streamed_tokens, r2.choices[0].logprobs.tokens)


class ChoicesTest(unittest.TestCase):
    def test_n_choices_are_seeded_per_index_and_streamed_by_index(self):
        c = client()
        kw = dict(model=MODEL_NAME, prompt="My favourite animal is", max_tokens=12, temperature=1.0)
        three = c.completions.create(n=3, seed=40, **kw)
        self.assertEqual([ch.index for ch in three.choices], [0, 1, 2])
        texts = [ch.text for ch in three.choices]
        # Choice i draws as a single request seeded with seed + i.
        for i in range(3):
            self.assertEqual(c.completions.create(seed=40 + i, **kw).choices[0].text, texts[i])
        self.assertGreaterEqual(len(set(texts)), 2)
        single = c.completions.create(seed=40, **kw)
        self.assertEqual(three.usage.prompt_tokens, single.usage.prompt_tokens)
        self.assertGreater(three.usage.completion_tokens, single.usage.completion_tokens)
        streamed = {}
        for ch in c.completions.create(n=3, seed=40, stream=True, **kw):
            for choice in ch.choices:
                streamed[choice.index] = streamed.get(choice.index, "") + choice.text
        self.assertEqual([streamed[i] for i in range(3)], texts)

    def test_n_choices_share_the_prompt_kv(self):
        c = client()
        prompt = "Here is a long story about a lighthouse keeper. " * 12
        before = metric("tandem_prefix_cache_hit_tokens_total")
        r = c.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=4, temperature=0.8, seed=1, n=4)
        hits = metric("tandem_prefix_cache_hit_tokens_total") - before
        n_prompt = r.usage.prompt_tokens
        # Choices 1..3 find every full block of the prompt but the last token's in the cache.
        self.assertGreaterEqual(hits, 3 * (n_prompt - 32), (hits, n_prompt))

    def test_chat_n_and_several_prompts(self):
        c = client()
        chat = c.chat.completions.create(model=MODEL_NAME, messages=CHAT, max_tokens=10, temperature=0, n=2)
        self.assertEqual(len(chat.choices), 2)
        self.assertEqual(chat.choices[0].message.content, chat.choices[1].message.content)  # greedy
        prompts = ["The sky is", "Two plus two is", "Paris is in"]
        many = c.completions.create(model=MODEL_NAME, prompt=prompts, max_tokens=6, temperature=0)
        self.assertEqual(len(many.choices), 3)
        for i, p in enumerate(prompts):
            alone = c.completions.create(model=MODEL_NAME, prompt=p, max_tokens=6, temperature=0)
            self.assertEqual(many.choices[i].text, alone.choices[0].text)
        # Prompts x n: index = prompt * n + i.
        grid = c.completions.create(model=MODEL_NAME, prompt=prompts[:2], max_tokens=4, temperature=0, n=2)
        self.assertEqual([ch.index for ch in grid.choices], [0, 1, 2, 3])
        self.assertEqual(grid.choices[2].text, many.choices[1].text[:len(grid.choices[2].text)])


class LogitControlsTest(unittest.TestCase):
    def test_logit_bias_forces_and_bans_tokens(self):
        c = client()
        banana = tokenize(" banana")
        self.assertEqual(len(banana), 1)
        forced = c.completions.create(model=MODEL_NAME, prompt="Hello", max_tokens=4, temperature=0,
                                      logit_bias={str(banana[0]): 100}, extra_body={"ignore_eos": True})
        self.assertEqual(forced.choices[0].text, detokenize(banana * 4))
        first = c.completions.create(model=MODEL_NAME, prompt="The capital of France is", max_tokens=1,
                                     temperature=0)
        ids = tokenize(first.choices[0].text)
        self.assertEqual(len(ids), 1)
        banned = c.completions.create(model=MODEL_NAME, prompt="The capital of France is", max_tokens=1,
                                      temperature=0, logit_bias={str(ids[0]): -100})
        self.assertNotEqual(banned.choices[0].text, first.choices[0].text)

    def test_min_tokens_and_stop_token_ids(self):
        c = client()
        short = c.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "Say hi."}],
                                          max_tokens=100, temperature=0)
        self.assertEqual(short.choices[0].finish_reason, "stop")
        n = short.usage.completion_tokens
        longer = c.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "Say hi."}],
                                           max_tokens=100, temperature=0, extra_body={"min_tokens": n + 6})
        self.assertGreaterEqual(longer.usage.completion_tokens, n + 6)

        base = c.completions.create(model=MODEL_NAME, prompt="1, 2, 3, 4,", max_tokens=12, temperature=0,
                                    extra_body={"ignore_eos": True})
        ids = tokenize(base.choices[0].text)
        stop_at = ids.index(ids[3])  # the first occurrence of the fourth token
        cut = c.completions.create(model=MODEL_NAME, prompt="1, 2, 3, 4,", max_tokens=12, temperature=0,
                                   extra_body={"ignore_eos": True, "stop_token_ids": [ids[3]]})
        self.assertEqual(cut.choices[0].finish_reason, "stop")
        self.assertEqual(cut.usage.completion_tokens, stop_at + 1)
        self.assertEqual(cut.choices[0].text, detokenize(ids[:stop_at]))

    def test_penalties_change_repetitive_output(self):
        c = client()
        kw = dict(model=MODEL_NAME, prompt="one one one one one one", max_tokens=24, temperature=0,
                  extra_body={"ignore_eos": True})
        plain = c.completions.create(**kw).choices[0].text
        freq = c.completions.create(frequency_penalty=2.0, **kw).choices[0].text
        pres = c.completions.create(presence_penalty=2.0, **kw).choices[0].text
        rep = c.completions.create(model=MODEL_NAME, prompt="one one one one one one", max_tokens=24,
                                   temperature=0, extra_body={"ignore_eos": True, "repetition_penalty": 1.5})
        rep = rep.choices[0].text

        def distinct(text):
            ids = tokenize(text)
            return len(set(ids)) / max(1, len(ids))

        for penalised in (freq, pres, rep):
            self.assertNotEqual(penalised, plain)
            self.assertGreater(distinct(penalised), distinct(plain))


PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 20},
        "age": {"type": "integer"},
        "city": {"enum": ["Paris", "Rome", "Oslo"]},
        "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 3},
        "pet": {"anyOf": [{"type": "null"}, {"type": "object", "properties": {"kind": {"type": "string", "maxLength": 10}},
                                               "required": ["kind"], "additionalProperties": False}]},
    },
    "required": ["name", "age", "city", "hobbies"],
    "additionalProperties": False,
}


def person_format():
    return {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}


class StructuredOutputTest(unittest.TestCase):
    def test_json_schema_output_always_validates(self):
        c = client()
        prompts = ["Describe a person as JSON.", "Invent a character from Rome.", "Who are you?",
                   "Write a poem about the sea."]  # the last is not a JSON request at all
        for i, prompt in enumerate(prompts):
            for temperature, seed in ((0, None), (1.0, i)):
                with self.subTest(prompt=prompt, temperature=temperature):
                    r = c.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": prompt}],
                                                  max_tokens=300, temperature=temperature, seed=seed,
                                                  response_format=person_format())
                    self.assertEqual(r.choices[0].finish_reason, "stop", r.choices[0].message.content)
                    doc = json.loads(r.choices[0].message.content)
                    jsonschema.validate(doc, PERSON)

    def test_streamed_structured_output_equals_the_whole(self):
        c = client()
        kw = dict(model=MODEL_NAME, messages=[{"role": "user", "content": "A person, as JSON."}], max_tokens=300,
                  temperature=0, response_format=person_format())
        whole = c.chat.completions.create(**kw).choices[0].message.content
        chunks = c.chat.completions.create(stream=True, **kw)
        self.assertEqual("".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices), whole)

    def test_json_object_and_completions(self):
        c = client()
        r = c.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "A JSON object about cats."}],
                                      max_tokens=300, temperature=0, response_format={"type": "json_object"})
        if r.choices[0].finish_reason == "stop":
            self.assertIsInstance(json.loads(r.choices[0].message.content), dict)
        else:  # cut by max_tokens: still a valid prefix of an object
            self.assertTrue(r.choices[0].message.content.lstrip().startswith("{"))
        # The completions endpoint takes response_format too (an extension, as vLLM).
        body = {"model": MODEL_NAME, "prompt": "Answer in JSON:", "max_tokens": 60, "temperature": 0,
                "response_format": {"type": "json_schema", "json_schema": {"name": "b", "schema": {
                    "type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
                    "additionalProperties": False}}}}
        r = requests.post(SERVER.base + "/v1/completions", json=body, timeout=60).json()
        self.assertIn(json.loads(r["choices"][0]["text"])["ok"], (True, False))

    def test_unsupported_schemas_are_400_naming_the_keyword(self):
        body = {"model": MODEL_NAME, "messages": CHAT, "response_format": {
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "^a"}}}}
        r = requests.post(SERVER.base + "/v1/chat/completions", json=body, timeout=30)
        self.assertEqual(r.status_code, 400)
        self.assertIn("pattern", r.json()["error"]["message"])


WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40},
                                           "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"timezone": {"type": "string", "maxLength": 40}},
        "required": ["timezone"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather of a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "description": "Current time in a timezone",
                                           "parameters": TIME}}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


class ToolsTest(unittest.TestCase):
    def check_call(self, call, name=None):
        self.assertEqual(call.type, "function")
        self.assertTrue(call.id.startswith("call_"))
        self.assertIn(call.function.name, ("get_weather", "get_time"))
        if name:
            self.assertEqual(call.function.name, name)
        jsonschema.validate(json.loads(call.function.arguments),
                            WEATHER if call.function.name == "get_weather" else TIME)

    def test_required_and_named_calls_are_valid(self):
        c = client()
        for choice, name in (("required", None), ({"type": "function", "function": {"name": "get_time"}}, "get_time")):
            for temperature, seed, parallel in ((0, None, True), (1.0, 4, True), (0, None, False)):
                with self.subTest(choice=choice, temperature=temperature, parallel=parallel):
                    # The constraint ends the answer after 8 calls at most; a sampled call here
                    # takes 30-70 tokens (its strings are at most 40 characters), so 1,024 tokens
                    # leave room for 8 long ones: the answer ends with its calls, not its budget.
                    # (200 was too few for one machine's draws at temperature 1: three long calls
                    # and the start of a fourth.)
                    r = c.chat.completions.create(model=MODEL_NAME, messages=ASK, tools=TOOLS, tool_choice=choice,
                                                  max_tokens=1024, temperature=temperature, seed=seed,
                                                  parallel_tool_calls=parallel)
                    self.assertEqual(r.choices[0].finish_reason, "tool_calls")
                    self.assertIsNone(r.choices[0].message.content)
                    calls = r.choices[0].message.tool_calls
                    # Several calls may follow one another when parallel calls are allowed (at most 8).
                    self.assertGreaterEqual(len(calls), 1)
                    self.assertLessEqual(len(calls), 8 if parallel else 1)
                    self.assertEqual(len({t.id for t in calls}), len(calls), "each call has its own id")
                    for t in calls:
                        self.check_call(t, name)

    def test_streamed_call_and_the_next_turn(self):
        c = client()
        stream = c.chat.completions.create(model=MODEL_NAME, messages=ASK, tools=TOOLS, tool_choice="required",
                                           max_tokens=200, temperature=0, stream=True)
        calls, finish = {}, None
        for ch in stream:
            for choice in ch.choices:
                for d in choice.delta.tool_calls or []:
                    entry = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
                    entry["id"] = d.id or entry["id"]
                    entry["name"] += d.function.name or ""
                    entry["arguments"] += d.function.arguments or ""
                finish = choice.finish_reason or finish
                self.assertFalse(choice.delta.content, "a call streams no content")
        self.assertEqual(finish, "tool_calls")
        self.assertEqual(sorted(calls), list(range(len(calls))), "indices count up from 0")
        whole = c.chat.completions.create(model=MODEL_NAME, messages=ASK, tools=TOOLS, tool_choice="required",
                                          max_tokens=200, temperature=0).choices[0].message.tool_calls
        self.assertEqual([(calls[i]["name"], json.loads(calls[i]["arguments"])) for i in range(len(calls))],
                         [(t.function.name, json.loads(t.function.arguments)) for t in whole])
        # The calls and their results go back to the model; it answers in words.
        messages = ASK + [{"role": "assistant", "content": None, "tool_calls": [
            {"id": call["id"], "type": "function", "function": {"name": call["name"], "arguments": call["arguments"]}}
            for call in calls.values()]}]
        messages += [{"role": "tool", "tool_call_id": call["id"], "content": json.dumps({"temperature_c": 21})}
                     for call in calls.values()]
        r = c.chat.completions.create(model=MODEL_NAME, messages=messages, tools=TOOLS, tool_choice="none",
                                      max_tokens=40, temperature=0)
        self.assertTrue(r.choices[0].message.content)
        self.assertFalse(r.choices[0].message.tool_calls)

    def test_auto_answers_in_words_or_with_a_valid_call(self):
        c = client()
        asks = [ASK, [{"role": "user", "content": "Hello! How are you?"}],
                [{"role": "user", "content": "Call get_time for Europe/Oslo."}]]
        for messages in asks:
            r = c.chat.completions.create(model=MODEL_NAME, messages=messages, tools=TOOLS, max_tokens=80,
                                          temperature=0)
            m = r.choices[0].message
            if m.tool_calls:
                self.assertEqual(r.choices[0].finish_reason, "tool_calls")
                self.check_call(m.tool_calls[0])
            else:
                self.assertTrue(m.content)
                self.assertNotIn("<tool_call>", m.content)

    def test_bad_tool_requests_are_400(self):
        cases = [
            {"messages": ASK, "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            {"messages": ASK, "tool_choice": "required"},
            {"messages": ASK, "tools": [{"type": "function", "function": {"name": "bad name!"}}]},
            {"messages": ASK, "tools": TOOLS, "response_format": {"type": "json_object"}},
            {"messages": ASK, "tools": [{"type": "function", "function": {
                "name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "string", "pattern": "a"}}}}}]},
        ]
        for body in cases:
            r = requests.post(SERVER.base + "/v1/chat/completions", json=dict(body, model=MODEL_NAME), timeout=30)
            self.assertEqual(r.status_code, 400, (body, r.text))
        r = requests.post(SERVER.base + "/v1/completions",
                          json={"model": MODEL_NAME, "prompt": "x", "tools": TOOLS}, timeout=30)
        self.assertEqual(r.status_code, 400)


class BatchInvarianceTest(unittest.TestCase):
    def test_features_give_the_same_answer_alone_and_under_load(self):
        # Sampled (seeded), penalised, biased, constrained and scored requests: the answer does
        # not depend on what else runs.
        bodies = [
            {"prompt": "Once upon a time", "max_tokens": 24, "temperature": 0.9, "seed": 5,
             "frequency_penalty": 0.7, "logprobs": 2},
            {"prompt": "1, 2, 3,", "max_tokens": 16, "temperature": 0, "repetition_penalty": 1.3,
             "logit_bias": {"28": -5}},
            {"prompt": "A person as JSON:", "max_tokens": 120, "temperature": 0.8, "seed": 9,
             "response_format": person_format()},
            {"prompt": "The quick brown fox", "max_tokens": 2, "echo": True, "logprobs": 1, "temperature": 0},
        ]

        def run(body):
            r = requests.post(SERVER.base + "/v1/completions", json=dict(body, model=MODEL_NAME), timeout=300)
            self.assertEqual(r.status_code, 200, r.text)
            c = r.json()["choices"][0]
            return c["text"], json.dumps(c["logprobs"], sort_keys=True)

        alone = [run(b) for b in bodies]
        with concurrent.futures.ThreadPoolExecutor(12) as pool:
            loaded = list(pool.map(run, bodies * 3))
        for i, got in enumerate(loaded):
            self.assertEqual(got, alone[i % len(bodies)], bodies[i % len(bodies)])


class EdgesTest(unittest.TestCase):
    def test_tokenize_and_detokenize(self):
        r = requests.post(SERVER.base + "/tokenize",
                          json={"prompt": "Hello world", "return_token_strs": True}, timeout=30).json()
        self.assertEqual(r["count"], len(r["tokens"]))
        self.assertEqual("".join(r["token_strs"]), "Hello world")
        self.assertEqual(detokenize(r["tokens"]), "Hello world")
        self.assertEqual(r["max_model_len"], 2048)
        chat = requests.post(SERVER.base + "/tokenize", json={"messages": CHAT}, timeout=30).json()
        full = client().chat.completions.create(model=MODEL_NAME, messages=CHAT, max_tokens=1)
        self.assertEqual(chat["count"], full.usage.prompt_tokens)
        bad = requests.post(SERVER.base + "/detokenize", json={"tokens": [-1]}, timeout=30)
        self.assertEqual(bad.status_code, 400)
        bad = requests.post(SERVER.base + "/tokenize", json={"prompt": "x", "model": "nope"}, timeout=30)
        self.assertEqual(bad.status_code, 404)

    def test_model_aliases(self):
        c = client()
        self.assertEqual([m.id for m in c.models.list().data], [MODEL_NAME, ALIAS])
        r = c.completions.create(model=ALIAS, prompt="Hi", max_tokens=2)
        self.assertEqual(r.model, ALIAS)
        with self.assertRaises(openai.NotFoundError):
            c.completions.create(model="not-served", prompt="Hi", max_tokens=2)

    def test_unseeded_sampling_differs(self):
        c = client()
        kw = dict(model=MODEL_NAME, prompt="A random word:", max_tokens=12, temperature=1.5)
        texts = {c.completions.create(**kw).choices[0].text for _ in range(4)}
        self.assertGreater(len(texts), 1)


if __name__ == "__main__":
    unittest.main()
