"""The host-to-GPU copy of a mini-batch: pinned sources, a copy stream, one event.

A mini-batch is copied on its own CUDA stream as soon as the loader has it, and the compute
stream is told to wait for that copy's event: work already queued on the compute stream
(the previous mini-batch's step) runs on while the copy proceeds, and nothing queued later
reads the tensors before they have arrived. Sources are pinned (page-locked) so the copy is
asynchronous; a backend may hand pinned buffers it recycles: before each copy the previous
one is waited for on the host, so a buffer whose copy was issued two mini-batches ago is
free again (a pool of three or more buffers never overwrites a copy in flight). Float16
rows travel as float16 and are widened to float32 on the GPU.
"""
from __future__ import annotations

from typing import Any

import torch

from gnnssd.compiler import CSCBlock, TypedCSCBlock

_STREAMS: dict[torch.device, torch.cuda.Stream] = {}
_LAST_COPY: dict[torch.device, torch.cuda.Event] = {}


def copy_stream(device: torch.device) -> torch.cuda.Stream:
    """The stream that carries mini-batches to `device` (one per GPU)."""
    if device not in _STREAMS:
        _STREAMS[device] = torch.cuda.Stream(device)
    return _STREAMS[device]


def _pinned(t: torch.Tensor) -> torch.Tensor:
    return t if t.is_pinned() else t.pin_memory()


class DeviceCopy:
    """The copies of one mini-batch to one GPU: `move` each value inside the `with`."""

    def __init__(self, device: torch.device):
        self.device = device
        self.stream = copy_stream(device)
        self.moved: list[torch.Tensor] = []

    def __enter__(self) -> DeviceCopy:
        previous = _LAST_COPY.get(self.device)
        if previous is not None:
            previous.synchronize()  # its pinned sources may be reused from here on
        self._context = torch.cuda.stream(self.stream)
        self._context.__enter__()
        return self

    def move(self, value: Any, widen: bool = False) -> Any:
        """A tensor, or a dict or list of them, copied to the device (`widen`: float16 to float32)."""
        if isinstance(value, dict):
            return {k: self.move(v, widen) for k, v in value.items()}
        if isinstance(value, list):
            return [self.move(v, widen) for v in value]
        if isinstance(value, (CSCBlock, TypedCSCBlock)):
            return value.map(self.move)
        if value.is_cuda:  # assembled on a GPU (the ssd loader's device gather): no host copy
            value = value.to(self.device)
            return value.float() if widen and value.dtype == torch.float16 else value
        moved = _pinned(value).to(self.device, non_blocking=True)
        if widen and moved.dtype == torch.float16:
            moved = moved.float()
        self.moved.append(moved)
        return moved

    def __exit__(self, *exc: Any) -> None:
        self._context.__exit__(*exc)
        event = torch.cuda.Event()
        event.record(self.stream)
        compute = torch.cuda.current_stream(self.device)
        compute.wait_event(event)
        for tensor in self.moved:  # the allocator keeps them until the compute stream is done
            tensor.record_stream(compute)
        _LAST_COPY[self.device] = event
