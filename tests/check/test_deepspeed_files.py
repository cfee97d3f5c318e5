"""DeepSpeed configs of the kinds DeepSpeed's docs show (fixtures/deepspeed, written by hand from
docs/_pages/config-json.md, README there): the JSON plus the model and degrees it does not hold."""

from __future__ import annotations

from pathlib import Path

import pytest

from planner.check import check_job, read_job
from planner.check.job import Overrides

FX = Path(__file__).resolve().parent / "fixtures" / "deepspeed"


@pytest.mark.parametrize("name,o,expect", [
    ("zero1_fp16.json", dict(model="gpt3-1.3b", gpus=16, extra={"job.seq_len": 2048}), dict(zero=1, micro_batch_size=4, dp=16, prec="fp16", gbs=256)),
    ("zero2_bf16.json", dict(model="llama3.1-8b", gpus=16, extra={"job.seq_len": 4096}), dict(zero=2, micro_batch_size=2, dp=16, prec="bf16", gbs=256)),
    ("zero3_offload.json", dict(model="llama2-13b", gpus=32, extra={"job.seq_len": 4096}), dict(zero=3, micro_batch_size=1, dp=32, prec="bf16", gbs=64)),
    ("pipe_zero1.json", dict(model="llama2-13b", gpus=64, extra={"job.seq_len": 4096, "parallel.pp": 4}),
     dict(zero=1, micro_batch_size=1, dp=16, prec="bf16", gbs=512)),
])
def test_deepspeed_json_with_command_line(name, o, expect):
    cj = read_job([str(FX / name)], Overrides(**o))
    p = cj.parallel
    assert (p.zero, p.micro_batch_size, p.dp, cj.job.precision, cj.job.global_batch_size) == \
        (expect["zero"], expect["micro_batch_size"], expect["dp"], expect["prec"], expect["gbs"])
    assert cj.engine == "deepspeed" and p.vpp == 1 and p.schedule == "1f1b"
    assert cj.sources["model"][1].kind == "flag"
    r = check_job(cj, top=2, time_limit_s=3)
    assert r.estimate.step_time_s > 0
    if name == "zero3_offload.json":
        assert any("offload_optimizer" in u for u in cj.unmodelled)
    for ed in r.edits:  # every change is a JSON diff that reads back (or says what it cannot hold)
        assert ed.verified or "layers_per_stage" in ed.problem or "pipeline" in ed.problem, ed.problem


def test_megatron_deepspeed_script_and_its_json():
    cj = read_job([str(FX / "megatron_deepspeed_gpt.sh")])
    p = cj.parallel
    assert cj.engine == "megatron-deepspeed" and cj.fmt == "megatron-deepspeed"
    assert (p.tp, p.pp, p.dp, p.zero, p.recompute, cj.cluster.num_gpus) == (4, 4, 2, 1, "full", 32)
    assert cj.sources["hardware.num_gpus"][1].kind == "default"  # ${NNODES:-4}
    assert cj.model.layers == 40 and cj.model.vocab == 50257  # --vocab-file: GPT-2 BPE


def test_overlap_comm_default_follows_the_stage(tmp_path):
    import json

    p = tmp_path / "ds.json"
    p.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True}, "zero_optimization": {"stage": 3}}))
    cj = read_job([str(p)], Overrides(model="llama3.1-8b", gpus=8, extra={"job.seq_len": 4096}))
    assert cj.parallel.overlap_grad_reduce is True and cj.job.global_batch_size == 8  # overlap_comm None -> stage == 3


def test_megatron_deepspeed_flash_attn_v2_is_read_as_flashattention_2(tmp_path):
    """--use-flash-attn-v2 runs the flash-attn 2.x package: read as attention "fa2" and priced on
    Megatron-DeepSpeed (it was refused: the engine's default is unfused)."""
    src = (FX / "megatron_deepspeed_gpt.sh").read_text()
    script = tmp_path / "run.sh"
    script.write_text(src.replace("--seq-length", "--use-flash-attn-v2 --seq-length", 1))
    (tmp_path / "pipe_zero1.json").write_text((FX / "pipe_zero1.json").read_text())
    cj = read_job([str(script)])
    assert cj.parallel.attention == "fa2" and cj.engine == "megatron-deepspeed"
    assert check_job(cj, top=1, time_limit_s=3).estimate.step_time_s > 0


