"""Per-stage wall-time accounting, so a run shows where its time goes."""
from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager
from typing import Iterator


class StageTimer:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - start

    def take(self) -> dict[str, float]:
        """The totals so far, rounded for logs; resets the timer."""
        totals = {k: round(v, 4) for k, v in self.seconds.items()}
        self.seconds.clear()
        return totals
