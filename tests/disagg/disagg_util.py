"""Helpers of the disaggregated-serving end-to-end tests: servers in either mode, prompts,
requests, and the worker processes of a `tandem serve`."""
import json
import os
import re
import subprocess
import sys
import urllib.request

import cluster_auth

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "server"))
from server_util import GEMMA, MODEL_NAME, Server, sse_events, wait_for  # noqa: E402,F401

# Prompts and completions stay within this context, so that "near the limit" is affordable on
# two cores (a prompt of ~900 tokens plus its completion).
MAX_MODEL_LEN = 1024


# A cluster token the tests give their servers (TANDEM_CLUSTER_TOKEN) when they must talk to
# internal endpoints themselves.
TEST_CLUSTER_TOKEN = "tandem-test-cluster-token-0123456789"


def worker_endpoints(server):
    """{name: (host, port)} of the server's workers, from the lines they log at start."""
    found = re.findall(r"worker (\S+) \((?:prefill|decode|mixed)\) on ([\d.]+):(\d+);",
                       server.log_text())
    return {name: (host, int(port)) for name, host, port in found}


def call_internal(host, port, path, body, secret=TEST_CLUSTER_TOKEN, timeout=10):
    """POSTs `body` to a cluster-internal endpoint as a member of the cluster: signed with
    `secret`, and the answer's proof checked. Returns the body; raises HTTPError on >= 400."""
    data = json.dumps(body).encode()
    header, nonce = cluster_auth.sign_call(secret, "POST", path, data)
    req = urllib.request.Request(f"http://{host}:{port}{path}", data=data,
                                 headers={"Content-Type": "application/json",
                                          "X-Tandem-Auth": header})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        if r.headers.get("X-Tandem-Auth-Reply") != cluster_auth.reply_proof(secret, nonce):
            raise PermissionError(f"{host}:{port} did not prove the cluster token")
        return r.read()


def disaggregated(*extra, threads=2, env=None, model=None):
    return Server("--mode", "disaggregated", *extra, threads=threads, max_model_len=MAX_MODEL_LEN,
                  kv_cache_tokens=8192, env=env, model=model)


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


def scrape(port):
    """The /metrics samples of a server on 127.0.0.1:port: {"name{labels}": value}."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


class ProcessCluster:
    """Processes started one by one (a cluster assembled by hand, as on several hosts), each
    logging to <tmp>/<name>.log, all given the test cluster token; every one is killed at the
    end. Mix into a unittest.TestCase and call cluster_setup / cluster_teardown."""

    def cluster_setup(self, prefix):
        import tempfile
        self.tmp = tempfile.mkdtemp(prefix=prefix)
        self.procs = []
        self.env = {**os.environ, "TANDEM_CLUSTER_TOKEN": TEST_CLUSTER_TOKEN}

    def cluster_teardown(self):
        import shutil
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def start(self, name, *args):
        with open(os.path.join(self.tmp, name + ".log"), "a") as log:
            p = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=self.env)
        self.procs.append(p)
        return p

    def log(self, name):
        with open(os.path.join(self.tmp, name + ".log")) as f:
            return f.read()

    def logs(self):
        out = []
        for name in sorted(os.listdir(self.tmp)):
            if name.endswith(".log"):
                with open(os.path.join(self.tmp, name)) as f:
                    out.append(f"--- {name}\n" + f.read()[-3000:])
        return "\n".join(out)

    def start_etcd(self, free_port):
        """A real etcd on free loopback ports, answering; returns its etcd:// URI. Its process
        is self.etcd; restart_etcd() starts it again on the same ports and data."""
        self.etcd_ports = (free_port(), free_port())
        self.etcd = self._run_etcd()
        return f"etcd://127.0.0.1:{self.etcd_ports[0]}"

    def restart_etcd(self):
        self.etcd = self._run_etcd()

    def _run_etcd(self):
        import socket
        client, peer = self.etcd_ports
        proc = self.start("etcd", "etcd", "--data-dir", os.path.join(self.tmp, "etcd"),
                          "--listen-client-urls", f"http://127.0.0.1:{client}",
                          "--advertise-client-urls", f"http://127.0.0.1:{client}",
                          "--listen-peer-urls", f"http://127.0.0.1:{peer}",
                          "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
                          "--initial-cluster", f"default=http://127.0.0.1:{peer}")

        def answers():
            try:
                socket.create_connection(("127.0.0.1", client), timeout=1).close()
                return True
            except OSError:
                return False
        wait_for(answers, 30, "etcd")
        return proc

    def workers_healthy(self, http_port, prefill=1, decode=1):
        """Whether the conductor on http_port counts that many healthy workers of each role."""
        try:
            m = scrape(http_port)
        except OSError:
            return False
        return (m.get('tandem_workers{role="decode",state="healthy"}') == decode
                and m.get('tandem_workers{role="prefill",state="healthy"}') == prefill)
