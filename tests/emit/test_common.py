"""Plan validation, provenance in every file, all-or-nothing writes, and the `planner launch` CLI."""

from __future__ import annotations

import copy
import json
import os
import stat

import pytest

from emit_helpers import ALL_PLANS, FIXTURES, load
from planner.emit import emit_bundle, emit_files, write_files
from planner.errors import InputError


@pytest.mark.parametrize("fixture,rank", ALL_PLANS)
def test_every_file_names_version_plan_and_prediction(fixture, rank):
    files, _ = emit_bundle(load(fixture), "all", rank)
    for name, text in files.items():
        assert "planner 0.1.0" in text, name
        assert f"plan rank {rank}" in text or f'"plan_rank": {rank}' in text, name
        if name != "hostfile":
            assert "tp=" in text or '"tp":' in text, name
        if name not in ("hostfile",):
            assert "step time" in text and "peak memory" in text, name


def _mutate(changes: dict):
    doc = copy.deepcopy(load("llama70b_64gpu"))
    for path, value in changes.items():
        obj = doc
        keys = path.split(".")
        for k in keys[:-1]:
            obj = obj[int(k)] if isinstance(obj, list) else obj[k]
        obj[keys[-1]] = value
    return doc


@pytest.mark.parametrize("changes,field", [
    ({"schema": "other/1"}, "plan.schema"),
    ({"hardware.num_gpus": 32}, "hardware.num_gpus"),
    ({"hardware.num_gpus": 32, "hardware.num_nodes": 4}, "parallel"),  # tp*pp*dp*cp != GPUs
    ({"job.global_batch_size": 500}, "job.global_batch_size"),
    ({"model.heads": 60, "model.kv_heads": 4}, "parallel.tp"),  # 60 heads % tp 8
    ({"model.kv_heads": 12, "model.heads": 48}, "parallel.tp"),
    ({"plans.0.parallel.layers_per_stage": [18, 22, 22, 20]}, "parallel.layers_per_stage"),
    ({"plans.0.parallel.zero": 5}, "parallel.zero"),
    ({"plans.0.parallel.ep": 2}, "parallel.ep"),  # dense model
    ({"plans.1.parallel.cp": 4, "plans.1.parallel.dp": 1, "plans.1.parallel.num_microbatches": 256,
      "job.seq_len": 8190}, "job.seq_len"),
])
def test_bad_plans_raise_input_error(changes, field):
    rank = 2 if any(k.startswith("plans.1") for k in changes) else 1
    with pytest.raises(InputError) as exc:
        emit_files(_mutate(changes), "megatron", rank)
    assert exc.value.field.startswith(field), exc.value


def test_unknown_rank_and_engine():
    with pytest.raises(InputError, match="plan_rank"):
        emit_files(load("llama70b_64gpu"), "megatron", 9)
    with pytest.raises(InputError, match="engine"):
        emit_files(load("llama70b_64gpu"), "jax", 1)


def test_write_files_all_or_nothing(tmp_path):
    files = emit_files(load("gpt_dense_16gpu"), "all", 1)  # Megatron-LM and DeepSpeed run it and fit
    out = tmp_path / "out"
    written = write_files(files, out)
    assert sorted(p.name for p in written) == sorted(files)
    assert all((out / n).read_text() == c for n, c in files.items())
    assert os.stat(out / "megatron_launch.sh").st_mode & stat.S_IXUSR
    assert not os.stat(out / "ds_config.json").st_mode & stat.S_IXUSR
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temp files left
    # One pre-existing target: nothing is written, nothing is touched.
    out2 = tmp_path / "out2"
    out2.mkdir()
    (out2 / "hostfile").write_text("mine\n")
    with pytest.raises(InputError, match="--force"):
        write_files(files, out2)
    assert [p.name for p in out2.iterdir()] == ["hostfile"] and (out2 / "hostfile").read_text() == "mine\n"
    write_files(files, out2, force=True)
    assert (out2 / "hostfile").read_text() == files["hostfile"]


def test_write_files_rejects_paths(tmp_path):
    with pytest.raises(InputError):
        write_files({"../x": "y"}, tmp_path)
    with pytest.raises(InputError):
        write_files({}, tmp_path)


def test_write_failure_leaves_no_partial_files(tmp_path, monkeypatch):
    files = {"a.txt": "a", "b.txt": "b"}
    real_replace = os.replace
    calls = []

    def fail_fsync(fd):
        calls.append(fd)
        if len(calls) == 2:
            raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", fail_fsync)
    with pytest.raises(InputError) as exc:  # the folder named by --out cannot take the files: exit 2, the OS reason kept
        write_files(files, tmp_path)
    assert isinstance(exc.value.__cause__, OSError) and "disk full" in str(exc.value) and exc.value.flag == "--out"
    monkeypatch.setattr(os, "replace", real_replace)
    assert list(tmp_path.iterdir()) == []


