"""Engine policy: the engine's default for every unset field, and the layouts it refuses.

:func:`resolve` is the one place where a partly given :class:`planner.specs.ParallelConfig`
becomes the configuration an engine runs: ``estimate``, ``plan``, ``validate``, ``hetero``,
``sweep``, calibration and the CLI all go through it, so the same configuration gets the same
answer from every door. :func:`check_engine` raises the engine's own reason for a layout it
does not run (one line: field, value, what the engine accepts).

>>> from planner.engines import get_engine, resolve
>>> from planner.specs import Job, ParallelConfig
>>> from planner.io.loaders import load_model, make_cluster
>>> par, filled = resolve(ParallelConfig(tp=8, pp=4, dp=2), load_model("llama3.1-70b"),
...                       make_cluster("h100-sxm5-80gb", 64), Job(8192, 256), get_engine("megatron-core"))
>>> par.sequence_parallel, par.zero, par.attention, "sequence_parallel" in filled
(True, 1, 'flash', True)
"""

from __future__ import annotations

from dataclasses import replace

from planner.engines.profile import Engine, has_dropout
from planner.errors import InputError
from planner.specs import ENGINE_FIELDS, ClusterSpec, GpuSpec, Job, ModelSpec, ParallelConfig, is_flash

__all__ = ["supports_flash", "flash_kernel_why", "dp_overlap_why", "resolve", "engine_flags", "check_engine", "default_split", "interleaving_ok", "least_layers", "default_etp",
           "a2a_overlap_runs", "a2a_overlap_why", "flex_dispatcher_why", "cuda_graph_why"]


def supports_flash(gpu: GpuSpec) -> bool:
    """FlashAttention-2 needs Ampere or newer on NVIDIA (not V100); AMD CDNA3 (MI300X) runs it
    through Composable Kernel (ROCm/flash-attention)."""
    return gpu.id.startswith("mi") or gpu.peak("bf16") / 1e12 >= 200


def flash_kernel_why(kernel: str | None, gpu: GpuSpec) -> str | None:
    """Why ``gpu`` cannot run the attention kernel ``kernel`` (None: it can, or it is not flash).
    FlashAttention 1 (flash-attn 1.0.x, the last before FlashAttention-2) builds CUDA kernels for
    sm75, sm80 and sm90 only (Dao-AILab/flash-attention setup.py at 9af165c3, June 2023: "Turing,
    Ampere, Ada, or Hopper GPUs"): none for Blackwell (sm100, no PTX to JIT) or AMD GPUs (ROCm's
    flash-attention is FlashAttention-2)."""
    if not is_flash(kernel):
        return None
    if not supports_flash(gpu):
        return f"unfused on {gpu.id} (no flash-attention kernel: FlashAttention needs Ampere or newer)"
    if kernel == "fa1" and (gpu.id.startswith("mi") or gpu.mx_formats):
        return (f"fa2 or unfused on {gpu.id} (FlashAttention 1 builds for Turing to Hopper only, sm75-sm90; "
                "none for Blackwell or AMD GPUs)")
    return None


def _even(layers: int, pp: int) -> tuple[int, ...]:
    """As even as possible, the extra layers on the last stages."""
    base, rem = divmod(layers, pp)
    return tuple(base + (1 if i >= pp - rem else 0) for i in range(pp))


