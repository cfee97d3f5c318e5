"""The sections, keys and defaults of torchtitan 0.2.2's job config, read (with ``ast``, no
import) from the installed ``torchtitan/config/job_config.py``: ``JobConfig``'s fields are the
TOML sections, each dataclass field a key, a field typed as another dataclass a sub-section
(``[quantize.linear.float8]``). torchtitan's ConfigManager rejects unknown sections and keys
(config/manager.py:160-181, ``_dict_to_dataclass``), and so does ``planner check``.
"""

from __future__ import annotations

import ast
import importlib.util
from functools import lru_cache
from pathlib import Path

__all__ = ["job_config_schema", "Section", "key_type", "type_ok"]


class Section:
    def __init__(self, name: str):
        self.name = name
        self.keys: dict[str, object] = {}  # key -> default (None when not a literal)
        self.types: dict[str, str] = {}  # key -> its annotation, as written (e.g. "int", "list[str] | None")
        self.sections: dict[str, "Section"] = {}


def _source() -> Path | None:
    spec = importlib.util.find_spec("torchtitan")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "config" / "job_config.py"
    return path if path.is_file() else None


@lru_cache(maxsize=1)
def job_config_schema() -> Section | None:
    """The tree of sections of torchtitan's JobConfig, or None when torchtitan is not installed."""
    path = _source()
    if path is None:
        return None
    tree = ast.parse(path.read_text())
    classes: dict[str, dict] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            fields = {}
            for st in node.body:
                if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name):
                    ann = ast.unparse(st.annotation)
                    default = None
                    if st.value is not None:
                        if isinstance(st.value, ast.Call) and ast.unparse(st.value.func) == "field":
                            for kw in st.value.keywords:
                                if kw.arg == "default_factory":
                                    default = ("factory", ast.unparse(kw.value))
                                elif kw.arg == "default":
                                    default = _literal(kw.value)
                        else:
                            default = _literal(st.value)
                    fields[st.target.id] = (ann, default)
            classes[node.name] = fields

    def build(name: str, cls: str, seen: tuple) -> Section:
        sec = Section(name)
        for key, (ann, default) in classes.get(cls, {}).items():
            sub = ann if ann in classes else (default[1] if isinstance(default, tuple) and default[1] in classes else None)
            if sub and sub not in seen:
                sec.sections[key] = build(key, sub, seen + (sub,))
            else:
                sec.keys[key] = default
                sec.types[key] = ann
        return sec

    return build("", "JobConfig", ("JobConfig",)) if "JobConfig" in classes else None


def key_type(schema: Section, key: str) -> str | None:
    """The annotation of ``section.sub.key`` in the schema (None when it has no such key)."""
    *secs, name = key.split(".")
    for s in secs:
        schema = schema.sections.get(s)
        if schema is None:
            return None
    return schema.types.get(name)


_SCALARS = {"int": lambda v: isinstance(v, int) and not isinstance(v, bool), "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
            "bool": lambda v: isinstance(v, bool), "str": lambda v: isinstance(v, str)}


def type_ok(value, ann: str) -> bool:
    """Whether a TOML value has the annotated type (the plain types torchtitan's fields use:
    int, float, bool, str, list[...] of them, Literal[...], unions with None); True for any other
    annotation (not checked)."""
    try:
        node = ast.parse(ann, mode="eval").body
    except SyntaxError:
        return True
    return _ok(value, node)


def _ok(v, node) -> bool:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _ok(v, node.left) or _ok(v, node.right)
    if isinstance(node, ast.Constant) and node.value is None:
        return v is None
    if isinstance(node, ast.Name):
        return _SCALARS.get(node.id, lambda _: True)(v)
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
        if node.value.id == "list":
            return isinstance(v, list) and all(_ok(x, node.slice) for x in v)
        if node.value.id == "Literal":
            opts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            return any(isinstance(o, ast.Constant) and o.value == v for o in opts)
    return True


def _literal(node):
    try:
        return ast.literal_eval(node)
    except (ValueError, SyntaxError):
        if isinstance(node, ast.Call) and ast.unparse(node.func) in ("list", "dict"):
            return [] if ast.unparse(node.func) == "list" else {}
        return None
