"""Changes as edits in the user's own format that `planner check` accepts back: the edited files,
read again, are the configuration the change predicts, with the same step time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import planner
from planner.check import check_job, read_job
from planner.check.edits_shell import _cut_words
from planner.emit.megatron import pipeline_layout
from planner.check.job import Overrides
from planner.errors import InputError
from tests.conftest import SHARED_ENGINES

SCRIPT = """#!/bin/bash
GPUS_PER_NODE=8
NNODES=${NNODES:-2}
TP=1
MBS=1
DTYPE=fp8
MODEL=(
    --num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32
    --group-query-attention --num-query-groups 8 --swiglu --normalization RMSNorm
    --position-embedding-type rope --untie-embeddings-and-output-weights --disable-bias-linear
    --seq-length 4096 --max-position-embeddings 4096 --vocab-size 128256
)
TRAIN=(--micro-batch-size $MBS --global-batch-size 128 --bf16
    --recompute-granularity full --recompute-method uniform --recompute-num-layers 1)
EXTRA=()
if [[ "$DTYPE" == "fp8" ]]; then
    EXTRA+=("--fp8-format hybrid")
fi
torchrun --nproc_per_node $GPUS_PER_NODE --nnodes $NNODES pretrain_gpt.py \\
    ${MODEL[@]} ${TRAIN[@]} ${EXTRA[@]} \\
    --tensor-model-parallel-size $TP
"""


def _round_trip(report, files_arg, o):
    seen = 0
    for ch, ed in zip(report.changes, report.edits):
        assert ed is not None and ed.verified, (ch.label, ed.problem if ed else None)
        tmp = Path(files_arg[0]).parent / f"edited-{seen}"
        tmp.mkdir()
        for path, text in ed.files.items():
            (tmp / Path(path).name).write_text(text)
        arg = str(tmp / Path(files_arg[0].split(":")[0]).name) + (":" + files_arg[0].split(":")[1] if ":" in files_arg[0] else "")
        cj = read_job([arg], o)
        e = planner.estimate(cj.model, cj.cluster, cj.job, cj.parallel, cj.engine)
        assert e.step_time_s == pytest.approx(ch.estimate.step_time_s, rel=1e-9), ch.label
        assert ed.diff.startswith("--- a/")
        seen += 1
    return seen


def test_megatron_script_edits_read_back(tmp_path):
    p = tmp_path / "train.sh"
    p.write_text(SCRIPT)
    r = check_job(read_job([str(p)]), top=4, time_limit_s=10)
    assert r.changes and _round_trip(r, [str(p)], None) == len(r.changes)
    # values are rewritten where they are written (the variable), flags added at the end of the command
    diffs = "".join(ed.diff for ed in r.edits)
    assert "-MBS=1" in diffs or "-TP=1" in diffs or "--recompute" in diffs


def test_shell_cuts():
    assert _cut_words('    EXTRA+=("--fp8-format hybrid")', "--fp8-format", 1)[0] == "    EXTRA+=()"
    assert _cut_words("  --a 1 --recompute-granularity full --b", "--recompute-granularity", 1)[0] == "  --a 1 --b"
    assert pipeline_layout((3, 2), 2) == "Et|t|tt|tL"
    from planner.check.megatron import parse_layout

    assert parse_layout(pipeline_layout((3, 2), 2), 5, 2, "x") == (2, (3, 2))  # the reader reads back what the editor writes
    assert parse_layout(pipeline_layout((3, 2), 2, 1), 5, 2, "x", mtp=1) == (2, (3, 2))


def test_layout_multi_token_prediction():
    """The 'm' modules follow every 't' in the last stage, as many as --mtp-num-layers
    (pipeline_parallel_layer_layout.py validate_layer_layout)."""
    from planner.check.megatron import parse_layout

    assert pipeline_layout((4, 4), 1, 2) == "Etttt|ttttmmL"
    for bad, why in (("Etttt|ttttL", "1 'm'"), ("Etttt|tttmtL", "after its 't'"), ("Ettttm|ttttL", "after its 't'"),
                     ("Ett|tt|tt|ttmmL", "1 'm'")):
        with pytest.raises(InputError, match=why):
            parse_layout(bad, 8, 2, "--pipeline-model-parallel-layout", mtp=1)
    with pytest.raises(InputError, match="0 'm'"):
        parse_layout("Etttt|ttttmL", 8, 2, "--pipeline-model-parallel-layout")


def test_toml_edits_read_back(tmp_path):
    p = tmp_path / "job.toml"
    p.write_text('[model]\nname = "llama3"\nflavor = "8B"\n\n[training]\nlocal_batch_size = 1\nseq_len = 8192  # tokens\n\n'
                 '[parallelism]\ndata_parallel_shard_degree = -1\n\n[activation_checkpoint]\nmode = "full"\n')
    o = Overrides(gpus=16)
    r = check_job(read_job([str(p)], o), top=3, time_limit_s=10)
    assert r.changes and _round_trip(r, [str(p)], o) == len(r.changes)
    assert all("# tokens" in t or "seq_len" not in ed.diff for ed in r.edits for t in ed.files.values())  # comments kept


def test_toml_edits_keep_the_global_batch_torchtitan_would_derive(tmp_path):
    """A TOML without global_batch_size leaves it to torchtitan (local_batch_size x dp): a change
    of micro-batch or of dp writes the global batch, or applying it would halve the batch; every
    change reads back with the job's global batch."""
    p = tmp_path / "job.toml"
    p.write_text('[model]\nname = "llama3"\nflavor = "8B"\n\n[training]\nlocal_batch_size = 4\nseq_len = 8192\n\n'
                 '[parallelism]\ndata_parallel_shard_degree = -1\ntensor_parallel_degree = 2\n\n'
                 '[activation_checkpoint]\nmode = "selective"\n')
    o = Overrides(gpus=32)
    cj = read_job([str(p)], o)
    assert cj.job.global_batch_size == 4 * 16
    r = check_job(cj, top=5, time_limit_s=10)
    assert r.edits and all(ed.verified for ed in r.edits), [ed.problem for ed in r.edits]
    from planner.check.edits_titan import titan_settings  # noqa: PLC0415

    for ch, ed in zip(r.changes, r.edits):
        if titan_settings(cj, ch.parallel)["training.local_batch_size"] * ch.parallel.dp != 64:
            assert "[training] global_batch_size = 64" in ed.summary, (ch.label, ed.summary)
        else:
            assert not any("global_batch_size" in line for line in ed.summary), (ch.label, ed.summary)
    assert any("global_batch_size" in line for ed in r.edits for line in ed.summary)


