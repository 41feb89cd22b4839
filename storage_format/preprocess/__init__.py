"""Preprocessing: a dataset source written into a store (topology, features, node order,
link splits, checksums) in a partial folder made complete at the end. The reading side
(Store, the loaders, training) never imports this package (tests/test_layering.py)."""
