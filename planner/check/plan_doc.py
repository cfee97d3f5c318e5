"""The planner's own files: a plan document (``planner plan --json``, schema planner-plan/1, or
``planner estimate --json``) and what ``planner launch`` wrote.

A plan document holds everything: the model, the hardware (network included), the job, the
engine and each plan's resolved configuration. A launch file holds what its engine's format
can hold, plus provenance the emitters write into every file (comments; the ``_planner`` key of
the DeepSpeed JSON): the model id, the GPU and its count, the plan's degrees and layer split.
:func:`provenance` reads that text generally (``key=value`` pairs, ``N x <gpu preset>``,
``model <preset>``), not line by line, so a changed wording still reads; it fills only what
the format itself cannot say.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from planner.check.job import Draft
from planner.errors import InputError
from planner.io.loaders import load_model, model_from_dict
from planner.io.presets import preset_ids
from planner.specs import Job

__all__ = ["read_plan_doc", "is_plan_doc", "provenance", "apply_provenance"]


def is_plan_doc(doc) -> bool:
    return isinstance(doc, dict) and str(doc.get("schema", "")).startswith(("planner-plan/", "planner-estimate/"))


def read_plan_doc(path: Path, doc: dict, rank: int | None = None) -> Draft:
    name = path.name
    plans = doc.get("plans")
    if not isinstance(plans, list) or not plans:
        raise InputError(f"{name}: plans", plans, "a non-empty list of ranked plans")
    rank = rank or 1
    chosen = next((p for p in plans if isinstance(p, dict) and p.get("rank") == rank), None)
    if chosen is None:
        raise InputError(f"{name}: plan rank", rank, f"one of {[p.get('rank') for p in plans if isinstance(p, dict)]} (FILE.json:RANK)")
    engine = chosen.get("engine") or doc.get("engine")  # a plan's own engine (--engine auto)
    d = Draft(fmt="plan", engine=str(engine if engine and engine != "auto" else "megatron-core"), files=[str(path)])
    m = doc.get("model")
    if not isinstance(m, dict):
        raise InputError(f"{name}: model", m, "the plan's model block")
    model = model_from_dict({k: v for k, v in m.items() if v is not None}, f"{name}: model", strict=False)
    d.model, d.model_id = model, str(m.get("id") or m.get("name") or "model")
    hw = doc.get("hardware") or {}
    for key in ("gpu", "num_gpus", "gpus_per_node"):
        if hw.get(key) is not None:
            d.set(f"hardware.{key}", hw[key], "file", f"{name}: hardware.{key}")
    d.hardware = {"inter_node": hw.get("inter_node"), "intra_node": hw.get("intra_node")}  # type: ignore[attr-defined]
    j = doc.get("job") or {}
    for key in Job.__dataclass_fields__:
        if j.get(key) is not None:
            d.set(f"job.{key}", j[key], "file", f"{name}: job.{key}")
    par = chosen.get("parallel") or {}
    from planner.specs import ParallelConfig  # noqa: PLC0415

    for key in ParallelConfig.__dataclass_fields__:
        if key in par:
            v = par[key]
            d.set(f"parallel.{key}", tuple(v) if key == "layers_per_stage" and v is not None else v, "file",
                  f"{name}: plans[rank {rank}].parallel.{key}")
    d.default("parallel.moe_dispatcher", "alltoall", "a plan without it: the all-to-all dispatcher")
    d.default("parallel.cuda_graph", "none", "a plan without it: eager launches")
    if doc.get("constants"):
        d.unmodelled.append(f"constants {sorted(doc['constants'])}: the plan was priced with a calibration profile; "
                            "checked with the published constants")
    d.predicted = chosen.get("predicted") or {}  # type: ignore[attr-defined]
    from planner.check.edits import PlanDocEditor  # noqa: PLC0415

    d.editor = PlanDocEditor(path, doc, rank)
    return d


_KV = re.compile(r"\b([a-z_]+)=(\[[^\]]*\]|[^\s,;]+)")


def provenance(text: str) -> dict:
    """What the planner's provenance lines in ``text`` say: {"gpu", "num_gpus", "gpus_per_node",
    "model", "degrees": {key: value}}; empty when the text has none."""
    if "planner" not in text:
        return {}
    out: dict = {}
    gpus = set(preset_ids("gpus"))
    for m in re.finditer(r"(\d+)\s*x\s*([A-Za-z0-9][\w.\-]*)", text):
        if m.group(2).lower() in gpus:
            out.setdefault("gpu", m.group(2).lower())
            out.setdefault("num_gpus", int(m.group(1)))
    m = re.search(r"\((\d+)\s+node\(?s?\)?\s*x\s*(\d+)\)", text)
    if m:
        out.setdefault("gpus_per_node", int(m.group(2)))
    m = re.search(r"network (infiniband|roce|ethernet|omnipath) (\d+) x ([\d.]+) Gb/s per node", text)
    if m:
        out.setdefault("inter_node", {"kind": m.group(1), "nics_per_node": int(m.group(2)), "gbps_per_nic": float(m.group(3))})
    models = set(preset_ids("models"))
    for m in re.finditer(r"\bmodel[\s:=]+([A-Za-z0-9][\w.\-]*)", text):
        cand = m.group(1).rstrip(".;,")
        if cand.lower() in models:
            out.setdefault("model", cand.lower())
            break
    deg = {}
    for m in _KV.finditer(text):
        k, v = m.group(1), m.group(2).rstrip(".;,")
        if k in ("tp", "pp", "dp", "cp", "ep", "vpp", "zero", "micro_batch", "microbatches", "global_batch", "seq_len", "recompute",
                 "schedule", "layers_per_stage", "precision", "sequence_parallel", "etp"):
            deg.setdefault(k, v)
    if deg:
        out["degrees"] = deg
    return out


def _text_of(path: Path) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    if path.suffix == ".json":
        try:
            doc = json.loads(text)
            meta = doc.get("_planner") if isinstance(doc, dict) else None
            if isinstance(meta, dict):
                return "\n".join(str(x) for x in meta.get("lines", [])) + "\n" + json.dumps({k: v for k, v in meta.items() if k != "lines"})
        except json.JSONDecodeError:
            return ""
        return ""
    return "\n".join(line for line in text.splitlines() if line.lstrip().startswith("#") or path.suffix == ".txt"
                     or line.lstrip().startswith(('"""', "'''")) or "planner" in line)


