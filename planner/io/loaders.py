"""Loading at the edge: presets, YAML/JSON files and runs files into frozen specs.

Units are converted here, once: files carry GB/s, GiB, Gb/s and TFLOP/s with the unit in
the key name; specs carry bytes, bytes/s and FLOP/s.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import yaml

from planner.cost.constants import LINK_DEFAULTS, NCCL_CALL_LATENCY_S
from planner.errors import InputError, suggest
from planner.io.presets import read_preset
from planner.io import schema as V
from planner.search.hetero import GpuGroup, HeteroCluster
from planner.specs import (
    Tier,
    ClusterSpec,
    GpuSpec,
    InterNodeNetwork,
    IntraNodeLink,
    Job,
    ModelSpec,
    MoESpec,
    ParallelConfig,
    job_options,
)

__all__ = [
    "load_gpu",
    "load_model",
    "model_from_dict",
    "make_cluster",
    "load_cluster",
    "load_runs",
    "Run",
    "run_from_dict",
    "read_mapping",
]

GIB = 2**30

_MODEL_KEYS = {
    "id", "name", "layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "mlp",
    "tied_embeddings", "head_dim", "moe", "bias", "norm", "q_lora_rank", "kv_lora_rank",
    "qk_rope_head_dim", "v_head_dim", "max_seq_len", "sources", "source", "notes", "family", "published_params_b",
    "position_embedding", "rope_theta", "mtp_layers", "qk_norm",
}


def read_mapping(path: str | Path) -> dict:
    """Read a YAML or JSON file into a mapping, with a one-line error on failure."""
    p = Path(path)
    if not p.is_file():
        raise InputError("file", str(path), "an existing file")
    text = p.read_text()
    try:
        data = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InputError(str(path), "malformed file", f"valid {'JSON' if p.suffix == '.json' else 'YAML'} ({first})") from None
    if not isinstance(data, dict):
        raise InputError(str(path), type(data).__name__, "a mapping at the top level")
    return data


def _num(d: dict, key: str, where: str, default: Any = None) -> Any:
    v = d.get(key, default)
    if v is None:
        raise InputError(f"{where}.{key}", None, "a value")
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise InputError(f"{where}.{key}", v, "a positive number")
    return v


def _int(d: dict, key: str, where: str, default: Any = None) -> int:
    v = d.get(key, default)
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise InputError(f"{where}.{key}", v, "a positive integer")
    return v


# --- GPUs -------------------------------------------------------------------------------------

def gpu_from_dict(d: dict, where: str = "gpu") -> GpuSpec:
    V.check_mapping(d, V.GPU_SCHEMA, where)
    peaks = d.get("peak_tflops") or {}
    if not isinstance(peaks, dict) or not peaks:
        raise InputError(f"{where}.peak_tflops", peaks, "a mapping precision -> dense TFLOP/s")
    ceiling = d.get("matmul_ceiling") or {"bf16": 0.8}
    return GpuSpec(
        id=str(d.get("id", "custom")),
        name=str(d.get("name", d.get("id", "custom"))),
        memory_bytes=float(round(_num(d, "memory_gib", where) * GIB)),  # whole bytes (79.6 GiB is not)
        hbm_bandwidth_bytes_per_s=_num(d, "hbm_bandwidth_gbs", where) * 1e9,
        peak_flops={k: float(v) * 1e12 for k, v in peaks.items()},
        matmul_ceiling={k: float(v) for k, v in ceiling.items()},
        nvlink_bandwidth_bytes_per_s=float(d.get("nvlink_gbs_per_direction", 0) or 0) * 1e9,
        intra_node=str(d.get("intra_node", "nvswitch")),
        nvlink_generation=int(d.get("nvlink_generation", 0) or 0),
        gpus_per_node=_int(d, "gpus_per_node", where, 8),
        nvlink_domain=int(d.get("nvlink_domain") or 0),
        sm_count=_int(d, "sm_count", where, 108),
        tdp_w=float(d.get("tdp_w", 400)),
        sources=tuple(d.get("sources", ()) or ()),
        mx_formats=bool(d.get("mx_formats", False)),
        scale_out=None if not d.get("scale_out") else (str(d["scale_out"].get("kind", "infiniband")),
                                                       float(d["scale_out"]["gbps_per_nic"]), int(d["scale_out"]["nics_per_node"])),
    )


def load_gpu(name_or_path: str) -> GpuSpec:
    """A GPU preset id (``planner hw list``) or a YAML/JSON GPU file.

    >>> load_gpu("a100-sxm4-80gb").peak("bf16") / 1e12
    312.0
    """
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml", ".json") and p.is_file():
        return gpu_from_dict(read_mapping(p), str(p))
    return gpu_from_dict(read_preset("gpus", name_or_path), f"gpu[{name_or_path}]")


# --- Models -----------------------------------------------------------------------------------

def model_from_dict(d: dict, where: str = "model", strict: bool = True) -> ModelSpec:
    if not isinstance(d, dict):
        raise InputError(where, type(d).__name__, "a mapping of model fields")
    V.check_mapping(d if strict else {k: v for k, v in d.items() if k in _MODEL_KEYS}, V.MODEL_SCHEMA, where)
    for key in ("layers", "hidden", "heads", "ffn_hidden", "vocab"):
        _int(d, key, where)
    moe = d.get("moe")
    moe_spec = None
    if moe:
        if not isinstance(moe, dict):
            raise InputError(f"{where}.moe", moe, "a mapping or null")
        try:
            moe_spec = MoESpec(**moe)
        except TypeError as exc:
            raise InputError(f"{where}.moe", moe, f"fields experts, top_k, expert_ffn_hidden, shared_experts, dense_layers ({exc})") from None
    tied = d.get("tied_embeddings")
    sources = d.get("sources") or d.get("source") or ""
    return ModelSpec(
        name=str(d.get("name") or d.get("id") or "model"),
        layers=d["layers"],
        hidden=d["hidden"],
        heads=d["heads"],
        kv_heads=d["heads"] if d.get("kv_heads") is None else d["kv_heads"],
        ffn_hidden=d["ffn_hidden"],
        vocab=d["vocab"],
        mlp=d.get("mlp", "gelu"),
        tied_embeddings=True if tied is None else bool(tied),
        head_dim=d.get("head_dim"),
        moe=moe_spec,
        bias=bool(d.get("bias", d.get("mlp", "gelu") == "gelu")),
        norm=d.get("norm", "layernorm" if d.get("mlp", "gelu") == "gelu" else "rmsnorm"),
        q_lora_rank=int(d.get("q_lora_rank", 0) or 0),
        kv_lora_rank=int(d.get("kv_lora_rank", 0) or 0),
        qk_rope_head_dim=int(d.get("qk_rope_head_dim", 0) or 0),
        v_head_dim=int(d.get("v_head_dim", 0) or 0),
        position_embedding=d.get("position_embedding"),
        rope_theta=None if d.get("rope_theta") is None else float(d["rope_theta"]),
        mtp_layers=int(d.get("mtp_layers", 0) or 0),
        qk_norm=bool(d.get("qk_norm", False)),
        source="; ".join(sources) if isinstance(sources, list) else str(sources),
        max_seq_len=d.get("max_seq_len"),
    )


def load_model(name_or_path: str) -> ModelSpec:
    """A preset id (``planner models list``), a YAML/JSON model file, or a Hugging Face ``config.json``.

    >>> m = load_model("llama3.1-70b")
    >>> m.layers, m.hidden, m.kv_heads, m.mlp
    (80, 8192, 8, 'swiglu')
    """
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml", ".json") or p.is_file():
        if not p.is_file():
            raise InputError("model", str(name_or_path), "an existing model file (YAML, JSON or a Hugging Face config.json) "
                             "or a preset id (planner models list)", flag="--model")
        data = read_mapping(p)
        from planner.io import hf_import  # noqa: PLC0415 (lazy: only for HF configs)

        if hf_import.looks_like_hf_config(data):
            # <repo>/config.json is named after its folder; any other file after itself, unless
            # the config records where it came from.
            name = data.get("_name_or_path") or (p.resolve().parent.name if p.name == "config.json" else p.stem)
            return hf_import.model_from_hf_config(data, name=str(name))
        return model_from_dict(data, str(p))
    return model_from_dict(read_preset("models", name_or_path), f"model[{name_or_path}]")


# --- Clusters ---------------------------------------------------------------------------------

def _intra(gpu: GpuSpec, d: dict | None = None) -> IntraNodeLink:
    d = d or {}
    kind = d.get("kind", gpu.intra_node)
    alpha, eff = LINK_DEFAULTS.get(kind, LINK_DEFAULTS["nvswitch"])
    bw = d.get("gbs_per_direction")
    if bw is None:
        bw = gpu.nvlink_bandwidth_bytes_per_s / 1e9 if kind in ("nvswitch", "nvlink", "xgmi") and gpu.nvlink_bandwidth_bytes_per_s else 32.0
    return IntraNodeLink(
        kind=kind,
        bandwidth_bytes_per_s=float(bw) * 1e9,
        latency_s=float(d.get("latency_us", alpha * 1e6)) * 1e-6,
        efficiency=float(d.get("efficiency", eff)),
        domain_size=int(d.get("domain_size", max(gpu.gpus_per_node, gpu.nvlink_domain))),
    )


def _inter(d: dict | None, where: str = "hardware.inter_node") -> InterNodeNetwork:
    d = dict(d or {"kind": "infiniband", "gbps_per_nic": 400, "nics_per_node": 8})
    kind = d.get("kind", "infiniband")
    if kind not in LINK_DEFAULTS:
        raise InputError(f"{where}.kind", kind, "one of infiniband, roce, ethernet, omnipath")
    alpha, eff = LINK_DEFAULTS[kind]
    return InterNodeNetwork(
        kind=kind,
        gbps_per_nic=float(_num(d, "gbps_per_nic", where)),
        nics_per_node=_int(d, "nics_per_node", where),
        latency_s=float(d.get("latency_us", alpha * 1e6)) * 1e-6,
        efficiency=float(d.get("efficiency", eff)),
        oversubscription=float(d.get("oversubscription", 1.0)),
        rail_optimized=bool(d.get("rail_optimized", True)),
    )


def make_cluster(
    gpu: str | GpuSpec,
    num_gpus: int,
    gpus_per_node: int | None = None,
    inter_node: dict | None = None,
    intra_node: dict | None = None,
    name: str = "custom",
) -> ClusterSpec:
    """A cluster of ``num_gpus`` GPUs of one preset (or GpuSpec): the GPU's node size and
    NVLink domain, and a scale-out network (default 8 x 400 Gb/s InfiniBand per node;
    ``inter_node={"kind", "gbps_per_nic", "nics_per_node", ...}`` to change it).

    >>> c = make_cluster("h100-sxm5-80gb", 128, inter_node={"kind": "roce", "gbps_per_nic": 200, "nics_per_node": 8})
    >>> c.num_nodes, c.inter.kind, c.inter.gbps_per_nic
    (16, 'roce', 200.0)
    """
    g = load_gpu(gpu) if isinstance(gpu, str) else gpu
    gpn = g.gpus_per_node if gpus_per_node is None else gpus_per_node
    V.check_value("hardware.gpus_per_node", gpn, "gpn")
    V.check_value("hardware.num_gpus", num_gpus, "gpus")
    if inter_node is not None:
        V.check_value("hardware.inter_node", inter_node, "inter")
    if intra_node is not None:
        V.check_value("hardware.intra_node", intra_node, "intra")
    intra = dict(intra_node or {})
    intra.setdefault("domain_size", max(gpn, g.nvlink_domain, int((intra_node or {}).get("domain_size", gpn))))
    tiers = ()
    if inter_node and inter_node.get("tiers") is not None:
        tiers = tiers_from_list(inter_node["tiers"])
    if inter_node is None and g.scale_out is not None:  # the GPU's reference node (its preset's scale_out)
        inter_node = dict(zip(("kind", "gbps_per_nic", "nics_per_node"), g.scale_out))
    return ClusterSpec(name=name, gpu=g, num_gpus=num_gpus, gpus_per_node=gpn, intra=_intra(g, intra), inter=_inter(inter_node), tiers=tiers,
                       collective_latency_s=NCCL_CALL_LATENCY_S)


def _cluster_mapping(name_or_path: str) -> tuple[dict, str]:
    """The checked mapping of a cluster preset id or file, and where it came from (for errors)."""
    p = Path(name_or_path)
    d = read_mapping(p) if p.suffix in (".yaml", ".yml", ".json") or p.is_file() else read_preset("clusters", name_or_path)
    where = str(p) if p.is_file() else f"cluster[{name_or_path}]"
    V.check_mapping(d, V.CLUSTER_SCHEMA, where)
    return d, where


def _file_gpu(name, where: str) -> GpuSpec:
    """The GPU preset a file names, an error naming the file's field (not --gpu) when no preset
    or GPU file has that name; errors inside a GPU file keep their own field."""
    try:
        return load_gpu(str(name))
    except InputError as exc:
        if exc.field != "gpu":
            raise
        raise InputError(where, exc.value, exc.expected) from None


def _size_note(d: dict, where: str, name: str, num_gpus: int | None) -> str | None:
    """A note when ``num_gpus`` is more GPUs than the cluster mapping ``d`` describes, else None:
    the cluster is then priced as if its fabric grew to that size (same links, same tiers); a
    mapping without a size takes ``num_gpus`` as it is."""
    if num_gpus is None or d.get("num_gpus") is None:
        return None
    size = _int(d, "num_gpus", where)
    if num_gpus <= size:
        return None
    return (f"--gpus {num_gpus} is more than the {size} GPUs of {d.get('name', name)}; "
            "priced as if its fabric grew to that size (same links, tiers and oversubscription)")


def load_cluster(name_or_path: str, num_gpus: int | None = None, notes: list | None = None) -> ClusterSpec:
    """A cluster preset id (``planner hw list``) or a YAML/JSON cluster file, optionally resized;
    ``notes``: a list that gets a note when ``num_gpus`` grows the cluster past its own size.

    >>> c = load_cluster("gb200-nvl72", num_gpus=144)
    >>> c.gpu.id, c.nvlink_domain
    ('gb200', 72)
    >>> notes = []
    >>> _ = load_cluster("dgx-h100-superpod", num_gpus=2048, notes=notes)
    >>> notes[0][:28]
    '--gpus 2048 is more than the'
    """
    d, where = _cluster_mapping(name_or_path)
    if notes is not None and (note := _size_note(d, where, name_or_path, num_gpus)) is not None:
        notes.append(note)
    return make_cluster(
        _file_gpu(d["gpu"], f"{where}.gpu"),
        num_gpus or _int(d, "num_gpus", where),
        d.get("gpus_per_node"),
        d.get("inter_node"),
        d.get("intra_node"),
        name=str(d.get("name", name_or_path)),
    )


# --- Runs files (schema planner-runs/1) ------------------------------------------------------

_RUNS_FILE_KEYS = {"schema", "runs", "note", "notes", "description", "source", "sources"}
_RUN_KEYS = {"id", "source", "model", "job", "hardware", "parallel", "measured", "notes"}
# planner-runs/1's parallel fields and the planner's extensions a user's own runs may state
# (etp, the overlaps, the dispatcher, CUDA graphs, the attention kernel): the schema's keys
_PARALLEL_KEYS = set(V.PARALLEL_SCHEMA)
_MEASURED_KEYS = {"step_time_s", "basis", "tflops_per_gpu_reported", "mfu_reported_pct", "memory_peak_bytes", "memory_metric"}


class Run:
    """One row of a runs file: specs plus the (possibly partial) parallel block and measurement."""

    def __init__(self, id: str, model: ModelSpec, job: Job, cluster: ClusterSpec, parallel: dict, measured: dict | None, raw: dict):
        self.id = id
        self.model = model
        self.job = job
        self.cluster = cluster
        self.parallel = parallel  # raw dict; None = unknown
        self.measured = measured
        self.raw = raw


def run_from_dict(r: dict, where: str = "run") -> Run:
    if not isinstance(r, dict):
        raise InputError(where, type(r).__name__, "a mapping (one run)")
    rid = str(r.get("id", where))
    w = f"runs[{rid}]"
    V.check_mapping(r, V.RUN_SCHEMA, w)
    for key in ("model", "job", "hardware"):
        if not isinstance(r.get(key), dict):
            raise InputError(f"{w}.{key}", r.get(key), "a mapping")
    model = model_from_dict(r["model"], f"{w}.model")
    j = r["job"]
    job = Job(seq_len=_int(j, "seq_len", f"{w}.job"), global_batch_size=_int(j, "global_batch_size", f"{w}.job"), **job_options(j))
    h = r["hardware"]
    if "gpu" not in h:
        raise InputError(f"{w}.hardware.gpu", None, "a GPU preset id")
    cluster = make_cluster(h["gpu"], _int(h, "num_gpus", f"{w}.hardware"), h.get("gpus_per_node"), h.get("inter_node"), h.get("intra_node"))
    par = dict(r.get("parallel") or {})
    bad = sorted(set(par) - _PARALLEL_KEYS)
    if bad:
        raise InputError(f"{w}.parallel.{bad[0]}", par[bad[0]], "a planner-runs/1 parallel field")
    meas = r.get("measured")
    if meas is not None:
        bad = sorted(set(meas) - _MEASURED_KEYS)
        if bad:
            raise InputError(f"{w}.measured.{bad[0]}", meas[bad[0]], "a planner-runs/1 measured field")
    return Run(rid, model, job, cluster, par, meas, r)


def load_runs(path: str | Path) -> list[Run]:
    """The runs of a ``planner-runs/1`` file (published or your own measurements).

    >>> from planner.calibration.datasets import dataset_path
    >>> runs = load_runs(dataset_path("public"))
    >>> len(runs), runs[0].id
    (32, 'narayanan21-t1-1.7B')
    """
    data = read_mapping(path)
    _known_keys(data, tuple(sorted(_RUNS_FILE_KEYS)), str(path), "a planner-runs/1 top-level field", ": ")
    if data.get("schema") != "planner-runs/1":
        raise InputError(f"{path}.schema", data.get("schema"), "'planner-runs/1'")
    runs = data.get("runs")
    if not isinstance(runs, list) or not runs:
        raise InputError(f"{path}.runs", runs, "a non-empty list of runs")
    return [run_from_dict(r, f"runs[{i}]") for i, r in enumerate(runs)]


def parallel_from_dict(d: dict) -> ParallelConfig:
    """A fully known parallel block (no nulls) into a ParallelConfig."""
    keys = {k: v for k, v in d.items() if k in ParallelConfig.__dataclass_fields__ and v is not None}
    if "layers_per_stage" in keys:
        keys["layers_per_stage"] = tuple(keys["layers_per_stage"])
    return ParallelConfig(**keys)


__all__.append("parallel_from_dict")
__all__.append("gpu_from_dict")


# --- Switch tiers -------------------------------------------------------------------------------

_TIER_KEYS = {"name", "nodes", "oversubscription"}


def tiers_from_list(raw: object) -> tuple[Tier, ...]:
    """Tiers from the YAML form: a list of mappings, or ``{"tiers": [...]}`` (``inter_node``)."""
    if isinstance(raw, dict):
        raw = raw.get("tiers")
    if raw is None:
        return ()
    if not isinstance(raw, (list, tuple)) or not raw:
        raise InputError("inter_node.tiers", raw, "a non-empty list of {name, nodes, oversubscription}")
    out: list[Tier] = []
    for i, t in enumerate(raw):
        if isinstance(t, Tier):
            out.append(t)
            continue
        if not isinstance(t, dict):
            raise InputError(f"inter_node.tiers[{i}]", t, "a mapping with name, nodes, oversubscription")
        bad = sorted(set(t) - _TIER_KEYS)
        if bad:
            raise InputError(f"inter_node.tiers[{i}].{bad[0]}", t[bad[0]], "one of name, nodes, oversubscription")
        out.append(Tier(str(t.get("name", f"tier{i}")), t.get("nodes"), t.get("oversubscription", 1.0)))
    for i, t in enumerate(out[:-1]):
        if t.nodes is None:
            raise InputError(f"inter_node.tiers[{i}].nodes", None, "a node count (only the top tier may omit it)")
    sizes = [t.nodes for t in out if t.nodes is not None]
    if any(b <= a for a, b in zip(sizes, sizes[1:])):
        raise InputError("inter_node.tiers[].nodes", sizes, "node counts increasing from the bottom tier up")
    return tuple(out)



__all__.append("tiers_from_list")


# --- Mixed clusters ----------------------------------------------------------------------------

_HETERO_KEYS = ("name", "groups", "network", "description", "sources", "notes")
_GROUP_KEYS = ("gpu", "count", "gpus_per_node", "inter_node")


def _known_keys(d: dict, known: tuple, where: str, what: str = "a known field name", sep: str = ", ") -> None:
    """InputError naming the first key of ``d`` not in ``known``, with the closest one."""
    for key in d:
        if key not in known:
            hint = suggest(str(key), known)
            raise InputError(f"{where}.{key}", str(key), what + (f" ({hint})" if hint else "") + sep + "one of " + ", ".join(known))


def load_hetero(path: str | Path):
    """A mixed cluster file ``{name, groups: [{gpu, count[, gpus_per_node, inter_node]}],
    network: {kind, gbps_per_nic, nics_per_node}}`` as a :class:`planner.search.hetero.HeteroCluster`."""
    d = read_mapping(path)
    _known_keys(d, _HETERO_KEYS, str(path))
    groups = d.get("groups")
    if not isinstance(groups, list) or not groups:
        raise InputError(f"{path}.groups", groups, "a non-empty list of {gpu, count}")
    net = d.get("network")
    if net is not None and not isinstance(net, dict):
        raise InputError(f"{path}.network", net, "a mapping {kind, gbps_per_nic, nics_per_node}")
    out = []
    for i, g in enumerate(groups):
        w = f"{path}.groups[{i}]"
        if not isinstance(g, dict) or "gpu" not in g:
            raise InputError(w, g, "a mapping with gpu and count")
        _known_keys(g, _GROUP_KEYS, w)
        gpu = _file_gpu(g["gpu"], f"{w}.gpu")
        count = g.get("count")
        gpn = g.get("gpus_per_node", gpu.gpus_per_node)
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise InputError(f"{w}.count", count, "a positive integer")
        if isinstance(gpn, bool) or not isinstance(gpn, int) or gpn < 1 or (count > gpn and count % gpn):
            raise InputError(f"{w}.gpus_per_node", gpn, f"a positive integer dividing count ({count})")
        cluster = make_cluster(gpu, count, gpn, g.get("inter_node", net), name=f"{d.get('name', Path(path).stem)}/{gpu.id}")
        out.append(GpuGroup(cluster, count))
    return HeteroCluster(str(d.get("name", Path(path).stem)), tuple(out))


__all__.append("load_hetero")
