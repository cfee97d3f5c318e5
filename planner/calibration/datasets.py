"""The published runs that ship with the project, by name, and the engine each was measured on.

The files are copies, unchanged, of ``shared/validation/`` (repository folder ``validation/``,
package ``planner._validation`` in a wheel), with their source notes (README.md, VTRAIN.md).
``planner validate --set public`` reads them from a clone or an installed wheel alike.

>>> from planner.calibration.datasets import SETS, dataset_path
>>> sorted(SETS)
['memory', 'modern', 'public', 'vtrain-multi', 'vtrain-single']
>>> dataset_path("public").name
'public_runs.json'
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from pathlib import Path

import yaml

from planner.errors import InputError, suggest

__all__ = ["SETS", "dataset_path", "data_dir", "run_engine", "ENGINE_RULES"]

SETS = {
    "public": "public_runs.json",
    "vtrain-multi": "vtrain_multi_runs.json",
    "vtrain-single": "vtrain_single_runs.json",
    "modern": "modern_runs.json",
    "memory": "memory_runs.json",
}

_REPO = Path(__file__).resolve().parents[2] / "validation"


def data_dir() -> Path:
    """The folder of the shipped runs files (the wheel's package data, else the repository's)."""
    try:
        # a namespace package (no __init__.py) gives a MultiplexedPath whose str() is not a
        # folder: ask it for the file and take the file's folder
        installed = resources.files("planner._validation").joinpath("public_runs.json")
        if installed.is_file():
            return Path(str(installed)).parent
    except ModuleNotFoundError:
        pass
    return _REPO


def dataset_path(name: str) -> Path:
    """The runs file of the named set (``planner validate --set NAME``)."""
    if name not in SETS:
        hint = suggest(name, SETS)
        raise InputError("--set", name, f"one of {', '.join(SETS)}" + (f" ({hint})" if hint else ""))
    return data_dir() / SETS[name]


@lru_cache(maxsize=1)
def _rules() -> dict:
    return yaml.safe_load((resources.files("planner.calibration") / "run_engines.yaml").read_text())


ENGINE_RULES = _rules


def run_model_fields(run_id: str) -> dict:
    """Model fields the runs file cannot hold but its notes state: from ``run_engines.yaml``'s
    ``model_rules`` whose ``id_regex`` matches the run (the first rule that names a field wins;
    ``moe`` holds fields of the MoE block), else from the first
    engine rule that matches it and carries a ``model`` block (its ``model_why`` says where the
    notes say so)."""
    import re  # noqa: PLC0415

    out: dict = {}
    for rule in _rules().get("model_rules", []):
        if re.search(rule["id_regex"], run_id):
            for k, v in rule["model"].items():  # every matching rule, the first one per field
                if k == "moe":
                    out["moe"] = {**v, **out.get("moe", {})}
                else:
                    out.setdefault(k, v)
    if out:
        return out
    for rule in _rules()["rules"]:
        if run_id.startswith(rule["id_prefix"]) and "model" in rule:
            return dict(rule["model"])
    return {}


def run_job_fields(run_id: str) -> dict:
    """Job fields the runs file cannot hold but its source states (the FP8 recipe, whether
    FSDP or TP gathers in FP8, the cross-entropy kernels): from ``run_engines.yaml``'s ``job_rules`` whose ``id_regex``
    matches the run, the first rule per field."""
    import re  # noqa: PLC0415

    out: dict = {}
    for rule in _rules().get("job_rules", []):
        if re.search(rule["id_regex"], run_id):
            for k, v in rule["job"].items():
                out.setdefault(k, v)
    return out


@lru_cache(maxsize=1)
def _recipes() -> dict:
    return yaml.safe_load((resources.files("planner.calibration") / "run_recipes.yaml").read_text())


def run_recipe(run_id: str) -> tuple[dict, str]:
    """(parallel fields, sources) the run's recipe states and its table leaves out, from the
    rules of ``run_recipes.yaml`` whose ``id_regex`` matches: for each field the first matching
    rule that names it wins; a rule that names a field with null keeps it unknown (later rules
    do not set it). ({} and "" when no rule sets anything.)"""
    import re  # noqa: PLC0415

    claimed: dict = {}
    sources: list[str] = []
    for rule in _recipes()["rules"]:
        if re.search(rule["id_regex"], run_id):
            new = {k: v for k, v in (rule.get("parallel") or {}).items() if k not in claimed}
            claimed.update(new)
            if any(v is not None for v in new.values()):
                sources.append(str(rule["source"]))
    return {k: v for k, v in claimed.items() if v is not None}, "; ".join(sources)


def run_engine(run_id: str) -> tuple[str, str]:
    """(engine, why) of a published run, from ``run_engines.yaml`` (first matching rule)."""
    r = _rules()
    for rule in r["rules"]:
        if run_id.startswith(rule["id_prefix"]):
            return rule["engine"], rule["why"]
    return r["default"]["engine"], r["default"]["why"]
