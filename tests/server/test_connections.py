"""End-to-end test of the front door under many connections (bench/connections.py, small size):
with 1,500 idle, half-header and kept-alive connections held open, a fresh /health and a fresh
chat completion are answered; 100 streaming clients at once all end with [DONE] or a clean
429/503; the server lets every connection go once its client closes it. Also: limits on the
request head and body get clear 4xx errors; a kept-alive connection serves several requests.

Run: python3 -m unittest -v tests/server/test_connections.py   (after building build/tandem)
"""
import os
import socket
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench"))
import connections  # noqa: E402
from server_util import MODEL_NAME, Server  # noqa: E402

SERVER = None
IDLE = 1500
STREAMS = 100


def setUpModule():
    global SERVER
    connections.raise_fd_limit()
    SERVER = Server("--mode", "colocated", "--max-num-seqs", "16", "--max-waiting", "32")


def tearDownModule():
    if SERVER is not None:
        rc = SERVER.stop()
        if rc != 0:
            print(SERVER.log_text(), file=sys.stderr)


class ConnectionsTest(unittest.TestCase):
    def test_idle_and_streaming_clients_leave_room_for_a_fresh_request(self):
        limit = connections.raise_fd_limit()
        if limit < IDLE + STREAMS + 200:
            self.skipTest(f"the open-file limit ({limit}) is too low for {IDLE} connections")
        out = connections.measure("127.0.0.1", SERVER.port, MODEL_NAME, IDLE, STREAMS,
                                  max_tokens=8)
        print(out, file=sys.stderr)
        self.assertEqual(out["idle_failures"], 0, out)
        self.assertEqual(out["idle_held"], IDLE, out)
        self.assertGreaterEqual(out["server_connections_open"], IDLE, out)
        # Answered while every idle connection is held (a thread per connection could not).
        self.assertEqual(out["health_status_with_idle"], 200, out)
        self.assertEqual(out["chat_status_with_idle"], 200, out)
        self.assertEqual(out["health_status_with_streams"], 200, out)
        outcomes = out["stream_outcomes"]
        self.assertEqual(outcomes["error"], 0, out)
        self.assertEqual(outcomes["done"] + outcomes["rejected"], STREAMS, out)
        self.assertGreater(outcomes["done"], 0, out)
        self.assertLessEqual(out["server_connections_open_after"], 2, out)

    def test_oversized_head_and_body_get_clear_errors(self):
        with socket.create_connection(("127.0.0.1", SERVER.port), timeout=30) as s:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n")
            answer = read_answer(s)
        self.assertTrue(answer.startswith(b"HTTP/1.1 431"), answer[:200])
        self.assertIn(b"larger than the limit", answer)
        body = b"{" + b" " * (9 << 20) + b"}"
        with socket.create_connection(("127.0.0.1", SERVER.port), timeout=30) as s:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                      b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n")
            try:
                s.sendall(body)
            except OSError:
                pass  # the server answered and closed before the whole body went
            answer = read_answer(s)
        self.assertTrue(answer.startswith(b"HTTP/1.1 413"), answer[:200])
        self.assertIn(b'"error"', answer)

    def test_a_kept_alive_connection_serves_several_requests(self):
        with socket.create_connection(("127.0.0.1", SERVER.port), timeout=30) as s:
            for _ in range(3):
                s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
                answer = read_answer(s, until=b'"ok"}')
                self.assertTrue(answer.startswith(b"HTTP/1.1 200"), answer[:200])


def read_answer(sock, until=None, timeout=30):
    """What the server sends until `until` appears or it closes the connection."""
    sock.settimeout(timeout)
    got = b""
    end = time.monotonic() + timeout
    while time.monotonic() < end and (until is None or until not in got):
        try:
            chunk = sock.recv(65536)
        except OSError:
            break
        if not chunk:
            break
        got += chunk
    return got


if __name__ == "__main__":
    unittest.main()
