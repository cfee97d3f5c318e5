"""Where the shipped presets live and how they are listed.

Presets are YAML files in the repository's ``hwspecs/`` and ``models/`` folders. In an
installed wheel they are the packages ``planner._hwspecs`` and ``planner._models``
(pyproject maps the folders there), so the CLI works from any directory.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import yaml

from planner.errors import InputError, suggest

__all__ = ["preset_dir", "preset_ids", "read_preset", "suggest"]

_PKG = Path(__file__).resolve().parents[1]  # the planner package
_REPO = _PKG.parent


def preset_dir(kind: str) -> Path:
    """Folder of one kind of preset: ``gpus``, ``fabrics``, ``clusters`` or ``models``."""
    installed = {"models": _PKG / "_models"}.get(kind, _PKG / "_hwspecs" / kind)
    source = {"models": _REPO / "models"}.get(kind, _REPO / "hwspecs" / kind)
    return installed if installed.is_dir() else source


@lru_cache(maxsize=None)
def preset_ids(kind: str) -> tuple[str, ...]:
    folder = preset_dir(kind)
    if not folder.is_dir():
        return ()
    return tuple(sorted(p.stem for p in folder.glob("*.yaml")))




@lru_cache(maxsize=None)
def _read(path: str) -> dict:
    try:
        data = yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError as exc:
        raise InputError(path, "malformed YAML", f"valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise InputError(path, type(data).__name__, "a YAML mapping")
    return data


def read_preset(kind: str, name: str) -> dict:
    """The raw mapping of preset ``name`` (case-insensitive id), or InputError with suggestions."""
    ids = preset_ids(kind)
    key = name.lower()
    if key not in ids:
        label = {"gpus": "gpu", "models": "model", "clusters": "cluster", "fabrics": "fabric"}[kind]
        hint = suggest(key, ids)
        raise InputError(label, name, f"a preset id ({hint})" if hint else f"one of {', '.join(ids)}", flag=f"--{label}")
    return dict(_read(str(preset_dir(kind) / f"{key}.yaml")))