def test_megatron_deepspeed_flash_attn_v1_is_read_as_flashattention_1(tmp_path):
    """--use-flash-attn is Megatron-DeepSpeed's --use-flash-attn-v1 (megatron/arguments.py): the
    flash-attn 1.x package, read as attention "fa1" and priced slower than --use-flash-attn-v2."""
    src = (FX / "megatron_deepspeed_gpt.sh").read_text()
    (tmp_path / "pipe_zero1.json").write_text((FX / "pipe_zero1.json").read_text())
    times = {}
    for flag, kind in (("--use-flash-attn", "fa1"), ("--use-flash-attn-v1", "fa1"), ("--use-flash-attn-v2", "fa2")):
        script = tmp_path / f"run{flag}.sh"
        script.write_text(src.replace("--seq-length", f"{flag} --seq-length", 1))
        cj = read_job([str(script)])
        assert cj.parallel.attention == kind, flag
        assert cj.sources["parallel.attention"][1].kind == "file"
        times[flag] = check_job(cj, top=1, time_limit_s=3).estimate.step_time_s
    assert times["--use-flash-attn"] == times["--use-flash-attn-v1"] > times["--use-flash-attn-v2"]


def test_megatron_deepspeed_changes_keep_its_flash_flag_and_edit_its_script(tmp_path):
    """The script's --use-flash-attn stays in every change (the edits cannot remove it, so the
    searches hold it), and the micro-batch and recompute changes edit the script's Megatron flags
    as well as the JSON: every change reads back as the configuration it was priced for."""
    src = (FX / "megatron_deepspeed_gpt.sh").read_text()
    script = tmp_path / "run.sh"
    script.write_text(src.replace("--seq-length", "--use-flash-attn --seq-length", 1))
    (tmp_path / "pipe_zero1.json").write_text((FX / "pipe_zero1.json").read_text())
    cj = read_job([str(script)])
    r = check_job(cj, top=5, time_limit_s=10)
    assert r.changes and len(r.edits) == len(r.changes)
    for ch, ed in zip(r.changes, r.edits):
        assert ch.parallel.attention == "fa1", ch.label
        assert ed.verified, (ch.label, ed.problem)
    rec = next(ed for ch, ed in zip(r.changes, r.edits) if ch.parallel.recompute == "none")
    assert any("--checkpoint-activations" in s for s in rec.summary), rec.summary
    mbs = next(ed for ch, ed in zip(r.changes, r.edits) if ch.parallel.micro_batch_size != cj.parallel.micro_batch_size)
    assert any("--micro-batch-size" in s for s in mbs.summary), mbs.summary


def test_json_edits_change_only_the_lines_of_the_changed_settings(tmp_path):
    """A DeepSpeed JSON written by hand (4-space indent, objects and lists on one line) keeps its
    layout: a change rewrites the values it changes and adds the keys it adds, and leaves every
    other line as it was; each edited file still parses to exactly the changed document."""
    import json

    from planner.check.edits import _json_text

    text = ('{\n    "train_batch_size": 256,\n    "train_micro_batch_size_per_gpu": 2,\n    "gradient_accumulation_steps": 16,\n'
            '    "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95]}},\n    "bf16": {"enabled": true},\n'
            '    "zero_optimization": {\n        "stage": 1,\n        "reduce_bucket_size": 5e8\n    }\n}\n')
    doc = json.loads(text)
    doc["train_micro_batch_size_per_gpu"], doc["gradient_accumulation_steps"] = 4, 8
    doc["zero_optimization"]["stage"], doc["zero_optimization"]["overlap_comm"] = 2, True
    out = _json_text(doc, text)
    assert json.loads(out) == doc
    changed = [line for line in out.splitlines() if line not in text.splitlines()]
    assert changed == ['    "train_micro_batch_size_per_gpu": 4,', '    "gradient_accumulation_steps": 8,',
                       '        "overlap_comm": true,', '        "stage": 2,']
    inline = json.loads(text)
    inline["bf16"]["loss_scale"] = 0
    assert '"bf16": {"loss_scale": 0, "enabled": true},' in _json_text(inline, text)
    removed = json.loads(text)
    del removed["bf16"]  # a removed key re-writes the file at its indentation
    assert json.loads(_json_text(removed, text)) == removed and '\n    "train_batch_size": 256,' in _json_text(removed, text)
    # the check of a real file: its diff touches only the settings it changes
    path = tmp_path / "zero2_bf16.json"
    path.write_text((FX / "zero2_bf16.json").read_text())
    r = check_job(read_job([str(path)], Overrides(model="llama3.1-8b", gpus=16, extra={"job.seq_len": 4096})), top=3, time_limit_s=5)
    assert r.edits
    for ed in (e for e in r.edits if not any("added" in line for line in e.summary)):  # an added block is several lines
        for sign in "-+":
            lines = [line for line in ed.diff.splitlines() if line.startswith(sign) and not line.startswith(sign * 3)]
            assert len(lines) <= len(ed.summary), (sign, ed.summary, ed.diff)
    # a file without a zero_optimization block gets none for a change that is not one of ZeRO's
    bare = tmp_path / "bare.json"
    bare.write_text('{\n  "train_micro_batch_size_per_gpu": 2,\n  "bf16": {"enabled": true}\n}\n')
    r = check_job(read_job([str(bare)], Overrides(model="llama3.1-8b", gpus=16, extra={"job.seq_len": 4096})), top=5, time_limit_s=5)
    for ch, ed in zip(r.changes, r.edits):
        if ch.parallel.zero == 0:
            assert "zero_optimization" not in ed.diff, ed.diff
    # CRLF line ends, tab indentation and non-ASCII text survive an edit; 1 is not true
    crlf = '{\r\n\t"a": 1,\r\n\t"z": {\r\n\t\t"stage": 1\r\n\t},\r\n\t"name": "na\u00efve"\r\n}\r\n'
    doc = json.loads(crlf)
    doc["a"], doc["z"]["overlap_comm"], doc["b"], doc["c"] = True, True, 2, 3
    out = _json_text(doc, crlf)
    assert json.loads(out) == doc and "\n" not in out.replace("\r\n", "")
    assert '\t\t"overlap_comm": true,' in out and '"name": "na\u00efve"' in out and '"a": true' in out
    assert out.index('"b"') < out.index('"c"')  # new keys keep their order


