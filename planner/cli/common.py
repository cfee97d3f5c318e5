"""Shared CLI plumbing: turning flags or a scenario into specs, and the plan JSON document."""

from __future__ import annotations

import json
import sys
import dataclasses
from contextvars import ContextVar
from dataclasses import dataclass, field

from planner import __version__
from planner.errors import InputError
from planner.io.loaders import load_cluster, load_model, make_cluster, read_mapping, run_from_dict
from planner.calibration.values import Calibration
from planner.engines import AUTO, DEFAULT_ENGINE, get_engine
from planner.search.space import SearchOptions
from planner.specs import ATTENTION_KINDS, ClusterSpec, Job, ModelSpec
from planner.units import fmt_precision

__all__ = ["Setup", "setup_from_cli", "setup_from_flags", "setup_from_scenario", "fixed_from_flags", "plan_document", "emit_json", "DEFAULTS",
           "SCENARIO_RUN"]

# The scenario run the command prices ("run ID of FILE"), set by setup_from_scenario: the CLI's
# one-line error names it, so a refusal of a value read from the file says which run it came from.
SCENARIO_RUN: ContextVar[str | None] = ContextVar("SCENARIO_RUN", default=None)

# The built-in example: Llama 3.1 70B on 64 H100 (8 DGX H100 nodes, 8 x 400 Gb/s NDR each),
# 8K sequence, 2M-token global batch. It is the one default cluster of every command that
# takes a cluster (plan, estimate, goodput, collective, chart scaling, sweep).
DEFAULTS = {"model": "llama3.1-70b", "gpu": "h100-sxm5-80gb", "gpus": 64, "seq_len": 8192, "global_batch_size": 256, "precision": "bf16"}


@dataclass
class Setup:
    """What every pricing command needs: specs, the fixed fields, the engine and the calibration."""

    model: ModelSpec
    cluster: ClusterSpec
    job: Job
    fixed: dict
    model_id: str
    gpu_id: str
    engine: str = DEFAULT_ENGINE
    calibration: Calibration = field(default_factory=Calibration)
    notes: list[str] = field(default_factory=list)  # about the setup itself (a cluster preset grown past its size)

    @property
    def constants(self):
        return self.calibration.constants

    def options(self, **kw) -> SearchOptions:
        """The search options of this setup (its fixed fields and engine)."""
        return SearchOptions(fixed=self.fixed, engine=self.engine, **kw)

    def best(self, **kw):
        """The best plan of this setup (``planner.plan`` with top_k=1, its engine and calibration)."""
        from planner.search.plan import plan  # noqa: PLC0415

        return plan(self.model, self.cluster, self.job, top_k=1, options=self.options(**kw), constants=self.constants).plans[0]

    def with_profile(self, profile: str | None) -> "Setup":
        """This setup with the calibration of a profile file (``planner calibrate --out``), if given."""
        if profile:
            from planner.calibration.fit import load_profile  # noqa: PLC0415
            from planner.calibration.profile import calibration_from_profile  # noqa: PLC0415

            self.calibration = calibration_from_profile(load_profile(profile))
            self.cluster = self.calibration.cluster(self.cluster)
        return self


