#!/usr/bin/env python3
"""Transfer engine comparison on one host (loopback): `tandem transfer-bench` over TCP, shared
memory and UCX (if built) against the limits of the machine (memcpy, an iperf3 TCP stream) and
against Mooncake's transfer engine over TCP, at the same block and batch sizes. Each round runs
every configuration once, alternating; the table shows medians over the rounds in GB/s (1e9).

    apt-get install iperf3                                  # scripts/setup.sh does
    pip install mooncake-transfer-engine-non-cuda           # optional: the Mooncake column
    python3 bench/transfer_compare.py --rounds 3

Mooncake runs with its own transfer_engine_bench (shipped in the wheel), metadata in its
P2PHANDSHAKE mode (no metadata server), both processes on 127.0.0.1.
"""
import argparse
import json
import math
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict

KIB, MIB = 1024, 1024 * 1024
SIZE_NAMES = {64 * KIB: "64KiB", 256 * KIB: "256KiB", MIB: "1MiB", 4 * MIB: "4MiB",
              16 * MIB: "16MiB"}


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def parse_size(text):
    m = re.fullmatch(r"(\d+)\s*(KiB|MiB|GiB|K|M|G)?", text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"bad size '{text}'")
    scale = {"K": KIB, "KiB": KIB, "M": MIB, "MiB": MIB, "G": 1 << 30, "GiB": 1 << 30, None: 1}
    return int(m.group(1)) * scale[m.group(2)]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tandem_bench(args, protocol, block, env_extra=None):
    """GB/s of one `tandem transfer-bench` loopback run, or None if it failed."""
    cmd = [args.tandem, "transfer-bench", "--protocol", protocol, "--block-size", str(block),
           "--batch-size", str(args.batch_size), "--threads", str(args.threads),
           "--duration", str(args.duration), "--operation", args.operation, "--json"]
    env = dict(os.environ, **(env_extra or {}))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env,
                              timeout=args.duration + 60)
    except subprocess.TimeoutExpired:
        log(f"  tandem {protocol} {block}: timed out")
        return None
    if proc.returncode != 0:
        log(f"  tandem {protocol} {block}: exit {proc.returncode}: {proc.stderr.strip()[-300:]}")
        return None
    lines = [l for l in proc.stdout.splitlines() if l.startswith("{")]
    return json.loads(lines[-1])["gbps"] if lines else None


def ucx_built(args):
    proc = subprocess.run([args.tandem, "transfer-bench", "--protocol", "ucx", "--duration",
                           "0.2", "--block-size", "4KiB", "--json"],
                          capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, UCX_TLS="tcp"))
    return "built without UCX" not in proc.stderr


