"""Mixed GPU clusters: the placement/split program against the even split and the homogeneous model."""

from __future__ import annotations

import pytest

from planner.cli.app import main
from planner.cost.estimate import estimate
from planner.errors import InputError
from planner.io.loaders import load_gpu, load_hetero, load_model, make_cluster
from planner.search.hetero import GpuGroup, HeteroCluster, hetero_evaluate, hetero_place, hetero_plan
from planner.specs import Job, ParallelConfig

A100, H100 = load_gpu("a100-sxm4-80gb"), load_gpu("h100-sxm5-80gb")
MODEL = load_model("llama3.1-8b")
JOB = Job(4096, 64)
PAR = ParallelConfig(tp=8, pp=4, dp=1, micro_batch_size=1, sequence_parallel=True, zero=1)


def group(gpu, count):
    return GpuGroup(make_cluster(gpu, count, 8), count)


def mixed(a100=16, h100=16):
    return HeteroCluster("mixed", (group(A100, a100), group(H100, h100)))


def test_uneven_split_beats_even_on_two_h100_and_two_a100_stages():
    hc = mixed()
    best = hetero_place(MODEL, hc, JOB, PAR)
    assert best is not None and best.fits
    assert sorted(best.placement) == [0, 0, 1, 1]  # each group hosts exactly its 2 stage slots
    h = [n for g, n in zip(best.placement, best.layers_per_stage) if g == 1]
    a = [n for g, n in zip(best.placement, best.layers_per_stage) if g == 0]
    assert min(h) > max(a)  # more layers on every H100 stage than on any A100 stage
    assert sum(best.layers_per_stage) == MODEL.layers
    even = hetero_evaluate(MODEL, hc, JOB, PAR, best.placement, (8, 8, 8, 8))
    # H100 layers run ~2-3x faster; the host launch time per layer (the same on both) damps it
    assert best.step_time_s < 0.9 * even.step_time_s
    # the program's optimum is no worse than any even split on any placement
    for placement in ((0, 0, 1, 1), (1, 1, 0, 0), (0, 1, 1, 0), (1, 0, 0, 1)):
        assert best.step_time_s <= hetero_evaluate(MODEL, hc, JOB, PAR, placement, (8, 8, 8, 8)).step_time_s + 1e-12


def test_one_group_reproduces_the_homogeneous_estimate():
    hc = HeteroCluster("h100", (group(H100, 32),))
    for split in ((8, 8, 8, 8), (9, 8, 8, 7)):
        het = hetero_evaluate(MODEL, hc, JOB, PAR, (0, 0, 0, 0), split)
        par = ParallelConfig(**{**PAR.__dict__, "layers_per_stage": split})
        est = estimate(MODEL, hc.group_cluster(0, 32), JOB, par)
        assert het.step_time_s == pytest.approx(est.step_time_s, rel=1e-12)
        assert max(het.stage_memory_bytes) == pytest.approx(est.memory_peak_bytes, rel=1e-12)
        # and fits exactly where estimate says it fits: both keep the memory margin free
        assert het.fits == est.fits and max(het.stage_capacity_bytes) == pytest.approx(est.memory_usable_bytes, rel=1e-12)


def test_a_one_group_plan_fits_as_planner_estimate_prices_it():
    """The search's best on one group of 64 H100 fits under planner.estimate (the margin kept free:
    it once chose a stage at 76.1 GiB of 79.6, over the 75.6 usable)."""
    hc = HeteroCluster("h100", (group(H100, 64),))
    model, job = load_model("llama3.1-70b"), Job(8192, 256)
    best, _ = hetero_plan(model, hc, job, {}, top_k=1)[0][0]
    par = ParallelConfig(**{**best.parallel.__dict__, "layers_per_stage": best.layers_per_stage})
    assert estimate(model, hc.group_cluster(0, 64), job, par).fits


def test_group_capacity_limits_placement():
    hc = mixed(a100=32, h100=8)  # one H100 stage slot only
    best = hetero_place(MODEL, hc, JOB, PAR)
    assert best.placement.count(1) == 1
    assert hetero_place(MODEL, mixed(a100=8, h100=8), JOB, PAR) is None  # 2 slots < 4 stages


def test_search_returns_plans_with_even_split_comparison():
    pairs, n_cand, stats, proven = hetero_plan(MODEL, mixed(), JOB, {"tp": 8, "micro_batch_size": 1, "recompute": "none"}, top_k=2)
    assert proven and n_cand >= 1 and stats.programs >= 1
    best, even = pairs[0]
    assert best.step_time_s <= even.step_time_s


