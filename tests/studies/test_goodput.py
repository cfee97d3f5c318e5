"""Young/Daly closed forms, goodput behaviour and the Llama 3 405B worked example."""

from __future__ import annotations

import math

import pytest

from planner.errors import InputError
from planner.studies.goodput import (
    CHECKPOINT_BYTES_PER_PARAM,
    DEFAULT_GPU_FAILURE_RATE_PER_S,
    checkpoint_bytes,
    checkpoint_write_time_s,
    daly_interval_s,
    expected_wall_time_s,
    goodput_fraction,
    job_mtbf_s,
    plan_checkpointing,
    young_interval_s,
)

MIN = 60.0
HOUR = 3600.0


def test_default_rate_is_llama3_arithmetic():
    # 419 unexpected interruptions / (16,384 GPUs * 54 days * 24 h) = 1.973e-5 per GPU-hour
    per_gpu_hour = DEFAULT_GPU_FAILURE_RATE_PER_S * HOUR
    assert per_gpu_hour == pytest.approx(419 / 21_233_664, rel=1e-12)
    assert per_gpu_hour == pytest.approx(1.973e-5, rel=1e-3)
    # job MTBF on the Llama 3 job: 54 * 24 / 419 = 3.093 h ("one failure every three hours")
    assert job_mtbf_s(16_384) / HOUR == pytest.approx(3.0931, rel=1e-4)


def test_mtbf_scales_inversely_with_gpus():
    assert job_mtbf_s(1000, 1e-6) == pytest.approx(1000.0)
    assert job_mtbf_s(2000, 1e-6) == pytest.approx(500.0)


def test_young_closed_form():
    # C = 5 min, M = 24 h: sqrt(2 * 300 s * 86400 s) = sqrt(51,840,000) = 7200 s
    assert young_interval_s(300.0, 86400.0) == pytest.approx(7200.0, rel=1e-12)
    # C = 10 s, M = 5000 s: sqrt(100,000) = 316.2278 s
    assert young_interval_s(10.0, 5000.0) == pytest.approx(316.22777, rel=1e-7)


@pytest.mark.parametrize(
    "mtbf_s, expected_min",
    [
        # Daly 2006 Figs. 3-5, C = 5 min:
        # M = 24 h: 120 * (1 + 0.0416667/3 + 0.0017361/9) - 5 = 120 * 1.0140818 - 5 = 116.690 min
        (24 * HOUR, 116.68981),
        # M = 6 h: 60 * (1 + 0.0833333/3 + 0.0069444/9) - 5 = 60 * 1.0285494 - 5 = 56.71296 min
        (6 * HOUR, 56.71296),
        # M = 15 min: sqrt(150) * (1 + 0.4082483/3 + 0.1666667/9) - 5 = 12.247449 * 1.1546013 - 5
        #           = 9.140920 min
        (15 * MIN, 9.140920),
    ],
)
def test_daly_closed_form_matches_paper(mtbf_s, expected_min):
    assert daly_interval_s(5 * MIN, mtbf_s) / MIN == pytest.approx(expected_min, rel=1e-6)
    # the paper's rounded figures: 117, 57, 9.1 min
    assert round(daly_interval_s(5 * MIN, mtbf_s) / MIN, 1 if mtbf_s < HOUR else 0) in (117, 57, 9.1)


def test_daly_large_checkpoint_branch():
    # C >= 2M: tau_opt = M
    assert daly_interval_s(100.0, 50.0) == 50.0
    assert daly_interval_s(300.0, 100.0) == 100.0


def test_goodput_daly_closed_form():
    # tau = 1000, C = 100, R = 200, M = 10,000:
    # tau / (M e^{R/M} (e^{(tau+C)/M} - 1)) = 1000 / (10000 * e^0.02 * (e^0.11 - 1))
    #   = 1000 / (10000 * 1.0202013 * 0.1162781) = 1000 / 1186.27 = 0.84298
    expected = 1000.0 / (10000.0 * math.exp(0.02) * math.expm1(0.11))
    assert goodput_fraction(1000.0, 100.0, 200.0, 10000.0) == pytest.approx(expected, rel=1e-12)
    assert expected == pytest.approx(0.84298, abs=1e-5)


def test_goodput_first_order_closed_form():
    # 1 - (100/1000 + (500 + 200)/10000) = 1 - 0.1 - 0.07 = 0.83
    assert goodput_fraction(1000.0, 100.0, 200.0, 10000.0, "first_order") == pytest.approx(0.83)
    # waste > 1 clips at zero
    assert goodput_fraction(1000.0, 100.0, 200.0, 100.0, "first_order") == 0.0


@pytest.mark.parametrize("model", ["daly", "first_order"])
def test_goodput_monotone_in_failure_rate(model):
    rates = [1e-10, 1e-9, 5e-9, 1e-8, 5e-8, 1e-7]
    c, r = 30.0, 600.0
    # at a fixed interval
    fixed = [goodput_fraction(600.0, c, r, job_mtbf_s(4096, k), model) for k in rates]
    assert all(a > b for a, b in zip(fixed, fixed[1:]))
    # and at each rate's own optimal interval
    opt = [goodput_fraction(daly_interval_s(c, job_mtbf_s(4096, k)), c, r, job_mtbf_s(4096, k), model)
           for k in rates]
    assert all(a > b for a, b in zip(opt, opt[1:]))
    assert all(0.0 <= g <= 1.0 for g in fixed + opt)


