"""What torch ops mean to the MP-DFG: elementwise, row-wise, which argument is a dim.

A value living on nodes or edges has one row per node or edge (dim 0). An op is
*row-wise* when each output row depends only on the same input row, so it commutes
with gathers: ``f(x[idx]) == f(x)[idx]``. That property is what the reorder pass needs.
"""
from __future__ import annotations

import operator

from torch import fx, nn

ELEMENTWISE = {
    "add", "sub", "mul", "truediv", "div", "neg", "pow", "exp", "log", "sigmoid", "tanh",
    "relu", "leaky_relu", "elu", "gelu", "silu", "softplus", "abs", "sqrt", "rsqrt",
    "reciprocal", "clamp", "float", "double", "contiguous", "sin", "cos", "selu", "celu",
    "relu6", "hardtanh", "mish", "square", "to", "type_as",
}
# Ops whose dimension argument is positional argument 1 or keyword ``dim``.
DIM_OPS = {"sum", "mean", "amax", "amin", "max", "min", "softmax", "log_softmax", "cat",
           "stack", "unsqueeze", "squeeze", "norm"}
REDUCTIONS = {"sum": "sum", "mean": "mean", "amax": "max", "amin": "min", "max": "max",
              "min": "min"}
ROWWISE_MODULES = (nn.Linear, nn.LeakyReLU, nn.ReLU, nn.ELU, nn.Sigmoid, nn.Tanh,
                   nn.Identity, nn.GELU, nn.SiLU, nn.LayerNorm)
RANDOM = {"dropout", "rand", "rand_like", "randn", "randn_like", "bernoulli"}
_INPLACE = {operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ipow,
            operator.imatmul}
_OPERATORS = {operator.add: "add", operator.sub: "sub", operator.mul: "mul",
              operator.truediv: "truediv", operator.neg: "neg", operator.pow: "pow",
              operator.getitem: "getitem", operator.matmul: "matmul"}


def op_name(node: fx.Node) -> str | None:
    """Canonical name of a torch op (``torch.sum``, ``x.sum`` and ``F.x`` alike), else None."""
    if node.op == "call_method":
        return node.target
    if node.op == "call_function":
        if node.target in _OPERATORS:
            return _OPERATORS[node.target]
        if (getattr(node.target, "__module__", None) or "").startswith("torch"):
            return getattr(node.target, "__name__", None)
    return None


def is_inplace(node: fx.Node) -> bool:
    """``x.add_(y)``, ``x += y``: mutation, which the MP-DFG (pure values) cannot express."""
    name = op_name(node) or ""
    return name.endswith("_") and not name.startswith("_") or node.target in _INPLACE


def dim_arg(node: fx.Node):
    """The op's dimension argument, or None when it has none (or reduces everything)."""
    if "dim" in node.kwargs:
        return node.kwargs["dim"]
    return node.args[1] if len(node.args) > 1 else None


def set_dim_arg(node: fx.Node, dim) -> None:
    if "dim" in node.kwargs:
        node.update_kwarg("dim", dim)
    else:
        node.update_arg(1, dim)


def shape(node) -> tuple | None:
    return node.meta.get("shape") if isinstance(node, fx.Node) else None


def _dims_avoid_rows(dim, ndim: int | None) -> bool:
    dims = dim if isinstance(dim, (tuple, list)) else (dim,)
    if any(not isinstance(d, int) for d in dims) or ndim is None:
        return False
    return all(d % ndim != 0 for d in dims)


def is_rowwise(node: fx.Node, gm: fx.GraphModule, row_args: list[fx.Node]) -> bool:
    """Whether ``node`` acts on each row of ``row_args`` independently.

    Arguments that are not in ``row_args`` must be parameters or Python scalars; they
    broadcast over rows only when they have no row dimension of their own.
    """
    out = shape(node)
    if out is None or node.op == "call_module" and not isinstance(
            gm.get_submodule(node.target), ROWWISE_MODULES):
        return False
    if node.op == "call_module":
        return True
    name = op_name(node)
    first = shape(row_args[0]) if row_args else None
    if name in ELEMENTWISE:
        others_broadcast = all(
            len(shape(a) or ()) < len(out) or shape(a)[0] == 1
            for a in node.all_input_nodes if a not in row_args and shape(a) is not None)
        return others_broadcast and all(len(shape(a) or ()) == len(out) for a in row_args)
    if name in ("linear", "matmul"):
        return node.args[0] in row_args and len(out) >= 2 and all(
            a is node.args[0] for a in row_args)
    if name in ("view", "reshape"):
        sizes = node.args[1] if isinstance(node.args[1], (tuple, list)) else node.args[1:]
        return len(sizes) > 0 and sizes[0] == -1
    if name == "flatten":
        return isinstance(dim_arg(node), int) and dim_arg(node) >= 1
    if name == "getitem":
        idx = node.args[1]
        if not isinstance(idx, tuple) or not idx:
            return False
        if idx[0] is Ellipsis:
            return first is not None and len(idx) - 1 < len(first)
        return idx[0] == slice(None)
    if name in DIM_OPS:
        ndim = len(out) if name in ("stack", "unsqueeze") else (len(first) if first else None)
        return _dims_avoid_rows(dim_arg(node), ndim)
    return False
