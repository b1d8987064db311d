"""The conductor killed (kill -9) and restarted, with workers started on their own (`tandem
worker`) and a real etcd between them: the workers stay up; the stream in flight ends for its
client (a broken connection, not a hang) and its sequence is freed on the worker; the new
conductor finds the workers in etcd and serves new requests with the same answers."""
import concurrent.futures
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import unittest
import urllib.request

from disagg_util import MODEL_NAME, TEST_CLUSTER_TOKEN, metric, stream, wait_for
from server_util import BIN, MODEL, free_port


def samples(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def complete(port, prompt, max_tokens):
    body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())["choices"][0]["text"]


class Base:
    """What stream() needs of a server: its base URL."""

    def __init__(self, port):
        self.base = f"http://127.0.0.1:{port}"


@unittest.skipUnless(shutil.which("etcd"), "needs etcd")
class ConductorRestart(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="tandem-restart-")
        self.procs = []
        self.env = {**os.environ, "TANDEM_CLUSTER_TOKEN": TEST_CLUSTER_TOKEN}

    def tearDown(self):
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

    def test_workers_survive_and_rejoin_a_restarted_conductor(self):
        etcd_port, peer_port, http_port = free_port(), free_port(), free_port()
        self.start("etcd", "etcd", "--data-dir", os.path.join(self.tmp, "etcd"),
                   "--listen-client-urls", f"http://127.0.0.1:{etcd_port}",
                   "--advertise-client-urls", f"http://127.0.0.1:{etcd_port}",
                   "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
                   "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
                   "--initial-cluster", f"default=http://127.0.0.1:{peer_port}")
        etcd = f"etcd://127.0.0.1:{etcd_port}"
        common = ["--metadata", etcd, "--model", MODEL, "--threads", "1", "--kv-cache-tokens", "4096"]
        workers = [self.start("prefill", BIN, "worker", "--role", "prefill", "--name", "prefill-r", *common),
                   self.start("decode", BIN, "worker", "--role", "decode", "--name", "decode-r", *common)]
        conductor_args = [BIN, "conductor", "--metadata", etcd, "--model", MODEL, "--port", str(http_port),
                          "--served-model-name", MODEL_NAME, "--max-model-len", "1024"]

        def joined():
            try:
                m = samples(http_port)
            except OSError:
                return False
            return (m.get('tandem_workers{role="decode",state="healthy"}') == 1
                    and m.get('tandem_workers{role="prefill",state="healthy"}') == 1)

        conductor = self.start("conductor", *conductor_args)
        try:
            wait_for(joined, 90, "both workers to join the conductor")
            before = complete(http_port, "The capital of France is", 12)
            # A long stream; the conductor dies under it.
            body = {"model": MODEL_NAME, "prompt": "Once upon a time", "max_tokens": 900,
                    "temperature": 0, "ignore_eos": True}
            running = 'tandem_worker_running_sequences{worker="decode-r",role="decode"}'
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                future = pool.submit(stream, Base(http_port), "/v1/completions", body, 60)
                wait_for(lambda: samples(http_port).get(running) == 1, 30,
                         "the stream to run on the decode worker")
                conductor.send_signal(signal.SIGKILL)
                conductor.wait(timeout=10)
                began = time.time()
                try:
                    text, finish, usage, error = future.result(timeout=30)
                    self.assertNotEqual(finish, "length")  # it cannot have completed
                except Exception:
                    pass  # the connection broke: the clean end a client can see
                self.assertLess(time.time() - began, 30)
            for w in workers:
                self.assertIsNone(w.poll(), "a worker died with the conductor:\n" + self.logs())
            # A new conductor finds the workers in etcd and serves; the orphaned sequence is
            # gone from the decode worker (its stream's writes failed).
            self.start("conductor", *conductor_args)
            wait_for(joined, 90, "the workers to join the new conductor")
            wait_for(lambda: samples(http_port)[running] == 0, 30, "the orphaned sequence to end")
            self.assertEqual(complete(http_port, "The capital of France is", 12), before)
            self.assertEqual(metric(samples(http_port), "tandem_kv_blocks_reserved"), 0)
        except AssertionError:
            raise AssertionError(self.logs())


if __name__ == "__main__":
    unittest.main()
