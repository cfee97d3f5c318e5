"""Engine profiles: what one training engine runs, as data (``profiles/*.yaml``).

A profile says which features an engine has (attention kernel, sequence/context/expert
parallelism, recompute granularities, tensor-parallel overlaps, data-parallel overlaps), how
it implements each ZeRO stage (when gradients are reduced and parameters gathered: once per
step or every micro-batch), which pipeline schedules and layouts it accepts, and the settings
the planner's launch files for that engine use when a field is left unset. Every entry cites
the engine's own docs or code (the ``sources`` of each file).

>>> from planner.engines import get_engine
>>> e = get_engine("megatron-core")
>>> e.sharding[1].grad_sync, e.sharding[2].grad_sync
('step', 'microbatch')
>>> get_engine("torchtitan").max_zero_with_pp
3
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import yaml

from planner.errors import InputError, suggest
from planner.specs import ATTENTION_KINDS, DEFAULT_ATTENTION_KERNELS, FLASH_KINDS, ModelSpec

__all__ = ["Sharding", "MemoryProfile", "Engine", "ENGINE_NAMES", "DEFAULT_ENGINE", "AUTO", "AUTO_ENGINES", "get_engine", "engine_names", "has_dropout"]

DEFAULT_ENGINE = "megatron-core"
GRAD_SYNC = ("step", "microbatch")
PARAM_GATHER = ("none", "step", "layer")
SCHEDULES = ("1f1b", "interleaved", "gpipe", "zb-h1", "zb-h2", "zb-v", "dualpipe")


def has_dropout(model: ModelSpec, dropout: str | bool | None) -> bool:
    """Whether the layers train with dropout under an engine's rule (``always``, ``never``,
    ``model``: GPT-era models with biases do, Llama-era models do not)."""
    if isinstance(dropout, bool):
        return dropout
    if dropout == "always":
        return True
    if dropout == "never":
        return False
    return model.bias  # "model" / None: GPT-era models train with dropout; Llama-era models do not


@dataclass(frozen=True)
class Sharding:
    """How an engine implements one ZeRO stage (Rajbhandari et al. 2020).

    ``grad_sync``: ``step`` = gradients accumulate locally over the micro-batches and are
    reduced (all-reduce, or reduce-scatter when sharded) once per step; ``microbatch`` = every
    micro-batch's backward reduce-scatters its gradients into the sharded buffer.
    ``param_gather``: ``none`` (replicated weights), ``step`` = the updated shards are
    all-gathered once after the optimizer step, ``layer`` = every layer's weights are
    all-gathered in the forward and (with ``reshard_after_forward``) again in the backward of
    every micro-batch (ZeRO-3 / FSDP FULL_SHARD).
    """

    zero: int
    name: str
    grad_sync: str
    param_gather: str
    reshard_after_forward: bool = True
    with_pp: bool = True
    source: str = ""
    grad_collective: str = "reducescatter"  # allreduce: DeepSpeed ZeRO-2 all-reduces each bucket by default
    overlap_grad_reduce: bool | None = None  # None: the engine's feature; False: this mode reduces after the backward
    pp: "Sharding | None" = None  # how the mode runs under pipeline parallelism, where that differs

    def __post_init__(self) -> None:
        if self.grad_sync not in GRAD_SYNC:
            raise InputError(f"engine.sharding[{self.zero}].grad_sync", self.grad_sync, "step or microbatch")
        if self.param_gather not in PARAM_GATHER:
            raise InputError(f"engine.sharding[{self.zero}].param_gather", self.param_gather, "none, step or layer")
        if self.grad_collective not in ("reducescatter", "allreduce"):
            raise InputError(f"engine.sharding[{self.zero}].grad_collective", self.grad_collective, "reducescatter or allreduce")


@dataclass(frozen=True)
class MemoryProfile:
    """What an engine keeps in GPU memory, where engines differ (``memory:`` in a profile; every
    value cites the engine's code there; :mod:`planner.cost.memory` uses them).

    ``states``: the model-state recipe: ``megatron`` (16-bit weights, a gradient buffer in the
    gradient dtype, fp32 master weights and Adam moments), ``fsdp2`` (the fp32 shard is the
    parameter, 16-bit copies exist only while all-gathered; gradients appear in the backward and
    are freed by ``zero_grad``), ``deepspeed`` (ZeRO's flat 16-bit and fp32 partitions).
    ``selective``: what ``recompute: selective`` keeps: ``korthikanti`` (Megatron: every tensor but
    the attention core's) or ``op`` (torchtitan's per-op policy). ``dropout``: ``always`` (the
    engine's default dropout 0.1), ``model`` (the model's own: GPT-era models), ``never``.
    ``loss_*``: bytes per logit element: ``held`` between a micro-batch's forward and backward,
    ``peak`` at the loss backward (``_tp`` with the vocabulary split over tensor parallelism),
    ``pp_stage_output`` more on a pipeline's last stage that keeps its output until its backward.
    ``output_input_gathered``: column-parallel linears save their all-gathered input (DTensor).
    ``fp8_saved_input_bytes``: bytes per saved FP8 GEMM input element (TE 1, torchao 2).
    ``cp_allgather_kv``: context-parallel attention all-gathers the whole sequence's K and V
    (torch's ring attention with the allgather rotater) and accumulates fp32 gradients.
    ``reserve_fraction``: the caching allocator's reserve as a fraction of what is allocated and
    freed within the step, where this engine has its own measurement (None: the allocator's,
    Constants.ALLOCATOR_RESERVE_FRACTION).
    """

    states: str = "megatron"
    selective: str = "korthikanti"
    dropout: str = "always"
    rope_copies: bool = False
    loss_held: float = 6.0
    loss_peak: float = 6.0
    loss_peak_tp: float = 6.0
    pp_stage_output: float = 0.0
    final_norm_bytes: float = 2.0
    output_input_gathered: bool = False
    pp_recv_buffers: bool = False
    fp8_weight_cache: float = 2.0
    fp8_saved_input_bytes: float = 1.0
    cp_allgather_kv: bool = False
    foreach_optimizer_temp: float = 0.0
    reserve_fraction: float | None = None  # None: Constants.ALLOCATOR_RESERVE_FRACTION
    sources: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for k, ok in (("states", ("megatron", "fsdp2", "deepspeed")), ("selective", ("korthikanti", "op")),
                      ("dropout", ("always", "model", "never"))):
            if getattr(self, k) not in ok:
                raise InputError(f"engine.memory.{k}", getattr(self, k), " or ".join(ok))
        if self.reserve_fraction is not None and not 0 <= self.reserve_fraction < 1:
            raise InputError("engine.memory.reserve_fraction", self.reserve_fraction, "a fraction in [0, 1)")


@dataclass(frozen=True)
class Engine:
    """One training engine: features, sharding modes, pipeline rules and defaults.

    >>> from planner import get_engine
    >>> e = get_engine("deepspeed")
    >>> e.tensor_parallel, e.mode(2).grad_collective
    (False, 'allreduce')
    """

    name: str
    title: str
    describes: str
    # features the engine has
    flash_attention: bool
    sequence_parallel: bool
    sequence_parallel_optional: bool  # False: tensor parallelism always shards norms/dropout over the sequence
    context_parallel: bool
    expert_parallel: bool
    tensor_parallel: bool
    recompute: tuple[str, ...]
    tp_comm_overlap: bool
    async_tp_allreduce: bool
    overlap_grad_reduce: bool
    overlap_param_gather: bool
    sharding: tuple[Sharding, ...]  # indexed by ZeRO stage; stages the engine lacks are absent
    schedules: tuple[str, ...]
    uneven_interleaving: bool  # stages may hold different numbers of layers per virtual chunk
    embedding_in_split: bool  # the embedding and the loss count as layers of the pipeline split
    default_zero: int
    default_recompute: str
    default_schedule: str
    sources: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    memory: MemoryProfile = MemoryProfile()
    padded_interleaving: bool = False  # noop layers pad rank 0's first and the last rank's last chunk (ZB fork)
    moe_a2a_overlap: bool = False  # the expert all-to-all overlapped with another micro-batch's compute
    moe_flex_dispatcher: bool = False  # DeepEP / HybridEP token dispatch (one copy per destination rank and node)
    # context parallelism only on flash/fused attention kernels (Megatron-core: TE's DotProductAttention;
    # its unfused backend and Megatron's local attention refuse cp > 1)
    cp_needs_flash: bool = False
    # the attention kernels the engine can be told to run (ParallelConfig.attention): its default
    # (flash where flash_attention, else unfused) and, where a flag selects it, FlashAttention-2's
    # (Megatron-DeepSpeed --use-flash-attn-v2; SDPA's flash backend) or flash-attn 1.x's
    # (Megatron-DeepSpeed --use-flash-attn-v1). A profile that does not list them gets
    # specs.DEFAULT_ATTENTION_KERNELS (flash, fa2, unfused) where it has flash attention, else unfused.
    attention_kernels: tuple[str, ...] = ()
    # the kernel the engine's flash path runs by default where the GPU has flash attention: "flash"
    # (the generation's best, cuDNN/FA3 on Hopper), "fa2" (PyTorch SDPA's fixed priority puts its
    # FlashAttention-2 backend first: Hugging Face models under DeepSpeed) or "fa1"; one of attention_kernels
    flash_kernel: str = "flash"
    precisions: tuple[str, ...] = ("fp16", "bf16", "fp8")  # the training precisions the engine runs
    # whether its launch files can set an uneven layer split (False: the engine partitions the
    # layers itself, so plans keep its default split; DeepSpeed's PipelineModule partition_method)
    custom_split: bool = True
    cuda_graphs: bool = False  # CUDA-graph capture of layers or of the whole step (--cuda-graph-impl)
    mtp: bool = False  # multi-token prediction modules on the last pipeline stage (--mtp-num-layers)
    # the interleaved schedule's send/recv posted asynchronously and waited only before the chunk
    # that needs it, so it runs under other chunks' compute (Megatron-LM overlap_p2p_comm)
    overlap_p2p_comm: bool = False
    # sequence-parallel collectives on the sequence dimension (dim 1 of [b, s, h]) through torch's
    # functional collectives: NCCL gathers and scatters along dim 0, so a copy re-lays each
    # gathered output (b > 1) and each scattered input (DTensor Shard(1), torchtitan's TP plans)
    tp_sequence_dim_copies: bool = False
    # whether a plan that leaves the TP overlap unset gets it (None: whenever the engine has it)
    tp_comm_overlap_default: bool | None = None
    # FP8: the recipes the engine runs (specs.FP8_RECIPES), the one "auto" means, and whose casts
    # it runs: "te" (Transformer Engine's fused cast-transpose kernels, FP8 weight copies cached for
    # the step) or "torchao" (torchao Float8Linear: a dynamic cast of each GEMM operand, the bf16
    # input saved and cast again in backward).
    fp8_recipes: tuple[str, ...] = ("delayed",)
    fp8_default: str = "delayed"
    fp8_casts: str = "te"
    # FP8 primary weights, gathered in FP8 (Job.fp8_param_gather): the recipes that can, and whether
    # the planner's launch files turn it on when the job leaves it unset.
    fp8_gather_recipes: tuple[str, ...] = ()
    fp8_gather_default: bool = False
    # The loss's cross-entropy (Job.cross_entropy): (name, forward bytes, backward bytes) per logit
    # element its kernels move, for each way the engine runs it (the profile's ``loss`` block, each
    # value counted from the engine's code there), and the one it runs unless told.
    loss_kernels: tuple[tuple[str, float, float], ...] = (("unfused", 38.0, 14.0),)
    loss_default: str = "unfused"
    # where an implementation runs differently on vocabulary-sharded logits (tp > 1): its bytes there
    loss_tp_kernels: tuple[tuple[str, float, float], ...] = ()
    # where it runs differently on fp16 logits (precision fp16): its bytes there (ahead of the tp ones)
    loss_fp16_kernels: tuple[tuple[str, float, float], ...] = ()
    # implementations the engine's code has but its argument checks refuse to launch: (name, why)
    loss_launch_refused: tuple[tuple[str, str], ...] = ()

    def launch_loss(self, cross_entropy: str = "auto", field: str = "job.cross_entropy") -> str:
        """``loss_name`` for a job the engine is to launch: InputError (naming ``field``) as well for an
        implementation the engine's own argument checks refuse (the profile's ``loss.launch_refuses``)."""
        name = self.loss_name(cross_entropy)
        for n, why in self.loss_launch_refused:
            if n == name:
                ok = " or ".join(k for k, _, _ in self.loss_kernels if k not in dict(self.loss_launch_refused))
                raise InputError(field, cross_entropy, f"auto or {ok} for {self.name} launches ({why})")
        return name

    def has_loss(self, cross_entropy: str) -> bool:
        """Whether the engine runs ``cross_entropy`` ("auto": always; its default)."""
        return cross_entropy == "auto" or cross_entropy in {n for n, _, _ in self.loss_kernels}

    def loss_name(self, cross_entropy: str = "auto") -> str:
        """The cross-entropy implementation the engine runs for ``cross_entropy`` ("auto": its
        default); InputError when it has no such implementation."""
        name = self.loss_default if cross_entropy == "auto" else cross_entropy
        names = [n for n, _, _ in self.loss_kernels]
        if name not in names:
            raise InputError("job.cross_entropy", cross_entropy, f"auto or {' or '.join(names)} on {self.name} (the cross entropies its code has)")
        return name

    def loss_bytes(self, cross_entropy: str = "auto", tp: int = 1, precision: str = "bf16") -> tuple[float, float]:
        """(forward, backward) bytes per logit element of the loss as the engine runs ``cross_entropy``
        with tensor-parallel degree ``tp`` on ``precision`` logits; InputError when it has no such
        implementation."""
        name = self.loss_name(cross_entropy)
        fp16 = self.loss_fp16_kernels if precision == "fp16" else ()
        for n, f, b in fp16 + (self.loss_tp_kernels if tp > 1 else ()) + self.loss_kernels:
            if n == name:
                return f, b
        raise AssertionError(name)  # loss_name checked it

    @property
    def zero_stages(self) -> tuple[int, ...]:
        return tuple(s.zero for s in self.sharding)

    @property
    def max_zero_with_pp(self) -> int:
        """The highest ZeRO stage the engine runs together with pipeline parallelism."""
        return max((s.zero for s in self.sharding if s.with_pp), default=0)

    def mode(self, zero: int, pp: int = 1) -> Sharding:
        """The engine's implementation of ZeRO stage ``zero`` with ``pp`` pipeline stages
        (InputError when it has none)."""
        for s in self.sharding:
            if s.zero == zero:
                return s.pp if (pp > 1 and s.pp is not None) else s
        raise InputError("parallel.zero", zero, f"a sharding stage {self.name} implements ({', '.join(map(str, self.zero_stages))})")

    def as_dict(self) -> dict:
        return {"name": self.name, "title": self.title, "describes": self.describes}


def engine_names() -> tuple[str, ...]:
    folder = resources.files("planner.engines") / "profiles"
    return tuple(sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml")))


ENGINE_NAMES = engine_names()

_BOOL = ("flash_attention", "sequence_parallel", "sequence_parallel_optional", "context_parallel", "expert_parallel",
         "tensor_parallel", "tp_comm_overlap", "async_tp_allreduce", "overlap_grad_reduce", "overlap_param_gather",
         "uneven_interleaving", "embedding_in_split")


def _from_dict(d: dict, where: str) -> Engine:
    feats = d.get("features") or {}
    for k in _BOOL:
        if not isinstance(feats.get(k), bool):
            raise InputError(f"{where}.features.{k}", feats.get(k), "true or false")
    def sharding(z: int, s: dict, base: dict | None = None) -> Sharding:
        s = {**(base or {}), **s}
        pp = s.get("pp")
        return Sharding(zero=z, name=str(s["name"]), grad_sync=s["grad_sync"], param_gather=s["param_gather"],
                        reshard_after_forward=bool(s.get("reshard_after_forward", True)), with_pp=bool(s.get("with_pp", True)),
                        source=str(s.get("source", "")), grad_collective=str(s.get("grad_collective", "reducescatter")),
                        overlap_grad_reduce=s.get("overlap_grad_reduce"),
                        pp=sharding(z, pp, {k: v for k, v in s.items() if k != "pp"}) if isinstance(pp, dict) else None)

    if feats.get("precisions") is not None and not feats["precisions"]:
        raise InputError(f"{where}.features.precisions", [], "at least one of fp16, bf16, fp8 (or leave it out: all three)")
    for prec in feats.get("precisions") or ():
        if prec not in ("fp16", "bf16", "fp8"):
            raise InputError(f"{where}.features.precisions", prec, "fp16, bf16 or fp8")
    shard = [sharding(int(z), s) for z, s in sorted((d.get("sharding") or {}).items())]
    pipe = d.get("pipeline") or {}
    scheds = tuple(pipe.get("schedules") or ("1f1b",))
    for s in scheds:
        if s not in SCHEDULES:
            raise InputError(f"{where}.pipeline.schedules", s, "one of " + ", ".join(SCHEDULES))
    dflt = d.get("defaults") or {}
    return Engine(
        name=str(d["name"]), title=str(d["title"]), describes=str(d.get("describes", "")),
        **{k: feats[k] for k in _BOOL if k not in ("uneven_interleaving", "embedding_in_split")},
        recompute=tuple(feats.get("recompute") or ("none", "full")),
        sharding=tuple(shard), schedules=scheds,
        uneven_interleaving=feats["uneven_interleaving"], embedding_in_split=feats["embedding_in_split"],
        default_zero=int(dflt.get("zero", 0)), default_recompute=str(dflt.get("recompute", "none")),
        default_schedule=str(dflt.get("schedule", "1f1b")),
        sources=tuple(d.get("sources") or ()), notes=tuple(d.get("notes") or ()),
        memory=_memory(d.get("memory") or {}, where), padded_interleaving=bool(feats.get("padded_interleaving", False)),
        moe_a2a_overlap=bool(feats.get("moe_a2a_overlap", False)),
        moe_flex_dispatcher=bool(feats.get("moe_flex_dispatcher", False)),
        cuda_graphs=bool(feats.get("cuda_graphs", False)),
        cp_needs_flash=bool(feats.get("cp_needs_flash", False)),
        attention_kernels=_attention_kernels(feats, where),
        flash_kernel=_flash_kernel(feats, where, _attention_kernels(feats, where)),
        custom_split=bool(feats.get("custom_split", True)),
        precisions=tuple(feats["precisions"]) if feats.get("precisions") is not None else ("fp16", "bf16", "fp8"),
        mtp=bool(feats.get("mtp", False)),
        overlap_p2p_comm=bool(feats.get("overlap_p2p_comm", False)),
        tp_sequence_dim_copies=bool(feats.get("tp_sequence_dim_copies", False)),
        tp_comm_overlap_default=feats.get("tp_comm_overlap_default"),
        **_fp8(d.get("fp8") or {}, where),
        **_loss(d.get("loss"), where),
    )


def _attention_kernels(feats: dict, where: str) -> tuple[str, ...]:
    """``features.attention_kernels`` (default: flash, FlashAttention-2 and unfused where the engine
    has flash attention, only unfused where it does not; flash-attn 1.x only where listed)."""
    kinds = feats.get("attention_kernels")
    if kinds is None:
        return DEFAULT_ATTENTION_KERNELS if feats["flash_attention"] else ("unfused",)
    for k in kinds:
        if k not in ATTENTION_KINDS:
            raise InputError(f"{where}.features.attention_kernels", k, "one of " + ", ".join(ATTENTION_KINDS))
    return tuple(kinds)


def _flash_kernel(feats: dict, where: str, kernels: tuple[str, ...]) -> str:
    """``features.flash_kernel``: flash (default), fa2 or fa1, one the profile's attention_kernels
    list (where it has flash attention)."""
    k = feats.get("flash_kernel", "flash")
    if k not in FLASH_KINDS:
        raise InputError(f"{where}.features.flash_kernel", k, " or ".join(FLASH_KINDS))
    if feats.get("flash_attention") and k not in kernels:
        raise InputError(f"{where}.features.flash_kernel", k, "one of its attention_kernels (" + ", ".join(kernels) + ")")
    return k


def _loss(block: dict | None, where: str) -> dict:
    """The profile's ``loss`` block: ``kernels`` {name: [forward, backward] bytes per logit}, ``default``,
    ``launch_refuses`` {name: the engine's reason}."""
    from planner.specs import CROSS_ENTROPY  # noqa: PLC0415

    if not isinstance(block, dict) or not isinstance(block.get("kernels"), dict) or not block["kernels"]:
        raise InputError(f"{where}.loss.kernels", None if not isinstance(block, dict) else block.get("kernels"),
                         "a map of cross-entropy implementations to [forward, backward] bytes per logit element")
    def pairs(key: str, names) -> tuple:
        out = []
        for name, fb in (block.get(key) or {}).items():
            if name not in names:
                raise InputError(f"{where}.loss.{key}", name, "one of " + ", ".join(names))
            if not (isinstance(fb, list) and len(fb) == 2 and all(isinstance(x, (int, float)) and x >= 0 for x in fb)):
                raise InputError(f"{where}.loss.{key}.{name}", fb, "[forward, backward] bytes per logit element (>= 0)")
            out.append((str(name), float(fb[0]), float(fb[1])))
        return tuple(out)

    kernels = pairs("kernels", [x for x in CROSS_ENTROPY if x != "auto"])
    names = [k[0] for k in kernels]
    default = str(block.get("default", names[0]))
    if default not in names:
        raise InputError(f"{where}.loss.default", default, "one of the profile's loss.kernels")
    refused = block.get("launch_refuses") or {}
    if not isinstance(refused, dict) or any(n not in names or not isinstance(w, str) for n, w in refused.items()):
        raise InputError(f"{where}.loss.launch_refuses", refused, "a map of the profile's loss.kernels names to the engine's reason")
    if default in refused:
        raise InputError(f"{where}.loss.default", default, "an implementation the engine launches (not in loss.launch_refuses)")
    return {"loss_kernels": kernels, "loss_default": default, "loss_tp_kernels": pairs("tp_kernels", names),
            "loss_fp16_kernels": pairs("fp16_kernels", names),
            "loss_launch_refused": tuple((str(n), w) for n, w in refused.items())}


def _fp8(f: dict, where: str) -> dict:
    """The profile's ``fp8`` block: ``recipes``, ``default``, ``casts``."""
    from planner.specs import FP8_RECIPES  # noqa: PLC0415

    recipes = tuple(f.get("recipes") or ("delayed",))
    for r in recipes:
        if r not in FP8_RECIPES or r == "auto":
            raise InputError(f"{where}.fp8.recipes", r, "one of " + ", ".join(x for x in FP8_RECIPES if x != "auto"))
    default = str(f.get("default", recipes[0]))
    if default not in recipes:
        raise InputError(f"{where}.fp8.default", default, "one of the profile's fp8.recipes")
    casts = str(f.get("casts", "te"))
    if casts not in ("te", "torchao"):
        raise InputError(f"{where}.fp8.casts", casts, "te or torchao")
    gather = tuple(f.get("param_gather") or ())
    for r in gather:
        if r not in recipes:
            raise InputError(f"{where}.fp8.param_gather", r, "one of the profile's fp8.recipes")
    return {"fp8_recipes": recipes, "fp8_default": default, "fp8_casts": casts, "fp8_gather_recipes": gather,
            "fp8_gather_default": bool(f.get("param_gather_default", False))}


def _memory(m: dict, where: str) -> MemoryProfile:
    names = MemoryProfile.__dataclass_fields__
    bad = sorted(set(m) - set(names))
    if bad:
        raise InputError(f"{where}.memory.{bad[0]}", m[bad[0]], "a memory field (" + ", ".join(names) + ")")
    return MemoryProfile(**{k: (tuple(v) if k == "sources" else v) for k, v in m.items()})


@lru_cache(maxsize=None)
def _load(name: str) -> Engine:
    path = resources.files("planner.engines") / "profiles" / f"{name}.yaml"
    return _from_dict(yaml.safe_load(path.read_text()), f"engine[{name}]")


# ``--engine auto``: the search runs on each engine a team would launch today and ranks the plans
# of all of them (each plan names its engine). megatron-legacy (2020-21) and megatron-deepspeed
# describe published runs; megatron-zb is a research fork: they are searched only when named.
AUTO = "auto"
AUTO_ENGINES = ("megatron-core", "torchtitan", "deepspeed")


def get_engine(engine: "str | Engine | None" = None) -> Engine:
    """The profile named ``engine`` (``None``: :data:`DEFAULT_ENGINE`); an Engine passes through.

    >>> get_engine().name, get_engine("torchtitan").schedules[:2]
    ('megatron-core', ('1f1b', 'interleaved'))
    """
    if isinstance(engine, Engine):
        return engine
    name = DEFAULT_ENGINE if engine is None else str(engine).lower()
    if name not in ENGINE_NAMES:
        hint = "" if name == AUTO else suggest(name, ENGINE_NAMES)
        also = " (auto: plan only)" if name == AUTO else f", or {AUTO} (plan only: every engine ranked together)"
        raise InputError("engine", engine, f"one of {', '.join(ENGINE_NAMES)}{also}" + (f" ({hint})" if hint else ""), flag="--engine")
    return _load(name)
