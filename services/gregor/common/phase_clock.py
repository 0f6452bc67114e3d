"""Wall time per phase of a multi-step operation, for its log lines ("read 0.12 s, decide 0.30 s, ...")."""

from __future__ import annotations

import logging
import time


class PhaseClock:
    """Laps of a multi-step operation (a controller failover, a broker's shutdown).

    With a logger, each lap is logged at INFO as it ends, formatted by `what` with the phase's name and
    seconds (the broker's stop: "[Broker id=1] gRPC server shut down in 0.012 s"), so a process killed half
    way still says how far it got and where the time went.
    """

    def __init__(self, logger: logging.Logger | None = None, what: str = "{phase} done in {seconds:.3f} s") -> None:
        self._start = self._last = time.monotonic()
        self.laps: list[tuple[str, float]] = []
        self._log = logger
        self._what = what

    def lap(self, name: str) -> float:
        """End the current phase as `name`; returns its seconds."""
        now = time.monotonic()
        seconds = now - self._last
        self.laps.append((name, seconds))
        self._last = now
        if self._log is not None:
            self._log.info(self._what.format(phase=name, seconds=seconds))
        return seconds

    @property
    def total(self) -> float:
        return self._last - self._start

    def __str__(self) -> str:
        return f"{self.total:.3f} s (" + ", ".join(f"{name} {s:.3f}" for name, s in self.laps) + ")"
