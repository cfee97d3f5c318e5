"""Engine generations: which training-engine features a run can use when nobody says.

The runs people publish come from two generations of engines, and the planner needs to know
which one it is predicting when a field is unknown:

* ``legacy`` (Megatron-LM 2020-2021, Megatron-DeepSpeed): fp16 training, Megatron's fused
  scale-mask-softmax over the full s x s square (no flash attention), no sequence parallelism
  and no selective recompute (both introduced by Korthikanti et al. 2022), no context
  parallelism (Megatron-core 2024), tensor-parallel communication not overlapped with GEMMs,
  not even the backward all-reduce (``--async-tensor-model-parallel-allreduce`` came with
  Korthikanti et al. 2022; Narayanan et al. 2021), and the ZeRO-1 weight all-gather after the
  optimizer step not overlapped (DeepSpeed ZeRO stage 1/2 gathers the updated partitions
  right after ``step()``; Megatron-LM had no distributed optimizer before 2022), and the
  data-parallel gradient all-reduce run after the last backward, not beside it (Megatron-LM
  v2's default ``--DDP-impl local`` all-reduces in ``train_step`` once the pipeline has
  drained; DeepSpeed's pipeline engine reduces after its flush).
* ``modern`` (Megatron-core with Transformer Engine, torchtitan, DeepSpeed since 2023): bf16
  or fp8, flash attention (Dao et al. 2022/2023), sequence parallelism, selective recompute,
  context parallelism, tensor-parallel all-gather / reduce-scatter pipelined with the GEMMs
  (``--tp-comm-overlap``), the distributed optimizer's weight all-gather overlapped with the
  next step's forward (``--overlap-param-gather``) and the gradient reduction bucketed beside
  the backward (``--overlap-grad-reduce``).

When the generation is not given it is inferred from the precision: FlashAttention reached
the engines in 2023, after large-model training had moved from fp16 to bf16, so fp16 runs are
legacy and bf16/fp8 runs modern. ``--generation`` overrides the inference.
"""

from __future__ import annotations

from planner.errors import InputError
from planner.specs import Job

__all__ = ["GENERATIONS", "default_generation", "features", "resolve_flash"]

GENERATIONS = ("legacy", "modern")


def default_generation(job: Job) -> str:
    return "legacy" if job.precision == "fp16" else "modern"


def features(generation: str) -> dict[str, bool]:
    """Feature switches of one engine generation."""
    if generation not in GENERATIONS:
        raise InputError("--generation", generation, "legacy or modern")
    modern = generation == "modern"
    return {"flash_attention": modern, "sequence_parallel": modern, "tp_comm_overlap": modern,
            "selective_recompute": modern, "context_parallel": modern, "async_tp_allreduce": modern,
            "overlap_param_gather": modern, "overlap_grad_reduce": modern}


def resolve_flash(job: Job, generation: str | None = None, flash: bool | None = None) -> bool:
    """The attention kernel of a prediction: an explicit choice wins, else the generation's
    (given, or inferred from the precision)."""
    if flash is not None:
        return bool(flash)
    return features(generation or default_generation(job))["flash_attention"]
