"""The offline mega-batch planner: sampling, plans, read planning, repack, node orders.

One module per job: sampling (numba neighbour sampling), blocks (compact MFGs and their
DGLBlocks), plan (mega-batch plans, save/load), worker (background planning), readplan
(cost model, extents, strategy choice), repack (compact blocks), loader (executing plans),
direct_io (the one adapter to gnnssd.io_engine), calibration, order.
"""
from .blocks import MFGs, to_dgl_blocks
from .calibration import calibrate, load_model
from .direct_io import DirectIO
from .loader import MegaBatchLoader
from .order import degree_order, hotness, locality_order
from .plan import MegaBatchPlan, PlanConfig, Planner, load_plan, minibatch_seeds, save_plan
from .readplan import CostModel, ReadPlan, plan_extents, read_stats, windows
from .repack import remove, repack, repacked_windows
from .sampling import NeighborSampler
from .worker import PlanWorker, replay, saving

__all__ = [
    "CostModel", "DirectIO", "MFGs", "MegaBatchLoader", "MegaBatchPlan", "NeighborSampler", "PlanConfig",
    "PlanWorker", "Planner", "ReadPlan", "calibrate", "degree_order", "hotness", "load_model", "load_plan",
    "locality_order", "minibatch_seeds", "plan_extents", "read_stats", "remove", "repack", "repacked_windows", "replay",
    "save_plan", "saving", "to_dgl_blocks", "windows",
]