def test_plan_document_edits_read_back(tmp_path):
    from planner.cli.common import Setup, plan_document

    m, c, j = planner.load_model("llama3.1-8b"), planner.make_cluster("h100-sxm5-80gb", 16), planner.Job(4096, 64)
    doc = plan_document(Setup(m, c, j, {}, "llama3.1-8b", "h100-sxm5-80gb"),
                        [planner.Plan(1, *(lambda e: (e.parallel, e))(planner.estimate(m, c, j, planner.ParallelConfig(tp=8, micro_batch_size=1, recompute="full"))))], None)
    p = tmp_path / "plan.json"
    p.write_text(json.dumps(doc))
    r = check_job(read_job([str(p)]), top=3, time_limit_s=10)
    assert r.changes and _round_trip(r, [str(p)], None) == len(r.changes)


def test_deepspeed_json_edits_read_back(tmp_path):
    p = tmp_path / "ds.json"
    p.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 8, "bf16": {"enabled": True},
                             "zero_optimization": {"stage": 3}, "activation_checkpointing": {"partition_activations": False}}, indent=4))
    o = Overrides(model="llama3.1-8b", gpus=8, extra={"job.seq_len": 4096})
    r = check_job(read_job([str(p)], o), top=3, time_limit_s=10)
    single = [(ch, ed) for ch, ed in zip(r.changes, r.edits) if ch.parallel.pp == 1]
    assert single
    for ch, ed in single:
        assert ed.verified, ed.problem
        assert json.loads(next(iter(ed.files.values())))["train_micro_batch_size_per_gpu"] == ch.parallel.micro_batch_size


