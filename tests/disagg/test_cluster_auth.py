"""Closed doors: with a cluster token, a peer without it can neither drive a worker, nor read
the metadata service, nor read or write a KV segment through the TCP transport; a member of the
cluster (cluster_auth.py, the protocol written again in Python) can, and every refusal is
counted. The server's own traffic keeps working."""
import base64
import json
import re
import socket
import time
import unittest
import urllib.error
import urllib.request

import cluster_auth
from disagg_util import (MODEL_NAME, TEST_CLUSTER_TOKEN, call_internal, disaggregated, post,
                         text_of, worker_endpoints)


def raw_post(host, port, path, data, headers):
    """(status, body, headers) of a POST, errors included."""
    req = urllib.request.Request(f"http://{host}:{port}{path}", data=data,
                                 headers={"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read(), r.headers
    except urllib.error.HTTPError as e:
        return e.code, e.read(), e.headers


def closed_without_a_byte(sock):
    sock.settimeout(10)
    return sock.recv(1) == b""


class ClusterTokenTest(unittest.TestCase):
    def test_outsiders_are_refused_members_are_served(self):
        server = disaggregated(env={"TANDEM_CLUSTER_TOKEN": TEST_CLUSTER_TOKEN})
        try:
            body = {"model": MODEL_NAME, "prompt": "The capital of France is", "max_tokens": 6,
                    "temperature": 0}
            self.assertTrue(text_of(post(server, "/v1/completions", body)))  # the cluster works
            host, port = worker_endpoints(server)["decode-0"]
            refused = 0

            # Driving a worker: no proof, another token, a changed body, a replay, a stale proof.
            data = json.dumps({"role": "prefill", "reason": "outsider"}).encode()
            status, reply, _ = raw_post(host, port, "/v1/role", data, {})
            self.assertEqual(status, 401, reply)
            self.assertEqual(json.loads(reply)["error"]["code"], "UNAUTHENTICATED")
            wrong, _ = cluster_auth.sign_call("another-token-0123456789", "POST", "/v1/role", data)
            self.assertEqual(raw_post(host, port, "/v1/role", data, {"X-Tandem-Auth": wrong})[0], 401)
            good, nonce = cluster_auth.sign_call(TEST_CLUSTER_TOKEN, "POST", "/v1/role", data)
            other_body = json.dumps({"role": "decode", "reason": "outsider"}).encode()
            self.assertEqual(raw_post(host, port, "/v1/role", other_body, {"X-Tandem-Auth": good})[0], 401)
            stale, _ = cluster_auth.sign_call(TEST_CLUSTER_TOKEN, "POST", "/v1/role", data,
                                              unix_ms=int((time.time() - 600) * 1000))
            self.assertEqual(raw_post(host, port, "/v1/role", data, {"X-Tandem-Auth": stale})[0], 401)
            refused += 4
            # A member: served, and the worker proves the token back.
            same_role, nonce = cluster_auth.sign_call(
                TEST_CLUSTER_TOKEN, "POST", "/v1/role",
                json.dumps({"role": "decode", "reason": "member"}).encode())
            status, reply, headers = raw_post(host, port, "/v1/role",
                                              json.dumps({"role": "decode", "reason": "member"}).encode(),
                                              {"X-Tandem-Auth": same_role})
            self.assertEqual(status, 200, reply)
            self.assertEqual(headers["X-Tandem-Auth-Reply"],
                             cluster_auth.reply_proof(TEST_CLUSTER_TOKEN, nonce))
            # The very same call again is a replay.
            self.assertEqual(raw_post(host, port, "/v1/role",
                                      json.dumps({"role": "decode", "reason": "member"}).encode(),
                                      {"X-Tandem-Auth": same_role})[0], 401)
            refused += 1
            # Its statistics (prefix-cache keys included) are closed too.
            req = urllib.request.Request(f"http://{host}:{port}/stats")
            with self.assertRaises(urllib.error.HTTPError) as stats:
                urllib.request.urlopen(req, timeout=10)
            self.assertEqual(stats.exception.code, 401)
            refused += 1

            # The metadata service: closed to outsiders, open to members.
            meta = re.search(r"metadata http://([\d.]+):(\d+)", server.log_text())
            self.assertIsNotNone(meta, server.log_text()[-2000:])
            meta_host, meta_port = meta.group(1), int(meta.group(2))
            listing = json.dumps({"prefix": base64.b64encode(b"tandem/segments/").decode()}).encode()
            self.assertEqual(raw_post(meta_host, meta_port, "/v1/kv/list", listing, {})[0], 401)
            refused += 1
            kvs = json.loads(call_internal(meta_host, meta_port, "/v1/kv/list",
                                           json.loads(listing)))["kvs"]
            segments = [json.loads(base64.b64decode(kv["value"])) for kv in kvs]
            decode_kv = next(s for s in segments if s["name"].startswith("decode-0"))
            tcp_host, tcp_port = decode_kv["tcp_endpoint"].rsplit(":", 1)

            # The KV segment over TCP: a read without the handshake gets the connection closed,
            # not a byte of KV; after the handshake it is served.
            with socket.create_connection((tcp_host, int(tcp_port)), timeout=10) as s:
                s.sendall(cluster_auth.tcp_read_request(decode_kv["name"], 0, 64))
                self.assertTrue(closed_without_a_byte(s))
            refused += 1
            with socket.create_connection((tcp_host, int(tcp_port)), timeout=10) as s:
                with self.assertRaises(PermissionError):  # another token: the target's proof fails
                    cluster_auth.tcp_handshake(s, "another-token-0123456789")
            with socket.create_connection((tcp_host, int(tcp_port)), timeout=10) as s:
                cluster_auth.tcp_handshake(s, TEST_CLUSTER_TOKEN)
                s.sendall(cluster_auth.tcp_read_request(decode_kv["name"], 0, 64))
                code, text, payload = cluster_auth.tcp_reply(s)
                self.assertEqual((code, len(payload)), (0, 64), text)

            # Every refusal is counted (the workers' reach the conductor with their statistics).
            deadline = time.time() + 30
            while server.metrics().get("tandem_cluster_auth_refusals_total", 0) < refused:
                self.assertLess(time.time(), deadline, f"expected >= {refused} refusals counted")
                time.sleep(0.2)
            self.assertIn("refused", server.log_text())
            self.assertTrue(text_of(post(server, "/v1/completions", body)))  # still serving
        finally:
            server.stop()


if __name__ == "__main__":
    unittest.main()
