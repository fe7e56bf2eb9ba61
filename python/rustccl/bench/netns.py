"""Two "hosts" on one machine: network namespaces joined by a veth pair,
optionally shaped with ``tc`` to a given link (needs root).

    with two_hosts(link="1gbit") as hosts:     # [Host(ns, dev, ip), Host(...)]
        subprocess.run(hosts[0].exec(["python", ...]))

Each host's egress goes through ``netem`` (delay, where the kernel has
it) and ``tbf`` (rate), so
traffic between the namespaces crosses a link of that speed in each
direction; traffic within a namespace (loopback, shared memory) is not
shaped. The namespaces are deleted on exit, whatever happens. Names carry
``prefix`` and the process id, so concurrent users do not collide.
"""

from __future__ import annotations

import contextlib
import os
import random
import subprocess
from dataclasses import dataclass

# name -> (rate, one-way delay, tbf burst)
LINKS = {
    "1gbit": ("1gbit", "0.2ms", "256kb"),
    "10gbit": ("10gbit", "0.2ms", "2mb"),
    "25gbit": ("25gbit", "0.2ms", "4mb"),
    "none": None,
}


class NetnsError(RuntimeError):
    pass


@dataclass
class Host:
    ns: str
    dev: str
    ip: str
    shaping: str = "unshaped"

    def exec(self, argv: list[str]) -> list[str]:
        """`argv` run inside this host's namespace."""
        return ["ip", "netns", "exec", self.ns, *argv]

    def tx_bytes(self) -> int:
        """Bytes this host has sent over its link (kernel counter)."""
        out = _sh("ip", "netns", "exec", self.ns, "cat", f"/sys/class/net/{self.dev}/statistics/tx_bytes")
        return int(out.stdout.strip())


def _sh(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), capture_output=True, text=True)


def _must(*args: str) -> None:
    r = _sh(*args)
    if r.returncode != 0:
        raise NetnsError(f"rustccl netns harness: `{' '.join(args)}` failed: {r.stderr.strip()}")


def shape(host: Host, link: str) -> str:
    """tbf rate (under netem delay where the kernel has netem) on the egress
    of `host`'s link end. Returns what was applied."""
    spec = LINKS[link]
    if spec is None:
        return "unshaped"
    rate, delay, burst = spec
    tc = ["ip", "netns", "exec", host.ns, "tc", "qdisc", "add", "dev", host.dev]
    tbf = ["tbf", "rate", rate, "burst", burst, "latency", "50ms"]
    r = _sh(*tc, "root", "handle", "1:", "netem", "delay", delay, "limit", "100000")
    if r.returncode == 0:
        _must(*tc, "parent", "1:", "handle", "2:", *tbf)
        return f"tbf {rate} + netem {delay}"
    _must(*tc, "root", "handle", "1:", *tbf)  # no sch_netem in this kernel: rate only
    return f"tbf {rate} (no netem in this kernel: no added delay)"


@contextlib.contextmanager
def two_hosts(link: str = "none", prefix: str = "rc"):
    """Yields two :class:`Host` objects joined by a veth pair shaped to
    `link` (a key of :data:`LINKS`). Raises NetnsError when namespaces
    cannot be made here (not root, no ``ip``)."""
    if link not in LINKS:
        raise ValueError(f"rustccl netns harness: unknown link {link!r} (known: {', '.join(LINKS)})")
    tag = f"{os.getpid()}{random.randint(0, 99):02d}"
    short = f"{os.getpid() % 100000}{random.randint(0, 99):02d}"
    names = [f"{prefix}{tag}{x}" for x in "ab"]
    devs = [f"rcv{short}{x}" for x in "ab"]  # interface names: at most 15 characters
    net = random.randint(16, 250)
    hosts = [Host(names[i], devs[i], f"10.232.{net}.{i + 1}") for i in range(2)]
    made: list[str] = []
    try:
        for h in hosts:
            _must("ip", "netns", "add", h.ns)
            made.append(h.ns)
        _must("ip", "link", "add", devs[0], "type", "veth", "peer", "name", devs[1])
        for h in hosts:
            _must("ip", "link", "set", h.dev, "netns", h.ns)
            _must("ip", "-n", h.ns, "addr", "add", f"{h.ip}/24", "dev", h.dev)
            _must("ip", "-n", h.ns, "link", "set", h.dev, "up")
            _must("ip", "-n", h.ns, "link", "set", "lo", "up")
            h.shaping = shape(h, link)
        yield hosts
    finally:
        for ns in made:
            _sh("ip", "netns", "del", ns)  # takes its end of the veth pair (and so the pair) with it


def available() -> str | None:
    """None when namespaces can be made here, else the reason."""
    if os.geteuid() != 0:
        return "needs root (ip netns)"
    probe = f"rcprobe{os.getpid()}"
    r = _sh("ip", "netns", "add", probe)
    if r.returncode != 0:
        return f"cannot create network namespaces here: {r.stderr.strip()}"
    _sh("ip", "netns", "del", probe)
    return None
