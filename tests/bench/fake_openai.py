"""A fake OpenAI-compatible completions server with known, injected timing, for checking what
the benchmark client measures.

Each streamed completion sends its first token `ttft_ms` after the request was read, then one
token per gap of `gaps_ms` (cycled), on an absolute schedule so that delays do not accumulate.
Special max_tokens values inject faults: `reject_tokens` -> HTTP `reject_status` (503 unless
set; 429 comes with Retry-After, as an admission-control rejection), `short_tokens` -> stops
after 2 tokens (as a server ignoring ignore_eos would), `hang_tokens` -> never answers in time.
`serial` makes requests run one at a time (a server with capacity 1). Every request is logged
with its arrival time (time.perf_counter) and body. Hooks for a fake `tandem serve`: `admit(body)`
returning an HTTP status rejects the request with it (429 with Retry-After), and `metrics()`
gives the text of GET /metrics.
"""
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeConfig:
    def __init__(self, ttft_ms=200.0, gaps_ms=(30.0,), reject_tokens=None, short_tokens=None,
                 hang_tokens=None, serial=False, reject_status=503):
        self.ttft_ms = ttft_ms
        self.gaps_ms = list(gaps_ms)
        self.reject_tokens = reject_tokens
        self.short_tokens = short_tokens
        self.hang_tokens = hang_tokens
        self.serial = serial
        self.reject_status = reject_status


class FakeServer:
    def __init__(self, config, port=0, admit=None, metrics=None):
        self.config = config
        self.admit = admit
        self.metrics = metrics
        self.log = []
        self.lock = threading.Lock()
        self.serial_lock = threading.Lock()
        self.in_flight = 0
        self.max_in_flight = 0
        self.stop_event = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                if self.path == "/metrics" and server.metrics is not None:
                    body = server.metrics().encode()
                    ctype = "text/plain; version=0.0.4"
                else:
                    body = json.dumps({"object": "list", "data": [{"id": "fake-model"}]}).encode()
                    ctype = "application/json"
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):
                t_arrival = time.perf_counter()
                n = int(self.headers.get("Content-Length", "0"))
                req = json.loads(self.rfile.read(n))
                with server.lock:
                    server.log.append({"t": t_arrival, "body": req, "path": self.path})
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                try:
                    if server.config.serial:
                        with server.serial_lock:
                            server._answer(self, req, time.perf_counter())
                    else:
                        server._answer(self, req, t_arrival)
                finally:
                    with server.lock:
                        server.in_flight -= 1

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.base = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def _answer(self, h, req, t0):
        cfg = self.config
        want = int(req.get("max_tokens", 16))
        status = self.admit(req) if self.admit is not None else None
        if status is None and want == cfg.reject_tokens:
            status = cfg.reject_status
        if status is not None:
            body = b'{"error": {"message": "overloaded"}}'
            h.send_response(status)
            if status == 429:
                h.send_header("Retry-After", "1")
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", str(len(body)))
            h.end_headers()
            h.wfile.write(body)
            return
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()

        def send(obj):
            data = ("data: " + (obj if isinstance(obj, str) else json.dumps(obj)) + "\n\n").encode()
            h.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            h.wfile.flush()

        if want == cfg.hang_tokens:
            self.stop_event.wait(30)
            return
        n = 2 if want == cfg.short_tokens else want
        due = t0 + cfg.ttft_ms / 1000.0
        for i in range(n):
            delay = due - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            send({"object": "text_completion", "choices": [
                {"index": 0, "text": f" w{i}", "finish_reason": "length" if i == n - 1 else None}]})
            due += cfg.gaps_ms[i % len(cfg.gaps_ms)] / 1000.0
        prompt_tokens = len(req.get("prompt", "").split())
        send({"object": "text_completion", "choices": [],
              "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": n,
                        "total_tokens": prompt_tokens + n}})
        send("[DONE]")
        h.wfile.write(b"0\r\n\r\n")
        h.wfile.flush()

    def close(self):
        self.stop_event.set()
        self.httpd.shutdown()
        self.httpd.server_close()
