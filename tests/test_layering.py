"""One direction of imports: errors/units/specs <- engines <- cost <- search <- io, studies <-
calibration <- report, emit <- check <- cli (docs/architecture.md). Every import of a planner
module, at the top of a file or inside a function (a lazy import is still a dependency), goes
to the same layer or a lower one."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "planner"

LAYERS = {
    "planner.errors": 0, "planner.units": 0, "planner.specs": 0, "planner.schemas": 0,
    "planner.engines": 1,
    "planner.cost": 2,
    "planner.search": 3,
    "planner.io": 4, "planner.studies": 4,
    "planner.calibration": 5,
    "planner.report": 6, "planner.emit": 6,
    "planner.check": 7,
    "planner.cli": 8,
    "planner.__main__": 9,
}


def _layer(module: str) -> int | None:
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        key = ".".join(parts[:n])
        if key in LAYERS:
            return LAYERS[key]
    return None


def _module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    name = ".".join(rel.parts)
    return name.removesuffix(".__init__")


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.startswith("planner"):
            if node.module == "planner":
                out += [(node.lineno, f"planner.{a.name}") for a in node.names if a.name != "__version__"]
            else:
                out.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.startswith("planner")]
    return out


def test_every_module_has_a_layer():
    missing = [str(p) for p in PKG.rglob("*.py") if _module_name(p) != "planner" and _layer(_module_name(p)) is None]
    assert not missing, missing


def test_imports_go_down_the_layers_only():
    bad = []
    for path in sorted(PKG.rglob("*.py")):
        mod = _module_name(path)
        if mod == "planner":
            continue  # the public API re-exports every layer
        own = _layer(mod)
        for line, target in _imports(path):
            t = _layer(target)
            if t is not None and t > own:
                bad.append(f"{mod}:{line} imports {target} (layer {t} > {own})")
    assert not bad, "\n".join(bad)
