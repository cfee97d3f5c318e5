"""Calibration of the cost model's constants: constants as values (no module state edited),
identifiability, and recovery of known constants from synthetic measurements made with the
real cost model."""

from __future__ import annotations

import numpy as np
import pytest

from concurrent.futures import ThreadPoolExecutor

from planner.calibration.fit import ProfileEntry
from planner.calibration.profile import (
    Calibration,
    CalibrationRun,
    calibration_from_profile,
    fit_runs,
    identifiable,
    predict_step_time,
)
from planner.cost.constants import DEFAULT_CONSTANTS
from planner.cost.estimate import estimate
from planner.errors import InputError
from planner.io.loaders import load_model, make_cluster
from planner.specs import Job, ParallelConfig

# ~10 varied configurations: models 125M-13B, A100/H100, 8-128 GPUs, tp/pp/dp, micro-batch,
# recompute, ZeRO 0-3, interleaving, so that compute-bound and memory-bound terms mix differently.
CONFIGS = [
    ("gpt3-350m", "a100-sxm4-80gb", 8, 2048, 64, dict(tp=1, pp=1, dp=8, micro_batch_size=4)),
    ("gpt3-1.3b", "a100-sxm4-80gb", 16, 2048, 128, dict(tp=2, pp=1, dp=8, micro_batch_size=2, zero=1)),
    ("gpt3-2.7b", "h100-sxm5-80gb", 16, 2048, 256, dict(tp=2, pp=2, dp=4, micro_batch_size=2, sequence_parallel=True)),
    ("llama3.1-8b", "h100-sxm5-80gb", 32, 8192, 64, dict(tp=4, pp=1, dp=8, micro_batch_size=1, zero=1, sequence_parallel=True)),
    ("llama3.1-8b", "a100-sxm4-80gb", 64, 4096, 256, dict(tp=8, pp=2, dp=4, micro_batch_size=1, recompute="selective", sequence_parallel=True)),
    ("gpt3-6.7b", "a100-sxm4-80gb", 32, 2048, 512, dict(tp=4, pp=2, dp=4, micro_batch_size=4, recompute="full")),
    ("gpt3-125m", "h100-sxm5-80gb", 8, 1024, 256, dict(tp=1, pp=1, dp=8, micro_batch_size=32)),
    ("gpt3-760m", "h100-sxm5-80gb", 8, 2048, 64, dict(tp=1, pp=1, dp=8, micro_batch_size=1, zero=3)),
    ("llama2-13b", "h100-sxm5-80gb", 64, 4096, 128, dict(tp=8, pp=4, dp=2, micro_batch_size=1, sequence_parallel=True, zero=1)),
    ("gpt3-13b", "a100-sxm4-80gb", 128, 2048, 1024, dict(tp=8, pp=4, dp=4, micro_batch_size=1, vpp=2)),
]
TRUTH = {"TRAINING_KERNEL_EFFICIENCY": 0.7, "HBM_STREAM_EFFICIENCY": 0.6}


def synthetic_runs(seed: int = 1, noise: float = 0.02) -> list[CalibrationRun]:
    runs = [CalibrationRun(f"r{i}", load_model(m), make_cluster(g, n), Job(s, b), ParallelConfig(**p), 1.0)
            for i, (m, g, n, s, b, p) in enumerate(CONFIGS)]
    t = np.array([predict_step_time(TRUTH, r) for r in runs])
    meas = t * (1 + noise * np.random.default_rng(seed).standard_normal(len(t)))
    return [CalibrationRun(r.id, r.model, r.cluster, r.job, r.parallel, float(x)) for r, x in zip(runs, meas)]


def test_recovers_known_constants_within_3_sigma():
    runs = synthetic_runs()
    # start from other values: the shipped defaults 0.84 and 0.7, moved further away
    res = fit_runs(runs, list(TRUTH), init={"TRAINING_KERNEL_EFFICIENCY": 0.9, "HBM_STREAM_EFFICIENCY": 0.4})
    assert res.success
    for k, v in TRUTH.items():
        u = res.uncertainties[k]
        assert 0 < u < 0.2 * v
        assert abs(res.values[k] - v) <= 3 * u, (k, res.values[k], u)
    assert res.mape_before_pct > 5 and res.mape_after_pct < 3


def test_constants_are_values_and_reentrant():
    m, c, j = load_model("gpt3-1.3b"), make_cluster("a100-sxm4-80gb", 16), Job(2048, 64)
    par = ParallelConfig(tp=1, pp=1, dp=16, micro_batch_size=2)
    before = estimate(m, c, j, par).step_time_s
    published = DEFAULT_CONSTANTS.TRAINING_KERNEL_EFFICIENCY
    cal = Calibration.from_values({"TRAINING_KERNEL_EFFICIENCY": 0.5, "INTER_NODE_EFFICIENCY": 0.5})
    assert cal.constants.TRAINING_KERNEL_EFFICIENCY == 0.5 and cal.cluster(c).inter.efficiency == 0.5
    slower = estimate(m, cal.cluster(c), j, par, constants=cal.constants).step_time_s
    assert slower > 1.2 * before
    # nothing global moved: the defaults and a fresh cluster are as they were
    assert DEFAULT_CONSTANTS.TRAINING_KERNEL_EFFICIENCY == published and make_cluster("a100-sxm4-80gb", 16).inter.efficiency == c.inter.efficiency
    assert estimate(m, c, j, par).step_time_s == before
    # two calibrations priced at the same time in threads give the sequential answers
    jobs = [(DEFAULT_CONSTANTS, c), (cal.constants, cal.cluster(c))] * 8
    with ThreadPoolExecutor(4) as ex:
        got = list(ex.map(lambda x: estimate(m, x[1], j, par, constants=x[0]).step_time_s, jobs))
    assert got == [before, slower] * 8
    with pytest.raises(InputError):
        Calibration.from_values({"NOT_A_CONSTANT": 0.5})
    with pytest.raises(InputError):
        calibration_from_profile({"HBM_STREAM_EFFICIENCY": ProfileEntry(1.5, 0.1, 3, "2025-01-01")})


def test_identifiable_drops_blind_constants():
    # single-node runs: the scale-out network carries nothing, so its efficiency is blind
    runs = [r for r in synthetic_runs() if r.cluster.num_gpus <= 8]
    chosen, strength = identifiable(runs)
    assert "TRAINING_KERNEL_EFFICIENCY" in chosen
    assert "INTER_NODE_EFFICIENCY" not in chosen and strength["INTER_NODE_EFFICIENCY"] < 0.02
