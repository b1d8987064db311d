"""Sends a workload to an endpoint (open loop by arrival time, optionally capped in flight, or
closed loop at a concurrency) and records each request."""
import asyncio
import collections
import sys
import time

from . import client, metrics


class Progress:
    """The progress line: sent, finished, failed, in flight, recent send and finish rates."""

    def __init__(self, total, enabled, stream=sys.stderr):
        self.total = total
        self.enabled = enabled
        self.stream = stream
        self.tty = enabled and hasattr(stream, "isatty") and stream.isatty()
        self.sent = self.finished = self.failed = 0
        self.sent_times = collections.deque()
        self.finish_times = collections.deque()
        self.t0 = time.perf_counter()

    def on_sent(self):
        self.sent += 1
        self.sent_times.append(time.perf_counter())

    def on_done(self, ok):
        self.finished += 1
        if not ok:
            self.failed += 1
        self.finish_times.append(time.perf_counter())

    def line(self, window=10.0):
        now = time.perf_counter()
        for q in (self.sent_times, self.finish_times):
            while q and q[0] < now - window:
                q.popleft()
        span = min(window, max(now - self.t0, 1e-3))
        return (f"[bench] {now - self.t0:7.1f}s sent {self.sent}/{self.total} finished "
                f"{self.finished} failed {self.failed} in flight {self.sent - self.finished} | "
                f"rate sent {len(self.sent_times) / span:.2f}/s finished "
                f"{len(self.finish_times) / span:.2f}/s")

    async def run(self):
        if not self.enabled:
            return
        interval = 0.5 if self.tty else 5.0
        while True:
            await asyncio.sleep(interval)
            self.emit()

    def emit(self, final=False):
        if not self.enabled:
            return
        if self.tty:
            self.stream.write("\r" + self.line() + ("\n" if final else ""))
        else:
            self.stream.write(self.line() + "\n")
        self.stream.flush()


def _payload(req, cfg):
    body = {"max_tokens": req.output_tokens, "stream": True, "temperature": cfg.temperature,
            "stream_options": {"include_usage": True}}
    if cfg.model:
        body["model"] = cfg.model
    if cfg.ignore_eos:
        body["ignore_eos"] = True
    if cfg.endpoint == "chat":
        body["messages"] = [{"role": "user", "content": req.prompt}]
    else:
        body["prompt"] = req.prompt
    body.update(cfg.extra_body)
    return body


def _path(cfg):
    return "/v1/chat/completions" if cfg.endpoint == "chat" else "/v1/completions"


async def send_one(endpoint, req, cfg, t_start):
    """One streamed request; returns its record (never raises for request failures)."""
    rec = {"index": req.index, "phase": req.phase, "scheduled_s": req.arrival_s,
           "input_tokens_target": req.input_tokens,
           "requested_output_tokens": req.output_tokens, "prompt_chars": len(req.prompt),
           "ok": False, "status": None, "error": None, "error_kind": None, "ttft_ms": None,
           "e2e_ms": None, "itl_ms": [], "chunks": 0, "prompt_tokens": None,
           "completion_tokens": None, "output_tokens": None, "output_tokens_source": None,
           "saw_done": False, "finish_reason": None}
    state = {"first": None, "last": None, "stream_error": None}

    def on_event(t, obj):
        if isinstance(obj, dict) and obj.get("error"):
            state["stream_error"] = str(obj["error"])[:300]
            return
        usage = obj.get("usage") if isinstance(obj, dict) else None
        if usage:
            rec["prompt_tokens"] = usage.get("prompt_tokens", rec["prompt_tokens"])
            rec["completion_tokens"] = usage.get("completion_tokens", rec["completion_tokens"])
        choices = obj.get("choices") if isinstance(obj, dict) else None
        if not choices:
            return
        c = choices[0]
        if c.get("finish_reason"):
            rec["finish_reason"] = c["finish_reason"]
        text = c.get("text") if cfg.endpoint == "completions" else (c.get("delta") or {}).get("content")
        if not text:
            return
        if state["first"] is None:
            state["first"] = t
        else:
            rec["itl_ms"].append((t - state["last"]) * 1000.0)
        state["last"] = t
        rec["chunks"] += 1

    t_call = time.perf_counter()
    rec["sent_s"] = t_call - t_start
    rec["client_wait_ms"] = max(0.0, (rec["sent_s"] - req.arrival_s) * 1000.0) if cfg.open_loop else 0.0
    t_sent = t_call
    try:
        t_sent, done = await asyncio.wait_for(
            endpoint.stream(_path(cfg), _payload(req, cfg), on_event), timeout=cfg.request_timeout_s)
        rec["saw_done"] = done
        t_end = time.perf_counter()
        if state["stream_error"]:
            rec["error"], rec["error_kind"] = state["stream_error"], "stream_error"
        elif state["first"] is None:
            rec["error"], rec["error_kind"] = "stream ended without any output", "empty"
        else:
            rec["ok"] = True
            rec["status"] = 200
            rec["ttft_ms"] = (state["first"] - t_sent) * 1000.0
            rec["e2e_ms"] = (t_end - t_sent) * 1000.0
            if rec["completion_tokens"] is not None:
                rec["output_tokens"], rec["output_tokens_source"] = rec["completion_tokens"], "usage"
            else:
                rec["output_tokens"], rec["output_tokens_source"] = rec["chunks"], "chunks"
    except asyncio.TimeoutError:
        rec["error"] = f"no complete response within {cfg.request_timeout_s:g} s"
        rec["error_kind"] = "timeout"
    except client.HttpError as e:
        rec["status"], rec["error"], rec["error_kind"] = e.status, str(e), "http"
    except (OSError, asyncio.IncompleteReadError, client.ProtocolError, ValueError) as e:
        rec["error"], rec["error_kind"] = f"{type(e).__name__}: {e}", "connection"
    rec["sent_s"] = t_sent - t_start
    return metrics.finish_record(rec)


