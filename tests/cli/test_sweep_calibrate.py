"""CLI: planner sweep (Pareto rows, chart), planner goodput (Young/Daly closed forms),
planner plan --objective/--tokens/--profile, planner calibrate (profile round trip)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import yaml

from planner.cli.app import main
from planner.cli.sweep import parse_gpu_range
from planner.errors import InputError
from planner.studies.goodput import DEFAULT_GPU_FAILURE_RATE_PER_S


def run(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_gpu_range():
    assert parse_gpu_range("256..16384") == [256, 512, 1024, 2048, 4096, 8192, 16384]
    assert parse_gpu_range("100..300") == [128, 256]
    assert parse_gpu_range("64") == [64]
    for bad in ("0..8", "16..8", "x", "3..3"):
        with pytest.raises(InputError):
            parse_gpu_range(bad)


def test_sweep_json_and_chart(capsys, tmp_path):
    svg = tmp_path / "s.svg"
    code, out, err = run(capsys, "sweep", "--model", "gpt3-1.3b", "--gpu", "a100-sxm4-80gb", "--gpus", "8..32", "-s", "2048",
                         "-b", "64", "--tokens", "26B", "--price-per-gpu-hour", "2", "--chart", str(svg), "--json")
    assert code == 0, err
    rows = json.loads(out)["rows"]
    assert [r["gpus"] for r in rows] == [8, 16, 32]
    for r in rows:
        assert r["wall_time_s"] == pytest.approx(26e9 / r["tokens_per_s"] / r["goodput_fraction"])
        assert r["gpu_hours"] == pytest.approx(r["gpus"] * r["wall_time_s"] / 3600)
        assert r["cost"] == pytest.approx(2 * r["gpu_hours"])
    assert any(r["pareto"] for r in rows)
    fastest = min(rows, key=lambda r: r["wall_time_s"])
    assert fastest["pareto"]
    assert svg.read_text().lstrip().startswith(("<?xml", "<svg"))
    code, out, err = run(capsys, "sweep", "--model", "gpt3-1.3b", "--gpus", "8..32", "--chart", str(svg))
    assert code == 2 and "--chart" in err  # exists, no --force
    code, out, err = run(capsys, "sweep", "--model", "gpt3-1.3b", "--gpus", "9..15")
    assert code == 2


def test_goodput_cli_matches_young_daly_closed_forms(capsys):
    code, out, err = run(capsys, "goodput", "--params", "405B", "--gpus", "16384", "--tokens", "15.6T",
                         "--tokens-per-s", "2.5e6", "--restart-s", "600", "--ckpt-write-gbs", "2000", "--json")
    assert code == 0, err
    d = json.loads(out)
    M = 1 / (16384 * DEFAULT_GPU_FAILURE_RATE_PER_S)
    Cs = 405e9 * 14 / 2e12
    assert d["mtbf_s"] == pytest.approx(M, rel=1e-12)
    assert d["checkpoint_s"] == pytest.approx(Cs, rel=1e-12)
    assert d["young_interval_s"] == pytest.approx(math.sqrt(2 * Cs * M), rel=1e-12)
    xi = Cs / (2 * M)
    assert d["daly_interval_s"] == pytest.approx(math.sqrt(2 * Cs * M) * (1 + math.sqrt(xi) / 3 + xi / 9) - Cs, rel=1e-12)
    tau = d["daly_interval_s"]
    g = tau / (M * math.exp(600 / M) * (math.exp((tau + Cs) / M) - 1))
    assert d["goodput_fraction"] == pytest.approx(g, rel=1e-12)
    assert d["wall_time_s"] == pytest.approx(15.6e12 / 2.5e6 / g, rel=1e-12)
    assert d["goodput_fraction"] == pytest.approx(0.9263, abs=1e-4)  # docs/goodput.md worked example
    # Daly's Fig. 3-5 case through the CLI: C = 5 min (via bandwidth), M = 24 h, tau = 117 min
    rate_h = 1 / 24.0
    code, out, _ = run(capsys, "goodput", "--params", "1e9", "--gpus", "1", "--failure-rate", str(rate_h),
                       "--ckpt-write-gbs", str(14e9 / 300 / 1e9), "--restart-s", "600", "--json")
    assert code == 0
    assert json.loads(out)["daly_interval_s"] / 60 == pytest.approx(116.69, abs=0.01)
    assert run(capsys, "goodput", "--params", "lots", "--gpus", "8")[0] == 2
    assert run(capsys, "goodput", "--params", "405B", "--model", "llama3.1-8b")[0] == 2  # one or the other


def test_goodput_runs_on_the_default_cluster_like_plan(capsys):
    """`planner goodput` alone: the default cluster of `planner plan` (DEFAULTS), its best plan's throughput."""
    from planner.cli.common import DEFAULTS

    code, out, err = run(capsys, "goodput", "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["n_gpus"] == DEFAULTS["gpus"] and d["n_params"] == pytest.approx(70.55e9, rel=1e-3)
    assert d["tokens_per_s"] > 0 and d["n_tokens"] == pytest.approx(20 * d["n_params"])
    code, out, err = run(capsys, "goodput")
    assert code == 0, err
    assert out.startswith("70.6B parameters on 64 GPUs (Llama 3.1 70B)")
    assert "8 nodes x 1.94 GB/s" in out and "--ckpt-write-gbs" in out


def test_checkpoint_bandwidth_scales_with_the_job(capsys):
    """128 GPUs are 16 nodes writing at 1.94 GB/s each (DGX SuperPOD 'Best' guideline, 62 GB/s per
    32-node SU), not the 2 TB/s of Meta's 16K-GPU Tectonic; 16K GPUs reach that cap."""
    code, out, _ = run(capsys, "goodput", "--params", "70B", "--gpus", "128", "--tokens-per-s", "1e5", "--json")
    assert code == 0
    d = json.loads(out)
    assert d["write_bandwidth_bytes_per_s"] == pytest.approx(16 * 62e9 / 32)
    assert d["checkpoint_s"] == pytest.approx(70e9 * 14 / (16 * 62e9 / 32))  # ~31.6 s, not 0.49 s
    assert d["checkpoint_s"] > 30
    code, out, _ = run(capsys, "goodput", "--params", "405B", "--gpus", "16384", "--tokens-per-s", "2.5e6", "--json")
    assert json.loads(out)["write_bandwidth_bytes_per_s"] == pytest.approx(2e12)
    code, out, _ = run(capsys, "goodput", "--params", "70B", "--gpus", "128", "--tokens-per-s", "1e5",
                       "--ckpt-write-gbs", "100", "--json")
    d = json.loads(out)
    assert d["write_bandwidth_bytes_per_s"] == 100e9 and d["write_bandwidth_source"] == "--ckpt-write-gbs"


def test_plan_objective_goodput_and_tokens(capsys):
    base = ["plan", "--model", "gpt3-1.3b", "--gpu", "a100-sxm4-80gb", "--gpus", "16", "-s", "2048", "-b", "64", "--top", "3"]
    code, out, err = run(capsys, *base, "--json")
    assert code == 0, err
    plain = json.loads(out)
    code, out, err = run(capsys, *base, "--objective", "goodput", "--tokens", "26B", "--price-per-gpu-hour", "2", "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["search"]["objective"] == "goodput" and 0 < d["search"]["goodput_fraction"] < 1
    # one GPU count: the goodput factor is common, so the ranking is the time ranking
    assert [p["predicted"]["step_time_s"] for p in d["plans"]] == [p["predicted"]["step_time_s"] for p in plain["plans"]]
    gp = d["goodput"]
    assert gp["n_gpus"] == 16 and gp["cost"] == pytest.approx(2 * gp["gpu_hours"])
    assert gp["wall_time_s"] == pytest.approx(26e9 / d["plans"][0]["predicted"]["tokens_per_s"] / gp["goodput_fraction"])
    code, out, err = run(capsys, *base, "--objective", "goodput")
    assert code == 0 and "goodput (daly)" in out
    assert run(capsys, *base, "--objective", "speed")[0] == 2


RUN_CONFIGS = [
    ("gpt3-350m", "a100-sxm4-80gb", 8, 2048, 64, dict(tp=1, pp=1, dp=8, micro_batch_size=4)),
    ("gpt3-1.3b", "a100-sxm4-80gb", 16, 2048, 128, dict(tp=2, pp=1, dp=8, micro_batch_size=2, zero=1)),
    ("gpt3-2.7b", "h100-sxm5-80gb", 16, 2048, 256, dict(tp=2, pp=2, dp=4, micro_batch_size=2, sequence_parallel=True)),
    ("gpt3-6.7b", "a100-sxm4-80gb", 32, 2048, 512, dict(tp=4, pp=2, dp=4, micro_batch_size=4, recompute="full")),
    ("gpt3-125m", "h100-sxm5-80gb", 8, 1024, 256, dict(tp=1, pp=1, dp=8, micro_batch_size=32)),
    ("gpt3-760m", "h100-sxm5-80gb", 8, 2048, 64, dict(tp=1, pp=1, dp=8, micro_batch_size=1, zero=3)),
    ("gpt3-13b", "a100-sxm4-80gb", 64, 2048, 512, dict(tp=8, pp=2, dp=4, micro_batch_size=1)),
    ("gpt3-2.7b", "a100-sxm4-80gb", 8, 2048, 32, dict(tp=1, pp=1, dp=8, micro_batch_size=1, zero=1)),
]


def _runs_file(path, truth):
    """A planner-runs/1 file whose measured step times are the cost model's at ``truth`` (+2 % noise)."""
    from planner.calibration.profile import predict_step_time, prepare_runs
    from planner.io.loaders import load_runs

    rows = []
    for i, (m, g, n, s, b, p) in enumerate(RUN_CONFIGS):
        spec = yaml.safe_load(open(f"models/{m}.yaml"))
        model = {k: spec[k] for k in ("layers", "hidden", "heads", "ffn_hidden", "vocab") if k in spec}
        model.update(name=m, kv_heads=spec.get("kv_heads") or spec["heads"], mlp=spec.get("mlp", "gelu"))
        par = {"tp": 1, "pp": 1, "dp": 1, "cp": 1, "ep": 1, "vpp": 1, "micro_batch_size": 1, "recompute": "none",
               "sequence_parallel": False, "zero": 0, **p}
        rows.append({"id": f"run{i}", "model": model, "job": {"seq_len": s, "global_batch_size": b, "precision": "bf16"},
                     "hardware": {"gpu": g, "num_gpus": n, "gpus_per_node": 8,
                                  "inter_node": {"kind": "infiniband", "gbps_per_nic": 200, "nics_per_node": 8}},
                     "parallel": par, "measured": {"step_time_s": 1.0, "basis": "synthetic"}})
    path.write_text(json.dumps({"schema": "planner-runs/1", "runs": rows}))
    runs = prepare_runs(load_runs(path))
    noise = 1 + 0.02 * np.random.default_rng(3).standard_normal(len(runs))
    for row, r, e in zip(rows, runs, noise):
        row["measured"]["step_time_s"] = predict_step_time(truth, r) * float(e)
    path.write_text(json.dumps({"schema": "planner-runs/1", "runs": rows}))


def test_calibrate_cli_profile_round_trip(capsys, tmp_path):
    truth = {"TRAINING_KERNEL_EFFICIENCY": 0.7, "HBM_STREAM_EFFICIENCY": 0.6}
    runs, prof = tmp_path / "runs.json", tmp_path / "cluster.yaml"
    _runs_file(runs, truth)
    code, out, err = run(capsys, "calibrate", str(runs), "--out", str(prof), "--fit",
                         "TRAINING_KERNEL_EFFICIENCY,HBM_STREAM_EFFICIENCY", "--json")
    assert code == 0, err
    d = json.loads(out)
    for k, v in truth.items():
        c = d["constants"][k]
        assert abs(c["value"] - v) <= 3 * c["uncertainty"], (k, c)
    saved = yaml.safe_load(prof.read_text())
    assert saved["format"] == "planner-cluster-profile/1"
    assert set(saved["constants"]) == set(truth)
    # refuses to overwrite without --force; text output with --force
    assert run(capsys, "calibrate", str(runs), "--out", str(prof))[0] == 2
    code, out, err = run(capsys, "calibrate", str(runs), "--out", str(prof), "--force")
    assert code == 0, err
    assert "TRAINING_KERNEL_EFFICIENCY" in out and "profile written" in out
    assert run(capsys, "calibrate", str(runs), "--out", str(tmp_path / "x.yaml"), "--fit", "NOPE")[0] == 2
    # plan --profile uses the fitted (slower) constants
    base = ["plan", "--model", "gpt3-1.3b", "--gpu", "a100-sxm4-80gb", "--gpus", "8", "-s", "2048", "-b", "64",
            "--top", "1", "--json"]
    t0 = json.loads(run(capsys, *base)[1])["plans"][0]["predicted"]["step_time_s"]
    code, out, err = run(capsys, *base, "--profile", str(prof))
    assert code == 0, err
    assert json.loads(out)["plans"][0]["predicted"]["step_time_s"] > 1.1 * t0
    t2 = json.loads(run(capsys, *base)[1])["plans"][0]["predicted"]["step_time_s"]
    assert t2 == pytest.approx(t0, rel=1e-12)  # constants restored after the command
    assert run(capsys, *base, "--profile", str(tmp_path / "missing.yaml"))[0] == 2


def test_example_runs_file_recovers_its_truth(capsys):
    """README's calibration example: examples/my_runs.json was made by _runs_file at kernel
    efficiency 0.7 and HBM efficiency 0.6; calibrating it finds both within 3 sigma."""
    from pathlib import Path

    runs = Path(__file__).resolve().parents[2] / "examples" / "my_runs.json"
    code, out, err = run(capsys, "calibrate", str(runs), "--out", "/dev/null", "--force", "--json")
    assert code == 0, err
    c = json.loads(out)["constants"]
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    for k, v in {"TRAINING_KERNEL_EFFICIENCY": 0.7, "HBM_STREAM_EFFICIENCY": 0.6}.items():
        assert abs(c[k]["value"] - v) <= c[k]["uncertainty"], (k, c[k])  # "Both true values are within 1 sigma"
        # the README's example output is this fit (regenerate examples/my_runs.json with _runs_file when the model changes)
        row = next(ln.split() for ln in readme.splitlines() if ln.startswith(k + " "))
        assert (float(row[2]), float(row[3])) == (round(c[k]["value"], 4), round(c[k]["uncertainty"], 4)), (k, row, c[k])


def test_calibrate_writes_no_profile_from_constants_driven_to_their_bounds(capsys, tmp_path):
    """Runs 100x slower than any constant can explain (seconds mistaken for centiseconds, say)
    drive the fit to its bounds: no profile is written, exit 1, and the message says why."""
    from pathlib import Path

    doc = json.loads((Path(__file__).resolve().parents[2] / "examples" / "my_runs.json").read_text())
    for r in doc["runs"]:
        r["measured"]["step_time_s"] *= 100
    runs, prof = tmp_path / "slow.json", tmp_path / "p.yaml"
    runs.write_text(json.dumps(doc))
    code, out, err = run(capsys, "calibrate", str(runs), "--out", str(prof))
    assert code == 1 and not prof.exists()
    assert "(at bound)" in out and "no profile written" in err
    code, out, err = run(capsys, "calibrate", str(runs), "--out", str(prof), "--json")
    assert code == 1 and not prof.exists()
    d = json.loads(out)
    assert d["profile"] is None and d["at_bound"]
