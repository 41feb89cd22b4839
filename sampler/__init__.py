"""The offline mega-batch planner: sampling, plans, read planning, node orders.

One module per job: sampling (numba neighbour sampling, per relation on a typed graph),
blocks (compact MFGs and their DGLBlocks, heterogeneous ones included), plan (mega-batch
plans, save/load), readplan (cost model, extents, strategy choice), order (node orders, the
hot-row ranking's heat). Executing plans (reading, repacking, background stages) is
gnnssd.pipeline.
"""
from .blocks import MFGs, to_dgl_blocks
from .order import (ORDERS, NodeOrder, degree_order, hot_order, hotness, locality_order, metis_order, node_order, rcm_order,
                    window_locality)
from .plan import (HotRows, MegaBatchPlan, PlanConfig, Planner, load_plan, minibatch_seeds, save_plan, seed_batches,
                   shard)
from .readplan import CostModel, ReadPlan, plan_extents, read_stats, windows
from .sampling import NeighborSampler

__all__ = [
    "CostModel", "HotRows", "MFGs", "MegaBatchPlan", "NeighborSampler", "NodeOrder", "ORDERS", "PlanConfig", "Planner",
    "ReadPlan", "degree_order", "hot_order", "hotness", "load_plan", "locality_order", "metis_order", "minibatch_seeds",
    "node_order", "rcm_order", "window_locality",
    "plan_extents",
    "read_stats", "save_plan", "seed_batches", "shard", "to_dgl_blocks", "windows",
]
