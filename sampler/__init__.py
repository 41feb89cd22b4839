"""The offline mega-batch planner: sampling, plans, read planning, node orders.

One module per job: sampling (numba neighbour sampling, per relation on a typed graph),
blocks (compact MFGs and their DGLBlocks, heterogeneous ones included), plan (mega-batch
plans, save/load), readplan (cost model, extents, strategy choice), bitset (a bit a row: the
hot rows, a window's union), order (node orders, the hot-row ranking), seed_order (an
epoch's seed order and its mini-batches). Executing plans
(reading, repacking, background stages) is gnnssd.pipeline.
"""
from .blocks import MFGs, to_dgl_blocks, typed_dgl_blocks
from .order import ORDERS, NodeOrder, hot_order, node_order
from .plan import HotRows, MegaBatchPlan, PlanConfig, Planner
from .readplan import CostModel, Scan, Strategy, choose_window, pages_plan, per_row_requests, plan_extents, windows
from .sampling import NeighborSampler, sampling_method
from .seed_order import Proximity, SeedOrder, Sequential, Sharded, Shuffled, named_order, seed_batches

__all__ = [
    "CostModel", "choose_window", "HotRows", "MFGs", "MegaBatchPlan", "NeighborSampler", "NodeOrder", "ORDERS", "PlanConfig",
    "Planner", "Proximity", "Scan", "SeedOrder", "Sequential", "Sharded", "Shuffled", "Strategy",
    "hot_order", "named_order", "node_order", "pages_plan", "per_row_requests", "plan_extents",
    "sampling_method", "seed_batches", "to_dgl_blocks", "typed_dgl_blocks", "windows",
]
