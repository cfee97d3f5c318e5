"""``--cuda-graph`` and ``--moe-dispatcher`` on estimate and plan: the value is fixed (never
searched), reaches the prediction and the JSON, and a bad value is one line with exit code 2."""

import json

import pytest

from conftest import run_cli as _run

SMALL = ["--model", "gpt3-350m", "--gpu", "a100-sxm4-80gb", "--gpus", "8", "-s", "1024", "-b", "16"]


def test_estimate_prices_the_cuda_graph_flag():
    steps = {}
    for g in ("none", "layer", "full_iteration"):
        code, out, err = _run(["estimate", *SMALL, "--tp", "8", "--recompute", "none", "--cuda-graph", g, "--json"])
        assert code == 0, err
        doc = json.loads(out)
        assert doc["parallel"]["cuda_graph"] == g
        steps[g] = doc["predicted"]["step_time_s"]
    assert steps["full_iteration"] < steps["layer"] < steps["none"]


def test_plan_keeps_a_fixed_graph_and_dispatcher():
    code, out, err = _run(["plan", *SMALL, "--cuda-graph", "layer", "--top", "5", "--json"])
    assert code == 0, err
    plans = json.loads(out)["plans"]
    assert plans and all(p["parallel"]["cuda_graph"] == "layer" and p["parallel"]["recompute"] != "full" for p in plans)
    code, out, err = _run(["plan", "--model", "qwen3-30b-a3b", "--gpus", "16", "-s", "4096", "-b", "256", "--precision", "fp8",
                           "--moe-dispatcher", "hybridep", "--top", "3", "--json"])
    assert code == 0, err
    assert all(p["parallel"]["moe_dispatcher"] == "hybridep" for p in json.loads(out)["plans"])


@pytest.mark.parametrize("argv,flag", [(["estimate", "--cuda-graph", "partial"], "--cuda-graph"),
                                       (["plan", "--moe-dispatcher", "nccl"], "--moe-dispatcher"),
                                       (["estimate", *SMALL, "--tp", "8", "--recompute", "full", "--cuda-graph", "layer"], "parallel.cuda_graph"),
                                       (["estimate", "--engine", "torchtitan", "--cuda-graph", "layer"], "parallel.cuda_graph")])
def test_a_bad_value_is_one_line_exit_2(argv, flag):
    code, _, err = _run(argv)
    assert code == 2 and len(err.strip().splitlines()) == 1 and flag in err, err


def test_fp8_tp_gather_flag_reaches_the_price_the_json_and_the_header():
    """--fp8-tp-gather (torchao's Float8 TP, tensor-wise on torchtitan): the TP all-gathers move
    1-byte activations, so the step is faster; the JSON and the header say so; off tensor-wise
    or on Transformer Engine it is one line with exit code 2."""
    base = ["estimate", "--model", "llama3.1-8b", "--gpus", "8", "--tp", "4", "--zero", "3", "--engine", "torchtitan",
            "--precision", "fp8", "--fp8-recipe", "tensorwise"]
    steps = {}
    for flag in ("--fp8-tp-gather", "--no-fp8-tp-gather"):
        code, out, err = _run([*base, flag, "--json"])
        assert code == 0, err
        doc = json.loads(out)
        assert doc["predicted"]["fp8_tp_gather"] is (flag == "--fp8-tp-gather") and doc["job"]["fp8_tp_gather"] is (flag == "--fp8-tp-gather")
        steps[flag] = doc["predicted"]["step_time_s"]
    assert steps["--fp8-tp-gather"] < steps["--no-fp8-tp-gather"]
    code, out, err = _run([*base, "--fp8-tp-gather"])
    assert code == 0 and "FP8 TP gathers" in out.splitlines()[0]
    code, out, err = _run(["plan", *base[1:], "--fp8-tp-gather", "--top", "2", "--json"])
    assert code == 0, err
    assert all(p["predicted"]["fp8_tp_gather"] is (p["parallel"]["tp"] > 1) for p in json.loads(out)["plans"])
    for bad in (["--fp8-recipe", "rowwise"], ["--engine", "megatron-core"]):
        code, _, err = _run([*base, *bad, "--fp8-tp-gather"])
        assert code == 2 and "job.fp8_tp_gather" in err and len(err.strip().splitlines()) == 1


