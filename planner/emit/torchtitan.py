"""torchtitan: the 0.2.2 TOML job config (this module) and the 0.3.0 config module
(:mod:`planner.emit.torchtitan030`), from one set of settings (:func:`titan_settings`).

Only plans torchtitan runs are written: the ``torchtitan`` engine profile
(:func:`planner.emit.common.for_engine`), a model torchtitan ships a flavor for
(:mod:`planner.emit.titan_flavors`), and torchtitan's own rules cited below (0.2.2 paths are
``torchtitan/...`` of the wheel; notes in docs/research/titan_deepspeed.md sec. A, B).

Mapping: ``dp_replicate x dp_shard x cp x tp x pp = world`` (distributed/parallel_dims.py);
the planner's DP is the FSDP axis ``data_parallel_shard_degree`` (HSDP when the plan shards
over ``zero_shard_degree`` ranks only), except a pure data-parallel ZeRO-0 plan, which is DDP
(``data_parallel_replicate_degree``; torchtitan's DDP runs only as the sole parallelism,
llama3/infra/parallelize.py). ZeRO-3 is FSDP2 with ``fsdp_reshard_after_forward = "default"``
(resharded after forward without PP, kept under PP: the engine profile's two modes), ZeRO-2 is
``"never"``. With PP, ``local_batch_size`` is one step's batch per DP rank, split into
``local / pipeline_parallel_microbatch_size`` pipeline microbatches; without PP it is the micro
batch and torchtitan accumulates ``global / (local x dp)`` times (train.py).
"""

from __future__ import annotations

import tomllib

import tomli_w

from planner.engines import fp8_gathers, fp8_recipe, get_engine
from planner.emit.common import LaunchSpec, PlanView, attention_note, chunk_sizes, comment, for_engine, provenance_lines, render_torchrun
from planner.emit.titan_flavors import VERSIONS, Flavor, match_flavor
from planner.errors import InputError

__all__ = ["TITAN_ENGINE", "TORCHTITAN_TARGET", "TITAN_CONFIG", "TITAN_SCRIPT", "titan_settings", "titan_versions", "torchtitan_config",
           "torchtitan_launch_spec", "torchtitan_notes", "torchtitan_files", "SCHEDULES"]

TITAN_ENGINE = "torchtitan"
TORCHTITAN_TARGET = "torchtitan 0.2.2 TOML job config"
TITAN_CONFIG = "torchtitan_job.toml"
TITAN_SCRIPT = "torchtitan_launch.sh"
# The planner's schedules -> torch.distributed.pipelining names (schedules.py get_schedule_class).
SCHEDULES = {"1f1b": "1F1B", "interleaved": "Interleaved1F1B", "gpipe": "GPipe", "zb-v": "ZBVZeroBubble", "dualpipe": "DualPipeV"}
_V_SCHEDULES = ("zb-v", "dualpipe")  # two chunks per rank in a V (pipeline_parallel.py _get_stage_indices)
_OUTPUT = {"0.2.2": "output", "0.3.0": "lm_head"}  # the output layer's module name


def _check(v: PlanView) -> None:
    """torchtitan's own rules beyond the engine profile."""
    p, j = v.parallel, v.job
    if j.precision == "fp16":
        raise InputError("job.precision", "fp16", "bf16 or fp8 for torchtitan (mixed_precision_param is bfloat16 or float32)")
    if p.zero == 0 and p.dp > 1 and (p.tp * p.pp * p.cp * p.ep) > 1:
        raise InputError("parallel.zero", 0, "2 or 3 on torchtitan when dp > 1 is combined with tp/pp/cp/ep "
                         "(its DDP runs only as the sole parallelism: llama3/infra/parallelize.py)")
    divisor = p.tp * 2 * p.cp  # ParallelDims.seq_len_divisor (SP needs tp | seq, CP load balancing 2cp | seq)
    if j.seq_len % divisor:
        raise InputError("job.seq_len", j.seq_len, f"a multiple of tp x 2 x cp = {divisor} for torchtitan")
    shard = p.zero_shard_degree or p.dp
    if p.dp % shard:
        raise InputError("parallel.zero_shard_degree", shard, f"a divisor of dp ({p.dp})")
    if p.pp > 1 and p.schedule in _V_SCHEDULES and p.vpp != 2:
        raise InputError("parallel.vpp", p.vpp, f"2 with torchtitan's {SCHEDULES[p.schedule]} (two stages per rank in a V)")


