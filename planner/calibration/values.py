"""Fitted constants as the values the cost model takes (no numpy or scipy: the CLI imports it
at start-up).

:class:`Calibration` holds a :class:`planner.cost.constants.Constants` and the scale-out link
efficiency of the cluster, which a profile file (``planner calibrate --out``) sets.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from numbers import Real

from planner.cost.constants import DEFAULT_CONSTANTS, FITTABLE, Constants
from planner.errors import InputError
from planner.specs import ClusterSpec

__all__ = ["Calibration", "check_values"]


def check_values(values: Mapping[str, float]) -> dict[str, float]:
    out = {}
    for k, v in values.items():
        if k not in FITTABLE:
            raise InputError("constant", k, "one of " + ", ".join(FITTABLE))
        if isinstance(v, bool) or not isinstance(v, Real) or not (0 < float(v) <= 1):
            raise InputError(k, v, "an efficiency in (0, 1]")
        out[k] = float(v)
    return out




@dataclass(frozen=True)
class Calibration:
    """Fitted values as what the cost model takes: ``constants`` (passed to estimate/plan) and
    the scale-out efficiency (``inter_node_efficiency``, applied to a cluster by :meth:`cluster`).

    >>> cal = Calibration.from_values({"TRAINING_KERNEL_EFFICIENCY": 0.7})
    >>> cal.constants.TRAINING_KERNEL_EFFICIENCY, cal.inter_node_efficiency is None
    (0.7, True)
    """

    constants: Constants = DEFAULT_CONSTANTS
    inter_node_efficiency: float | None = None

    @classmethod
    def from_values(cls, values: Mapping[str, float], base: Constants = DEFAULT_CONSTANTS) -> "Calibration":
        vals = check_values(values)
        inter = vals.pop("INTER_NODE_EFFICIENCY", None)
        return cls(base.replace(**vals) if vals else base, inter)

    def cluster(self, cluster: ClusterSpec) -> ClusterSpec:
        """The cluster with the calibrated scale-out efficiency (if any)."""
        if self.inter_node_efficiency is None:
            return cluster
        return replace(cluster, inter=replace(cluster.inter, efficiency=float(self.inter_node_efficiency)))


