"""A step of several pipeline flushes: gradient accumulation around a pipeline schedule.

torchtitan splits a step's batch into ``gradient_accumulation_steps = global / (local x dp)``
pieces and runs the pipeline schedule once per piece (train.py ``train_step``: one
``pp_schedule.step`` per accumulation step, then one ``optimizers.step()``). Each schedule run
is a whole pipeline: its own warm-up and cool-down (the bubble), and its last backward
synchronises the gradients over data parallelism (torch/distributed/pipelining/schedules.py:
``last_backward = bwd_mb_index == n_microbatches - 1``; stage.py ``backward_maybe_with_nosync``).
So the step is ``F`` times what one flush of ``m / F`` micro-batches costs, less the parts that run
once per step (the optimizer and the step's fixed overhead). Memory is one flush's.
"""

from __future__ import annotations

import dataclasses

from planner.cost.result import Estimate

__all__ = ["repeat_flushes", "ONCE_PER_STEP"]

# time_breakdown_s entries paid once per optimizer step, not once per flush
ONCE_PER_STEP = ("optimizer_s", "overhead_s")


def repeat_flushes(one: Estimate, flushes: int) -> Estimate:
    """The estimate of a step that runs ``flushes`` times the pipeline that ``one`` prices (one
    flush of the step's micro-batches / ``flushes``); memory, the layer split, the per-GPU
    shapes and the per-micro-batch stage times are ``one``'s. ``flushes`` = 1 returns ``one``."""
    if flushes <= 1:
        return one
    once = sum(one.time_breakdown_s.get(k, 0.0) for k in ONCE_PER_STEP)
    step = flushes * (one.step_time_s - once) + once
    scale = flushes * one.step_time_s / step  # work per second, relative to one flush's
    breakdown = {k: (v if k in ONCE_PER_STEP else flushes * v) for k, v in one.time_breakdown_s.items()}
    comm = [{**c, **{k: flushes * c[k] for k in ("time_s", "exposed_s") if k in c}} if isinstance(c, dict) else c for c in one.comm]
    note = (f"{flushes} pipeline flushes per step (gradient accumulation around the schedule): each runs "
            f"{one.num_microbatches} micro-batches with its own bubble and gradient synchronisation")
    return dataclasses.replace(
        one, step_time_s=step, tokens_per_s=one.tokens_per_s * scale, tflops_per_gpu=one.tflops_per_gpu * scale,
        mfu=one.mfu * scale, hfu=one.hfu * scale, model_flops=one.model_flops * flushes, executed_flops=one.executed_flops * flushes,
        time_breakdown_s=breakdown, comm=comm,
        num_microbatches=one.num_microbatches * flushes, notes=[*one.notes, note])