def _etp(v: PlanView) -> int:
    p = v.parallel
    etp = getattr(p, "etp", None)
    return p.tp if etp is None else etp


def titan_settings(v: PlanView, version: str) -> dict:
    """The job as torchtitan ``version`` runs it (version-neutral keys); InputError if it cannot."""
    v, _ = for_engine(v, TITAN_ENGINE)
    _check(v)
    p, j = v.parallel, v.job
    fl: Flavor = match_flavor(v.model, v.model_id, version)
    if p.pp > 1 and version in fl.no_pipeline:
        raise InputError("parallel.pp", p.pp, f"1 for {fl.name} on torchtitan {version} (its train spec has no pipelining_fn)")
    if p.cp > 1 and version in fl.no_cp:
        raise InputError("parallel.cp", p.cp, f"1 for {fl.name} {fl.flavor} on torchtitan {version} (the flavor's FlexAttention "
                         "does not run context parallelism, only SDPA does)")
    etp = _etp(v)
    if p.ep > 1 and etp not in (1, p.tp):
        raise InputError("parallel.etp", etp, f"1 or tp ({p.tp}) on torchtitan (parallel_dims.py)")
    if version == "0.3.0" and p.ep > 1 and etp != 1:
        raise InputError("parallel.etp", etp, "1 on torchtitan 0.3.0 (expert_tensor_parallel_degree is gone: EP borrows the TP ranks)")
    eng = get_engine(TITAN_ENGINE)
    recipe = fp8_recipe(eng, j)  # InputError for a recipe torchao does not run (e.g. Transformer Engine's delayed)
    if j.fp8_tp_gather:
        raise InputError("job.fp8_tp_gather", True, "false or unset for torchtitan's launch files (0.2.2's apply_tp turns torchao's Float8 TP "
                         "on only when '\"float8\" in model.converters', which its converter name quantize.linear.float8 never "
                         "matches; 0.3.0 has no tensor-wise recipe)")
    if version == "0.3.0" and recipe == "tensorwise":
        raise InputError("job.fp8_recipe", recipe, "rowwise or rowwise_with_gw_hp on torchtitan 0.3.0 (its Float8 converter has no tensorwise recipe)")
    pure_ddp = p.zero == 0 and p.tp * p.pp * p.cp * p.ep == 1
    shard = 1 if (pure_ddp or p.zero == 0) else (p.zero_shard_degree or p.dp)
    s = {
        "flavor": fl, "version": version,
        "dp_replicate": p.dp // shard, "dp_shard": shard, "tp": p.tp, "pp": p.pp, "cp": p.cp, "ep": p.ep, "etp": etp if p.ep > 1 else 1,
        "reshard": "never" if p.zero == 2 else "default",
        "sequence_parallel": bool(p.sequence_parallel) or p.tp == 1,
        "local_batch_size": p.micro_batch_size * (v.num_microbatches if p.pp > 1 else 1),
        "global_batch_size": j.global_batch_size, "seq_len": j.seq_len,
        "ac": p.recompute, "fp8": j.precision == "fp8", "fp8_recipe": recipe, "fp8_gather": fp8_gathers(eng, j, p.zero),
        "hf_assets_path": f"./assets/hf/{fl.hf_repo.split('/')[-1]}",
        # async TP (the plan's tp_comm_overlap): enable_async_tensor_parallel with torch.compile of
        # the model, which torchtitan requires (0.2.2 distributed/tensor_parallel.py, 0.3.0 CompileConfig)
        "async_tp": bool(p.tp_comm_overlap and p.tp > 1),
    }
    # torch.compile's components (0.2.2 job_config.py Compile, 0.3.0 CompileConfig; torchtitan
    # compiles the loss with "loss" among them, components/loss.py): the model for async TP, the
    # loss where the plan was priced with the compiled cross entropy, nothing else.
    s["compile"] = (["model"] if s["async_tp"] else []) + (["loss"] if eng.loss_name(j.cross_entropy) == "compiled" else [])
    if p.pp > 1:
        style = "v" if p.schedule in _V_SCHEDULES else "loop"
        sizes = chunk_sizes(v.stage_layers, p.vpp, style)
        s.update(schedule=SCHEDULES[p.schedule], microbatch_size=p.micro_batch_size, parts=None, layers_per_stage=None)
        if len(set(sizes)) == 1:
            s["layers_per_stage"] = sizes[0]  # with first/last_stage_less_layers 0: pp x vpp equal parts
        else:
            parts, start = [], 0
            for k, n in enumerate(sizes):
                names = (["tok_embeddings"] if k == 0 else []) + [f"layers.{i}" for i in range(start, start + n)]
                parts.append(names + (["norm", _OUTPUT[version]] if k == len(sizes) - 1 else []))
                start += n
            s["parts"] = parts
    return s


