"""Megatron-LM: a torchrun launch script for ``pretrain_gpt.py`` carrying every parallel option
of the plan.

Flag names are those of Megatron-LM main @ d98e8a64 (launch_formats.md sec. 2): most are the
dashed field names of ``TransformerConfig`` / ``ModelParallelConfig`` (sec. 2.1), the uneven
pipeline and VPP flags are the hand-written ones of ``megatron/training/arguments.py``
(sec. 2.2); removed flags of sec. 2.3 are never emitted.
"""

from __future__ import annotations

from planner.cost.memory import grad_dtype
from planner.emit.common import LaunchSpec, PlanView, comment, provenance_lines, render_torchrun
from planner.errors import InputError

__all__ = ["pipeline_layout", "MEGATRON_TARGET", "MEGATRON_SCRIPT", "USER_BLOCK", "megatron_args", "megatron_env", "megatron_launch_spec",
           "megatron_notes", "megatron_files"]

MEGATRON_TARGET = "Megatron-LM main @ d98e8a64, pretrain_gpt.py"
MEGATRON_SCRIPT = "megatron_launch.sh"


def _model_args(v: PlanView) -> list[str]:
    m, j = v.model, v.job
    a = ["--num-layers", m.layers, "--hidden-size", m.hidden, "--ffn-hidden-size", m.ffn_hidden,
         "--num-attention-heads", m.heads]
    if m.kv_heads != m.heads:  # grouped-query attention (sec. 2.4)
        a += ["--group-query-attention", "--num-query-groups", m.kv_heads]
    a += ["--kv-channels", m.head_dim, "--seq-length", j.seq_len, "--max-position-embeddings", j.seq_len]
    if m.norm == "rmsnorm":
        # The plan does not record the position embedding; RMSNorm models (Llama family) use RoPE.
        a += ["--position-embedding-type", "rope", "--normalization", "RMSNorm"]
    if m.mlp == "swiglu":
        a.append("--swiglu")
    elif m.mlp == "relu2":
        a.append("--squared-relu")  # gelu is Megatron's default activation
    if not m.bias:
        a.append("--disable-bias-linear")
    if not m.tied_embeddings:
        a.append("--untie-embeddings-and-output-weights")  # Megatron ties by default (sec. 2.4)
    return [str(x) for x in a]


def _moe_args(v: PlanView) -> list[str]:
    moe = v.model.moe
    if moe is None:
        return []
    a = ["--num-experts", moe.experts, "--moe-router-topk", moe.top_k, "--moe-ffn-hidden-size", moe.expert_ffn_hidden]
    if moe.shared_experts:
        a += ["--moe-shared-expert-intermediate-size", moe.shared_experts * moe.expert_ffn_hidden]
    if moe.dense_layers:
        # Python-list form of --moe-layer-freq: 0 = dense layer, 1 = MoE layer.
        a += ["--moe-layer-freq", f"([0]*{moe.dense_layers}+[1]*{v.model.layers - moe.dense_layers})"]
    a += ["--moe-token-dispatcher-type", "alltoall"]
    return [str(x) for x in a]


