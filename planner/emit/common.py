"""Shared pieces of the launch-config emitters: the validated plan view, provenance headers,
torchrun command rendering and all-or-nothing file writes.

The input is one plan document as written by ``planner plan --json`` (schema
``planner-plan/1``); :func:`load_plan_view` picks one ranked plan out of it and checks the
rules every engine shares (world size, batch arithmetic, head/layer divisibility). Engine
modules add their own rules. Option names and rules follow
``shared/reference/launch_formats.md`` (sections cited where used).
"""

from __future__ import annotations

import importlib.metadata
import os
import shlex
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

from planner.errors import InputError
from planner.cost.compute import gpu_generation
from planner.cost.constants import DEFAULT_CONSTANTS
from planner.cost.rules import tp_rule
from planner.engines import Engine, check_engine, get_engine, resolve, tp_overlap_why
from planner.io.loaders import make_cluster, model_from_dict
from planner.specs import ClusterSpec, Job, ModelSpec, ParallelConfig, is_flash, job_options
from planner.units import gib

__all__ = [
    "attention_note",
    "PLAN_SCHEMA",
    "PLANNER_VERSION",
    "PlanView",
    "LaunchSpec",
    "load_plan_view",
    "for_engine", "fit_problem",
    "chunk_sizes",
    "provenance_lines",
    "comment",
    "render_torchrun",
    "write_files",
]

PLAN_SCHEMA = "planner-plan/1"
try:
    PLANNER_VERSION = importlib.metadata.version("planner")
except importlib.metadata.PackageNotFoundError:  # running from a source tree
    PLANNER_VERSION = "0.1.0"

_EXECUTABLE_SUFFIXES = (".sh", ".sbatch")


def _get(d: object, key: str, where: str) -> object:
    if not isinstance(d, dict):
        raise InputError(where, type(d).__name__, "an object")
    if key not in d:
        raise InputError(f"{where}.{key}", None, "a value (key missing from the plan document)")
    return d[key]


