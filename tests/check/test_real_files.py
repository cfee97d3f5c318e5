"""Files nobody here wrote: NVIDIA's Megatron-LM launch scripts and torchtitan's own job
configs (the snapshot in ../shared/engines). Each parses and predicts; what each says is
checked against the file (degrees, engine, the known problems of the scripts)."""

from __future__ import annotations

import pytest

from planner.check import check_job, read_job
from planner.check.job import Overrides

from tests.conftest import SHARED_ENGINES

MEG = SHARED_ENGINES / "megatron-lm" / "examples"
TT = SHARED_ENGINES / "torchtitan"
pytestmark = pytest.mark.skipif(not MEG.is_dir() or not TT.is_dir(), reason="../shared/engines (the engines' snapshot) is not beside the project")

SCRIPTS = {
    # path, overrides, engine, (tp, pp, cp, ep, vpp, zero, recompute), reader findings expected
    "gpt3/train_gpt3_175b_distributed.sh": (dict(gpus=1024, gpu="a100-sxm4-80gb"), "megatron-core", (8, 16, 1, 1, 1, 0, "none"),
                                            {"shell-word-splitting", "megatron-rejects"}),
    "llama/train_llama3_8b_h100_fp8.sh": ({}, "megatron-core", (1, 1, 1, 1, 1, 1, "none"), set()),
    "mixtral/train_mixtral_8x7b_distributed.sh": (dict(gpus=32), "megatron-core", (1, 4, 1, 8, 1, 1, "none"), set()),
    "megatron_fsdp/train_llama3_8b_fsdp_h100_fp8.sh": ({}, "megatron-core", (1, 1, 1, 1, 1, 3, "none"), set()),
    "megatron_fsdp/sbatch_mfsdp_deepseek_v3.sh": (dict(gpus=256), "megatron-core", (1, 1, 1, 8, 1, 3, "selective"), set()),
}


@pytest.mark.parametrize("rel", sorted(SCRIPTS))
def test_nvidia_scripts_parse_and_predict(rel):
    o, engine, degrees, reader_findings = SCRIPTS[rel]
    cj = read_job([str(MEG / rel)], Overrides(**o))
    p = cj.parallel
    assert cj.engine == engine
    assert (p.tp, p.pp, p.cp, p.ep, p.vpp, p.zero, p.recompute) == degrees
    r = check_job(cj, top=2, time_limit_s=4)
    assert r.estimate.step_time_s > 0 and r.estimate.memory_peak_bytes > 0
    assert reader_findings <= {f.id for f in r.findings}
    for ed in r.edits:
        assert ed is None or ed.verified is not None


def test_llama3_fp8_script_details():
    cj = read_job([str(MEG / "llama/train_llama3_8b_h100_fp8.sh")])
    assert cj.cluster.num_gpus == 8 and cj.job.precision == "fp8" and cj.job.grad_reduce == "bf16"
    assert cj.model.rope_theta == 1_000_000 and cj.model.vocab == 128256 and not cj.model.tied_embeddings
    assert cj.parallel.overlap_grad_reduce and cj.parallel.overlap_param_gather  # DDP_ARGS appended with +=
    assert cj.job.fp8_recipe == "delayed" and cj.job.fp8_param_gather  # --fp8-param-gather: FP8 primary weights, 1 B each
    est = check_job(cj, top=1, time_limit_s=4).estimate
    assert est.stages[0].weights_bytes == pytest.approx(8.03e9, rel=0.01)
    assert cj.sources["job.precision"][1].where.startswith("train_llama3_8b_h100_fp8.sh:")


def test_deepseek_sbatch_reads_mla_moe_through_heredoc_and_bash_c():
    cj = read_job([str(MEG / "megatron_fsdp/sbatch_mfsdp_deepseek_v3.sh")], Overrides(gpus=256))
    m = cj.model
    assert (m.layers, m.moe.experts, m.moe.top_k, m.moe.dense_layers, m.q_lora_rank, m.kv_lora_rank) == (61, 256, 8, 3, 1536, 512)
    assert cj.job.grad_reduce == "bf16" and cj.parallel.etp == 1
    assert any("--recompute-modules" in u for u in cj.unmodelled)


