"""Megatron-LM's own code accepts the emitted launch arguments: parse_args + validate_args,
core_transformer_config_from_args, the microbatch calculator and get_num_layers_to_build for
every (pipeline rank, virtual stage), run on the Megatron-LM snapshot (SHARED_ENGINES/megatron-lm,
or $PLANNER_MEGATRON_LM) in one subprocess (megatron_lm_worker.py) for all plans.

Cases: every plan of MEGATRON_PLANS (among them Llama 3.1 405B on pp 8 x vpp 8 with the embedding
and the loss in the split, DeepSeek-V3 with MLA + MoE + EP and a layout, Megatron-FSDP ZeRO-3),
the layout flag for an uneven split with and without VPP, and two controls the same code must
reject (so the check is live).
"""

from __future__ import annotations

import copy

import pytest

from emit_helpers import MEGATRON_PLANS, command_words, load
from engine_env import megatron_lm_root, run_worker
from planner.emit import emit_files
from planner.errors import InputError
from planner.emit.common import chunk_sizes, load_plan_view


def _argv(doc: dict, rank: int) -> tuple[list[str], dict, list[str]]:
    script = emit_files(doc, "megatron", rank)["megatron_launch.sh"]
    v = load_plan_view(doc, rank)
    words = command_words(script, "torchrun")
    prog = next(i for i, w in enumerate(words) if w.endswith("pretrain_gpt.py"))
    args = [w for w in words[prog + 1:] if not w.startswith('"$') and "${" not in w and w != "$@"]
    # The script's DATA_ARGS and a minimal TRAINING_ARGS (not decided by the planner).
    args += ["--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", str(v.model.vocab), "--train-iters", "10", "--lr", "1e-4"]
    env = {"WORLD_SIZE": str(v.world), "RANK": "0", "LOCAL_RANK": "0"}
    unset = []
    if "unset CUDA_DEVICE_MAX_CONNECTIONS" in script:
        unset.append("CUDA_DEVICE_MAX_CONNECTIONS")
    else:
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"
    return args, env, unset


def _layout_doc(vpp: int) -> dict:
    doc = copy.deepcopy(load("llama70b_64gpu"))
    doc["plans"][0]["parallel"].update(vpp=vpp, schedule="interleaved" if vpp > 1 else "1f1b", layers_per_stage=[18, 20, 24, 18])
    return doc


def _odd_doc() -> dict:
    doc = copy.deepcopy(load("llama70b_64gpu"))
    doc["plans"][0]["parallel"]["layers_per_stage"] = [19, 21, 21, 19]
    return doc


def _a2a_overlap_doc(etp: int) -> dict:
    """DeepSeek-V3 on pp 16 x vpp 3 with ep 8, selective recompute and the expert all-to-all
    overlap (--overlap-moe-expert-parallel-comm); etp 1 or tp."""
    doc = copy.deepcopy(load("deepseek_v3_1024gpu"))
    doc["plans"][2]["parallel"].update(recompute="selective", moe_a2a_overlap=True, etp=etp)
    return doc


def _ep_beyond_dp_doc() -> dict:
    """DeepSeek-V3 on tp 8 x pp 32 x dp 4 with ep 8 over the tensor ranks too (etp 1: ep x etp
    divides tp x dp x cp although ep does not divide dp x cp), a layout the search proposes."""
    doc = copy.deepcopy(load("deepseek_v3_1024gpu"))
    doc["plans"][0]["parallel"].update(ep=8, etp=1)
    return doc


def _flex_doc(backend: str) -> dict:
    """DeepSeek-V3 with Megatron-core's flex dispatcher on the DeepEP or HybridEP backend, with the overlap."""
    doc = _a2a_overlap_doc(1)
    doc["plans"][2]["parallel"].update(moe_dispatcher=backend)
    return doc


def _graph_doc(graph: str) -> dict:
    """Llama 3.1 70B on 64 GPUs with per-layer or full-iteration CUDA graphs (no full recompute)."""
    doc = copy.deepcopy(load("llama70b_64gpu"))
    doc["plans"][0]["parallel"].update(cuda_graph=graph, recompute="none" if graph == "layer" else doc["plans"][0]["parallel"]["recompute"])
    return doc


