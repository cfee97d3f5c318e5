"""``planner check LAUNCH.sh`` for torchtitan: the job file the script starts, its world and its
``--section.key`` overrides (planner.check.titan_launch)."""

from __future__ import annotations

import shutil

import pytest

from planner.check import check_job, read_job
from planner.errors import InputError

from tests.conftest import SHARED_ENGINES, run_cli

TT_TOML = SHARED_ENGINES / "torchtitan" / "v0.2-toml" / "llama3_8b.toml"
needs_toml = pytest.mark.skipif(not TT_TOML.is_file(), reason="../shared/engines (torchtitan's job configs) is not beside the project")


def _launch(tmp_path, name: str, args: str):
    """torchtitan's llama3_8b.toml beside a script ``name`` that starts it with ``args`` after the job file."""
    shutil.copy(TT_TOML, tmp_path / "llama3_8b.toml")
    (tmp_path / name).write_text(f"torchrun --nproc_per_node 8 -m torchtitan.train --job.config_file llama3_8b.toml {args}\n")
    return read_job([str(tmp_path / name)])


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    out = tmp_path_factory.mktemp("tt")
    code, _, err = run_cli(["plan", "--model", "llama3.1-8b", "--gpus", "16", "--engine", "torchtitan", "--emit", "torchtitan",
                            "--out", str(out / "job"), "--top", "1"])
    assert code == 0, err
    return out / "job"


def test_planners_own_launch_scripts_read_as_their_job_files(launched):
    """Each launch script alone reads the job it starts: the same job as its TOML / config module."""
    toml = read_job([str(launched / "torchtitan_job.toml")])
    for script in ("torchtitan_launch.sh", "torchtitan030_launch.sh"):
        cj = read_job([str(launched / script)])
        assert cj.parallel == toml.parallel and cj.cluster.num_gpus == 16, script
        assert cj.files[0].endswith(script)  # listed first: an edit is read back with it
    code, out, err = run_cli(["check", str(launched / "torchtitan_launch.sh")])
    assert code == 0, err
    assert "torchtitan_launch.sh, " in out and "torchtitan_job.toml  [torchtitan-toml" in out


@needs_toml
def test_world_and_overrides_of_a_users_script(tmp_path):
    shutil.copy(TT_TOML, tmp_path / "llama3_8b.toml")
    (tmp_path / "train.sh").write_text(
        "#!/bin/bash\nNNODES=2\n"
        "torchrun --nnodes $NNODES --nproc_per_node=8 -m torchtitan.train --job.config_file llama3_8b.toml \\\n"
        "  --parallelism.tensor_parallel_degree 2 --parallelism.pipeline_parallel_degree=2 --training.local_batch_size 4 \\\n"
        "  --parallelism.no_disable_loss_parallel\n")
    cj = read_job([str(tmp_path / "train.sh")])
    p = cj.parallel
    assert cj.cluster.num_gpus == 16 and cj.cluster.gpus_per_node == 8
    assert "torchrun --nproc-per-node 8 x --nnodes 2" in cj.sources["hardware.num_gpus"][1].where
    assert (p.tp, p.pp, p.dp) == (2, 2, 4)  # dp_shard = -1: the rest of 16
    assert cj.job.global_batch_size == 16 and p.micro_batch_size == 1  # local batch 4 x dp 4; pipeline micro-batches of 1
    assert "train.sh:3 --parallelism.tensor_parallel_degree" in cj.sources["parallel.tp"][1].where
    # an edit of a degree the command line sets cannot go into the TOML: refused, naming the flag
    r = check_job(cj, top=3, time_limit_s=4)
    refused = [ed for ed in r.edits if ed is not None and "command line" in ed.problem]
    assert refused and all("--parallelism.tensor_parallel_degree" in ed.problem and ed.verified is False for ed in refused)
    assert any(ed is not None and ed.verified for ed in r.edits)  # a change of TOML-only keys is written and read back


@needs_toml
def test_run_train_sh_reads_config_file_and_ngpu(tmp_path):
    shutil.copy(TT_TOML, tmp_path / "llama3_8b.toml")
    (tmp_path / "go.sh").write_text("NGPU=4 CONFIG_FILE=./llama3_8b.toml ./run_train.sh --parallelism.tensor_parallel_degree 2\n")
    cj = read_job([str(tmp_path / "go.sh")])
    assert cj.cluster.num_gpus == 4 and (cj.parallel.tp, cj.parallel.dp) == (2, 2)


