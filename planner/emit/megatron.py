"""Megatron-LM: a torchrun launch script for ``pretrain_gpt.py`` carrying every parallel option
of the plan and every model feature Megatron needs to build that model.

Flag names are those of the Megatron-LM snapshot in ``shared/engines/megatron-lm``
(megatron-core 0.20.0; ``megatron/training/arguments.py`` = ARGS, ``transformer_config.py`` =
TC; the line numbers are in docs/research/megatron.md). Most flags are the dashed field names of
``TransformerConfig`` / ``ModelParallelConfig``; the uneven pipeline and VPP flags are
ARGS:3095-3117. Only plans megatron-core runs are written (:func:`planner.emit.common.for_engine`
with the ``megatron-core`` profile): ZeRO-2/3 is Megatron-FSDP, which the profile does not run
with a pipeline.
"""

from __future__ import annotations

from planner.cost.memory import grad_dtype
from planner.cost.memory import has_dropout
from planner.emit.common import LaunchSpec, PlanView, attention_note, chunk_sizes, comment, for_engine, provenance_lines, render_torchrun
from planner.engines import fp8_gathers, fp8_recipe, get_engine
from planner.errors import InputError

__all__ = ["pipeline_layout", "pipeline_args", "MEGATRON_ENGINE", "MEGATRON_TARGET", "MEGATRON_SCRIPT", "USER_BLOCK", "megatron_args",
           "megatron_env", "megatron_launch_spec", "megatron_notes", "megatron_files", "megatron_view"]

MEGATRON_ENGINE = "megatron-core"
MEGATRON_TARGET = "Megatron-LM (megatron-core 0.20.0 snapshot), pretrain_gpt.py"
MEGATRON_SCRIPT = "megatron_launch.sh"

# Routers are not part of ModelSpec: the published recipe of a known model, else Megatron's
# softmax top-k with the auxiliary load-balancing loss at the coefficient TC:875-878 recommends.
_DEFAULT_ROUTER = ["--moe-router-load-balancing-type", "aux_loss", "--moe-aux-loss-coeff", "1e-2"]
_ROUTERS = {
    # DeepSeek-V3 report (arXiv 2412.19437) sec. 2.1.2 and 4.2: sigmoid affinities, auxiliary-loss-
    # free balancing by a per-expert bias (update speed 0.001), routed weights scaled by 2.5,
    # node-limited routing (8 groups, top 4), a sequence-wise balance loss of 0.0001; the same
    # flags as Megatron-LM's examples/megatron_fsdp/sbatch_mfsdp_deepseek_v3.sh.
    "deepseek-v3": ["--moe-router-score-function", "sigmoid", "--moe-router-enable-expert-bias",
                    "--moe-router-bias-update-rate", "1e-3", "--moe-router-topk-scaling-factor", "2.5",
                    "--moe-router-num-groups", "8", "--moe-router-group-topk", "4",
                    "--moe-router-load-balancing-type", "seq_aux_loss", "--moe-aux-loss-coeff", "1e-4"],
}


def megatron_view(v: PlanView) -> tuple[PlanView, list[str]]:
    """The plan as megatron-core runs it (InputError with the engine's reason otherwise)."""
    return for_engine(v, MEGATRON_ENGINE)


def _rotary_base(theta: float) -> int:
    """--rotary-base is an int (ARGS:2418): 5e5 is rejected as "invalid int value"."""
    if theta != int(theta):
        raise InputError("model.rope_theta", theta, "a whole number (Megatron's --rotary-base is an int)")
    return int(theta)