@pytest.mark.parametrize("gpus", ["-3", "0"])
def test_a_bad_gpu_count_names_the_gpu_count(gpus):
    """--gpus 0 or negative on a launch script names --gpus (it had named the node size it capped)."""
    from conftest import run_cli

    code, _, err = run_cli(["check", str(FX / "megatron_deepspeed_gpt.sh"), "--gpus", gpus])
    assert code == 2 and f"--gpus: got {gpus}, expected a positive integer" in err, err


def test_a_misspelt_top_level_key_is_a_finding_and_bfloat16_is_read(tmp_path):
    """DeepSpeed ignores top-level keys it does not know, so a typo'd zero_optimization runs (and
    is priced) as ZeRO 0, with a warning naming the key it resembles; a key DeepSpeed knows but
    the cost does not depend on is only listed as ignored. The older "bfloat16" block is bf16."""
    import json

    p = tmp_path / "typo.json"
    p.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2, "zero_optimisation": {"stage": 2}, "bf16": {"enabled": True},
                             "steps_per_print": 10}))
    cj = read_job([str(p)], Overrides(model="llama3.1-8b", gpus=8, extra={"job.seq_len": 4096}))
    assert cj.parallel.zero == 0
    assert [f for f, _ in cj.findings] == ["unknown-key"] and "did you mean zero_optimization?" in cj.findings[0][1]
    assert any(i.startswith("steps_per_print (DeepSpeed config: no effect") for i in cj.ignored)
    r = check_job(cj, top=3, time_limit_s=5)
    assert any(f.id == "unknown-key" and f.severity == "warning" for f in r.findings)
    # ZeRO 0: DeepSpeed has no overlap to offer (overlap_comm is a ZeRO option), so no such finding
    assert not any(f.id == "hidden-by-engine-option" and f.evidence.get("option") == "overlap_grad_reduce" for f in r.findings)
    # no change writes the accumulation DeepSpeed already infers (1 without train_batch_size)
    for ch, ed in zip(r.changes, r.edits):
        if ch.parallel.num_microbatches(cj.job.global_batch_size) == 1:
            assert not any(s.startswith("gradient_accumulation_steps") for s in ed.summary), ed.summary
    q = tmp_path / "old.json"
    q.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "bfloat16": {"enabled": True}, "zero_optimization": {"stage": 2}}))
    cj = read_job([str(q)], Overrides(model="llama3.1-8b", gpus=8, extra={"job.seq_len": 4096}))
    assert cj.job.precision == "bf16" and cj.sources["job.precision"][1].where.endswith("bfloat16.enabled") and not cj.findings
    assert not any(i.startswith("bfloat16") for i in cj.ignored)  # read, so not listed as ignored


def test_an_activation_checkpointing_block_is_read_as_full_recompute_and_says_so(tmp_path):
    import json

    p = tmp_path / "ds.json"
    p.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True}, "zero_optimization": {"stage": 3},
                             "activation_checkpointing": {"partition_activations": False}}))
    cj = read_job([str(p)], Overrides(model="llama3.1-8b", gpus=8, extra={"job.seq_len": 4096}))
    assert cj.parallel.recompute == "full"
    assert any("read as full recompute" in n and "deepspeed.checkpointing.checkpoint" in n for n in cj.notes)
