#!/usr/bin/env python3
"""A policy agent of protocol v2 in Python 3, standard library only.

It implements the policy of the Go demo agent (examples/demoagent) over a
Unix socket, speaking the frames of docs/protocol.md itself:

  * requests for /admin and below are blocked: 403, a JSON body and an
    x-blocked-by header; the upstream never sees them;
  * requests under /old are redirected (302) to the same path under /new;
  * every allowed request gets x-demo: 1 and x-client-class (cli, browser,
    bot or other, from the User-Agent) on its way upstream;
  * every response gets x-inspected-by: python-agent, and the word "secret"
    (any letter case) is masked with asterisks in text response bodies as
    they stream through, also when it is split across body chunks.

It declares supports_client_request when the proxy offers the
client_request feature, so it is shown each request as the client sent it
(the client's header block, request_target, and what the upstream receives
in metadata: upstream_host, forwarded_for, forwarded_proto,
forwarded_host); its policy reads the path (metadata.path, the decoded and normalised path
the sidecar routed) and the client's User-Agent, which both views carry alike.

Each event is handled in its own asyncio task, so requests are served
concurrently; CancelRequest cancels the task of its request and CancelAll
every task of the connection. Run it with:

    python3 examples/python-agent/agent.py --socket /tmp/python-agent.sock

and point an agent of the sidecar's configuration (transport: uds) at the
same path. Check it with:

    sidecar agent-check -transport uds -address /tmp/python-agent.sock -pid <PID>
"""

import argparse
import asyncio
import base64
import json
import logging
import os
import posixpath
import re
import signal
import socket
import stat
import struct
import sys
import time
import urllib.parse

PROTOCOL_VERSION = 2
AGENT_NAME = "python-agent"

# Frame types (docs/protocol.md §2.5).
HANDSHAKE_REQUEST = 0x01
HANDSHAKE_RESPONSE = 0x02
REQUEST_HEADERS = 0x10
REQUEST_BODY_CHUNK = 0x11
RESPONSE_HEADERS = 0x12
RESPONSE_BODY_CHUNK = 0x13
DECISION = 0x20
BODY_MUTATION = 0x21
CANCEL_REQUEST = 0x30
CANCEL_ALL = 0x31
PING = 0xF0
PONG = 0xF1

EVENTS = (REQUEST_HEADERS, REQUEST_BODY_CHUNK, RESPONSE_HEADERS, RESPONSE_BODY_CHUNK)

MAX_FRAME = 16 * 1024 * 1024  # §2.2, checked before reading the frame
HANDSHAKE_TIMEOUT = 5.0  # §5: the wait for the proxy's HandshakeRequest
FRAME_TIMEOUT = 5.0  # §2.3: the rest of a started frame
WRITE_TIMEOUT = 5.0  # §2.4: each write
STREAM_TTL = 120.0  # bound on the state of a response body never finished

BLOCK_PREFIX = "/admin"
REDIRECT_FROM = "/old"
REDIRECT_TO = "/new"
REDACT = b"secret"
MASK = ord("*")
BLOCK_BODY = '{"error":"forbidden","reason":"this path is blocked by the demo agent"}\n'

log = logging.getLogger(AGENT_NAME)


class RateLimitedLog:
    """At most `burst` warnings per `window` seconds: a peer that sends
    garbage in a loop must not flood the log."""

    def __init__(self, burst=10, window=10.0):
        self.burst, self.window = burst, window
        self.start, self.count, self.dropped = 0.0, 0, 0

    def warning(self, fmt, *args):
        now = time.monotonic()
        if now - self.start > self.window:
            if self.dropped:
                log.warning("%d warnings suppressed", self.dropped)
            self.start, self.count, self.dropped = now, 0, 0
        if self.count >= self.burst:
            self.dropped += 1
            return
        self.count += 1
        log.warning(fmt, *args)


warn = RateLimitedLog()


class FrameError(Exception):
    """The byte stream is not framed as §2 says: the connection ends."""


def frame(msg_type, obj):
    """Encodes one frame: u32 length (type + payload), type, JSON."""
    payload = json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()
    return struct.pack(">IB", len(payload) + 1, msg_type) + payload


