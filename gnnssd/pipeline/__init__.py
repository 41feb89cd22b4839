"""Executing the planner's plans: the SSD data path between gnnssd.sampler and the loaders.

direct_io (the one adapter to gnnssd.io_engine), loader (fill mega-batch buffers, gather
mini-batch inputs), repack and block_writer (compact blocks), worker (background stages),
calibration (the drive's cost model).
"""
from .calibration import calibrate, load_model
from .direct_io import DirectIO
from .loader import MegaBatchLoader
from .repack import remove, repack, repacked_windows
from .worker import PlanWorker, replay, saving

__all__ = ["DirectIO", "MegaBatchLoader", "PlanWorker", "calibrate", "load_model", "remove", "repack",
           "repacked_windows", "replay", "saving"]