def test_fsdp_template_without_a_world_needs_gpus():
    from planner.errors import InputError

    cj = read_job([str(MEG / "megatron_fsdp/sbatch_mfsdp_deepseek_v3.sh")])
    assert cj.sources["hardware.num_gpus"][1].kind == "default"  # #SBATCH --nodes=your_own_num_nodes
    assert any("GPU count is not in the file" in n for n in cj.notes)
    with pytest.raises(InputError, match="no pretrain"):
        read_job([str(MEG / "megatron_fsdp/sbatch_checkpoint_convert.sh")])


@pytest.mark.parametrize("script", sorted(p.name for p in (MEG / "academic_paper_scripts" / "sc21").glob("run_*.sh")) if MEG.is_dir() else [])
def test_sc21_scripts_read_as_the_2021_engine(script):
    cj = read_job([str(MEG / "academic_paper_scripts" / "sc21" / script)], Overrides(gpu="a100-sxm4-80gb"))
    assert cj.engine == "megatron-legacy" and cj.job.precision == "fp16" and cj.parallel.zero == 0
    assert any("2021 engine" in n for n in cj.notes)
    assert cj.cluster.num_gpus % 8 == 0  # sbatch --nodes x #SBATCH --ntasks-per-node=8 of SRUN.sh
    r = check_job(cj, top=1, time_limit_s=3)
    assert r.estimate.step_time_s > 0


@pytest.mark.parametrize("name,gpus", [("llama3_8b.toml", 8), ("llama3_70b.toml", 64), ("llama3_405b.toml", 512),
                                       ("deepseek_v3_671b.toml", 256), ("llama4_17bx16e.toml", 64)])
def test_torchtitan_tomls_parse_and_predict(name, gpus):
    cj = read_job([str(TT / "v0.2-toml" / name)], Overrides(gpus=gpus))
    assert cj.engine == "torchtitan" and cj.parallel.dp * cj.parallel.tp * cj.parallel.pp * cj.parallel.cp == gpus
    r = check_job(cj, top=1, time_limit_s=3)
    assert r.estimate.step_time_s > 0
    if name == "llama3_405b.toml":
        assert cj.job.precision == "fp8" and "unregistered-converter" in {f.id for f in r.findings}
        # enable_async_tensor_parallel = true with [compile] enable: async TP, priced as the TP overlap
        assert cj.parallel.tp == 8 and cj.parallel.tp_comm_overlap is True
    if name == "llama3_70b.toml":
        assert cj.parallel.tp_comm_overlap is False  # the toml leaves async TP off


def test_toml_world_defaults_to_run_train_ngpu():
    cj = read_job([str(TT / "v0.2-toml" / "llama3_8b.toml")])
    assert cj.cluster.num_gpus == 8 and cj.sources["hardware.num_gpus"][1].kind == "default"
    assert cj.model.ffn_hidden == 14336 and cj.model.rope_theta == 500000  # built from torchtitan's own flavor


@pytest.mark.parametrize("ref,gpus", [("llama3_config_registry.py:llama3_8b", 8), ("llama3_config_registry.py:llama3_70b", 64),
                                      ("llama3_config_registry.py:llama3_405b", 512), ("deepseek_v3_config_registry.py:deepseek_v3_16b", 64)])
def test_torchtitan_030_registries_parse_and_predict(ref, gpus):
    path, _, fn = ref.partition(":")
    cj = read_job([f"{TT / 'current' / path}:{fn}"], Overrides(gpus=gpus))
    assert cj.fmt == "torchtitan-config"
    r = check_job(cj, top=1, time_limit_s=3)
    assert r.estimate.step_time_s > 0
    if fn == "llama3_70b":
        assert (cj.parallel.tp, cj.parallel.recompute, cj.parallel.micro_batch_size, cj.job.seq_len) == (8, "full", 8, 8192)
    if fn == "deepseek_v3_16b":
        assert cj.parallel.ep == 8 and cj.model.moe.experts == 64
    if fn == "llama3_405b":  # CompileConfig(enable=True, enable_async_tensor_parallel=True)
        assert cj.parallel.tp > 1 and cj.parallel.tp_comm_overlap is True
