"""Run torchtitan's own config code on emitted configs (one process per torchtitan version).

Started by test_torchtitan_engine.py with that version first on PYTHONPATH. Reads
{"version", "cases"} from stdin; writes one ``RESULT {json}`` line per case. A case is

* ``toml`` (0.2.2): ``ConfigManager().parse_args(["--job.config_file", path])``;
* ``module`` (0.3.0): ``ConfigManager().parse_args(["--module", m, "--config", fn])`` with the
  emitted module's folder on sys.path (Trainer.Config.__post_init__ runs inside: tyro rebuilds it);
* ``flavor``: a registry entry by (name, flavor), for the planner's flavor table.

Per config case, as torchtitan's trainer meets them (0.2.2 train.py / 0.3.0 trainer.py):
tyro type/Literal mismatches made errors (they are only UserWarnings there); ParallelDims with
the plan's world size (the degree product); the schedule class (torch's get_schedule_class);
the pipeline split torchtitan builds (module_fqns_per_model_part, or its own generator from
layers_per_stage) with the stage placement of the schedule (loop or V), every module name
checked against the model; gradient accumulation (global % (local x dp)) and pipeline
microbatches (local % microbatch); converter names (0.2.2 registry); and the model itself,
built on the meta device as the trainer builds it, with its parameter count.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import math
import sys
import traceback
import warnings

import titan_shim  # noqa: F401  (before any torchtitan import)

warnings.filterwarnings("ignore", message=".*PYTORCH_CUDA_ALLOC_CONF.*")


def _parse(args: list[str]):
    from torchtitan.config import ConfigManager

    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # tyro: wrong types / Literal values
        return ConfigManager().parse_args(args)


def _count(model) -> int:
    return int(sum(p.numel() for p in model.parameters()))


def _build_022(cfg):
    import torch
    from torchtitan.protocols.train_spec import get_train_spec

    spec = get_train_spec(cfg.model.name)
    args = copy.deepcopy(spec.model_args[cfg.model.flavor])
    args.update_from_config(cfg)  # train.py:140-150
    with torch.device("meta"):
        model = spec.model_cls(args)
    return model, args.n_layers, spec.pipelining_fn is not None


def _build_030(cfg):
    import torch

    mc = copy.deepcopy(cfg.model_spec.model)
    mc.update_from_config(config=cfg)  # trainer.py:344-367
    with torch.device("meta"):
        model = mc.build()
    return model, len(mc.layers), cfg.model_spec.pipelining_fn is not None, mc


def _stage_ids(schedule_name: str, pp: int, n_stages: int) -> list[list[int]]:
    """Stages of each pp rank (pipeline_parallel.py _get_stage_indices: loop, or V for ZBV/DualPipeV)."""
    from torch.distributed.pipelining.schedules import ScheduleDualPipeV, ScheduleZBVZeroBubble, get_schedule_class

    per = n_stages // pp
    if get_schedule_class(schedule_name) in (ScheduleZBVZeroBubble, ScheduleDualPipeV):
        assert per == 2, f"v schedules assume 2 stages per rank, got {per}"
        return [[r, n_stages - 1 - r] for r in range(pp)]
    return [[r + s * pp for s in range(per)] for r in range(pp)]


def _parts(version: str, par, n_layers: int, model_config, dims) -> list[list[str]]:
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle, get_schedule_class

    if par.module_fqns_per_model_part:
        parts = [list(p) for p in par.module_fqns_per_model_part]
    elif version == "0.2.2":
        from torchtitan.distributed.pipeline_parallel import generate_llm_fqn_per_model_part

        single = issubclass(get_schedule_class(par.pipeline_parallel_schedule), PipelineScheduleSingle)
        inw, outw = par.pipeline_parallel_first_stage_less_layers, par.pipeline_parallel_last_stage_less_layers
        lps = par.pipeline_parallel_layers_per_stage
        # pipeline_parallel.py pipeline_llm (0.2.2): number of virtual stages
        n = math.ceil((n_layers + inw + outw) / lps) if lps is not None else par.pipeline_parallel_degree * (1 if single else 2)
        parts = generate_llm_fqn_per_model_part(n, n_layers, inw, outw)
    else:
        from torchtitan.distributed.pipeline_parallel import _generate_llm_fqn_per_model_part, _get_pipeline_metadata

        n, L, inw, outw = _get_pipeline_metadata(dims, par, model_config)
        parts = _generate_llm_fqn_per_model_part(n, L, inw, outw)
    single = issubclass(get_schedule_class(par.pipeline_parallel_schedule), PipelineScheduleSingle)
    per_rank = len(parts) // par.pipeline_parallel_degree
    assert len(parts) % par.pipeline_parallel_degree == 0, f"{len(parts)} stages for pp {par.pipeline_parallel_degree}"
    assert (per_rank == 1) if single else (per_rank >= 2), f"{per_rank} stages per rank for {par.pipeline_parallel_schedule}"
    return parts


def _float8_converter_022(cfg, dims) -> dict:
    """torchtitan 0.2.2's Float8LinearConverter.__init__ on the parsed config: its recipe and
    all-gather checks (it asserts enable_fsdp_float8_all_gather is off with a recipe_name). On a
    CPU machine float8.emulate stands in for SM89; without torchao a stand-in Float8LinearConfig
    records what the converter asks torchao for (the checks are torchtitan's own code)."""
    import copy
    import types

    try:
        import torchao.float8  # noqa: F401
    except ImportError:
        class _Config:
            def __init__(self, **kw):
                self.kw = kw

            @classmethod
            def from_recipe_name(cls, name):
                return cls(recipe_name=name)

        fake = types.ModuleType("torchao.float8")
        fake.Float8LinearConfig = _Config
        sys.modules.setdefault("torchao", types.ModuleType("torchao"))
        sys.modules["torchao.float8"] = fake
    from torchtitan.components.quantization.float8 import Float8LinearConverter

    job = copy.deepcopy(cfg)
    job.quantize.linear.float8.emulate = True
    job.compile.enable = False  # emulate runs only in eager mode
    conv = Float8LinearConverter(job, dims)
    kw = getattr(conv.config, "kw", {})
    return {"recipe": kw.get("recipe_name", "tensorwise"), "fsdp_float8_all_gather": bool(kw.get("enable_fsdp_float8_all_gather", False)),
            "precompute_scale": bool(conv.precompute_scale)}


def _config_case(version: str, case: dict) -> dict:
    from torch.distributed.pipelining.schedules import get_schedule_class

    if case["kind"] == "toml":
        cfg = _parse(["--job.config_file", case["path"]])
    else:
        sys.path.insert(0, case["dir"])
        cfg = _parse(["--module", case["module"], "--config", case["config"]])
    par, tr = cfg.parallelism, cfg.training
    out: dict = {}
    if version == "0.2.2":
        from torchtitan.distributed.parallel_dims import ParallelDims
        from torchtitan.protocols.model_converter import _registry_model_converter_cls

        dims = ParallelDims(dp_replicate=par.data_parallel_replicate_degree, dp_shard=par.data_parallel_shard_degree,
                            cp=par.context_parallel_degree, tp=par.tensor_parallel_degree, pp=par.pipeline_parallel_degree,
                            ep=par.expert_parallel_degree, etp=par.expert_tensor_parallel_degree, world_size=case["world"])
        unknown = [c for c in cfg.model.converters if c not in _registry_model_converter_cls]
        assert not unknown, f"converters not registered in torchtitan 0.2.2: {unknown}"
        model, n_layers, pipelines = _build_022(cfg)
        mc = None
        f8 = cfg.quantize.linear.float8
        out.update(async_tp=par.enable_async_tensor_parallel, compile=[cfg.compile.enable, list(cfg.compile.components)])
        out.update(model=cfg.model.name, flavor=cfg.model.flavor, etp=par.expert_tensor_parallel_degree,
                   converters=list(cfg.model.converters), ac=cfg.activation_checkpoint.mode,
                   float8={k: getattr(f8, k) for k in ("recipe_name", "enable_fsdp_float8_all_gather",
                                                       "precompute_float8_dynamic_scale_for_fsdp", "filter_fqns")})
        if "quantize.linear.float8" in cfg.model.converters:
            out["float8_converter"] = _float8_converter_022(cfg, dims)
    else:
        from torchtitan.distributed.parallel_dims import ParallelDims

        dims = ParallelDims.from_config(par, case["world"])
        model, n_layers, pipelines, mc = _build_030(cfg)
        ac = cfg.activation_checkpoint
        out.update(async_tp=cfg.compile.enable_async_tensor_parallel, compile=[cfg.compile.enable, list(cfg.compile.components)])
        out.update(model=cfg.model_spec.name, flavor=cfg.model_spec.flavor, ac=None if ac is None else type(ac).__qualname__,
                   sequence_parallel=par.enable_sequence_parallel, disable_cuda_graphs=tr.disable_cuda_graphs)
    batch = dims.dp_replicate * dims.dp_shard
    assert tr.global_batch_size % (tr.local_batch_size * batch) == 0, "global % (local x dp) != 0"
    out.update(params=_count(model), dp_replicate=dims.dp_replicate, dp_shard=dims.dp_shard, tp=dims.tp, pp=dims.pp, cp=dims.cp,
               ep=dims.ep, reshard=par.fsdp_reshard_after_forward, local_batch_size=tr.local_batch_size,
               global_batch_size=tr.global_batch_size, seq_len=tr.seq_len, accumulation=tr.global_batch_size // (tr.local_batch_size * batch),
               hf_assets_path=getattr(cfg.model, "hf_assets_path", None) if version == "0.2.2" else cfg.hf_assets_path)
    assert tr.seq_len % dims.seq_len_divisor == 0, f"seq_len {tr.seq_len} % {dims.seq_len_divisor}"
    if dims.pp > 1:
        assert pipelines, f"{out['model']} has no pipelining_fn in torchtitan {version}"
        get_schedule_class(par.pipeline_parallel_schedule)  # ValueError for an unknown name
        assert tr.local_batch_size % par.pipeline_parallel_microbatch_size == 0, "local % microbatch != 0"
        parts = _parts(version, par, n_layers, mc, dims)
        missing = [n for p in parts for n in p if _missing(model, n)]
        assert not missing, f"module names not in the model: {missing[:5]}"
        out.update(schedule=par.pipeline_parallel_schedule, microbatches=tr.local_batch_size // par.pipeline_parallel_microbatch_size,
                   parts=[sum(1 for n in p if n.startswith("layers.")) for p in parts],
                   stage_ids=_stage_ids(par.pipeline_parallel_schedule, dims.pp, len(parts)),
                   embedding_part=next(i for i, p in enumerate(parts) if "tok_embeddings" in p),
                   output_part=next(i for i, p in enumerate(parts) if "norm" in p))
    return out


def _missing(model, name: str) -> bool:
    try:
        model.get_submodule(name)
        return False
    except AttributeError:
        return True


def _flavor_case(version: str, case: dict) -> dict:
    import torch

    if version == "0.2.2":
        from torchtitan.config import JobConfig
        from torchtitan.protocols.train_spec import get_train_spec

        spec = get_train_spec(case["model"])
        args = copy.deepcopy(spec.model_args[case["flavor"]])
        args.update_from_config(JobConfig())
        with torch.device("meta"):
            model = spec.model_cls(args)
    else:
        import importlib

        registry = importlib.import_module(f"torchtitan.models.{case['model']}").model_registry
        mc = copy.deepcopy(registry(case["flavor"]).model)
        with torch.device("meta"):
            model = mc.build()
    return {"params": _count(model)}


def main() -> None:
    job = json.load(sys.stdin)
    version = job["version"]
    import torchtitan  # noqa: F401

    for case in job["cases"]:
        err = io.StringIO()
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
                res = _flavor_case(version, case) if case["kind"] == "flavor" else _config_case(version, case)
            res.update(name=case["name"], ok=True)
        except BaseException as exc:  # tyro prints its error on stderr and raises SystemExit
            res = {"name": case["name"], "ok": False, "error": f"{type(exc).__name__}: {exc} {err.getvalue()[-1500:]}",
                   "trace": traceback.format_exc()[-3000:]}
        print("RESULT " + json.dumps(res, default=str), flush=True)


if __name__ == "__main__":
    main()
