"""torchtitan: a 0.2.x job TOML (this module) or a 0.3.0 config module
(:mod:`planner.check.torchtitan_py`) -> model, job, parallel configuration.

Both forms become the same settings (0.2.2 section.key names, defaults read from the
installed ``torchtitan/config/job_config.py`` by :mod:`planner.check.titan_schema`), mapped by
:func:`titan_draft` with torchtitan's own rules (``SP`` = the torchtitan 0.2.2 wheel):

* degrees: ``dp_replicate x dp_shard x cp x tp x pp = world``, ``dp_shard = -1`` is the rest
  (distributed/parallel_dims.py:45-56); the planner's dp is ``dp_replicate x dp_shard``; FSDP2
  when ``dp_shard > 1`` or ``cp > 1`` (``fsdp_enabled``, :334), HSDP with both; DDP only as the
  sole parallelism (llama3/infra/parallelize.py:148-156).
* sharding: FSDP2 ``fsdp_reshard_after_forward`` default/always -> ZeRO-3, never -> ZeRO-2
  (parallelize.py:319-331; under PP "default" keeps the weights, the engine profile's PP mode).
* pipeline: stages per rank from ``pipeline_parallel_layers_per_stage`` (ceil((L + first_less +
  last_less) / n), pipeline_parallel.py:71-109) or the schedule (1 single-stage, 2 multi-stage);
  the layer split of ``generate_llm_fqn_per_model_part`` (:236-343) or ``module_fqns_per_model_part``;
  stage k on rank k mod pp, or in a V for ZBVZeroBubble/DualPipeV (:447-471).
* batch: pipeline micro-batch ``pipeline_parallel_microbatch_size`` (local % mb, :186-201);
  without PP the micro-batch is ``local_batch_size``; gradient accumulation
  ``global / (local x dp_replicate x dp_shard)`` (train.py:196-215).
"""

from __future__ import annotations

import math
import tomllib
from pathlib import Path

from planner.check.job import Draft
from planner.check.titan_flavors import flavor_shape
from planner.check.titan_schema import job_config_schema, key_type, type_ok
from planner.engines import supports_flash
from planner.errors import InputError

__all__ = ["read_titan_toml", "titan_draft", "stage_layers", "SCHEDULES", "TitanSettings"]

# torch.distributed.pipelining names (schedules.py get_schedule_class, case-insensitive) -> the planner's
SCHEDULES = {"1f1b": ("1f1b", False), "gpipe": ("gpipe", False), "interleaved1f1b": ("interleaved", True),
             "loopedbfs": ("interleaved", True), "interleavedzerobubble": ("interleaved", True), "zbvzerobubble": ("zb-v", True),
             "dualpipev": ("dualpipe", True), "pipelineschedulesingle": ("1f1b", False), "pipelineschedulemulti": ("interleaved", True)}
# Sections that do not change the step's cost.
_IGNORED_SECTIONS = {"job": "run name and output folder", "profiling": "profiling", "metrics": "logging",
                     "optimizer": "optimizer hyper-parameters (AdamW state priced)", "lr_scheduler": "learning-rate schedule",
                     "checkpoint": "checkpoints (outside the step)", "comm": "communication timeouts", "memory_estimation": "a dry run",
                     "fault_tolerance": "fault tolerance", "experimental": "custom model registration", "validation": "evaluation",
                     "debug": "debugging switches"}


