"""Import shims for running Megatron-LM's argument parser on a CPU-only machine (used by
test_megatron.py when PLANNER_MEGATRON_LM is set): modules that import triton kernels at
import time are replaced by inert stand-ins, and typing.override (Python 3.12) is provided."""

from __future__ import annotations

import sys
import types
import typing

__all__: list[str] = []

_TRITON_MODULES = [
    "megatron.core.transformer.moe.ops.paged_stash",
    "megatron.core.ssm.ops.common.causal_conv1d_varlen",
    "megatron.core.ssm.ops.mamba2.ssd_bmm",
    "megatron.core.ssm.ops.mamba2.ssd_chunk_scan",
    "megatron.core.ssm.ops.mamba2.ssd_combined",
    "megatron.core.ssm.ops.mamba2.ssd_state_passing",
    "megatron.core.ssm.ops.mamba2.ssd_chunk_state",
    "megatron.core.ssm.ops.mamba2.batch_invariant_decode",
]


def _anything(*args, **kwargs):
    if len(args) == 1 and callable(args[0]) and not kwargs:
        return args[0]
    return _anything


class _Inert(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _anything


try:
    import triton  # noqa: F401
except ImportError:
    for _name in _TRITON_MODULES:
        sys.modules.setdefault(_name, _Inert(_name))

if not hasattr(typing, "override"):
    typing.override = lambda f: f  # type: ignore[attr-defined]
