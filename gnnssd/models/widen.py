"""float16 input rows widened inside the model's first layer, and kept narrow for backward.

A float16 store's rows reach the built-in models as float16 x (the loader gathers and holds
half the bytes). The layer that takes them widens them to float32 for its arithmetic; the
float32 copy would stay alive until the backward pass through every tensor autograd saved
from it (a Linear saves its input), so those saved tensors are packed as views of the
float16 x and widened again when the backward pass unpacks them. Widening is exact, so
outputs and gradients are the ones float32 x gives, with a float32 copy of x alive only
while the layer's forward runs."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, TypeVar

import torch

Inputs = TypeVar("Inputs", torch.Tensor, dict)


class _HalfView:
    """A saved tensor packed as the same view of the float16 rows it was widened from."""

    def __init__(self, half: torch.Tensor, like: torch.Tensor):
        self.view = half.as_strided(like.size(), like.stride(), like.storage_offset())

    def unpack(self) -> torch.Tensor:
        return self.view.float()


@contextmanager
def widened(h: Inputs) -> Iterator[Inputs]:
    """`h` (a tensor, or a dict of them by node type) with its float16 tensors as float32;
    inside the block, autograd saves views of the float16 tensors in place of the float32
    copies. Tensors of other dtypes pass as they are; without float16, a no-op."""
    values = h.values() if isinstance(h, dict) else [h]
    if not any(isinstance(v, torch.Tensor) and v.dtype == torch.float16 for v in values):
        yield h
        return

    def wide(v: torch.Tensor) -> torch.Tensor:
        return v.float() if isinstance(v, torch.Tensor) and v.dtype == torch.float16 else v

    out = {k: wide(v) for k, v in h.items()} if isinstance(h, dict) else wide(h)
    pairs = zip(h.values(), out.values()) if isinstance(h, dict) else [(h, out)]
    # held until the block ends: no other tensor can take a widened copy's address meanwhile
    halves = {w.untyped_storage().data_ptr(): (half, w) for half, w in pairs if w is not half}

    def pack(t: torch.Tensor) -> torch.Tensor | _HalfView:
        found = halves.get(t.untyped_storage().data_ptr()) if t.dtype == torch.float32 else None
        if found is None or t.device != found[1].device:
            return t
        return _HalfView(found[0], t)

    def unpack(packed: torch.Tensor | _HalfView) -> torch.Tensor:
        return packed.unpack() if isinstance(packed, _HalfView) else packed

    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            yield out
    finally:
        halves.clear()  # every saved tensor keeps `pack` (and so this dict) alive