def _model_args(v: PlanView) -> list[str]:
    m, j = v.model, v.job
    a: list[object] = ["--num-layers", m.layers, "--hidden-size", m.hidden, "--ffn-hidden-size", m.ffn_hidden,
                       "--num-attention-heads", m.heads]
    if m.is_mla:
        # Multi-head latent attention (TC:288; ARGS:3548-3556; DeepSeek-V3 report sec. 2.1.1):
        # Megatron's CLI defaults (kv-lora-rank 32, no Q compression) are not DeepSeek's, so every
        # dimension is written. --qk-layernorm turns on the norms of the compressed latents.
        a += ["--multi-latent-attention", "--kv-lora-rank", m.kv_lora_rank, "--qk-head-dim", m.head_dim,
              "--qk-pos-emb-head-dim", m.qk_rope_head_dim, "--v-head-dim", m.v_head_dim or m.head_dim, "--qk-layernorm"]
        if m.q_lora_rank:
            a += ["--q-lora-rank", m.q_lora_rank]
    elif m.kv_heads != m.heads:  # grouped-query attention (ARGS:2382; exclusive with MLA, ARGS:1973)
        a += ["--group-query-attention", "--num-query-groups", m.kv_heads]
    if m.qk_norm and not m.is_mla:  # norms of the query and key heads (Qwen3; TransformerConfig.qk_layernorm)
        a += ["--qk-layernorm"]
    a += ["--kv-channels", m.head_dim, "--seq-length", j.seq_len, "--max-position-embeddings", j.seq_len]
    if m.position_embedding == "rope":
        a += ["--position-embedding-type", "rope"]
        if m.rope_theta is not None:
            a += ["--rotary-base", _rotary_base(m.rope_theta)]
    else:
        a += ["--position-embedding-type", "learned_absolute"]
    a += ["--normalization", "RMSNorm" if m.norm == "rmsnorm" else "LayerNorm"]
    if m.mtp_layers:
        a += ["--mtp-num-layers", m.mtp_layers]  # multi-token prediction (TransformerConfig.mtp_num_layers)
    if m.mlp == "swiglu":
        a.append("--swiglu")
    elif m.mlp == "relu2":
        a.append("--squared-relu")  # gelu is Megatron's default activation
    if not m.bias:
        a.append("--disable-bias-linear")
    if not m.tied_embeddings:
        a.append("--untie-embeddings-and-output-weights")  # Megatron ties by default
    if not has_dropout(m, get_engine(MEGATRON_ENGINE).memory.dropout):
        # Megatron's default dropout is 0.1 (ARGS --attention-dropout / --hidden-dropout); Llama-era
        # models train without it (examples/llama/train_llama3_8b_h100_fp8.sh; NeMo recipes), and
        # the memory the plan was priced with holds no dropout masks for them.
        a += ["--attention-dropout", "0.0", "--hidden-dropout", "0.0"]
    return [str(x) for x in a]


def _moe_args(v: PlanView) -> list[str]:
    moe = v.model.moe
    if moe is None:
        return []
    a: list[object] = ["--num-experts", moe.experts, "--moe-router-topk", moe.top_k, "--moe-ffn-hidden-size", moe.expert_ffn_hidden]
    if moe.shared_experts:
        a += ["--moe-shared-expert-intermediate-size", moe.shared_experts * moe.expert_ffn_hidden]
    if moe.dense_layers:
        # Python-list form of --moe-layer-freq (ARGS:327-350): 0 = dense layer, 1 = MoE layer.
        a += ["--moe-layer-freq", f"([0]*{moe.dense_layers}+[1]*{v.model.layers - moe.dense_layers})"]
    # the plan's dispatcher (all-to-all, or the flex one with DeepEP / HybridEP kernels: what the
    # cost model prices), grouped expert GEMMs, fp32 router.
    disp = getattr(v.parallel, "moe_dispatcher", None) or "alltoall"
    if moe.capacity_factor is not None:
        a += ["--moe-expert-capacity-factor", moe.capacity_factor]
        if disp != "deepep":  # padded to the capacity, as the cost model prices it; DeepEP refuses padding (TC:1754-1761)
            a.append("--moe-pad-expert-input-to-capacity")
    if disp == "alltoall":
        a += ["--moe-token-dispatcher-type", "alltoall"]
    else:  # TransformerConfig.moe_flex_dispatcher_backend (needs the DeepEP / HybridEP package)
        a += ["--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend", disp]
    a += ["--moe-grouped-gemm", "--moe-router-dtype", "fp32"]
    a += _ROUTERS.get(v.model_id, _DEFAULT_ROUTER)
    return [str(x) for x in a]


def pipeline_layout(stages: tuple[int, ...] | list[int], vpp: int, mtp: int = 0) -> str:
    """Megatron's ``--pipeline-model-parallel-layout`` for per-rank layer counts ``stages``:
    the pp x vpp virtual stages in chunk-major order (virtual stage j on rank j % pp, TC:119-121),
    E = embedding, t = one transformer layer, m = one multi-token prediction module (``mtp``, in the
    last virtual stage before the loss: the count must equal --mtp-num-layers, TC layout checks),
    L = output layer and loss; chunk sizes from
    :func:`planner.emit.common.chunk_sizes`. Runs of equal stages are written ``(...)*n``
    (pipeline_parallel_layer_layout.py:291-301 unrolls one level)."""
    segs = ["t" * n for n in chunk_sizes(stages, vpp)]
    tail = "m" * mtp + "L"
    if len(segs) == 1:
        return "E" + segs[0] + tail
    text, i, middle = "E" + segs[0] + "|", 1, len(segs) - 1
    while i < middle:
        j = i
        while j + 1 < middle and segs[j + 1] == segs[i]:
            j += 1
        n = j - i + 1
        text += f"({segs[i]}|)*{n}," if n > 2 else (segs[i] + "|") * n
        i = j + 1
    return text + segs[-1] + tail


