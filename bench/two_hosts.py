"""Two "hosts" on one machine, for the benchmarks that need a real network between processes:
two network namespaces joined by a veth pair (needs root and iproute2), and the stopping of the
processes started in them."""
import subprocess


def _sh(*args):
    subprocess.run(args, check=True, capture_output=True)


def make(ns_a, ns_b, addr_a, addr_b, dev="veth-t"):
    """Creates ns_a and ns_b, joined by a veth pair (addr_a/24 in ns_a, addr_b/24 in ns_b),
    loopback up in both."""
    _sh("ip", "netns", "add", ns_a)
    _sh("ip", "netns", "add", ns_b)
    _sh("ip", "link", "add", dev + "a", "netns", ns_a, "type", "veth", "peer", "name", dev + "b",
        "netns", ns_b)
    for ns, end, addr in ((ns_a, dev + "a", addr_a), (ns_b, dev + "b", addr_b)):
        _sh("ip", "-n", ns, "addr", "add", addr + "/24", "dev", end)
        _sh("ip", "-n", ns, "link", "set", end, "up")
        _sh("ip", "-n", ns, "link", "set", "lo", "up")


def etcd_command(host, client_port, peer_port, data_dir):
    """The command line of a one-member etcd serving clients on host:client_port."""
    return ["etcd", "--data-dir", data_dir,
            "--listen-client-urls", f"http://{host}:{client_port}",
            "--advertise-client-urls", f"http://{host}:{client_port}",
            "--listen-peer-urls", f"http://{host}:{peer_port}",
            "--initial-advertise-peer-urls", f"http://{host}:{peer_port}",
            "--initial-cluster", f"default=http://{host}:{peer_port}"]


def drop(*namespaces):
    """Deletes the namespaces (their veth ends go with them); missing ones are ignored."""
    for ns in namespaces:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def stop(procs, timeout=10):
    """SIGTERM to each running process (last started first), SIGKILL after `timeout` s."""
    for p in reversed(procs):
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
