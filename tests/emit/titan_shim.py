"""Import before any torchtitan import on a CPU-only torch (no triton): the notes' stub
(the notes' stub, docs/research/titan_deepspeed.md). torchtitan imports triton kernels at import time:
0.2.2 through torchtitan/models/moe/kernels.py:8 (reached from torchtitan/__init__.py), 0.3.0
through torchtitan/distributed/minimal_async_ep/kernels.py:10 (reached from every model). Only
those torchtitan kernel modules are replaced (any attribute is a function that raises when
called); ``triton`` itself is not faked, so torch's has-triton checks stay true."""

from __future__ import annotations

import sys
import types

__all__: list[str] = []

_MODULES = ("torchtitan.models.moe.kernels", "torchtitan.distributed.minimal_async_ep.kernels")


def _unavailable(*args, **kwargs):
    raise RuntimeError("triton kernels unavailable (CPU-only torch)")


def _getattr(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    return _unavailable


try:
    import triton  # noqa: F401
except ImportError:
    for _name in _MODULES:
        if _name not in sys.modules:
            _m = types.ModuleType(_name)
            _m.__getattr__ = _getattr  # PEP 562
            sys.modules[_name] = _m
