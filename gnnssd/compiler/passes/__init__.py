"""Rewrites of the MP-DFG. Each pass mutates an fx.GraphModule's graph in place.

Every pass keeps the program runnable (except while mailbox markers remain), and
the driver re-annotates spaces after each one so the next sees fresh metadata.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

from torch import fx

from gnnssd.compiler.annotate import annotate

Pass = Callable[[fx.GraphModule], None]


def graph_input(graph: fx.Graph) -> fx.Node:
    """The program's DGL-graph placeholder (always its first node)."""
    return next(iter(graph.nodes))


def replace(old: fx.Node, new: fx.Node) -> None:
    """Route every use of ``old`` to ``new`` (the same value) and drop ``old``."""
    for key in ("space", "shape"):
        if key in old.meta:
            new.meta.setdefault(key, old.meta[key])
    old.replace_all_uses_with(new)
    old.graph.erase_node(old)


def run_passes(gm: fx.GraphModule, passes: Sequence[Pass]) -> None:
    for p in passes:
        p(gm)
        gm.graph.lint()
        annotate(gm.graph)
    gm.recompile()
