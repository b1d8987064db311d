"""Chaos of the cluster's shared services under load: the metadata store (etcd) and the KV
pool (its master and a storage node).

The metadata store: a cluster assembled by hand (`tandem worker` x2 and
`tandem conductor`, a real etcd between them) serves streams while, each round, etcd is
killed (kill -9, restarted on the same data directory and ports 1.5 s later), stopped briefly
(SIGSTOP for 2 s, then SIGCONT) or stopped past the workers' lease TTL (8 s against 5 s: their
keys expire when etcd resumes, and they must publish themselves again). Requests run from
before the fault, and more are sent while etcd is away. Every request must end within its
deadline, completed with the text of the fault-free run (greedy) or with a clear error; after
each round the cluster serves again within a stated time, every process is still up, both
workers are healthy and no KV reservation is left. TANDEM_CHAOS_ROUNDS sets the rounds (the
default run does 3, one of each fault; the chaos_metadata_long target runs 30). A summary line
reports the figures.

The KV pool: a standalone pool master with a standby, a storage node holding every block
(workers contribute no DRAM), streams over prompts that share a long prefix read from the pool.
Each round kill -9s the active master (the standby takes over from the journal in etcd; a new
standby is started) or the storage node (restarted 1 s later, empty). Every request completes
with the fault-free text or a clear error, and the cluster serves again."""
import concurrent.futures
import os
import shutil
import signal
import sys
import time
import unittest

from disagg_util import MODEL_NAME, ProcessCluster, metric, scrape, stream, wait_for
from server_util import BIN, MODEL, free_port

ROUNDS = int(os.environ.get("TANDEM_CHAOS_ROUNDS", "3"))
FAULTS = ("kill", "stop", "stop_past_ttl")


class Base:
    def __init__(self, port):
        self.base = f"http://127.0.0.1:{port}"


def bodies():
    return [{"model": MODEL_NAME, "prompt": f"Story {i}: a lighthouse keeper finds a letter.",
             "max_tokens": 24 + 8 * i, "temperature": 0, "ignore_eos": True} for i in range(4)]


class ChaosRounds(ProcessCluster):
    """What both chaos tests check after each fault, and their tally."""

    def chaos_setup(self, prefix):
        self.cluster_setup(prefix)
        self.errors, self.messages, self.recovery = 0, {}, []

    def ends(self, futures, started):
        """Each request's end: its text, or None after an error (counted); none may hang."""
        texts = []
        for f in futures:
            try:
                text, _, _, error = f.result(timeout=150)
            except Exception as e:  # noqa: BLE001 - a broken connection is an end
                text, error = None, {"message": f"{type(e).__name__}: {e}"}
            self.assertLess(time.monotonic() - started, 150, "a request hung")
            if error is not None:
                text = None
                self.errors += 1
                msg = str(error.get("message", ""))[:80]
                self.messages[msg] = self.messages.get(msg, 0) + 1
            texts.append(text)
        return texts

    def recovered(self, http_port, serves, processes, back, round_no, prefill=1):
        """The cluster serves again (timed from `back`), every process is up, the workers are
        healthy and no KV reservation is left."""
        wait_for(serves, 60, f"the cluster to serve again after round {round_no}")
        self.recovery.append(time.monotonic() - back)
        wait_for(lambda: self.workers_healthy(http_port, prefill=prefill), 60,
                 f"the workers healthy after round {round_no}")
        for p in processes:
            self.assertIsNone(p.poll(), "a process died:\n" + self.logs())
        wait_for(lambda: metric(scrape(http_port), "tandem_kv_blocks_reserved") == 0, 30,
                 "no KV reservation left")

    def summary(self, what, completed, total, extra=""):
        r = sorted(self.recovery)
        print(f"\nchaos ({what}): {ROUNDS} rounds, {completed}/{total} completed with the "
              f"fault-free text, {self.errors} ended with an error {self.messages}{extra}; "
              f"serving again {r[len(r) // 2]:.1f} s (median), {r[-1]:.1f} s (max) after the "
              f"fault ended", file=sys.stderr)
        self.assertEqual(completed + self.errors, total)


