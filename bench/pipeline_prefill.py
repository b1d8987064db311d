#!/usr/bin/env python3
"""Chunked pipeline-parallel prefill: TTFT of one long prompt prefilled by two prefill workers
(each a range of layers, chunks flowing between them) against one prefill worker, same
threads per worker, same processes.

Topology ("two hosts", network namespaces joined by a veth pair; needs root, `ip` and etcd):
  host A: etcd, the decode worker, prefill worker 0, and two conductors over the same workers:
          one that pipelines prompts of at least --min-tokens, one that never does
  host B: prefill worker 1
Every worker moves KV over TCP only (--transfer-protocols tcp), so stage 1's KV and the
residual stream between the stages cross the veth pair. Each round sends one prompt of
--tokens tokens to each conductor in turn (a fresh prompt every time: no prefix cache hit), as a
stream with max_tokens 2; TTFT is measured at the client. The pipelined conductor's log line
gives the layer split, the bytes between stages and the longest wait of a stage for input.

    sudo python3 bench/pipeline_prefill.py --model models/gemma-3-270m-q4_k_m.gguf \\
        --tokens 32000 --rounds 3 --out bench/out/pipeline
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import two_hosts  # bench/, beside this script

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
NS_A, NS_B = f"tandem-ca-{os.getpid()}", f"tandem-cb-{os.getpid()}"
ADDR_A, ADDR_B = "10.233.0.1", "10.233.0.2"
ETCD_PORT, PEER_PORT = 23791, 23801
PORTS = {"pipelined": 8100, "one_worker": 8101}
TOKEN = "pipeline-bench-token-0123456789"


def log(msg):
    print(msg, file=sys.stderr, flush=True)


class Cluster:
    def __init__(self, args, tmp):
        self.args, self.tmp, self.procs, self.logs = args, tmp, [], {}
        two_hosts.make(NS_A, NS_B, ADDR_A, ADDR_B, dev="veth-pp")
        token_file = os.path.join(tmp, "token")
        with open(os.open(token_file, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
            f.write(TOKEN + "\n")
        self.start(NS_A, "etcd", *two_hosts.etcd_command(ADDR_A, ETCD_PORT, PEER_PORT,
                                                         os.path.join(tmp, "etcd")))
        etcd = f"etcd://{ADDR_A}:{ETCD_PORT}"
        kv = str(args.tokens + 4096)
        common = ["--metadata", etcd, "--model", args.model, "--threads", str(args.threads),
                  "--kv-cache-tokens", kv, "--transfer-protocols", "tcp", "--kv-pool", "off",
                  "--cluster-token-file", token_file]
        self.start(NS_A, "decode", args.tandem, "worker", "--role", "decode", "--name", "decode-a",
                   "--host", ADDR_A, *common)
        self.start(NS_A, "prefill-a", args.tandem, "worker", "--role", "prefill", "--name",
                   "prefill-a", "--host", ADDR_A, *common)
        self.start(NS_B, "prefill-b", args.tandem, "worker", "--role", "prefill", "--name",
                   "prefill-b", "--host", ADDR_B, *common)
        for name, port in PORTS.items():
            pipeline = ["--pipeline-min-tokens", str(args.min_tokens), "--pipeline-chunk-tokens",
                        str(args.chunk)] if name == "pipelined" else []
            self.start(NS_A, name, args.tandem, "conductor", "--metadata", etcd, "--model",
                       args.model, "--host", ADDR_A, "--port", str(port), "--max-model-len",
                       str(args.tokens + 64), "--no-local-prefill", "--request-timeout-s",
                       "3600", "--cluster-token-file", token_file, *pipeline)
        deadline = time.time() + 600  # workers may calibrate their cost model first
        while time.time() < deadline:
            if all(self.healthy_workers(port) == (2, 1) for port in PORTS.values()):
                return
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"a process exited:\n{self.tail_all()}")
            time.sleep(1)
        raise RuntimeError(f"the cluster did not come up:\n{self.tail_all()}")

    def start(self, ns, name, *cmd):
        path = os.path.join(self.tmp, name + ".log")
        self.logs[name] = path
        f = open(path, "w")
        self.procs.append(subprocess.Popen(["ip", "netns", "exec", ns, *cmd], stdout=f,
                                           stderr=subprocess.STDOUT))

    def log_of(self, name):
        with open(self.logs[name], errors="replace") as f:
            return f.read()

    def tail_all(self):
        return "\n".join(f"== {n}\n" + self.log_of(n)[-3000:] for n in self.logs)

    def curl(self, port, path, body=None, timeout=60, stream=False):
        cmd = ["ip", "netns", "exec", NS_A, "curl", "-sN" if stream else "-s", "-m", str(timeout),
               f"http://{ADDR_A}:{port}{path}"]
        if body is not None:
            cmd += ["-H", "Content-Type: application/json", "-d", "@-"]
        return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True), \
            json.dumps(body) if body is not None else None

    def get(self, port, path):
        p, _ = self.curl(port, path)
        out, _ = p.communicate(timeout=70)
        return out

    def healthy_workers(self, port):
        text = self.get(port, "/metrics")
        found = dict(re.findall(r'tandem_workers\{role="(\w+)",state="healthy"\} (\S+)', text))
        return int(float(found.get("prefill", 0))), int(float(found.get("decode", 0)))

    def ttft(self, port, prompt_ids):
        """Seconds from sending a streamed completion to its first token event."""
        body = {"prompt": prompt_ids, "max_tokens": 2, "temperature": 0, "ignore_eos": True,
                "stream": True}
        p, data = self.curl(port, "/v1/completions", body, timeout=3600, stream=True)
        start = time.time()
        p.stdin.write(data)
        p.stdin.close()
        first = None
        for line in p.stdout:
            if line.startswith("data: ") and '"text"' in line and first is None:
                first = time.time() - start
            if '"error"' in line:
                raise RuntimeError(line)
        p.wait()
        if first is None:
            raise RuntimeError("no token came back")
        return first

    def stop(self):
        two_hosts.stop(self.procs, timeout=30)
        two_hosts.drop(NS_A, NS_B)


def prompt_ids(cluster, n, tag):
    text = " ".join(f"Entry {k} ({tag}): the tide gauge read {k * 37 % 211} cm at dawn."
                    for k in range(n // 12 + 32))
    p, data = cluster.curl(PORTS["one_worker"], "/tokenize", {"prompt": f"{tag}. {text}"})
    out, _ = p.communicate(data, timeout=120)
    ids = json.loads(out)["tokens"]
    assert len(ids) >= n, len(ids)
    return ids[:n]


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tandem", default=os.path.join(ROOT, "build", "tandem"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "gemma-3-270m-q4_k_m.gguf"))
    ap.add_argument("--tokens", type=int, default=32000)
    ap.add_argument("--threads", type=int, default=1, help="per worker")
    ap.add_argument("--chunk", type=int, default=1024)
    ap.add_argument("--min-tokens", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None, help="directory for results.json and the logs")
    args = ap.parse_args()
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("etcd"):
        sys.exit("needs root, iproute2 and etcd (network namespaces)")
    tmp = tempfile.mkdtemp(prefix="tandem-pipeline-")
    cluster = Cluster(args, tmp)
    results = {"pipelined": [], "one_worker": []}
    try:
        for r in range(args.rounds):
            for name, port in PORTS.items():
                ids = prompt_ids(cluster, args.tokens, f"round {r} {name}")
                t = cluster.ttft(port, ids)
                results[name].append(t)
                log(f"round {r}: {name} TTFT {t:.2f} s")
        lines = re.findall(r"prefilled by a pipeline \((.*?)\) in chunks of (\d+): ([\d.]+) s "
                           r"\(predicted ([\d.]+) s; one worker ([\d.]+) s\), ([\d.]+) MiB between "
                           r"stages, a stage waited ([\d.]+) s", cluster.log_of("pipelined"))
        stages = re.findall(r"pipeline stage (\d) of 2 .*?: ([\d.]+) s computing, ([\d.]+) s "
                            r"waiting", cluster.log_of("prefill-a") + cluster.log_of("prefill-b"))
    finally:
        logs = {n: cluster.log_of(n) for n in cluster.logs}
        cluster.stop()
    pipe, one = statistics.median(results["pipelined"]), statistics.median(results["one_worker"])
    summary = {
        "tokens": args.tokens, "threads_per_worker": args.threads, "chunk": args.chunk,
        "rounds": args.rounds, "ttft_s": results,
        "median_ttft_s": {"pipelined": pipe, "one_worker": one}, "ratio": pipe / one,
        "pipeline_log": [{"layout": l[0], "prefill_s": float(l[2]), "predicted_s": float(l[3]),
                          "predicted_one_worker_s": float(l[4]), "stage_mib": float(l[5]),
                          "most_wait_s": float(l[6])} for l in lines],
        "stages": [{"stage": int(s[0]), "compute_s": float(s[1]), "wait_s": float(s[2])}
                   for s in stages],
    }
    print(json.dumps(summary, indent=1))
    print(f"\n{args.tokens}-token prompt, {args.threads} thread(s) per worker, chunks of "
          f"at most {args.chunk}: TTFT median {pipe:.2f} s on 2 prefill workers (pipelined) vs "
          f"{one:.2f} s on 1: ratio {pipe / one:.3f}")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "results.json"), "w") as f:
            json.dump(summary, f, indent=1)
        for n, text in logs.items():
            with open(os.path.join(args.out, n + ".log"), "w") as f:
                f.write(text)
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
