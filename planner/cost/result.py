"""The result of one prediction: step time, its breakdown, utilisation, memory per stage."""

from __future__ import annotations

from dataclasses import dataclass, field

from planner.units import GIB, fmt_time, fmt_tokens, gib

__all__ = ["Estimate"]


@dataclass(frozen=True)
class Estimate:
    """One prediction (SI units): what :func:`planner.estimate` returns.

    ``parallel`` is the configuration priced (every engine default filled in, ``resolved``
    names the fields the engine filled), ``engine`` the engine profile's name. ``as_dict()``
    is the JSON form the CLI writes; ``repr`` is one short line; in a rich console the
    estimate renders as a table.

    >>> import planner
    >>> est = planner.estimate(planner.load_model("llama3.1-8b"), planner.make_cluster("h100-sxm5-80gb", 8),
    ...                        planner.Job(8192, 64), planner.ParallelConfig(tp=1, pp=1))
    >>> repr(est).startswith("Estimate(step ")
    True
    """

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
    parallel: object = None  # planner.specs.ParallelConfig (resolved)
    engine: str = ""
    resolved: tuple = ()
    memory_margin: float = 0.0  # fraction of the capacity kept free (Constants.MEMORY_MARGIN_FRACTION, --memory-margin)
    fp8_recipe: str = ""  # the FP8 scaling recipe priced ("" in 16-bit; planner.engines.fp8_recipe)
    fp8_param_gather: bool = False  # FP8 primary weights gathered in FP8 (planner.engines.fp8_gathers, ZeRO >= 1)
    fp8_tp_gather: bool = False  # TP all-gathers activations in FP8 (Job.fp8_tp_gather, torchao Float8 TP; tp > 1)
    cross_entropy: str = ""  # the loss's cross-entropy implementation priced (Engine.loss_name)

    # Memory: ``memory_peak_bytes`` is what the fullest GPU needs (the allocator's reserved peak
    # plus device memory outside it); feasibility compares it with the capacity less the margin.
    @property
    def memory_usable_bytes(self) -> float:
        """The capacity a plan may use: capacity x (1 - memory_margin)."""
        return self.memory_capacity_bytes * (1.0 - self.memory_margin)

    @property
    def fits(self) -> bool:
        return self.memory_peak_bytes <= self.memory_usable_bytes

    @property
    def memory_allocated_peak_bytes(self) -> float:
        """The peak of what tensors hold (``torch.cuda.max_memory_allocated``), over the stages."""
        return max((s.allocated_bytes for s in self.stages), default=0.0)

    @property
    def memory_reserved_peak_bytes(self) -> float:
        """The caching allocator's reserved peak (``torch.cuda.max_memory_reserved``): allocated
        plus the fragmentation reserve, over the stages."""
        return max((s.reserved_bytes for s in self.stages), default=0.0)

    @property
    def memory_peak_stage(self) -> int:
        """The pipeline stage with the largest peak (the first of equals)."""
        return max(range(len(self.stages)), key=lambda i: (self.stages[i].total_bytes, -i)) if self.stages else 0

    @property
    def memory_peak_moment(self) -> str:
        """When that stage reaches its peak (which pass, which micro-batch)."""
        return self.stages[self.memory_peak_stage].moment if self.stages else ""

    def __repr__(self) -> str:
        par = self.parallel.short() if self.parallel is not None else "?"
        return (f"Estimate(step {self.step_time_s:.4g} s, {self.tokens_per_s:,.0f} tok/s, MFU {100 * self.mfu:.1f}%, "
                f"peak {self.memory_peak_bytes / GIB:.1f}/{self.memory_capacity_bytes / GIB:.1f} GiB"
                f"{'' if self.fits else ' (does not fit)'}, {par}, {self.engine})")

    def __rich__(self):
        """A two-column rich table: the headline figures, then every non-zero term of the step."""
        from rich import box  # noqa: PLC0415  (rich only when rendering)
        from rich.table import Table  # noqa: PLC0415

        t = Table(box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0), pad_edge=False, show_edge=False, collapse_padding=True, show_header=False)
        t.add_column("quantity", style="bold")
        t.add_column("value", justify="right")
        lps = self.layers_per_stage
        rows = [
            ("step time", fmt_time(self.step_time_s)),
            ("tokens/s", fmt_tokens(self.tokens_per_s)),
            ("TFLOP/s per GPU (model)", f"{self.tflops_per_gpu:.1f}"),
            ("MFU / HFU", f"{100 * self.mfu:.1f}% / {100 * self.hfu:.1f}%"),
            ("peak memory per GPU", f"{gib(self.memory_peak_bytes)} of {gib(self.memory_capacity_bytes)} GiB" + ("" if self.fits else "  (does NOT fit)")),
            ("  torch allocated / reserved", f"{gib(self.memory_allocated_peak_bytes)} / {gib(self.memory_reserved_peak_bytes)} GiB"
             f" (+{gib(self.memory_peak_bytes - self.memory_reserved_peak_bytes)} outside the allocator)"),
            ("  usable (margin)", f"{gib(self.memory_usable_bytes)} GiB ({100 * self.memory_margin:.0f}%)"),
            ("  peak", f"stage {self.memory_peak_stage}: {self.memory_peak_moment}"),
            ("micro-batches", str(self.num_microbatches)),
            ("layers per stage", ",".join(map(str, lps)) if len(lps) <= 12 else f"{lps[0]}..{lps[-1]} ({len(lps)} stages)"),
            ("bound by", self.bound),
        ]
        for k, v in self.time_breakdown_s.items():
            if v > 0:
                rows.append(("  " + k.removesuffix("_s").replace("_", " "), fmt_time(v)))
        for k, v in rows:
            t.add_row(k, v)
        return t

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
            "memory_allocated_peak_bytes": self.memory_allocated_peak_bytes,
            "memory_reserved_peak_bytes": self.memory_reserved_peak_bytes,
            "memory_capacity_bytes": round(self.memory_capacity_bytes),  # whole bytes (the GPU preset's capacity)
            "memory_margin": self.memory_margin,
            "memory_usable_bytes": self.memory_usable_bytes,
            "memory_peak_stage": self.memory_peak_stage,
            "memory_peak_moment": self.memory_peak_moment,
            "fits": self.fits,
            "num_microbatches": self.num_microbatches,
            "layers_per_stage": list(self.layers_per_stage),
            "bound": self.bound,
            "engine": self.engine,
            "fp8_recipe": self.fp8_recipe or None,
            "fp8_param_gather": self.fp8_param_gather,
            "fp8_tp_gather": self.fp8_tp_gather,
            "cross_entropy": self.cross_entropy or None,
            "resolved_by_engine": list(self.resolved),
            "time_breakdown_s": dict(self.time_breakdown_s),
            "communication": list(self.comm),
            "stage_times_s": list(self.stage_times_s),
            "memory_by_stage": [s.as_dict() for s in self.stages],
            "notes": list(self.notes),
        }
