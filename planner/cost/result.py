"""The result of one prediction: step time, its breakdown, utilisation, memory per stage."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Estimate"]


@dataclass(frozen=True)
class Estimate:
    step_time_s: float
    tokens_per_s: float
    tflops_per_gpu: float
    mfu: float
    hfu: float
    model_flops: float
    executed_flops: float
    time_breakdown_s: dict
    comm: list
    stage_times_s: list
    stages: list
    memory_peak_bytes: float
    memory_capacity_bytes: float
    num_microbatches: int
    layers_per_stage: tuple
    bound: str
    notes: list = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return self.memory_peak_bytes <= self.memory_capacity_bytes

    def as_dict(self) -> dict:
        return {
            "step_time_s": self.step_time_s,
            "tokens_per_s": self.tokens_per_s,
            "tflops_per_gpu": self.tflops_per_gpu,
            "mfu": self.mfu,
            "hfu": self.hfu,
            "model_flops_per_step": self.model_flops,
            "executed_flops_per_step": self.executed_flops,
            "flop_conventions": {
                "mfu": "model FLOPs: 3 x forward, full-square attention, no recompute (Narayanan 2021 eq. 3 without the recompute term), over the dense 16-bit peak",
                "hfu": "model FLOPs plus the recomputed forward (same full-square attention convention), over the dense 16-bit peak",
            },
            "memory_peak_bytes": self.memory_peak_bytes,
            "memory_capacity_bytes": self.memory_capacity_bytes,
            "fits": self.fits,
            "num_microbatches": self.num_microbatches,
            "layers_per_stage": list(self.layers_per_stage),
            "bound": self.bound,
            "time_breakdown_s": dict(self.time_breakdown_s),
            "communication": list(self.comm),
            "stage_times_s": list(self.stage_times_s),
            "memory_by_stage": [s.as_dict() for s in self.stages],
            "notes": list(self.notes),
        }