def _mtp_doc() -> dict:
    """DeepSeek-V3 with one multi-token prediction module (--mtp-num-layers 1)."""
    doc = copy.deepcopy(load("deepseek_v3_1024gpu"))
    doc["model"]["mtp_layers"] = 1
    return doc


def _fp8_doc(recipe: str) -> dict:
    """Llama 3 8B in FP8 with the recipe and FP8 primary weights (--fp8-recipe, --fp8-param-gather)."""
    doc = copy.deepcopy(load("llama8b_fsdp_64gpu"))
    doc["job"].update(precision="fp8", fp8_recipe=recipe, fp8_param_gather=True)
    return doc


def _ce_doc(impl: str) -> dict:
    """Llama 3 8B with the fused cross entropy it was priced with (--cross-entropy-loss-fusion, impl)."""
    doc = copy.deepcopy(load("llama8b_fsdp_64gpu"))
    doc["job"]["cross_entropy"] = impl
    return doc


CASES = {f"{fx}-{r}": (load(fx), r) for fx, r in MEGATRON_PLANS}
CASES.update({"layout-vpp1": (_layout_doc(1), 1), "layout-vpp2": (_layout_doc(2), 1), "odd-chunks-vpp2": (_odd_doc(), 1),
              "a2a-overlap-etp1": (_a2a_overlap_doc(1), 3), "a2a-overlap-etp-tp": (_a2a_overlap_doc(2), 3),
              "flex-deepep": (_flex_doc("deepep"), 3), "flex-hybridep": (_flex_doc("hybridep"), 3),
              "cuda-graph-layer": (_graph_doc("layer"), 1), "cuda-graph-full-iteration": (_graph_doc("full_iteration"), 1),
              "mtp": (_mtp_doc(), 1), "fp8-tensorwise": (_fp8_doc("tensorwise"), 1), "fp8-delayed": (_fp8_doc("delayed"), 1),
              "ce-native": (_ce_doc("native"), 1), "ep-beyond-dp-etp1": (_ep_beyond_dp_doc(), 1)})


def _controls() -> list[dict]:
    """Arguments Megatron must reject: 405B's split without the account flags (126 % 8, caught
    only by get_num_layers_to_build) and a rotary base written as 5e5 (an int flag)."""
    args, env, unset = _argv(load("llama405b_512gpu"), 1)
    no_account = [a for a in args if a not in ("--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split")]
    i = args.index("--rotary-base")
    float_base = args[:i + 1] + ["5e5"] + args[i + 2:]
    return [{"name": "control-no-account", "argv": no_account, "env": env, "unset": unset},
            {"name": "control-float-rotary-base", "argv": float_base, "env": env, "unset": unset}]


@pytest.fixture(scope="module")
def megatron_results() -> dict[str, dict]:
    root, where = megatron_lm_root()
    if root is None:
        pytest.skip(f"Megatron-LM snapshot not found at {where} (set PLANNER_MEGATRON_LM or PLANNER_SHARED)")
    cases = []
    for name, (doc, rank) in CASES.items():
        args, env, unset = _argv(doc, rank)
        cases.append({"name": name, "argv": args, "env": env, "unset": unset})
    return run_worker("megatron_lm_worker.py", cases + _controls(), [str(root)])


