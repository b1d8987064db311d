"""End-to-end test of a chat template given at start (`tandem serve --chat-template FILE`),
rendered by tandem's Jinja renderer: the prompt the server builds for a conversation with tools,
tool calls and tool results is the one jinja2 renders (tests/golden/jinja, made by
tools/golden/make_jinja_golden.py); the template's own refusal is a 400 with its message; a chat
completion runs; a template that does not parse stops the server at start. Tool calls follow
the template's own format (this template's is Mistral's "[TOOL_CALLS] [...]"), or the one
--tool-call-format names.

Run: python3 -m unittest -v tests/server/test_chat_template.py   (after building build/tandem)
"""
import json
import os
import subprocess
import sys
import unittest

import jsonschema
import openai
import requests

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from server_util import BIN, MODEL, MODEL_NAME, SOURCE_DIR, Server  # noqa: E402

GOLDEN = os.path.join(SOURCE_DIR, "tests", "golden", "jinja")
TEMPLATE = os.path.join(GOLDEN, "templates", "mistral_style.jinja")
SERVER = None


def setUpModule():
    global SERVER
    SERVER = Server("--mode", "colocated", "--chat-template", TEMPLATE)


def tearDownModule():
    if SERVER is not None:
        rc = SERVER.stop()
        if rc != 0:
            print(SERVER.log_text(), file=sys.stderr)


def golden_cases(template):
    with open(os.path.join(GOLDEN, "jinja_golden.json"), encoding="utf-8") as f:
        return [c for c in json.load(f)["cases"] if c["template"] == template]