MOE_SCRIPT = """#!/bin/bash
torchrun --nproc_per_node 8 --nnodes 8 pretrain_gpt.py \\
    --num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 \\
    --group-query-attention --num-query-groups 8 --swiglu --normalization RMSNorm \\
    --position-embedding-type rope --untie-embeddings-and-output-weights --disable-bias-linear \\
    --seq-length 4096 --max-position-embeddings 4096 --vocab-size 32000 \\
    --num-experts 8 --moe-router-topk 2 --moe-grouped-gemm \\
    --micro-batch-size 1 --global-batch-size 512 --bf16 --use-distributed-optimizer \\
    --expert-model-parallel-size 8
"""


def test_overlap_edit_brings_the_dispatcher_megatron_needs(tmp_path):
    """Megatron's default dispatcher is allgather; the expert all-to-all overlap needs alltoall
    or flex (transformer_config.py): an edit that turns the overlap on sets the dispatcher too,
    and the script as read says the default dispatcher is priced as all-to-all."""
    p = tmp_path / "moe.sh"
    p.write_text(MOE_SCRIPT)
    cj = read_job([str(p)])
    assert any("--moe-token-dispatcher-type not set" in u for u in cj.unmodelled)
    r = check_job(cj, top=4, time_limit_s=10)
    on = [(ch, ed) for ch, ed in zip(r.changes, r.edits) if ch.parallel.moe_a2a_overlap and ed is not None]
    assert on, [ch.label for ch in r.changes]
    for ch, ed in on:
        text = "\n".join(ed.files.values())
        assert "--overlap-moe-expert-parallel-comm" in text and "--moe-token-dispatcher-type alltoall" in text, ch.label


def test_two_flags_with_the_same_value_on_one_line_are_each_edited(tmp_path):
    """tp 2 -> 1 and pp 1 -> 2 on one line: each value is rewritten after its own flag (the pp
    edit must not take tp's new 1); the edited script reads back as the change."""
    p = tmp_path / "one_line.sh"
    p.write_text("torchrun --nproc-per-node 8 --nnodes 2 pretrain_gpt.py --num-layers 32 --hidden-size 4096 "
                 "--num-attention-heads 32 --ffn-hidden-size 14336 --seq-length 4096 --max-position-embeddings 4096 "
                 "--micro-batch-size 1 --global-batch-size 64 --bf16 --vocab-size 128256 --swiglu --normalization RMSNorm "
                 "--position-embedding-type rope --disable-bias-linear --untie-embeddings-and-output-weights "
                 "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 1 --use-distributed-optimizer\n")
    cj = read_job([str(p)])
    new = cj.parallel.replace(tp=1, pp=2, dp=8, layers_per_stage=(16, 16), sequence_parallel=False, etp=1)
    ed = cj.editor.edit(cj, new)
    text = next(iter(ed.files.values()))
    assert "--tensor-model-parallel-size 1 --pipeline-model-parallel-size 2" in text
    (tmp_path / "edited.sh").write_text(text)
    back = read_job([str(tmp_path / "edited.sh")]).parallel
    assert (back.tp, back.pp) == (1, 2)


def _titan_job(tmp_path, extra=""):
    p = tmp_path / "tp.toml"
    p.write_text('[model]\nname = "llama3"\nflavor = "8B"\n\n[training]\nlocal_batch_size = 2\nseq_len = 8192\n\n'
                 '[parallelism]\ntensor_parallel_degree = 8\ndata_parallel_shard_degree = -1\n\n'
                 '[activation_checkpoint]\nmode = "full"\n' + extra)
    return p


def _edited_job(tmp_path, cj, par, o):
    ed = cj.editor.edit(cj, par)
    out = tmp_path / "edited"
    out.mkdir(exist_ok=True)
    for path, text in ed.files.items():
        (out / Path(path).name).write_text(text)
    return ed, out


