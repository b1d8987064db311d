"""End-to-end checks of `tandem transfer-bench`: a real loopback run (the bench starts its own
target process and metadata server) per transport, and clear refusals of bad flags."""
import json
import os
import subprocess
import unittest

BIN = os.environ.get("TANDEM_BIN", "build/tandem")
FIELDS = ("protocol", "operation", "block_size", "batch_size", "threads", "duration_s", "bytes",
          "requests", "gbps", "p50_us", "p99_us")


def bench(*args, timeout=120):
    return subprocess.run([BIN, "transfer-bench", *args], capture_output=True, text=True,
                          timeout=timeout)


def ucx_built():
    # A build without UCX refuses --protocol ucx with a message naming the build option.
    proc = bench("--protocol", "ucx", "--duration", "0.2", "--block-size", "4KiB", "--json")
    return "built without UCX" not in proc.stderr


class TransferBenchTest(unittest.TestCase):
    def run_json(self, protocol, *extra, env=None):
        proc = subprocess.run(
            [BIN, "transfer-bench", "--protocol", protocol, "--block-size", "256KiB",
             "--batch-size", "8", "--duration", "1", "--json", *extra],
            capture_output=True, text=True, timeout=120, env=env)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        lines = proc.stdout.strip().splitlines()
        self.assertEqual(len(lines), 1, proc.stdout)  # exactly one JSON object on stdout
        result = json.loads(lines[0])
        for field in FIELDS:
            self.assertIn(field, result)
        self.assertEqual(result["protocol"], protocol)
        self.assertEqual(result["block_size"], 256 * 1024)
        self.assertEqual(result["batch_size"], 8)
        self.assertGreater(result["gbps"], 0)
        self.assertGreater(result["requests"], 0)
        self.assertEqual(result["bytes"], result["requests"] * 256 * 1024)
        self.assertGreaterEqual(result["p99_us"], result["p50_us"])
        self.assertGreater(result["p50_us"], 0)
        self.assertGreater(result["duration_s"], 0.9)
        return result

    def test_tcp_loopback(self):
        self.run_json("tcp")

    def test_tcp_read_with_two_threads(self):
        result = self.run_json("tcp", "--operation", "read", "--threads", "2")
        self.assertEqual(result["operation"], "read")
        self.assertEqual(result["threads"], 2)

    def test_shm_loopback(self):
        self.run_json("shm")

    def test_memcpy_limit(self):
        self.run_json("memcpy")

    def test_ucx_loopback_if_built(self):
        if not ucx_built():
            self.skipTest("built without UCX")
        for tls in ("tcp", "posix,sysv,cma,self"):  # never InfiniBand here
            with self.subTest(tls=tls):
                self.run_json("ucx", env=dict(os.environ, UCX_TLS=tls))

    def test_human_readable_output(self):
        proc = bench("--protocol", "tcp", "--block-size", "64KiB", "--duration", "0.5")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("GB/s", proc.stdout)
        self.assertIn("p99", proc.stdout)

    def test_bad_flags_fail_clearly(self):
        cases = [
            (["--protocol", "carrier-pigeon"], "protocol"),
            (["--operation", "copy"], "operation"),
            (["--mode", "both"], "mode"),
            (["--block-size", "12XB"], "size unit"),
            (["--block-size", "0"], "size"),
            (["--block-size", "2GiB"], "1 GiB"),
            (["--batch-size", "0"], "batch-size"),
            (["--duration", "-1"], "duration"),
            (["--mode", "target", "--protocol", "tcp"], "--metadata"),
            (["--segment", "nowhere/kv"], "--metadata"),
            (["--segment", "nowhere/kv", "--metadata", "embedded:empty"], "nowhere/kv"),
        ]
        for args, needle in cases:
            with self.subTest(args=args):
                short = [] if "--duration" in args else ["--duration", "0.2"]
                proc = bench(*args, *short, timeout=60)
                self.assertNotEqual(proc.returncode, 0, proc.stdout)
                self.assertIn(needle.lower(), (proc.stderr + proc.stdout).lower())
                self.assertNotIn("Traceback", proc.stderr)
                self.assertFalse(proc.stdout.strip().startswith("{"), proc.stdout)


if __name__ == "__main__":
    unittest.main()
