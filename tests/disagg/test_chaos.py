"""Chaos under load: for a number of rounds, requests stream while a driver kill -9s or
SIGSTOPs a random worker (prefill or decode). Every request must end within its deadline,
completed with the text of the fault-free run (greedy; a stream whose decode worker dies moves
to another, a prefill whose worker dies is redone) or with a clear error; after each round the
cluster comes back (every worker healthy, no KV reservation left) and the serve process holds
no more file descriptors or threads than before. TANDEM_CHAOS_ROUNDS sets the rounds (the
default run does 3; `ctest -L long` runs chaos_long with 100). A summary line reports the
figures."""
import concurrent.futures
import os
import random
import signal
import time
import unittest

from disagg_util import MODEL_NAME, disaggregated, metric, stream, wait_for, worker_pids

ROUNDS = int(os.environ.get("TANDEM_CHAOS_ROUNDS", "3"))


def bodies():
    out = []
    for i in range(6):
        if i % 3 == 0:  # a longer prompt: a prefill worker has work to lose
            prompt = " ".join(f"Line {k} of log {i} reads {k * 17 + i}." for k in range(45))
            max_tokens = 16
        else:
            prompt = f"Request {i}: tell a short story about a lighthouse keeper."
            max_tokens = 40 + 8 * i
        out.append({"model": MODEL_NAME, "prompt": prompt, "max_tokens": max_tokens,
                    "temperature": 0, "ignore_eos": True})
    return out


def fds_and_threads(pid):
    return len(os.listdir(f"/proc/{pid}/fd")), len(os.listdir(f"/proc/{pid}/task"))


class ChaosUnderLoad(unittest.TestCase):
    def test_random_kills_and_stops_lose_nothing(self):
        rng = random.Random(int(os.environ.get("TANDEM_CHAOS_SEED", "7")))
        server = disaggregated("--prefill-workers", "2", "--decode-workers", "2", threads=4)
        completed = errors = 0
        recovery, messages = [], {}
        try:
            reqs = bodies()
            with concurrent.futures.ThreadPoolExecutor(len(reqs)) as pool:
                baseline = [r[0] for r in pool.map(
                    lambda b: stream(server, "/v1/completions", b, 120), reqs)]
            server.wait_idle()
            fds0, threads0 = fds_and_threads(server.proc.pid)
            for round_no in range(ROUNDS):
                role = rng.choice(["prefill", "decode"])
                stop = rng.random() < 0.3
                with concurrent.futures.ThreadPoolExecutor(len(reqs)) as pool:
                    futures = [pool.submit(stream, server, "/v1/completions", b, 300) for b in reqs]
                    time.sleep(rng.uniform(0.2, 1.5))
                    pids = worker_pids(server, role)
                    victim = rng.choice(pids)
                    if stop:
                        os.kill(victim, signal.SIGSTOP)
                        time.sleep(1.5)
                        os.kill(victim, signal.SIGCONT)
                    else:
                        os.kill(victim, signal.SIGKILL)
                    hit = time.time()
                    for i, f in enumerate(futures):
                        try:
                            text, finish, usage, error = f.result(timeout=300)
                        except Exception as e:  # a broken HTTP stream is an error, not a hang
                            text, finish, usage, error = "", None, None, {"message": repr(e)}
                        what = f"round {round_no} ({'stop' if stop else 'kill'} {role}) request {i}"
                        if error is None:
                            self.assertEqual(finish, "length", what)
                            self.assertEqual(text, baseline[i], what)
                            completed += 1
                        else:
                            self.assertTrue(error.get("message"), what)
                            errors += 1
                            key = f"{'stop' if stop else 'kill'} {role}: {error['message'][:120]}"
                            messages[key] = messages.get(key, 0) + 1
                wait_for(lambda: all(metric(server.metrics(), "tandem_workers", role=r,
                                            state="healthy") == 2 for r in ("prefill", "decode")),
                         90, f"round {round_no}: every worker back")
                recovery.append(time.time() - hit)
                m = server.wait_idle()
                self.assertEqual(metric(m, "tandem_kv_blocks_reserved"), 0, f"round {round_no}")
                fds, threads = fds_and_threads(server.proc.pid)
                # Connections to workers and request threads come and go: a bounded slack.
                self.assertLessEqual(fds, fds0 + 16, f"round {round_no}: fds {fds0} -> {fds}")
                self.assertLessEqual(threads, threads0 + 16,
                                     f"round {round_no}: threads {threads0} -> {threads}")
            m = server.metrics()
            recovery.sort()
            print(f"\nchaos: {ROUNDS} rounds, {completed} completed unchanged, {errors} errors, "
                  f"{metric(m, 'tandem_stream_migrations_total'):.0f} stream migrations, "
                  f"{metric(m, 'tandem_prefill_retries_total'):.0f} prefill retries, "
                  f"{metric(m, 'tandem_colocated_fallback_requests_total'):.0f} fallbacks, "
                  f"{metric(m, 'tandem_worker_restarts_total'):.0f} restarts; back in "
                  f"{recovery[len(recovery) // 2]:.1f} s median, {recovery[-1]:.1f} s max",
                  flush=True)
            for message, count in sorted(messages.items()):
                print(f"chaos: {count} x {message}", flush=True)
            self.assertGreater(completed, 0)
        finally:
            self.assertEqual(server.stop(), 0)


if __name__ == "__main__":
    unittest.main()