def test_toml_edit_turns_async_tp_on_with_compile(tmp_path):
    """The editor writes torchtitan's async TP (the plan's tp_comm_overlap) and the torch.compile
    of the model it needs; the edited file reads back with the overlap on and the same price."""
    o = Overrides(gpus=16)
    cj = read_job([str(_titan_job(tmp_path, '\n[compile]\nenable = false\ncomponents = ["loss"]\n'))], o)
    assert cj.parallel.tp_comm_overlap is False
    par = cj.parallel.replace(tp_comm_overlap=True)
    ed, out = _edited_job(tmp_path, cj, par, o)
    import tomllib  # noqa: PLC0415

    doc = tomllib.loads(next(iter(ed.files.values())))
    assert doc["parallelism"]["enable_async_tensor_parallel"] is True
    assert doc["compile"] == {"enable": True, "components": ["model", "loss"]}
    back = read_job([str(out / "tp.toml")], o)
    assert back.parallel.tp_comm_overlap is True
    want = planner.estimate(cj.model, cj.cluster, cj.job, par, cj.engine).step_time_s
    assert planner.estimate(back.model, back.cluster, back.job, back.parallel, back.engine).step_time_s == pytest.approx(want, rel=1e-12)
    # and off again: the flag is written false, compile left as the user has it
    ed2 = back.editor.edit(back, back.parallel.replace(tp_comm_overlap=False))
    doc2 = tomllib.loads(next(iter(ed2.files.values())))
    assert doc2["parallelism"]["enable_async_tensor_parallel"] is False and doc2["compile"]["enable"] is True


def test_search_keeps_a_jobs_async_tp(tmp_path):
    """tp_comm_overlap is a torchtitan setting the job controls: changes that do not release it keep it."""
    o = Overrides(gpus=16)
    p = _titan_job(tmp_path, '\n[compile]\nenable = true\n')
    p.write_text(p.read_text().replace("tensor_parallel_degree = 8\n", "tensor_parallel_degree = 8\nenable_async_tensor_parallel = true\n"))
    cj = read_job([str(p)], o)
    assert cj.parallel.tp_comm_overlap is True and "tp_comm_overlap" not in cj.editor.uncontrolled
    r = check_job(cj, top=3, time_limit_s=10)
    held = [ch for ch in r.changes if "tp_comm_overlap" not in ch.released and ch.parallel.tp > 1 and ch.source == "search"]
    assert held  # at least one search kept the layout's TP and did not release the overlap
    for ch in held:
        assert ch.parallel.tp_comm_overlap is True, ch.label


@pytest.mark.skipif(not (SHARED_ENGINES / "torchtitan" / "current").is_dir(), reason="../shared/engines is not beside the project")
@pytest.mark.parametrize("fn,on", [("llama3_405b", False), ("llama3_70b", True)])
def test_030_module_edit_sets_async_tp_in_compile_config(tmp_path, fn, on):
    """0.3.0 keeps the switch in CompileConfig (config/configs.py): the edit rewrites or adds its
    keyword there, never in ParallelismConfig, and the edited module reads back with it."""
    src = SHARED_ENGINES / "torchtitan" / "current" / "llama3_config_registry.py"
    (tmp_path / src.name).write_text(src.read_text())
    o = Overrides(gpus=512 if fn == "llama3_405b" else 64)
    cj = read_job([f"{tmp_path / src.name}:{fn}"], o)
    assert cj.parallel.tp > 1 and cj.parallel.tp_comm_overlap is (not on)
    par = cj.parallel.replace(tp_comm_overlap=on)
    ed, out = _edited_job(tmp_path, cj, par, o)
    import ast  # noqa: PLC0415

    text = next(iter(ed.files.values()))
    fn_src = ast.get_source_segment(text, next(n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name == fn))
    assert f"enable_async_tensor_parallel={on}" in fn_src  # in the edited function, in a CompileConfig call
    calls = [c for c in ast.walk(ast.parse(fn_src)) if isinstance(c, ast.Call) and any(k.arg == "enable_async_tensor_parallel" for k in c.keywords)]
    assert calls and all(ast.unparse(c.func) == "CompileConfig" for c in calls)
    back = read_job([f"{out / src.name}:{fn}"], o)
    assert back.parallel.tp_comm_overlap is on


