"""int8 feature rows: each row stored as 8-bit codes with its own float32 scale and offset.

A row x becomes q = round((x - min) / scale) - 128 with scale = (max - min) / 255, and is
read back as q * scale + offset (offset = min + 128 * scale): every value within scale / 2
of the original (plus float32 rounding). A row costs dim bytes in features.bin instead of
4 * dim, and 8 bytes in the sidecar (features.scale: (scale, offset) per row, float32 LE).
"""
from __future__ import annotations

import numpy as np

LEVELS = 255  # int8 codes -128..127


def quantize_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(int8 codes (rows, dim), float32 (rows, 2) scale and offset) of float rows `x`."""
    x = np.asarray(x, dtype=np.float32)
    low, high = x.min(axis=1, keepdims=True), x.max(axis=1, keepdims=True)
    scale = (high - low) / LEVELS
    step = np.where(scale > 0, scale, 1.0).astype(np.float32)  # a constant row: all codes -128
    codes = np.rint((x - low) / step) - 128
    params = np.hstack([scale, low + 128 * scale]).astype(np.float32)
    return np.clip(codes, -128, 127).astype(np.int8), params


def dequantize_rows(codes: np.ndarray, params: np.ndarray) -> np.ndarray:
    """float32 rows from int8 `codes` and their (scale, offset) `params` (rows, 2)."""
    params = np.asarray(params, dtype=np.float32)
    out = codes.astype(np.float32)
    out *= params[:, :1]
    out += params[:, 1:]
    return out
