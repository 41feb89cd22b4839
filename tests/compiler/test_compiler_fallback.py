"""Layers the compiler cannot capture run as plain DGL, with a warning saying why."""
import warnings

import dgl
import pytest
import torch
from torch import nn

import gnnssd  # noqa: F401
from gnnssd.compiler import SAGEConvUDF, compile


class ControlFlowLayer(nn.Module):
    """Branches on the value of a tensor: data-dependent control flow."""

    def forward(self, graph, feat):
        with graph.local_scope():
            graph.srcdata["h"] = feat
            graph.update_all(lambda e: {"m": e.src["h"]},
                             lambda n: {"o": n.mailbox["m"].sum(1)})
            out = graph.dstdata["o"]
            return out * 2 if out.sum() > 0 else out


class SortLayer(nn.Module):
    """Sorts each mailbox: an op over the neighbour dimension with no segment form."""

    def forward(self, graph, feat):
        with graph.local_scope():
            graph.srcdata["h"] = feat
            graph.update_all(lambda e: {"m": e.src["h"]},
                             lambda n: {"o": n.mailbox["m"].sort(dim=1)[0][:, 0]})
            return graph.dstdata["o"]


class BucketShapeLayer(nn.Module):
    """Divides by the mailbox's width: the degree, which only the mailbox layout has."""

    def forward(self, graph, feat):
        with graph.local_scope():
            graph.srcdata["h"] = feat
            graph.update_all(lambda e: {"m": e.src["h"]},
                             lambda n: {"o": n.mailbox["m"].sum(1) / n.mailbox["m"].shape[1]})
            return graph.dstdata["o"]


class NodeCountLayer(nn.Module):
    """Asks the graph for something the MP-DFG does not model."""

    def forward(self, graph, feat):
        return feat * graph.num_edges()


def regular_graph():
    src = torch.arange(20).repeat_interleave(3)
    dst = (src + torch.tensor([1, 2, 3]).repeat(20)) % 20
    return dgl.graph((src, dst), num_nodes=20)


@pytest.mark.parametrize("layer,reason", [
    (ControlFlowLayer(), "symbolically traced variables cannot be used as inputs to control flow"),
    (SortLayer(), "cannot lower sort on mailbox values"),
    (NodeCountLayer(), "graph.num_edges is not supported inside a compiled layer"),
    (BucketShapeLayer(), "reads the shape of a mailbox"),
])
def test_fallback_warns_and_matches(layer, reason):
    g, x = regular_graph(), torch.randn(20, 4)
    compiled = compile(layer)
    with pytest.warns(UserWarning, match="falling back to plain DGL execution") as record:
        out = compiled(g, x)
    assert reason in str(record[0].message)
    assert type(layer).__name__ in str(record[0].message)
    torch.testing.assert_close(out, layer(g, x))
    assert reason in compiled.explain()


def test_heterograph_falls_back():
    g = dgl.heterograph({("a", "x", "b"): ([0, 1], [1, 0]), ("b", "y", "a"): ([0], [1])})
    compiled = compile(SAGEConvUDF(3, 2))
    with pytest.warns(UserWarning, match="only homogeneous graphs"):
        with pytest.raises((dgl.DGLError, AssertionError)):  # plain DGL refuses it too
            compiled(g, torch.randn(2, 3))


def test_warns_once_per_specialisation():
    compiled = compile(ControlFlowLayer())
    g, x = regular_graph(), torch.randn(20, 4)
    with pytest.warns(UserWarning):
        compiled(g, x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compiled(g, x)


def test_bad_level_is_refused():
    with pytest.raises(ValueError, match="level"):
        compile(SAGEConvUDF(3, 2), level="turbo")
