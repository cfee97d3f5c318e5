"""A job read from the user's own files: model, cluster, job and a fully set ParallelConfig,
with where each setting came from (the file, a command-line flag, or a default named).

Readers (:mod:`planner.check.megatron`, ``torchtitan``, ``deepspeed``, ``plan_doc``) fill a
:class:`Draft`; :func:`finish` turns it into a :class:`CheckedJob`, applies the command-line
overrides (``--gpus``, ``--cluster``, ``--gpu``, ``--model``) and checks what every engine
needs (degrees that multiply to the world, a batch that divides, a complete model shape),
raising one-line :class:`planner.errors.InputError` naming the file and the setting.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from planner.errors import InputError
from planner.io.loaders import load_cluster, load_model, make_cluster, model_from_dict
from planner.specs import ENGINE_FIELDS, ClusterSpec, Job, ModelSpec, ParallelConfig

__all__ = ["Source", "Draft", "CheckedJob", "Overrides", "finish", "MODEL_FIELDS", "PARALLEL_FIELDS"]

MODEL_FIELDS = ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "mlp", "tied_embeddings", "head_dim", "bias",
                "norm", "position_embedding", "rope_theta", "q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "v_head_dim", "mtp_layers", "qk_norm", "moe")
PARALLEL_FIELDS = tuple(ParallelConfig.__dataclass_fields__)
DEFAULT_GPU = "h100-sxm5-80gb"


@dataclass(frozen=True)
class Source:
    """Where one setting came from: ``kind`` file | flag | default, and a short ``where``."""

    kind: str
    where: str

    def as_dict(self) -> dict:
        return {"kind": self.kind, "where": self.where}


@dataclass
class Draft:
    """Settings collected by a reader: name -> (value, Source). Names are ``model.<field>``,
    ``job.<field>``, ``parallel.<field>``, ``hardware.<num_gpus|gpus_per_node|gpu>``."""

    fmt: str
    engine: str
    files: list
    values: dict = field(default_factory=dict)
    ignored: list = field(default_factory=list)
    unmodelled: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    editor: object = None
    model_id: str = ""
    model: ModelSpec | None = None  # a whole model the file names (a preset, a torchtitan flavor)
    findings: list = field(default_factory=list)  # (id, text): problems the reader found in the file itself
    post: list = field(default_factory=list)  # (draft, cluster) -> None: settings that need the hardware
    flushes: int = 1  # pipeline runs per step (torchtitan's gradient accumulation around the schedule)

    def set(self, name: str, value, kind: str, where: str) -> None:
        self.values[name] = (value, Source(kind, where))

    def default(self, name: str, value, where: str) -> None:
        if name not in self.values:
            self.values[name] = (value, Source("default", where))

    def get(self, name: str, default=None):
        return self.values[name][0] if name in self.values else default

    def has(self, name: str) -> bool:
        return name in self.values


@dataclass
class Overrides:
    """Command-line settings (``planner check`` flags): they win over the file; the output says
    what the file had."""

    gpus: int | None = None
    gpus_per_node: int | None = None
    gpu: str | None = None
    cluster: str | None = None
    engine: str | None = None
    model: str | None = None
    extra: dict = field(default_factory=dict)  # parallel.<field> / job.<field> values (DeepSpeed degrees)


@dataclass
class CheckedJob:
    fmt: str
    files: list
    engine: str
    model: ModelSpec
    cluster: ClusterSpec
    job: Job
    parallel: ParallelConfig
    sources: dict
    ignored: list
    unmodelled: list
    notes: list
    editor: object = None
    model_id: str = ""
    findings: list = field(default_factory=list)
    overrides: object = None  # the Overrides it was read with (edits are read back with them)
    flushes: int = 1  # pipeline runs per step (planner.cost.accumulation): torchtitan's gradient accumulation under pp

    def as_dict(self) -> dict:
        return {"format": self.fmt, "files": list(self.files), "engine": self.engine, "model_id": self.model_id,
                "settings": {k: {"value": _plain(v), **s.as_dict()} for k, (v, s) in sorted(self.sources.items())},
                "ignored": list(self.ignored), "unmodelled": list(self.unmodelled), "notes": list(self.notes)}


def _plain(v):
    if isinstance(v, tuple):
        return list(v)
    if hasattr(v, "__dataclass_fields__"):
        return {k: _plain(getattr(v, k)) for k in v.__dataclass_fields__}
    return v


def _apply_overrides(d: Draft, o: Overrides) -> None:
    for name, value in (("hardware.num_gpus", o.gpus), ("hardware.gpus_per_node", o.gpus_per_node), ("hardware.gpu", o.gpu)):
        if value is not None:
            old = d.values.get(name)
            d.set(name, value, "flag", f"--{name.split('.')[1].replace('_', '-').replace('num-gpus', 'gpus')}"
                  + (f" (the file has {old[0]})" if old and old[1].kind == "file" and old[0] != value else ""))
    for name, value in o.extra.items():
        if value is not None:
            old = d.values.get(name)
            d.set(name, value, "flag", f"--{name.split('.')[1].replace('_', '-')}"
                  + (f" (the file has {old[0]})" if old and old[1].kind == "file" and old[0] != value else ""))
    if o.engine is not None and o.engine != d.engine:
        from planner.engines import get_engine  # noqa: PLC0415

        eng = get_engine(o.engine)
        ce = d.get("job.cross_entropy", "auto")
        if not eng.has_loss(ce):  # the files' engine's loss, not the one asked for
            d.set("job.cross_entropy", "auto", "flag", f"--engine {o.engine}: its default cross entropy (the files' {d.engine} "
                  f"runs {ce!r})")
            d.notes.append(f"priced on {o.engine} (--engine), not on the files' {d.engine}: {o.engine}'s own cross entropy "
                           f"in place of {ce!r}")
        d.engine = o.engine


def _model(d: Draft, o: Overrides) -> tuple[ModelSpec, str]:
    base = d.model
    model_id = d.model_id
    if o.model is not None:
        base = load_model(o.model)
        model_id = o.model
        from planner.io.hf_import import import_notes  # noqa: PLC0415

        if (notes := import_notes(base)) is not None:
            d.notes.append(notes)
        for f in MODEL_FIELDS:
            d.values.pop(f"model.{f}", None)
        d.set("model", o.model, "flag", "--model")
    fields = {f: d.get(f"model.{f}") for f in MODEL_FIELDS if d.has(f"model.{f}")}
    if base is not None:
        merged = {f: getattr(base, f) for f in MODEL_FIELDS}
        if base.moe is not None:
            merged["moe"] = {k: getattr(base.moe, k) for k in base.moe.__dataclass_fields__}
        merged.update(fields)
        fields = merged
        fields["name"] = base.name
    missing = [f for f in ("layers", "hidden", "heads", "vocab") if fields.get(f) is None]
    if missing:
        if d.fmt.startswith("megatron"):  # the shape is the script's own flags
            flag = {"layers": "--num-layers", "hidden": "--hidden-size", "heads": "--num-attention-heads", "vocab": "--vocab-size"}
            what = f"the model shape ({', '.join(flag.get(m, m) for m in missing)}; or name a model with --model)"
        else:  # a DeepSpeed JSON (or another file) holds no model: --model names one
            what = "a model: this file holds no model shape; name one with --model (a preset id, a model YAML or a Hugging Face config.json)"
        raise InputError(f"{d.files[0]}: model.{missing[0]}", None, what)
    if fields.get("ffn_hidden") is None:
        fields["ffn_hidden"] = 4 * fields["hidden"]
    if fields.get("kv_heads") is None:
        fields["kv_heads"] = fields["heads"]
    fields.setdefault("name", model_id or "model")
    moe = fields.get("moe")
    if moe is not None and not isinstance(moe, dict):
        fields["moe"] = {k: getattr(moe, k) for k in moe.__dataclass_fields__}
    return model_from_dict({k: v for k, v in fields.items() if v is not None}, f"{d.files[0]}: model", strict=False), model_id or str(fields["name"])


def _cluster(d: Draft, o: Overrides) -> ClusterSpec:
    n = d.get("hardware.num_gpus")
    if n is None:
        raise InputError(f"{d.files[0]}: world size", None, "a GPU count the file or --gpus gives")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:  # before the node size is capped by it
        raise InputError("hardware.num_gpus", n, "a positive integer", flag="--gpus" if o.gpus is not None else None)
    if o.cluster:
        c = load_cluster(o.cluster, num_gpus=n)
        d.set("hardware.gpu", c.gpu.id, "flag", f"--cluster {o.cluster}")
        return c
    gpu = d.get("hardware.gpu")
    if gpu is None:
        gpu = DEFAULT_GPU
        d.set("hardware.gpu", gpu, "default", "the planner's default GPU (pass --gpu or --cluster)")
    gpn = d.get("hardware.gpus_per_node")
    if gpn is not None and n < gpn:
        gpn = n
    return make_cluster(gpu, n, gpn, d.get("hardware.inter_node"))  # the network the planner's provenance names, else the default


def finish(d: Draft, o: Overrides | None = None) -> CheckedJob:
    """The CheckedJob of a reader's draft, with the command-line overrides applied."""
    o = o or Overrides()
    _apply_overrides(d, o)
    cluster = _cluster(d, o)
    for hook in d.post:  # settings that need the hardware (the rest of the world, the attention kernel)
        hook(d, cluster)
    model, model_id = _model(d, o)
    where = d.files[0]
    seq, gbs = d.get("job.seq_len"), d.get("job.global_batch_size")
    if seq is None:
        raise InputError(f"{where}: sequence length", None, "a sequence length the file gives (or --seq-len)")
    par = {f: d.get(f"parallel.{f}") for f in PARALLEL_FIELDS if d.has(f"parallel.{f}")}
    tp, pp, cp = par.get("tp", 1), par.get("pp", 1), par.get("cp", 1)
    n = cluster.num_gpus
    if n % (tp * pp * cp):
        raise InputError(f"{where}: tp x pp x cp", f"{tp} x {pp} x {cp} = {tp * pp * cp}", f"a divisor of the world size ({n} GPUs)")
    dp = par.get("dp")
    if dp is None:
        dp = n // (tp * pp * cp)
        d.set("parallel.dp", dp, "default", f"world / (tp x pp x cp) = {n} / {tp * pp * cp}")
        par["dp"] = dp
    elif dp * tp * pp * cp != n:
        raise InputError(f"{where}: dp x tp x pp x cp", f"{dp} x {tp} x {pp} x {cp} = {dp * tp * pp * cp}", f"the world size ({n} GPUs)")
    mb = par.get("micro_batch_size", 1)
    if gbs is None:
        gbs = mb * dp
        d.set("job.global_batch_size", gbs, "default", f"micro-batch x dp = {mb} x {dp}")
    if gbs % (mb * dp):
        raise InputError(f"{where}: global batch", gbs, f"a multiple of micro-batch x dp = {mb} x {dp} = {mb * dp}")
    job = Job(seq_len=seq, global_batch_size=gbs, precision=d.get("job.precision", "bf16"), grad_reduce=d.get("job.grad_reduce", "auto"),
              fp8_recipe=d.get("job.fp8_recipe", "auto"), fp8_param_gather=d.get("job.fp8_param_gather"),
              fp8_tp_gather=d.get("job.fp8_tp_gather"), cross_entropy=d.get("job.cross_entropy", "auto"))
    lps = par.get("layers_per_stage")
    if lps is None:
        from planner.engines import default_split, get_engine  # noqa: PLC0415

        lps = default_split(model, pp, par.get("vpp") or 1, get_engine(d.engine))
        d.set("parallel.layers_per_stage", tuple(lps), "default", f"the engine's split ({d.engine})")
        par["layers_per_stage"] = lps
    if lps is not None:
        par["layers_per_stage"] = tuple(lps)
        if len(lps) != pp or sum(lps) != model.layers or min(lps) < 0:
            raise InputError(f"{where}: layers per stage", list(lps), f"{pp} counts summing to the model's {model.layers} layers")
    parallel = ParallelConfig(**par)
    missing = [f for f in ENGINE_FIELDS if getattr(parallel, f) is None]
    if missing:  # a reader sets every field; this is the reader's bug, not the user's
        raise AssertionError(f"reader {d.fmt} left {missing} unset")
    sources = {k: v for k, v in d.values.items()}
    return CheckedJob(d.fmt, list(d.files), d.engine, model, cluster, job, parallel, sources, list(d.ignored), list(d.unmodelled),
                      list(d.notes), d.editor, model_id, list(d.findings), flushes=d.flushes)


def with_parallel(cj: CheckedJob, par: ParallelConfig) -> CheckedJob:
    return replace(cj, parallel=par)


def estimate_as_written(cj: CheckedJob, job: Job | None = None):
    """The estimate of ``cj``'s own configuration as its files run it: ``cj.flushes`` pipeline
    runs of the step's micro-batches / flushes each (planner.cost.accumulation), else one."""
    from planner.cost.accumulation import repeat_flushes  # noqa: PLC0415
    from planner.cost.estimate import estimate  # noqa: PLC0415

    job = job or cj.job
    if cj.flushes <= 1:
        return estimate(cj.model, cj.cluster, job, cj.parallel, cj.engine)
    return repeat_flushes(estimate(cj.model, cj.cluster, one_run_job(cj, job), cj.parallel, cj.engine), cj.flushes)


def one_run_job(cj: CheckedJob, job: Job | None = None) -> Job:
    """The job of one of ``cj``'s pipeline runs: the step's batch / ``cj.flushes``."""
    job = job or cj.job
    return job if cj.flushes <= 1 else replace(job, global_batch_size=job.global_batch_size // cj.flushes)


__all__ += ["with_parallel", "estimate_as_written", "one_run_job"]
