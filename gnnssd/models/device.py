"""Whether a model can run on a device: on a GPU without DGL's CUDA build (PyPI's DGL is
CPU-only) only layers the compiler lowers to CSC blocks can, so any other layer is refused
when the model is built, naming it and the way out, not at the first mini-batch."""
from __future__ import annotations

import logging

import torch
from torch import nn

from gnnssd.compiler import CompiledLayer, LoweringError
from gnnssd.core import ConfigError, dgl_has_cuda

log = logging.getLogger("gnnssd")

COMPILED = ("write it as a DGL-style message/reduce layer that gnnssd.compile lowers (the built-in "
            "sage, gcn, gat, rgcn, rgat and mlp with model.compile: true are)")
WAYS_OUT = f"{COMPILED}, install DGL's CUDA build, or set device: cpu"
#: The ways out where the loader's blocks are CSC tensors (features: device).
CSC_WAYS_OUT = f"{COMPILED}, or use features: memory or ssd (DGL blocks)"


def check_device(model: nn.Module, device: torch.device, csc_blocks: bool = False) -> None:
    """Refuse a model that cannot run on `device`: on CUDA without DGL's CUDA build, or
    wherever the blocks are CSC tensors only (`csc_blocks`: features: device), every
    message-passing layer must be compiled and lowerable (ConfigError naming the layer)."""
    if not csc_blocks and (device.type != "cuda" or dgl_has_cuda()):
        return
    ways_out = CSC_WAYS_OUT if csc_blocks else WAYS_OUT
    for name, module in model.named_modules():
        if isinstance(module, CompiledLayer):
            try:
                module.check_lowerable()
            except LoweringError as err:
                raise ConfigError(f"model layer {name!r} cannot run on {device}: {err}; {ways_out}") from err
        elif type(module).__module__.startswith("dgl."):
            why = ("features: device gives CSC blocks (gnnssd.compiler.CSCBlock), sampled on the device" if csc_blocks
                   else f"this DGL cannot hold a graph on {device} (PyPI's DGL is CPU-only)")
            raise ConfigError(f"model layer {name!r} ({type(module).__module__}.{type(module).__name__}) runs "
                              f"only on DGL graphs, and {why}: {ways_out}")


def device_for(model: nn.Module, device: torch.device, preference: str, csc_blocks: bool = False) -> torch.device:
    """The device `model` trains on: `device` if it can run there; with `device: auto` the
    CPU otherwise (said in the log), with `device: cuda` or `csc_blocks` (where the CPU
    does not help) the refusal naming the layer."""
    try:
        check_device(model, device, csc_blocks)
    except ConfigError as err:
        if preference != "auto" or csc_blocks:
            raise
        log.warning("device: auto: %s; training on the CPU instead", err)
        return torch.device("cpu")
    return device
