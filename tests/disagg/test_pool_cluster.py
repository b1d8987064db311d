"""The KV pool across processes as on several hosts: a real etcd, a standalone pool master
(`tandem pool-master`, its state journaled in etcd) with a standby beside it, a storage node
without an engine (`tandem store`), workers and a conductor started on their own.

The first prefill worker computes a long prompt; its blocks land on the storage node. Then the
master is killed (kill -9) and the prefill worker too. The standby takes over with the journal,
a new prefill worker joins with an empty cache, and the same prompt is read from the pool
instead of computed: same answer, pool hits counted."""
import json
import shutil
import signal
import unittest
import urllib.request

from disagg_util import MODEL_NAME, ProcessCluster, metric, scrape, wait_for
from server_util import BIN, MODEL, free_port

PROMPT = " ".join(f"Fact {k}: the river number {k} is {k * 3 + 1} km long." for k in range(30))


def complete(port):
    body = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 16, "temperature": 0,
            "ignore_eos": True}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        reply = json.loads(r.read())
    return reply["choices"][0]["text"], reply["usage"]["prompt_tokens_details"]["cached_tokens"]


@unittest.skipUnless(shutil.which("etcd"), "needs etcd")
class PoolAcrossProcesses(ProcessCluster, unittest.TestCase):
    def setUp(self):
        self.cluster_setup("tandem-pool-cluster-")

    def tearDown(self):
        self.cluster_teardown()

    def test_a_standby_master_restores_the_pool_and_a_new_worker_reads_it(self):
        http_port = free_port()
        etcd = self.start_etcd(free_port)
        master = self.start("master-1", BIN, "pool-master", "--metadata", etcd)
        wait_for(lambda: "pool master on" in self.log("master-1"), 60, "the first master")
        self.start("master-2", BIN, "pool-master", "--metadata", etcd)
        wait_for(lambda: "standing by" in self.log("master-2"), 30, "the standby")
        self.start("store", BIN, "store", "--metadata", etcd, "--name", "store-a", "--dram-mb", "64")
        # Workers contribute no DRAM: every block lands on the storage node.
        common = ["--metadata", etcd, "--model", MODEL, "--threads", "1", "--kv-cache-tokens", "4096",
                  "--pool-dram-mb", "0"]
        prefill = self.start("prefill-1", BIN, "worker", "--role", "prefill", "--name", "prefill-1",
                             *common)
        self.start("decode", BIN, "worker", "--role", "decode", "--name", "decode-1", *common)
        self.start("conductor", BIN, "conductor", "--metadata", etcd, "--model", MODEL,
                   "--port", str(http_port), "--served-model-name", MODEL_NAME,
                   "--max-model-len", "2048", "--no-local-prefill")

        def joined(prefill_name):
            try:
                m = scrape(http_port)
            except OSError:
                return False
            return (m.get('tandem_workers{role="decode",state="healthy"}') == 1
                    and m.get('tandem_workers{role="prefill",state="healthy"}') == 1
                    and any(prefill_name in k for k in m))

        try:
            wait_for(lambda: joined("prefill-1"), 120, "the workers to join the conductor")
            first, cached = complete(http_port)
            self.assertEqual(cached, 0)
            stored = lambda: metric(scrape(http_port), "tandem_kv_pool_put_blocks_total",
                                    role="prefill", outcome="stored")
            wait_for(lambda: stored() > 0, 30, "the prompt's blocks in the pool")

            # The master dies; the standby takes over once its etcd lease lapses.
            master.send_signal(signal.SIGKILL)
            master.wait(timeout=10)
            wait_for(lambda: "pool master on" in self.log("master-2"), 30, "the standby to take over")
            self.assertRegex(self.log("master-2"), r"[1-9]\d* of [1-9]\d* objects restored")

            # The prefill worker dies too; a new one starts with an empty cache.
            prefill.send_signal(signal.SIGKILL)
            prefill.wait(timeout=10)
            self.start("prefill-2", BIN, "worker", "--role", "prefill", "--name", "prefill-2", *common)
            # One healthy prefill worker, and it is the new one.
            wait_for(lambda: joined("prefill-2"), 120, "the new prefill worker to replace the old one")
            second, cached = complete(http_port)
            self.assertEqual(second, first)
            self.assertGreater(cached, 0)
            m = scrape(http_port)
            self.assertGreater(metric(m, "tandem_kv_pool_hit_blocks_total", role="prefill"), 0)
            self.assertEqual(metric(m, "tandem_kv_pool_checksum_failures_total", role="prefill"), 0)
            # The conductor shows the standalone master's figures: the one now serving restored
            # the journal, and the storage node's segment holds the blocks.
            self.assertEqual(metric(m, "tandem_kv_pool_master_up"), 1)
            self.assertGreater(metric(m, "tandem_kv_pool_restored_objects_total"), 0)
            store_used = [v for k, v in m.items()
                          if k.startswith("tandem_kv_pool_segment_used_bytes") and "store-a" in k]
            self.assertEqual(len(store_used), 1, m)
            self.assertGreater(store_used[0], 0)
        except AssertionError:
            raise AssertionError(self.logs())


if __name__ == "__main__":
    unittest.main()