def titan_versions(v: PlanView) -> tuple[dict[str, dict], dict[str, str]]:
    """({version: settings} for the versions that run the plan, {version: why not} for the others);
    InputError when neither does (the 0.2.2 reason, or both when they differ)."""
    ok, why = {}, {}
    errors = {}
    for ver in VERSIONS:
        try:
            ok[ver] = titan_settings(v, ver)
        except InputError as exc:
            errors[ver], why[ver] = exc, str(exc)
    if not ok:
        first = errors[VERSIONS[0]]
        if all(e.field == "model" for e in errors.values()):
            match_flavor(v.model, v.model_id, VERSIONS)  # one reason for both versions
        if len(set(why.values())) == 1:
            raise first
        raise InputError(first.field, first.value, first.expected + f" (torchtitan 0.3.0: {why[VERSIONS[1]]})")
    return ok, why


def torchtitan_config(v: PlanView) -> dict:
    """The 0.2.2 TOML document as a dict (InputError when 0.2.2 cannot run the plan)."""
    s = titan_settings(v, "0.2.2")
    fl = s["flavor"]
    par = {
        "data_parallel_replicate_degree": s["dp_replicate"], "data_parallel_shard_degree": s["dp_shard"],
        "fsdp_reshard_after_forward": s["reshard"], "tensor_parallel_degree": s["tp"],
        "pipeline_parallel_degree": s["pp"], "context_parallel_degree": s["cp"],
        "expert_parallel_degree": s["ep"], "expert_tensor_parallel_degree": s["etp"],
    }
    if s["pp"] > 1:
        par.update(pipeline_parallel_schedule=s["schedule"], pipeline_parallel_microbatch_size=s["microbatch_size"])
        if s["parts"] is not None:
            par["module_fqns_per_model_part"] = s["parts"]
        else:
            par.update(pipeline_parallel_layers_per_stage=s["layers_per_stage"],
                       pipeline_parallel_first_stage_less_layers=0, pipeline_parallel_last_stage_less_layers=0)
    model = {"name": fl.name, "flavor": fl.flavor, "hf_assets_path": s["hf_assets_path"]}
    if s["fp8"]:
        model["converters"] = ["quantize.linear.float8"]  # the 0.2.2 name (components/quantization/float8.py:238)
    ac = {"mode": s["ac"]}
    if s["ac"] == "selective":
        ac["selective_ac_option"] = "op"  # op-level selective recompute
    if s["async_tp"]:
        par["enable_async_tensor_parallel"] = True
    doc = {
        "job": {"dump_folder": "./outputs", "description": f"planner {v.model_id} plan rank {v.rank}: {v.degrees_text()}"},
        "model": model,
        "training": {"local_batch_size": s["local_batch_size"], "global_batch_size": s["global_batch_size"],
                     "seq_len": s["seq_len"], "steps": 1000, "mixed_precision_param": "bfloat16",
                     "mixed_precision_reduce": "float32"},  # 0.2.2 accepts only float32 (job_config.py:290)
        "parallelism": par,
        "activation_checkpoint": ac,
    }
    if s["compile"]:
        doc["compile"] = {"enable": True, "components": s["compile"]}
    if s["fp8"]:
        # The output layer stays bf16, as priced (torchtitan's own tomls filter it). Tensor-wise is
        # 0.2.2's recipe_name None: with recipe_name set, its converter asserts that
        # enable_fsdp_float8_all_gather is off (components/quantization/float8.py Float8LinearConverter)
        f8: dict = {"filter_fqns": [_OUTPUT["0.2.2"]]}
        if s["fp8_recipe"] != "tensorwise":
            f8["recipe_name"] = s["fp8_recipe"]
        elif s["fp8_gather"]:  # FSDP gathers FP8 weights, one amax all-reduce a step (job_config.py Float8Linear)
            f8.update(enable_fsdp_float8_all_gather=True, precompute_float8_dynamic_scale_for_fsdp=True)
        doc["quantize"] = {"linear": {"float8": f8}}
    return doc