class TitanSettings:
    """section.key -> (value, where) as the file gives them; defaults from torchtitan's JobConfig."""

    def __init__(self, values: dict, path: Path, version: str, defaults: dict | None = None):
        self.values, self.path, self.version = values, path, version
        self.overridden: set = set()  # keys a launch script's command line sets (their where names the script)
        schema = job_config_schema()
        self.defaults = dict(defaults or {})
        if schema is not None:
            for sec_name, sec in schema.sections.items():
                for k, v in sec.keys.items():
                    self.defaults.setdefault(f"{sec_name}.{k}", v)
            if version == "0.2.2":  # the schema is 0.2.2's JobConfig: its types, as its ConfigManager parses them
                for key, (v, where) in values.items():
                    ann = key_type(schema, key)
                    if ann is not None and not type_ok(v, ann):
                        raise InputError(f"{path.name}: {where}", v, f"a value of type {ann} (torchtitan 0.2.2 config/job_config.py)")

    def get(self, key: str):
        if key in self.values:
            return self.values[key][0]
        v = self.defaults.get(key)
        if isinstance(v, tuple) and v and v[0] == "factory":  # field(default_factory=...): list, or lambda: [...]
            import ast  # noqa: PLC0415

            body = v[1].split(":", 1)[1] if v[1].startswith("lambda") else None
            try:
                return ast.literal_eval(body.strip()) if body else ([] if v[1] == "list" else None)
            except (ValueError, SyntaxError):
                return None
        return v

    def given(self, key: str) -> bool:
        return key in self.values

    def where(self, key: str) -> str:
        if key in self.overridden:
            return self.values[key][1]
        if key in self.values:
            return f"{self.path.name}: {self.values[key][1]}"
        return f"torchtitan {self.version} default {key} = {self.get(key)!r} (config/job_config.py)"

    def kind(self, key: str) -> str:
        return "file" if key in self.values else "default"


def _flatten(doc: dict, prefix: str, out: dict, lines: dict) -> None:
    for k, v in doc.items():
        key = f"{prefix}.{k}" if prefix else k
        if isinstance(v, dict):
            _flatten(v, key, out, lines)
        else:
            out[key] = (v, f"[{prefix}] {k}" + (f" (line {lines[key]})" if key in lines else ""))


def _key_lines(text: str) -> dict:
    """section.key -> line number (for messages and edits)."""
    out, section = {}, ""
    for i, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if s.startswith("[") and s.endswith("]"):
            section = s.strip("[]").strip()
        elif "=" in s and not s.startswith("#"):
            out[f"{section}.{s.split('=', 1)[0].strip()}" if section else s.split("=", 1)[0].strip()] = i
    return out


def _check_keys(doc: dict, path: Path) -> None:
    schema = job_config_schema()
    if schema is None:
        return

    def walk(d: dict, sec, prefix: str) -> None:
        for k, v in d.items():
            full = f"{prefix}.{k}" if prefix else k
            if isinstance(v, dict):
                if k not in sec.sections:
                    raise InputError(f"{path.name}: [{full}]", "unknown section", f"a section of torchtitan's JobConfig "
                                     f"({', '.join(sorted(sec.sections)) or 'none here'}); ConfigManager rejects it (config/manager.py:160-181)")
                walk(v, sec.sections[k], full)
            elif k not in sec.keys:
                import difflib  # noqa: PLC0415

                close = difflib.get_close_matches(k, list(sec.keys), n=1)
                raise InputError(f"{path.name}: [{prefix}] {k}", v, f"a key of [{prefix}]" + (f" (did you mean {close[0]}?)" if close else "")
                                 + "; torchtitan's ConfigManager rejects unknown keys")

    walk(doc, schema, "")


def read_titan_toml(path: Path, launch=None) -> Draft:
    """The job of a torchtitan 0.2.2 TOML, with the world and the ``--section.key`` overrides of
    the launch script that starts it (``launch``: planner.check.titan_launch.TitanLaunch)."""
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(str(path), "malformed TOML", f"valid TOML ({exc})") from None
    _check_keys(doc, path)
    values: dict = {}
    _flatten(doc, "", values, _key_lines(text))
    given = {}
    if launch is not None:
        from planner.check.titan_launch import override_values  # noqa: PLC0415

        given = override_values(launch.overrides, job_config_schema())
        had = {k: values[k][0] for k in given if k in values}
        values.update(given)
    s = TitanSettings(values, path, "0.2.2")
    s.overridden = set(given)
    d = titan_draft(s, path, "torchtitan-toml", launch=launch)
    if given:
        d.notes.append(f"set on {launch.script.name}'s command line, over {path.name}: " + ", ".join(
            f"{k} = {v!r} ({path.name}: {had[k]!r})" if k in had else f"{k} = {v!r} (not in {path.name})" for k, (v, _) in given.items()))
    from planner.check.edits import TomlEditor  # noqa: PLC0415

    d.editor = TomlEditor(path, text, given)
    for sec in doc:
        if sec in _IGNORED_SECTIONS:
            d.ignored.append(f"[{sec}] ({_IGNORED_SECTIONS[sec]})")
    return d


