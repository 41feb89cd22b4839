"""The compiler's exceptions: code it cannot capture, and a layer it cannot lower where it must."""


class CaptureError(RuntimeError):
    """The layer uses something the MP-DFG cannot express; run it uncompiled instead."""


class LoweringError(RuntimeError):
    """A layer that must run without DGL (on a CSCBlock) but cannot be compiled."""