def test_option_findings_carry_their_edit(tmp_path):
    """A finding that names an engine option comes with the edit that turns it on, in the
    script's words, read back as the job it prices (the fused loss; the DP overlaps)."""
    p = tmp_path / "run.sh"
    p.write_text("#!/bin/bash\ntorchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 32 --hidden-size 4096 "
                 "--ffn-hidden-size 14336 --num-attention-heads 32 --group-query-attention --num-query-groups 8 --swiglu "
                 "--normalization RMSNorm --position-embedding-type rope --untie-embeddings-and-output-weights "
                 "--disable-bias-linear --seq-length 4096 --max-position-embeddings 4096 --vocab-size 128256 "
                 "--micro-batch-size 1 --global-batch-size 64 --bf16 --tensor-model-parallel-size 2 --use-distributed-optimizer\n")
    cj = read_job([str(p)], Overrides())
    r = check_job(cj, top=0)
    by = {f.evidence["option"]: f for f in r.findings if f.id == "hidden-by-engine-option"}
    ce = by["cross_entropy_loss_fusion"].edit
    assert ce.verified and ce.summary == ["add --cross-entropy-loss-fusion"]
    q = tmp_path / "fused.sh"
    q.write_text(next(iter(ce.files.values())))
    back = read_job([str(q)], Overrides())
    assert back.job.cross_entropy == "native" and back.parallel == cj.parallel
    og = by["overlap_grad_reduce"].edit
    assert og.verified and og.summary == ["add --overlap-grad-reduce"]
    idle = next(f for f in r.findings if f.id == "idle-memory")  # a micro-batch the memory leaves room for
    assert idle.edit.verified and idle.edit.summary == [f"--micro-batch-size 1 -> {idle.evidence['alt_micro_batch']}"]
    assert all(f.edit is None for f in r.findings if "parallel" not in f.evidence and f.id != "hidden-by-engine-option")
    doc = check_job(cj, top=0).findings  # JSON carries it
    assert any("edit" in f.as_dict() for f in doc)
    assert all(f.edit is None for f in check_job(cj, top=0, edits=False).findings)


def test_toml_edits_keep_multi_line_arrays_whole():
    """A multi-line array (module_fqns_per_model_part) is one entry: replaced or removed whole, and
    its inner "[" lines are never taken for table headers."""
    import tomllib  # noqa: PLC0415

    from planner.check.edits_titan import _section_bounds, _toml_del, _toml_set  # noqa: PLC0415

    text = ('[parallelism]\npipeline_parallel_degree = 2\nmodule_fqns_per_model_part = [\n    [\n        "tok_embeddings",\n'
            '        "layers.0",\n    ],\n    [\n        "layers.1", # a comment ] [\n        "norm",\n    ],\n]\n'
            'tensor_parallel_degree = 1\n\n[compile]\nenable = false\n')
    lines = text.split("\n")
    assert _section_bounds(lines, "parallelism") == (0, lines.index("[compile]"))
    out = "\n".join(_toml_set(lines, "parallelism", "module_fqns_per_model_part", [["a"], ["b"]]))
    assert tomllib.loads(out)["parallelism"] == {"pipeline_parallel_degree": 2, "module_fqns_per_model_part": [["a"], ["b"]],
                                                  "tensor_parallel_degree": 1}
    out = "\n".join(_toml_del(lines, "parallelism", "module_fqns_per_model_part"))
    assert tomllib.loads(out) == {"parallelism": {"pipeline_parallel_degree": 2, "tensor_parallel_degree": 1}, "compile": {"enable": False}}
    out = "\n".join(_toml_set(lines, "parallelism", "enable_async_tensor_parallel", True))  # appended after the array
    assert tomllib.loads(out)["parallelism"]["enable_async_tensor_parallel"] is True