def test_daly_interval_is_near_optimal_for_daly_model():
    c, r, m = 60.0, 300.0, 4 * HOUR
    best = goodput_fraction(daly_interval_s(c, m), c, r, m)
    for tau in [0.5 * daly_interval_s(c, m), 2.0 * daly_interval_s(c, m), young_interval_s(c, m)]:
        assert goodput_fraction(tau, c, r, m) <= best + 1e-9


def test_worked_example_llama3_405b():
    # 16,384 GPUs, 405e9 parameters * 14 B = 5.67e12 B, written at Tectonic's sustained
    # 2 TB/s (Llama 3 paper sec. 3.3.1), restart 10 min, 15.6e12 tokens at 2.5e6 tokens/s.
    res = plan_checkpointing(16_384, 405e9, 2e12, 600.0, n_tokens=15.6e12, tokens_per_s=2.5e6)
    assert res.checkpoint_bytes == pytest.approx(405e9 * CHECKPOINT_BYTES_PER_PARAM)
    assert res.checkpoint_s == pytest.approx(2.835)
    assert res.mtbf_s == pytest.approx(job_mtbf_s(16_384))
    assert res.young_interval_s == pytest.approx(math.sqrt(2 * 2.835 * res.mtbf_s))
    assert 200.0 < res.daly_interval_s < 300.0
    assert res.interval_s == res.daly_interval_s
    # sensible: > 90% like the reported "effective training time", < 100%
    assert 0.90 < res.goodput_fraction < 0.95
    assert res.compute_time_s == pytest.approx(15.6e12 / 2.5e6)
    assert math.isfinite(res.wall_time_s) and res.wall_time_s > res.compute_time_s
    assert res.wall_time_s == pytest.approx(res.compute_time_s / res.goodput_fraction)


def test_expected_wall_time():
    assert expected_wall_time_s(1e9, 1e5, 0.5) == pytest.approx(2e4)


def test_checkpoint_helpers():
    assert checkpoint_bytes(1e9) == 14e9
    assert checkpoint_write_time_s(14e9, 7e9) == pytest.approx(2.0)


@pytest.mark.parametrize(
    "call",
    [
        lambda: job_mtbf_s(0),
        lambda: job_mtbf_s(8, -1.0),
        lambda: job_mtbf_s(True),
        lambda: young_interval_s(-1.0, 10.0),
        lambda: daly_interval_s(1.0, 0.0),
        lambda: goodput_fraction(0.0, 1.0, 1.0, 10.0),
        lambda: goodput_fraction(1.0, 1.0, 1.0, 10.0, "weibull"),
        lambda: checkpoint_write_time_s(1.0, 0.0),
        lambda: checkpoint_bytes(float("nan")),
        lambda: expected_wall_time_s(1.0, 1.0, 1.5),
        lambda: plan_checkpointing(8, 1e9, 1e9, 60.0, n_tokens=1e9),
    ],
)
def test_bad_input_raises(call):
    with pytest.raises(InputError):
        call()


def test_default_write_bandwidth_is_per_node_times_nodes_capped():
    from planner.studies.goodput import FS_WRITE_CAP_BYTES_PER_S, NODE_CHECKPOINT_WRITE_BYTES_PER_S, checkpoint_write_bandwidth

    assert NODE_CHECKPOINT_WRITE_BYTES_PER_S == pytest.approx(1.9375e9)  # 62 GB/s per 32-node SU
    assert checkpoint_write_bandwidth(1) == NODE_CHECKPOINT_WRITE_BYTES_PER_S
    assert checkpoint_write_bandwidth(16) == pytest.approx(31e9)
    assert checkpoint_write_bandwidth(128) == pytest.approx(248e9)  # the RA's 4-SU figure: 250 GB/s
    assert checkpoint_write_bandwidth(2048) == FS_WRITE_CAP_BYTES_PER_S == 2e12
    with pytest.raises(InputError):
        checkpoint_write_bandwidth(0)


def test_a_job_that_never_finishes_says_so_and_its_json_parses():
    """At a failure rate where checkpoints cannot keep up, the expected wall time is not a number
    worth printing (it overflowed into hundreds of digits and JSON's non-standard Infinity): the
    text says never, the JSON has finishes false and nulls."""
    import json  # noqa: PLC0415

    from conftest import run_cli  # noqa: PLC0415

    argv = ["goodput", "--params", "405B", "--gpus", "16384", "--tokens", "15.6T", "--tokens-per-s", "2.5e6"]
    code, out, err = run_cli([*argv, "--failure-rate", "1"])
    assert code == 0, err
    assert "expected wall: never" in " ".join(out.split()) and "inf" not in out
    code, out, err = run_cli([*argv, "--failure-rate", "1", "--json"])
    doc = json.loads(out, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))  # no Infinity/NaN
    assert doc["finishes"] is False and doc["wall_time_s"] is None and doc["gpu_hours"] is None
    code, out, err = run_cli([*argv, "--json"])
    doc = json.loads(out)
    assert doc["finishes"] is True and doc["wall_time_s"] > doc["compute_time_s"] > 0
