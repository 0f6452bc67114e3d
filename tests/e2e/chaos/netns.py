"""Linux network namespaces for the chaos suite: one bridge, one namespace per node, veth pairs between.

Everything this module creates is named with PREFIX (namespaces `gch-<node>`, the bridge `gchbr0`,
host-side veths `gchv<n>`), so `cleanup()` finds and removes whatever a killed run left behind: the
processes inside those namespaces (by the pids `ip netns pids` lists), the namespaces, the links.
The subnet (10.77.0.0/24 by default) exists only on that bridge. Needs root (CI runs as root).

Faults that act on the network run inside a node's namespace, so they never touch the host's rules:
iptables INPUT drops per peer address (partitions, one-way loss) and, for latency, jitter, loss, duplication
and reordering, `tc netem` on the node's eth0 where the kernel has sch_netem, otherwise the same faults in
user space (netem_user.py: an NFQUEUE on the node's OUTPUT chain and the NetfilterQueue binding).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
from dataclasses import dataclass, field

PREFIX = "gch"
BRIDGE = f"{PREFIX}br0"
SMALL_FS_MARK = f"{PREFIX}small"  # in the path of the small log filesystem (the disk-full fault)


class CapabilityError(RuntimeError):
    """The machine lacks something the suite needs (root, ip, iptables, a kernel feature): says which."""


# One run at a time owns everything named with PREFIX: a run holds an flock on LOCK_PATH from Network.up() to
# down(), and cleanup() works only while this process holds it (taking it for the call when free). A second run,
# the netem tests or `python -m tests.e2e.chaos.netns` started meanwhile used to remove the first run's namespaces
# under it; now they stop with Busy. The kernel drops the lock of a killed run, so its leftovers are still removed.
LOCK_PATH = os.path.join("/run/lock" if os.path.isdir("/run/lock") else "/tmp", "gregor-chaos.lock")
_lock_fd: int | None = None


class Busy(RuntimeError):
    """Another process's chaos run holds the network namespaces."""


