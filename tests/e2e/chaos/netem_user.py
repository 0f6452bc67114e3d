"""netem in user space, for kernels without sch_netem: delay, jitter, loss, duplication and reordering of a
namespace's outgoing packets through an NFQUEUE (iptables) and the NetfilterQueue binding.

    ip netns exec NS python -m tests.e2e.chaos.netem_user --queue N --delay-ms 80 --jitter-ms 40 \
        --loss 0.05 --duplicate 0.05 --reorder 0.2 --seed S

Like `tc qdisc ... netem`, it acts on egress: the nemesis adds
`iptables -I OUTPUT ! -o lo -m mark ! --mark MARK -j NFQUEUE --queue-num N --queue-bypass` in the node's
namespace and starts this program there; deleting the rule (or the program dying: --queue-bypass) lets
traffic flow again. Each packet is, in this order of draws from a seeded generator:
  lost        with probability --loss (dropped: NF_DROP);
  duplicated  with probability --duplicate (a copy sent at once through a raw socket, marked so that
              it does not come back to the queue);
  reordered   with probability --reorder sent at once, overtaking the delayed ones (netem's
              `reorder P`: those go first, the rest wait the delay);
  delayed     otherwise by --delay-ms ± --jitter-ms (uniform), so jitter larger than the gap between
              packets reorders them too.
On SIGTERM or SIGINT it lets every held packet go, prints a JSON line of counts and exits 0.
Concurrency: one thread; the queue's callback only takes a verdict decision and parks the packet.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import random
import select
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import Any

MARK = 0x4E37  # packets this program sends itself (duplicates) carry it; the NFQUEUE rule skips them
SO_MARK = getattr(socket, "SO_MARK", 36)


@dataclass(frozen=True)
class Decision:
    drop: bool
    duplicate: bool
    delay_s: float  # 0: at once


@dataclass
class NetemModel:
    """What happens to each packet (pure: a seeded generator and the parameters)."""

    delay_ms: float
    jitter_ms: float
    loss: float
    duplicate: float
    reorder: float
    seed: int = 0
    rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        for name in ("loss", "duplicate", "reorder"):
            p = getattr(self, name)
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"{name} must be a probability in [0, 1], got {p}")
        if self.delay_ms < 0 or self.jitter_ms < 0 or self.jitter_ms > self.delay_ms:
            raise ValueError("need 0 <= jitter_ms <= delay_ms")
        self.rng = random.Random(self.seed)

    def decide(self) -> Decision:
        r = self.rng
        if r.random() < self.loss:
            return Decision(drop=True, duplicate=False, delay_s=0.0)
        dup = r.random() < self.duplicate
        if r.random() < self.reorder:
            return Decision(drop=False, duplicate=dup, delay_s=0.0)
        delay = self.delay_ms + r.uniform(-self.jitter_ms, self.jitter_ms)
        return Decision(drop=False, duplicate=dup, delay_s=max(0.0, delay) / 1000.0)


class UserNetem:
    """Owns the queue binding, the held packets and the raw socket for duplicates."""

    def __init__(self, model: NetemModel, queue_num: int) -> None:
        from netfilterqueue import NetfilterQueue  # type: ignore[import-not-found]

        self.model = model
        self.queue = NetfilterQueue()
        self.queue.bind(queue_num, self._on_packet, max_len=20000)
        self.fd = socket.fromfd(self.queue.get_fd(), socket.AF_UNIX, socket.SOCK_STREAM)
        self.raw = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
        self.raw.setsockopt(socket.SOL_SOCKET, SO_MARK, MARK)
        self.held: list[tuple[float, int, Any]] = []
        self.seq = itertools.count()
        self.counts = {"packets": 0, "lost": 0, "duplicated": 0, "reordered": 0, "delayed": 0}
        self.stopping = False

    def _on_packet(self, pkt: Any) -> None:
        d = self.model.decide()
        self.counts["packets"] += 1
        if d.drop:
            self.counts["lost"] += 1
            pkt.drop()
            return
        if d.duplicate:
            payload = pkt.get_payload()
            dst = socket.inet_ntoa(payload[16:20])
            try:
                self.raw.sendto(payload, (dst, 0))
                self.counts["duplicated"] += 1
            except OSError:
                pass
        if d.delay_s == 0.0:
            self.counts["reordered"] += 1
            pkt.accept()
            return
        self.counts["delayed"] += 1
        heapq.heappush(self.held, (time.monotonic() + d.delay_s, next(self.seq), pkt))

    def _release_due(self, now: float) -> None:
        while self.held and (self.stopping or self.held[0][0] <= now):
            heapq.heappop(self.held)[2].accept()

    def run(self) -> dict[str, int]:
        while not self.stopping:
            timeout = 0.05 if not self.held else max(0.0, min(0.05, self.held[0][0] - time.monotonic()))
            try:
                ready, _, _ = select.select([self.fd], [], [], timeout)
            except InterruptedError:
                ready = []
            if ready:
                self.queue.run(block=False)
            self._release_due(time.monotonic())
        self._release_due(float("inf"))
        self.queue.unbind()
        return self.counts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="netem_user", description=__doc__.splitlines()[0])
    ap.add_argument("--queue", type=int, required=True)
    ap.add_argument("--delay-ms", type=float, default=80)
    ap.add_argument("--jitter-ms", type=float, default=40)
    ap.add_argument("--loss", type=float, default=0.05)
    ap.add_argument("--duplicate", type=float, default=0.05)
    ap.add_argument("--reorder", type=float, default=0.2)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    try:
        model = NetemModel(a.delay_ms, a.jitter_ms, a.loss, a.duplicate, a.reorder, a.seed)
    except ValueError as exc:
        ap.error(str(exc))
    netem = UserNetem(model, a.queue)

    def stop(*_: Any) -> None:
        netem.stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print("NETEM READY", flush=True)
    counts = netem.run()
    print(json.dumps(counts), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
