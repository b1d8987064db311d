"""A small asyncio HTTP/1.1 client for streaming OpenAI requests.

Written on asyncio streams rather than on a client library so that the benchmark needs nothing
beyond the standard library and so that every timestamp is taken by the one event-loop thread
the moment an SSE event has been read off the socket (time.perf_counter), with no thread
hand-off between the socket and the clock. One connection per request (Connection: close), so
requests never queue behind each other in a client-side pool.
"""
import asyncio
import json
import ssl
import time
import urllib.parse


class HttpError(Exception):
    def __init__(self, status, body):
        super().__init__(f"HTTP {status}: {body[:300]}")
        self.status = status
        self.body = body


class ProtocolError(Exception):
    pass


def split_url(base_url):
    """(scheme, host, port, path prefix) of an http(s) base URL; ValueError if it is not one."""
    u = urllib.parse.urlsplit(base_url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise ValueError(f"not an http(s) URL: {base_url!r}")
    port = u.port or (443 if u.scheme == "https" else 80)
    return u.scheme, u.hostname, port, u.path.rstrip("/")


async def _read_head(reader):
    status_line = await reader.readline()
    if not status_line:
        raise ProtocolError("connection closed before the response")
    parts = status_line.decode("latin-1").split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/"):
        raise ProtocolError(f"bad status line {status_line[:80]!r}")
    status = int(parts[1])
    headers = {}
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b"\n", b""):
            break
        k, _, v = line.decode("latin-1").partition(":")
        headers[k.strip().lower()] = v.strip()
    return status, headers


async def _body_chunks(reader, headers):
    """Yields the response body as it arrives (chunked, sized or until close)."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        while True:
            size_line = await reader.readline()
            if not size_line:
                raise ProtocolError("connection closed inside a chunked body")
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                    pass
                return
            data = await reader.readexactly(size)
            await reader.readexactly(2)
            yield data
    elif "content-length" in headers:
        left = int(headers["content-length"])
        while left > 0:
            data = await reader.read(min(left, 65536))
            if not data:
                raise ProtocolError("connection closed before the end of the body")
            left -= len(data)
            yield data
    else:
        while True:
            data = await reader.read(65536)
            if not data:
                return
            yield data


class Endpoint:
    def __init__(self, base_url, api_key=None):
        self.scheme, self.host, self.port, self.prefix = split_url(base_url)
        self.api_key = api_key

    async def _open(self):
        ctx = ssl.create_default_context() if self.scheme == "https" else None
        return await asyncio.open_connection(self.host, self.port, ssl=ctx,
                                             limit=16 * 1024 * 1024)

    def _head(self, method, path, body_len):
        lines = [f"{method} {self.prefix}{path} HTTP/1.1", f"Host: {self.host}:{self.port}",
                 "Connection: close", "Accept: */*", "User-Agent: tandem-bench"]
        if body_len is not None:
            lines += ["Content-Type: application/json", f"Content-Length: {body_len}"]
        if self.api_key:
            lines.append(f"Authorization: Bearer {self.api_key}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode()

    async def _get(self, path):
        reader, writer = await self._open()
        try:
            writer.write(self._head("GET", path, None))
            await writer.drain()
            status, headers = await _read_head(reader)
            body = b"".join([c async for c in _body_chunks(reader, headers)])
            if status != 200:
                raise HttpError(status, body.decode("utf-8", "replace"))
            return body
        finally:
            writer.close()

    async def get_json(self, path):
        return json.loads(await self._get(path))

    async def get_text(self, path):
        return (await self._get(path)).decode("utf-8", "replace")

    async def stream(self, path, payload, on_event):
        """POSTs payload and calls on_event(t, obj) for every SSE `data:` JSON event, t being
        time.perf_counter() when it was read; returns (t_sent, saw_done). Raises HttpError for a
        non-200 status."""
        data = json.dumps(payload).encode()
        reader, writer = await self._open()
        try:
            t_sent = time.perf_counter()
            writer.write(self._head("POST", path, len(data)) + data)
            await writer.drain()
            status, headers = await _read_head(reader)
            if status != 200:
                body = b"".join([c async for c in _body_chunks(reader, headers)])
                raise HttpError(status, body.decode("utf-8", "replace"))
            buf = b""
            done = False
            async for chunk in _body_chunks(reader, headers):
                t = time.perf_counter()
                buf += chunk
                while True:
                    # SSE events end with a blank line; accept \n\n and \r\n\r\n.
                    i = buf.find(b"\n\n")
                    j = buf.find(b"\r\n\r\n")
                    if i < 0 and j < 0:
                        break
                    if j >= 0 and (i < 0 or j < i):
                        event, buf = buf[:j], buf[j + 4:]
                    else:
                        event, buf = buf[:i], buf[i + 2:]
                    for line in event.splitlines():
                        line = line.strip()
                        if not line.startswith(b"data:"):
                            continue
                        value = line[5:].strip()
                        if value == b"[DONE]":
                            done = True
                            continue
                        try:
                            obj = json.loads(value)
                        except ValueError:
                            raise ProtocolError(f"bad SSE data {value[:120]!r}") from None
                        on_event(t, obj)
            return t_sent, done
        finally:
            writer.close()
