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
import socket
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


@unittest.skipUnless(shutil.which("etcd"), "needs etcd")
class MetadataChaos(ProcessCluster, unittest.TestCase):
    def setUp(self):
        self.cluster_setup("tandem-chaos-etcd-")
        self.client_port, self.peer_port = free_port(), free_port()

    def tearDown(self):
        self.cluster_teardown()

    def start_etcd_here(self):
        """etcd on this test's fixed ports and data directory (a restart finds its data)."""
        c, p = self.client_port, self.peer_port
        proc = self.start("etcd", "etcd", "--data-dir", os.path.join(self.tmp, "etcd"),
                          "--listen-client-urls", f"http://127.0.0.1:{c}",
                          "--advertise-client-urls", f"http://127.0.0.1:{c}",
                          "--listen-peer-urls", f"http://127.0.0.1:{p}",
                          "--initial-advertise-peer-urls", f"http://127.0.0.1:{p}",
                          "--initial-cluster", f"default=http://127.0.0.1:{p}")

        def answers():
            try:
                socket.create_connection(("127.0.0.1", c), timeout=1).close()
                return True
            except OSError:
                return False
        wait_for(answers, 30, "etcd")
        return proc

    def test_etcd_killed_or_stopped_under_load_loses_nothing(self):
        http_port = free_port()
        etcd = self.start_etcd_here()
        uri = f"etcd://127.0.0.1:{self.client_port}"
        common = ["--metadata", uri, "--model", MODEL, "--threads", "1", "--kv-cache-tokens", "4096"]
        workers = [self.start("prefill", BIN, "worker", "--role", "prefill", "--name", "prefill-c",
                              *common),
                   self.start("decode", BIN, "worker", "--role", "decode", "--name", "decode-c",
                              *common)]
        conductor = self.start("conductor", BIN, "conductor", "--metadata", uri, "--model", MODEL,
                               "--port", str(http_port), "--served-model-name", MODEL_NAME,
                               "--max-model-len", "1024")
        server = Base(http_port)

        def healthy():
            try:
                m = scrape(http_port)
            except OSError:
                return False
            return (m.get('tandem_workers{role="decode",state="healthy"}') == 1
                    and m.get('tandem_workers{role="prefill",state="healthy"}') == 1)

        def serves():
            try:
                text, finish, _, error = stream(server, "/v1/completions", reqs[0], 30)
                return error is None and text == baseline[0]
            except OSError:
                return False

        completed = errors = 0
        recovery, messages = [], {}
        try:
            wait_for(healthy, 90, "both workers to join the conductor")
            reqs = bodies()
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
                        etcd.send_signal(signal.SIGKILL)
                        etcd.wait(timeout=10)
                    else:
                        etcd.send_signal(signal.SIGSTOP)
                    # More requests while etcd is away.
                    futures += [pool.submit(stream, server, "/v1/completions", b, 120)
                                for b in reqs]
                    if fault == "kill":
                        time.sleep(1.5)
                        etcd = self.start_etcd_here()
                    else:
                        time.sleep(2.0 if fault == "stop" else 8.0)
                        etcd.send_signal(signal.SIGCONT)
                    back = time.monotonic()
                    for k, f in enumerate(futures):
                        i = k % len(reqs)
                        try:
                            text, finish, _, error = f.result(timeout=150)
                        except Exception as e:  # noqa: BLE001 - a broken connection is an end
                            text, error = None, {"message": f"{type(e).__name__}: {e}"}
                        self.assertLess(time.monotonic() - started, 150, "a request hung")
                        if error is None:
                            self.assertEqual(text, baseline[i], f"round {round_no} request {i}")
                            completed += 1
                        else:
                            errors += 1
                            msg = str(error.get("message", ""))[:80]
                            messages[msg] = messages.get(msg, 0) + 1
                wait_for(serves, 60, f"the cluster to serve again after round {round_no}")
                recovery.append(time.monotonic() - back)
                wait_for(healthy, 60, f"both workers healthy after round {round_no}")
                for p in [conductor, *workers]:
                    self.assertIsNone(p.poll(), "a process died:\n" + self.logs())
                wait_for(lambda: metric(scrape(http_port), "tandem_kv_blocks_reserved") == 0, 30,
                         "no KV reservation left")
            if ROUNDS >= 3:  # a stop past the TTL ran: the workers' leases expired and came back
                for name in ("prefill", "decode"):
                    self.assertIn("expired; granting a new one", self.log(name))
            total = ROUNDS * 2 * len(bodies())
            print(f"\nchaos (etcd): {ROUNDS} rounds, {completed}/{total} completed with the "
                  f"fault-free text, {errors} ended with an error {messages}; serving again "
                  f"{sorted(recovery)[len(recovery) // 2]:.1f} s (median), {max(recovery):.1f} s "
                  f"(max) after etcd was back", file=sys.stderr)
            self.assertEqual(completed + errors, total)
        except AssertionError:
            raise AssertionError(self.logs())