def pipeline_layout(stages: tuple[int, ...] | list[int], vpp: int) -> str:
    """Megatron's ``--pipeline-model-parallel-layout`` for a split of layers over pipeline ranks,
    each rank's layers divided equally over its ``vpp`` model chunks."""
    pp = len(stages)
    segments = ["t" * (stages[j % pp] // vpp) for j in range(pp * vpp)]
    segments[0] = "E" + segments[0]
    segments[-1] = segments[-1] + "L"
    return "|".join(segments)


def _pipeline_args(v: PlanView) -> list[str]:
    p = v.parallel
    a: list[object] = []
    if p.schedule not in ("1f1b", "interleaved"):
        raise InputError("parallel.schedule", p.schedule, "1f1b or interleaved for Megatron-LM")
    stages = v.stage_layers
    if p.vpp > 1:
        for r, n in enumerate(stages):
            if n % p.vpp:
                raise InputError(f"parallel.layers_per_stage[{r}]", n, f"a multiple of vpp ({p.vpp}) for Megatron-LM")
        # Default microbatch group size per virtual stage is PP; the interleaved schedule then
        # needs the microbatch count to be a multiple of PP (sec. 2.2).
        if v.num_microbatches % p.pp:
            raise InputError("parallel.num_microbatches", v.num_microbatches,
                             f"a multiple of pp ({p.pp}) for Megatron's interleaved schedule")
    if v.uneven and len(set(stages[1:-1])) > 1:
        # Unequal middle stages: --pipeline-model-parallel-layout lists the pp x vpp virtual
        # stages in schedule order (virtual stage j on rank j % pp, model chunk j // pp);
        # E = embedding, t = one transformer layer, L = output layer and loss (sec. 2.2). It
        # replaces the first/last and virtual-stage flags.
        a += ["--pipeline-model-parallel-layout", pipeline_layout(stages, p.vpp)]
        return [str(x) for x in a]
    if v.uneven:
        a += ["--decoder-first-pipeline-num-layers", stages[0], "--decoder-last-pipeline-num-layers", stages[-1]]
    if p.vpp > 1:
        if v.uneven:
            # --num-layers-per-virtual-pipeline-stage is rejected with uneven first/last stages.
            a += ["--num-virtual-stages-per-pipeline-rank", p.vpp]
        else:
            a += ["--num-layers-per-virtual-pipeline-stage", stages[0] // p.vpp]
    return [str(x) for x in a]


def _parallel_args(v: PlanView) -> list[str]:
    p = v.parallel
    a: list[object] = ["--tensor-model-parallel-size", p.tp, "--pipeline-model-parallel-size", p.pp,
                       "--context-parallel-size", p.cp]
    if v.model.moe is not None:
        # ETP = TP pins the expert grid that planner.emit.layout documents.
        a += ["--expert-model-parallel-size", p.ep, "--expert-tensor-parallel-size", p.tp]
    if p.sequence_parallel and p.tp > 1:  # Megatron drops SP with a warning when TP == 1
        a.append("--sequence-parallel")
        if p.tp_comm_overlap:  # TE userbuffer overlap of the SP all-gather/reduce-scatter (needs SP)
            a.append("--tp-comm-overlap")
    return [str(x) for x in a]


def _memory_args(v: PlanView) -> list[str]:
    p = v.parallel
    a: list[str] = []
    if p.recompute == "selective":
        a += ["--recompute-granularity", "selective"]  # recomputes core attention (default modules)
    elif p.recompute == "full":
        # uniform, 1 layer per chunk: every transformer layer is checkpointed (sec. 2.2).
        a += ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    if p.zero >= 1:
        a.append("--use-distributed-optimizer")  # ZeRO-1: optimizer states sharded over DP
    if p.overlap_grad_reduce and p.dp * p.cp > 1:
        # The cost model hides the bucketed gradient reduction behind the last backward
        # (stages.stage_sync); Megatron does that only when asked.
        a.append("--overlap-grad-reduce")
        if p.overlap_param_gather and p.zero in (1, 2):  # Megatron requires it with the one above
            a.append("--overlap-param-gather")  # the weight gather beside the next forward
    if p.zero >= 2:
        # ZeRO-2/3 = Megatron FSDP with the matching sharding strategy (sec. 0 glossary).
        # validate_args: Megatron-FSDP requires --ckpt-format fsdp_dtensor.
        a += ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads" if p.zero == 2 else "optim_grads_params",
              "--ckpt-format", "fsdp_dtensor"]
        if v.job.precision != "fp16":
            # Megatron FSDP keeps gradients in its own dtype (default: the compute dtype), not
            # --grad-reduce-in-bf16's: ask for the one the prediction assumed.
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
    return a


def megatron_args(v: PlanView) -> list[list[str]]:
    """The plan-derived ``pretrain_gpt.py`` arguments, grouped (model, MoE, parallel, pipeline,
    memory, batch/precision); raises InputError where Megatron-LM cannot express the plan."""
    return [_model_args(v), _moe_args(v), _parallel_args(v), _pipeline_args(v), _memory_args(v),
            _batch_precision_args(v)]


USER_BLOCK = """\
# ---- not decided by the planner: data, tokenizer, optimizer, schedule (edit) ----
MEGATRON_DIR="${{MEGATRON_DIR:-/path/to/Megatron-LM}}"
DATA_ARGS=(--mock-data --tokenizer-type NullTokenizer --vocab-size {vocab})
TRAINING_ARGS=(--train-iters 1000 --lr 3.0e-4 --min-lr 3.0e-5 --lr-decay-style cosine --lr-warmup-iters 100
    --weight-decay 0.1 --clip-grad 1.0 --log-interval 1 --distributed-timeout-minutes 30)
"""


def megatron_env(v: PlanView) -> str:
    """CUDA_DEVICE_MAX_CONNECTIONS: 1 as Megatron's examples (TP/SP overlap), but Megatron-FSDP
    (ZeRO-2/3) asserts it is unset or > 1 (arguments.py validate_args)."""
    if v.parallel.zero >= 2:
        return "unset CUDA_DEVICE_MAX_CONNECTIONS  # Megatron-FSDP requires it unset or > 1\n"
    return "export CUDA_DEVICE_MAX_CONNECTIONS=1  # as Megatron's examples, for TP/SP overlap\n"


def megatron_launch_spec(v: PlanView) -> LaunchSpec:
    return LaunchSpec(
        program=['"${MEGATRON_DIR}/pretrain_gpt.py"'],
        arg_lines=megatron_args(v),
        tail=['"${DATA_ARGS[@]}"', '"${TRAINING_ARGS[@]}"', '"$@"'],
    )


def megatron_notes(v: PlanView) -> list[str]:
    p = v.parallel
    return [
        f"Megatron derives dp = world / (tp x pp x cp) = {v.world} / ({p.tp} x {p.pp} x {p.cp}) = {p.dp}; "
        f"microbatches = global / (micro x dp) = {v.num_microbatches}.",
        "Rank order tp-cp-ep-dp-pp (Megatron default): tensor-parallel groups are consecutive ranks.",
        "Dry run of the process groups without a cluster: add --fake-process-group and set WORLD_SIZE/RANK by hand.",
    ]


def megatron_files(v: PlanView) -> dict[str, str]:
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