def fixed_from_flags(**kw) -> dict:
    """Non-None parallel flags become fixed constraints (names as in ParallelConfig)."""
    fixed = {k: v for k, v in kw.items() if v is not None}
    if "recompute" in fixed and fixed["recompute"] not in ("none", "selective", "full"):
        raise InputError("--recompute", fixed["recompute"], "none, selective or full")
    if "schedule" in fixed:
        from planner.cli.options import schedule_name  # noqa: PLC0415
        from planner.cost.step import SCHEDULE_FORMS  # noqa: PLC0415

        fixed["schedule"] = schedule_name(fixed["schedule"])
        if fixed["schedule"] not in SCHEDULE_FORMS:
            raise InputError("--schedule", fixed["schedule"], " | ".join(SCHEDULE_FORMS))
        if fixed["schedule"] == "1f1b" and fixed.get("vpp", 1) > 1:  # ParallelConfig would turn it interleaved
            raise InputError("--vpp", fixed["vpp"], "1 with --schedule 1f1b (virtual stages are the interleaved schedule: --schedule interleaved)")
    if "zero" in fixed and fixed["zero"] not in (0, 1, 2, 3):
        raise InputError("--zero", fixed["zero"], "0, 1, 2 or 3")
    from planner.specs import CUDA_GRAPHS, MOE_DISPATCHERS  # noqa: PLC0415

    for k, allowed in (("cuda_graph", CUDA_GRAPHS), ("moe_dispatcher", MOE_DISPATCHERS)):
        if k in fixed and fixed[k] not in allowed:
            raise InputError(f"--{k.replace('_', '-')}", fixed[k], " | ".join(allowed))
    for k in ("tp", "pp", "dp", "cp", "ep", "vpp", "micro_batch_size"):
        if k in fixed and fixed[k] < 1:
            raise InputError(f"--{k.replace('_', '-')}", fixed[k], "a positive integer")
        if k in fixed and fixed[k] > 10_000_000:
            raise InputError(f"--{k.replace('_', '-')}", fixed[k], "at most 10,000,000")
    return fixed


def _default(value, key: str):
    """The flag's value, or the built-in default when the flag was not given (0 is a value)."""
    return DEFAULTS[key] if value is None else value


def _flag(name: str, value, kind: str) -> None:
    if value is not None:
        from planner.io.schema import check_value  # noqa: PLC0415

        check_value(name, value, kind)


def _attention(flag: str | None) -> str | None:
    """``--attention``: flash | fa2 | fa1 | unfused | auto (None: the engine's kernel for the GPU)."""
    if flag is None or flag == "auto":
        return None
    if flag not in ATTENTION_KINDS:
        raise InputError("--attention", flag, "flash, fa2, fa1, unfused or auto")
    return flag


def setup_from_flags(
    model: str | None, gpu: str | None, gpus: int | None, gpus_per_node: int | None, cluster: str | None,
    nic_gbps: float | None, nics_per_node: int | None, network: str | None,
    seq_len: int | None, global_batch_size: int | None, precision: str | None, attention: str | None, fixed: dict,
) -> Setup:
    model_id = _default(model, "model")
    if not model_id:
        raise InputError("--model", model_id, "a model preset id or a model file")
    _flag("--gpus", gpus, "gpus")
    _flag("--gpus-per-node", gpus_per_node, "gpn")
    _flag("--nic-gbps", nic_gbps, "num+")
    _flag("--nics-per-node", nics_per_node, "int+")
    _flag("--seq-len", seq_len, "seq")
    _flag("--global-batch-size", global_batch_size, "gbs")
    m = load_model(model_id)
    if cluster:
        notes: list[str] = []
        c = load_cluster(cluster, num_gpus=gpus, notes=notes)  # the cluster file read once, its note beside it
        gpu_id = c.gpu.id
        if gpu and gpu != gpu_id:
            raise InputError("--gpu", gpu, f"the cluster's GPU ({gpu_id}) or nothing when --cluster is given")
    else:
        notes = []
        gpu_id = _default(gpu, "gpu")
        inter = None
        if nic_gbps is not None or nics_per_node is not None or network is not None:
            if network is not None and network not in ("infiniband", "roce", "ethernet", "omnipath"):
                raise InputError("--network", network, "one of infiniband, roce, ethernet, omnipath")
            from planner.io.loaders import load_gpu  # noqa: PLC0415

            # the flags not given keep the GPU's reference node (its preset's scale_out), else 8 x 400 Gb/s InfiniBand
            kind0, gbps0, nics0 = load_gpu(gpu_id).scale_out or ("infiniband", 400.0, 8)
            inter = {"kind": _none(network, kind0), "gbps_per_nic": _none(nic_gbps, gbps0), "nics_per_node": _none(nics_per_node, nics0)}
        c = make_cluster(gpu_id, _default(gpus, "gpus"), gpus_per_node, inter)
    job = Job(_default(seq_len, "seq_len"), _default(global_batch_size, "global_batch_size"), _default(precision, "precision"))
    return Setup(m, c, job, fixed, model_id, gpu_id, notes=notes)


