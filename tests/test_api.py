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


def test_every_public_name_has_a_worked_example_that_runs():
    """Every public function and class documents a worked example (>>>), and the examples run
    (doctest of the public API's own docstrings)."""
    import doctest

    missing, failed = [], []
    for name in planner.__all__:
        obj = getattr(planner, name)
        if name.startswith("__") or name.isupper() or isinstance(obj, (str, tuple)):
            continue
        doc = obj.__doc__ or ""
        if ">>>" not in doc:
            missing.append(name)
            continue
        import sys  # noqa: PLC0415

        globs = dict(vars(sys.modules[obj.__module__]))  # the example runs where the name is defined
        test = doctest.DocTestParser().get_doctest(doc, globs, name, None, 0)
        runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
        out: list[str] = []
        runner.run(test, out=out.append)
        if runner.failures:
            failed.append(f"{name}: {''.join(out)[-400:]}")
    assert not missing, f"public names without an example: {missing}"
    assert not failed, f"examples that do not run: {failed}"


def test_short_reprs_and_rich_rendering():
    import io

    from rich.console import Console

    m, c, j = planner.load_model("llama3.1-8b"), planner.make_cluster("h100-sxm5-80gb", 8), planner.Job(8192, 64)
    result = planner.plan(m, c, j, top_k=2)
    for obj in (result, result.plans[0], result.plans[0].estimate, result.plans[0].parallel):
        assert len(repr(obj)) < 300 and "\n" not in repr(obj), repr(obj)
    buf = io.StringIO()
    Console(file=buf, width=100).print(result.plans[0].estimate)
    Console(file=buf, width=100).print(result)
    assert "step time" in buf.getvalue() and "candidates" in buf.getvalue()


def test_collective_takes_public_types():
    c = planner.make_cluster("h100-sxm5-80gb", 64)
    whole = planner.collective("allreduce", 2**30, c)
    node = planner.collective("allreduce", 2**30, c, gpus=8)
    assert isinstance(whole, planner.CollectiveResult) and whole.gpus == 64 and node.gpus == 8
    assert node.time_s < whole.time_s


def test_plan_takes_engine_as_estimate_does():
    import planner  # noqa: PLC0415

    m, c, j = planner.load_model("llama3.1-8b"), planner.make_cluster("h100-sxm5-80gb", 16), planner.Job(8192, 64)
    a = planner.plan(m, c, j, top_k=1, engine="torchtitan").plans[0]
    b = planner.plan(m, c, j, top_k=1, options=planner.SearchOptions(engine="torchtitan")).plans[0]
    assert a.estimate.engine == "torchtitan" and a.parallel == b.parallel and a.estimate.step_time_s == b.estimate.step_time_s


def test_sequence_parallelism_without_tensor_parallelism_resolves_off():
    """Megatron-LM's validate_args turns --sequence-parallel off at tp 1; the planner resolves it
    so in every door (the API here)."""
    import planner  # noqa: PLC0415

    m, c, j = planner.load_model("llama3.1-8b"), planner.make_cluster("h100-sxm5-80gb", 8), planner.Job(4096, 64)
    e = planner.estimate(m, c, j, planner.ParallelConfig(tp=1, sequence_parallel=True))
    assert e.parallel.sequence_parallel is False and "sequence_parallel" in e.resolved
    assert planner.estimate(m, c, j, planner.ParallelConfig(tp=2, sequence_parallel=True)).parallel.sequence_parallel is True


def test_one_f_one_b_with_virtual_stages_is_refused_by_the_api_as_by_the_cli():
    import pytest  # noqa: PLC0415

    import planner  # noqa: PLC0415

    with pytest.raises(planner.InputError, match="parallel.schedule.*interleaved with vpp 2"):
        planner.ParallelConfig(pp=2, vpp=2, schedule="1f1b")
    assert planner.ParallelConfig(pp=2, vpp=2).schedule == "interleaved"  # unset: the interleaved schedule
