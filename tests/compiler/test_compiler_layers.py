"""The built-in UDF layers equal the dgl.nn layers they mirror, parameters copied."""
import dgl
import pytest
import torch
from dgl.nn import GATConv, GraphConv, SAGEConv

import gnnssd  # noqa: F401
from gnnssd.compiler import GATConvUDF, GraphConvUDF, SAGEConvUDF, compile

PAIRS = {
    "sage": (lambda d: SAGEConv(d, 5, "mean"), SAGEConvUDF),
    "sage_shrink": (lambda d: SAGEConv(d, 2, "mean"), SAGEConvUDF),
    "gcn": (lambda d: GraphConv(d, 5, norm="both", allow_zero_in_degree=True), GraphConvUDF),
    "gat": (lambda d: GATConv(d, 4, num_heads=3, allow_zero_in_degree=True), GATConvUDF),
}


def graph_and_block():
    gen = torch.Generator().manual_seed(0)
    src = torch.randint(0, 50, (200,), generator=gen)
    dst = torch.randint(0, 40, (200,), generator=gen)  # nodes 40..49: zero in-degree
    g = dgl.graph((torch.cat([src, src[:20]]), torch.cat([dst, dst[:20]])), num_nodes=50)
    seeds = torch.tensor([1, 2, 3, 5, 8, 41, 45])
    block = dgl.to_block(dgl.sampling.sample_neighbors(g, seeds, 5), seeds)
    return {"whole": g, "block": block}


def randomise(module: torch.nn.Module) -> None:
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5)


def grads(module, graph, feat):
    feat = feat.clone().requires_grad_()
    out = module(graph, feat)
    (out * torch.linspace(-1, 1, out.numel()).view(out.shape)).sum().backward()
    return out.detach(), {n: p.grad for n, p in module.named_parameters()}, feat.grad


@pytest.mark.parametrize("name", sorted(PAIRS))
@pytest.mark.parametrize("kind", ["whole", "block"])
@pytest.mark.parametrize("dim", [1, 7, 64])
def test_udf_layer_equals_dgl_nn(name, kind, dim):
    make_dgl, udf_cls = PAIRS[name]
    conv = make_dgl(dim)
    randomise(conv)
    udf = udf_cls.from_dgl(conv)
    graph = graph_and_block()[kind]
    feat = torch.randn(graph.num_src_nodes(), dim, generator=torch.Generator().manual_seed(1))
    ref_out, ref_grads, ref_fgrad = grads(conv, graph, feat)
    for module in (udf, compile(udf)):
        out, pgrads, fgrad = grads(module, graph, feat)
        torch.testing.assert_close(out, ref_out, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(fgrad, ref_fgrad, rtol=1e-4, atol=1e-5)
        assert pgrads.keys() == ref_grads.keys()
        for key in ref_grads:
            torch.testing.assert_close(pgrads[key], ref_grads[key], rtol=1e-4, atol=1e-5)
        udf.zero_grad()


def test_constructors_mirror_dgl_nn():
    assert SAGEConvUDF(8, 4).fc_neigh.weight.shape == SAGEConv(8, 4, "mean").fc_neigh.weight.shape
    assert SAGEConvUDF((8, 6), 4).fc_self.weight.shape == (4, 6)
    assert GraphConvUDF(8, 4).weight.shape == GraphConv(8, 4).weight.shape
    gat, ref = GATConvUDF(8, 4, num_heads=2), GATConv(8, 4, num_heads=2)
    assert gat.state_dict().keys() == ref.state_dict().keys()
    with pytest.raises(ValueError):
        SAGEConvUDF(8, 4, aggregator_type="lstm")