def as_openai(messages):
    """The golden conversation as an OpenAI request carries it (arguments as JSON strings)."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            m["tool_calls"] = [
                {**c, "function": {**c["function"], "arguments": c["function"]["arguments"]
                                   if isinstance(c["function"]["arguments"], str)
                                   else json.dumps(c["function"]["arguments"], ensure_ascii=False)}}
                for c in m["tool_calls"]]
        if m.get("content") is None:
            m.pop("content", None)
        out.append(m)
    return out


class ChatTemplateFileTest(unittest.TestCase):
    def rendered(self, messages, tools, add_generation_prompt):
        body = {"model": MODEL_NAME, "messages": messages,
                "add_generation_prompt": add_generation_prompt}
        if tools:
            body["tools"] = tools
        r = requests.post(SERVER.base + "/tokenize", json=body, timeout=60)
        self.assertEqual(r.status_code, 200, r.text)
        tokens = r.json()["tokens"]
        r = requests.post(SERVER.base + "/detokenize", json={"model": MODEL_NAME, "tokens": tokens},
                          timeout=60)
        self.assertEqual(r.status_code, 200, r.text)
        return r.json()["prompt"]

    def test_prompts_equal_jinja2(self):
        # The golden renders saw bos_token "<s>" and eos_token "</s>"; SmolLM2's are these.
        # The server gives templates a call's arguments as an object (as vLLM does; OpenAI sends
        # them as a string): conversations whose golden render saw a string are left out.
        checked = 0
        for case in golden_cases("mistral_style"):
            calls = [c for m in case["context"]["messages"] for c in m.get("tool_calls") or []]
            if "error" in case or any(isinstance(c["function"]["arguments"], str) for c in calls):
                continue
            ctx = case["context"]
            expected = case["expected"].replace("<s>", "<|im_start|>").replace("</s>", "<|im_end|>")
            got = self.rendered(as_openai(ctx["messages"]), ctx["tools"],
                                ctx["add_generation_prompt"])
            self.assertEqual(got, expected, json.dumps(ctx["messages"])[:200])
            checked += 1
        self.assertEqual(checked, 16)

    def test_template_refusal_is_a_400_with_its_message(self):
        r = requests.post(SERVER.base + "/v1/chat/completions", timeout=60, json={
            "model": MODEL_NAME, "max_tokens": 4,
            "messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]})
        self.assertEqual(r.status_code, 400, r.text)
        self.assertIn("turns alternate user then assistant", r.json()["error"]["message"])

    def test_chat_completion_runs(self):
        c = openai.OpenAI(base_url=SERVER.base + "/v1", api_key="unused", max_retries=0,
                          timeout=300)
        out = c.chat.completions.create(model=MODEL_NAME, max_tokens=8, temperature=0,
                                        messages=[{"role": "user", "content": "Say hi"}])
        self.assertGreater(out.usage.prompt_tokens, 3)
        self.assertGreaterEqual(out.usage.completion_tokens, 1)
        self.assertIsInstance(out.choices[0].message.content, str)
        self.assertIn(out.choices[0].finish_reason, ("stop", "length"))

    def test_bad_template_stops_the_server_at_start(self):
        bad = os.path.join(SOURCE_DIR, "build", "bad_template.jinja")
        with open(bad, "w") as f:
            f.write("{% for m in messages %}\n{{ m.content }\n")
        p = subprocess.run([BIN, "serve", "--model", MODEL, "--mode", "colocated",
                            "--chat-template", bad, "--port", "1"],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("line 2", p.stderr)


WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40}},
           "required": ["city"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather of a city",
                                           "parameters": WEATHER}}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def raw_call(base, tool_choice, stream=False):
    """A call's tool_calls, finish reason and the model's raw text (its logprobs' tokens).

    One call only (parallel_tool_calls off): this model, asked greedily, repeats its call until
    max_tokens when more are allowed."""
    c = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=300)
    kwargs = dict(model=MODEL_NAME, messages=ASK, tools=TOOLS, tool_choice=tool_choice, max_tokens=120,
                  temperature=0, logprobs=True, parallel_tool_calls=False)
    if not stream:
        r = c.chat.completions.create(**kwargs)
        calls = [(t.function.name, json.loads(t.function.arguments)) for t in r.choices[0].message.tool_calls or []]
        return calls, r.choices[0].finish_reason, "".join(t.token for t in r.choices[0].logprobs.content)
    calls, finish, raw = {}, None, ""
    for ch in c.chat.completions.create(stream=True, **kwargs):
        for choice in ch.choices:
            for d in choice.delta.tool_calls or []:
                entry = calls.setdefault(d.index, ["", ""])
                entry[0] += d.function.name or ""
                entry[1] += d.function.arguments or ""
            if choice.logprobs and choice.logprobs.content:
                raw += "".join(t.token for t in choice.logprobs.content)
            finish = choice.finish_reason or finish
    return [(n, json.loads(a)) for n, a in calls.values()], finish, raw


class ToolCallFormatTest(unittest.TestCase):
    def check(self, calls, finish, raw, opening):
        self.assertEqual(finish, "tool_calls")
        self.assertEqual(len(calls), 1)
        self.assertEqual(calls[0][0], "get_weather")
        jsonschema.validate(calls[0][1], WEATHER)
        self.assertTrue(raw.lstrip().startswith(opening), raw)

    def test_calls_take_the_templates_format(self):
        for stream in (False, True):
            for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
                with self.subTest(stream=stream, choice=choice):
                    self.check(*raw_call(SERVER.base, choice, stream), opening="[TOOL_CALLS]")
        # A call made in this format goes back through the template the same way.
        calls, _, raw = raw_call(SERVER.base, "required")
        r = requests.post(SERVER.base + "/v1/chat/completions", timeout=300, json={
            "model": MODEL_NAME, "max_tokens": 8, "temperature": 0, "tools": TOOLS, "messages": ASK + [
                {"role": "assistant", "tool_calls": [{"id": "a1b2c3d4e", "type": "function", "function": {
                    "name": calls[0][0], "arguments": json.dumps(calls[0][1])}}]},
                {"role": "tool", "tool_call_id": "a1b2c3d4e", "content": "{\"temperature_c\": 21}"}]})
        self.assertEqual(r.status_code, 200, r.text)

    def test_the_flag_names_another_format(self):
        # Disaggregated (the default mode): the format travels with the request to the workers.
        other = Server("--chat-template", TEMPLATE, "--tool-call-format", "llama3_json")
        try:
            for stream in (False, True):
                calls, finish, raw = raw_call(other.base, "required", stream)
                self.check(calls, finish, raw, opening="{")
                self.assertIn('"parameters"', raw)
        finally:
            self.assertEqual(other.stop(), 0, other.log_text())
        p = subprocess.run([BIN, "serve", "--model", MODEL, "--tool-call-format", "xml", "--port", "1"],
                           capture_output=True, text=True, timeout=120)
        self.assertNotEqual(p.returncode, 0, p.stderr)
        self.assertIn("--tool-call-format", p.stderr)


if __name__ == "__main__":
    unittest.main()