def _account_split(stages: tuple[int, ...], vpp: int) -> bool:
    """The split Megatron builds with --account-for-embedding-in-pipeline-split and
    --account-for-loss-in-pipeline-split (transformer_block.py:148-203): L+2 slots, equal per
    rank and chunk, the first chunk of rank 0 and the last chunk of the last rank one layer short."""
    pp, slots = len(stages), sum(stages) + 2
    if slots % (pp * vpp):
        return False
    per = slots // pp
    return list(stages) == [per - (r == 0) - (r == pp - 1) for r in range(pp)]


def pipeline_args(v: PlanView) -> list[str]:
    """The pipeline-split flags: plain (even), first/last, account flags, or a layout string."""
    p = v.parallel
    if p.pp == 1:
        return []
    stages, vpp = v.stage_layers, p.vpp
    even_chunks = all(n % vpp == 0 for n in stages)
    middle = stages[1:-1]
    first_last = len(set(middle)) <= 1 and (not middle or middle[0] > 0) and (vpp == 1 or even_chunks)
    a: list[object] = []
    if not v.uneven and even_chunks:
        if vpp > 1:  # equal chunks only: N = 6 for 20-layer stages is refused (ARGS:957-975)
            a += ["--num-layers-per-virtual-pipeline-stage", stages[0] // vpp]
    elif vpp > 1 and not even_chunks and _account_split(stages, vpp):
        # Llama 3.1 405B on pp 8 x vpp 8: (15, 16 x 6, 15); TC:2370-2415 checks (L+2) % (pp*vpp).
        a += ["--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split",
              "--num-virtual-stages-per-pipeline-rank", vpp]
    elif first_last:
        # Equal middle stages (TC:2294-2368); --num-layers-per-virtual-pipeline-stage is
        # rejected together with them (ARGS:954-956), the virtual-stage count is not.
        a += ["--decoder-first-pipeline-num-layers", stages[0], "--decoder-last-pipeline-num-layers", stages[-1]]
        if vpp > 1:
            a += ["--num-virtual-stages-per-pipeline-rank", vpp]
    else:
        # Anything else: the explicit layout (it replaces the first/last and virtual-stage flags;
        # vpp = stages / pp, ARGS:941-952).
        a += ["--pipeline-model-parallel-layout", pipeline_layout(stages, vpp, v.model.mtp_layers)]
    return [str(x) for x in a]


def _parallel_args(v: PlanView) -> list[str]:
    p = v.parallel
    if p.schedule not in ("1f1b", "interleaved"):
        raise InputError("parallel.schedule", p.schedule, "1f1b or interleaved for Megatron-LM")
    a: list[object] = ["--tensor-model-parallel-size", p.tp, "--pipeline-model-parallel-size", p.pp,
                       "--context-parallel-size", p.cp]
    if v.model.moe is not None:
        # The plan's expert tensor degree (tp unless the expert group spans the tensor ranks);
        # the rank map (planner.emit.bundle) says when it differs from tp.
        a += ["--expert-model-parallel-size", p.ep, "--expert-tensor-parallel-size", getattr(p, "etp", None) or p.tp]
        if getattr(p, "moe_a2a_overlap", False):
            # combined 1F1B: the expert all-to-all under another micro-batch's compute
            # (ModelParallelConfig.overlap_moe_expert_parallel_comm)
            a.append("--overlap-moe-expert-parallel-comm")
    if p.sequence_parallel and p.tp > 1:  # Megatron drops SP with a warning when TP == 1 (ARGS:1433-1439)
        a.append("--sequence-parallel")
        if p.tp_comm_overlap:  # TE userbuffer overlap of the SP all-gather/reduce-scatter (needs SP)
            a.append("--tp-comm-overlap")
    return [str(x) for x in a]


def _memory_args(v: PlanView) -> list[str]:
    p = v.parallel
    a: list[str] = []
    if p.recompute == "selective":
        a += ["--recompute-granularity", "selective"]  # recomputes core attention (default modules, TC:1940)
    elif p.recompute == "full":
        # uniform, 1 layer per chunk: every transformer layer is checkpointed (core/recompute.py:157-183).
        a += ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    graph = getattr(p, "cuda_graph", None) or "none"
    if graph == "layer":
        # each transformer layer's forward and backward captured and replayed (CudaGraphManager;
        # empty --cuda-graph-modules = the whole layer, TC cuda_graph_modules)
        a += ["--cuda-graph-impl", "local"]
    elif graph == "full_iteration":
        m = v.model
        if m.moe is not None and m.moe_layers > 0 and m.moe.capacity_factor is None:
            raise InputError("parallel.cuda_graph", graph, "none or a capacity factor for a dropless MoE model (Megatron-Bridge "
                             "captures it with capacity padding and paged stashing, which the planner does not write)")
        # the whole forward-backward step as one graph; validate_args requires the NaN check off (ARGS:1235-1237)
        a += ["--cuda-graph-impl", "full_iteration", "--no-check-for-nan-in-loss-and-grad"]
    if p.zero >= 1:
        a.append("--use-distributed-optimizer")  # ZeRO-1: optimizer states sharded over DP
    if p.overlap_grad_reduce and p.dp * p.cp > 1:
        # The cost model hides the bucketed gradient reduction behind the last backward;
        # Megatron does that only when asked.
        a.append("--overlap-grad-reduce")
        if p.overlap_param_gather and p.zero in (1, 2):  # needs --overlap-grad-reduce (ARGS:1024-1029)
            a.append("--overlap-param-gather")
    if p.zero >= 2:
        # ZeRO-2/3 = Megatron-FSDP optim_grads / optim_grads_params (ARGS:3190-3192;
        # mcore_fsdp_adapter.py:166-169). validate_args requires --ckpt-format fsdp_dtensor
        # (ARGS:1118-1187) and CUDA_DEVICE_MAX_CONNECTIONS unset (megatron_env).
        a += ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads" if p.zero == 2 else "optim_grads_params",
              "--ckpt-format", "fsdp_dtensor"]
        if v.job.precision != "fp16":
            # Megatron-FSDP keeps gradients in its own dtype (ARGS:3691), not --grad-reduce-in-bf16's.
            a += ["--megatron-fsdp-main-grads-dtype", grad_dtype(v.job.precision, v.job.grad_reduce)]
    return a