def test_load_and_bad_input(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("groups:\n  - {gpu: a100-sxm4-80gb, count: 64}\n  - {gpu: h100-sxm5-80gb, count: 32}\n"
                 "network: {kind: infiniband, gbps_per_nic: 200, nics_per_node: 8}\n")
    hc = load_hetero(f)
    assert hc.num_gpus == 96 and hc.groups[1].gpu.id == "h100-sxm5-80gb"
    assert hc.group_cluster(0, 64).inter.gbps_per_nic == 200
    bad = tmp_path / "bad.yaml"
    bad.write_text("groups:\n  - {gpu: a100-sxm4-80gb, count: 0}\n")
    with pytest.raises(InputError):
        load_hetero(bad)
    assert main(["hetero", str(bad)]) == 2
    with pytest.raises(InputError):
        hetero_evaluate(MODEL, mixed(), JOB, PAR, (0, 0, 1, 1), (8, 8, 8, 9))


def test_cli_hetero_json(tmp_path, capsys):
    import json

    f = tmp_path / "c.yaml"
    f.write_text("groups:\n  - {gpu: a100-sxm4-80gb, count: 16}\n  - {gpu: h100-sxm5-80gb, count: 16}\n")
    code = main(["hetero", str(f), "--model", "llama3.1-8b", "-s", "4096", "-b", "64", "--tp", "8", "--pp", "4",
                 "--mb", "1", "--recompute", "none", "--top", "1", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    d = json.loads(out)["plans"][0]
    assert d["step_time_s"] < d["even_split"]["step_time_s"]
    assert sorted(d["placement"]) == ["a100-sxm4-80gb"] * 2 + ["h100-sxm5-80gb"] * 2


@pytest.mark.parametrize("opg", [False, True])
def test_placement_program_matches_enumeration_with_two_part_dp_sync(opg):
    """With ZeRO-1 the gradient synchronisation has two overlapped parts (reduce-scatter beside
    the backward, and with overlap_param_gather the weight gather beside the forward); the
    program's optimum equals the best of every placement and split."""
    import itertools  # noqa: PLC0415

    from planner.specs import ModelSpec  # noqa: PLC0415

    model = ModelSpec(name="g", layers=12, hidden=2048, heads=16, kv_heads=16, ffn_hidden=8192, vocab=32000)
    hc = HeteroCluster("mixed", (group(A100, 32), group(H100, 32)))
    job = Job(512, 16)
    par = ParallelConfig(tp=4, pp=4, dp=4, micro_batch_size=1, sequence_parallel=True, zero=1, overlap_param_gather=opg)
    best = hetero_place(model, hc, job, par)
    every = [hetero_evaluate(model, hc, job, par, pl, tuple(y - x for x, y in zip((0, *c, 12), (*c, 12))))
             for pl in itertools.product((0, 1), repeat=4) if pl.count(0) <= 2 and pl.count(1) <= 2
             for c in itertools.combinations(range(1, 12), 3)]
    brute = min(e.step_time_s for e in every if e.fits)
    assert best is not None and best.step_time_s == pytest.approx(brute, rel=1e-9)


def test_cli_hetero_time_limit_exits_3_and_one_stage_is_refused(tmp_path, capsys):
    """A search cut short prints its best plans and exits 3, as plan does (the global --time-limit
    bounds it); --pp 1 is one GPU type's job, refused with a pointer to planner plan; a cluster with
    fewer than two stage slots says why nothing is placed."""
    f = tmp_path / "c.yaml"
    f.write_text("groups:\n  - {gpu: a100-sxm4-80gb, count: 64}\n  - {gpu: h100-sxm5-80gb, count: 64}\n")
    assert main(["--time-limit", "0.5", "hetero", str(f), "--model", "llama3.1-70b", "-s", "4096", "-b", "256"]) == 3
    got = capsys.readouterr()
    assert "hit: best so far" in got.out or "time limit of 0.5 s hit" in got.err  # plans so far, or none yet
    assert main(["hetero", str(f), "--model", "gpt3-125m", "--pp", "1"]) == 2
    assert "parallel.pp: got 1, expected at least 2" in capsys.readouterr().err
    assert main(["hetero", str(f), "--model", "gpt3-125m", "--tp", "3"]) == 2
    assert "parallel.tp: got 3, expected a divisor of the GPUs per node (8)" in capsys.readouterr().err
    one = tmp_path / "one.yaml"
    one.write_text("groups:\n  - {gpu: h100-sxm5-80gb, count: 1, gpus_per_node: 1}\n")
    assert main(["hetero", str(one), "--model", "gpt3-125m", "-s", "2048", "-b", "8"]) == 1
    assert "hetero places at least 2 pipeline stages" in capsys.readouterr().err
