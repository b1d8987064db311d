"""Reads the server's Prometheus /metrics while a run is in progress and keeps the samples of
the worker-utilisation and pool-size families, one JSON line per scrape in
metrics_timeseries.jsonl: {"t": seconds since the run started, "samples": [{"name", "labels",
"value"}]}. A family the server does not export is simply absent; a failed scrape is counted
and skipped. The text is parsed with prometheus_client's parser; without it there are no scrapes."""
import asyncio
import json
import time

from . import client

# Sample names kept (counters with their _total suffix, as they appear in the text).
FAMILIES = (
    "tandem_worker_busy_seconds_total",      # {worker, role, phase}: engine forward-pass seconds
    "tandem_worker_computed_tokens_total",   # {worker, role, phase}: tokens computed
    "tandem_worker_threads",                 # {worker, role}: engine threads of the worker
    "tandem_workers",                        # {role, state}: workers known to the conductor
    "tandem_planner_target_workers",         # {role}: pool size the planner aims for
    "tandem_role_switches_total",            # {from, to}: workers moved between pools
    "tandem_planner_decisions_total",        # {action, reason}: planner decisions
)

try:
    from prometheus_client.parser import text_string_to_metric_families as _prom_families
except ImportError:  # then no scrapes: the summary has no utilisation
    _prom_families = None

# Why scrapes cannot run here, or None.
UNAVAILABLE = (None if _prom_families is not None else
               "prometheus_client is not installed (pip install prometheus_client): /metrics not read")


def parse(text, families=FAMILIES):
    """The samples of `families` in a Prometheus text exposition, as [{"name", "labels",
    "value"}] in the order they appear. ValueError when the text does not parse."""
    wanted = set(families)
    rows = []
    try:
        for family in _prom_families(text):
            for s in family.samples:
                if s.name in wanted:
                    rows.append({"name": s.name, "labels": dict(s.labels), "value": float(s.value)})
    except (TypeError, IndexError) as e:
        raise ValueError(f"not a Prometheus text exposition: {e}") from e
    return rows


class Scraper:
    """Scrapes base_url/metrics every interval_s seconds from start(t0) until stop(), appending
    each scrape to `path` (and to self.scrapes). t0 is the run's start (time.perf_counter())."""

    def __init__(self, base_url, api_key, interval_s, path, timeout_s=5.0):
        self.endpoint = client.Endpoint(base_url, api_key)
        self.interval_s = interval_s
        self.path = path
        self.timeout_s = timeout_s
        self.scrapes = []
        self.errors = 0
        self.last_error = None
        self.t0 = None
        self._task = None
        self._file = None

    async def scrape_once(self):
        t = time.perf_counter() - self.t0
        try:
            text = await asyncio.wait_for(self.endpoint.get_text("/metrics"), self.timeout_s)
        except (asyncio.TimeoutError, OSError, client.HttpError, client.ProtocolError,
                ValueError) as e:
            self.errors += 1
            self.last_error = f"{type(e).__name__}: {e}"[:300]
            return None
        try:
            samples = parse(text)
        except ValueError as e:
            self.errors += 1
            self.last_error = str(e)[:300]
            return None
        row = {"t": round(t, 4), "samples": samples}
        self.scrapes.append(row)
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        return row

    async def _loop(self):
        k = 1
        while True:
            # On a fixed grid from t0 so that slow scrapes do not stretch the interval.
            await asyncio.sleep(max(0.0, self.t0 + k * self.interval_s - time.perf_counter()))
            await self.scrape_once()
            k += 1

    async def start(self, t0):
        self.t0 = t0
        self._file = open(self.path, "w")
        await self.scrape_once()
        self._task = asyncio.ensure_future(self._loop())

    def cancel(self):
        """Ends the scrapes without a last one (the run failed)."""
        if self._task is not None:
            self._task.cancel()
        if self._file is not None:
            self._file.close()

    async def stop(self, settle_s=0.0):
        """Ends the periodic scrapes and takes a last one settle_s seconds later (counters that
        workers report to the server late)."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        if settle_s > 0:
            await asyncio.sleep(settle_s)
        await self.scrape_once()
        self._file.close()
