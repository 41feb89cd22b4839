"""Per-stage wall-time accounting, so a run shows where its time goes."""
from __future__ import annotations

import threading
import time
from collections import defaultdict
from contextlib import contextmanager
from typing import Iterator


class StageTimer:
    """Seconds per named stage; pipeline threads add to it concurrently."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self._lock = threading.Lock()

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - start)

    def add(self, name: str, seconds: float) -> None:
        with self._lock:
            self.seconds[name] += seconds

    def take(self) -> dict[str, float]:
        """The totals so far, rounded for logs; resets the timer."""
        with self._lock:
            totals = {k: round(v, 4) for k, v in self.seconds.items()}
            self.seconds.clear()
        return totals