def _none(value, default):
    return default if value is None else value


def setup_from_scenario(path: str, run_id: str | None) -> Setup:
    """The setup of one run of a runs/scenario file (or of a shipped set, by name: ``public``...)."""
    from pathlib import Path  # noqa: PLC0415

    from planner.calibration.datasets import SETS, dataset_path  # noqa: PLC0415

    shown = path  # a shipped set by its name
    if path in SETS and not Path(path).exists():
        path = str(dataset_path(path))
    data = read_mapping(path)
    runs = data.get("runs") if isinstance(data.get("runs"), list) else [data]
    if run_id is None:
        if len(runs) != 1:
            raise InputError("--id", None, f"one of the {len(runs)} run ids in {path}")
        raw = runs[0]
    else:
        matches = [r for r in runs if isinstance(r, dict) and r.get("id") == run_id]
        if not matches:
            ids = [r.get("id") for r in runs if isinstance(r, dict)]
            from planner.io.presets import suggest  # noqa: PLC0415

            hint = suggest(run_id, [str(i) for i in ids])
            raise InputError("--id", run_id, f"a run id in {path}" + (f" ({hint})" if hint else ""))
        raw = matches[0]
    run = run_from_dict(raw, f"runs[{run_id}]")
    SCENARIO_RUN.set(f"run {run.id} of {shown}")
    from planner.calibration.datasets import run_engine  # noqa: PLC0415
    from planner.calibration.validate import fixed_fields, with_sidecars  # noqa: PLC0415

    run, _ = with_sidecars(run)  # as validate reads it (the source's model fields, the recipe's)

    return Setup(run.model, run.cluster, run.job, fixed_fields(run.parallel), raw["model"].get("name", run.id), run.cluster.gpu.id,
                 engine=run_engine(run.id)[0])


def precision_text(job: Job, engine: str | None) -> str:
    """The job's precision as the tables head it: "fp8 (rowwise)" with the recipe the engine runs."""
    if job.precision != "fp8" or not engine or engine == AUTO:
        return job.precision
    from planner.engines import fp8_recipe  # noqa: PLC0415

    return fmt_precision("fp8", fp8_recipe(get_engine(engine), job), False, bool(job.fp8_tp_gather))


def with_job_flags(job: Job, **flags) -> Job:
    """``job`` with the job flags that were given (fp8_recipe, fp8_param_gather, fp8_tp_gather,
    cross_entropy; None: left as it is); Job checks them, the engine's lists when priced."""
    extra = {k: v for k, v in flags.items() if v is not None}
    return dataclasses.replace(job, **extra) if extra else job


def setup_from_cli(model, gpu, gpus, gpus_per_node, cluster, nic_gbps, nics_per_node, network, seq_len,
                   global_batch_size, precision, attention, scenario, run_id, engine=None, grad_reduce=None, profile=None,
                   allow_auto: bool = False, fp8_recipe=None, fp8_param_gather=None, fp8_tp_gather=None, cross_entropy=None,
                   **parallel) -> Setup:
    """The setup of every pricing command: from a scenario (its non-null parallel fields fixed,
    then the flags') or from flags; ``parallel`` holds the parallel flags (None = free or the
    engine's default); ``engine`` names the engine (default :data:`planner.engines.DEFAULT_ENGINE`,
    or the scenario run's; ``allow_auto``: the command takes ``auto``); ``profile`` a calibration profile file."""
    fixed = fixed_from_flags(**parallel)
    if _attention(attention) is not None:
        fixed["attention"] = _attention(attention)
    if scenario:
        setup = setup_from_scenario(scenario, run_id)
        setup.fixed.update(fixed)
    else:
        setup = setup_from_flags(model, gpu, gpus, gpus_per_node, cluster, nic_gbps, nics_per_node, network,
                                 seq_len, global_batch_size, precision, attention, fixed)
    if engine is not None:
        # InputError naming the engines on anything else; "auto" (search every engine) is plan's
        setup.engine = AUTO if str(engine).lower() == AUTO and allow_auto else get_engine(engine).name
    if grad_reduce is not None:
        setup.job = dataclasses.replace(setup.job, grad_reduce=grad_reduce)  # validated by Job
    setup.job = with_job_flags(setup.job, fp8_recipe=fp8_recipe, fp8_param_gather=fp8_param_gather, fp8_tp_gather=fp8_tp_gather,
                               cross_entropy=cross_entropy)
    return setup.with_profile(profile)