def stage_layers(num_stages: int, layers: int, input_weight: int, output_weight: int, where: str) -> list[int]:
    """Transformer layers of each virtual stage, as ``generate_llm_fqn_per_model_part`` deals
    them (torchtitan/distributed/pipeline_parallel.py:236-343): ``L + input + output`` effective
    layers spread evenly, the extra ones to the first stages; the embedding's and the output's
    weights taken from the first and last stage."""
    if num_stages == 1:
        return [layers]
    eff = layers + input_weight + output_weight
    per, extra = divmod(eff, num_stages)
    if per == 0 or input_weight > per or output_weight > per:
        raise InputError(where, f"{num_stages} stages of {layers} layers (+{input_weight}+{output_weight})",
                         "at least one layer per stage and weights within a stage (pipeline_parallel.py:269-296)")
    out, left = [], layers
    for k in range(num_stages):
        n = per + (1 if k < extra else 0)
        n -= input_weight if k == 0 else 0
        n -= output_weight if k == num_stages - 1 else 0
        n = max(0, min(n, left))
        out.append(n)
        left -= n
    return out


def _degrees(d: Draft, s: TitanSettings, world: int) -> tuple:
    P = "parallelism."
    rep, shard = s.get(P + "data_parallel_replicate_degree"), s.get(P + "data_parallel_shard_degree")
    tp, pp, cp = s.get(P + "tensor_parallel_degree"), s.get(P + "pipeline_parallel_degree"), s.get(P + "context_parallel_degree")
    ep, etp = s.get(P + "expert_parallel_degree") or 1, s.get(P + "expert_tensor_parallel_degree") or 1
    for key, v in (("data_parallel_replicate_degree", rep), ("tensor_parallel_degree", tp), ("pipeline_parallel_degree", pp),
                   ("context_parallel_degree", cp), ("expert_parallel_degree", ep)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise InputError(s.where(P + key), v, "a positive integer (parallel_dims.py:45-56)")
    if isinstance(shard, bool) or not isinstance(shard, int) or (shard < 1 and shard != -1):
        raise InputError(s.where(P + "data_parallel_shard_degree"), shard, "a positive integer or -1 (the rest of the world)")
    if shard == -1:
        if world % (rep * cp * tp * pp):
            raise InputError(s.where(P + "data_parallel_shard_degree"), f"-1 on {world} GPUs",
                             f"a world divisible by dp_replicate x cp x tp x pp = {rep * cp * tp * pp}")
        shard = world // (rep * cp * tp * pp)
    if rep * shard * cp * tp * pp != world:
        raise InputError(f"{s.path.name}: dp_replicate x dp_shard x cp x tp x pp", f"{rep} x {shard} x {cp} x {tp} x {pp}",
                         f"the world size ({world} GPUs) (parallel_dims.py:56)")
    if ep > 1 and etp not in (1, tp):
        raise InputError(s.where(P + "expert_tensor_parallel_degree"), etp, f"1 or tp ({tp}) (parallel_dims.py:58-59)")
    return rep, shard, tp, pp, cp, ep, etp


def titan_draft(s: TitanSettings, path: Path, fmt: str, launch=None) -> Draft:
    """The draft of a torchtitan job from its settings (both versions); ``launch``: the script
    that starts it (its world; listed first among the files, so an edit is read back with it)."""
    d = Draft(fmt=fmt, engine="torchtitan", files=([str(launch.script)] if launch else []) + [str(path)])
    world = launch.world if launch else None
    if world:
        d.set("hardware.num_gpus", world, "file", launch.world_where)
        d.set("hardware.gpus_per_node", launch.gpus_per_node, "file", launch.world_where)
    P, T, A = "parallelism.", "training.", "activation_checkpoint."
    name, flavor = s.get("model.name"), s.get("model.flavor")
    seq = s.get(T + "seq_len")
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 1:
        raise InputError(s.where(T + "seq_len"), seq, "a positive integer")
    shape = flavor_shape(str(name), str(flavor), int(seq or 4096))
    where = f"{s.where('model.flavor')} -> torchtitan 0.2.2's {name} {flavor} (built on the meta device)"
    for k, v in shape.items():
        if k != "interleaved_moe":
            d.set(f"model.{k}", v, s.kind("model.flavor"), where)
    d.model_id = f"{name}-{flavor}"
    if shape.get("interleaved_moe"):
        d.notes.append(f"{name} {flavor} alternates dense and MoE layers; priced with its {shape['moe']['dense_layers']} dense layers first")
    d.set("job.seq_len", seq, s.kind(T + "seq_len"), s.where(T + "seq_len"))
    convs = [str(c) for c in (s.get("model.converters") or [])]
    if s.version == "0.2.2":
        for c in convs:
            if c in ("float8", "mx"):
                d.findings.append(("unregistered-converter", f"{s.where('model.converters')}: {c!r} is not a converter torchtitan 0.2.2 "
                                   f"registers (it has 'quantize.linear.{c}', components/quantization/float8.py:238): the job stops at "
                                   "model build (KeyError, protocols/model_converter.py:61-63); priced as the FP8 run it means"))
    fp8 = [c for c in convs if "float8" in c or "mx" in c]
    if s.get(T + "mixed_precision_param") not in ("bfloat16", None):
        raise InputError(s.where(T + "mixed_precision_param"), s.get(T + "mixed_precision_param"),
                         "bfloat16 (the planner prices 16-bit and FP8 training, not float32)")
    d.set("job.precision", "fp8" if fp8 else "bf16", "file" if fp8 else s.kind(T + "mixed_precision_param"),
          s.where("model.converters") if fp8 else s.where(T + "mixed_precision_param"))
    if any("mx" in c for c in fp8):
        d.unmodelled.append("model.converters MX: MXFP8 priced as FP8")
    elif fp8:
        # torchao's recipe: 0.2.2 recipe_name None is Float8LinearConfig() = tensor-wise (job_config.py
        # Float8Linear); 0.3.0 defaults to rowwise (components/quantization/float8.py)
        key, gkey = "quantize.linear.float8.recipe_name", "quantize.linear.float8.enable_fsdp_float8_all_gather"
        recipe = s.get(key) or ("tensorwise" if s.version == "0.2.2" else "rowwise")
        d.set("job.fp8_recipe", recipe, s.kind(key), s.where(key))
        if s.get(key) and s.get(gkey):
            d.findings.append(("torchtitan-rejects", f"{s.where(key)} with {gkey} = true: torchtitan's Float8LinearConverter asserts "
                               "enable_fsdp_float8_all_gather is off when recipe_name is set (components/quantization/float8.py); "
                               "the job stops at model conversion. For tensor-wise with FP8 gathers leave recipe_name unset"))
        if recipe == "tensorwise":
            d.set("job.fp8_param_gather", bool(s.get(gkey)), s.kind(gkey),
                  s.where(gkey) if s.kind(gkey) == "file" else f"torchtitan {s.version} default {gkey} = False (config/job_config.py Float8Linear)")
    d.set("job.grad_reduce", "auto", s.kind(T + "mixed_precision_reduce"), s.where(T + "mixed_precision_reduce") + " (fp32 gradients)")
    if s.get(T + "dtype") == "bfloat16":
        d.unmodelled.append("training.dtype = bfloat16: bf16 weights and optimizer states (the planner prices fp32 master weights)")
    if s.get(T + "enable_cpu_offload"):
        d.unmodelled.append("training.enable_cpu_offload: FSDP CPU offload")
    P_ = P + "data_parallel_"
    if not d.has("hardware.num_gpus"):
        if s.get(P_ + "shard_degree") == -1:
            d.set("hardware.num_gpus", world or 8, "default", "torchtitan's run_train.sh default NGPU=8 (pass --gpus)")
        else:
            n = 1
            for k in ("data_parallel_replicate_degree", "data_parallel_shard_degree", "tensor_parallel_degree",
                      "pipeline_parallel_degree", "context_parallel_degree"):
                n *= int(s.get(P + k) or 1)
            d.set("hardware.num_gpus", n, "file", f"{s.path.name}: the product of the parallel degrees")
    _recompute(d, s)
    comps = s.get("compile.components") or []
    if s.get("compile.enable") and "loss" in comps:  # components/loss.py: torch.compile(loss_fn)
        d.set("job.cross_entropy", "compiled", "file", f"{s.where('compile.enable')} with 'loss' in compile.components {comps}")
    else:
        d.set("job.cross_entropy", "torch", s.kind("compile.enable"), f"{s.where('compile.enable')}: the eager loss (components/loss.py)")
    if s.get("compile.enable") and "model" in comps:
        d.unmodelled.append(f"compile.enable (components {comps}): torch.compile fuses the model's elementwise work (priced eager; "
                            "the loss's fusion and async TP are priced)")
    d.post.append(lambda dd, cluster: _parallel(dd, s, shape, cluster))
    d.post.append(_attention)
    return d


def _parallel(d: Draft, s: TitanSettings, shape: dict, cluster) -> None:
    P = "parallelism."
    rep, shard, tp, pp, cp, ep, etp = _degrees(d, s, cluster.num_gpus)
    dp = rep * shard
    for key, v, k in (("tp", tp, "tensor_parallel_degree"), ("pp", pp, "pipeline_parallel_degree"), ("cp", cp, "context_parallel_degree"),
                      ("ep", ep, "expert_parallel_degree")):
        d.set(f"parallel.{key}", v, s.kind(P + k), s.where(P + k))
    d.set("parallel.etp", etp if ep > 1 else tp, s.kind(P + "expert_tensor_parallel_degree"), s.where(P + "expert_tensor_parallel_degree"))
    d.set("parallel.dp", dp, "file" if s.given(P + "data_parallel_shard_degree") else "default",
          f"dp_replicate x dp_shard = {rep} x {shard}")
    fsdp = shard > 1 or cp > 1
    reshard = s.get(P + "fsdp_reshard_after_forward")
    if fsdp:
        zero = 2 if reshard == "never" else 3
        if reshard == "always" and pp > 1:  # the profile's ZeRO-3 under pp is the 'default' policy (no reshard)
            d.unmodelled.append(f"{s.where(P + 'fsdp_reshard_after_forward')} = always under pipeline parallelism: every micro-batch "
                                "re-gathers each block (parallelize.py apply_fsdp); priced as the default policy, which keeps "
                                "the blocks unsharded under pp (less all-gather time and more memory than this job has)")
        d.set("parallel.zero", zero, s.kind(P + "fsdp_reshard_after_forward"),
              f"FSDP2 over dp_shard x cp = {shard * cp}, " + s.where(P + "fsdp_reshard_after_forward"))
        d.set("parallel.zero_shard_degree", shard * cp if rep > 1 else None, "file" if rep > 1 else "default",
              f"HSDP: shards over dp_shard x cp = {shard * cp}, replicas over dp_replicate = {rep}" if rep > 1 else "FSDP over all of dp")
    else:
        if rep > 1 and tp * pp * cp * ep > 1:
            raise InputError(s.where(P + "data_parallel_replicate_degree"), rep,
                             "dp_shard > 1 when combined with tp/pp/cp/ep: torchtitan's DDP runs only as the sole parallelism "
                             "(llama3/infra/parallelize.py:148-156)")
        d.set("parallel.zero", 0, "default", "no FSDP (dp_shard = 1): DDP over dp_replicate" if rep > 1 else "one data-parallel rank")
        d.set("parallel.zero_shard_degree", None, "default", "no sharding")
    d.set("parallel.sequence_parallel", tp > 1 and s.get(P + "enable_sequence_parallel") is not False, "default",
          "torchtitan's TP plans shard norms over the sequence (SequenceParallel)")
    asynctp = bool(s.get(P + "enable_async_tensor_parallel"))
    if asynctp and not (s.get("compile.enable") and "model" in (s.get("compile.components") or [])):
        raise InputError(s.where(P + "enable_async_tensor_parallel"), True, "compile.enable with 'model' in compile.components "
                         "(distributed/tensor_parallel.py:16-25)")
    d.set("parallel.tp_comm_overlap", asynctp and tp > 1, s.kind(P + "enable_async_tensor_parallel"), s.where(P + "enable_async_tensor_parallel"))
    d.default("parallel.moe_a2a_overlap", False, "torchtitan: no expert all-to-all overlap with another micro-batch")
    d.default("parallel.moe_dispatcher", "alltoall", "torchtitan: its all-to-all token dispatch")
    d.default("parallel.cuda_graph", "none", "torchtitan: priced as eager launches")
    if s.version != "0.2.2" and pp == 1 and s.get("training.disable_cuda_graphs") is not True:
        d.unmodelled.append("training.disable_cuda_graphs is not set: torchtitan 0.3.0 captures the training step in a CUDA graph "
                            "by default without a pipeline (trainer.py); priced as eager launches")
    d.set("parallel.async_tp_allreduce", False, "default", "DTensor TP: blocking collectives (engine torchtitan)")
    d.set("parallel.overlap_grad_reduce", True, "default", "FSDP2 reduce-scatters each block during the backward (DDP: buckets)")
    from planner.engines import engine_flags, get_engine  # noqa: PLC0415

    zero = d.get("parallel.zero")
    opg = engine_flags(get_engine("torchtitan"), cluster.gpu, tp, zero, {"overlap_grad_reduce": True}, pp, cluster.nvlink_domain)["overlap_param_gather"]
    d.set("parallel.overlap_param_gather", opg, "default", "FSDP2 prefetches the next block's all-gather (per-layer gathers: "
          "priced by the engine's sharding mode)" if fsdp else "no sharded weights")
    _pipeline(d, s, pp, dp, shape["layers"])


def _attention(d: Draft, cluster) -> None:
    ok = supports_flash(cluster.gpu)
    d.set("parallel.attention", "flash" if ok else "unfused", "default",
          "SDPA flash / FlexAttention" + ("" if ok else f" (no flash kernel on {cluster.gpu.id})"))


def _pipeline(d: Draft, s: TitanSettings, pp: int, dp: int, layers: int) -> None:
    P, T = "parallelism.", "training."
    local = s.get(T + "local_batch_size")
    gbs = s.get(T + "global_batch_size")
    if isinstance(local, bool) or not isinstance(local, int) or local < 1:
        raise InputError(s.where(T + "local_batch_size"), local, "a positive integer")
    if gbs is None or gbs < 0:
        gbs = local * dp
        d.set("job.global_batch_size", gbs, "default", f"global_batch_size -1: local x dp = {local} x {dp} (train.py:196-200)")
    else:
        if gbs % (local * dp):
            raise InputError(s.where(T + "global_batch_size"), gbs, f"a multiple of local_batch_size x dp = {local} x {dp} (train.py:203)")
        d.set("job.global_batch_size", gbs, "file", s.where(T + "global_batch_size"))
    ga = gbs // (local * dp)
    if pp == 1:
        d.set("parallel.micro_batch_size", local, s.kind(T + "local_batch_size"), s.where(T + "local_batch_size"))
        d.set("parallel.vpp", 1, "default", "no pipeline")
        d.set("parallel.schedule", "1f1b", "default", "no pipeline")
        d.set("parallel.layers_per_stage", (layers,), "default", "no pipeline")
        return
    mb = s.get(P + "pipeline_parallel_microbatch_size")
    if local % mb:
        raise InputError(s.where(P + "pipeline_parallel_microbatch_size"), mb, f"a divisor of local_batch_size ({local}) (pipeline_parallel.py:188)")
    d.set("parallel.micro_batch_size", mb, s.kind(P + "pipeline_parallel_microbatch_size"), s.where(P + "pipeline_parallel_microbatch_size"))
    d.flushes = ga  # one pipeline schedule run per accumulation step (train.py train_step), priced so (cost/accumulation.py)
    name = str(s.get(P + "pipeline_parallel_schedule"))
    if s.get(P + "pipeline_parallel_schedule_csv"):
        d.unmodelled.append("parallelism.pipeline_parallel_schedule_csv: a custom schedule, priced as " + name)
    if name.lower() not in SCHEDULES:
        raise InputError(s.where(P + "pipeline_parallel_schedule"), name, "a torch.distributed.pipelining schedule: "
                         "1F1B, Interleaved1F1B, GPipe, LoopedBFS, InterleavedZeroBubble, ZBVZeroBubble, DualPipeV")
    sched, multi = SCHEDULES[name.lower()]
    if name.lower() == "interleavedzerobubble":
        d.notes.append("InterleavedZeroBubble priced as interleaved 1F1B (its bubble is an upper bound)")
    first_less = s.get(P + "pipeline_parallel_first_stage_less_layers")
    last_less = s.get(P + "pipeline_parallel_last_stage_less_layers")
    parts = s.get(P + "module_fqns_per_model_part")
    per_stage_n = s.get(P + "pipeline_parallel_layers_per_stage")
    if parts:
        stages = [sum(1 for m in part if str(m).startswith("layers.")) for part in parts]
        where = s.where(P + "module_fqns_per_model_part")
        if sum(stages) != layers:
            raise InputError(where, f"{sum(stages)} layers", f"all {layers} layers of the model, each in one part")
    else:
        if per_stage_n is not None:
            n_stages = math.ceil((layers + first_less + last_less) / per_stage_n)
            where = s.where(P + "pipeline_parallel_layers_per_stage")
        else:
            n_stages = pp * (2 if multi else 1)
            where = s.where(P + "pipeline_parallel_schedule") + f" ({'2 stages' if multi else '1 stage'} per rank)"
        stages = stage_layers(n_stages, layers, first_less, last_less, where)
    if len(stages) % pp:
        raise InputError(where, f"{len(stages)} stages", f"a multiple of pp ({pp}) (pipeline_parallel.py:78-86)")
    vpp = len(stages) // pp
    if multi and vpp < 2:
        raise InputError(where, f"{vpp} stage per rank", f"at least 2 for {name} (a multi-stage schedule, pipeline_parallel.py:101)")
    if not multi and vpp != 1:
        raise InputError(where, f"{vpp} stages per rank", f"exactly 1 for {name} (a single-stage schedule, pipeline_parallel.py:93)")
    if sched in ("zb-v", "dualpipe"):
        if vpp != 2:
            raise InputError(where, vpp, f"2 stages per rank for {name} (V style, pipeline_parallel.py:462)")
        ranks = [stages[r] + stages[2 * pp - 1 - r] for r in range(pp)]
    else:
        ranks = [sum(stages[v * pp + r] for v in range(vpp)) for r in range(pp)]
    d.set("parallel.vpp", vpp, "file" if (parts or per_stage_n or multi) else "default", where)
    d.set("parallel.schedule", sched, s.kind(P + "pipeline_parallel_schedule"), s.where(P + "pipeline_parallel_schedule"))
    d.set("parallel.layers_per_stage", tuple(ranks), "file" if parts or per_stage_n else "default", where)
    if len(set(stages)) > 1 and vpp > 1 and len(set(x for x in stages)) > 1:
        d.notes.append(f"virtual stages hold {sorted(set(stages))} layers (torchtitan's split); priced per rank {ranks}")


def _recompute(d: Draft, s: TitanSettings) -> None:
    A = "activation_checkpoint."
    mode = s.get(A + "mode")
    where = s.where(A + "mode")
    if mode == "none":
        d.set("parallel.recompute", "none", s.kind(A + "mode"), where)
    elif mode == "full":
        d.set("parallel.recompute", "full", s.kind(A + "mode"), where)
    elif mode == "selective":
        opt = str(s.get(A + "selective_ac_option"))
        if opt == "op":
            # torchtitan's selective level is its per-op policy (engine memory.selective: op):
            # every second mm, the elementwise kernels and the SP all-gathers re-run (cost.recompute)
            d.set("parallel.recompute", "selective", s.kind(A + "mode"), where + ", selective_ac_option 'op'")
        elif opt.isdigit() and int(opt) >= 1:
            n = int(opt)
            d.set("parallel.recompute", "full", s.kind(A + "mode"), where + f", every {n}th block wrapped")
            if n > 1:
                d.unmodelled.append(f"activation_checkpoint selective_ac_option {n}: every {n}th block fully recomputed, the others keep "
                                    f"their activations; priced as full recompute of every block (memory under-estimated by up to "
                                    f"{100 - 100 // n}% of the activations, recompute time over-estimated)")
        else:
            raise InputError(s.where(A + "selective_ac_option"), opt, "'op' or a positive integer (distributed/activation_checkpoint.py)")
    elif mode == "memory_budget":
        d.set("parallel.recompute", "selective", "file", where)
        d.unmodelled.append(f"activation_checkpoint memory_budget {s.get(A + 'memory_budget')}: compiler-chosen recompute, priced as the per-op selective policy")
    else:
        raise InputError(where, mode, "none, selective, full or memory_budget")
