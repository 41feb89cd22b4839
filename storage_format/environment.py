"""The one reader of the process environment variables gnnssd acts on (GNNSSD_*, torchrun's
RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, and numba's
NUMBA_NUM_THREADS, which numba itself reads as it is imported): each value is checked
against its type and range, and a bad one is an error naming the variable, its value and
what was expected, before torch, DGL or numba meet it (RANK=0 WORLD_SIZE=0 crashed torch's
store creation; NUMBA_NUM_THREADS=0 failed numba's import with a traceback).

Standard library only: storage_format's __init__ checks NUMBA_NUM_THREADS with it before
anything imports numba.
"""
from __future__ import annotations

import math
import os


class EnvironmentVariableError(ValueError):
    """An environment variable's value is not one gnnssd (or a library it drives) can use."""


#: Characters of a variable's value quoted in an error (a value may be any length).
_SHOWN = 100
#: The most threads a numba pool may be asked for (numba starts them all at its first kernel).
MAX_NUMBA_THREADS = 1 << 12


def _raw(name: str) -> str | None:
    return os.environ.get(name)


def _refused(name: str, raw: str, expected: str) -> EnvironmentVariableError:
    value = raw if len(raw) <= _SHOWN else f"{raw[:_SHOWN]}..."
    return EnvironmentVariableError(f"environment variable {name}={value!r}: expected {expected}")


def env_int(name: str, default: int | None, low: int, high: int, why: str = "") -> int:
    """The integer `name` holds, from `low` to `high` (`why`: what sets that range, for the
    error); `default` when unset (None: required)."""
    raw = _raw(name)
    expected = f"an integer from {low:,} to {high:,}{f' ({why})' if why else ''}"
    if raw is None:
        if default is None:
            raise EnvironmentVariableError(f"environment variable {name} is not set; expected {expected}")
        return default
    text = raw.strip()
    if not (text.lstrip("+-").isdigit() and text.isascii() and len(text) <= 20):
        raise _refused(name, raw, expected)
    value = int(text)
    if not low <= value <= high:
        raise _refused(name, raw, expected)
    return value


def env_seconds(name: str, default: float, low: float, high: float) -> float:
    """The finite number of seconds `name` holds, from `low` to `high`; `default` when unset."""
    raw = _raw(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and low <= value <= high):
        raise _refused(name, raw, f"a number of seconds from {low:g} to {high:,g}")
    return value


def env_text(name: str) -> str:
    """The non-empty text `name` must hold (a host name, ...)."""
    raw = _raw(name)
    if raw is None or not raw.strip():
        raise EnvironmentVariableError(f"environment variable {name} is {'not set' if raw is None else 'empty'}; "
                                       "expected a value")
    return raw


def env_optional(name: str) -> str | None:
    """The value of `name`, or None where it is unset or empty (a default then applies)."""
    raw = _raw(name)
    return raw if raw else None


def check_numba_threads() -> None:
    """NUMBA_NUM_THREADS, if set, is a thread count numba accepts (numba fails its own import
    on 0 or a word, with a traceback that does not name the variable)."""
    env_int("NUMBA_NUM_THREADS", 1, 1, MAX_NUMBA_THREADS)
