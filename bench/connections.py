"""The front door under many connections: thousands of idle and slow clients, hundreds or
thousands of streaming clients at once, and how long a fresh request takes meanwhile.

  python3 bench/connections.py --start --idle 10000 --streams 1000     # starts `tandem serve`
  python3 bench/connections.py --base http://127.0.0.1:8000 --idle 2000 --streams 100

Idle clients come in three kinds, in equal parts: silent (connect, send nothing), half a
request header (the slowloris shape), and kept alive (one GET /health answered, then silence).
While they are held, a fresh /health and a fresh chat completion are timed; then the streaming
clients start (each a streamed chat completion), and /health is timed again while they run.
Every stream must end with [DONE], or with a clean 429/503; anything else is an error. Prints
one JSON object with the figures. The server closes idle connections after 10 s and unfinished
requests after 30 s (its deadlines), so the fresh requests are timed within that window.
"""
import argparse
import http.client
import json
import os
import resource
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "server"))


def raise_fd_limit():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


KINDS = ("silent", "half", "keepalive")


def open_idle(host, port, n, kinds=KINDS):
    """n connections, the kinds in equal parts; returns (sockets, failures)."""
    socks, failures = [], 0
    for i in range(n):
        try:
            s = socket.create_connection((host, port), timeout=10)
            kind = kinds[i % len(kinds)]
            if kind == "half":
                s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: app")
            elif kind == "keepalive":
                s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
                got = b""
                while b"}" not in got:
                    chunk = s.recv(4096)
                    if not chunk:
                        break
                    got += chunk
                if b"200 OK" not in got:
                    failures += 1
            socks.append(s)
        except OSError:
            failures += 1
    return socks, failures


def timed_request(host, port, method, path, body=None, timeout=60):
    """(seconds, status) of one request on a fresh connection; status None on failure."""
    start = time.monotonic()
    try:
        c = http.client.HTTPConnection(host, port, timeout=timeout)
        c.request(method, path, body=json.dumps(body) if body else None,
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        r.read()
        c.close()
        return time.monotonic() - start, r.status
    except (OSError, http.client.HTTPException):
        return time.monotonic() - start, None


def chat_body(model, max_tokens, stream):
    return {"model": model, "messages": [{"role": "user", "content": "Name a colour."}],
            "max_tokens": max_tokens, "temperature": 0, "stream": stream}


def run_streams(host, port, model, n, max_tokens, timeout):
    """Starts n streaming clients at once; returns the outcome counts and the wall time."""
    outcomes = {"done": 0, "rejected": 0, "error": 0}
    lock = threading.Lock()
    barrier = threading.Barrier(n)

    def client():
        outcome = "error"
        try:
            barrier.wait(timeout=60)
            c = http.client.HTTPConnection(host, port, timeout=timeout)
            c.request("POST", "/v1/chat/completions",
                      body=json.dumps(chat_body(model, max_tokens, True)),
                      headers={"Content-Type": "application/json"})
            r = c.getresponse()
            text = r.read().decode("utf-8", "replace")
            if r.status == 200 and text.rstrip().endswith("data: [DONE]"):
                outcome = "done"
            elif r.status in (429, 503) and '"error"' in text:
                outcome = "rejected"
            c.close()
        except (OSError, http.client.HTTPException, threading.BrokenBarrierError):
            pass
        with lock:
            outcomes[outcome] += 1

    threads = [threading.Thread(target=client, daemon=True) for _ in range(n)]
    start = time.monotonic()
    for t in threads:
        t.start()
    return threads, outcomes, start


def open_connections(host, port):
    """The server's tandem_http_connections_open, from /metrics (-1: no answer in 30 s)."""
    try:
        c = http.client.HTTPConnection(host, port, timeout=30)
        c.request("GET", "/metrics")
        text = c.getresponse().read().decode()
        c.close()
    except (OSError, http.client.HTTPException):
        return -1
    for line in text.splitlines():
        if line.startswith("tandem_http_connections_open "):
            return int(float(line.split()[1]))
    return -1


def rss_mib(pid):
    """Resident memory of a process (MiB), or None."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None


def measure(host, port, model, idle, streams, max_tokens, stream_timeout=300, kinds=KINDS,
            server_pid=None):
    """The figures; with server_pid, also the front-door process's memory with and without the
    idle connections."""
    out = {"idle_requested": idle, "streams": streams}
    out["fd_limit"] = raise_fd_limit()
    out["health_s_before"], _ = timed_request(host, port, "GET", "/health")
    out["chat_s_before"], _ = timed_request(host, port, "POST", "/v1/chat/completions",
                                            chat_body(model, 4, False))
    if server_pid:
        out["server_rss_mib_before"] = rss_mib(server_pid)
    t0 = time.monotonic()
    socks, failures = open_idle(host, port, idle, kinds)
    out["idle_open_s"] = round(time.monotonic() - t0, 2)
    out["idle_held"] = len(socks)
    out["idle_failures"] = failures
    out["server_connections_open"] = open_connections(host, port)
    if server_pid:
        out["server_rss_mib_with_idle"] = rss_mib(server_pid)
    secs, status = timed_request(host, port, "GET", "/health")
    out["health_s_with_idle"], out["health_status_with_idle"] = round(secs, 4), status
    secs, status = timed_request(host, port, "POST", "/v1/chat/completions",
                                 chat_body(model, 4, False))
    out["chat_s_with_idle"], out["chat_status_with_idle"] = round(secs, 3), status
    if streams > 0:
        threads, outcomes, start = run_streams(host, port, model, streams, max_tokens,
                                               stream_timeout)
        time.sleep(1.0)  # the streams are connected and generating
        secs, status = timed_request(host, port, "GET", "/health")
        out["health_s_with_streams"], out["health_status_with_streams"] = round(secs, 4), status
        for t in threads:
            t.join(stream_timeout)
        out["streams_s"] = round(time.monotonic() - start, 1)
        out["stream_outcomes"] = outcomes
    for s in socks:
        s.close()
    # The server lets the closed connections go.
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        out["server_connections_open_after"] = open_connections(host, port)
        if out["server_connections_open_after"] <= 2:
            break
        time.sleep(0.2)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", help="a running server (http://host:port)")
    ap.add_argument("--start", action="store_true", help="start `tandem serve` (default flags)")
    ap.add_argument("--mode", default="disaggregated", help="--start: the serving mode")
    ap.add_argument("--idle", type=int, default=10000)
    ap.add_argument("--streams", type=int, default=1000)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--model", default="smol")
    ap.add_argument("--kinds", default=",".join(KINDS),
                    help="kinds of idle connection, comma-separated: silent, half, keepalive")
    args = ap.parse_args()
    raise_fd_limit()
    server = None
    if args.start:
        from server_util import Server
        server = Server("--mode", args.mode)
        base = server.base
    elif args.base:
        base = args.base
    else:
        ap.error("give --base or --start")
    host, port = base.split("//")[1].split(":")
    try:
        print(json.dumps(measure(host, int(port), args.model, args.idle, args.streams,
                                 args.max_tokens, kinds=tuple(args.kinds.split(",")),
                                 server_pid=server.proc.pid if server else None)))
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