async def read_frame(reader):
    """Reads one frame. The wait for its first byte is unbounded (the
    proxy pings idle connections); the rest must come within
    FRAME_TIMEOUT."""
    first = await reader.readexactly(1)
    try:
        rest = await asyncio.wait_for(reader.readexactly(4), FRAME_TIMEOUT)
        (length,) = struct.unpack(">I", first + rest[:3])
        if length == 0:
            raise FrameError("zero-length frame")
        if length > MAX_FRAME:
            raise FrameError("frame of %d bytes exceeds 16 MiB" % length)
        payload = await asyncio.wait_for(reader.readexactly(length - 1), FRAME_TIMEOUT)
    except asyncio.TimeoutError:
        raise FrameError("peer stalled mid-frame") from None
    return rest[3], payload


def decode(payload):
    """Decodes a payload that must be one JSON object (§3.1)."""
    obj = json.loads(payload.decode("utf-8"))
    if not isinstance(obj, dict):
        raise ValueError("payload is not a JSON object")
    return obj


_ID = re.compile(rb'^\s*\{\s*"request_id"\s*:\s*(\d+)')


def peek_request_id(payload):
    """The request_id of a payload that does not decode, when readable."""
    m = _ID.match(payload)
    return int(m.group(1)) if m else None


def header(headers, name):
    """The first value of a header (§3.5): the proxy sends name → list of
    values; decoders also accept name → value and lists of pairs."""
    if isinstance(headers, list):
        for h in headers:
            if isinstance(h, list) and len(h) == 2 and str(h[0]).lower() == name:
                return str(h[1])
            if isinstance(h, dict) and str(h.get("name", "")).lower() == name:
                return str(h.get("value", ""))
        return ""
    v = (headers or {}).get(name)
    if isinstance(v, list):
        return str(v[0]) if v else ""
    return "" if v is None else str(v)


def b64decode(s):
    """Standard base64, with or without padding (§3.4)."""
    return base64.b64decode(s + "=" * (-len(s) % 4), validate=True)


# ---------------------------------------------------------------------------
# The policy (the same as examples/demoagent).


def split_uri(uri):
    """The percent-decoded, cleaned path and the raw query of a target."""
    path, _, query = uri.partition("?")
    path = path.split("#", 1)[0]
    path = urllib.parse.unquote(path)
    if not path.startswith("/"):
        path = urllib.parse.urlsplit(path).path or "/" + path
        if not path.startswith("/"):
            path = "/" + path
    path = posixpath.normpath(path)
    if path.startswith("//"):
        path = "/" + path.lstrip("/")
    return path, query


def under_prefix(path, prefix):
    if prefix == "/":
        return True
    n = len(prefix)
    return path[:n].lower() == prefix.lower() and (len(path) == n or path[n] == "/")


def classify(user_agent):
    ua = user_agent[:256].lower()
    if not ua:
        return "other"
    if "bot" in ua or "spider" in ua or "crawl" in ua:
        return "bot"
    if ua.startswith(("curl/", "wget/", "httpie/", "go-http-client/")):
        return "cli"
    if ua.startswith("mozilla/"):
        return "browser"
    return "other"


def redactable(headers):
    ce = header(headers, "content-encoding")
    if ce and ce.lower() != "identity":
        return False
    ct = header(headers, "content-type").lower()
    return bool(ct) and (ct.startswith("text/") or "json" in ct or "xml" in ct or "javascript" in ct)


class Redactor:
    """Masks the word in a body that arrives in chunks. A chunk that ends
    with the beginning of the word is forwarded without those bytes, which
    go out with the next chunk once it shows whether they are the word;
    the last chunk flushes them. The body's size does not change."""

    def __init__(self):
        self.pending = b""
        self.seen = time.monotonic()

    def write(self, data, last):
        held = len(self.pending)
        buf = bytearray(self.pending + data)
        low = bytes(buf).lower()
        n = len(REDACT)
        masked, end, i = False, 0, 0
        while i + n <= len(buf):
            if low[i:i + n] == REDACT:
                buf[i:i + n] = bytes([MASK]) * n
                i += n
                end, masked = i, True
                continue
            i += 1
        cut = len(buf)
        if not last:
            for p in range(max(len(buf) - n + 1, end, 0), len(buf)):
                if REDACT.startswith(low[p:]):
                    cut = p
                    break
        self.pending = bytes(buf[cut:])
        if held == 0 and not masked and cut == len(buf):
            return data, False
        return bytes(buf[:cut]), True


def decision(request_id, verdict="allow", request_headers=(), response_headers=(), needs_more=False):
    d = {"request_id": request_id, "decision": verdict,
         "request_headers": list(request_headers), "response_headers": list(response_headers)}
    if needs_more:
        d["needs_more"] = True
    return d


def set_op(name, value):
    return {"operation": "set", "name": name, "value": value}