@needs_toml
def test_bad_launches_get_one_line_errors(tmp_path):
    shutil.copy(TT_TOML, tmp_path / "llama3_8b.toml")
    cases = {
        "nofile.sh": ("torchrun --nproc_per_node 8 -m torchtitan.train\n", "--job.config_file"),
        "missing.sh": ("torchrun --nproc_per_node 8 -m torchtitan.train --job.config_file other.toml\n", "other.toml"),
        "unknown.sh": ("torchrun --nproc_per_node 8 -m torchtitan.train --job.config_file llama3_8b.toml --parallelism.tp 2\n",
                       "a key of torchtitan's JobConfig"),
        "typed.sh": ("torchrun --nproc_per_node 8 -m torchtitan.train --job.config_file llama3_8b.toml "
                     "--parallelism.tensor_parallel_degree two\n", "type int"),
        "noconfig.sh": ("./run_train.sh\n", "CONFIG_FILE"),
    }
    for name, (text, expected) in cases.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(InputError, match=expected.replace(".", r"\.")):
            read_job([str(tmp_path / name)])
        code, _, err = run_cli(["check", str(tmp_path / name)])
        assert code == 2 and len(err.strip().splitlines()) == 1, (name, err)


def test_a_030_module_with_overrides_is_refused(launched, tmp_path):
    for f in launched.iterdir():
        shutil.copy(f, tmp_path / f.name)
    sh = tmp_path / "torchtitan030_launch.sh"
    sh.write_text(sh.read_text().replace('    "$@"', '    --parallelism.tensor_parallel_degree 2 "$@"'))
    with pytest.raises(InputError, match="no command-line override of a 0.3.0 config module"):
        read_job([str(sh)])


@needs_toml
def test_gradient_accumulation_under_pp_is_priced_as_flushes(tmp_path):
    """local_batch_size below global / dp with a pipeline: one schedule run per accumulation
    step (torchtitan train.py), each with its bubble: priced so, and the fix is a finding whose
    edit writes the whole local batch (read back as one run)."""
    text = TT_TOML.read_text().replace("pipeline_parallel_degree = 1", "pipeline_parallel_degree = 4")
    assert "local_batch_size = 1\n" in text
    toml = tmp_path / "job.toml"
    toml.write_text(text)
    sh = tmp_path / "train.sh"
    sh.write_text("torchrun --nproc_per_node 8 -m torchtitan.train --job.config_file job.toml --training.local_batch_size 2 "
                  "--training.global_batch_size 64\n")
    cj = read_job([str(toml)])  # the TOML's own batch (global -1: local x dp): no accumulation
    assert cj.flushes == 1
    cj = read_job([str(sh)])
    assert cj.parallel.pp == 4 and cj.parallel.dp == 2 and cj.flushes == 16  # 64 / (2 x 2)
    r = check_job(cj, top=2, time_limit_s=4)
    f = next(f for f in r.findings if f.id == "pipeline-flushes")
    assert f.evidence["one_pipeline_step_s"] < r.estimate.step_time_s / 2
    assert r.base is not None and r.base.step_time_s == f.evidence["one_pipeline_step_s"]
    assert "command line" in f.edit.problem  # the local batch is the script's: the edit names its flag
    # the accumulation written in the TOML: the edit goes into the TOML and reads back as one run
    toml.write_text(text.replace("local_batch_size = 1\n", "local_batch_size = 2\nglobal_batch_size = 64\n"))
    cj = read_job([str(toml)])
    assert cj.flushes == 16
    f = next(f for f in check_job(cj, top=0).findings if f.id == "pipeline-flushes")
    assert f.edit.verified, f.edit.problem
    assert "+local_batch_size = 32" in f.edit.diff


@needs_toml
def test_command_line_settings_are_listed_with_what_the_toml_had(tmp_path):
    cj = _launch(tmp_path, "t.sh", "--parallelism.tensor_parallel_degree 2 --training.seq_len 4096")
    note = next(n for n in cj.notes if n.startswith("set on t.sh's command line"))
    assert "parallelism.tensor_parallel_degree = 2 (llama3_8b.toml: 1)" in note and "training.seq_len = 4096 (llama3_8b.toml: 8192)" in note
    assert cj.sources["job.seq_len"][1].where == "t.sh:1 --training.seq_len"  # the script's line, not the TOML's


@needs_toml
def test_reshard_always_under_pp_is_said_to_be_priced_as_the_default(tmp_path):
    text = TT_TOML.read_text().replace("pipeline_parallel_degree = 1", "pipeline_parallel_degree = 2")
    text = text.replace("[parallelism]", '[parallelism]\nfsdp_reshard_after_forward = "always"', 1)
    (tmp_path / "j.toml").write_text(text)
    cj = read_job([str(tmp_path / "j.toml")])
    assert cj.parallel.pp == 2 and cj.parallel.zero == 3
    assert any("always under pipeline parallelism" in u for u in cj.unmodelled)


@needs_toml
def test_a_negated_boolean_flag_clash_names_the_flag_to_write(tmp_path):
    cj = _launch(tmp_path, "n.sh", "--parallelism.tensor_parallel_degree 8 --parallelism.no_enable_async_tensor_parallel")
    assert cj.parallel.tp == 8 and cj.parallel.tp_comm_overlap is False
    r = check_job(cj, top=0)
    f = next(f for f in r.findings if f.id == "hidden-by-engine-option")
    assert f.edit.verified is False and f.edit.summary[0].startswith("on the launch script's command line")
    assert "got '--parallelism.no_enable_async_tensor_parallel'" in f.edit.problem
    assert "expected --parallelism.enable_async_tensor_parallel (" in f.edit.problem
