"""What a recompute policy re-runs in the backward, where it is not the whole forward.

Megatron's selective recompute re-runs the attention core (Korthikanti et al. 2022 sec. 4.2;
:mod:`planner.cost.stages` prices it as the layer's attention forward). torchtitan's per-op
selective checkpointing (``activation_checkpoint.mode = "selective"``, ``selective_ac_option =
"op"``) keeps a list of op outputs instead (torchtitan 0.2.2 models/llama3/infra/parallelize.py
``_op_sac_save_list``: ``aten.mm``, the SDPA kernels, ``reduce_scatter_tensor``, ``aten.max``;
the deepseek_v3, llama4 and gpt_oss lists also ``all_to_all_single``) and, in
distributed/activation_checkpoint.py ``_get_custom_policy``, recomputes every second ``aten.mm``
of a block (the counter runs over the block's forward; the MoE router's gate mm,
``per_op_sac_force_recompute_mm_shapes_by_fqns``, is recomputed without moving it). With
``early_stop`` off (0.2.2's default) the backward re-runs the block's whole forward with the
kept outputs cached: the norms, rotary embedding, activation and residual kernels, every FP8
cast, the sequence-parallel all-gathers, and the MoE experts' ``_grouped_mm`` (not in the list).
The expert all-to-alls are taken as kept (the MoE models' lists). Multi-head latent attention
is counted with its parameter-equivalent widths (:func:`planner.cost.flops.attn_proj_dims`),
not its five mms. :func:`planner.cost.memory.sac_op_bytes_per_layer` counts what it keeps.
"""

from __future__ import annotations

from planner.cost.compute import moe_load_factor
from planner.cost.constants import Constants
from planner.cost.flops import attn_proj_dims, mlp_matrices
from planner.specs import ModelSpec

__all__ = ["op_sac_recomputed_gemm_share"]


def op_sac_recomputed_gemm_share(model: ModelSpec, moe_layer: bool, ep: int, C: Constants) -> float:
    """Share of one layer's forward GEMM FLOPs that torchtitan's per-op policy re-runs.

    mm order in a block: wq, wk, wv, wo, then w1, w3, w2 (SwiGLU) or w1, w2 (two-matrix MLP);
    the even ones (wk, wo, w3 or w2) are recomputed. In an MoE layer the router's gate mm and the
    routed experts (``_grouped_mm``) are recomputed whole, and the shared expert's w1, w3, w2
    continue the count at 5, 6, 7: one matrix of three."""
    h = model.hidden
    qw, kvw = attn_proj_dims(model)
    attn_all = qw * h + kvw * h + h * qw
    attn_re = kvw / 2 * h + h * qw  # wk and wo
    mats = mlp_matrices(model)
    if model.moe is not None and moe_layer:
        moe = model.moe
        routed = moe.top_k * moe_load_factor(model, ep, C) * mats * h * moe.expert_ffn_hidden
        shared = moe.shared_experts * mats * h * moe.expert_ffn_hidden
        router = h * moe.experts
        return (attn_re + router + routed + shared / mats) / (attn_all + router + routed + shared)
    mlp = mats * h * model.ffn_hidden
    return (attn_re + h * model.ffn_hidden) / (attn_all + mlp)  # w3 (SwiGLU) or w2: one matrix of the MLP
