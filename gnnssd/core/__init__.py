"""What every layer above shares: the typed config, the memory budget, devices and seeds,
ranks, stage timing, logging and the allocator bound.

Names are imported from their modules on first use (storage_format.lazy): the config and
its errors load without torch and DGL, which ranks and runtime (seeds, devices) need."""
from gnnssd.storage_format import by_name, lazy_exports

_EXPORTS = by_name({
    ".allocator": ("bound_freed_memory",),
    ".budget": ("AUTO_FEATURE_SHARE", "PACKED_FEATURE_SHARE", "disk_share", "format_bytes", "parse_bytes",
                "resolve_block_budget", "ssd_split"),
    ".config": ("Config", "ConfigError", "ModelConfig", "SamplerConfig", "SSDConfig", "as_config",
                "check_count", "load_config"),
    ".logs": ("setup_logging",),
    ".ranks": ("Ranks", "current", "launched_by_torchrun", "torchrun_environment"),
    ".runtime": ("dgl_has_cuda", "epoch_seed", "one_interrupt", "run_seed", "seed_everything", "select_device",
                 "uninterruptible", "use_single_thread"),
    ".timing": ("StageTimer",),
})
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
