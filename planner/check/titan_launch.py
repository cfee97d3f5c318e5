"""A torchtitan launch script: the job file it starts, the world it runs on, its command-line overrides.

torchtitan is started as ``torchrun ... -m torchtitan.train --job.config_file JOB.toml [--a.b V ...]``
(0.2.2; ``run_train.sh`` does the same with ``CONFIG_FILE`` and ``NGPU`` from the environment) or
``... -m torchtitan.train --module MODULE --config FUNCTION`` (0.3.0, the module on PYTHONPATH).
``planner check launch.sh`` reads the file the script names (beside the script, or from the
working directory) and the ``--section.key value`` overrides after it, as torchtitan's
ConfigManager applies them over the file (config/manager.py: command-line arguments win).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from planner.errors import InputError

__all__ = ["TitanLaunch", "titan_launch", "override_values"]

# run_train.sh (torchtitan 0.2.2): NGPU=${NGPU:-"8"}, torchrun --nproc_per_node=${NGPU} on one node.
_RUN_TRAIN_NGPU = 8


@dataclass
class TitanLaunch:
    script: Path
    config: Path  # the TOML (0.2.2) or the config module (0.3.0)
    function: str | None  # 0.3.0: --config FUNCTION
    world: int | None = None
    gpus_per_node: int | None = None
    world_where: str = ""
    overrides: list = field(default_factory=list)  # (section.key, text or None for a bare flag, where)
    where: str = ""


def _entry(words: list[str]) -> int | None:
    """Index of the word that starts torchtitan's trainer (``-m torchtitan.train``, ``.../train.py``, ``run_train.sh``)."""
    for i, w in enumerate(words):
        if w == "torchtitan.train" and i and words[i - 1] == "-m":
            return i
        if w.endswith(("torchtitan/train.py", "run_train.sh")):
            return i
    return None


def _find(name: str, script: Path, given: tuple) -> Path | None:
    """The job file ``name``: beside the script, in the working directory, or a file given with the
    script (matched by its name)."""
    for base in (script.parent, Path.cwd()):
        cand = (base / name) if not os.path.isabs(name) else Path(name)
        if cand.is_file():
            return cand
    return next((Path(g) for g in given if Path(g).name == Path(name).name and Path(g).is_file()), None)


def titan_launch(script: Path, given: tuple = ()) -> TitanLaunch | None:
    """The torchtitan launch of ``script`` (None when it starts no torchtitan trainer); ``given``:
    the other files named with it (where the job file may be)."""
    from planner.check.bash import run_script  # noqa: PLC0415
    from planner.check.megatron_launch import _int, _torchrun_opts  # noqa: PLC0415

    sh = run_script(script)
    for cmd in sh.commands:
        words = cmd.words()
        k = _entry(words)
        if k is None:
            continue
        here = f"{script.name}:{cmd.origin.line}"
        args = words[k + 1:]
        opts = _torchrun_opts(words[:k])
        run_train = words[k].endswith("run_train.sh")
        config = function = None
        rest: list[str] = []
        i = 0
        while i < len(args):
            key, eq, val = args[i].partition("=")
            if key in ("--job.config_file", "--job.config-file", "--module", "--config") and not eq and i + 1 < len(args):
                val, i = args[i + 1], i + 1
            if key in ("--job.config_file", "--job.config-file", "--module"):
                config = (val.replace(".", "/") + ".py") if key == "--module" else val  # a module path: pkg.mod -> pkg/mod.py
            elif key == "--config":
                function = val
            else:
                rest.append(args[i])
            i += 1
        if run_train and config is None:
            config = cmd.env.get("CONFIG_FILE")
            if config is None:
                raise InputError(f"{here} run_train.sh", "no CONFIG_FILE", "CONFIG_FILE=JOB.toml in the script's environment "
                                 "(run_train.sh's default is a debug model inside the torchtitan checkout; for a 0.3.0 "
                                 "config module, call torchrun -m torchtitan.train --module M --config F instead)")
        if config is None:
            raise InputError(f"{here} {words[k]}", "no job file", "--job.config_file JOB.toml (0.2.2) or --module MODULE "
                             "--config FUNCTION (0.3.0)")
        path = _find(config, script, given)
        if path is None:
            raise InputError(f"{here} job file", config, "a file beside the script or in the working directory (or pass it too)")
        out = TitanLaunch(script, path, function, where=f"{here} {words[k]}")
        if run_train:
            n = _int(cmd.env.get("NGPU", str(_RUN_TRAIN_NGPU)))
            if n:
                out.world, out.gpus_per_node = n, n
                out.world_where = f"{here} run_train.sh NGPU={n} (one node)"
        else:
            nproc, nnodes = _int(opts.get("--nproc-per-node", "") or ""), _int(opts.get("--nnodes", "1") or "1")
            if nproc and nnodes:
                out.world, out.gpus_per_node = nproc * nnodes, nproc
                out.world_where = f"{here} torchrun --nproc-per-node {nproc} x --nnodes {nnodes}"
        out.overrides = _overrides(rest, here)
        return out
    return None


def _overrides(args: list[str], here: str) -> list:
    """``--section.key value`` / ``--section.key=value`` / a bare ``--section.flag``, in order."""
    out, i = [], 0
    while i < len(args):
        a = args[i]
        if not (a.startswith("--") and "." in a.split("=", 1)[0]):
            raise InputError(f"{here} argument", a, "--section.key VALUE (a torchtitan config override)")
        key, eq, val = a[2:].partition("=")
        if not eq:
            if i + 1 < len(args) and not args[i + 1].startswith("--"):
                val, i = args[i + 1], i + 1
            else:
                val = None  # a bare boolean flag
        out.append((key.replace("-", "_"), val, f"{here} --{key}"))
        i += 1
    return out


def override_values(overrides: list, schema) -> dict:
    """section.key -> (value, where) of the overrides, each text read as its JobConfig field's type."""
    from planner.check.titan_schema import key_type  # noqa: PLC0415

    out = {}
    for key, text, where in overrides:
        sec, _, name = key.rpartition(".")
        if name.startswith("no_") and text is None:  # tyro's negated boolean flag: --section.no_flag
            key, text = f"{sec}.{name[3:]}", "false"
        ann = key_type(schema, key) if schema is not None else None
        if schema is not None and ann is None:
            raise InputError(where, text, "a key of torchtitan's JobConfig (ConfigManager rejects unknown arguments)")
        out[key] = (_typed(text, ann or "", where), where)
    return out


def _typed(text: str | None, ann: str, where: str):
    if text is None:
        if ann and "bool" not in ann:
            raise InputError(where, "no value", f"a value of type {ann}")
        return True
    if "bool" in ann and text.lower() in ("true", "false"):
        return text.lower() == "true"
    if "list[list" in ann or "dict" in ann:
        raise InputError(where, text, "a value set in the job file (nested lists and tables are not read from the command line)")
    if ann.startswith("list"):
        return [_scalar(x, ann) for x in text.split(",") if x]
    return _scalar(text, ann)


def _scalar(text: str, ann: str):
    if ("int" in ann or not ann) and re.fullmatch(r"-?\d+", text):
        return int(text)
    if ("float" in ann or not ann) and re.fullmatch(r"-?\d+(\.\d*)?([eE]-?\d+)?", text):
        return float(text)
    if not ann and text.lower() in ("true", "false"):
        return text.lower() == "true"
    return text