def test_sweep_and_hetero_take_the_job_flags(tmp_path):
    """--cross-entropy reaches sweep's prices (the fused loss is faster) and hetero's job; a value
    the engine lacks is sweep's row error (a sweep reports each GPU count) and hetero's one-line exit 2."""
    steps = {}
    for ce in ("unfused", "native"):
        code, out, err = _run(["sweep", "--model", "llama3.1-8b", "--gpus", "8", "--cross-entropy", ce, "--json"])
        assert code == 0, err
        steps[ce] = json.loads(out)["rows"][0]["step_time_s"]
    assert steps["native"] < steps["unfused"]
    f = tmp_path / "mixed.yaml"
    f.write_text("groups:\n  - {gpu: a100-sxm4-80gb, count: 8}\n  - {gpu: h100-sxm5-80gb, count: 8}\n"
                 "network: {kind: infiniband, gbps_per_nic: 200, nics_per_node: 8}\n")
    code, out, err = _run(["sweep", "--model", "llama3.1-8b", "--gpus", "8", "--cross-entropy", "torch", "--json"])
    assert code == 0 and json.loads(out)["rows"][0]["error"].startswith("job.cross_entropy")
    code, _, err = _run(["hetero", str(f), "--model", "llama3.1-8b", "-s", "4096", "-b", "64", "--cross-entropy", "torch"])
    assert code == 2 and "job.cross_entropy" in err and len(err.strip().splitlines()) == 1, err


def test_fp8_switches_off_on_a_16_bit_run_and_bare_groups():
    """--no-fp8-tp-gather / --no-fp8-param-gather on a bf16 run are what it does anyway (accepted);
    turning one on says it needs FP8; a command group called bare prints its help and exits 0."""
    for flag in ("--no-fp8-tp-gather", "--no-fp8-param-gather"):
        code, _, err = _run(["estimate", *SMALL, "--tp", "8", flag])
        assert code == 0, err
    code, _, err = _run(["estimate", *SMALL, "--tp", "8", "--fp8-tp-gather"])
    assert code == 2 and "need precision fp8" in err and len(err.strip().splitlines()) == 1
    for group in ("models", "hw", "engines"):
        code, out, err = _run([group])
        assert code == 0 and "Usage" in out and "error" not in err, (group, err)


def test_the_overlap_switches_are_flags_of_estimate_and_plan():
    """--[no-]overlap-grad-reduce, --[no-]overlap-param-gather, --[no-]tp-comm-overlap and
    --[no-]async-tp-allreduce fix the engine switches (check prices a script that sets none of
    them with them off, and estimate can now say the same); each off is slower, and plan keeps them."""
    base = ["--model", "llama3.1-8b", "--gpus", "16", "-b", "32", "--tp", "4", "--json"]
    code, out, err = _run(["estimate", *base])
    assert code == 0, err
    on = json.loads(out)
    assert all(on["parallel"][f] for f in ("overlap_grad_reduce", "overlap_param_gather", "tp_comm_overlap", "async_tp_allreduce"))
    for flag, field in (("--no-overlap-grad-reduce", "overlap_grad_reduce"), ("--no-overlap-param-gather", "overlap_param_gather"),
                        ("--no-tp-comm-overlap", "tp_comm_overlap"), ("--no-async-tp-allreduce", "async_tp_allreduce")):
        code, out, err = _run(["estimate", *base, flag])
        assert code == 0, err
        doc = json.loads(out)
        assert doc["parallel"][field] is False and doc["predicted"]["step_time_s"] >= on["predicted"]["step_time_s"], flag
    code, out, err = _run(["plan", "--model", "llama3.1-8b", "--gpus", "16", "-b", "32", "--no-tp-comm-overlap", "--top", "3", "--json"])
    assert code == 0, err
    assert all(p["parallel"]["tp_comm_overlap"] is False for p in json.loads(out)["plans"])


@pytest.mark.parametrize("argv,field", [
    (["--engine", "deepspeed", "--zero", "0", "--overlap-grad-reduce"], "parallel.overlap_grad_reduce"),  # overlap_comm is a ZeRO option
    (["--zero", "0", "--overlap-param-gather"], "parallel.overlap_param_gather"),  # no once-per-step gather without ZeRO 1/2
    (["--engine", "torchtitan", "--zero", "3", "--overlap-param-gather"], "parallel.overlap_param_gather"),
])
def test_an_overlap_the_sharding_mode_cannot_run_is_refused(argv, field):
    code, _, err = _run(["estimate", "--model", "llama3.1-8b", "--gpus", "16", "-b", "32", *argv])
    assert code == 2 and err.startswith(f"error: {field}: got True"), err


def test_plan_with_a_fixed_overlap_searches_only_the_stages_that_run_it():
    code, out, err = _run(["plan", "--model", "llama3.1-8b", "--gpus", "16", "-b", "32", "--engine", "deepspeed",
                           "--overlap-grad-reduce", "--top", "10", "--json"])
    assert code == 0, err
    plans = json.loads(out)["plans"]
    assert plans and all(p["parallel"]["zero"] >= 1 and p["parallel"]["overlap_grad_reduce"] for p in plans)