def _batch_precision_args(v: PlanView) -> list[str]:
    p, j = v.parallel, v.job
    a = ["--micro-batch-size", str(p.micro_batch_size), "--global-batch-size", str(j.global_batch_size)]
    if j.precision == "fp16":
        a.append("--fp16")
        if j.grad_reduce == "fp32":
            a.append("--accumulate-allreduce-grads-in-fp32")
    else:
        a.append("--bf16")
        if j.grad_reduce == "bf16":
            a.append("--grad-reduce-in-bf16")  # the cost model's 2-byte gradients
        if j.precision == "fp8":
            a += ["--fp8-format", "hybrid"]  # E4M3 forward, E5M2 backward (Transformer Engine)
            eng = get_engine("megatron-core")
            recipe = fp8_recipe(eng, j)  # InputError for a recipe TE does not run (torchao's rowwise)
            if recipe != "delayed":  # Megatron's default (transformer_config.py fp8_recipe)
                a += ["--fp8-recipe", recipe]
            if fp8_gathers(eng, j, v.parallel.zero):  # FP8 primary weights (arguments.py: distributed optimizer or FSDP)
                a.append("--fp8-param-gather")
    get_engine("megatron-core").launch_loss(j.cross_entropy)  # InputError for one Megatron has not or refuses
    if j.cross_entropy == "native":  # the fused cross entropy the plan was priced with (model_parallel_config.py)
        a.append("--cross-entropy-loss-fusion")
    return a


def megatron_args(v: PlanView) -> list[list[str]]:
    """The plan-derived ``pretrain_gpt.py`` arguments, grouped (model, MoE, parallel, pipeline,
    memory, batch/precision); raises InputError where megatron-core cannot run the plan."""
    v, _ = megatron_view(v)
    return [_model_args(v), _moe_args(v), _parallel_args(v), pipeline_args(v), _memory_args(v), _batch_precision_args(v)]


USER_BLOCK = """\
# ---- not decided by the planner: data, tokenizer, optimizer, schedule (edit) ----
MEGATRON_DIR="${{MEGATRON_DIR:-/path/to/Megatron-LM}}"
DATA_ARGS=(--mock-data --tokenizer-type NullTokenizer --vocab-size {vocab})
TRAINING_ARGS=(--train-iters 1000 --lr 3.0e-4 --min-lr 3.0e-5 --lr-decay-style cosine --lr-warmup-iters 100
    --weight-decay 0.1 --clip-grad 1.0 --log-interval 1 --distributed-timeout-minutes 30)
"""