class Agent:
    """The policy's state, shared by the connections."""

    def __init__(self):
        self.streams = {}  # request_id -> Redactor, response bodies being redacted
        self.last_sweep = time.monotonic()

    def on_request_headers(self, m):
        rid = m["request_id"]
        path, query = split_uri(m.get("uri") or "/")
        # metadata.path is the path as the sidecar routed it (decoded, dot
        # segments resolved, repeated slashes merged); older sidecars do
        # not send it, and split_uri does the same cleaning.
        path = (m.get("metadata") or {}).get("path") or path
        if under_prefix(path, BLOCK_PREFIX):
            return DECISION, decision(rid, {"block": {
                "status": 403, "body": BLOCK_BODY,
                "headers": {"content-type": "application/json", "x-blocked-by": AGENT_NAME}}})
        if under_prefix(path, REDIRECT_FROM):
            target = posixpath.normpath(REDIRECT_TO + path[len(REDIRECT_FROM):])
            url = urllib.parse.quote(target, safe="/-._~!$&'()*+,;=:@")
            if query:
                url += "?" + query
            return DECISION, decision(rid, {"redirect": {"url": url, "status": 302}})
        ua = header(m.get("headers"), "user-agent")
        return DECISION, decision(rid, request_headers=[set_op("x-demo", "1"), set_op("x-client-class", classify(ua))])

    def on_response_headers(self, m):
        rid = m["request_id"]
        if m.get("has_body") and redactable(m.get("headers")):
            self.sweep()
            self.streams[rid] = Redactor()
        return DECISION, decision(rid, response_headers=[set_op("x-inspected-by", AGENT_NAME)])

    def on_body(self, msg_type, m):
        rid, idx = m["request_id"], m.get("chunk_index") or 0
        last = bool(m.get("is_last"))
        if msg_type == REQUEST_BODY_CHUNK:
            # Not declared; answer a misbehaving proxy sanely.
            return BODY_MUTATION, {"request_id": rid, "phase": "request", "chunk_index": idx}
        st = self.streams.get(rid)
        if st is None:
            # Not a text body: a final allow ends this agent's say over it.
            return DECISION, decision(rid)
        st.seen = time.monotonic()
        data = b64decode(m.get("data") or "")
        out, changed = st.write(data, last)
        if last:
            self.streams.pop(rid, None)
        mut = {"request_id": rid, "phase": "response", "chunk_index": idx}
        if changed:
            mut["data"] = base64.b64encode(out).decode()
        return BODY_MUTATION, mut

    def forget(self, rid):
        self.streams.pop(rid, None)

    def sweep(self):
        now = time.monotonic()
        if now - self.last_sweep < STREAM_TTL / 4:
            return
        self.last_sweep = now
        for rid in [r for r, s in self.streams.items() if now - s.seen > STREAM_TTL]:
            del self.streams[rid]

    def handle(self, msg_type, m):
        if msg_type == REQUEST_HEADERS:
            return self.on_request_headers(m)
        if msg_type == RESPONSE_HEADERS:
            return self.on_response_headers(m)
        return self.on_body(msg_type, m)


def capabilities():
    return {"handles_request_headers": True, "handles_request_body": False,
            "handles_response_headers": True, "handles_response_body": True,
            "supports_streaming": True, "supports_cancellation": True}


def agent_error(request_id, reason):
    """The agent error of §4.13: a decision kind the proxy refuses."""
    return {"request_id": request_id, "decision": {"error": {"reason": reason}}}


