"""The command line (`gnnssd ...`, `python -m gnnssd`), the demo and the reports it draws."""
from .commands import main

__all__ = ["main"]
