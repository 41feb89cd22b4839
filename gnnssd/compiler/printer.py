"""Text form of the MP-DFG: one line per value with its space, movement and shape."""
from __future__ import annotations

from torch import fx


def format_mpdfg(graph: fx.Graph) -> str:
    lines = []
    for node in graph.nodes:
        if node.op == "output":
            lines.append(f"  return {node.args[0]}")
            continue
        target = getattr(node.target, "__name__", node.target)
        args = node.args
        if args and isinstance(args[0], fx.Node) and args[0].meta.get("space") is not None \
                and args[0].meta["space"].value == "graph":
            args = args[1:]  # the DGL graph argument of every primitive
        args = ", ".join(map(str, args))
        kwargs = "".join(f", {k}={v}" for k, v in node.kwargs.items())
        call = node.name if node.op == "placeholder" else f"{node.op}:{target}({args}{kwargs})"
        space = getattr(node.meta.get("space"), "value", "?")
        movement = getattr(node.meta.get("movement"), "value", "")
        shape = node.meta.get("shape")
        lines.append(f"  %{node.name:<16} {space:<8} {movement:<12} "
                     f"{'x'.join(map(str, shape)) if shape else '':<14} {call}")
    return "\n".join(lines)
