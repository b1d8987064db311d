#!/usr/bin/env python3
"""Renders the chat templates of tests/golden/jinja/templates with jinja2, the reference
implementation, over a set of conversations, and writes tests/golden/jinja/jinja_golden.json
for src/jinja/template_test.cc. The environment is the one Hugging Face's apply_chat_template
builds: jinja2's ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks, the
loopcontrols extension, raise_exception and strftime_now as globals, and tojson as json.dumps
without key sorting or ASCII escaping.

    python3 tools/golden/make_jinja_golden.py --out tests/golden/jinja
"""
import argparse
import json
import os
import sys

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def environment():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. Zürich"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"]}}}
TIME_TOOL = {"type": "function", "function": {
    "name": "get_time", "description": "Local time", "parameters": {
        "type": "object", "properties": {"tz": {"type": "string"}}}}}

CONVERSATIONS = {
    "single": [{"role": "user", "content": "Hello!"}],
    "system": [{"role": "system", "content": "Be brief. "},
               {"role": "user", "content": "  What is 2+2?\n"}],
    "multi_turn": [{"role": "user", "content": "Hi"},
                   {"role": "assistant", "content": "Hello! How can I help?"},
                   {"role": "user", "content": "Tell me a joke about \"quotes\" & <tags>."}],
    "unicode": [{"role": "system", "content": "Réponds en français 🙂"},
                {"role": "user", "content": "日本語で\n\tタブと改行"}],
    "empty_content": [{"role": "user", "content": ""}],
    "tool_calls": [
        {"role": "system", "content": "You help with weather."},
        {"role": "user", "content": "Weather in Zürich?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_0123456789", "type": "function",
             "function": {"name": "get_weather", "arguments": {"city": "Zürich", "unit": "celsius"}}}]},
        {"role": "tool", "tool_call_id": "call_0123456789", "content": "{\"temp\": 21.5}"},
        {"role": "assistant", "content": "It is 21.5 °C in Zürich."},
        {"role": "user", "content": "Thanks"}],
    "parallel_calls": [
        {"role": "user", "content": "Weather and time in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_aaaaaaaaaa", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}},
            {"id": "call_bbbbbbbbbb", "type": "function",
             "function": {"name": "get_time", "arguments": {"tz": "Europe/Oslo"}}}]},
        {"role": "tool", "tool_call_id": "call_aaaaaaaaaa", "content": "cloudy"},
        {"role": "tool", "tool_call_id": "call_bbbbbbbbbb", "content": "14:02"}],
    "not_alternating": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
    "bad_role": [{"role": "narrator", "content": "Once upon a time"}],
}

# (template, conversation, with tools) to render, each with and without the generation prompt.
CASES = [(t, c, False) for t in ("smollm2", "chatml_tools", "llama3_style", "gemma_style",
                                 "mistral_style")
         for c in ("single", "system", "multi_turn", "unicode", "empty_content",
                   "not_alternating")]
CASES += [("smollm2", "bad_role", False), ("chatml_tools", "bad_role", False),
          ("gemma_style", "bad_role", False)]
CASES += [(t, c, True) for t in ("chatml_tools", "llama3_style", "mistral_style")
          for c in ("single", "system", "tool_calls", "parallel_calls")]

FEATURES_CONTEXT = {
    "names": ["carol", "alice", "bob", "Dave"],
    "numbers": [1, 2, 3, 4, 5, 6],
    "scores": {"zed": 3, "alice": 10, "bob": 7},
    "people": [{"name": "ann", "age": 41, "admin": True},
               {"name": "ben", "age": 25, "admin": False},
               {"name": "cy", "age": 33, "admin": True}],
}


def render(env, source, context):
    try:
        return {"expected": env.from_string(source).render(**context)}
    except jinja2.exceptions.TemplateError as e:
        return {"error": str(e)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "tests/golden/jinja"))
    args = ap.parse_args()
    env = environment()
    templates = {}
    for name in sorted(os.listdir(os.path.join(args.out, "templates"))):
        with open(os.path.join(args.out, "templates", name), encoding="utf-8") as f:
            templates[name.removesuffix(".jinja")] = f.read()
    cases = []
    for template, conversation, with_tools in CASES:
        for gen in (False, True):
            context = {"messages": CONVERSATIONS[conversation], "add_generation_prompt": gen,
                       "bos_token": "<s>", "eos_token": "</s>"}
            # apply_chat_template passes tools=None when it is given none.
            context["tools"] = [WEATHER_TOOL, TIME_TOOL] if with_tools else None
            case = {"template": template, "context": context}
            case.update(render(env, templates[template], context))
            cases.append(case)
    case = {"template": "features", "context": FEATURES_CONTEXT}
    case.update(render(env, templates["features"], FEATURES_CONTEXT))
    cases.append(case)
    out = {"generator": f"jinja2 {jinja2.__version__}, Python {sys.version.split()[0]}",
           "templates": templates, "cases": cases}
    with open(os.path.join(args.out, "jinja_golden.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)
        f.write("\n")
    errors = sum("error" in c for c in cases)
    print(f"{len(cases)} cases ({errors} errors) from {len(templates)} templates")


if __name__ == "__main__":
    main()
