"""Validation at the edge: file schemas, and why no parallel configuration is admissible.

:func:`check_mapping` checks one mapping read from a file (model, GPU, cluster, runs file)
against a small hand-written schema before :mod:`planner.io.loaders` converts units: unknown
keys, missing keys, wrong types, zero / negative / NaN / absurd values, each ending in one
:class:`planner.errors.InputError` (field, value, expected).
"""

from __future__ import annotations

import math
from typing import Any, Callable

from planner.errors import InputError, suggest
from planner.specs import ATTENTION_KINDS, CROSS_ENTROPY, FP8_RECIPES

__all__ = [
    "MODEL_SCHEMA",
    "MOE_SCHEMA",
    "GPU_SCHEMA",
    "CLUSTER_SCHEMA",
    "INTRA_SCHEMA",
    "INTER_SCHEMA",
    "RUN_SCHEMA",
    "JOB_SCHEMA",
    "HARDWARE_SCHEMA",
    "PARALLEL_SCHEMA",
    "MEASURED_SCHEMA",
    "check_mapping",
    "check_value",
]

# --- value kinds -----------------------------------------------------------------------------
# Each kind is (predicate, expectation). A trailing "?" in a schema entry allows null.


def _is_num(v: object) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _bounded(pred: Callable[[object], bool], hi: float) -> Callable[[object], bool]:
    return lambda v: pred(v) and v <= hi