def torchtitan_notes(v: PlanView) -> list[str]:
    """Notes for whichever torchtitan versions run the plan (InputError when none does)."""
    ok, why = titan_versions(v)
    s = next(iter(ok.values()))
    fl, p = s["flavor"], v.parallel
    notes = [
        f"Model {fl.name} flavor {fl.flavor}. torchtitan checks dp_replicate x dp_shard x cp x tp x pp = world ({v.world}) "
        "and global % (local x dp) == 0.",
        f"Tokenizer: the config reads {s['hf_assets_path']}; fetch it from a torchtitan source checkout of the same version "
        f"(the script is in the repository, not the wheel): python scripts/download_hf_assets.py --repo_id {fl.hf_repo} "
        "--assets tokenizer --hf_token <token>.",
        "Dry run without GPUs: NGPU=<world> COMM_MODE=fake_backend ./run_train.sh (torchtitan repo).",
    ]
    if (note := attention_note(v, "torchtitan")) is not None:
        notes.append(note)
    if v.job.grad_reduce == "bf16":
        notes.append("The prediction reduces gradients in bf16; torchtitan's FSDP reduces in float32 only "
                     "(training.mixed_precision_reduce), so expect twice the gradient traffic.")
    if p.tp > 1 and not p.sequence_parallel and "0.2.2" in ok:
        notes.append("torchtitan 0.2.2 always applies sequence parallelism inside TP (the plan has it off).")
    if s["async_tp"]:
        notes.append("Async TP (the plan's tp_comm_overlap) runs under torch.compile of the model, which the files turn on; "
                     "the prediction prices the overlap of the TP collectives, not the compiler's other fusions.")
    for ver, reason in why.items():
        notes.append(f"No torchtitan {ver} files: {reason}.")
    return notes + for_engine(v, TITAN_ENGINE)[1]


def torchtitan_launch_spec(v: PlanView) -> LaunchSpec:
    """The torchrun program of the 0.2.2 TOML, else of the 0.3.0 module (the SLURM emitter's)."""
    ok, _ = titan_versions(v)
    if "0.2.2" in ok:
        return LaunchSpec(program=["-m", "torchtitan.train"], arg_lines=[["--job.config_file", TITAN_CONFIG]], tail=['"$@"'])
    from planner.emit.torchtitan030 import torchtitan030_launch_spec  # noqa: PLC0415

    return torchtitan030_launch_spec(v)


def _script(v: PlanView, spec: LaunchSpec, target: str, where: str, notes: list[str]) -> str:
    return "".join([
        "#!/usr/bin/env bash\n",
        comment(provenance_lines(v, "torchtitan", target) + notes),
        f"# Run from {where}, the same command on every node with NODE_RANK set.\n",
        "set -euo pipefail\n\n",
        f'NNODES="${{NNODES:-{v.num_nodes}}}"\n',
        'NODE_RANK="${NODE_RANK:-0}"\n',
        'MASTER_ADDR="${MASTER_ADDR:-localhost}"\n',
        'MASTER_PORT="${MASTER_PORT:-29500}"\n',
        'export PYTORCH_ALLOC_CONF="expandable_segments:True"  # as torchtitan\'s run_train.sh\n\n',
        render_torchrun(spec, v.gpus_per_node, "static"),
    ])


def torchtitan_files(v: PlanView) -> dict[str, str]:
    """The files of every torchtitan version that runs the plan (0.2.2 TOML, 0.3.0 module)."""
    v = for_engine(v, TITAN_ENGINE)[0]  # as torchtitan runs it, priced there (the provenance lines' prediction)
    ok, _ = titan_versions(v)
    notes = torchtitan_notes(v)
    files: dict[str, str] = {}
    if "0.2.2" in ok:
        doc = torchtitan_config(v)
        text = comment(provenance_lines(v, "torchtitan", TORCHTITAN_TARGET) + notes) + "\n" + tomli_w.dumps(doc)
        if tomllib.loads(text) != doc:  # the comments must not change the document
            raise AssertionError("torchtitan TOML does not read back")
        spec = LaunchSpec(program=["-m", "torchtitan.train"], arg_lines=[["--job.config_file", TITAN_CONFIG]], tail=['"$@"'])
        files[TITAN_CONFIG] = text
        files[TITAN_SCRIPT] = _script(v, spec, TORCHTITAN_TARGET, "a torchtitan 0.2.2 checkout (pip install torchtitan==0.2.2)", notes)
    if "0.3.0" in ok:
        from planner.emit.torchtitan030 import torchtitan030_files  # noqa: PLC0415

        files.update(torchtitan030_files(v, ok["0.3.0"], notes, _script))
    return files
