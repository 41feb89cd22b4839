"""Each MP-DFG pass on its own: the rewrite happens, and the program still computes
what the UDF layer computes through DGL."""
import dgl
import pytest
import torch
from dgl.utils import expand_as_pair
from torch import nn

import gnnssd  # noqa: F401
from gnnssd.compiler import GATConvUDF, SAGEConvUDF, ops
from gnnssd.compiler.annotate import Space, annotate, propagate_shapes
from gnnssd.compiler.api import CompiledLayer
from gnnssd.compiler.capture import capture
from gnnssd.compiler.passes import run_passes
from gnnssd.compiler.passes.aggregate_order import linear_before_aggregate
from gnnssd.compiler.passes.cleanup import cse, cse_prefix_rows, dce
from gnnssd.compiler.passes.fuse import fuse_sddmm, fuse_spmm
from gnnssd.compiler.passes.fuse_attention import fuse_attention
from gnnssd.compiler.passes.hoist import hoist_nodewise
from gnnssd.compiler.passes.mailbox import (MAILBOX_PASSES, rewrite_mailbox_reductions,
                                            rewrite_mailbox_softmax, strip_mailbox)
from gnnssd.compiler.passes.split_concat import split_concat_linear
from gnnssd.compiler.semantics import op_name


class MessageLayer(nn.Module):
    """A layer made of a message and a reduce function given at construction."""

    def __init__(self, message, reduce, in_feats: int = 6, out_feats: int = 4):
        super().__init__()
        self.fc = nn.Linear(in_feats, out_feats)
        self.fc2 = nn.Linear(2 * in_feats, out_feats)
        self._message, self._reduce = message, reduce

    def message(self, edges):
        return self._message(self, edges)

    def reduce(self, nodes):
        return self._reduce(self, nodes)

    def forward(self, graph, feat):
        with graph.local_scope():
            graph.srcdata["h"], graph.dstdata["h"] = expand_as_pair(feat, graph)
            graph.update_all(self.message, self.reduce)
            return graph.dstdata["out"]


def copy_src(layer, edges):
    return {"m": edges.src["h"]}


def graph():
    gen = torch.Generator().manual_seed(0)
    src, dst = torch.randint(0, 30, (120,), generator=gen), torch.randint(0, 25, (120,), generator=gen)
    return dgl.graph((src, dst), num_nodes=30)


def feat(dim: int = 6):
    return torch.randn(30, dim, generator=torch.Generator().manual_seed(1))


def program(layer, *passes, mailbox: bool = True):
    """Captured program of ``layer`` on the test graph, after the given passes."""
    g, x = graph(), feat()
    gm = capture(CompiledLayer(layer), False, False)
    annotate(gm.graph)
    if mailbox:
        run_passes(gm, MAILBOX_PASSES)
        propagate_shapes(gm, g, x, None)
    run_passes(gm, passes)
    return gm


def targets(gm):
    return [n.target for n in gm.graph.nodes]


def assert_runs_like_udf(gm, layer):
    g, x = graph(), feat()
    torch.testing.assert_close(gm(g, x, None), layer(g, x), rtol=1e-4, atol=1e-5)


def test_mailbox_reductions_become_segment_reductions():
    layer = MessageLayer(copy_src, lambda s, n: {
        "out": n.mailbox["m"].mean(1) + torch.max(n.mailbox["m"], 1)[0]
        + torch.sum(n.mailbox["m"], dim=1)})
    gm = program(layer, rewrite_mailbox_reductions, mailbox=False)
    reductions = [n.args[2] for n in gm.graph.nodes if n.target is ops.segment_reduce]
    assert sorted(reductions) == ["max", "mean", "sum"]
    assert not any(op_name(n) in ("mean", "max", "sum") for n in gm.graph.nodes)
    assert ops.mailbox in targets(gm)  # layout markers go in strip_mailbox
    run_passes(gm, [strip_mailbox])
    assert_runs_like_udf(gm, layer)


def test_mailbox_softmax_becomes_edge_softmax():
    layer = MessageLayer(lambda s, e: {"m": s.fc(e.src["h"])}, lambda s, n: {
        "out": (torch.softmax(n.mailbox["m"], dim=1) * n.mailbox["m"]).sum(1)})
    gm = program(layer, rewrite_mailbox_softmax, mailbox=False)
    assert ops.edge_softmax in targets(gm)
    assert not any(op_name(n) == "softmax" for n in gm.graph.nodes)
    run_passes(gm, [rewrite_mailbox_reductions, strip_mailbox])
    assert_runs_like_udf(gm, layer)


def test_strip_mailbox_shifts_dims_past_the_neighbour_dim():
    layer = MessageLayer(copy_src, lambda s, n: {
        "out": n.mailbox["m"].unsqueeze(2).sum(1).squeeze(1)})
    gm = program(layer)
    assert ops.mailbox not in targets(gm)
    (unsq,) = [n for n in gm.graph.nodes if op_name(n) == "unsqueeze"]
    assert unsq.args[1] == 1 and unsq.meta["space"] is Space.EDGE
    assert_runs_like_udf(gm, layer)