@unittest.skipUnless(shutil.which("etcd"), "needs etcd")
class MetadataChaos(ChaosRounds, unittest.TestCase):
    def setUp(self):
        self.chaos_setup("tandem-chaos-etcd-")

    def tearDown(self):
        self.cluster_teardown()

    def test_etcd_killed_or_stopped_under_load_loses_nothing(self):
        http_port = free_port()
        uri = self.start_etcd(free_port)
        common = ["--metadata", uri, "--model", MODEL, "--threads", "1", "--kv-cache-tokens", "4096"]
        workers = [self.start("prefill", BIN, "worker", "--role", "prefill", "--name", "prefill-c",
                              *common),
                   self.start("decode", BIN, "worker", "--role", "decode", "--name", "decode-c",
                              *common)]
        conductor = self.start("conductor", BIN, "conductor", "--metadata", uri, "--model", MODEL,
                               "--port", str(http_port), "--served-model-name", MODEL_NAME,
                               "--max-model-len", "1024")
        server = Base(http_port)
        reqs = bodies()

        def serves():
            try:
                text, _, _, error = stream(server, "/v1/completions", reqs[0], 30)
                return error is None and text == baseline[0]
            except OSError:
                return False

        completed = 0
        try:
            wait_for(lambda: self.workers_healthy(http_port), 90,
                     "both workers to join the conductor")
            with concurrent.futures.ThreadPoolExecutor(len(reqs)) as pool:
                baseline = [r[0] for r in pool.map(
                    lambda b: stream(server, "/v1/completions", b, 120), reqs)]
            for round_no in range(ROUNDS):
                fault = FAULTS[round_no % len(FAULTS)]
                with concurrent.futures.ThreadPoolExecutor(2 * len(reqs)) as pool:
                    started = time.monotonic()
                    futures = [pool.submit(stream, server, "/v1/completions", b, 120)
                               for b in reqs]
                    time.sleep(0.5)
                    if fault == "kill":
                        self.etcd.send_signal(signal.SIGKILL)
                        self.etcd.wait(timeout=10)
                    else:
                        self.etcd.send_signal(signal.SIGSTOP)
                    # More requests while etcd is away.
                    futures += [pool.submit(stream, server, "/v1/completions", b, 120)
                                for b in reqs]
                    if fault == "kill":
                        time.sleep(1.5)
                        self.restart_etcd()
                    else:
                        time.sleep(2.0 if fault == "stop" else 8.0)
                        self.etcd.send_signal(signal.SIGCONT)
                    back = time.monotonic()
                    for k, text in enumerate(self.ends(futures, started)):
                        if text is not None:
                            self.assertEqual(text, baseline[k % len(reqs)], f"round {round_no}")
                            completed += 1
                self.recovered(http_port, serves, [conductor, *workers], back, round_no)
            if ROUNDS >= 3:  # a stop past the TTL ran: the workers' leases expired and came back
                for name in ("prefill", "decode"):
                    self.assertIn("expired; granting a new one", self.log(name))
            self.summary("etcd", completed, ROUNDS * 2 * len(reqs))
        except AssertionError:
            raise AssertionError(self.logs())


def pool_prompt(round_no, i):
    """Prompts of a round share a long prefix of their own (so it is new to the pool)."""
    facts = " ".join(f"Fact {k}: river {k} of set {round_no} is {k * 3 + round_no} km long."
                     for k in range(30))
    return {"model": MODEL_NAME, "prompt": f"{facts} Question {i}: which river is longest?",
            "max_tokens": 12 + 4 * i, "temperature": 0, "ignore_eos": True}