@dataclass(frozen=True)
class PlanView:
    """One ranked plan of a plan document, validated, in SI units."""

    doc: dict
    rank: int
    model_id: str
    model: ModelSpec
    job: Job
    parallel: ParallelConfig
    num_microbatches: int
    num_gpus: int
    gpus_per_node: int
    num_nodes: int
    gpu: str
    predicted: dict = field(default_factory=dict)
    engine: Engine | None = None  # the engine the plan was priced for (plan_doc["engine"])
    cluster: ClusterSpec | None = None

    @property
    def world(self) -> int:
        return self.parallel.world

    @property
    def stage_layers(self) -> tuple[int, ...]:
        """Transformer layers per pipeline stage (explicit split, or the even split)."""
        p = self.parallel
        if p.layers_per_stage is not None:
            return tuple(p.layers_per_stage)
        return (self.model.layers // p.pp,) * p.pp

    @property
    def uneven(self) -> bool:
        return len(set(self.stage_layers)) > 1

    def chunk_layers(self, style: str = "loop") -> list[list[int]]:
        """Layer indices of each model chunk (model part), in model order; see :func:`chunk_sizes`."""
        chunks, start = [], 0
        for size in chunk_sizes(self.stage_layers, self.parallel.vpp, style):
            chunks.append(list(range(start, start + size)))
            start += size
        return chunks

    def degrees_text(self) -> str:
        p = self.parallel
        lps = list(p.layers_per_stage) if p.layers_per_stage else "even"
        return (
            f"tp={p.tp} pp={p.pp} dp={p.dp} cp={p.cp} ep={p.ep} vpp={p.vpp} "
            f"micro_batch={p.micro_batch_size} microbatches={self.num_microbatches} "
            f"global_batch={self.job.global_batch_size} seq_len={self.job.seq_len} "
            f"zero={p.zero} recompute={p.recompute} sequence_parallel={str(p.sequence_parallel).lower()} "
            f"schedule={p.schedule} layers_per_stage={lps} precision={self.job.precision}"
        )

    def predicted_text(self) -> str:
        pr = self.predicted
        parts = []
        if isinstance(pr.get("step_time_s"), (int, float)):
            parts.append(f"step time {pr['step_time_s']:.3f} s")
        if isinstance(pr.get("tokens_per_s"), (int, float)):
            parts.append(f"{pr['tokens_per_s']:.4g} tokens/s")
        if isinstance(pr.get("mfu"), (int, float)):
            parts.append(f"MFU {100 * pr['mfu']:.1f}%")
        if isinstance(pr.get("memory_peak_bytes"), (int, float)):
            mem = f"peak memory {gib(pr['memory_peak_bytes'])} GiB/GPU"
            if isinstance(pr.get("memory_capacity_bytes"), (int, float)):
                mem += f" of {gib(pr['memory_capacity_bytes'])} GiB"
            parts.append(mem)
        return ", ".join(parts) if parts else "no prediction recorded in the plan"


def _model_from(doc_model: dict) -> tuple[str, ModelSpec]:
    """The plan document's model block as (id, ModelSpec), read by the loaders' own function."""
    if not isinstance(doc_model, dict):
        raise InputError("model", doc_model, "an object")
    model_id = str(doc_model.get("id") or doc_model.get("name") or "model")
    fields = {k: v for k, v in doc_model.items() if v is not None}
    return model_id, model_from_dict(fields, "plan.model", strict=False)


def load_plan_view(plan_doc: dict, rank: int = 1) -> PlanView:
    """Validate ``plan_doc`` and return the plan ranked ``rank``; raises InputError on bad input."""
    if not isinstance(plan_doc, dict):
        raise InputError("plan", type(plan_doc).__name__, "a plan document (JSON object)")
    schema = plan_doc.get("schema")
    if schema != PLAN_SCHEMA:
        raise InputError("plan.schema", schema, f"{PLAN_SCHEMA!r} (a document written by `planner plan --json`)")
    plans = _get(plan_doc, "plans", "plan")
    if not isinstance(plans, list) or not plans:
        raise InputError("plan.plans", plans, "a non-empty list of ranked plans")
    ranks = [p.get("rank") for p in plans if isinstance(p, dict)]
    chosen = next((p for p in plans if isinstance(p, dict) and p.get("rank") == rank), None)
    if chosen is None:
        raise InputError("plan_rank", rank, f"one of the ranks in the document {ranks}")
    model_id, model = _model_from(_get(plan_doc, "model", "plan"))
    j = _get(plan_doc, "job", "plan")
    job = Job(seq_len=_get(j, "seq_len", "job"), global_batch_size=_get(j, "global_batch_size", "job"), **job_options(j))
    par = _get(chosen, "parallel", f"plans[rank={rank}]")
    keys = ("tp", "pp", "dp", "cp", "ep", "vpp", "micro_batch_size", "recompute", "sequence_parallel", "zero", "schedule", "tp_comm_overlap",
            "async_tp_allreduce", "overlap_grad_reduce", "overlap_param_gather", "attention", "zero_shard_degree")
    keys += tuple(k for k in ("etp", "moe_a2a_overlap", "moe_dispatcher", "cuda_graph") if k in ParallelConfig.__dataclass_fields__)  # engine-decided fields
    pkw = {k: par[k] for k in keys if isinstance(par, dict) and par.get(k) is not None}
    lps = par.get("layers_per_stage") if isinstance(par, dict) else None
    parallel = ParallelConfig(layers_per_stage=tuple(lps) if lps is not None else None, **pkw)
    hw = _get(plan_doc, "hardware", "plan")
    # Fields a document leaves out are the engine's defaults, resolved as estimate() does.
    engine = get_engine(chosen.get("engine") or plan_doc.get("engine"))  # a plan's own engine (--engine auto)
    cluster = make_cluster(str(hw.get("gpu", "h100-sxm5-80gb")), _get(hw, "num_gpus", "hardware"), hw.get("gpus_per_node"),
                           hw.get("inter_node"), hw.get("intra_node"))
    parallel = resolve(parallel, model, cluster, job, engine)[0]
    num_gpus = _get(hw, "num_gpus", "hardware")
    gpn = hw.get("gpus_per_node", 8)
    for name, v in (("hardware.num_gpus", num_gpus), ("hardware.gpus_per_node", gpn)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise InputError(name, v, "a positive integer")
    num_nodes = hw.get("num_nodes") or max(1, -(-num_gpus // gpn))
    if num_gpus > gpn and num_gpus != num_nodes * gpn:
        raise InputError("hardware.num_gpus", num_gpus, f"num_nodes x gpus_per_node ({num_nodes} x {gpn})")
    if num_gpus < gpn:
        gpn = num_gpus  # a partial node: torchrun starts num_gpus workers
    m_default = parallel.num_microbatches(job.global_batch_size)
    num_mb = par.get("num_microbatches", m_default) if isinstance(par, dict) else m_default
    view = PlanView(
        doc=plan_doc, rank=rank, model_id=model_id, model=model, job=job, parallel=parallel,
        num_microbatches=num_mb, num_gpus=num_gpus, gpus_per_node=gpn, num_nodes=num_nodes,
        gpu=str(hw.get("gpu", "gpu")), predicted=dict(chosen.get("predicted") or {}), engine=engine, cluster=cluster,
    )
    _check_common(view)
    return view


def _check_common(v: PlanView) -> None:
    """Rules all engines share (launch_formats.md sec. 2.2, 3.1, 4.2, 10)."""
    p, m, j = v.parallel, v.model, v.job
    if p.world != v.num_gpus:
        raise InputError("parallel", f"tp*pp*dp*cp = {p.world}", f"hardware.num_gpus ({v.num_gpus})")
    if isinstance(v.num_microbatches, bool) or not isinstance(v.num_microbatches, int) or v.num_microbatches < 1:
        raise InputError("parallel.num_microbatches", v.num_microbatches, "a positive integer")
    if p.micro_batch_size * p.dp * v.num_microbatches != j.global_batch_size:
        raise InputError("job.global_batch_size", j.global_batch_size,
                         f"micro_batch_size x dp x num_microbatches = {p.micro_batch_size} x {p.dp} x {v.num_microbatches}")
    tp_rule(m, p.tp)
    if p.cp > 1 and j.seq_len % (2 * p.cp):
        raise InputError("job.seq_len", j.seq_len, f"a multiple of 2 x cp ({2 * p.cp})")
    if p.ep > 1:
        if m.moe is None:
            raise InputError("parallel.ep", p.ep, "1 for a dense model (no experts)")
        if m.moe.experts % p.ep:
            raise InputError("parallel.ep", p.ep, f"a divisor of the expert count ({m.moe.experts})")
        etp = p.etp or p.tp
        if (p.tp * p.dp * p.cp) % (p.ep * etp):
            raise InputError("parallel.ep", p.ep, f"ep x etp ({p.ep} x {etp}) dividing tp x dp x cp ({p.tp * p.dp * p.cp}): "
                                                  "the expert grid tiles each stage (experts borrow those ranks)")
    if p.vpp > 1 and p.pp == 1:
        raise InputError("parallel.vpp", p.vpp, "1 when pp == 1 (virtual stages need pipeline parallelism)")
    if p.layers_per_stage is not None:
        if sum(p.layers_per_stage) != m.layers:
            raise InputError("parallel.layers_per_stage", list(p.layers_per_stage), f"counts summing to the model's layers ({m.layers})")
        if min(p.layers_per_stage) < 1:
            raise InputError("parallel.layers_per_stage", list(p.layers_per_stage), "at least one layer per stage")
    elif m.layers % p.pp:
        raise InputError("parallel.layers_per_stage", None, f"an explicit split: layers ({m.layers}) are not divisible by pp ({p.pp})")


def part_rank(k: int, pp: int, vpp: int, style: str = "loop") -> tuple[int, int]:
    """(pipeline rank, chunk on that rank) of model part ``k`` (model order, 0 .. pp*vpp-1).

    ``loop``: part ``c*pp + r`` is chunk c of rank r (Megatron-core's interleaved placement;
    torchtitan's looped schedules, torchtitan/distributed/pipeline_parallel.py
    ``_get_stage_indices``). ``v``: two chunks per rank in a V, rank r holding parts r and
    2pp-1-r (torchtitan's ZBVZeroBubble and DualPipeV, same function)."""
    if style == "loop":
        return k % pp, k // pp
    if style == "v":
        if vpp != 2:
            raise InputError("parallel.vpp", vpp, "2 for a V-shaped schedule (two chunks per rank)")
        return (k, 0) if k < pp else (2 * pp - 1 - k, 1)
    raise InputError("style", style, "loop or v")


def chunk_sizes(stages: tuple[int, ...] | list[int], vpp: int, style: str = "loop") -> list[int]:
    """Transformer layers of each model part (model order) for per-rank counts ``stages``.

    Every rank's count divisible by ``vpp``: equal chunks. Otherwise the embedding and the loss
    are counted as one slot each (as Megatron's --account-for-embedding/-loss-in-pipeline-split
    and torchtitan's first/last_stage_less_layers do) and each rank's slots are spread as evenly
    as possible over its chunks, the extra slots going first to the chunks that hold the
    embedding or the loss. Llama 3.1 405B, 126 layers on (15, 16 x 6, 15) with vpp 8: part 0 =
    embedding + 1 layer, the last part = 1 layer + loss, the other 62 parts 2 layers each.
    """
    pp = len(stages)
    n_parts = pp * vpp
    where = [part_rank(k, pp, vpp, style) for k in range(n_parts)]
    parts_of = {r: sorted((c, k) for k, (rr, c) in enumerate(where) if rr == r) for r in range(pp)}
    sizes = [0] * n_parts
    even = all(n % vpp == 0 for n in stages)
    for r, n in enumerate(stages):
        parts = [k for _, k in parts_of[r]]
        extra = {k: (k == 0) + (k == n_parts - 1) for k in parts}
        if even:
            for k in parts:
                sizes[k] = n // vpp
            continue
        base, rem = divmod(n + sum(extra.values()), vpp)
        order = sorted(parts, key=lambda k: (-extra[k], parts.index(k)))
        for i, k in enumerate(order):
            sizes[k] = base + (1 if i < rem else 0) - extra[k]
        if min(sizes[k] for k in parts) < 0:
            raise InputError(f"parallel.layers_per_stage[{r}]", n, f"at least one layer per virtual stage (vpp {vpp})")
    return sizes


_FLAG_FIELDS = ("sequence_parallel", "attention", "tp_comm_overlap", "async_tp_allreduce", "overlap_grad_reduce",
                "overlap_param_gather")


# How each engine is told to run FlashAttention-2's kernels (ParallelConfig.attention "fa2"), for the
# launch files' notes: none of the emitted files can pin the kernel by themselves.
_FA2_HOW = {
    "megatron-deepspeed": "TRAIN_ARGS pass --use-flash-attn-v2 (the flash-attn 2.x package must be installed; without the flag "
                          "Megatron-DeepSpeed runs its fused softmax over the full s x s square, far slower and larger)",
    "megatron-core": "Transformer Engine picks cuDNN or FA3 on Hopper by default (--attention-backend auto), faster than priced; "
                     "--attention-backend flash with the flash-attn 2 package (and no flash-attn 3) runs FA2",
    "torchtitan": "torchtitan 0.2.x puts cuDNN first in SDPA (faster than priced); 0.3.0's FlexAttention is FA2-class",
    "deepspeed": "the model's attention must run FlashAttention-2 (Hugging Face attn_implementation='flash_attention_2', or "
                 "SDPA's flash backend)",
}


# ... and the first FlashAttention's (ParallelConfig.attention "fa1"): only Megatron-DeepSpeed has a flag for it
# (for_engine turns an fa1 plan into fa2 on the other engines, with a note).
_FA1_HOW = {
    "megatron-deepspeed": "TRAIN_ARGS pass --use-flash-attn-v1 (the flash-attn 1.x package must be installed; "
                          "--use-flash-attn-v2 with flash-attn 2.x runs about twice as fast in attention)",
}


def attention_note(v: PlanView, engine: str) -> str | None:
    """The launch files' note on a plan priced with FlashAttention-2's or -1's kernels, or with the
    GPU's best flash kernels on an engine whose flash path runs FlashAttention-2 by default
    (DeepSpeed: Hugging Face's SDPA) where the two differ (Hopper, Blackwell); None otherwise."""
    if v.parallel.attention == "fa2":
        return f"The plan prices FlashAttention-2's attention kernels: {_FA2_HOW.get(engine, 'run FlashAttention-2')}."
    if v.parallel.attention == "fa1":
        return f"The plan prices FlashAttention 1's attention kernels: {_FA1_HOW.get(engine, 'run flash-attn 1.x')}."
    if (v.parallel.attention == "flash" and get_engine(engine).flash_kernel != "flash" and v.cluster is not None
            and DEFAULT_CONSTANTS.FA2_ATTENTION_RATIO[gpu_generation(v.cluster.gpu)] < 1.0):
        return ("The plan prices the GPU's fastest flash attention (cuDNN or FlashAttention-3), which the model code must "
                "ask for: PyTorch SDPA runs FlashAttention-2 first unless told (torch.nn.attention.sdpa_kernel with "
                "SDPBackend.CUDNN_ATTENTION first), about half as fast on this GPU.")
    return None


def for_engine(v: PlanView, name: str) -> tuple[PlanView, list[str]]:
    """The plan as engine ``name`` runs it, and the notes on what differs from the prediction.

    The structure (degrees, ZeRO stage, recompute, schedule, split) is the plan's and must be
    one the engine runs: :func:`planner.engines.check_engine` raises the engine's one-line
    reason otherwise. The fields an engine decides for itself (sequence parallelism, attention
    kernel, overlaps) stay the plan's where the engine has them, else become what the engine
    does, with a note (the plan was priced for another engine)."""
    target = get_engine(name)
    par = v.parallel
    notes: list[str] = []
    if v.engine is not None and v.engine.name != target.name:
        ch: dict = {}
        if par.tp > 1 and par.sequence_parallel and not target.sequence_parallel:
            ch["sequence_parallel"] = False
        if par.tp > 1 and not par.sequence_parallel and not target.sequence_parallel_optional:
            ch["sequence_parallel"] = True
        if par.attention and target.attention_kernels and par.attention not in target.attention_kernels:
            # a flash plan on an engine that runs only FlashAttention-2 (Megatron-DeepSpeed --use-flash-attn-v2) keeps FA2
            ch["attention"] = "fa2" if is_flash(par.attention) and "fa2" in target.attention_kernels else "unfused"
        sp = ch.get("sequence_parallel", par.sequence_parallel)
        # an overlap the target runs only on request (torchtitan's async TP, which needs torch.compile) does not carry over
        domain = v.cluster.nvlink_domain if v.cluster is not None else par.tp  # no cluster in the document: taken as inside one domain
        tpo = tp_overlap_why(target, par.tp, sp, domain) is None and target.tp_comm_overlap_default is not False
        for key, has in (("tp_comm_overlap", tpo), ("async_tp_allreduce", target.async_tp_allreduce),
                         ("overlap_grad_reduce", target.overlap_grad_reduce), ("overlap_param_gather", target.overlap_param_gather)):
            if getattr(par, key) and not has:
                ch[key] = False
        for key, val in ch.items():
            notes.append(f"The plan was priced for {v.engine.name} with {key}={getattr(par, key)}; {target.name} runs "
                         f"{key}={val}, so that part of the prediction does not carry over.")
        par = replace(par, **ch)
        ce = v.job.cross_entropy
        if not target.has_loss(ce):  # e.g. Megatron's fusion on torchtitan
            notes.append(f"The plan was priced for {v.engine.name} with cross_entropy={ce}; {target.name} runs its own "
                         f"({target.loss_default}), so that part of the prediction does not carry over.")
            v = replace(v, job=replace(v.job, cross_entropy="auto"))
        if par.pp > 1 and par.layers_per_stage is not None and not target.custom_split:
            from planner.engines import default_split  # noqa: PLC0415

            even = default_split(v.model, par.pp, par.vpp or 1, target)
            if tuple(par.layers_per_stage) != even:  # the engine partitions the layers itself
                notes.append(f"The plan's layer split {list(par.layers_per_stage)} is not one {target.name} sets; it runs "
                             f"{list(even)}.")
                par = replace(par, layers_per_stage=even)
    out = replace(v, parallel=par)
    check_engine(v.model, v.job, par, target, out.stage_layers)
    if v.engine is not None and v.engine.name != target.name and v.cluster is not None:
        out = _repriced(out, v, target, notes)
    return out, notes


def _repriced(out: PlanView, v: PlanView, target: Engine, notes: list[str]) -> PlanView:
    """The plan as ``target`` runs it, priced on ``target`` (its kernels, its memory): the
    provenance lines carry that prediction; a plan that does not fit there gets a warning note and
    ``predicted["fits"] = False`` (``--emit all`` then leaves that engine out:
    :func:`fit_problem`)."""
    from planner.cost.estimate import estimate  # noqa: PLC0415

    e = estimate(out.model, out.cluster, out.job, out.parallel, target)
    old = v.predicted.get("planned_step_time_s", v.predicted.get("step_time_s"))  # the plan's own engine's
    notes.append(f"Priced again on {target.name}: step {e.step_time_s:.3f} s, MFU {100 * e.mfu:.1f}%, "
                 f"{gib(e.memory_peak_bytes)} GiB" + (f" (the plan's {v.engine.name} prediction: {old:.3f} s)" if isinstance(old, (int, float)) else ""))
    if not e.fits:
        notes.append(f"WARNING: on {target.name} this plan needs {gib(e.memory_peak_bytes)} GiB per GPU, "
                     f"{gib(e.memory_usable_bytes)} GiB usable: it is not expected to fit; plan with --engine {target.name}.")
    pred = {**v.predicted, "planned_step_time_s": old, "step_time_s": e.step_time_s, "tokens_per_s": e.tokens_per_s, "mfu": e.mfu,
            "memory_peak_bytes": e.memory_peak_bytes, "memory_capacity_bytes": e.memory_capacity_bytes, "fits": e.fits}
    return replace(out, predicted=pred)


def fit_problem(v: PlanView, target: str) -> str | None:
    """Why engine ``target``'s files of this plan are not written by ``--emit all``: the plan
    priced on ``target`` does not fit its memory (None: it fits, or it is the plan's own engine)."""
    w, _ = for_engine(v, target)
    if w.predicted.get("fits") is False:
        return (f"priced on {target}, the plan needs {gib(w.predicted['memory_peak_bytes'])} GiB per GPU, more than the usable "
                f"memory (the plan was priced for {v.engine.name}: {gib(v.predicted.get('memory_peak_bytes', 0.0))} GiB); "
                f"plan with --engine {target}")
    return None


def provenance_lines(v: PlanView, engine: str, target: str) -> list[str]:
    """The lines every emitted file carries: who produced it, from which plan, what it predicts."""
    doc = v.doc
    return [
        f"Generated by planner {PLANNER_VERSION} for {engine} ({target}).",
        f"Source plan: schema {doc.get('schema')}, written by planner {doc.get('planner_version', '?')}; "
        f"plan rank {v.rank}; model {v.model_id}; {v.num_gpus} x {v.gpu} ({v.num_nodes} node(s) x {v.gpus_per_node})"
        + (f"; network {v.cluster.inter.kind} {v.cluster.inter.nics_per_node} x {v.cluster.inter.gbps_per_nic:g} Gb/s per node"
           if v.cluster is not None and v.cluster.inter is not None else "") + ".",
        f"Plan rank {v.rank} degrees: {v.degrees_text()}.",
        f"Predicted by the planner: {v.predicted_text()}.",
        "Written by `planner launch`; re-run it (with --force) rather than editing the parallel settings by hand.",
    ]


def comment(lines: list[str], prefix: str = "# ") -> str:
    return "".join(f"{prefix}{line}".rstrip() + "\n" for line in lines)


@dataclass(frozen=True)
class LaunchSpec:
    """What torchrun starts: the program words (already shell-safe), plan-derived arguments
    (one inner list per rendered line, quoted on rendering) and shell words appended as-is."""

    program: list[str]
    arg_lines: list[list[str]]
    tail: list[str] = field(default_factory=list)


def render_torchrun(spec: LaunchSpec, nproc_per_node: int, style: str, prefix: str = "") -> str:
    """A torchrun command, one backslash-continued logical line (launch_formats.md sec. 1, 8).

    ``style="static"``: node rank + master address from the environment (one command per node).
    ``style="c10d"``: c10d rendezvous keyed by the SLURM job id (same command on every node).
    """
    if style == "static":
        head = [
            f'{prefix}torchrun --nnodes "${{NNODES}}" --nproc-per-node {nproc_per_node} --node-rank "${{NODE_RANK}}"',
            '--master-addr "${MASTER_ADDR}" --master-port "${MASTER_PORT}"',
        ]
    elif style == "c10d":
        head = [
            f'{prefix}torchrun --nnodes "${{SLURM_NNODES}}" --nproc-per-node {nproc_per_node}',
            '--rdzv-id "${SLURM_JOB_ID}" --rdzv-backend c10d --rdzv-endpoint "${MASTER_ADDR}:${MASTER_PORT}"',
        ]
    else:
        raise InputError("style", style, "static or c10d")
    lines = head + [" ".join(spec.program)]
    lines += [" ".join(shlex.quote(a) for a in group) for group in spec.arg_lines if group]
    if spec.tail:
        lines.append(" ".join(spec.tail))
    return " \\\n    ".join(lines) + "\n"


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        raise InputError("files", name, "a plain file name (no directories)")
    return name


def write_files(files: dict[str, str], out_dir: str | os.PathLike, force: bool = False) -> list[Path]:
    """Write ``files`` (name -> text) into ``out_dir``: all of them or none.

    Every target is checked before anything is written; an existing file is an InputError
    unless ``force``. Each file goes to a temporary file in the same directory first and is
    moved into place with os.replace only after all temporaries were written, so a reader
    never sees a half-written file. Shell scripts get mode 0755, others 0644.
    """
    if not isinstance(files, dict) or not files:
        raise InputError("files", files, "a non-empty mapping of file name to content")
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise InputError("out", str(out), "a directory", flag="--out")
    targets = {}
    for name, content in files.items():
        if not isinstance(content, str):
            raise InputError(f"files[{name!r}]", type(content).__name__, "text")
        targets[_check_name(name)] = out / name
    existing = [str(t) for t in targets.values() if t.exists() or t.is_symlink()]
    if existing and not force:
        raise InputError("out", ", ".join(existing), "files that do not exist yet (pass --force to overwrite)", flag="--out")
    for t in targets.values():
        if t.is_dir():
            raise InputError("out", str(t), "a file path, not a directory", flag="--out")
    staged: list[tuple[str, Path]] = []
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name, target in targets.items():
            fd, tmp = tempfile.mkstemp(dir=out, prefix=f".{name}.", suffix=".tmp")
            staged.append((tmp, target))
            with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as fh:
                fh.write(files[name])
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(tmp, 0o755 if name.endswith(_EXECUTABLE_SUFFIXES) else 0o644)
    except BaseException as exc:
        for tmp, _ in staged:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        if isinstance(exc, OSError):  # a folder that cannot be made or written: the user's path, not a bug
            raise InputError("out", str(out), f"a folder the files can be written to ({exc.strerror or exc})", flag="--out") from exc
        raise
    for tmp, target in staged:
        os.replace(tmp, target)
    return [target for _, target in staged]