def test_hoist_moves_nodewise_ops_before_the_gather():
    layer = GATConvUDF(6, 4, num_heads=2)
    gm = program(layer)
    fc_spaces = lambda: [n.meta["space"] for n in gm.graph.nodes if n.target == "fc"]  # noqa: E731
    assert fc_spaces() == [Space.EDGE, Space.EDGE]  # on source and destination rows, per edge
    run_passes(gm, [hoist_nodewise])
    assert fc_spaces() == [Space.NODE, Space.NODE]
    assert all(n.meta["space"] is not Space.EDGE for n in gm.graph.nodes
               if op_name(n) in ("view", "sum") and n.args[1] != 1)
    assert_runs_like_udf(gm, layer)


def test_split_concat_linear():
    layer = MessageLayer(lambda s, e: {"m": s.fc2(torch.cat([e.src["h"], e.dst["h"]], -1))},
                         lambda s, n: {"out": n.mailbox["m"].sum(1)})
    gm = program(layer, split_concat_linear, dce)
    assert not any(op_name(n) == "cat" for n in gm.graph.nodes)
    assert [op_name(n) for n in gm.graph.nodes].count("linear") == 2
    assert_runs_like_udf(gm, layer)
    run_passes(gm, [hoist_nodewise, fuse_sddmm])  # the split is what makes these apply
    assert ops.gsddmm in targets(gm)
    assert_runs_like_udf(gm, layer)


def test_cse_merges_duplicate_nodewise_ops():
    layer = GATConvUDF(6, 4, num_heads=2)
    gm = program(layer, hoist_nodewise)
    count = lambda: sum(n.target == "fc" for n in gm.graph.nodes)  # noqa: E731
    assert count() == 2  # fc(h) hoisted from both the source and the destination side
    run_passes(gm, [cse])
    assert count() == 1
    assert_runs_like_udf(gm, layer)


def test_dce_drops_unused_messages():
    layer = MessageLayer(lambda s, e: {"m": e.src["h"], "unused": s.fc(e.dst["h"]).exp()},
                         lambda s, n: {"out": n.mailbox["m"].sum(1)})
    gm = program(layer)
    assert any(op_name(n) == "exp" for n in gm.graph.nodes)
    run_passes(gm, [dce])
    assert not any(op_name(n) == "exp" or n.op == "call_module" for n in gm.graph.nodes)
    assert_runs_like_udf(gm, layer)


def test_fuse_spmm():
    layer = SAGEConvUDF(6, 8)
    gm = program(layer, fuse_spmm, dce)
    assert ops.gspmm in targets(gm)
    assert ops.segment_reduce not in targets(gm) and ops.gather_src not in targets(gm)
    assert_runs_like_udf(gm, layer)


def test_fuse_sddmm_binary_and_dot():
    layer = MessageLayer(
        lambda s, e: {"m": (e.src["h"] * e.dst["h"]).sum(-1, keepdim=True) + e.src["h"]
                      - e.dst["h"]},
        lambda s, n: {"out": n.mailbox["m"].max(1)[0]})
    gm = program(layer, fuse_sddmm, dce)
    sddmm = sorted(n.args[1] for n in gm.graph.nodes if n.target is ops.gsddmm)
    assert sddmm == ["add", "dot", "sub"]
    assert_runs_like_udf(gm, layer)


def test_fuse_attention():
    layer = GATConvUDF(6, 4, num_heads=2)
    gm = program(layer, hoist_nodewise, cse, fuse_spmm, fuse_sddmm, dce)
    assert ops.edge_softmax in targets(gm)
    run_passes(gm, [fuse_attention, dce])
    assert ops.fused_attention in targets(gm)
    assert not {ops.edge_softmax, ops.gsddmm, ops.gspmm} & set(targets(gm))
    assert_runs_like_udf(gm, layer)


@pytest.mark.parametrize("out_feats,moved", [(3, True), (9, False)])
def test_linear_before_aggregate_only_when_it_shrinks(out_feats, moved):
    layer = SAGEConvUDF(6, out_feats)
    gm = program(layer, linear_before_aggregate)
    (fc_neigh,) = [n for n in gm.graph.nodes if n.target == "fc_neigh"]
    assert (fc_neigh.args[0].target is not ops.segment_reduce) == moved
    assert_runs_like_udf(gm, layer)


def test_cse_prefix_rows_reuses_source_rows_on_blocks():
    g = graph()
    seeds = torch.tensor([0, 1, 2, 4, 7, 26, 28])
    block = dgl.to_block(dgl.sampling.sample_neighbors(g, seeds, 3), seeds)
    x = torch.randn(block.num_src_nodes(), 6, generator=torch.Generator().manual_seed(2))
    layer = GATConvUDF(6, 4, num_heads=2)
    gm = capture(CompiledLayer(layer), True, False)
    run_passes(gm, MAILBOX_PASSES)
    propagate_shapes(gm, block, x, None)
    run_passes(gm, [hoist_nodewise, cse])
    fc_spaces = lambda: [n.meta["space"] for n in gm.graph.nodes if n.target == "fc"]  # noqa: E731
    assert fc_spaces() == [Space.SRC, Space.DST]
    run_passes(gm, [cse_prefix_rows, dce])
    assert fc_spaces() == [Space.SRC]  # one projection, sliced for the destinations
    torch.testing.assert_close(gm(block, x, None), layer(block, x), rtol=1e-4, atol=1e-5)