class Connection:
    """One connection from the proxy."""

    def __init__(self, agent, reader, writer):
        self.agent, self.reader, self.writer = agent, reader, writer
        self.tasks = {}  # request_id -> the task handling its event
        self.wlock = asyncio.Lock()

    async def send(self, msg_type, obj):
        data = frame(msg_type, obj)
        async with self.wlock:
            self.writer.write(data)  # the whole frame in one write
            await asyncio.wait_for(self.writer.drain(), WRITE_TIMEOUT)

    async def handshake(self):
        msg_type, payload = await asyncio.wait_for(read_frame(self.reader), HANDSHAKE_TIMEOUT)
        if msg_type != HANDSHAKE_REQUEST:
            raise FrameError("first frame is type 0x%02x, not a HandshakeRequest" % msg_type)
        req = decode(payload)
        version = req.get("protocol_version")
        resp = {"protocol_version": PROTOCOL_VERSION, "agent_name": AGENT_NAME, "accepted": True,
                "capabilities": capabilities()}
        features = req.get("supported_features")
        if isinstance(features, list) and "client_request" in features:
            # Declared only to a proxy that offered it (§4.2).
            resp["capabilities"]["supports_client_request"] = True
        if version != PROTOCOL_VERSION:
            resp["accepted"] = False
            resp["error"] = "unsupported protocol version: proxy speaks %s, agent speaks 2" % version
            resp["capabilities"] = {}
            await self.send(HANDSHAKE_RESPONSE, resp)
            return False
        await self.send(HANDSHAKE_RESPONSE, resp)
        return True

    async def serve(self):
        try:
            if not await self.handshake():
                return
            while True:
                msg_type, payload = await read_frame(self.reader)
                if not self.dispatch(msg_type, payload):
                    return
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.TimeoutError):
            pass  # the proxy went away, or never spoke
        except (FrameError, ValueError) as e:
            warn.warning("closing connection: %s", e)
        finally:
            for t in self.tasks.values():
                t.cancel()
            self.writer.close()

    def dispatch(self, msg_type, payload):
        """Handles one frame; False ends the connection."""
        if msg_type == PING:
            try:
                p = decode(payload)
            except ValueError:
                return True  # a Ping that does not decode is not answered
            pong = {"sequence": p.get("sequence") or 0, "timestamp_ms": p.get("timestamp_ms") or 0}
            self.spawn(None, self.send(PONG, pong))
        elif msg_type == CANCEL_REQUEST:
            try:
                rid = decode(payload).get("request_id")
            except ValueError:
                return True
            t = self.tasks.pop(rid, None)
            if t is not None:
                t.cancel()
            self.agent.forget(rid)
        elif msg_type == CANCEL_ALL:
            for rid, t in list(self.tasks.items()):
                t.cancel()
                self.agent.forget(rid)
            self.tasks.clear()
        elif msg_type in EVENTS:
            try:
                m = decode(payload)
                rid = m["request_id"]
                if not isinstance(rid, int) or isinstance(rid, bool) or rid < 0:
                    raise ValueError("bad request_id")
            except (ValueError, KeyError):
                rid = peek_request_id(payload)
                if rid is None:
                    warn.warning("undecodable event without a request_id: closing")
                    return False
                self.spawn(None, self.send(DECISION, agent_error(rid, "undecodable event")))
                return True
            self.spawn(rid, self.event(msg_type, m))
        # Any other type (unknown, or sent the wrong way) is skipped (§2.6).
        return True

    def spawn(self, rid, coro):
        t = asyncio.get_running_loop().create_task(coro)
        if rid is not None:
            self.tasks[rid] = t
            t.add_done_callback(lambda _t: self.tasks.get(rid) is _t and self.tasks.pop(rid, None))
        t.add_done_callback(_log_failure)

    async def event(self, msg_type, m):
        rid = m["request_id"]
        try:
            kind, reply = self.agent.handle(msg_type, m)
        except Exception as e:  # a bug in the policy fails this request only
            warn.warning("request %d: %r", rid, e)
            kind, reply = DECISION, agent_error(rid, type(e).__name__)
        # A cancelled task never gets here: no reply after a cancel (§7.8).
        await self.send(kind, reply)


def _log_failure(t):
    if not t.cancelled() and t.exception() is not None and not isinstance(
            t.exception(), (ConnectionError, asyncio.TimeoutError)):
        warn.warning("task failed: %r", t.exception())


def listen(path):
    """A Unix socket at path with mode 0660; a stale socket file is
    replaced, a live one or a non-socket file is an error."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None:
        if not stat.S_ISSOCK(st.st_mode):
            raise SystemExit("%s exists and is not a socket" % path)
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
            raise SystemExit("%s: another agent is listening" % path)
        except (ConnectionRefusedError, FileNotFoundError):
            os.unlink(path)
        finally:
            probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    os.chmod(path, 0o660)
    sock.listen(512)
    return sock


async def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--socket", default="/tmp/python-agent.sock", help="Unix socket path to listen on")
    ap.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    args = ap.parse_args()
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s " + AGENT_NAME + ": %(message)s")
    agent = Agent()

    async def on_conn(reader, writer):
        await Connection(agent, reader, writer).serve()

    sock = listen(args.socket)
    server = await asyncio.start_unix_server(on_conn, sock=sock)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    log.info("serving on %s", args.socket)
    async with server:
        await stop.wait()
    try:
        os.unlink(args.socket)
    except FileNotFoundError:
        pass


if __name__ == "__main__":
    asyncio.run(main())