_KINDS: dict[str, tuple[Callable[[object], bool], str]] = {
    "int+": (lambda v: _is_int(v) and v >= 1, "a positive integer"),
    "int0": (lambda v: _is_int(v) and v >= 0, "a non-negative integer"),
    "num+": (lambda v: _is_num(v) and v > 0, "a positive finite number"),
    "num0": (lambda v: _is_num(v) and v >= 0, "a non-negative finite number"),
    "frac": (lambda v: _is_num(v) and 0 < v <= 1, "a fraction in (0, 1]"),
    "ratio>=1": (lambda v: _is_num(v) and v >= 1, "a ratio >= 1"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "str": (lambda v: isinstance(v, str) and v != "", "a non-empty string"),
    "text": (lambda v: isinstance(v, (str, list)), "a string or a list of strings"),
    "map": (lambda v: isinstance(v, dict), "a mapping"),
    "list": (lambda v: isinstance(v, list), "a list"),
    "any": (lambda v: True, "anything"),
    # Plausibility caps: beyond these the input is a typo, and the search would not be bounded.
    "layers": (_bounded(lambda v: _is_int(v) and v >= 1, 100_000), "a positive integer up to 100,000"),
    "width": (_bounded(lambda v: _is_int(v) and v >= 1, 10_000_000), "a positive integer up to 10,000,000"),
    "vocab": (_bounded(lambda v: _is_int(v) and v >= 1, 100_000_000), "a positive integer up to 100,000,000"),
    "gpus": (_bounded(lambda v: _is_int(v) and v >= 1, 10_000_000), "a positive integer up to 10,000,000"),
    "gpn": (_bounded(lambda v: _is_int(v) and v >= 1, 1_024), "a positive integer up to 1,024"),
    "gib": (_bounded(lambda v: _is_num(v) and v > 0, 1e6), "a positive number of GiB up to 1,000,000"),
    "seq": (_bounded(lambda v: _is_int(v) and v >= 1, 16_777_216), "a positive integer up to 16,777,216"),
    "gbs": (_bounded(lambda v: _is_int(v) and v >= 1, 16_777_216), "a positive integer up to 16,777,216"),
}


def _choice(*options: str) -> tuple[Callable[[object], bool], str]:
    return (lambda v: v in options, "one of " + ", ".join(options))


MLP = _choice("gelu", "swiglu", "relu2")
NORM = _choice("layernorm", "rmsnorm")
PRECISION = _choice("fp16", "bf16", "fp8")
INTRA_KIND = _choice("nvswitch", "nvlink", "pcie", "xgmi")
INTER_KIND = _choice("infiniband", "roce", "ethernet", "omnipath", "none")
RECOMPUTE = _choice("none", "selective", "full")
# The shared runs schema's schedules (``zb``: the Zero Bubble fork's automatic schedule) and the
# planner's named ones (planner.cost.step.SCHEDULE_FORMS), so a runs file can state a ZB-H1 run.
SCHEDULE = _choice("1f1b", "interleaved", "gpipe", "zb", "zb-h1", "zb-h2", "zb-v", "dualpipe")
ZERO = (lambda v: _is_int(v) and v in (0, 1, 2, 3), "0, 1, 2 or 3")
INT_LIST = (lambda v: isinstance(v, list) and bool(v) and all(_is_int(x) and x >= 0 for x in v), "a list of non-negative integers")

Schema = dict[str, Any]  # key -> kind name | (predicate, expectation) | nested Schema; "!" prefix = required

MOE_SCHEMA: Schema = {
    "!experts": "int+", "!top_k": "int+", "!expert_ffn_hidden": "width", "shared_experts": "int0",
    "dense_layers": "int0", "capacity_factor": "num+?",
}
MODEL_SCHEMA: Schema = {
    "!layers": "layers", "!hidden": "width", "!heads": "width", "kv_heads": "width?", "!ffn_hidden": "width",
    "!vocab": "vocab", "mlp": MLP, "tied_embeddings": "bool?", "head_dim": "width?", "moe": "moe?", "bias": "bool",
    "norm": NORM, "q_lora_rank": "int0?", "kv_lora_rank": "int0?", "qk_rope_head_dim": "int0?", "v_head_dim": "int0?",
    "position_embedding": _choice("rope", "learned"), "rope_theta": "num+?", "mtp_layers": "int0?", "qk_norm": "bool?",
    "max_seq_len": "int+?", "id": "any", "name": "any", "sources": "any", "source": "any", "notes": "any",
    "family": "any", "published_params_b": "num+?",
}
_PEAKS = (lambda v: isinstance(v, dict) and bool(v) and all(_is_num(x) and x > 0 for x in v.values()), "a mapping precision -> positive TFLOP/s")
_CEIL = (lambda v: isinstance(v, dict) and all(_is_num(x) and 0 < x <= 1 for x in v.values()), "a mapping precision -> fraction in (0, 1]")
GPU_SCHEMA: Schema = {
    "!memory_gib": "gib", "!hbm_bandwidth_gbs": "num+", "!peak_tflops": _PEAKS, "matmul_ceiling": _CEIL,
    "nvlink_gbs_per_direction": "num0?", "intra_node": INTRA_KIND, "nvlink_generation": "int0?",
    "gpus_per_node": "gpn", "nvlink_domain": "int0?", "sm_count": "int+", "tdp_w": "num+", "id": "any", "name": "any", "sources": "any",
    "notes": "any", "mx_formats": "bool", "scale_out": "inter?",
}
INTRA_SCHEMA: Schema = {"kind": INTRA_KIND, "gbs_per_direction": "num+", "latency_us": "num0", "efficiency": "frac", "domain_size": "gpus"}
INTER_SCHEMA: Schema = {
    "kind": INTER_KIND, "gbps_per_nic": "num+", "nics_per_node": "int+", "latency_us": "num0", "efficiency": "frac",
    "oversubscription": "ratio>=1", "rail_optimized": "bool", "tiers": "any", "id": "any", "name": "any",
    "sources": "any", "notes": "any",
}
CLUSTER_SCHEMA: Schema = {
    "!gpu": "str", "num_gpus": "gpus", "gpus_per_node": "gpn?", "inter_node": "inter?", "intra_node": "intra?",
    "id": "any", "name": "any", "sources": "any", "notes": "any",
}
GRAD_REDUCE = _choice("auto", "fp32", "bf16")
FP8_RECIPE = _choice(*FP8_RECIPES)
CROSS_ENTROPY_CHOICE = _choice(*CROSS_ENTROPY)
JOB_SCHEMA: Schema = {"!seq_len": "seq", "!global_batch_size": "gbs", "precision": PRECISION, "grad_reduce": GRAD_REDUCE,
                      "fp8_recipe": FP8_RECIPE, "fp8_param_gather": "bool?",
                      "fp8_tp_gather": "bool?", "cross_entropy": CROSS_ENTROPY_CHOICE}
HARDWARE_SCHEMA: Schema = {"!gpu": "str", "!num_gpus": "gpus", "gpus_per_node": "gpn?", "inter_node": "inter?", "intra_node": "intra?"}
PARALLEL_SCHEMA: Schema = {
    "tp": "int+?", "pp": "int+?", "dp": "int+?", "cp": "int+?", "ep": "int+?", "vpp": "int+?",
    "micro_batch_size": "int+?", "recompute": RECOMPUTE, "sequence_parallel": "bool?", "zero": ZERO,
    "schedule": SCHEDULE, "num_microbatches": "int+?", "layers_per_stage": INT_LIST, "zero_shard_degree": "int+?",
    "etp": "int+?", "moe_a2a_overlap": "bool?", "moe_dispatcher": _choice("alltoall", "deepep", "hybridep"),
    "cuda_graph": _choice("none", "layer", "full_iteration"),  # the planner's extensions (a user's own runs may state them)
    "attention": _choice(*ATTENTION_KINDS), "tp_comm_overlap": "bool?",
}
MEASURED_SCHEMA: Schema = {
    "step_time_s": "num+?", "basis": "any", "tflops_per_gpu_reported": "num+?", "mfu_reported_pct": "num+?",
    "memory_peak_bytes": "num+?", "memory_metric": "any",
}
RUN_SCHEMA: Schema = {
    "id": "any", "source": "any", "notes": "any", "!model": "map", "!job": "job", "!hardware": "hardware",
    "parallel": "parallel?", "measured": "measured?",
}
_NESTED: dict[str, Schema] = {
    "moe": MOE_SCHEMA, "inter": INTER_SCHEMA, "intra": INTRA_SCHEMA, "job": JOB_SCHEMA,
    "hardware": HARDWARE_SCHEMA, "parallel": PARALLEL_SCHEMA, "measured": MEASURED_SCHEMA,
}
# Choices may be null (= the default) as well.
for _schema in (MODEL_SCHEMA, GPU_SCHEMA, INTRA_SCHEMA, INTER_SCHEMA, JOB_SCHEMA, PARALLEL_SCHEMA):
    for _k, _v in list(_schema.items()):
        if isinstance(_v, tuple):
            _schema[_k] = (lambda p: (lambda v: v is None or p(v)))(_v[0]), _v[1]


def check_value(field: str, value: object, kind: Any) -> None:
    """Raise InputError when ``value`` is not of ``kind`` (a kind name, "name?" for nullable,
    a (predicate, expectation) pair, or a nested schema name)."""
    if isinstance(kind, tuple):
        pred, expected = kind
        if not pred(value):
            raise InputError(field, value, expected)
        return
    nullable = kind.endswith("?")
    name = kind.rstrip("?")
    if value is None:
        if nullable:
            return
        raise InputError(field, None, _KINDS[name][1] if name in _KINDS else "a mapping")
    if name in _NESTED:
        if not isinstance(value, dict):
            raise InputError(field, value, "a mapping")
        if value or name != "moe":
            check_mapping(value, _NESTED[name], field)
        return
    pred, expected = _KINDS[name]
    if not pred(value):
        raise InputError(field, value, expected)


# Hugging Face config.json names a model YAML is often written with, for the did-you-mean of an
# unknown key (the planner's own names are the schema's).
HF_KEY_ALIASES = {"num-layers": "layers", "num-hidden-layers": "layers", "hidden-size": "hidden",
                  "num-attention-heads": "heads", "num-key-value-heads": "kv_heads", "intermediate-size": "ffn_hidden",
                  "vocab-size": "vocab", "max-position-embeddings": "max_seq_len", "tie-word-embeddings": "tied_embeddings"}


def check_mapping(data: object, schema: Schema, where: str) -> None:
    """Check a mapping read from a file: unknown keys, missing required keys, value kinds."""
    if not isinstance(data, dict):
        raise InputError(where, type(data).__name__, "a mapping")
    keys = {k.lstrip("!"): v for k, v in schema.items()}
    for key in data:
        if key not in keys:
            known = sorted(k for k, v in keys.items() if v != "any")
            hint = suggest(str(key), known, HF_KEY_ALIASES)
            raise InputError(f"{where}.{key}", str(key), f"a known field name{f' ({hint})' if hint else ''}, one of {', '.join(known)}")
    for raw, kind in schema.items():
        key = raw.lstrip("!")
        if key not in data:
            if raw.startswith("!"):
                raise InputError(f"{where}.{key}", None, "a value (required field missing)")
            continue
        check_value(f"{where}.{key}", data[key], kind)