async def _warmup(endpoint, cfg, n):
    from . import prompts, workload
    for i in range(n):
        req = workload.Request(index=-1 - i, arrival_s=0.0, prompt=prompts.block_text(f"warmup-{i}", 32),
                               input_tokens=32, output_tokens=4)
        rec = await send_one(endpoint, req, cfg, time.perf_counter())
        if not rec["ok"]:
            raise RuntimeError(f"warm-up request failed: {rec['error']}")


async def run_workload(reqs, cfg, progress_enabled=True, scraper=None):
    """Runs the requests; returns (records sorted by index, duration_s). A scrape.Scraper, if
    given, reads /metrics from the start of the measured run (after the warm-up) until a
    moment after its end."""
    endpoint = client.Endpoint(cfg.base_url, cfg.api_key)
    if cfg.warmup:
        await _warmup(endpoint, cfg, cfg.warmup)
    progress = Progress(len(reqs), progress_enabled)
    records = []
    sem = asyncio.Semaphore(cfg.max_concurrency) if cfg.max_concurrency else None
    t_start = time.perf_counter()
    progress.t0 = t_start

    async def wrapped(req):
        if sem is not None:
            async with sem:
                progress.on_sent()
                rec = await send_one(endpoint, req, cfg, t_start)
        else:
            progress.on_sent()
            rec = await send_one(endpoint, req, cfg, t_start)
        progress.on_done(rec["ok"])
        records.append(rec)

    ticker = asyncio.ensure_future(progress.run())
    if scraper is not None:
        await scraper.start(t_start)
    try:
        if cfg.open_loop:
            tasks = []
            for req in sorted(reqs, key=lambda r: r.arrival_s):
                delay = req.arrival_s - (time.perf_counter() - t_start)
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.ensure_future(wrapped(req)))
            await asyncio.gather(*tasks)
        else:
            queue = collections.deque(sorted(reqs, key=lambda r: r.index))

            async def worker():
                while queue:
                    await wrapped(queue.popleft())

            await asyncio.gather(*(worker() for _ in range(min(cfg.closed_loop, len(reqs)))))
        duration = time.perf_counter() - t_start
        if scraper is not None:
            # The last scrape a moment later: workers report their counters to the server late.
            await scraper.stop(settle_s=min(1.0, cfg.scrape_interval_s))
            scraper = None
    finally:
        ticker.cancel()
        if scraper is not None:  # the run failed: end the scrapes
            scraper.cancel()
    progress.emit(final=True)
    records.sort(key=lambda r: r["index"])
    return records, duration


async def discover_model(base_url, api_key, timeout_s=10.0):
    """The first model id of /v1/models, or None if the server does not list any."""
    endpoint = client.Endpoint(base_url, api_key)
    try:
        data = await asyncio.wait_for(endpoint.get_json("/v1/models"), timeout=timeout_s)
        models = data.get("data") or []
        return models[0].get("id") if models else None
    except (asyncio.TimeoutError, OSError, client.HttpError, client.ProtocolError, ValueError,
            AttributeError):
        return None
