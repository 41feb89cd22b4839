"""What every layer above shares: the typed config, the memory budget, devices and seeds,
ranks, stage timing, logging and the allocator bound."""
from .allocator import bound_freed_memory
from .budget import disk_share, format_bytes, parse_bytes, resolve_block_budget, ssd_split
from .config import (MAX_COUNT, Config, ConfigError, ModelConfig, SamplerConfig, SSDConfig, as_config, check_count,
                     is_layer_fanouts, load_config)
from .logs import setup_logging
from .ranks import Ranks, current, launched_by_torchrun, torchrun_environment
from .runtime import (dgl_has_cuda, epoch_seed, one_interrupt, run_seed, seed_everything, select_device, uninterruptible,
                      use_single_thread)
from .timing import StageTimer

__all__ = ["MAX_COUNT", "Config", "ConfigError", "ModelConfig", "Ranks", "SSDConfig", "SamplerConfig", "StageTimer",
           "as_config", "bound_freed_memory", "check_count", "current", "dgl_has_cuda", "disk_share", "epoch_seed", "format_bytes", "is_layer_fanouts",
           "launched_by_torchrun",
           "load_config", "one_interrupt", "parse_bytes", "resolve_block_budget", "run_seed",
           "seed_everything", "select_device", "setup_logging", "ssd_split", "torchrun_environment", "uninterruptible",
           "use_single_thread"]
