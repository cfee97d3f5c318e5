"""``plan --schedule``: one name fixes the schedule; a comma list is the set the search tries
(each plan's schedule is one of them, and the list is checked name by name)."""

import json

from conftest import run_cli as _run


def test_schedule_list_is_searched():
    code, out, err = _run(["plan", "--model", "llama3.1-8b", "--gpus", "16", "-b", "64", "--pp", "2", "--engine", "torchtitan",
                           "--schedule", "1f1b,zb-v", "--top", "6", "--json"])
    assert code == 0, err
    scheds = {p["parallel"]["schedule"] for p in json.loads(out)["plans"]}
    assert scheds <= {"1f1b", "zb-v"} and scheds


def test_schedule_list_names_the_bad_entry():
    code, _, err = _run(["plan", "--schedule", "1f1b,zb-x"])
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "--schedule" in err and "1f1b,zb-x" in err and "comma list" in err


def test_a_schedule_the_engine_does_not_run_is_refused_not_dropped():
    code, _, err = _run(["plan", "--schedule", "1f1b,zb-h1,zb-v"])
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "got 'zb-h1,zb-v'" in err and "megatron-core runs (1f1b, interleaved)" in err and "zb-h1 runs on megatron-zb" in err


def test_emit_for_an_engine_plans_on_that_engine(tmp_path):
    code, out, err = _run(["plan", "--model", "llama3.1-8b", "--gpus", "8", "--emit", "deepspeed", "--out", str(tmp_path / "ds"),
                           "--top", "1", "--json"])
    assert code == 0, err
    assert json.loads(out)["engine"] == "deepspeed" and (tmp_path / "ds" / "ds_config.json").is_file()


def test_one_schedule_the_engine_does_not_run_is_refused_too():
    code, _, err = _run(["plan", "--schedule", "zb-h1"])
    assert code == 2 and "megatron-core runs (1f1b, interleaved)" in err and "zb-h1 runs on megatron-zb" in err


def test_interleaved_needs_virtual_stages():
    """--schedule interleaved with one chunk per rank is 1F1B under another name: refused (as zb-v
    and dualpipe without their two chunks), not priced as 1F1B silently."""
    code, _, err = _run(["estimate", "--model", "llama3.1-8b", "--gpus", "8", "-b", "64", "-s", "4096", "--pp", "2", "--schedule", "interleaved"])
    assert code == 2 and "parallel.vpp" in err and "interleaved" in err
    code, _, err = _run(["estimate", "--model", "llama3.1-8b", "--gpus", "8", "-b", "64", "-s", "4096", "--pp", "2", "--schedule", "interleaved",
                         "--vpp", "2"])
    assert code == 0, err


def test_one_f_one_b_with_virtual_stages_is_refused_not_turned_interleaved():
    for cmd in ("estimate", "plan"):
        code, _, err = _run([cmd, "--model", "gpt3-1.3b", "--gpus", "8", "--pp", "2", "--vpp", "2", "--schedule", "1f1b"])
        assert code == 2 and len(err.strip().splitlines()) == 1, (cmd, err)
        assert "--vpp: got 2" in err and "--schedule interleaved" in err


def test_single_chunk_schedules_refuse_virtual_stages():
    for engine, sched in (("torchtitan", "gpipe"), ("megatron-zb", "zb-h1"), ("megatron-zb", "zb-h2")):
        code, _, err = _run(["estimate", "--model", "gpt3-1.3b", "--gpus", "8", "--pp", "2", "--vpp", "2", "--schedule", sched,
                             "--engine", engine])
        assert code == 2 and f"1 with the {sched} schedule" in err, (engine, sched, err)
    code, _, err = _run(["estimate", "--model", "gpt3-1.3b", "--gpus", "8", "--pp", "2", "--vpp", "2", "--schedule", "interleaved",
                         "--engine", "torchtitan"])
    assert code == 0, err


def test_torchtitans_schedule_names_are_accepted_in_any_case():
    code, out, err = _run(["estimate", "--model", "llama3.1-8b", "--gpus", "16", "--pp", "2", "--vpp", "2", "--schedule", "Interleaved1F1B",
                           "--engine", "torchtitan", "--json"])
    assert code == 0, err
    assert json.loads(out)["parallel"]["schedule"] == "interleaved"
    code, out, err = _run(["plan", "--model", "llama3.1-8b", "--gpus", "16", "--pp", "2", "--engine", "torchtitan", "--schedule", "1F1B,ZBVZeroBubble",
                           "--top", "4", "--json"])
    assert code == 0, err
    assert {p["parallel"]["schedule"] for p in json.loads(out)["plans"]} <= {"1f1b", "zb-v"}
