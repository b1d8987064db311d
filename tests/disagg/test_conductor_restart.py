"""The conductor killed (kill -9) and restarted, with workers started on their own (`tandem
worker`) and a real etcd between them: the workers stay up; the stream in flight ends for its
client (a broken connection, not a hang) and its sequence is freed on the worker; the new
conductor finds the workers in etcd and serves new requests with the same answers."""
import concurrent.futures
import json
import shutil
import signal
import time
import unittest
import urllib.request

from disagg_util import MODEL_NAME, ProcessCluster, metric, scrape, stream, wait_for
from server_util import BIN, MODEL, free_port


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
class ConductorRestart(ProcessCluster, unittest.TestCase):
    def setUp(self):
        self.cluster_setup("tandem-restart-")

    def tearDown(self):
        self.cluster_teardown()

    def test_workers_survive_and_rejoin_a_restarted_conductor(self):
        http_port = free_port()
        etcd = self.start_etcd(free_port)
        common = ["--metadata", etcd, "--model", MODEL, "--threads", "1", "--kv-cache-tokens", "4096"]
        workers = [self.start("prefill", BIN, "worker", "--role", "prefill", "--name", "prefill-r", *common),
                   self.start("decode", BIN, "worker", "--role", "decode", "--name", "decode-r", *common)]
        conductor_args = [BIN, "conductor", "--metadata", etcd, "--model", MODEL, "--port", str(http_port),
                          "--served-model-name", MODEL_NAME, "--max-model-len", "1024"]

        def joined():
            try:
                m = scrape(http_port)
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
                wait_for(lambda: scrape(http_port).get(running) == 1, 30,
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
            wait_for(lambda: scrape(http_port)[running] == 0, 30, "the orphaned sequence to end")
            self.assertEqual(complete(http_port, "The capital of France is", 12), before)
            self.assertEqual(metric(scrape(http_port), "tandem_kv_blocks_reserved"), 0)
        except AssertionError:
            raise AssertionError(self.logs())


if __name__ == "__main__":
    unittest.main()
