"""`planner check` as a user runs it: text, --json against planner/schemas/check.json, exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import planner.cli  # noqa: F401
from planner.cli.app import main
from planner.cli.schema import SCHEMA_NAMES, schema_text

FLAGS = ("--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --seq-length 4096 --max-position-embeddings 4096 "
         "--micro-batch-size 1 --global-batch-size 64 --bf16 --vocab-size 32000 --swiglu --normalization RMSNorm "
         "--position-embedding-type rope --disable-bias-linear --untie-embeddings-and-output-weights --use-distributed-optimizer\n")


def _run(capsys, *args):
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def _validator():
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(schema_text("check"))
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_schema_is_listed():
    assert "check" in SCHEMA_NAMES


def test_text_report_has_the_prediction_and_changes(tmp_path, capsys):
    p = tmp_path / "flags.txt"
    p.write_text(FLAGS)
    code, out, err = _run(capsys, "check", str(p), "--gpus", "16", "--top", "2", "--time-limit", "5")
    assert code == 0, err
    for needle in ("prediction (megatron-core)", "tokens/s", "MFU", "memory: peak", "GiB", "bubble", "communication on", "findings",
                   "best changes", "edit: ", "not in the file (defaults)", "overlap_grad_reduce=False"):
        assert needle in out, needle


def test_json_matches_the_schema_and_exit_1_when_it_does_not_fit(tmp_path, capsys):
    v = _validator()
    p = tmp_path / "flags.txt"
    p.write_text(FLAGS.replace("--micro-batch-size 1", "--micro-batch-size 16").replace("--global-batch-size 64", "--global-batch-size 128"))
    code, out, err = _run(capsys, "check", str(p), "--gpus", "8", "--json", "--top", "2", "--time-limit", "5")
    doc = json.loads(out)
    v.validate(doc)
    assert code == 1 and doc["fits"] is False and doc["findings"][0]["id"] == "oom"
    assert doc["memory_margin_fraction"] < 0
    assert doc["settings"]["parallel.micro_batch_size"]["kind"] == "file"
    for c in doc["changes"]:
        assert c["edit"]["format"] == "megatron"


def test_json_of_a_fitting_job(tmp_path, capsys):
    v = _validator()
    p = tmp_path / "flags.txt"
    p.write_text(FLAGS)
    code, out, _ = _run(capsys, "check", str(p), "--gpus", "16", "--json", "--top", "1", "--time-limit", "5")
    doc = json.loads(out)
    v.validate(doc)
    assert code == 0 and doc["fits"] and doc["engine"] == "megatron-core" and doc["hardware"]["num_gpus"] == 16
    assert {x["kind"] for x in doc["predicted"]["communication"]} >= {"tp", "dp"}


def test_command_line_wins_and_says_so(tmp_path, capsys):
    p = tmp_path / "train.sh"
    p.write_text("torchrun --nproc_per_node 8 --nnodes 1 pretrain_gpt.py " + FLAGS)
    code, out, _ = _run(capsys, "check", str(p), "--gpus", "32", "--json", "--top", "0")
    doc = json.loads(out)
    assert doc["hardware"]["num_gpus"] == 32 and "the file has 8" in doc["settings"]["hardware.num_gpus"]["where"]


def test_bad_engine_and_gpu_are_exit_2(tmp_path, capsys):
    p = tmp_path / "flags.txt"
    p.write_text(FLAGS)
    assert _run(capsys, "check", str(p), "--engine", "nope")[0] == 2
    assert _run(capsys, "check", str(p), "--gpu", "h100-sxm5-80gb", "--cluster", "dgx-h100-superpod")[0] == 2
    code, _, err = _run(capsys, "check", str(Path(tmp_path) / "missing.sh"))
    assert code == 2 and err.count("\n") == 1


def test_unbalanced_split_names_the_faster_split_or_says_there_is_none(tmp_path):
    """A split the split program beats is a warning naming the faster split (with its edit); the
    planner's own split, uneven only because the outer stages hold the embedding and the loss,
    is an info."""
    import json as _json  # noqa: PLC0415

    from planner.check import check_job, read_job  # noqa: PLC0415

    from tests.conftest import run_cli  # noqa: PLC0415

    code, out, err = run_cli(["estimate", "--model", "llama3.1-8b", "--gpus", "16", "--tp", "2", "--pp", "4", "-b", "64",
                              "--layers-per-stage", "2,10,10,10", "--json"])
    assert code == 0, err
    (tmp_path / "bad.json").write_text(out)
    r = check_job(read_job([str(tmp_path / "bad.json")]), top=0)
    f = next(f for f in r.findings if f.id == "unbalanced-split")
    assert f.severity == "warning" and f.evidence["alt_step_s"] < r.estimate.step_time_s
    assert sum(f.evidence["alt_layers_per_stage"]) == 32 and f.evidence["parallel"]["layers_per_stage"]
    code, out, err = run_cli(["plan", "--model", "llama3.1-70b", "--gpus", "64", "--engine", "torchtitan", "--tp", "4", "--pp", "8",
                              "--cp", "2", "--top", "1", "--json"])
    assert code == 0, err
    (tmp_path / "own.json").write_text(out)
    r = check_job(read_job([str(tmp_path / "own.json")]), top=0)
    own = [f for f in r.findings if f.id == "unbalanced-split"]
    assert own and all(f.severity == "info" for f in own), _json.dumps([f.as_dict() for f in r.findings])