def pool_prompt(round_no, i):
    """Prompts of a round share a long prefix of their own (so it is new to the pool)."""
    facts = " ".join(f"Fact {k}: river {k} of set {round_no} is {k * 3 + round_no} km long."
                     for k in range(30))
    return {"model": MODEL_NAME, "prompt": f"{facts} Question {i}: which river is longest?",
            "max_tokens": 12 + 4 * i, "temperature": 0, "ignore_eos": True}


@unittest.skipUnless(shutil.which("etcd"), "needs etcd")
class PoolChaos(ProcessCluster, unittest.TestCase):
    def setUp(self):
        self.cluster_setup("tandem-chaos-pool-")

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

        def healthy():
            try:
                m = scrape(http_port)
            except OSError:
                return False
            return (m.get('tandem_workers{role="decode",state="healthy"}') == 1
                    and m.get('tandem_workers{role="prefill",state="healthy"}') == 2)

        results = {}  # (round, i) -> text, for the requests that completed
        errors = 0
        messages, recovery = {}, []
        try:
            wait_for(healthy, 120, "the workers to join the conductor")
            for round_no in range(ROUNDS):
                kill_master = round_no % 2 == 0
                # The round's prefix reaches the pool first.
                stream(server, "/v1/completions", pool_prompt(round_no, 0), 120)
                with concurrent.futures.ThreadPoolExecutor(4) as pool:
                    started = time.monotonic()
                    futures = [pool.submit(stream, server, "/v1/completions",
                                           pool_prompt(round_no, i), 120) for i in range(4)]
                    time.sleep(0.2)
                    if kill_master:
                        active = next(m for m in masters if m.poll() is None)
                        active.send_signal(signal.SIGKILL)
                        active.wait(timeout=10)
                        masters.remove(active)
                        name = f"master-{round_no + 3}"
                        masters.append(self.start(name, BIN, "pool-master", "--metadata", etcd))
                    else:
                        store.send_signal(signal.SIGKILL)
                        store.wait(timeout=10)
                        time.sleep(1.0)
                        store = self.start("store", *store_args)
                    back = time.monotonic()
                    for i, f in enumerate(futures):
                        try:
                            text, finish, _, error = f.result(timeout=150)
                        except Exception as e:  # noqa: BLE001 - a broken connection is an end
                            text, error = None, {"message": f"{type(e).__name__}: {e}"}
                        self.assertLess(time.monotonic() - started, 150, "a request hung")
                        if error is None:
                            results[(round_no, i)] = text
                        else:
                            errors += 1
                            msg = str(error.get("message", ""))[:80]
                            messages[msg] = messages.get(msg, 0) + 1

                def serves():
                    try:
                        _, _, _, error = stream(server, "/v1/completions", pool_prompt(99, 0), 60)
                        return error is None
                    except OSError:
                        return False
                wait_for(serves, 60, f"the cluster to serve again after round {round_no}")
                recovery.append(time.monotonic() - back)
                wait_for(healthy, 60, f"the workers healthy after round {round_no}")
                for p in [conductor, *workers]:
                    self.assertIsNone(p.poll(), "a process died:\n" + self.logs())
                wait_for(lambda: metric(scrape(http_port), "tandem_kv_blocks_reserved") == 0, 30,
                         "no KV reservation left")
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
            total = ROUNDS * 4
            print(f"\nchaos (pool): {ROUNDS} rounds, {len(results)}/{total} completed with the "
                  f"fault-free text, {errors} ended with an error {messages}; pool hits "
                  f"{hits:.0f} blocks, fetch failures {failures:.0f}; serving again {sorted(recovery)[len(recovery) // 2]:.1f} s "
                  f"(median), {max(recovery):.1f} s (max) after the fault", file=sys.stderr)
            self.assertEqual(len(results) + errors, total)
        except AssertionError:
            raise AssertionError(self.logs())


if __name__ == "__main__":
    unittest.main()
