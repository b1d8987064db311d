"""Helpers of the disaggregated-serving end-to-end tests: servers in either mode, prompts,
requests, and the worker processes of a `tandem serve`."""
import json
import os
import subprocess
import sys
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "server"))
from server_util import GEMMA, MODEL_NAME, Server, sse_events, wait_for  # noqa: E402,F401

# Prompts and completions stay within this context, so that "near the limit" is affordable on
# two cores (a prompt of ~900 tokens plus its completion).
MAX_MODEL_LEN = 1024


def disaggregated(*extra, threads=2):
    return Server("--mode", "disaggregated", *extra, threads=threads, max_model_len=MAX_MODEL_LEN,
                  kv_cache_tokens=8192)


def colocated(*extra, threads=2):
    return Server("--mode", "colocated", *extra, threads=threads, max_model_len=MAX_MODEL_LEN,
                  kv_cache_tokens=8192)


def post(server, path, body, timeout=300):
    req = urllib.request.Request(server.base + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def stream(server, path, body, timeout=300):
    """Streams a request; returns (text, finish_reason, usage, error_payload_or_None)."""
    body = dict(body, stream=True, stream_options={"include_usage": True})
    req = urllib.request.Request(server.base + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    text, finish, usage, error = "", None, None, None
    with urllib.request.urlopen(req, timeout=timeout) as r:
        for event in sse_events(line.rstrip(b"\n") for line in r):
            if event == "[DONE]":
                break
            if "error" in event:
                error = event["error"]
                continue
            if event.get("usage"):
                usage = event["usage"]
            for choice in event.get("choices", []):
                if "delta" in choice:
                    text += choice["delta"].get("content") or ""
                else:
                    text += choice.get("text") or ""
                finish = choice.get("finish_reason") or finish
    return text, finish, usage, error


def fifty_prompts():
    """50 requests: chat and plain, short and near MAX_MODEL_LEN, deterministic."""
    topics = ["rivers", "volcanoes", "the moon", "bread", "chess", "glaciers", "trains", "owls",
              "copper", "tea"]
    out = []
    for i in range(50):
        topic = topics[i % len(topics)]
        if i % 10 == 9:  # near the limit: ~750-900 prompt tokens
            body = " ".join(f"Sentence {k} is about {topic} and the number {k * 7 + i}."
                            for k in range(60 + i % 3 * 3))
            max_tokens = 24
        elif i % 3 == 0:
            body = f"Tell me one fact about {topic}."
            max_tokens = 16 + i % 5
        else:
            body = (f"Write two sentences about {topic}. " * (1 + i % 4)) + f"Request {i}."
            max_tokens = 12 + i % 7
        if i % 2 == 0:
            out.append(("/v1/chat/completions",
                        {"model": MODEL_NAME, "messages": [{"role": "user", "content": body}],
                         "max_tokens": max_tokens, "temperature": 0}))
        else:
            out.append(("/v1/completions",
                        {"model": MODEL_NAME, "prompt": body, "max_tokens": max_tokens,
                         "temperature": 0}))
    return out


def text_of(response):
    choice = response["choices"][0]
    return choice["message"]["content"] if "message" in choice else choice["text"]


def worker_pids(server, role):
    """Pids of the `tandem worker --role ROLE` children of a server."""
    out = subprocess.run(["pgrep", "-P", str(server.proc.pid), "-f", f"worker --role {role}"],
                         capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def metric(m, name, **labels):
    if labels:
        key = name + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"
    else:
        key = name
    return m.get(key, 0.0)
