"""Where the engines' own code is for the acceptance tests, and how the tests run it.

* Megatron-LM: the snapshot ``$PLANNER_MEGATRON_LM`` or ``SHARED_ENGINES/megatron-lm``
  (tests/conftest.py), read in place and run in a subprocess with it first on PYTHONPATH.
* torchtitan 0.2.2 / 0.3.0: the installed package when its version is that one, else
  ``$PLANNER_TORCHTITAN_022`` / ``$PLANNER_TORCHTITAN_030`` or ``build/engines/torchtitan-<version>``
  (``pip install --no-deps --target``, as .ci/run does), run in a subprocess with that folder
  first on PYTHONPATH.

A test skips only when the code is not there, saying where it looked and how to get it.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import ROOT, SHARED_ENGINES

__all__ = ["HERE", "megatron_lm_root", "torchtitan_path", "run_worker", "TT_INSTALL"]

HERE = Path(__file__).resolve().parent
TT_INSTALL = {
    "0.2.2": "pip install torchtitan==0.2.2 (site-packages) or pip install --no-deps --target build/engines/torchtitan-0.2.2 torchtitan==0.2.2",
    "0.3.0": "pip install --no-deps --target build/engines/torchtitan-0.3.0 torchtitan==0.3.0 spmd_types==0.2.3 torch_checkpointing==0.1.1",
}


def megatron_lm_root() -> tuple[Path | None, str]:
    """(snapshot root or None, where it looked)."""
    root = Path(os.environ.get("PLANNER_MEGATRON_LM") or SHARED_ENGINES / "megatron-lm")
    ok = (root / "megatron" / "training" / "arguments.py").is_file()
    return (root if ok else None), str(root)


def torchtitan_path(version: str) -> tuple[list[str] | None, str]:
    """(PYTHONPATH entries for torchtitan ``version``, [] for site-packages; None if absent), where it looked."""
    try:
        if importlib.metadata.version("torchtitan") == version:
            return [], "site-packages"
    except importlib.metadata.PackageNotFoundError:
        pass
    env = "PLANNER_TORCHTITAN_" + version.replace(".", "")
    folder = Path(os.environ.get(env) or ROOT / "build" / "engines" / f"torchtitan-{version}")
    if (folder / f"torchtitan-{version}.dist-info").is_dir():
        return [str(folder)], str(folder)
    return None, f"site-packages and {folder} (${env})"


def run_worker(script: str, payload: object, path: list[str], timeout: float = 600) -> dict[str, dict]:
    """Run ``tests/emit/<script>`` with ``path`` first on PYTHONPATH, ``payload`` as JSON on stdin;
    its ``RESULT {json}`` lines by name."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([*path, str(HERE), str(ROOT)]))
    res = subprocess.run([sys.executable, "-W", "ignore", str(HERE / script)], input=json.dumps(payload), env=env,
                         capture_output=True, text=True, timeout=timeout, cwd=str(HERE))
    out = {}
    for line in res.stdout.splitlines():
        if line.startswith("RESULT "):
            d = json.loads(line[7:])
            out[d["name"]] = d
    if res.returncode != 0 and not out:
        raise AssertionError(f"{script} failed (rc {res.returncode}): {res.stderr[-3000:]}")
    return out
