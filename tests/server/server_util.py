"""Starting and talking to a real `tandem serve` process for the end-to-end tests.

Environment: TANDEM_BIN (default build/tandem), TANDEM_MODEL (default the bundled SmolLM2),
TANDEM_SOURCE_DIR (default: two levels above this file), TANDEM_TEST_THREADS (engine threads of
each server, default 2).
"""
import json
import os
import random
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

SOURCE_DIR = os.environ.get(
    "TANDEM_SOURCE_DIR", os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
BIN = os.environ.get("TANDEM_BIN", os.path.join(SOURCE_DIR, "build", "tandem"))
MODEL = os.environ.get(
    "TANDEM_MODEL", os.path.join(SOURCE_DIR, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
MODEL_NAME = "smol"
# The 32k-context model with sliding-window layers (Gemma 3 270M, a base model: completions only).
GEMMA = os.path.join(SOURCE_DIR, "models", "gemma-3-270m-q4_k_m.gguf")


def _ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port():
    """A free port below the kernel's ephemeral range: a port the server is told to take must not
    be one that another listener bound to port 0 (a worker's transfer engine, started first) can
    be handed in the meantime."""
    low = _ephemeral_low()
    for _ in range(200):
        port = random.randrange(10000, max(10001, low))
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One `tandem serve` process on a free port; its log goes to a temporary file."""

    def __init__(self, *extra_args, threads=None, kv_cache_tokens=16384, max_model_len=2048,
                 model=None, env=None):
        threads = threads or int(os.environ.get("TANDEM_TEST_THREADS", "2"))
        # free_port() only finds a port free now: a process bound to port 0 (one of the server's
        # own workers, another test) may take it before the server binds it. Then try another.
        for attempt in range(3):
            self.port = free_port()
            self.base = f"http://127.0.0.1:{self.port}"
            self.log = tempfile.NamedTemporaryFile(prefix="tandem-serve-", suffix=".log",
                                                   delete=False)
            args = [BIN, "serve", "--model", model or MODEL, "--port", str(self.port),
                    "--threads", str(threads),
                    "--kv-cache-tokens", str(kv_cache_tokens), "--max-model-len", str(max_model_len),
                    "--served-model-name", MODEL_NAME, *extra_args]
            self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT,
                                         env={**os.environ, **(env or {})})
            if self._wait_healthy():
                return
            if attempt < 2 and "cannot bind" in self.log_text():
                self.log.close()
                continue
            raise RuntimeError(f"tandem serve exited with {self.proc.returncode}:\n{self.log_text()}")

    def _wait_healthy(self):
        """True once /health answers; False if the process exited first."""
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(self.base + "/health", timeout=2) as r:
                    if r.status == 200:
                        return True
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError("tandem serve did not become healthy in 120 s:\n" + self.log_text())

    def log_text(self):
        if not os.path.exists(self.log.name):
            return ""
        with open(self.log.name, "r", errors="replace") as f:
            return f.read()[-20000:]

    def terminate(self):
        """Sends SIGTERM (the server drains, then exits)."""
        self.proc.send_signal(signal.SIGTERM)

    def stop(self, timeout=60):
        """SIGTERM and wait; returns the exit code. The log is kept only when that is not 0."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        if self.proc.returncode == 0 and os.path.exists(self.log.name):
            os.unlink(self.log.name)
        elif os.path.exists(self.log.name):
            print(f"tandem serve exited with {self.proc.returncode}; log: {self.log.name}")
        return self.proc.returncode

    def metrics(self):
        """The /metrics samples as {"name{labels}": value}."""
        with urllib.request.urlopen(self.base + "/metrics", timeout=10) as r:
            text = r.read().decode()
        samples = {}
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
        return samples

    def wait_idle(self, timeout=60):
        """Waits until no request is running or waiting; returns the last metrics."""
        deadline = time.time() + timeout
        while True:
            m = self.metrics()
            if m["tandem_requests_running"] == 0 and m["tandem_requests_waiting"] == 0:
                return m
            if time.time() > deadline:
                raise AssertionError(f"server not idle after {timeout} s: {m}")
            time.sleep(0.05)


def sse_events(raw_lines):
    """Yields the JSON payloads (or "[DONE]") of an SSE byte-line iterator."""
    for line in raw_lines:
        if not line:
            continue
        if isinstance(line, bytes):
            line = line.decode()
        assert line.startswith("data: "), line
        payload = line[len("data: "):]
        yield payload if payload == "[DONE]" else json.loads(payload)


def wait_for(predicate, timeout, what):
    """Polls `predicate` until it returns something truthy (returned) or `timeout` s pass."""
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what} (last: {last})")
