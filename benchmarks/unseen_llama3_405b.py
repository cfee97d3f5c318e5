"""Out-of-sample: the Llama 3 405B pre-training throughput Meta published (16K H100, RoCE).

``benchmarks/unseen/llama3_405b_meta_runs.json`` holds the three rows of Table 4 of the Llama 3
paper (arXiv 2407.21783, sec. 3.3.2): 405B on 8,192 and 16,384 H100 at sequence 8K and on 16,384
at 128K with context parallelism 16, each with its TFLOP/s per GPU and BF16 MFU. No constant was
set from them, and they are not one of issue 16's four step-time files.

Meta publishes throughput, not step times, and does not say how it counts attention FLOPs. So
this script compares TFLOP/s per GPU both ways, from the same predicted step time:

* ``full``: attention over the whole s x s square (the planner's MFU convention);
* ``causal``: attention over the causal half (what flash attention executes).

At 8K the two differ by about 4%; at 128K attention is most of the work and they differ by about
a third, so the 128K row says little about step time. Unknown fields (micro-batch, virtual
stages, recompute, ZeRO, sequence parallelism) are filled two ways, as ``planner validate``
does: the planner's fastest plan and the median feasible one. A positive error is a predicted
throughput above Meta's (a step predicted too fast).

    python benchmarks/unseen_llama3_405b.py
"""

from __future__ import annotations

from pathlib import Path

from planner import load_runs
from planner.calibration.validate import fill_and_predict
from planner.cost.flops import step_model_flops

RUNS = Path(__file__).resolve().parent / "unseen" / "llama3_405b_meta_runs.json"


def tflops(est, run, causal: bool) -> float:
    """Model TFLOP/s per GPU of ``est`` with attention counted over the full square or causally."""
    flops = step_model_flops(run.model, run.job.global_batch_size, run.job.seq_len, causal=causal)
    return flops / est.step_time_s / run.cluster.num_gpus / 1e12


def measure() -> list[dict]:
    """One dict per run and fill: the plan the fill chose, its step time and the throughput error
    (per cent, predicted / published TFLOP/s - 1) with attention counted over the full square and
    causally."""
    out = []
    for run in load_runs(RUNS):
        pub = run.measured["tflops_per_gpu_reported"]
        res = fill_and_predict(run, median=True)
        for fill, est in (("fastest", res.estimate), ("median", res.median)):
            if est is None:
                continue
            full, causal = (tflops(est, run, c) for c in (False, True))
            out.append({"id": run.id, "fill": fill, "parallel": est.parallel, "step_time_s": est.step_time_s, "published": pub,
                        "full": full, "full_err_pct": 100 * (full / pub - 1), "causal": causal, "causal_err_pct": 100 * (causal / pub - 1)})
    return out


def main() -> None:
    print(f"{'run':36s} {'fill':7s} {'plan':34s} {'step s':>7s} {'pub':>5s} {'full':>5s} {'err':>7s} {'causal':>6s} {'err':>7s}")
    for r in measure():
        p = r["parallel"]
        what = f"v{p.vpp} mb{p.micro_batch_size} {p.recompute} z{p.zero} sp{int(p.sequence_parallel)}"
        print(f"{r['id']:36s} {r['fill']:7s} {what:34s} {r['step_time_s']:7.2f} {r['published']:5.0f} {r['full']:5.0f} "
              f"{r['full_err_pct']:+6.1f}% {r['causal']:6.0f} {r['causal_err_pct']:+6.1f}%")


if __name__ == "__main__":
    main()