def test_cli_launch(tmp_path, capsys):
    from planner.cli.app import main

    plan = str(FIXTURES / "llama70b_64gpu.json")
    out = tmp_path / "o"
    assert main(["launch", plan, "--engine", "megatron", "--out", str(out)]) == 0
    assert (out / "megatron_launch.sh").exists() and (out / "plan_summary.txt").exists()
    assert main(["launch", plan, "--engine", "megatron", "--out", str(out)]) == 2  # exists, no --force
    assert "--force" in capsys.readouterr().err
    assert main(["launch", plan, "--engine", "megatron", "--out", str(out), "--force", "--plan-rank", "3"]) == 0
    assert "plan rank 3" in (out / "megatron_launch.sh").read_text()
    assert main(["launch", plan, "--engine", "megatron", "--out", str(tmp_path / "m2"), "--plan-rank", "2"]) == 2
    assert "megatron-core" in capsys.readouterr().err  # Megatron-FSDP with a pipeline: the engine's reason
    assert main(["launch", plan, "--engine", "deepspeed", "--out", str(tmp_path / "d")]) == 2
    assert not (tmp_path / "d").exists()
    assert main(["launch", plan, "--engine", "all", "--out", str(tmp_path / "a")]) == 0
    assert "skipped deepspeed" in capsys.readouterr().err
    assert main(["launch", plan, "--engine", "slurm", "--slurm-engine", "torchtitan", "--plan-rank", "2", "--out", str(tmp_path / "s")]) == 0
    assert (tmp_path / "s" / "slurm_torchtitan.sbatch").exists() and (tmp_path / "s" / "torchtitan_job.toml").exists()
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert main(["launch", str(bad), "--engine", "megatron", "--out", str(tmp_path / "b")]) == 2
    assert main(["launch", plan, "--engine", "nope", "--out", str(tmp_path / "n")]) == 2
    json.loads((FIXTURES / "llama70b_64gpu.json").read_text())  # fixture untouched


def test_emit_all_prices_each_engine_and_leaves_out_those_it_does_not_fit():
    """--emit all re-prices the plan on each target engine: the files carry that engine's
    prediction, and an engine on which the plan does not fit is left out with the reason (a
    megatron-core plan of Llama 3.1 8B at 8K with tp 2 needs ~480 GiB per GPU on Megatron-DeepSpeed,
    whose attention is unfused)."""
    from planner.emit.bundle import emit_bundle  # noqa: PLC0415

    files, skipped = emit_bundle(load("gpt_dense_16gpu"), "all", 1)
    assert "ds_config.json" in files and "megatron_launch.sh" in files
    assert "Priced again on" in files["plan_summary.txt"]
    files, skipped = emit_bundle(load("llama8b_fsdp_64gpu"), "all", 1)
    assert "ds_config.json" not in files and "priced on megatron-deepspeed, the plan needs" in skipped["deepspeed"]


def test_launch_notes_say_how_to_run_the_priced_attention_kernels():
    """A plan priced with FlashAttention-2, or with the GPU's best flash kernels on DeepSpeed (whose
    Hugging Face models run SDPA's FlashAttention-2 unless told), says how to get them; a flash plan
    on Megatron-core (its own kernels) and on Ampere (where FA2 is the best) says nothing."""
    from conftest import run_cli

    def notes(gpu: str, engine: str, attention: str) -> str:
        code, out, err = run_cli(["plan", "--model", "llama3.1-8b", "--gpu", gpu, "--gpus", "8", "-s", "4096", "-b", "32",
                                  "--engine", engine, "--attention", attention, "--zero", "3" if engine == "deepspeed" else "1",
                                  "--top", "1", "--json"])
        assert code == 0, err
        files, _ = emit_bundle(json.loads(out), "deepspeed" if engine == "deepspeed" else "megatron", 1)
        return "\n".join(files.values())

    assert "fastest flash attention" in notes("h100-sxm5-80gb", "deepspeed", "flash")
    assert "FlashAttention-2's attention kernels" in notes("h100-sxm5-80gb", "deepspeed", "fa2")
    assert "fastest flash attention" not in notes("a100-sxm4-80gb", "deepspeed", "flash")
    assert "fastest flash attention" not in notes("h100-sxm5-80gb", "megatron-core", "flash")


def test_launch_takes_rank_as_explain_spells_it(tmp_path):
    """`planner launch --rank N` (explain's and the pictures' spelling) is --plan-rank N."""
    from conftest import run_cli

    doc = tmp_path / "plan.json"
    doc.write_text(json.dumps(load("llama70b_64gpu")))
    outs = {}
    for flag in ("--rank", "--plan-rank"):
        code, _, err = run_cli(["launch", str(doc), "--engine", "megatron", flag, "3", "--out", str(tmp_path / flag)])
        assert code == 0, err
        outs[flag] = (tmp_path / flag / "megatron_launch.sh").read_text()
    assert outs["--rank"] == outs["--plan-rank"] and "plan rank 3" in outs["--rank"]