def megatron_env(v: PlanView) -> str:
    """CUDA_DEVICE_MAX_CONNECTIONS: 1 as Megatron's examples (TP/SP overlap), but Megatron-FSDP
    (ZeRO-2/3) asserts it is unset or > 1 (ARGS:1118-1187), and the expert all-to-all overlap
    wants more than one connection (validate_args' warning, ARGS:1466-1474): unset where no
    tensor or context parallelism needs 1."""
    p = v.parallel
    if p.zero >= 2:
        return "unset CUDA_DEVICE_MAX_CONNECTIONS  # Megatron-FSDP requires it unset or > 1\n"
    if getattr(p, "moe_a2a_overlap", False) and p.tp == 1 and p.cp == 1:
        return "unset CUDA_DEVICE_MAX_CONNECTIONS  # the expert all-to-all overlap runs on more than one connection\n"
    return "export CUDA_DEVICE_MAX_CONNECTIONS=1  # as Megatron's examples, for TP/SP overlap\n"


def megatron_launch_spec(v: PlanView) -> LaunchSpec:
    return LaunchSpec(
        program=['"${MEGATRON_DIR}/pretrain_gpt.py"'],
        arg_lines=megatron_args(v),
        tail=['"${DATA_ARGS[@]}"', '"${TRAINING_ARGS[@]}"', '"$@"'],
    )


def megatron_notes(v: PlanView) -> list[str]:
    v, notes = megatron_view(v)
    p, m = v.parallel, v.model
    out = [
        f"Megatron derives dp = world / (tp x pp x cp) = {v.world} / ({p.tp} x {p.pp} x {p.cp}) = {p.dp}; "
        f"microbatches = global / (micro x dp) = {v.num_microbatches}.",
        "Rank order tp-cp-ep-dp-pp (Megatron default): tensor-parallel groups are consecutive ranks.",
        "Dry run of the process groups without a cluster: add --fake-process-group and set WORLD_SIZE/RANK by hand.",
    ]
    if m.position_embedding == "rope" and m.rope_theta is None:
        out.append("The model records no rotary base: Megatron's default --rotary-base 10000 applies.")
    if (note := attention_note(v, "megatron-core")) is not None:
        out.append(note)
    if m.moe is not None:
        router = "the published DeepSeek-V3 router" if v.model_id in _ROUTERS else "softmax top-k with aux_loss 1e-2"
        out.append(f"MoE router: {router} (the plan does not record the router; edit the --moe-router-* flags for yours).")
    if p.pp > 1 and p.vpp > 1 and not all(n % p.vpp == 0 for n in v.stage_layers):
        out.append("Layers per virtual stage (chunk-major order): " + _runs(chunk_sizes(v.stage_layers, p.vpp)) + ".")
    return out + notes


def _runs(xs: list[int]) -> str:
    """1, 2 x 62, 1: runs of equal counts."""
    out: list[list[int]] = []
    for x in xs:
        if out and out[-1][0] == x:
            out[-1][1] += 1
        else:
            out.append([x, 1])
    return ", ".join(f"{x} x {n}" if n > 1 else str(x) for x, n in out)


def megatron_files(v: PlanView) -> dict[str, str]:
    v = megatron_view(v)[0]  # as megatron-core runs it, priced there (the provenance lines' prediction)
    spec = megatron_launch_spec(v)
    body = [
        "#!/usr/bin/env bash\n",
        comment(provenance_lines(v, "Megatron-LM", MEGATRON_TARGET) + megatron_notes(v)),
        "# Run the same command on every node with NODE_RANK set to that node's index (0..NNODES-1).\n",
        "set -euo pipefail\n\n",
        f'NNODES="${{NNODES:-{v.num_nodes}}}"\n',
        'NODE_RANK="${NODE_RANK:-0}"\n',
        'MASTER_ADDR="${MASTER_ADDR:-localhost}"\n',
        'MASTER_PORT="${MASTER_PORT:-29500}"\n',
        megatron_env(v),
        "\n",
        USER_BLOCK.format(vocab=v.model.vocab),
        "\n",
        render_torchrun(spec, v.gpus_per_node, "static"),
    ]
    return {MEGATRON_SCRIPT: "".join(body)}
