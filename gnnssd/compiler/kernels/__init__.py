"""Fused CPU kernels for patterns DGL has no single kernel for."""
