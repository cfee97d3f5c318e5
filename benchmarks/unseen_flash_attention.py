"""Out-of-sample: FlashAttention's own GPT-3 training throughput on one 8 x A100 node.

``benchmarks/unseen/flash_attention_gpt3_runs.json`` holds the five rows of the "Training speed"
table that Dao-AILab/flash-attention published with its training code (Nov 2022, flash-attn
1.x): GPT-3 125M to 2.7B, sequence 2048, bf16, pure data parallelism (Lightning DDP, ZeRO-1 from
760M on), no activation checkpointing. No constant was set from them. They are not one of issue
16's four step-time files.

The training code is none of the planner's engines. Its kernels (fused bias-GELU MLP, fused
dropout-add-LayerNorm, the fused xentropy loss) are closest to Megatron-core's, which this
script prices them on, two ways:

* ``attention flash``: the rows as written (on A100 the planner's flash kernel is FlashAttention-2),
  what ``planner validate benchmarks/unseen/flash_attention_gpt3_runs.json`` scores;
* ``attention fa1``: the kernel the table ran, flash-attn 1.x (``FA1_TO_FA2_RATIO`` of FA2's
  speed, read from the FA2 paper's A100 and H100 kernel benchmarks). Megatron-core has no flag
  for flash-attn 1.x, so the engine's kernel check is skipped for this column only.

    python benchmarks/unseen_flash_attention.py
"""

from __future__ import annotations

import statistics
from pathlib import Path

import dataclasses

from planner import ParallelConfig, estimate, load_runs

RUNS = Path(__file__).resolve().parent / "unseen" / "flash_attention_gpt3_runs.json"


def main() -> None:
    errs: dict[str, list[float]] = {"flash": [], "fa1": []}
    print(f"{'run':36s} {'mb':>3s} {'meas s':>7s} {'flash s':>8s} {'err':>7s} {'fa1 s':>7s} {'err':>7s} {'MFU(fa1)':>8s}")
    fields = {f.name for f in dataclasses.fields(ParallelConfig)}
    for run in load_runs(RUNS):
        meas = run.measured["step_time_s"]
        given = ParallelConfig(**{k: v for k, v in run.parallel.items() if k in fields and v is not None})
        cells = []
        for kind in ("flash", "fa1"):
            par = given.replace(attention=kind)
            est = estimate(run.model, run.cluster, run.job, par, engine="megatron-core", validate=kind != "fa1")
            err = 100 * (est.step_time_s / meas - 1)
            errs[kind].append(err)
            cells.append((est, err))
        (ef, xf), (e1, x1) = cells
        print(f"{run.id:36s} {given.micro_batch_size:3d} {meas:7.3f} {ef.step_time_s:8.3f} {xf:+6.1f}% "
              f"{e1.step_time_s:7.3f} {x1:+6.1f}% {100 * e1.mfu:7.1f}%")
    for kind, e in errs.items():
        print(f"attention {kind:5s}: n = {len(e)}, step-time MAPE {statistics.mean(abs(x) for x in e):.1f}%, "
              f"mean signed {statistics.mean(e):+.1f}%, largest miss {max(abs(x) for x in e):.1f}%")


if __name__ == "__main__":
    main()