@pytest.mark.parametrize("name", list(CASES))
def test_megatron_lm_accepts(megatron_results, name):
    doc, rank = CASES[name]
    v = load_plan_view(doc, rank)
    p, m = v.parallel, v.model
    r = megatron_results[name]
    assert r["ok"], r.get("error", "") + "\n" + r.get("trace", "")
    a = r["args"]
    assert (a["tensor_model_parallel_size"], a["pipeline_model_parallel_size"], a["context_parallel_size"], a["data_parallel_size"]) == \
        (p.tp, p.pp, p.cp, p.dp)
    assert (a["virtual_pipeline_model_parallel_size"] or 1) == p.vpp
    assert r["microbatches"] == v.num_microbatches
    # Layers Megatron builds per (virtual stage, rank) == the planner's chunks (chunk-major).
    want = chunk_sizes(v.stage_layers, p.vpp) if p.pp > 1 else [m.layers]
    got = [n for row in r["chunks"] for n in row]
    assert got == want, (got, want)
    assert a["position_embedding_type"] == ("rope" if m.position_embedding == "rope" else "learned_absolute")
    if m.rope_theta is not None and m.position_embedding == "rope":
        assert a["rotary_base"] == int(m.rope_theta)
    assert a["multi_latent_attention"] == m.is_mla and (r["config"] == "MLATransformerConfig") == m.is_mla
    if m.is_mla:
        assert (a["q_lora_rank"], a["kv_lora_rank"], a["qk_head_dim"], a["qk_pos_emb_head_dim"], a["v_head_dim"]) == \
            (m.q_lora_rank or None, m.kv_lora_rank, m.head_dim, m.qk_rope_head_dim, m.v_head_dim)
    if m.moe is not None:
        assert (a["num_experts"], a["moe_router_topk"], a["expert_model_parallel_size"]) == (m.moe.experts, m.moe.top_k, p.ep)
        # initialize_model_parallel: the expert grid etp x ep x pp tiles the world (parallel_state.py)
        assert v.world % (a["expert_tensor_parallel_size"] * p.ep * p.pp) == 0
        assert a["expert_tensor_parallel_size"] == (p.etp or p.tp)
        assert a["overlap_moe_expert_parallel_comm"] == a["config_overlap_moe_expert_parallel_comm"] == bool(p.moe_a2a_overlap)
        disp = next(pl for pl in doc["plans"] if pl["rank"] == rank)["parallel"].get("moe_dispatcher") or "alltoall"
        assert (p.moe_dispatcher or "alltoall") == disp
        assert a["config_moe_token_dispatcher_type"] == ("alltoall" if disp == "alltoall" else "flex")
        if disp != "alltoall":
            assert a["config_moe_flex_dispatcher_backend"] == disp
    assert a["use_distributed_optimizer"] == (p.zero >= 1)
    assert a["use_megatron_fsdp"] == (p.zero >= 2)
    graph = p.cuda_graph or "none"  # the capture TransformerConfig holds: whole layers (no modules) or the step
    assert a["config_cuda_graph_impl"] == {"none": "none", "layer": "local", "full_iteration": "full_iteration"}[graph]
    assert a["config_cuda_graph_modules"] == []
    if p.zero >= 2:
        assert a["data_parallel_sharding_strategy"] == ("optim_grads" if p.zero == 2 else "optim_grads_params")
        assert a["ckpt_format"] == "fsdp_dtensor"
    assert (a["num_layers"], a["hidden_size"], a["ffn_hidden_size"], a["num_attention_heads"]) == (m.layers, m.hidden, m.ffn_hidden, m.heads)
    assert a["untie_embeddings_and_output_weights"] == (not m.tied_embeddings)
    assert (a["mtp_num_layers"] or 0) == m.mtp_layers
    if v.job.precision == "fp8":  # Megatron's own parser holds the recipe priced and the FP8 primary weights
        assert a["fp8"] == "hybrid" and a["fp8_recipe"] == ("delayed" if v.job.fp8_recipe == "auto" else v.job.fp8_recipe)
        assert a["fp8_param_gather"] == bool(v.job.fp8_param_gather and p.zero >= 1)
    ce = v.job.cross_entropy  # the cross entropy priced: auto = megatron-core's default, the eager one
    assert a["cross_entropy_loss_fusion"] == (ce in ("native", "te"))
    assert a["cross_entropy_fusion_impl"] == ("te" if ce == "te" else "native")


def test_te_cross_entropy_is_refused_as_megatron_refuses_it():
    """Megatron-LM's validate_args rejects --cross-entropy-fusion-impl te with the fusion on: the
    launch files refuse it in one line instead of writing a script that stops at start-up."""
    with pytest.raises(InputError, match="job.cross_entropy"):
        emit_files(_ce_doc("te"), "megatron", 1)


def test_the_check_is_live(megatron_results):
    r = megatron_results["control-no-account"]
    assert not r["ok"] and "divisible" in r["error"]
    r = megatron_results["control-float-rotary-base"]
    assert not r["ok"] and "SystemExit" in r["error"]