def iperf3_stream(args):
    """GB/s of one loopback TCP stream (iperf3, default write length), or None."""
    if shutil.which("iperf3") is None:
        return None
    port = free_port()
    server = subprocess.Popen(["iperf3", "-s", "-1", "-B", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        out = None
        for _ in range(50):  # the server needs a moment to listen
            proc = subprocess.run(["iperf3", "-c", "127.0.0.1", "-p", str(port), "-t",
                                   str(max(1, math.ceil(args.duration))), "-J"],
                                  capture_output=True, text=True, timeout=args.duration + 30)
            try:
                parsed = json.loads(proc.stdout)
            except json.JSONDecodeError:
                parsed = {}
            if proc.returncode == 0 and "sum_received" in parsed.get("end", {}):
                out = parsed
                break
            if server.poll() is not None:  # a one-off server ends after a failed test
                log(f"  iperf3: {parsed.get('error', proc.stderr.strip())}")
                return None
            time.sleep(0.1)
        if out is None:
            return None
        return out["end"]["sum_received"]["bits_per_second"] / 8 / 1e9
    finally:
        try:
            server.wait(timeout=5)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def mooncake_bench_binary():
    found = shutil.which("transfer_engine_bench")
    if found:
        return found
    try:
        import importlib.util
        spec = importlib.util.find_spec("mooncake")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for d in spec.submodule_search_locations:
        path = os.path.join(d, "transfer_engine_bench")
        if os.access(path, os.X_OK):
            return path
    return None


def mooncake_tcp(args, binary, block):
    """GB/s of Mooncake's transfer_engine_bench over TCP on loopback, or None."""
    buffer = max(256 * MIB, block * args.batch_size * args.threads)
    common = ["--metadata_server=P2PHANDSHAKE", "--protocol=tcp", f"--buffer_size={buffer}"]
    with tempfile.TemporaryDirectory() as tmp:
        target_log = open(os.path.join(tmp, "target.log"), "w+")
        target = subprocess.Popen(
            [binary, "--mode=target", f"--local_server_name=127.0.0.1:{free_port()}", *common],
            stdout=target_log, stderr=subprocess.STDOUT, cwd=tmp)
        try:
            # In P2PHANDSHAKE mode the segment is named by the RPC port the target picked.
            rpc = None
            for _ in range(100):
                target_log.seek(0)
                m = re.search(r"listening on (127\.0\.0\.1:\d+)", target_log.read())
                if m:
                    rpc = m.group(1)
                    break
                if target.poll() is not None:
                    break
                time.sleep(0.1)
            if rpc is None:
                log("  mooncake: target did not start")
                return None
            time.sleep(0.3)  # its segment is published right after
            proc = subprocess.run(
                [binary, "--mode=initiator", f"--local_server_name=127.0.0.1:{free_port()}",
                 f"--segment_id={rpc}", f"--block_size={block}",
                 f"--batch_size={args.batch_size}", f"--threads={args.threads}",
                 f"--duration={max(1, math.ceil(args.duration))}",
                 f"--operation={args.operation}", "--report_unit=GB", *common],
                capture_output=True, text=True, cwd=tmp, timeout=args.duration + 60)
            m = re.search(r"throughput ([0-9.]+) GB/s", proc.stdout + proc.stderr)
            if not m:
                log(f"  mooncake {block}: no throughput line (exit {proc.returncode})")
                return None
            return float(m.group(1))
        finally:
            target.terminate()
            try:
                target.wait(timeout=10)
            except subprocess.TimeoutExpired:
                target.kill()
                target.wait()
            target_log.close()


def fmt(v, digits=2):
    return "–" if v is None else f"{v:.{digits}f}"


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tandem", default="build/tandem", help="the tandem binary")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=3.0, help="seconds per run")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--operation", choices=["write", "read"], default="write")
    ap.add_argument("--sizes", default="64KiB,256KiB,1MiB,4MiB",
                    help="block sizes of every column (shm and memcpy add --shm-extra)")
    ap.add_argument("--shm-extra", default="16MiB", help="extra sizes for shm and memcpy")
    ap.add_argument("--no-mooncake", action="store_true")
    ap.add_argument("--no-ucx", action="store_true")
    ap.add_argument("--json-out", default="", help="write every measurement here")
    args = ap.parse_args()
    if args.rounds < 1 or args.duration <= 0 or args.batch_size < 1 or args.threads < 1:
        ap.error("--rounds, --duration, --batch-size and --threads must be positive")
    if not os.access(args.tandem, os.X_OK):
        ap.error(f"no tandem binary at {args.tandem} (build it, or pass --tandem)")
    sizes = [parse_size(s) for s in args.sizes.split(",") if s]
    extra = [parse_size(s) for s in args.shm_extra.split(",") if s]

    with_ucx = not args.no_ucx and ucx_built(args)
    mooncake = None if args.no_mooncake else mooncake_bench_binary()
    if not args.no_mooncake and mooncake is None:
        log("mooncake: transfer_engine_bench not found (pip install "
            "mooncake-transfer-engine-non-cuda); column skipped")

    runs = defaultdict(list)  # (column, block) -> [GB/s per round]
    for rnd in range(args.rounds):
        log(f"round {rnd + 1}/{args.rounds}")
        runs[("iperf3", 0)].append(iperf3_stream(args))
        for block in sizes + extra:
            big_only = block not in sizes
            columns = [("memcpy", lambda b: tandem_bench(args, "memcpy", b)),
                       ("shm", lambda b: tandem_bench(args, "shm", b))]
            if not big_only:
                columns.append(("tcp", lambda b: tandem_bench(args, "tcp", b)))
                if with_ucx:
                    columns.append(("ucx-tcp", lambda b: tandem_bench(
                        args, "ucx", b, {"UCX_TLS": "tcp"})))
                    columns.append(("ucx-sm", lambda b: tandem_bench(
                        args, "ucx", b, {"UCX_TLS": "sm,self"})))
                if mooncake:
                    columns.append(("mooncake-tcp", lambda b: mooncake_tcp(args, mooncake, b)))
            for name, run in columns:
                v = run(block)
                log(f"  {name:13s} {SIZE_NAMES.get(block, block):>7s}: {fmt(v, 3)} GB/s")
                runs[(name, block)].append(v)

    def med(col, block):
        vals = [v for v in runs.get((col, block), []) if v is not None]
        return statistics.median(vals) if vals else None

    iperf = med("iperf3", 0)
    lines = [
        f"Loopback, {args.operation}, batch {args.batch_size}, {args.threads} thread(s), "
        f"{args.duration:g} s per run, median of {args.rounds} round(s); GB/s = 1e9 B/s. "
        f"iperf3 single TCP stream: {fmt(iperf)} GB/s.",
        "",
        "| block | tandem tcp | tcp / iperf3 | Mooncake tcp | tcp / Mooncake | tandem shm | "
        "memcpy | shm / memcpy | tandem ucx (tcp) | tandem ucx (sm) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for block in sizes + extra:
        tcp, mc = med("tcp", block), med("mooncake-tcp", block)
        shm, mem = med("shm", block), med("memcpy", block)
        lines.append(
            f"| {SIZE_NAMES.get(block, block)} | {fmt(tcp)} | {fmt(ratio(tcp, iperf))} | "
            f"{fmt(mc)} | {fmt(ratio(tcp, mc))} | {fmt(shm)} | {fmt(mem)} | "
            f"{fmt(ratio(shm, mem))} | {fmt(med('ucx-tcp', block))} | "
            f"{fmt(med('ucx-sm', block))} |")
    lines.append("")
    lines.append("Targets: tcp >= 0.90 x iperf3 and >= 1.0 x Mooncake (64 KiB - 4 MiB); "
                 "shm >= 0.70 x memcpy (>= 1 MiB).")
    for block in sizes:
        tcp = med("tcp", block)
        r1, r2 = ratio(tcp, iperf), ratio(tcp, med("mooncake-tcp", block))
        lines.append(f"- {SIZE_NAMES.get(block, block)}: tcp/iperf3 {fmt(r1)} "
                     f"({'met' if r1 is not None and r1 >= 0.9 else 'missed'}), "
                     f"tcp/Mooncake {fmt(r2)} "
                     f"({'met' if r2 is not None and r2 >= 1.0 else 'missed'})")
    for block in sizes + extra:
        if block >= MIB:
            r = ratio(med("shm", block), med("memcpy", block))
            lines.append(f"- {SIZE_NAMES.get(block, block)}: shm/memcpy {fmt(r)} "
                         f"({'met' if r is not None and r >= 0.7 else 'missed'})")
    print("\n".join(lines))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"args": vars(args),
                       "runs": [{"column": c, "block": b, "gbps": v}
                                for (c, b), vs in runs.items() for v in vs]}, f, indent=1)


if __name__ == "__main__":
    main()
