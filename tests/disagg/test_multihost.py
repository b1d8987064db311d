"""Disaggregated serving across two hosts, shown with two network namespaces on one machine:
host A runs etcd, the conductor and a prefill worker; host B a decode worker. They find each
other through etcd only, and KV moves over TCP between the hosts' addresses. Needs root (to
create namespaces) and etcd; skipped otherwise."""
import json
import os
import shutil
import subprocess
import tempfile
import time
import unittest

from disagg_util import MODEL_NAME, colocated, wait_for
from server_util import BIN, MODEL

NS_A = f"tandem-a-{os.getpid()}"
NS_B = f"tandem-b-{os.getpid()}"
ADDR_A, ADDR_B = "10.231.0.1", "10.231.0.2"  # inside the namespaces only
ETCD_PORT, PEER_PORT, HTTP_PORT = 23790, 23800, 8000


def sh(*args):
    subprocess.run(args, check=True, capture_output=True)


def in_ns(ns, *args, **kw):
    return subprocess.Popen(["ip", "netns", "exec", ns, *args], **kw)


def curl_json(ns, path, body=None, timeout=60):
    cmd = ["ip", "netns", "exec", ns, "curl", "-s", "-m", str(timeout), f"http://{ADDR_A}:{HTTP_PORT}{path}"]
    if body is not None:
        cmd += ["-H", "Content-Type: application/json", "-d", json.dumps(body)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 10)
    return out.stdout


def metrics(ns):
    samples = {}
    for line in curl_json(ns, "/metrics").splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


@unittest.skipUnless(os.geteuid() == 0 and shutil.which("ip") and shutil.which("etcd")
                     and shutil.which("curl"), "needs root, iproute2, etcd and curl")
class TwoHosts(unittest.TestCase):
    def setUp(self):
        self.procs = []
        self.logs = []
        self.tmp = tempfile.mkdtemp(prefix="tandem-multihost-")
        sh("ip", "netns", "add", NS_A)
        sh("ip", "netns", "add", NS_B)
        sh("ip", "link", "add", "veth-ta", "netns", NS_A, "type", "veth", "peer", "name", "veth-tb",
           "netns", NS_B)
        for ns, dev, addr in ((NS_A, "veth-ta", ADDR_A), (NS_B, "veth-tb", ADDR_B)):
            sh("ip", "-n", ns, "addr", "add", addr + "/30", "dev", dev)
            sh("ip", "-n", ns, "link", "set", dev, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")

    def tearDown(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        for f in self.logs:
            f.close()
        for ns in (NS_A, NS_B):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def start(self, ns, name, *args):
        log = open(os.path.join(self.tmp, name + ".log"), "w")
        self.logs.append(log)
        p = in_ns(ns, *args, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(p)
        return p

    def log(self, name):
        with open(os.path.join(self.tmp, name + ".log")) as f:
            return f.read()[-4000:]

    def test_conductor_and_workers_on_two_hosts_through_etcd(self):
        self.start(NS_A, "etcd", "etcd", "--data-dir", os.path.join(self.tmp, "etcd"),
                   "--listen-client-urls", f"http://{ADDR_A}:{ETCD_PORT}",
                   "--advertise-client-urls", f"http://{ADDR_A}:{ETCD_PORT}",
                   "--listen-peer-urls", f"http://{ADDR_A}:{PEER_PORT}",
                   "--initial-advertise-peer-urls", f"http://{ADDR_A}:{PEER_PORT}",
                   "--initial-cluster", f"default=http://{ADDR_A}:{PEER_PORT}")
        etcd = f"etcd://{ADDR_A}:{ETCD_PORT}"
        # One cluster token file for the three processes (as if copied to each host): the
        # conductor's calls and the KV connections between the hosts are authenticated.
        token_file = os.path.join(self.tmp, "cluster-token")
        with open(os.open(token_file, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
            f.write("multihost-test-token-0123456789\n")
        common = ["--metadata", etcd, "--model", MODEL, "--threads", "1", "--kv-cache-tokens", "4096",
                  "--transfer-protocols", "tcp", "--cluster-token-file", token_file]
        # etcd starts concurrently; the workers and the conductor retry until it answers.
        self.start(NS_A, "prefill", BIN, "worker", "--role", "prefill", "--name", "prefill-a",
                   "--host", ADDR_A, *common)
        decode = self.start(NS_B, "decode", BIN, "worker", "--role", "decode", "--name", "decode-b",
                            "--host", ADDR_B, *common)
        # --no-local-prefill: every prompt crosses the hosts (with conditional disaggregation a
        # short prompt goes local once the first push's measured tail makes remote look slower).
        self.start(NS_A, "conductor", BIN, "conductor", "--metadata", etcd, "--model", MODEL,
                   "--host", ADDR_A, "--port", str(HTTP_PORT), "--served-model-name", MODEL_NAME,
                   "--max-model-len", "1024", "--no-local-prefill", "--cluster-token-file", token_file)
        try:
            wait_for(lambda: metrics(NS_A).get('tandem_workers{role="decode",state="healthy"}') == 1
                     and metrics(NS_A).get('tandem_workers{role="prefill",state="healthy"}') == 1,
                     90, "both workers to join")
        except AssertionError:
            raise AssertionError("\n".join(self.log(n) for n in ("etcd", "prefill", "decode", "conductor")))
        # The decode host is not reachable from the root namespace: the hosts are separate.
        prompts = ["The capital of France is", "Write a haiku about rivers.",
                   " ".join(f"Fact {k}: the number {k * 3} is odd or even." for k in range(40))]
        got = []
        for p in prompts:
            r = json.loads(curl_json(NS_A, "/v1/completions",
                                     {"model": MODEL_NAME, "prompt": p, "max_tokens": 12,
                                      "temperature": 0}))
            got.append(r["choices"][0]["text"])
        m = metrics(NS_A)
        self.assertEqual(m["tandem_disaggregated_requests_total"], 3)
        self.assertEqual(m["tandem_colocated_fallback_requests_total"], 0)
        self.assertGreater(m["tandem_kv_transfer_bytes_total"], 0)
        self.assertEqual(m["tandem_cluster_auth_refusals_total"], 0)
        # Same answers as one colocated process.
        ref = colocated()
        try:
            from disagg_util import post
            expect = [post(ref, "/v1/completions", {"model": MODEL_NAME, "prompt": p, "max_tokens": 12,
                                                    "temperature": 0})["choices"][0]["text"]
                      for p in prompts]
        finally:
            ref.stop()
        self.assertEqual(got, expect)
        # kill -9 the decode host's worker: its etcd lease lapses and the conductor stops placing
        # requests there, answering 503 with the reason.
        subprocess.run(["pkill", "-9", "-f", "name decode-b"])
        decode.wait(timeout=10)
        wait_for(lambda: metrics(NS_A).get('tandem_workers{role="decode",state="healthy"}') == 0,
                 30, "the dead decode worker to drop out")
        body = curl_json(NS_A, "/v1/completions", {"model": MODEL_NAME, "prompt": "hi", "max_tokens": 2})
        self.assertIn("no decode worker", body)


if __name__ == "__main__":
    unittest.main()
