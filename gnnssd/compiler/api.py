"""``compile(layer)``: capture, annotate, rewrite and lower a DGL-style layer.

The compiled module shares the layer's submodules and parameters (same names, same
objects). Programs are specialised per (block or whole graph, pair or single input,
training mode) and built on first use from that call's real inputs, whose shapes the
passes consult. Whatever cannot be captured runs as plain DGL, with a warning, on a DGL
graph; on a CSCBlock (a GPU without DGL's CUDA build) there is no plain DGL to fall back
to, so it is refused naming what could not be captured: `check_lowerable()` asks that
before the first mini-batch.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import dgl
import torch
from torch import fx, nn

from gnnssd.compiler.annotate import annotate, propagate_shapes
from gnnssd.compiler.block import CSCBlock, few_edges
from gnnssd.compiler.capture import capture, trace_layer
from gnnssd.compiler.errors import CaptureError, LoweringError
from gnnssd.compiler.passes import Pass, run_passes
from gnnssd.compiler.passes.aggregate_order import linear_before_aggregate
from gnnssd.compiler.passes.cleanup import cse, cse_prefix_rows, dce
from gnnssd.compiler.passes.fuse import fuse_sddmm, fuse_spmm
from gnnssd.compiler.passes.fuse_attention import fuse_attention
from gnnssd.compiler.passes.hoist import hoist_nodewise
from gnnssd.compiler.passes.mailbox import MAILBOX_PASSES
from gnnssd.compiler.passes.split_concat import split_concat_linear
from gnnssd.compiler.printer import format_mpdfg

LEVELS = ("lower", "reorder", "fuse")


def default_passes(level: str = "fuse", kernels: bool = True) -> list[Pass]:
    """Passes run after the mailbox rewrite for an optimisation ``level``.

    ``lower``: no rewrites beyond DCE; ``reorder``: + concat splitting, node-wise
    hoisting, CSE (also across a block's destination prefix), linear-before-aggregate; ``fuse``: + g-SpMM/g-SDDMM fusion and
    (``kernels``) the fused attention kernel.
    """
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
    passes: list[Pass] = [dce]
    if level in ("reorder", "fuse"):
        passes += [split_concat_linear, hoist_nodewise, cse, cse_prefix_rows,
                   linear_before_aggregate, dce]
    if level == "fuse":
        passes += [fuse_spmm, fuse_sddmm, dce]
        if kernels:
            passes += [fuse_attention, dce]
    return passes


@dataclass
class Program:
    """One specialisation: the captured and the optimised MP-DFG (or why it fell back)."""

    captured: str = ""
    optimised: str = ""
    module: fx.GraphModule | None = None
    fallback_reason: str | None = None


class CompiledLayer(nn.Module):
    """A layer whose message passing runs as an optimised MP-DFG."""

    def __init__(self, layer: nn.Module, level: str = "fuse", kernels: bool = True):
        super().__init__()
        default_passes(level, kernels)  # validate early
        object.__setattr__(self, "_layer", layer)
        self._modules = layer._modules
        self._parameters = layer._parameters
        self._buffers = layer._buffers
        self.level, self.kernels = level, kernels
        self._programs: dict = {}

    @property
    def layer(self) -> nn.Module:
        """The original (uncompiled) layer."""
        return self._layer

    def train(self, mode: bool = True) -> "CompiledLayer":
        self._layer.train(mode)  # the layer's own flag, which its forward may read
        return super().train(mode)

    def _trace_entry(self, graph, feat_src, feat_dst):
        return trace_layer(self._layer, graph, feat_src, feat_dst)

    def forward(self, graph: dgl.DGLGraph, feat):
        pair = isinstance(feat, tuple)
        key = (graph.is_block, pair, self.training)
        program = self._programs.get(key)
        if program is None:
            program = self._programs[key] = self._build(graph, feat, *key)
        if program.module is None:
            if isinstance(graph, CSCBlock):
                raise LoweringError(f"gnnssd.compile: {type(self._layer).__name__} cannot run on a CSCBlock "
                                    f"(no DGL to fall back to): {program.fallback_reason}")
            return self._layer(graph, feat)
        return program.module(graph, *(feat if pair else (feat, None)))

    def check_lowerable(self) -> None:
        """Capture the layer for a block with a (source, destination) input, as a model's
        layers run: raises LoweringError naming the op when it cannot be compiled, which on
        a CSCBlock means it cannot run at all."""
        try:
            gm = capture(self, True, True)
            annotate(gm.graph)
            run_passes(gm, MAILBOX_PASSES)
        except Exception as err:  # noqa: BLE001 - any capture failure is the answer
            raise LoweringError(f"gnnssd.compile: {type(self._layer).__name__} cannot be lowered "
                                f"without DGL: {type(err).__name__}: {err}") from err

    def _build(self, graph, feat, is_block: bool, pair: bool, training: bool) -> Program:
        program = Program()
        try:
            if len(graph.canonical_etypes) != 1 or not is_block and len(graph.ntypes) != 1:
                raise CaptureError("only homogeneous graphs and blocks with one edge type "
                                   "are supported")
            gm = capture(self, is_block, pair)
            annotate(gm.graph)
            program.captured = format_mpdfg(gm.graph)
            run_passes(gm, MAILBOX_PASSES)
            inputs = (few_edges(graph), *(feat if pair else (feat, None)))
            propagate_shapes(gm, *inputs)
            run_passes(gm, default_passes(self.level, self.kernels))
            propagate_shapes(gm, *inputs)
            program.optimised = format_mpdfg(gm.graph)
            program.module = gm
        except Exception as err:  # noqa: BLE001 - any capture failure means: run plain DGL
            program.fallback_reason = f"{type(err).__name__}: {err}"
            if isinstance(graph, CSCBlock):
                return program  # forward refuses it: nothing to fall back to
            warnings.warn(f"gnnssd.compile: cannot compile {type(self._layer).__name__}, "
                          f"falling back to plain DGL execution: {program.fallback_reason}",
                          stacklevel=3)
        return program

    def explain(self, graph: dgl.DGLGraph | None = None, feat=None) -> str:
        """Print (and return) the MP-DFG before and after the passes.

        With ``graph`` and ``feat`` it first builds the program for that input.
        """
        if graph is not None:
            with torch.no_grad():
                self(graph, feat)
        parts = []
        for (is_block, pair, training), p in self._programs.items():
            head = (f"== {type(self._layer).__name__} on a "
                    f"{'block' if is_block else 'whole graph'}, "
                    f"{'(src, dst) pair' if pair else 'single'} input, "
                    f"{'training' if training else 'eval'} ==")
            body = (f"falls back to plain DGL: {p.fallback_reason}" if p.module is None
                    else f"-- captured --\n{p.captured}\n-- after passes "
                         f"(level={self.level}, kernels={self.kernels}) --\n{p.optimised}")
            parts.append(f"{head}\n{body}")
        text = "\n\n".join(parts) or "nothing compiled yet: call the layer (or pass graph, feat)"
        print(text)
        return text


def compile(layer: nn.Module, level: str = "fuse", kernels: bool = True) -> CompiledLayer:  # noqa: A001
    """Compile a DGL-style message-passing layer; same parameters, same results."""
    return CompiledLayer(layer, level, kernels)
