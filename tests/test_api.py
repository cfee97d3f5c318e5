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
    root = Path(planner.__file__).parent
    missing = []
    for path in root.rglob("*.py"):
        if path.name in ("__main__.py",) or "/cli/" in str(path) and path.name == "__init__.py":
            continue
        text = path.read_text()
        if path.name == "__init__.py" and not text.strip():
            continue
        if "__all__" not in text:
            missing.append(str(path.relative_to(root)))
    assert not missing, f"modules without __all__: {missing}"


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
