"""The public API: an explicit, tested __all__, and the README's Python example runs."""

import re
from pathlib import Path

import planner

README = Path(__file__).resolve().parents[1] / "README.md"


def test_all_names_exist_and_are_public():
    assert planner.__all__, "planner.__all__ must list the public API"
    for name in planner.__all__:
        assert hasattr(planner, name), name
    for required in ("estimate", "plan", "load_model", "make_cluster", "Job", "ParallelConfig", "Estimate", "validate_runs", "collective"):
        assert required in planner.__all__


def test_every_module_declares_all():
    """Every module of the package lists its public names in __all__, and each listed name exists."""
    import importlib
    import pkgutil

    missing, dangling = [], []
    for info in pkgutil.walk_packages(planner.__path__, "planner."):
        if info.name.endswith("__main__") or info.name.startswith(("planner._hwspecs", "planner._models")):
            continue
        mod = importlib.import_module(info.name)
        names = getattr(mod, "__all__", None)
        if names is None:
            if not info.ispkg:
                missing.append(info.name)
            continue
        dangling += [f"{info.name}.{n}" for n in names if not hasattr(mod, n)]
    assert not missing, f"modules without __all__: {missing}"
    assert not dangling, f"names in __all__ that do not exist: {dangling}"


def test_readme_python_example_runs():
    block = re.search(r"```python\n(.*?)```", README.read_text(), re.S)
    assert block, "README has a Python example"
    namespace: dict = {}
    exec(compile(block.group(1), "README.md", "exec"), namespace)  # noqa: S102 - our own README
    best = namespace["best"]
    est = namespace["est"]
    assert est.step_time_s > 0 and 0 < est.mfu < 1
    assert best.estimate.fits
    if est.fits:  # the README's hand-picked configuration is in the search space: the best beats it
        assert best.estimate.step_time_s <= est.step_time_s * (1 + 1e-9)
