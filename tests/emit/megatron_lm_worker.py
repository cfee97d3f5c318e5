"""Run Megatron-LM's own argument checks on emitted launch arguments (one process, many plans).

Started by test_megatron_lm.py with the Megatron-LM snapshot first on PYTHONPATH (so that
``megatron.core`` is the snapshot's, not the pip wheel's: docs/research/megatron.md sec. 6). Reads
a JSON list of cases from stdin ({"name", "argv", "env"}), writes one JSON object per case to
stdout, each on a line starting with ``RESULT `` (Megatron logs to stdout too). Per case, in the order pretrain_gpt.py meets them:

1. ``parse_args`` + ``validate_args`` (megatron/training/arguments.py);
2. ``core_transformer_config_from_args`` (TransformerConfig.__post_init__: uneven PP, the
   layout, MLA, MoE, recompute rules);
3. the microbatch calculator (GBS % (MBS x DP), core/num_microbatches_calculator.py);
4. ``get_num_layers_to_build`` for every (pipeline rank, virtual stage) (transformer_block.py),
   which is where a split the other checks let through fails.

CPU-only stand-ins (each needed and verified in the notes): the triton-kernel modules and
typing.override (megatron_lm_shim), a Hopper device arch and capability (the checks that read
the GPU), the fused RoPE kernel (TransformerConfig refuses apply_rope_fusion without it) and a
Transformer Engine version (TE-gated checks, e.g. MoE + FP8).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import traceback
import warnings

import megatron_lm_shim  # noqa: F401  (before any megatron import)

warnings.filterwarnings("ignore")


def _setup():
    import packaging.version
    import torch

    import megatron.core.utils as U
    import megatron.training.arguments as A
    from megatron.core.models.common.embeddings import rope_utils

    A.get_device_arch_version = lambda: 9
    torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
    if getattr(rope_utils, "fused_apply_rotary_pos_emb", None) is None:
        rope_utils.fused_apply_rotary_pos_emb = lambda *a, **k: None
    U._te_version = packaging.version.Version("2.14.0")
    return A


def _config_from_args(args):
    try:
        from megatron.training.arguments import core_transformer_config_from_args
    except ImportError:
        from megatron.training.argument_utils import core_transformer_config_from_args
    return core_transformer_config_from_args(args)


def _layers_per_chunk(cfg, pp: int, vpp: int | None) -> list[list[int]]:
    from megatron.core import parallel_state as ps
    from megatron.core.transformer.transformer_block import get_num_layers_to_build

    ps.set_pipeline_model_parallel_world_size(pp)
    ps.set_virtual_pipeline_model_parallel_world_size(vpp)
    out = []
    for v in range(vpp or 1):
        row = []
        for r in range(pp):
            ps.set_pipeline_model_parallel_rank(r)
            ps.set_virtual_pipeline_model_parallel_rank(v)
            row.append(int(get_num_layers_to_build(cfg, vp_stage=v if vpp else None, pp_rank=r)))
        out.append(row)
    return out


def _check(A, case: dict) -> dict:
    from megatron.core import num_microbatches_calculator as nmc

    saved = dict(os.environ)
    os.environ.update(case.get("env", {}))
    for k in case.get("unset", []):
        os.environ.pop(k, None)
    sys.argv = ["pretrain_gpt.py", *case["argv"]]
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            args = A.parse_args()
            A.validate_args(args)
            cfg = _config_from_args(args)
            nmc.destroy_num_microbatches_calculator()
            nmc.init_num_microbatches_calculator(0, None, args.global_batch_size, args.micro_batch_size,
                                                 args.data_parallel_size, False)
            microbatches = nmc.get_num_microbatches()
            chunks = _layers_per_chunk(cfg, args.pipeline_model_parallel_size, args.virtual_pipeline_model_parallel_size)
        keys = ("data_parallel_size", "virtual_pipeline_model_parallel_size", "tensor_model_parallel_size",
                "pipeline_model_parallel_size", "context_parallel_size", "expert_model_parallel_size",
                "expert_tensor_parallel_size", "use_distributed_optimizer", "use_megatron_fsdp",
                "data_parallel_sharding_strategy", "ckpt_format", "position_embedding_type", "rotary_base",
                "multi_latent_attention", "q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim",
                "v_head_dim", "num_experts", "moe_router_topk", "moe_ffn_hidden_size", "moe_layer_freq",
                "moe_shared_expert_intermediate_size", "sequence_parallel", "recompute_granularity",
                "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
                "untie_embeddings_and_output_weights", "normalization", "swiglu", "add_bias_linear", "overlap_moe_expert_parallel_comm",
                "mtp_num_layers", "fp8", "fp8_recipe", "fp8_param_gather", "cross_entropy_loss_fusion", "cross_entropy_fusion_impl")
        got = {k: getattr(args, k, None) for k in keys}
        got["config_overlap_moe_expert_parallel_comm"] = getattr(cfg, "overlap_moe_expert_parallel_comm", None)
        got["config_moe_token_dispatcher_type"] = getattr(cfg, "moe_token_dispatcher_type", None)
        got["config_moe_flex_dispatcher_backend"] = getattr(cfg, "moe_flex_dispatcher_backend", None)
        got["config_cuda_graph_impl"] = getattr(cfg, "cuda_graph_impl", None)
        got["config_cuda_graph_modules"] = [str(m) for m in (getattr(cfg, "cuda_graph_modules", None) or [])]
        return {"name": case["name"], "ok": True, "args": got, "config": type(cfg).__name__,
                "microbatches": microbatches, "chunks": chunks}
    except BaseException as exc:  # argparse exits with SystemExit; asserts raise AssertionError
        return {"name": case["name"], "ok": False, "error": f"{type(exc).__name__}: {exc}",
                "trace": traceback.format_exc()[-3000:]}
    finally:
        os.environ.clear()
        os.environ.update(saved)


def main() -> None:
    cases = json.load(sys.stdin)
    A = _setup()
    for case in cases:
        print("RESULT " + json.dumps(_check(A, case), default=str), flush=True)


if __name__ == "__main__":
    main()
