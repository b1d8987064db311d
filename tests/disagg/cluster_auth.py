"""The cluster token protocol (src/common/cluster_auth.h) written again from its description,
with Python's hmac and hashlib: the tests use it to talk to internal endpoints as a member of
the cluster would, and it checks that the C++ side follows the description."""
import hashlib
import hmac
import os
import socket
import struct
import time


def mac(secret, label, *parts):
    """HMAC-SHA256 over the label and the parts, each framed as b"<len>:<bytes>"."""
    message = b""
    for part in (label, *parts):
        part = part.encode() if isinstance(part, str) else part
        message += str(len(part)).encode() + b":" + part
    return hmac.new(secret.encode(), message, hashlib.sha256).digest()


def sign_call(secret, method, path, body, unix_ms=None, nonce=None):
    """(X-Tandem-Auth header value, nonce) for one HTTP call."""
    unix_ms = str(int(time.time() * 1000) if unix_ms is None else unix_ms)
    nonce = nonce or os.urandom(16).hex()
    body_hash = hashlib.sha256(body).hexdigest()
    proof = mac(secret, "tandem-call-v1", method, path, unix_ms, nonce, body_hash).hex()
    return f"{unix_ms}.{nonce}.{body_hash}.{proof}", nonce


def reply_proof(secret, nonce):
    return mac(secret, "tandem-reply-v1", nonce).hex()


HELLO_MAGIC = b"TDXA"


def recv_exact(sock, n):
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


def tcp_handshake(sock, secret):
    """The initiator's side on a connected socket; raises if the target's proof is wrong."""
    mine = os.urandom(16)
    sock.sendall(HELLO_MAGIC + mine)
    challenge = recv_exact(sock, 48)
    theirs, proof = challenge[:16], challenge[16:]
    if not hmac.compare_digest(proof, mac(secret, "tcp-target-v1", mine, theirs)):
        raise PermissionError("the target did not prove the cluster token")
    sock.sendall(mac(secret, "tcp-initiator-v1", mine, theirs))


def tcp_read_request(segment, offset, length, request_id=1):
    """A read request of the TCP transport (src/transfer/tcp_transport_wire_internal.h)."""
    name = segment.encode()
    header = struct.pack("<IBBHQQQII", 0x31584454, 2, 0, 0, request_id, offset, length, len(name), 0)
    return header + name


def tcp_reply(sock):
    """(status code, error text, payload) of one reply."""
    magic, kind, code, _, _, _, length, name_len, _ = struct.unpack("<IBBHQQQII", recv_exact(sock, 40))
    assert magic == 0x31584454 and kind == 4, (magic, kind)
    text = recv_exact(sock, name_len) if name_len else b""
    payload = recv_exact(sock, length) if length else b""
    return code, text, payload
