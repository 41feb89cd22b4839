"""The one exception type of the compiler: code it cannot capture or lower."""


class CaptureError(RuntimeError):
    """The layer uses something the MP-DFG cannot express; run it uncompiled instead."""
