"""Calibration recovers known constants from synthetic measurements; profile save/load."""

from __future__ import annotations

import math

import numpy as np
import pytest
import yaml

from planner.calibration.fit import (
    CalibrationResult,
    ProfileEntry,
    fit_constants,
    load_profile,
    mape_pct,
    profile_from_result,
    save_profile,
)
from planner.errors import InputError

PEAK_FLOP_PER_S = 989e12  # H100 SXM dense BF16 (NVIDIA H100 datasheet)
HBM_BYTES_PER_S = 3.35e12  # H100 SXM HBM3 (NVIDIA H100 datasheet)
TRUE = {"eff": 0.55, "eta": 0.80}


def toy_step_time_s(params: dict[str, float], run: dict[str, float]) -> float:
    """t = flops / (peak * eff) + bytes / (bw * eta): compute and memory time, not overlapped."""
    return run["flop"] / (PEAK_FLOP_PER_S * params["eff"]) + run["bytes"] / (HBM_BYTES_PER_S * params["eta"])


def synthetic(n_runs: int = 40, noise: float = 0.02, seed: int = 7):
    rng = np.random.default_rng(seed)
    runs = [{"flop": float(f), "bytes": float(b)}
            for f, b in zip(10 ** rng.uniform(13, 16, n_runs), 10 ** rng.uniform(10, 13, n_runs))]
    true_s = np.array([toy_step_time_s(TRUE, r) for r in runs])
    measured_s = true_s * (1.0 + noise * rng.standard_normal(n_runs))
    return runs, measured_s


def test_recovers_known_constants_within_3_sigma():
    runs, measured_s = synthetic()
    res = fit_constants(toy_step_time_s, runs, measured_s, {"eff": (0.3, 0.05, 1.0), "eta": (0.5, 0.05, 1.0)})
    assert isinstance(res, CalibrationResult) and res.success
    for name, true in TRUE.items():
        u = res.uncertainties[name]
        assert 0.0 < u < 0.05 * true  # informative
        assert abs(res.values[name] - true) <= 3.0 * u, (name, res.values[name], u)
        assert not res.at_bound[name]
    assert res.mape_before_pct > 20.0
    assert res.mape_after_pct < 3.0  # 2% Gaussian noise: E|e| = 0.02 * sqrt(2/pi) = 1.6%
    assert res.rms_log_residual == pytest.approx(0.02, rel=0.3)
    assert res.n_runs == 40 and res.covariance.shape == (2, 2)


def test_uncertainty_matches_scatter_over_repeats():
    # the reported sigma should be the right size: the spread of fitted eff over 30 noisy
    # data sets is within a factor 2 of the mean reported uncertainty
    fits = [fit_constants(toy_step_time_s, *synthetic(seed=s), {"eff": (0.3, 0.05, 1.0), "eta": (0.5, 0.05, 1.0)})
            for s in range(30)]
    spread = np.std([f.values["eff"] for f in fits], ddof=1)
    reported = np.mean([f.uncertainties["eff"] for f in fits])
    assert 0.5 < spread / reported < 2.0


def test_unidentifiable_parameter_gets_infinite_uncertainty():
    runs, measured_s = synthetic()

    def predict(p, run):  # "ghost" does not enter the prediction
        return toy_step_time_s(p, run) * (1.0 + 0.0 * p["ghost"])

    res = fit_constants(predict, runs, measured_s,
                        {"eff": (0.3, 0.05, 1.0), "eta": (0.5, 0.05, 1.0), "ghost": (1.0, 0.0, 2.0)})
    assert math.isinf(res.uncertainties["ghost"])


def test_mape_by_hand():
    # |1.1 - 1|/1 = 0.1, |1.8 - 2|/2 = 0.1 -> 10 %
    assert mape_pct([1.1, 1.8], [1.0, 2.0]) == pytest.approx(10.0)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"params": {"eff": (0.3, 0.5, 1.0)}},  # init below lo
        {"params": {"eff": (0.3, 1.0, 0.05)}},  # lo > hi
        {"params": {}},
        {"params": {"eff": 0.3}},
        {"measured_s": [1.0, 2.0]},  # wrong length
        {"measured_s": [-1.0] * 3},
        {"runs": [{"flop": 1e13, "bytes": 1e10}], "measured_s": [0.1]},  # n <= p
        {"predict": "not callable"},
    ],
)
def test_bad_input_raises(kwargs):
    args = {"predict": toy_step_time_s, "runs": [{"flop": 1e13, "bytes": 1e10}] * 3,
            "measured_s": [0.1, 0.1, 0.1], "params": {"eff": (0.3, 0.05, 1.0)}}
    args.update(kwargs)
    with pytest.raises(InputError):
        fit_constants(**args)


def test_profile_round_trip_and_no_overwrite(tmp_path):
    runs, measured_s = synthetic()
    res = fit_constants(toy_step_time_s, runs, measured_s, {"eff": (0.3, 0.05, 1.0), "eta": (0.5, 0.05, 1.0)})
    path = tmp_path / "cluster.yaml"
    save_profile(path, profile_from_result(res, date="2025-01-31"))
    prof = load_profile(path)
    assert set(prof) == {"eff", "eta"}
    assert prof["eff"] == ProfileEntry(res.values["eff"], res.uncertainties["eff"], 40, "2025-01-31")
    # twice without force raises and leaves the file as it was
    before = path.read_text()
    with pytest.raises(InputError):
        save_profile(path, {"eff": ProfileEntry(0.1, 0.01, 3, "2025-02-01")})
    assert path.read_text() == before
    # with force it is replaced
    save_profile(path, {"eff": ProfileEntry(0.1, 0.01, 3, "2025-02-01")}, force=True)
    assert load_profile(path) == {"eff": ProfileEntry(0.1, 0.01, 3, "2025-02-01")}
    # no temp files left behind
    assert [p.name for p in tmp_path.iterdir()] == ["cluster.yaml"]


def test_profile_accepts_result_and_infinite_uncertainty(tmp_path):
    runs, measured_s = synthetic()
    res = fit_constants(toy_step_time_s, runs, measured_s, {"eff": (0.3, 0.05, 1.0), "eta": (0.5, 0.05, 1.0)})
    save_profile(tmp_path / "a.yaml", res)
    assert load_profile(tmp_path / "a.yaml")["eta"].n_runs == 40
    save_profile(tmp_path / "b.yaml", {"x": ProfileEntry(1.0, math.inf, 2, "2025-01-31")})
    assert math.isinf(load_profile(tmp_path / "b.yaml")["x"].uncertainty)


def test_load_rejects_bad_files(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"format": "something-else", "constants": {}}))
    with pytest.raises(InputError):
        load_profile(bad)
    bad.write_text(yaml.safe_dump({"format": "planner-cluster-profile/1", "constants": {"eff": {"value": 1.0}}}))
    with pytest.raises(InputError):
        load_profile(bad)
    with pytest.raises(InputError):
        load_profile(tmp_path / "missing.yaml")
