"""Malformed or contradictory job files: each is exit 2 with one line naming the file, the
setting and what was expected (no traceback, nothing on stdout)."""

from __future__ import annotations

import json

import pytest

import planner.cli  # noqa: F401  (registers the commands)
from planner.cli.app import main

MEG = """#!/bin/bash
torchrun --nproc_per_node 8 --nnodes 1 pretrain_gpt.py \\
    --num-layers 32 --hidden-size 4096 --num-attention-heads 32 --seq-length 4096 --max-position-embeddings 4096 \\
    --micro-batch-size 1 --global-batch-size 64 --bf16 --vocab-size 32000 {extra}
"""
DS = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4, "bf16": {"enabled": True}, "zero_optimization": {"stage": 1}}
TOML = """[model]
name = "llama3"
flavor = "8B"
[training]
local_batch_size = 2
seq_len = 4096
[parallelism]
{par}
"""

CASES = {
    # Megatron-LM
    "degrees-do-not-divide-world": ("train.sh", MEG.format(extra="--tensor-model-parallel-size 3"), [], "tp x pp x cp"),
    "unknown-flag": ("train.sh", MEG.format(extra="--tensor-model-paralel-size 2"), [], "--tensor-model-paralel-size"),
    "batch-not-divisible": ("train.sh", MEG.format(extra="").replace("--global-batch-size 64", "--global-batch-size 60"), [], "global batch"),
    "missing-shape": ("train.sh", MEG.format(extra="").replace("--hidden-size 4096 ", ""), [], "model.hidden"),
    "bad-int": ("train.sh", MEG.format(extra="--rotary-base 5e5 --position-embedding-type rope"), [], "--rotary-base"),
    "bad-choice": ("train.sh", MEG.format(extra="--recompute-granularity half"), [], "--recompute-granularity"),
    "stray-word": ("train.sh", MEG.format(extra="--bf16 extra-word"), [], "extra-word"),
    "layers-not-divisible-by-pp": ("train.sh", MEG.format(extra="--pipeline-model-parallel-size 3").replace("nproc_per_node 8", "nproc_per_node 6"), [], "--num-layers"),
    "two-vpp-flags": ("train.sh", MEG.format(extra="--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 4 --num-virtual-stages-per-pipeline-rank 4"), [], "at most one"),
    "layout-wrong-layer-count": ("train.sh", MEG.format(extra="--pipeline-model-parallel-size 2 --pipeline-model-parallel-layout 'Et*15|t*15L'"), [], "32 't' layers"),
    "full-recompute-without-method": ("train.sh", MEG.format(extra="--recompute-granularity full"), [], "--recompute-method"),
    "param-gather-without-grad-reduce": ("train.sh", MEG.format(extra="--use-distributed-optimizer --overlap-param-gather"), [], "--overlap-grad-reduce"),
    "fp32-run": ("train.sh", MEG.format(extra="").replace("--bf16 ", ""), [], "--bf16 / --fp16"),
    "unclosed-quote": ("train.sh", MEG.format(extra='--split "99,1,0'), [], "closing double quote"),
    "zero-micro-batch": ("train.sh", MEG.format(extra="--micro-batch-size 0"), [], "--micro-batch-size"),
    "zero-tp": ("train.sh", MEG.format(extra="--tensor-model-parallel-size 0"), [], "positive integer"),
    "word-for-int": ("train.sh", MEG.format(extra="--pipeline-model-parallel-size two"), [], "--pipeline-model-parallel-size"),
    "no-launch": ("train.sh", "#!/bin/bash\necho hello\n", [], "no pretrain_*.py launch"),
    # DeepSpeed
    "broken-json": ("ds.json", '{"train_batch_size": 8,', ["--model", "llama3.1-8b", "--seq-len", "4096"], "malformed JSON"),
    "ds-batch-triple": ("ds.json", json.dumps({**DS, "train_batch_size": 100}), ["--model", "llama3.1-8b", "--gpus", "8", "--seq-len", "4096"], "train_batch_size"),
    "ds-zero-stage": ("ds.json", json.dumps({**DS, "zero_optimization": {"stage": 4}}), ["--model", "llama3.1-8b", "--gpus", "8", "--seq-len", "4096"], "zero_optimization.stage"),
    "ds-zero2-with-pp": ("ds.json", json.dumps({**DS, "zero_optimization": {"stage": 2}}), ["--model", "llama3.1-8b", "--gpus", "8", "--pp", "2", "--seq-len", "4096"], "pipeline"),
    "ds-no-model": ("ds.json", json.dumps(DS), ["--gpus", "8", "--seq-len", "4096"], "model.layers"),
    # torchtitan
    "broken-toml": ("job.toml", "[training\nseq_len = 1", ["--gpus", "8"], "malformed TOML"),
    "toml-unknown-key": ("job.toml", TOML.format(par="tensor_parallel_degre = 2"), ["--gpus", "8"], "tensor_parallel_degre"),
    "toml-degrees-vs-world": ("job.toml", TOML.format(par="data_parallel_shard_degree = 3\ntensor_parallel_degree = 2"), ["--gpus", "8"], "world size"),
    "toml-unknown-flavor": ("job.toml", TOML.format(par="").replace('"8B"', '"9B"'), ["--gpus", "8"], "model.flavor"),
    "toml-list-for-int": ("job.toml", TOML.format(par="pipeline_parallel_degree = 2\npipeline_parallel_layers_per_stage = [16, 16]"),
                          ["--gpus", "8"], "type int | None"),
    "toml-string-for-int": ("job.toml", TOML.format(par="").replace("seq_len = 4096", 'seq_len = "4k"'), ["--gpus", "8"], "seq_len"),
    "toml-negative-seq": ("job.toml", TOML.format(par="").replace("seq_len = 4096", "seq_len = -1"), ["--gpus", "8"], "positive"),
    "toml-bad-schedule": ("job.toml", TOML.format(par='pipeline_parallel_degree = 2\npipeline_parallel_schedule = "Zigzag"'), ["--gpus", "8"], "Zigzag"),
    # plan document
    "plan-missing-rank": ("plan.json", json.dumps({"schema": "planner-plan/1", "model": {"layers": 2, "hidden": 64, "heads": 2, "ffn_hidden": 256, "vocab": 100},
                                                   "plans": [{"rank": 1, "parallel": {}}]}), [], "plan rank"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_job_file_is_exit_2_one_line(name, tmp_path, capsys):
    fname, text, flags, needle = CASES[name]
    path = tmp_path / fname
    path.write_text(text)
    arg = str(path) + (":3" if name == "plan-missing-rank" else "")
    code = main(["check", arg, *flags])
    out = capsys.readouterr()
    assert code == 2, (name, out.out[-500:], out.err)
    lines = out.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), out.err
    assert needle in lines[0], (needle, lines[0])
    assert out.out == ""


def test_there_are_at_least_twenty_cases():
    assert len(CASES) >= 20
