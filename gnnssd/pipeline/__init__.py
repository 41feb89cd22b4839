"""Executing the planner's plans: the SSD data path between gnnssd.sampler and the loaders.

direct_io (the one adapter to gnnssd.io_engine), row_source (the `read(ids)` interface every
reader and cache of rows offers), feature_file (the features file's reader), hot_cache (the
hot rows, the one owner of which rows are hot and where each is: a device slice, the host
cache, or the mega-batch buffer), buffers (the mega-batch buffers, the gather on the host),
device_gather (x assembled on the consuming device; imported by buffers when used, with
torch), repack and block_writer (compact blocks), worker (background stages), packers
(planning and repacking of whole windows in processes beside the trainer), kept (an epoch's
plans and blocks kept for the epochs that reuse its samples), calibration (the drive's cost
model).
"""
from gnnssd.pipeline.block_writer import BlockWriter
from gnnssd.pipeline.buffers import BUFFERS, MegaBatchBuffers, Recycler, x_dtype, x_pool_bytes
from gnnssd.pipeline.calibration import calibrate, describe_model, load_cost_model
from gnnssd.pipeline.direct_io import DirectIO
from gnnssd.pipeline.feature_file import FeatureFile
from gnnssd.pipeline.hot_cache import HotCache, HotRanking
from gnnssd.pipeline.kept import KeptSamples, samples_key
from gnnssd.pipeline.packers import (FIRST_WINDOW, OWN_WINDOW_MOST, SCANS_AT_ONCE, PackerPool, PackerSpec,
                                     default_packers, window_bounds)
from gnnssd.pipeline.repack import RepackReport, delete, repack, repacked_windows
from gnnssd.pipeline.row_source import RowSource
from gnnssd.pipeline.worker import PlanWorker, check_numba_threads, numba_threads

__all__ = ["BUFFERS", "BlockWriter", "FIRST_WINDOW", "OWN_WINDOW_MOST", "DirectIO", "FeatureFile", "HotCache",
           "HotRanking", "KeptSamples",
           "MegaBatchBuffers", "PackerPool", "PackerSpec", "PlanWorker", "Recycler", "RepackReport", "RowSource", "SCANS_AT_ONCE", "calibrate", "check_numba_threads", "describe_model",
           "default_packers", "delete", "load_cost_model", "numba_threads", "repack", "repacked_windows",
           "samples_key", "window_bounds", "x_dtype", "x_pool_bytes"]
