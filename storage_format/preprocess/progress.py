"""The resume record of an unfinished store: which steps and files are on disk.

`progress.json` in the `.NAME.partial` folder maps a step or file name to its state
(rows written, size, CRC-32, done, ...). A step records itself only once its output is
durable, so a preprocess killed at any point redoes at most the step it was in (and the
long steps record their progress chunk by chunk).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ..atomic import atomic_write_json
from ..small_files import read_small_json

PROGRESS = "progress.json"
#: The state of a file or step nothing has been recorded for.
NOTHING = {"rows": 0, "size": 0, "crc32": 0, "done": 0}


def record(partial: Path, name: str, state: dict[str, Any]) -> None:
    progress = read_small_json(partial / PROGRESS)
    progress["files"][name] = state
    atomic_write_json(partial / PROGRESS, progress, into_store=True)


def state_of(partial: Path, name: str) -> dict[str, Any]:
    progress = read_small_json(partial / PROGRESS)
    return progress["files"].get(name, dict(NOTHING))
