"""The offline mega-batch planner: sampling, plans, read planning, node orders.

One module per job: fanouts (the per-layer, per-relation fanouts value), sampling (numba
neighbour sampling, per relation on a typed graph), blocks (compact MFGs and their
DGLBlocks, heterogeneous ones included), plan (mega-batch plans, save/load), readplan (cost
model, extents, strategy choice), bitset (a bit a row: the hot rows, a window's union),
order (node orders, the hot-row ranking), seed_order (an epoch's seed order and its
mini-batches). Executing plans (reading, repacking, background stages) is gnnssd.pipeline.

Names are imported from their modules on first use (storage_format.lazy): the config reads
its fanouts through `Fanouts` without loading numba.
"""
from gnnssd.storage_format import by_name, lazy_exports

_EXPORTS = by_name({
    ".blocks": ("MFGs", "to_dgl_blocks", "typed_dgl_blocks"),
    ".fanouts": ("FANOUTS_EXPECTED", "Fanouts", "MAX_COUNT"),
    ".order": ("ORDERS", "NodeOrder", "hot_order", "node_order"),
    ".plan": ("HotRows", "MegaBatchPlan", "PlanConfig", "Planner"),
    ".readplan": ("CostModel", "Scan", "Strategy", "choose_window", "pages_plan", "per_row_requests", "plan_extents", "windows"),
    ".sampling": ("NeighborSampler", "sampling_method"),
    ".seed_order": ("Proximity", "SeedOrder", "Sequential", "Sharded", "Shuffled", "named_order", "seed_batches"),
})
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