def apply_provenance(d: Draft, paths: list[Path]) -> None:
    """Fill what the engine's format cannot hold from the planner's provenance in ``paths``:
    the GPU, the model (a preset id) when the files give no shape, the layer split."""
    info: dict = {}
    where = ""
    for p in paths:
        got = provenance(_text_of(p))
        if got:
            where = where or p.name
            for k, v in got.items():
                info.setdefault(k, v)
    if not info:
        return
    src = f"{where}: the planner's provenance"
    if "gpu" in info and not d.has("hardware.gpu"):
        d.set("hardware.gpu", info["gpu"], "file", src)
    if "num_gpus" in info and (not d.has("hardware.num_gpus") or d.values["hardware.num_gpus"][1].kind == "default"):
        d.set("hardware.num_gpus", info["num_gpus"], "file", src)
    if "gpus_per_node" in info and not d.has("hardware.gpus_per_node"):
        d.set("hardware.gpus_per_node", info["gpus_per_node"], "file", src)
    if "inter_node" in info and not d.has("hardware.inter_node"):
        d.set("hardware.inter_node", info["inter_node"], "file", src)
    if "model" in info:
        d.model_id = info["model"]
        if d.model is None and not d.has("model.layers"):
            d.model = load_model(info["model"])
    deg = info.get("degrees", {})
    lps = deg.get("layers_per_stage")
    if lps and lps.startswith("[") and not d.has("parallel.layers_per_stage"):
        try:
            d.set("parallel.layers_per_stage", tuple(int(x) for x in lps.strip("[]").split(",") if x.strip()), "file", src)
        except ValueError:
            pass
    for key, name in (("seq_len", "job.seq_len"), ("global_batch", "job.global_batch_size"), ("precision", "job.precision")):
        if key in deg and not d.has(name):
            v = deg[key]
            d.set(name, int(v) if v.isdigit() else v, "file", src)
    for key in ("tp", "pp", "ep"):
        if key in deg and deg[key].isdigit() and (not d.has(f"parallel.{key}") or d.values[f"parallel.{key}"][1].kind == "default"):
            d.set(f"parallel.{key}", int(deg[key]), "file", src)
    d.notes.append(f"written by `planner launch` ({where}): GPU, model preset and layer split read from its provenance")


__all__.append("model_from_dict")
