"""Shared test settings: the one place the tests find the published runs.

Every validation test reads the runs files shipped with the project (``validation/``, the
package data ``planner._validation`` in a wheel), never ``../shared``: a clone with nothing
beside it runs them all. ``SHARED_ENGINES`` is the engines' source snapshot the acceptance
tests run (Megatron-LM, torchtitan configs): ``$PLANNER_SHARED/engines`` or ``../shared/engines``.
"""

from __future__ import annotations

import os
from pathlib import Path

from planner.calibration.datasets import dataset_path, data_dir

ROOT = Path(__file__).resolve().parents[1]
VALIDATION = data_dir()
SHARED = Path(os.environ.get("PLANNER_SHARED", ROOT.parent / "shared"))
SHARED_ENGINES = SHARED / "engines"
# the planner's cache (torchtitan flavor shapes) goes to a folder of this test session, not the user's
if "PLANNER_CACHE_DIR" not in os.environ:
    import atexit
    import shutil
    import tempfile

    os.environ["PLANNER_CACHE_DIR"] = tempfile.mkdtemp(prefix="planner-test-cache-")
    atexit.register(shutil.rmtree, os.environ["PLANNER_CACHE_DIR"], True)

__all__ = ["ROOT", "VALIDATION", "SHARED", "SHARED_ENGINES", "dataset_path", "run_cli"]


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``planner ARGV`` run in this process."""
    import contextlib  # noqa: PLC0415
    import io  # noqa: PLC0415

    from planner.cli.app import main  # noqa: PLC0415

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()