def acquire_lock() -> None:
    """Hold LOCK_PATH for this process (Busy, naming the holder, if another process has it)."""
    global _lock_fd
    if _lock_fd is not None:
        return
    fd = os.open(LOCK_PATH, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise Busy(f"another chaos run (pid {holder}) holds the network namespaces ({LOCK_PATH}): wait for it to end "
                   f"or stop it; its namespaces are left alone") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    _lock_fd = fd


def release_lock() -> None:
    global _lock_fd
    if _lock_fd is not None:
        os.close(_lock_fd)  # closing drops the flock
        _lock_fd = None


def run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(list(cmd), capture_output=True, text=True)
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({res.returncode}): {res.stderr.strip()}")
    return res


def ns_name(node: str) -> str:
    return f"{PREFIX}-{node}"


def netns_exec(node: str, *cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return run("ip", "netns", "exec", ns_name(node), *cmd, check=check)


def require_capabilities() -> dict[str, bool]:
    """Raise CapabilityError naming what is missing; return the features ({"netem": bool}: the kernel's
    sch_netem; without it, NFQUEUE and the NetfilterQueue binding must work, for netem_user.py)."""
    if os.geteuid() != 0:
        raise CapabilityError("the chaos suite needs root (network namespaces, veth, iptables): run it as root")
    for tool, package in (("ip", "iproute2"), ("iptables", "iptables"), ("tc", "iproute2")):
        if shutil.which(tool) is None:
            raise CapabilityError(f"`{tool}` not found: install Debian's {package} package")
    probe = f"{PREFIX}-probe"
    run("ip", "netns", "del", probe, check=False)
    res = run("ip", "netns", "add", probe, check=False)
    if res.returncode != 0:
        raise CapabilityError(f"cannot create a network namespace ({res.stderr.strip()}): needs CAP_SYS_ADMIN")
    try:
        ipt = run("ip", "netns", "exec", probe, "iptables", "-A", "INPUT", "-m", "statistic", "--mode", "random",
                  "--probability", "0.5", "-j", "DROP", check=False)
        if ipt.returncode != 0:
            raise CapabilityError(f"iptables does not work in a namespace ({ipt.stderr.strip()}): needs CAP_NET_ADMIN "
                                  "and the kernel's netfilter (nf_tables or ip_tables)")
        netem = run("ip", "netns", "exec", probe, "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms",
                    check=False).returncode == 0
        if not netem:
            nfq = run("ip", "netns", "exec", probe, "iptables", "-A", "OUTPUT", "-j", "NFQUEUE", "--queue-num", "1",
                      "--queue-bypass", check=False)
            if nfq.returncode != 0:
                raise CapabilityError(f"the kernel has neither sch_netem nor iptables NFQUEUE ({nfq.stderr.strip()})")
            try:
                import netfilterqueue  # type: ignore[import-not-found]  # noqa: F401
            except ImportError as exc:
                raise CapabilityError(f"no sch_netem in this kernel and the NetfilterQueue binding is missing ({exc}):"
                                      " `make chaos-deps` installs it (Debian's libnetfilter-queue-dev, then pip)")
    finally:
        run("ip", "netns", "del", probe, check=False)
    return {"netem": netem}


@dataclass
class Node:
    name: str
    ip: str
    veth: str


@dataclass
class Network:
    """The bridge and the namespaces of one run. Single owner: the orchestrator's thread."""

    subnet: str = "10.77.0"  # a /24 that exists only on BRIDGE
    nodes: dict[str, Node] = field(default_factory=dict)
    _next_host: int = 10

    def up(self) -> None:
        acquire_lock()
        cleanup()
        run("ip", "link", "add", BRIDGE, "type", "bridge")
        run("ip", "addr", "add", f"{self.subnet}.1/24", "dev", BRIDGE)
        run("ip", "link", "set", BRIDGE, "up")

    def add(self, name: str) -> Node:
        """A namespace with one interface, eth0, at the next address of the subnet, joined to the bridge."""
        ip = f"{self.subnet}.{self._next_host}"
        veth = f"{PREFIX}v{self._next_host}"
        self._next_host += 1
        ns = ns_name(name)
        run("ip", "netns", "add", ns)
        run("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        run("ip", "link", "set", veth, "master", BRIDGE, "up")
        run("ip", "netns", "exec", ns, "ip", "addr", "add", f"{ip}/24", "dev", "eth0")
        run("ip", "netns", "exec", ns, "ip", "link", "set", "eth0", "up")
        run("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        node = Node(name, ip, veth)
        self.nodes[name] = node
        return node

    # --- network faults, each inside one node's namespace --------------------------------------------------

    def drop_from(self, node: str, peers: list[str]) -> None:
        """node stops receiving anything from peers (a one-way cut; apply on both sides for a full one)."""
        for peer in peers:
            netns_exec(node, "iptables", "-A", "INPUT", "-s", self.nodes[peer].ip, "-j", "DROP")

    def lossy(self, node: str, probability: float) -> None:
        netns_exec(node, "iptables", "-A", "INPUT", "-m", "statistic", "--mode", "random",
                   "--probability", f"{probability:.3f}", "-j", "DROP")

    def heal_filters(self, node: str) -> None:
        netns_exec(node, "iptables", "-F", "INPUT", check=False)
        netns_exec(node, "iptables", "-F", "OUTPUT", check=False)

    def queue_egress(self, node: str, queue_num: int, skip_mark: int) -> None:
        """node's outgoing packets (not loopback, not marked skip_mark) go to NFQUEUE queue_num; they flow
        untouched while no program listens on it (--queue-bypass)."""
        netns_exec(node, "iptables", "-I", "OUTPUT", "!", "-o", "lo", "-m", "mark", "!", "--mark", hex(skip_mark),
                   "-j", "NFQUEUE", "--queue-num", str(queue_num), "--queue-bypass")

    def qdisc(self, node: str, *spec: str) -> None:
        netns_exec(node, "tc", "qdisc", "replace", "dev", "eth0", "root", *spec)

    def heal_qdisc(self, node: str) -> None:
        netns_exec(node, "tc", "qdisc", "del", "dev", "eth0", "root", check=False)

    def heal_all(self) -> None:
        for name in self.nodes:
            self.heal_filters(name)
            self.heal_qdisc(name)

    def down(self) -> None:
        cleanup()
        self.nodes.clear()
        release_lock()


def our_namespaces() -> list[str]:
    out = run("ip", "netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.split() and line.split()[0].startswith(PREFIX + "-")]


def cleanup() -> list[str]:
    """Remove every namespace, process in one, link and small-filesystem mount named with PREFIX; returns
    what it removed. Mounts are unmounted lazily (-l), so a file a process still holds cannot stop it. Busy if
    another process's run holds the lock (its namespaces are not leftovers)."""
    if _lock_fd is not None:
        return _remove_ours()
    acquire_lock()
    try:
        return _remove_ours()
    finally:
        release_lock()


def _remove_ours() -> list[str]:
    removed = []
    try:
        with open("/proc/mounts") as f:
            mounts = [line.split()[1] for line in f if SMALL_FS_MARK in line.split()[1]]
    except OSError:
        mounts = []
    for m in mounts:
        run("umount", "-l", m, check=False)
        removed.append(m)
    for ns in our_namespaces():
        pids = run("ip", "netns", "pids", ns, check=False).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGCONT)
                os.kill(int(pid), signal.SIGKILL)
            except (OSError, ValueError):
                pass
        run("ip", "netns", "del", ns, check=False)
        removed.append(ns)
    links = run("ip", "-o", "link", "show", check=False).stdout
    for line in links.splitlines():
        parts = line.split(":")
        if len(parts) > 1:
            name = parts[1].strip().split("@")[0]
            if name.startswith(PREFIX):
                run("ip", "link", "del", name, check=False)
                removed.append(name)
    return removed


if __name__ == "__main__":  # `python -m tests.e2e.chaos.netns`: remove leftovers of a killed run
    try:
        gone = cleanup()
    except Busy as exc:
        raise SystemExit(f"not removed: {exc}") from None
    print("removed: " + (", ".join(gone) if gone else "nothing"))