@unittest.skipUnless(shutil.which("etcd"), "needs etcd")
class PoolChaos(ChaosRounds, unittest.TestCase):
    def setUp(self):
        self.chaos_setup("tandem-chaos-pool-")

    def tearDown(self):
        self.cluster_teardown()

    def test_pool_master_or_storage_node_killed_under_load_loses_nothing(self):
        http_port = free_port()
        etcd = self.start_etcd(free_port)
        masters = [self.start("master-1", BIN, "pool-master", "--metadata", etcd)]
        wait_for(lambda: "pool master on" in self.log("master-1"), 60, "the first master")
        masters.append(self.start("master-2", BIN, "pool-master", "--metadata", etcd))
        wait_for(lambda: "standing by" in self.log("master-2"), 30, "the standby")
        store_args = [BIN, "store", "--metadata", etcd, "--name", "store-a", "--dram-mb", "64"]
        store = self.start("store", *store_args)
        common = ["--metadata", etcd, "--model", MODEL, "--threads", "1", "--kv-cache-tokens",
                  "4096", "--pool-dram-mb", "0"]
        # Two prefill workers placed by load alone: a prefix one computed, the other reads from
        # the pool.
        workers = [self.start(f"prefill-{k}", BIN, "worker", "--role", "prefill", "--name",
                              f"prefill-{k}", *common) for k in (1, 2)]
        workers.append(self.start("decode", BIN, "worker", "--role", "decode", "--name", "decode-p",
                                  *common))
        conductor = self.start("conductor", BIN, "conductor", "--metadata", etcd, "--model", MODEL,
                               "--port", str(http_port), "--served-model-name", MODEL_NAME,
                               "--max-model-len", "2048", "--no-local-prefill",
                               "--placement-policy", "load-balance")
        server = Base(http_port)

        def serves():
            try:
                return stream(server, "/v1/completions", pool_prompt(99, 0), 60)[3] is None
            except OSError:
                return False

        results = {}  # (round, i) -> text, for the requests that completed
        try:
            wait_for(lambda: self.workers_healthy(http_port, prefill=2), 120,
                     "the workers to join the conductor")
            for round_no in range(ROUNDS):
                # The round's prefix reaches the pool first.
                stream(server, "/v1/completions", pool_prompt(round_no, 0), 120)
                with concurrent.futures.ThreadPoolExecutor(4) as pool:
                    started = time.monotonic()
                    futures = [pool.submit(stream, server, "/v1/completions",
                                           pool_prompt(round_no, i), 120) for i in range(4)]
                    time.sleep(0.2)
                    if round_no % 2 == 0:
                        active = next(m for m in masters if m.poll() is None)
                        active.send_signal(signal.SIGKILL)
                        active.wait(timeout=10)
                        masters.remove(active)
                        masters.append(self.start(f"master-{round_no + 3}", BIN, "pool-master",
                                                  "--metadata", etcd))
                    else:
                        store.send_signal(signal.SIGKILL)
                        store.wait(timeout=10)
                        time.sleep(1.0)
                        store = self.start("store", *store_args)
                    back = time.monotonic()
                    for i, text in enumerate(self.ends(futures, started)):
                        if text is not None:
                            results[(round_no, i)] = text
                self.recovered(http_port, serves, [conductor, *workers], back, round_no,
                               prefill=2)
            # A master serves again (a standby took over).
            wait_for(lambda: metric(scrape(http_port), "tandem_kv_pool_master_up") == 1, 60,
                     "a pool master up")
            # What completed under faults is what the cluster answers without them.
            for (round_no, i), text in sorted(results.items()):
                again = stream(server, "/v1/completions", pool_prompt(round_no, i), 120)
                self.assertIsNone(again[3])
                self.assertEqual(text, again[0], f"round {round_no} request {i}")
            m = scrape(http_port)
            hits = metric(m, "tandem_kv_pool_hit_blocks_total", role="prefill")
            failures = metric(m, "tandem_kv_pool_fetch_failures_total", role="prefill")
            self.summary("pool", len(results), ROUNDS * 4,
                         f"; pool hits {hits:.0f} blocks, fetch failures {failures:.0f}")
        except AssertionError:
            raise AssertionError(self.logs())


if __name__ == "__main__":
    unittest.main()
