#!/usr/bin/env python3
"""KV pool fetch throughput against the transfer engine's own: `tandem pool-bench` (lookups of
whole batches through the pool master, the bytes read from a `tandem store` process) against
`tandem transfer-bench --operation read` at the same block and batch size, in the same topology,
over the same working set (a batch of distinct blocks read again and again). Each round runs every configuration once; the table
shows medians in GB/s (1e9) and the ratio pool / transfer engine.

Topologies:
  host        the store and the reader on one host: shared memory (shm) and TCP over loopback
  namespaces  the store in another network namespace (another "host" behind a veth pair): TCP;
              needs root and `ip` (skipped otherwise)

    python3 bench/pool_fetch.py --rounds 3 --out bench/out/pool_fetch
"""
import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import two_hosts  # bench/, beside this script

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
NS_A, NS_B = f"tandem-pa-{os.getpid()}", f"tandem-pb-{os.getpid()}"
ADDR_A, ADDR_B = "10.232.0.1", "10.232.0.2"


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """etcd + `tandem pool-master` (+ `tandem store`) in `ns_reader` / `ns_store` (None: here)."""

    def __init__(self, args, tmp, ns_reader=None, ns_store=None, host_reader="127.0.0.1",
                 host_store="127.0.0.1"):
        self.args, self.tmp, self.procs = args, tmp, []
        self.ns_reader, self.ns_store = ns_reader, ns_store
        self.host_reader, self.host_store = host_reader, host_store
        port, peer = free_port(), free_port()
        self.etcd = f"etcd://{host_reader}:{port}"
        self.start("etcd", ns_reader, two_hosts.etcd_command(host_reader, port, peer,
                                                             os.path.join(tmp, f"etcd-{port}")))
        time.sleep(1.5)
        self.start("master", ns_reader, [args.tandem, "pool-master", "--metadata", self.etcd,
                                         "--host", host_reader, "--journal", "off",
                                         "--hot-gets", "0"])

    def wrap(self, ns, cmd):
        return ["ip", "netns", "exec", ns] + cmd if ns else cmd

    def start(self, name, ns, cmd):
        logf = open(os.path.join(self.tmp, f"{name}.log"), "a")
        p = subprocess.Popen(self.wrap(ns, cmd), stdout=logf, stderr=subprocess.STDOUT)
        self.procs.append(p)
        return p

    def start_store(self, mb):
        return self.start("store", self.ns_store,
                          [self.args.tandem, "store", "--metadata", self.etcd, "--name", "bench-store",
                           "--host", self.host_store, "--dram-mb", str(mb)])

    def run(self, ns, cmd, timeout):
        out = subprocess.run(self.wrap(ns, cmd), capture_output=True, text=True, timeout=timeout)
        if out.returncode != 0:
            log(f"FAILED {' '.join(cmd)}: {out.stderr[-600:]}")
            return None
        return json.loads(out.stdout.strip().splitlines()[-1])

    def stop(self):
        two_hosts.stop(self.procs)


def pool_run(args, cluster, protocols, batch):
    time.sleep(2.0)  # the store's segment mounted
    return cluster.run(cluster.ns_reader,
                       [args.tandem, "pool-bench", "--metadata", cluster.etcd, "--host",
                        cluster.host_reader, "--transfer-protocols", protocols,
                        "--block-size", str(args.block_size), "--batch-size", str(batch),
                        "--objects", str(batch), "--duration", str(args.duration), "--json"],
                       timeout=args.duration + 120)


def engine_loopback(args, protocol, batch):
    cmd = [args.tandem, "transfer-bench", "--protocol", protocol, "--operation", "read",
           "--block-size", str(args.block_size), "--batch-size", str(batch),
           "--duration", str(args.duration), "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.duration + 120)
    if out.returncode != 0:
        log(f"FAILED {' '.join(cmd)}: {out.stderr[-600:]}")
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])


