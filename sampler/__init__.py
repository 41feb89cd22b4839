"""The offline mega-batch planner: sampling, plans, read planning, node orders.

One module per job: sampling (numba neighbour sampling, per relation on a typed graph),
blocks (compact MFGs and their DGLBlocks, heterogeneous ones included), plan (mega-batch
plans, save/load), readplan (cost model, extents, strategy choice), order (node orders, the
hot-row ranking), seed_order (an epoch's seed order and its mini-batches). Executing plans
(reading, repacking, background stages) is gnnssd.pipeline.
"""
from .blocks import MFGs, to_dgl_blocks
from .order import (ORDERS, NodeOrder, degree_order, hot_order, hotness, locality_order, metis_order, node_order, rcm_order,
                    window_locality)
from .plan import HotRows, MegaBatchPlan, PlanConfig, Planner, load_plan, save_plan
from .readplan import CostModel, ReadPlan, plan_extents, read_stats, windows
from .sampling import NeighborSampler
from .seed_order import SEED_ORDERS, Proximity, SeedOrder, Sequential, Sharded, Shuffled, named_order, seed_batches, shard

__all__ = [
    "CostModel", "HotRows", "MFGs", "MegaBatchPlan", "NeighborSampler", "NodeOrder", "ORDERS", "PlanConfig",
    "Planner", "Proximity", "ReadPlan", "SEED_ORDERS", "SeedOrder", "Sequential", "Sharded", "Shuffled",
    "degree_order", "hot_order", "hotness", "load_plan", "locality_order", "metis_order", "named_order",
    "node_order", "plan_extents", "rcm_order", "read_stats", "save_plan", "seed_batches", "shard", "to_dgl_blocks",
    "window_locality", "windows",
]