def test_loss_fusion_edit_drops_a_te_impl(tmp_path):
    """--cross-entropy-fusion-impl te without the fusion flag reads as the eager loss; the edit that
    turns the fusion on also drops te (Megatron-LM refuses te with the fusion), read back native."""
    p = tmp_path / "run.sh"
    p.write_text("#!/bin/bash\ntorchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 32 --hidden-size 4096 "
                 "--num-attention-heads 32 --seq-length 4096 --max-position-embeddings 4096 --vocab-size 128256 "
                 "--micro-batch-size 1 --global-batch-size 64 --bf16 --tensor-model-parallel-size 2 --cross-entropy-fusion-impl te\n")
    cj = read_job([str(p)], Overrides())
    assert cj.job.cross_entropy == "unfused"
    f = next(f for f in check_job(cj, top=0).findings if f.evidence.get("option") == "cross_entropy_loss_fusion")
    assert f.edit.verified, f.edit.problem
    assert "--cross-entropy-fusion-impl" not in next(iter(f.edit.files.values()))


def test_toml_edits_skip_brackets_in_strings_and_refuse_what_they_cannot_edit(tmp_path):
    """A bracket inside an escaped or triple-quoted string is not an array; a TOML written with
    dotted keys gets an unverified edit that says so, never an internal error."""
    base = ('[model]\nname = "llama3"\nflavor = "8B"\n[training]\nlocal_batch_size = 1\nseq_len = 4096\n'
            '[parallelism]\ntensor_parallel_degree = 2\ndata_parallel_shard_degree = 4\n')
    for name, text in (("escaped", '[job]\ndescription = "llama3 \\"8B [bf16\\" run"\n' + base),
                       ("triple", '[job]\ndescription = """a [\nmulti-line ] [ string"""\n' + base)):
        p = tmp_path / f"{name}.toml"
        p.write_text(text)
        r = check_job(read_job([str(p)], Overrides(gpu="h100-sxm5-80gb")), top=0)
        assert all(f.edit.verified for f in r.findings if f.edit is not None), [(f.id, f.edit.problem) for f in r.findings if f.edit]
    p = tmp_path / "dotted.toml"
    p.write_text("\n".join(ln.replace("[", "#[") if ln.startswith("[") else ln for ln in base.split("\n")).replace(
        "name =", "model.name =").replace("flavor =", "model.flavor =").replace("local_batch_size", "training.local_batch_size").replace(
        "seq_len", "training.seq_len").replace("tensor_parallel", "parallelism.tensor_parallel").replace("data_parallel", "parallelism.data_parallel"))
    r = check_job(read_job([str(p)], Overrides(gpu="h100-sxm5-80gb")), top=1)
    assert any(e is not None and e.verified is False and "dotted keys" in e.problem for e in r.edits + [f.edit for f in r.findings])


def test_shell_edits_quote_what_the_shell_would_split():
    from planner.check.edits_shell import _quote  # noqa: PLC0415

    assert _quote("Etttt|tttt|(tttt|)*4,tttL") == "'Etttt|tttt|(tttt|)*4,tttL'" and _quote("8") == "8" and _quote("a b") == "'a b'"


def test_torchtitan_even_split_edit_writes_the_less_layers_it_assumes(tmp_path):
    """An edit that writes pipeline_parallel_layers_per_stage also writes first/last_stage_less_layers
    = 0 (torchtitan's defaults are 1), so the edited file reads back with the stages predicted."""
    p = tmp_path / "t1.toml"
    p.write_text('[model]\nname = "llama3"\nflavor = "70B"\n[training]\nlocal_batch_size = 16\nseq_len = 8192\n[parallelism]\n'
                 'tensor_parallel_degree = 8\npipeline_parallel_degree = 2\npipeline_parallel_schedule = "Interleaved1F1B"\n'
                 'pipeline_parallel_layers_per_stage = 21\npipeline_parallel_microbatch_size = 1\ndata_parallel_shard_degree = -1\n'
                 '[activation_checkpoint]\nmode = "full"\n')
    r = check_job(read_job([str(p)], Overrides(gpus=64)), top=0)
    eds = [f.edit for f in r.findings if f.edit is not None and any("layers_per_stage" in x for x in f.edit.summary)]
    assert eds and all(e.verified for e in eds), [e.problem for e in eds]