def default_split(model: ModelSpec, pp: int, vpp: int, engine: Engine) -> tuple[int, ...]:
    """The engine's split of the transformer layers over ``pp`` stages with ``vpp`` chunks each.

    * ``vpp`` dividing the layers: whole chunks spread as evenly as possible (each stage holds a
      multiple of ``vpp`` layers, one equal share per virtual stage).
    * Otherwise, where the engine counts the embedding and the loss as layers of the split
      (Megatron ``--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split``):
      ``L + 2`` slots spread evenly, the first stage giving one slot to the embedding and the last
      one to the loss (Llama 3.1 405B: 126 layers on pp 8 x vpp 8 = 15, 16 x 6, 15).
    * Otherwise an even split of the layers (chunks then differ by one layer, which engines
      with uneven interleaving express as a layout).
    """
    L = model.layers
    if pp <= 1:
        return (L,)
    if vpp > 1 and L % vpp == 0 and L // vpp >= pp:
        return tuple(vpp * n for n in _even(L // vpp, pp))
    if vpp > 1 and engine.embedding_in_split and (L + 2) % (pp * vpp) == 0:
        per = (L + 2) // pp
        return tuple(per - (1 if i in (0, pp - 1) else 0) for i in range(pp)) if pp > 1 else (L,)
    return _even(L, pp)


def least_layers(stage: int, pp: int, vpp: int, engine: Engine) -> int:
    """The fewest transformer layers stage ``stage`` may hold with ``vpp`` chunks: one a chunk;
    where the engine counts the embedding and the loss in the split, the first and the last
    rank's outer chunk may hold only the embedding / only the loss (Megatron's layout allows
    empty transformer stages: transformer_block.get_num_layers_to_build)."""
    if vpp > 1 and engine.uneven_interleaving and engine.embedding_in_split and stage in (0, pp - 1):
        return vpp - 1
    return vpp


def interleaving_ok(lps: tuple[int, ...], vpp: int, engine: Engine) -> bool:
    """Every stage can hold ``vpp`` model chunks (:func:`least_layers` each), and equal chunks
    unless the engine takes uneven ones (a pipeline layout)."""
    if vpp <= 1:
        return True
    if engine.uneven_interleaving:
        return all(n >= least_layers(i, len(lps), vpp, engine) for i, n in enumerate(lps))
    if engine.padded_interleaving:  # one noop layer may pad the first and the last rank's outer chunk
        ends = (lps[0], lps[-1])
        return all(n % vpp in (0, vpp - 1) and n >= vpp - 1 for n in ends) and all(n % vpp == 0 and n >= vpp for n in lps[1:-1])
    return all(n % vpp == 0 and n >= vpp for n in lps)


def attention_kernel(engine: Engine, gpu: GpuSpec, given: str | None = None) -> str:
    """The attention kernel: ``given`` (the user's), else the engine's flash kernel (Engine.flash_kernel)
    where the engine and the GPU have flash attention, else unfused."""
    return given or (engine.flash_kernel if engine.flash_attention and supports_flash(gpu) else "unfused")


def cp_attention_why(engine: Engine, attention: str | None, gpu: GpuSpec | None = None) -> str | None:
    """Why context parallelism cannot run with this attention kernel on ``engine`` (None: it can);
    ``gpu``: named where it has no flash kernel (the reason the attention is unfused)."""
    if engine.cp_needs_flash and not is_flash(attention):
        return ("with unfused attention (its context parallelism runs on flash/fused attention kernels only"
                + (f"; {gpu.id} has no flash-attention kernel)" if gpu is not None and not supports_flash(gpu) else ")"))
    return None


def tp_overlap_why(engine: Engine, tp: int, sp: bool, nvlink_domain: int) -> str | None:
    """Why the TP communication overlap cannot run for tensor degree ``tp`` (None: it can).
    Transformer Engine's userbuffers (Megatron-core --tp-comm-overlap) and torch's symmetric
    memory (torchtitan's async TP) exchange through NVLink peer memory (TE initialize_ub lays the
    buffers out per "TP domain"), and both pipeline sequence-parallel all-gathers/reduce-scatters."""
    if not engine.tp_comm_overlap:
        return f"{engine.name} has no TP communication overlap"
    if tp <= 1 or not sp:
        return "it pipelines the sequence-parallel all-gathers and reduce-scatters: tensor and sequence parallelism"
    if tp > nvlink_domain:
        return (f"tensor parallelism {tp} is wider than the NVLink domain ({nvlink_domain} GPUs) and its buffers live in "
                "NVLink peer memory")
    return None


def engine_flags(engine: Engine, gpu: GpuSpec, tp: int, zero: int, given: dict | None, pp: int,
                 nvlink_domain: int) -> dict:
    """The engine-decided fields for tensor degree ``tp`` and ZeRO stage ``zero``: sequence
    parallelism, attention kernel, the TP and data-parallel overlaps. ``given`` holds values the
    user set (kept as they are, except sequence parallelism without tensor parallelism, which is
    off: Megatron-LM's validate_args turns it off, arguments.py "Disabling sequence parallelism
    because tensor model parallelism is disabled"; the others follow from them).
    ``nvlink_domain``: the GPUs one scale-up domain holds (ClusterSpec.nvlink_domain): the TP
    communication overlap is on by default only where it can run (:func:`tp_overlap_why`)."""
    g = {k: v for k, v in (given or {}).items() if v is not None}
    sp = bool(g.get("sequence_parallel", engine.sequence_parallel) and tp > 1)
    out = {"sequence_parallel": sp,
           "attention": attention_kernel(engine, gpu, g.get("attention")),
           "tp_comm_overlap": g.get("tp_comm_overlap", tp_overlap_why(engine, tp, sp, nvlink_domain) is None
                                    and engine.tp_comm_overlap_default is not False),
           "async_tp_allreduce": g.get("async_tp_allreduce", engine.async_tp_allreduce),
           "overlap_grad_reduce": g.get("overlap_grad_reduce", engine.overlap_grad_reduce)}
    if "overlap_grad_reduce" not in g and zero in engine.zero_stages and engine.mode(zero, pp).overlap_grad_reduce is False:
        out["overlap_grad_reduce"] = False  # the mode reduces after the backward (e.g. DeepSpeed without ZeRO)
    gathers_once = zero >= 1 and zero in engine.zero_stages and engine.mode(zero, pp).param_gather == "step"
    out["overlap_param_gather"] = g.get("overlap_param_gather", bool(engine.overlap_param_gather and gathers_once and out["overlap_grad_reduce"]))
    return out


def fp8_recipe(engine: Engine, job: Job) -> str:
    """The FP8 scaling recipe ``engine`` runs for ``job`` ("" for a 16-bit job): the job's, or the
    engine's default for "auto"; InputError when the engine does not run it."""
    if job.precision != "fp8":
        return ""
    r = engine.fp8_default if job.fp8_recipe == "auto" else job.fp8_recipe
    if r not in engine.fp8_recipes:
        raise InputError("job.fp8_recipe", job.fp8_recipe, f"auto or one of {', '.join(engine.fp8_recipes)} on {engine.name}")
    return r


def resolve_job(job: Job, engine: Engine) -> Job:
    """``job`` with its FP8 recipe made concrete for ``engine`` (checked; a 16-bit job unchanged)."""
    r = fp8_recipe(engine, job)
    if job.fp8_param_gather and r not in engine.fp8_gather_recipes:
        can = f"recipes {', '.join(engine.fp8_gather_recipes)}" if engine.fp8_gather_recipes else "no recipe"
        raise InputError("job.fp8_param_gather", True, f"false or unset with {r or job.precision} on {engine.name} "
                         f"(FP8 weight all-gathers: {can})")
    if job.fp8_tp_gather and not (engine.fp8_casts == "torchao" and r == "tensorwise"):
        raise InputError("job.fp8_tp_gather", True, f"false or unset with {r or job.precision} on {engine.name} (FP8 tensor-parallel "
                         "all-gathers are torchao's Float8 TP styles, tensor-wise recipe only: torchao float8_tensor_parallel.py)")
    ce = engine.loss_name(job.cross_entropy)  # InputError for a cross entropy the engine does not run
    changes = {k: v for k, v in (("fp8_recipe", r), ("cross_entropy", ce)) if v and v != getattr(job, k)}
    return replace(job, **changes) if changes else job


def fp8_casts(engine: Engine, job: Job, zero: int) -> str:
    """How the FP8 casts of ``job`` run on ``engine`` with ZeRO stage ``zero``, as the cost model
    prices them (planner.cost.fp8): "" in 16-bit, "te" (Transformer Engine, any recipe), or
    "torchao-<recipe>", with "+fsdp8" where the weights arrive in FP8 from the FSDP all-gather and
    "+tp8" where tensor parallelism all-gathers the activations in FP8 (``Job.fp8_tp_gather``)."""
    r = fp8_recipe(engine, job)
    if not r:
        return ""
    if engine.fp8_casts == "te":
        return "te"
    return (f"torchao-{r}" + ("+fsdp8" if fp8_gathers(engine, job, zero) else "")
            + ("+tp8" if job.fp8_tp_gather and r == "tensorwise" else ""))


def fp8_gathers(engine: Engine, job: Job, zero: int) -> bool:
    """Whether ``job`` holds FP8 primary weights and all-gathers them in FP8 on ``engine`` with
    ZeRO stage ``zero`` (``Job.fp8_param_gather``, or the engine's launch default where unset):
    torchao tensor-wise with enable_fsdp_float8_all_gather (torchtitan's FSDP, on by default),
    Megatron's --fp8-param-gather (off by default). Only a sharded optimizer or FSDP gathers the
    weights (ZeRO >= 1; Megatron arguments.py: "only supported with distributed optimizer, torch
    fsdp2, megatron fsdp"); torchtitan has no ZeRO 1."""
    if zero < 1 or fp8_recipe(engine, job) not in engine.fp8_gather_recipes:
        return False
    return engine.fp8_gather_default if job.fp8_param_gather is None else job.fp8_param_gather


def fp8_gather_bytes(engine: Engine, job: Job, zero: int) -> tuple[float, float]:
    """Bytes per parameter a weight all-gather moves and a gathered layer holds: (the layers'
    linear weights, their routed experts), beside 2 B for the embedding and output layer. 2 and 2
    in 16-bit; with FP8 gathers (:func:`fp8_gathers`) the linear weights at 1 B, and the experts
    too under Transformer Engine (fp8_model_init makes TE's grouped experts FP8; torchao's
    grouped experts are not Float8Linear modules and stay 16-bit)."""
    if not fp8_gathers(engine, job, zero):
        return 2.0, 2.0
    return 1.0, (1.0 if engine.fp8_casts == "te" else 2.0)


def mtp_rule(engine: Engine, model: ModelSpec) -> None:
    """Multi-token prediction as the planner prices it: Megatron-core's MTP block, which its
    arguments refuse beside learned absolute position embeddings (megatron/training/arguments.py,
    "MTP validation": rope or none only)."""
    if not model.mtp_layers:
        return
    if not engine.mtp:
        raise InputError("model.mtp_layers", model.mtp_layers, f"0 on {engine.name} (the planner prices multi-token prediction on megatron-core only)")
    if model.position_embedding == "learned":
        raise InputError("model.mtp_layers", model.mtp_layers, "0 with learned position embeddings (Megatron-core runs MTP with rope only)")


def a2a_overlap_runs(engine: Engine, model: ModelSpec, par: ParallelConfig) -> str | None:
    """Why ``engine`` cannot overlap the expert all-to-all of ``par`` (None when it can):
    Megatron-core's combined 1F1B (``--overlap-moe-expert-parallel-comm``) needs an MoE model,
    expert parallelism, no full recompute and, with a pipeline, the interleaved schedule
    (megatron/core/transformer/transformer_config.py, the overlap_moe_expert_parallel_comm asserts)."""
    return a2a_overlap_why(engine, model, par.ep, par.recompute, par.pp, par.vpp or 1, par.schedule)


def a2a_overlap_why(engine: Engine, model: ModelSpec, ep: int, recompute: str | None, pp: int, vpp: int, schedule: str | None,
                    *, zero: int = 0, graph: str | None = None) -> str | None:
    """:func:`a2a_overlap_runs` from the degrees alone (the search's form). With ``zero`` and
    ``graph`` (the engine's default for the overlap: resolve and the search): not beside a layer
    CUDA graph under Megatron-FSDP (mcore_fsdp_adapter.py; :func:`cuda_graph_why` refuses the
    pair when both are fixed)."""
    if not engine.moe_a2a_overlap:
        return f"{engine.name} has no expert all-to-all overlap"
    if model.moe is None or model.moe_layers == 0:
        return "an MoE model"
    if ep <= 1:
        return "expert parallelism (ep > 1)"
    if recompute == "full":
        return "no full recompute"
    if pp > 1 and not (vpp > 1 and schedule == "interleaved"):
        return "the interleaved schedule (vpp > 1) with pipeline parallelism"
    if model.mtp_layers > 1:
        return "at most one multi-token prediction layer (transformer_config.py)"
    if graph == "layer" and zero >= 2:
        return "no layer CUDA graph under Megatron-FSDP (ZeRO >= 2)"
    return None


def flex_dispatcher_why(engine: Engine, model: ModelSpec, dispatcher: str | None, ep: int | None = None,
                        etp: int | None = None) -> str | None:
    """Why ``engine`` cannot run the MoE token ``dispatcher`` (None when it can, or when it is the
    all-to-all): Megatron-core's flex dispatcher with DeepEP / HybridEP needs an MoE model, and
    DeepEP expert tp x ep > 1 (token_dispatcher.py MoEFlexTokenDispatcher). The degrees, when
    None, are not checked (the search's check of fixed fields)."""
    if dispatcher not in ("deepep", "hybridep"):
        return None
    if not engine.moe_flex_dispatcher:
        return f"on {engine.name} (it has no DeepEP/HybridEP dispatcher)"
    if model.moe is None or model.moe_layers == 0:
        return "for a model without MoE layers"
    if dispatcher == "deepep" and ep is not None and etp is not None and ep * etp <= 1:
        return "with expert tp x ep = 1 (DeepEP needs TP x EP > 1: token_dispatcher.py)"
    return None


def cuda_graph_why(engine: Engine, model: ModelSpec, graph: str | None, recompute: str | None = None,
                   zero: int | None = None, a2a_overlap: bool | None = None) -> str | None:
    """Why ``engine`` cannot capture ``graph`` CUDA graphs (None when it can, or for none); the
    fields left None are not checked. Megatron-core's TransformerConfig checks (cuda_graph_impl):
    full recompute only in the full-iteration graph; a whole-layer or full-iteration graph holding
    the recomputed core attention refuses attention dropout (the planner's selective recompute is
    core attention; the engine's dropout rule, Engine.memory.dropout). The planner's own rule, not
    a TransformerConfig check: no whole-layer graph of dropless MoE layers, whose dispatcher copies
    the token counts to the host each layer (a capacity factor makes them static). Full-iteration
    graphs of dropless MoE run in Megatron-Bridge with capacity padding and paged stashing: priced
    without them, and the planner's Megatron launch files refuse to write them. Megatron-FSDP
    (ZeRO >= 2) refuses layer graphs with the expert all-to-all overlap (mcore_fsdp_adapter.py)."""
    if graph in (None, "none"):
        return None
    if not engine.cuda_graphs:
        return f"on {engine.name} (the planner prices CUDA graphs on megatron-core only)"
    if graph == "layer" and recompute == "full":
        return "with full recompute (Megatron-core captures full recompute only in a full-iteration graph)"
    if recompute == "selective" and has_dropout(model, engine.memory.dropout):
        return "with selective recompute of a model trained with dropout (Megatron-core refuses attention dropout in a graphed recomputed core attention)"
    if graph == "layer" and model.moe is not None and model.moe_layers > 0 and model.moe.capacity_factor is None:
        return "for dropless MoE layers (their token counts go to the host each layer; a layer graph needs moe.capacity_factor)"
    if graph == "layer" and zero is not None and zero >= 2 and a2a_overlap:
        return "with Megatron-FSDP (ZeRO >= 2) and the expert all-to-all overlap (mcore_fsdp_adapter.py refuses them together)"
    return None


def default_etp(tp: int, dp: int, cp: int, ep: int) -> int:
    """Expert tensor parallelism: Megatron-core's default is tp; an expert-parallel group larger
    than dp x cp is only possible with ``--expert-tensor-parallel-size 1`` (the expert grid
    etp x ep x edp x pp tiles the world: megatron/core/parallel_state.py)."""
    return tp if (dp * cp) % ep == 0 else 1


def resolve(par: ParallelConfig, model: ModelSpec, cluster: ClusterSpec, job: Job, engine: Engine) -> tuple[ParallelConfig, tuple[str, ...]]:
    """The configuration ``engine`` runs for ``par``: every ``None`` field set to the engine's
    default (the setting the planner's launch files for that engine use), and the names of the
    fields it filled. A field the user set is never changed.

    >>> import planner
    >>> m, c, j = planner.load_model("llama3.1-8b"), planner.make_cluster("h100-sxm5-80gb", 8), planner.Job(8192, 64)
    >>> par, filled = planner.resolve(planner.ParallelConfig(tp=2), m, c, j, planner.get_engine("torchtitan"))
    >>> par.dp, par.zero, par.recompute, "zero" in filled
    (4, 3, 'selective', True)
    """
    ch: dict = {}
    if par.dp is None:
        n, mp = cluster.num_gpus, par.tp * par.pp * par.cp
        for name, deg in (("tp", par.tp), ("pp", par.pp), ("cp", par.cp)):
            if n % deg:
                raise InputError(f"parallel.{name}", deg, f"a divisor of the GPU count ({n})")
        if n % mp:
            raise InputError("parallel", f"tp*pp*cp = {par.tp}*{par.pp}*{par.cp} = {mp}", f"a divisor of the GPU count ({n})")
        ch["dp"] = n // mp
    if par.vpp is None:
        ch["vpp"] = 1
    vpp = ch.get("vpp", par.vpp)
    if par.schedule is None:
        ch["schedule"] = "interleaved" if vpp > 1 else engine.default_schedule
    if par.recompute is None:
        ch["recompute"] = engine.default_recompute
    zero = par.zero
    if zero is None:
        zero = engine.default_zero
        if par.pp > 1 and zero > engine.max_zero_with_pp:
            zero = engine.max_zero_with_pp
        ch["zero"] = zero
    if par.etp is None:
        ch["etp"] = default_etp(par.tp, ch.get("dp", par.dp), par.cp, par.ep)
    flags = engine_flags(engine, cluster.gpu, par.tp, zero, {k: getattr(par, k) for k in _FLAG_FIELDS}, par.pp, cluster.nvlink_domain)
    # the fields left unset, and the one engine_flags overrules (sequence parallelism at tp 1)
    ch.update({k: v for k, v in flags.items() if getattr(par, k) != v})
    out = replace(par, **ch) if ch else par
    if par.moe_a2a_overlap is None:
        ch["moe_a2a_overlap"] = a2a_overlap_why(engine, model, out.ep, out.recompute, out.pp, out.vpp or 1, out.schedule,
                                                zero=out.zero, graph=par.cuda_graph) is None
        out = replace(out, moe_a2a_overlap=ch["moe_a2a_overlap"])
    if par.moe_dispatcher is None:
        ch["moe_dispatcher"] = "alltoall"  # what the planner's launch files set (--moe-token-dispatcher-type alltoall)
        out = replace(out, moe_dispatcher="alltoall")
    if par.cuda_graph is None:
        ch["cuda_graph"] = "none"  # eager launches: every engine's default (Megatron-core --cuda-graph-impl none)
        out = replace(out, cuda_graph="none")
    return out, tuple(k for k in ("dp",) + ENGINE_FIELDS if k in ch)


_FLAG_FIELDS = ("sequence_parallel", "attention", "tp_comm_overlap", "async_tp_allreduce", "overlap_grad_reduce", "overlap_param_gather")


def precision_rule(job: Job, engine: Engine) -> None:
    """InputError when ``engine`` does not train in ``job.precision`` (torchtitan: no fp16)."""
    if job.precision not in engine.precisions:
        raise InputError("job.precision", job.precision, f"{' or '.join(engine.precisions)} on {engine.name}")


def dp_overlap_why(engine: Engine, field: str, zero: int, pp: int) -> str | None:
    """Why ``engine`` cannot run the data-parallel overlap ``field`` (overlap_grad_reduce or
    overlap_param_gather) at ZeRO ``zero`` with ``pp`` stages; None: it can. The reduction
    overlaps unless the sharding mode reduces after the backward (DeepSpeed without ZeRO:
    overlap_comm is a ZeRO option); the weight gather overlaps only the once-per-step gather of
    ZeRO 1/2 on engines with the switch (Megatron --overlap-param-gather with the distributed
    optimizer)."""
    if zero not in engine.zero_stages:
        return None  # refused on its own (parallel.zero)
    mode = engine.mode(zero, pp)
    if field == "overlap_grad_reduce":
        # Engine.overlap_grad_reduce is the engine's default, not a limit (Megatron-LM 2021 overlaps
        # with --DDP-impl torch); a sharding mode that reduces after the backward is the limit
        if mode.overlap_grad_reduce is False:
            return f"{engine.name} reduces after the backward at ZeRO {zero}, {mode.name}"
        return None
    if not engine.overlap_param_gather:
        return f"{engine.name} has no weight-gather overlap switch"
    if not (zero >= 1 and mode.param_gather == "step"):
        return f"only ZeRO 1/2's once-per-step weight gather overlaps on {engine.name}; ZeRO {zero} is {mode.name}"
    return None


def check_engine(model: ModelSpec, job: Job, par: ParallelConfig, engine: Engine, lps: tuple[int, ...]) -> None:
    """Raise InputError, with the engine's reason, when ``engine`` does not run ``par``
    (a resolved configuration) with the layer split ``lps``."""
    e = engine.name
    precision_rule(job, engine)
    if par.zero not in engine.zero_stages:
        raise InputError("parallel.zero", par.zero, f"a ZeRO stage {e} implements ({', '.join(map(str, engine.zero_stages))})")
    mode = engine.mode(par.zero)
    if par.pp > 1 and not mode.with_pp:
        raise InputError("parallel.zero", par.zero,
                         f"at most {engine.max_zero_with_pp} with pipeline parallelism on {e} ({mode.name} does not run with a pipeline)")
    if par.tp > 1 and not engine.tensor_parallel:
        raise InputError("parallel.tp", par.tp, f"1 on {e} (no tensor parallelism; megatron-deepspeed has it)")
    if par.cp > 1 and not engine.context_parallel:
        raise InputError("parallel.cp", par.cp, f"1 on {e} (no context parallelism)")
    if par.ep > 1 and not engine.expert_parallel:
        raise InputError("parallel.ep", par.ep, f"1 on {e} (no expert parallelism)")
    if par.sequence_parallel and par.tp > 1 and not engine.sequence_parallel:
        raise InputError("parallel.sequence_parallel", True, f"false on {e} (no sequence parallelism)")
    if not par.sequence_parallel and par.tp > 1 and not engine.sequence_parallel_optional:
        raise InputError("parallel.sequence_parallel", False, f"true on {e} (its tensor parallelism always shards norms over the sequence)")
    if par.recompute not in engine.recompute:
        raise InputError("parallel.recompute", par.recompute, f"one of {', '.join(engine.recompute)} on {e}")
    for f in ("overlap_grad_reduce", "overlap_param_gather"):
        if getattr(par, f) and (why := dp_overlap_why(engine, f, par.zero, par.pp)) is not None:
            raise InputError(f"parallel.{f}", True, f"false ({why})")
    if par.tp_comm_overlap and not (engine.tp_comm_overlap and par.sequence_parallel):
        raise InputError("parallel.tp_comm_overlap", True, f"false on {e} without sequence parallelism or TP overlap")
    if par.moe_a2a_overlap and (why := a2a_overlap_runs(engine, model, par)) is not None:
        raise InputError("parallel.moe_a2a_overlap", True, f"false on {e} (the expert all-to-all overlap needs {why})"
                         if engine.moe_a2a_overlap else f"false ({why})")
    if (why := flex_dispatcher_why(engine, model, par.moe_dispatcher, par.ep, par.etp or par.tp)) is not None:
        raise InputError("parallel.moe_dispatcher", par.moe_dispatcher, f"alltoall {why}")
    if (why := cuda_graph_why(engine, model, par.cuda_graph, par.recompute, par.zero, par.moe_a2a_overlap)) is not None:
        raise InputError("parallel.cuda_graph", par.cuda_graph, f"none {why}")
    mtp_rule(engine, model)
    if job.fp8_param_gather and par.zero == 0:
        raise InputError("parallel.zero", 0, f"1 or more on {e} with job.fp8_param_gather (FP8 weights are gathered by a sharded optimizer or FSDP)")
    if par.cp > 1 and (why := cp_attention_why(engine, par.attention)) is not None:
        raise InputError("parallel.cp", par.cp, f"1 on {e} {why}")
    if par.attention is not None and engine.attention_kernels and par.attention not in engine.attention_kernels:
        raise InputError("parallel.attention", par.attention, f"{' or '.join(engine.attention_kernels)} on {e}")
    if par.pp > 1 and par.schedule not in engine.schedules:
        raise InputError("parallel.schedule", par.schedule, f"one of {', '.join(engine.schedules)} on {e}")
    if par.vpp > 1:
        if par.pp == 1:
            raise InputError("parallel.vpp", par.vpp, "1 without pipeline parallelism")
        if par.schedule in ("gpipe", "zb-h1", "zb-h2"):  # one model chunk per rank
            raise InputError("parallel.vpp", par.vpp, f"1 with the {par.schedule} schedule (one chunk per rank)")
        if "interleaved" not in engine.schedules and par.schedule not in ("zb-v", "dualpipe"):
            raise InputError("parallel.vpp", par.vpp, f"1 on {e} (no interleaved schedule)")
        if not interleaving_ok(lps, par.vpp, engine):
            what = "at least one layer per virtual stage on every stage" if engine.uneven_interleaving else \
                "a divisor of every stage's layer count"
            raise InputError("parallel.vpp", par.vpp, f"{what} {list(lps)} on {e}")
        m = par.num_microbatches(job.global_batch_size)
        if par.schedule == "interleaved" and m % par.pp:
            raise InputError("parallel.vpp", par.vpp, f"interleaving needs the micro-batch count ({m}) divisible by pp ({par.pp})")
    if par.pp > 1 and par.schedule == "interleaved" and par.vpp == 1:  # Megatron interleaves only with virtual stages
        raise InputError("parallel.vpp", 1, "2 or more with the interleaved schedule (virtual stages per rank: --vpp)")
    if par.schedule in ("zb-v", "dualpipe") and par.vpp != 2:
        raise InputError("parallel.vpp", par.vpp, f"2 with the {par.schedule} schedule (two chunks per rank in a V)")