def engine_across(args, cluster, batch):
    """transfer-bench initiator (reader's namespace) against a target in the store's."""
    segment = f"bench-target-{os.getpid()}-{batch}"
    buf = str(args.block_size * batch)
    target = cluster.start("target", cluster.ns_store,
                           [args.tandem, "transfer-bench", "--mode", "target", "--protocol", "tcp",
                            "--metadata", cluster.etcd, "--segment", segment, "--buffer-size", buf,
                            "--listen-host", cluster.host_store, "--lifetime",
                            str(args.duration + 60)])
    time.sleep(1.5)
    try:
        return cluster.run(cluster.ns_reader,
                           [args.tandem, "transfer-bench", "--protocol", "tcp", "--operation", "read",
                            "--metadata", cluster.etcd, "--segment", segment, "--buffer-size", buf,
                            "--block-size", str(args.block_size), "--batch-size",
                            str(batch), "--duration", str(args.duration), "--json"],
                           timeout=args.duration + 120)
    finally:
        target.terminate()
        target.wait()


def make_namespaces():
    two_hosts.make(NS_A, NS_B, ADDR_A, ADDR_B, dev="veth-p")


def drop_namespaces():
    two_hosts.drop(NS_A, NS_B)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tandem", default=os.path.join(ROOT, "build", "tandem"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--block-size", type=int, default=368640,
                    help="bytes per object (default: one SmolLM2-135M KV block of 16 tokens)")
    ap.add_argument("--batch-sizes", default="32,128",
                    help="blocks per lookup (a 2k-token prompt of SmolLM2 is 128 blocks)")
    ap.add_argument("--topologies", default="host,namespaces")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "out", "pool_fetch"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    batches = [int(b) for b in args.batch_sizes.split(",")]
    store_mb = max(64, args.block_size * max(batches) * 4 // (1 << 20))
    topologies = args.topologies.split(",")
    can_ns = os.geteuid() == 0 and shutil.which("ip")
    if "namespaces" in topologies and not can_ns:
        log("namespaces: skipped (needs root and ip)")
        topologies.remove("namespaces")
    results = {}  # config -> [(pool run, engine run)]

    def record(rnd, name, pool, engine):
        log(f"round {rnd + 1} {name}: pool {pool and pool['gbps']} GB/s, "
            f"engine {engine and engine['gbps']} GB/s")
        if pool and engine:
            results.setdefault(name, []).append((pool, engine))

    for rnd in range(args.rounds):
        tmp = tempfile.mkdtemp(prefix="tandem-pool-fetch-", dir=args.out)
        if "host" in topologies:
            cluster = Cluster(args, tmp)
            try:
                cluster.start_store(store_mb)
                for batch in batches:
                    for topo, protocols, engine_protocol in (("host shm", "shm,tcp", "shm"),
                                                             ("host tcp", "tcp", "tcp")):
                        name = f"{topo}, batch {batch}"
                        record(rnd, name, pool_run(args, cluster, protocols, batch),
                               engine_loopback(args, engine_protocol, batch))
            finally:
                cluster.stop()
        if "namespaces" in topologies:
            make_namespaces()
            try:
                cluster = Cluster(args, tmp, NS_A, NS_B, ADDR_A, ADDR_B)
                try:
                    cluster.start_store(store_mb)
                    for batch in batches:
                        name = f"namespaces tcp, batch {batch}"
                        record(rnd, name, pool_run(args, cluster, "tcp", batch),
                               engine_across(args, cluster, batch))
                finally:
                    cluster.stop()
            finally:
                drop_namespaces()
    lines = ["| topology, blocks per lookup | pool GB/s | pool p50 lookup us | of which reads us | "
             "transfer engine GB/s | pool / engine | rounds |", "|---|---|---|---|---|---|---|"]
    for name, runs in results.items():
        pool = statistics.median(p["gbps"] for p, _ in runs)
        p50 = statistics.median(p["p50_us"] for p, _ in runs)
        reads = statistics.median(p["read_mean_us"] for p, _ in runs)
        engine = statistics.median(e["gbps"] for _, e in runs)
        ratio = statistics.median(p["gbps"] / e["gbps"] for p, e in runs)
        lines.append(f"| {name} | {pool:.2f} | {p50:.0f} | {reads:.0f} | {engine:.2f} | "
                     f"{ratio:.2f}x | {len(runs)} |")
    table = "\n".join(lines)
    print(f"Block {args.block_size} B, {args.duration:g} s per run, "
          f"medians of {args.rounds} round(s):\n\n{table}")
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({name: runs for name, runs in results.items()}, f, indent=1)


if __name__ == "__main__":
    main()
