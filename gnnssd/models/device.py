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

WAYS_OUT = ("write it as a DGL-style message/reduce layer that gnnssd.compile lowers (the built-in "
            "sage, gcn, gat, rgcn, rgat and mlp with model.compile: true are), install DGL's CUDA build, or set device: cpu")


def check_device(model: nn.Module, device: torch.device) -> None:
    """Refuse a model that cannot run on `device`: on CUDA without DGL's CUDA build, every
    message-passing layer must be compiled and lowerable (ConfigError naming the layer)."""
    if device.type != "cuda" or dgl_has_cuda():
        return
    for name, module in model.named_modules():
        if isinstance(module, CompiledLayer):
            try:
                module.check_lowerable()
            except LoweringError as err:
                raise ConfigError(f"model layer {name!r} cannot run on {device}: {err}; {WAYS_OUT}") from err
        elif type(module).__module__.startswith("dgl."):
            raise ConfigError(f"model layer {name!r} ({type(module).__module__}.{type(module).__name__}) runs "
                              f"only on DGL graphs, and this DGL cannot hold a graph on {device} (PyPI's DGL "
                              f"is CPU-only): {WAYS_OUT}")


def device_for(model: nn.Module, device: torch.device, preference: str) -> torch.device:
    """The device `model` trains on: `device` if it can run there; with `device: auto` the
    CPU otherwise (said in the log), with `device: cuda` the refusal naming the layer."""
    try:
        check_device(model, device)
    except ConfigError as err:
        if preference != "auto":
            raise
        log.warning("device: auto: %s; training on the CPU instead", err)
        return torch.device("cpu")
    return device