def plan_document(setup: Setup, plans: list, search: dict | None) -> dict:
    """The ``planner-plan/1`` document (``plan --json``), read back by ``launch`` and ``timeline``."""
    m, c, j = setup.model, setup.cluster, setup.job
    model = {
        "id": setup.model_id, "name": m.name, "layers": m.layers, "hidden": m.hidden, "heads": m.heads,
        "kv_heads": m.kv_heads, "ffn_hidden": m.ffn_hidden, "vocab": m.vocab, "mlp": m.mlp,
        "tied_embeddings": m.tied_embeddings, "head_dim": m.head_dim, "bias": m.bias, "norm": m.norm,
        "moe": None if m.moe is None else {"experts": m.moe.experts, "top_k": m.moe.top_k, "expert_ffn_hidden": m.moe.expert_ffn_hidden, "shared_experts": m.moe.shared_experts, "dense_layers": m.moe.dense_layers,
                                            "capacity_factor": m.moe.capacity_factor},
        "q_lora_rank": m.q_lora_rank, "kv_lora_rank": m.kv_lora_rank, "qk_rope_head_dim": m.qk_rope_head_dim, "v_head_dim": m.v_head_dim,
        "position_embedding": m.position_embedding, "rope_theta": m.rope_theta, "mtp_layers": m.mtp_layers, "qk_norm": m.qk_norm,
    }
    hardware = {
        "gpu": c.gpu.id, "num_gpus": c.num_gpus, "gpus_per_node": c.gpus_per_node, "num_nodes": c.num_nodes,
        "nvlink_domain": c.nvlink_domain, "memory_bytes_per_gpu": round(c.gpu.memory_bytes),
        "inter_node": {"kind": c.inter.kind, "gbps_per_nic": c.inter.gbps_per_nic, "nics_per_node": c.inter.nics_per_node,
                       "latency_us": c.inter.latency_s * 1e6, "efficiency": c.inter.efficiency,
                       "oversubscription": c.inter.oversubscription, "rail_optimized": c.inter.rail_optimized,
                       **({"tiers": [{"name": t.name, "nodes": t.nodes, "oversubscription": t.oversubscription}
                                     for t in c.tiers]} if c.tiers else {})},
        "intra_node": {"kind": c.intra.kind, "gbs_per_direction": c.intra.bandwidth_bytes_per_s / 1e9,
                       "latency_us": c.intra.latency_s * 1e6, "efficiency": c.intra.efficiency,
                       "domain_size": c.intra.domain_size},
    }
    doc = {
        "schema": "planner-plan/1",
        "planner_version": __version__,
        "model": model,
        "job": j.as_dict(),
        "hardware": hardware,
        "engine": setup.engine,
        "constants": _changed_constants(setup.constants),
        "constraints": setup.fixed,
        "plans": [p.as_dict() for p in plans],
    }
    if search is not None:
        doc["search"] = search
    if setup.notes:
        doc["notes"] = list(setup.notes)
    return doc


def _changed_constants(c) -> dict:
    """The calibration constants that differ from the published defaults (a profile's fit)."""
    from planner.cost.constants import DEFAULT_CONSTANTS  # noqa: PLC0415

    base = DEFAULT_CONSTANTS.as_dict()
    return {k: v for k, v in c.as_dict().items() if v != base[k]}


def emit_json(doc: dict) -> None:
    json.dump(doc, sys.stdout, indent=2, default=_json_default)
    sys.stdout.write("\n")


def _json_default(o):
    if isinstance(o, tuple):
        return list(o)
    raise TypeError(type(o).__name__)
