"""The feature backends behind FeatureSource: memory (gnnssd's sampler over rows in RAM),
ssd (the mega-batch pipeline) and the baselines a user would try (mmap, per-row)."""
