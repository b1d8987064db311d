"""The OpenAI features beyond plain generation give the colocated mode's answers when prefill and
decode are disaggregated: penalties, logit_bias, min_tokens and stop_token_ids continue on the
decode worker from the first token the prefill worker drew; logprobs travel with every token;
n > 1 and several prompts per call fan out through the conductor."""
import json
import unittest
import urllib.request

from disagg_util import MODEL_NAME, colocated, disaggregated, post

CHAT = [{"role": "user", "content": "Write a sentence about the sea."}]

# (path, body, streamed): sampled requests carry a seed; none depends on the order they run in.
REQUESTS = [
    ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 24, "temperature": 0,
                              "frequency_penalty": 1.2, "presence_penalty": 0.4}, False),
    ("/v1/completions", {"prompt": "one one one one", "max_tokens": 20, "temperature": 0,
                         "repetition_penalty": 1.4, "ignore_eos": True}, True),
    ("/v1/completions", {"prompt": "The ocean is", "max_tokens": 16, "temperature": 0.9, "seed": 11,
                         "frequency_penalty": 0.8, "top_p": 0.9}, False),
    ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 16, "temperature": 0,
                              "logprobs": True, "top_logprobs": 4}, True),
    ("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 10, "temperature": 0,
                         "logprobs": 3}, False),
    ("/v1/completions", {"prompt": "Colours: red,", "max_tokens": 8, "temperature": 1.0, "seed": 5,
                         "n": 3}, True),
    ("/v1/completions", {"prompt": ["Cats are", "Dogs are"], "max_tokens": 8, "temperature": 0}, False),
    ("/v1/completions", {"prompt": "Hello", "max_tokens": 6, "temperature": 0,
                         "logit_bias": {"17": 100}, "ignore_eos": True}, False),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 40,
                              "temperature": 0, "min_tokens": 25}, False),
    ("/v1/completions", {"prompt": "1, 2, 3, 4,", "max_tokens": 12, "temperature": 0,
                         "stop_token_ids": [28], "ignore_eos": True}, True),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "A city, as JSON."}], "max_tokens": 200,
                              "temperature": 0.8, "seed": 21, "response_format": {
                                  "type": "json_schema", "json_schema": {"name": "city", "schema": {
                                      "type": "object",
                                      "properties": {"name": {"type": "string", "maxLength": 24},
                                                     "population": {"type": "integer"},
                                                     "sights": {"type": "array", "maxItems": 3,
                                                                "items": {"type": "string", "maxLength": 24}}},
                                      "required": ["name", "population", "sights"],
                                      "additionalProperties": False}}}}, True),
    ("/v1/completions", {"prompt": "The quick brown fox", "max_tokens": 3, "temperature": 0, "echo": True,
                         "logprobs": 2}, False),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Weather in Rome?"}], "max_tokens": 320,
                              "temperature": 0.7, "seed": 2, "tool_choice": "required", "tools": [
                                  {"type": "function", "function": {"name": "get_weather", "parameters": {
                                      "type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                                      "required": ["city"], "additionalProperties": False}}}]}, False),
]


def streamed(server, path, body):
    """Streams a request; returns the choices as a non-streamed response would hold them."""
    body = dict(body, stream=True, stream_options={"include_usage": True})
    req = urllib.request.Request(server.base + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    choices, usage = {}, None
    with urllib.request.urlopen(req, timeout=300) as r:
        for line in r:
            line = line.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            event = json.loads(line[6:])
            assert "error" not in event, event
            usage = event.get("usage") or usage
            for c in event["choices"]:
                out = choices.setdefault(c["index"], {"text": "", "logprobs": [], "finish": None})
                out["text"] += (c["delta"].get("content") or "") if "delta" in c else c["text"]
                for call in (c.get("delta") or {}).get("tool_calls") or []:
                    out["text"] += json.dumps(call_text(call))
                if c.get("logprobs"):
                    out["logprobs"].append(c["logprobs"])
                out["finish"] = c["finish_reason"] or out["finish"]
    return {"choices": [choices[i] for i in sorted(choices)], "usage": usage}


def call_text(call):
    """A tool call without its (random) id."""
    return [call["function"]["name"], json.loads(call["function"]["arguments"])]


def summary(response):
    """Texts, finish reasons, completion tokens and logprob values of a non-streamed response."""
    out = []
    for c in response["choices"]:
        if "message" in c:
            text = c["message"]["content"] or json.dumps([call_text(t) for t in c["message"].get("tool_calls") or []])
        else:
            text = c["text"]
        out.append({"text": text, "finish": c["finish_reason"], "logprobs": flat_logprobs(c.get("logprobs"))})
    return out, response["usage"]["completion_tokens"]


def flat_logprobs(lp):
    if lp is None:
        return []
    if "content" in lp:
        return [(t["token"], t["logprob"], [(a["token"], a["logprob"]) for a in t["top_logprobs"]])
                for t in lp["content"]]
    return [(t, v, sorted((top or {}).items())) for t, v, top in zip(lp["tokens"], lp["token_logprobs"],
                                                                       lp["top_logprobs"])]


def stream_summary(s):
    out = []
    for c in s["choices"]:
        lps = []
        for part in c["logprobs"]:
            lps += flat_logprobs(part)
        out.append({"text": c["text"], "finish": c["finish"], "logprobs": lps})
    return out, s["usage"]["completion_tokens"]


def run(server):
    answers = []
    for path, body, is_stream in REQUESTS:
        body = dict(body, model=MODEL_NAME)
        answers.append(stream_summary(streamed(server, path, body)) if is_stream
                       else summary(post(server, path, body)))
    return answers


class ApiFeaturesDisaggregatedEqualColocated(unittest.TestCase):
    def test_every_feature_gives_the_colocated_answer(self):
        server = colocated()
        try:
            expected = run(server)
        finally:
            server.stop()
        server = disaggregated("--no-local-prefill")
        try:
            got = run(server)
        finally:
            server.stop()
        self.assertEqual(len(got), len(expected))
        for (path, body, _), (g, g_tokens), (e, e_tokens) in zip(REQUESTS, got, expected):
            with self.subTest(body=body):
                self.assertEqual(g_tokens, e_tokens)
                self.assertEqual(len(g), len(e))
                for gc, ec in zip(g, e):
                    self.assertEqual(gc["text"], ec["text"])
                    self.assertEqual(gc["finish"], ec["finish"])
                    self.assertEqual(len(gc["logprobs"]), len(ec["logprobs"]))
                    for (gt, gv, gtop), (et, ev, etop) in zip(gc["logprobs"], ec["logprobs"]):
                        self.assertEqual(gt, et)
                        if ev is None:  # the prompt's first token under echo
                            self.assertIsNone(gv)
                        else:
                            self.assertAlmostEqual(gv, ev, places=4)
                        self.assertEqual([t for t, _ in gtop], [t for t, _ in etop])
        # The features did something: logprobs came back, n and several prompts fanned out.
        self.assertTrue(expected[3][0][0]["logprobs"])
        self.assertEqual(len(expected[5][0]), 3)
        self.assertEqual(len(expected[6][0]), 2)
        self.assertGreaterEqual(expected[8][1], 25)  # min_tokens
        self.assertEqual(expected[9][0][0]["finish"], "stop")  # stop_token_ids
        city = json.loads(expected[10][0][0]["text"])  # structured output, sampled
        self.assertEqual(sorted(city), ["name", "population", "sights"])
        self.assertEqual(len(expected[11][0][0]["logprobs"]), 4 + 3)  # echo: prompt + output tokens
        self.assertEqual(expected[12][0][0]["finish"], "tool_calls")
        self.assertEqual({name for name, _ in json.loads(expected[12][0][0]["text"])}, {"get_weather"})


if __name__ == "__main__":
    unittest.main()
