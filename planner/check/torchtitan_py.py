"""torchtitan 0.3.0's config form: a Python module of config functions (``--module M --config F``,
torchtitan/config/manager.py:19-159), read with ``ast`` and never imported.

A small evaluator runs the chosen function's body: assignments (``cfg = llama3_70b()``,
``cfg.parallelism = ParallelismConfig(...)``, ``config.training.disable_cuda_graphs = True``),
calls of other functions of the same module, arithmetic on numbers, lists and dicts. A call of
anything else is recorded as that class with its keyword arguments (``ParallelismConfig``,
``TrainingConfig``, ``FullAC.Config``, ``model_registry("70B", converters=[...])``). A function
imported from torchtitan (the registry function an emitted module starts from) is not read:
what it sets and the file does not set is torchtitan's default, and the output says so.

The settings become the 0.2.2 names (same keys: ParallelismConfig, TrainingConfig and
CompileConfig keep them, configs.py:35-310) and :func:`planner.check.torchtitan.titan_draft`
prices them. ``TrainingConfig(num_tokens_per_microbatch_per_dp_rank, max_context_length)``
(the newer registries in shared/engines/torchtitan/current) is ``local_batch_size = tokens /
context`` and ``seq_len = context``. The default activation checkpointing of 0.3.0 is
``SelectiveAC`` (trainer.py:108-110); sequence parallelism is on with TP (configs.py:160).
"""

from __future__ import annotations

import ast
import operator
from pathlib import Path

from planner.check.job import Draft
from planner.check.torchtitan import TitanSettings, titan_draft
from planner.errors import InputError

__all__ = ["read_titan_py", "config_functions"]


class Rec:
    """A call of a config class or factory: its name, positional and keyword arguments, and the
    attributes the function sets on it afterwards."""

    def __init__(self, func: str, args: list, kwargs: dict, line: int):
        self.func, self.args, self.kwargs, self.line = func, args, kwargs, line

    def get(self, key: str):
        return self.kwargs.get(key)

    def __repr__(self) -> str:
        return f"{self.func}({', '.join(map(repr, self.args))}{', ' if self.args and self.kwargs else ''}" \
               f"{', '.join(f'{k}={v!r}' for k, v in self.kwargs.items())})"


class Opaque:
    def __init__(self, text: str, line: int = 0):
        self.text, self.line = text, line

    def __repr__(self) -> str:
        return f"<{self.text}>"


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
        ast.Div: operator.truediv, ast.Mod: operator.mod, ast.Pow: operator.pow}


class _Eval:
    def __init__(self, tree: ast.Module, path: Path):
        self.path = path
        self.funcs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
        self.consts: dict = {}
        self.imports: dict = {}
        for n in tree.body:
            if isinstance(n, ast.ImportFrom):
                for a in n.names:
                    self.imports[a.asname or a.name] = ("." * n.level) + (n.module or "") + "." + a.name
            elif isinstance(n, ast.Import):
                for a in n.names:
                    self.imports[a.asname or a.name] = a.name
            elif isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name):
                try:
                    self.consts[n.targets[0].id] = ast.literal_eval(n.value)
                except (ValueError, SyntaxError):
                    pass
        self.unread: list[str] = []
        self.depth = 0

    def call_function(self, name: str, line: int):
        fn = self.funcs[name]
        if self.depth > 16:
            raise InputError(f"{self.path.name}:{line}", name, "config functions that do not recurse forever")
        self.depth += 1
        env: dict = {}
        try:
            for st in fn.body:
                if isinstance(st, ast.Return):
                    return self.expr(st.value, env) if st.value is not None else None
                if isinstance(st, (ast.Assign, ast.AnnAssign)):
                    targets = st.targets if isinstance(st, ast.Assign) else [st.target]
                    if st.value is None:
                        continue
                    value = self.expr(st.value, env)
                    for t in targets:
                        self.assign(t, value, env)
            return None
        finally:
            self.depth -= 1

    def assign(self, target, value, env: dict) -> None:
        if isinstance(target, ast.Name):
            env[target.id] = value
        elif isinstance(target, ast.Attribute):
            obj = self.expr(target.value, env)
            if isinstance(obj, Rec):
                obj.kwargs[target.attr] = value

    def expr(self, node, env: dict):
        if node is None:
            return None
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, (ast.List, ast.Tuple)):
            return [self.expr(e, env) for e in node.elts]
        if isinstance(node, ast.Dict):
            return {self.expr(k, env): self.expr(v, env) for k, v in zip(node.keys, node.values)}
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            a, b = self.expr(node.left, env), self.expr(node.right, env)
            if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
                return _OPS[type(node.op)](a, b)
            return Opaque(ast.unparse(node), node.lineno)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            v = self.expr(node.operand, env)
            return -v if isinstance(v, (int, float)) else Opaque(ast.unparse(node), node.lineno)
        if isinstance(node, ast.Name):
            if node.id in env:
                return env[node.id]
            if node.id in self.consts:
                return self.consts[node.id]
            return Opaque(node.id, node.lineno)
        if isinstance(node, ast.Attribute):
            base = self.expr(node.value, env)
            if isinstance(base, Rec):
                return base.kwargs.get(node.attr)
            return Opaque(ast.unparse(node), node.lineno)
        if isinstance(node, ast.Call):
            name = ast.unparse(node.func)
            if isinstance(node.func, ast.Name) and node.func.id in self.funcs and not node.keywords:
                return self.call_function(node.func.id, node.lineno)
            args = [self.expr(a, env) for a in node.args]
            kwargs = {kw.arg: self.expr(kw.value, env) for kw in node.keywords if kw.arg}
            rec = Rec(name, args, kwargs, node.lineno)
            if isinstance(node.func, ast.Name) and node.func.id in self.imports and not node.func.id[0].isupper():
                rec.imported = self.imports[node.func.id]  # type: ignore[attr-defined]
            return rec
        return Opaque(ast.unparse(node), getattr(node, "lineno", 0))


def config_functions(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")]


def _model_name(ev: _Eval, path: Path) -> str:
    """The model package: where ``model_registry`` comes from (``torchtitan.models.<name>``, or
    ``from . import model_registry`` inside the package: the file's own name, e.g.
    llama3_config_registry.py as torchtitan/models/llama3/config_registry.py)."""
    src = ev.imports.get("model_registry", "")
    if src.startswith("torchtitan.models."):
        return src.split(".")[2]
    stem = path.stem.replace("config_registry", "").strip("_")
    if src.startswith(".") and stem:
        return stem
    for imp in ev.imports.values():
        parts = imp.split(".")
        if imp.startswith("torchtitan.models.") and len(parts) > 3 and parts[2] not in ("common", "utils", "moe"):
            return parts[2]
    return stem or path.parent.name


def read_titan_py(path: Path, function: str | None, launch=None) -> Draft:
    """The job of a torchtitan 0.3.0 config module's ``function``; ``launch``: the script that
    starts it (its world; command-line overrides of a module are refused, not read)."""
    if launch is not None and launch.overrides:
        key, text, where = launch.overrides[0]
        raise InputError(where, "an override" if text is None else text, "no command-line override of a 0.3.0 config module (planner check reads the module's "
                         "own values: set it in the module)")
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        tree = ast.parse(text)
    except SyntaxError as exc:
        raise InputError(f"{path.name}:{exc.lineno}", "Python syntax error", f"a config module ({exc.msg})") from None
    ev = _Eval(tree, path)
    if any(v.lstrip(".").startswith(("megatron.bridge", "nemo", "nemo_run")) for v in ev.imports.values()):
        raise InputError(str(path), "a Megatron-Bridge / NeMo 2 recipe", "a format planner check reads: megatron-bridge 0.3.1 does not "
                         "install on this CPU machine (its dependency mamba-ssm builds a CUDA extension), so its recipes cannot be "
                         "built; pass the job's Megatron-LM flags (a flags file) or a plan document instead (docs/check.md)")
    names = [n for n in ev.funcs if not n.startswith("_")]
    if function is None:
        if len(names) != 1:
            raise InputError(str(path), f"{len(names)} config functions", "FILE.py:FUNCTION naming one of " + ", ".join(names[:12]))
        function = names[0]
    if function not in ev.funcs:
        raise InputError(f"{path.name}:{function}", function, "a function of the module (" + ", ".join(names[:12]) + ")")
    cfg = ev.call_function(function, ev.funcs[function].lineno)
    if not isinstance(cfg, Rec):
        raise InputError(f"{path.name}:{function}", type(cfg).__name__, "a function returning a Trainer.Config(...)")
    values: dict = {}

    def put(key: str, value, line: int | None, what: str) -> None:
        if value is not None and not isinstance(value, Opaque):
            values[key] = (value, f"{function}(): {what}" + (f" (line {line})" if line else ""))

    spec = cfg.get("model_spec")
    if not isinstance(spec, Rec) or not spec.args:
        raise InputError(f"{path.name}:{function}", "no model_spec = model_registry(FLAVOR)", "a config that names its model flavor")
    put("model.name", _model_name(ev, path), spec.line, "model_registry's module")
    put("model.flavor", spec.args[0], spec.line, f"model_registry({spec.args[0]!r})")
    convs = []
    for c in spec.get("converters") or []:
        cname = c.func if isinstance(c, Rec) else str(c)
        convs.append("quantize.linear.float8" if "Float8" in cname else ("quantize.linear.mx" if "MX" in cname else cname))
        if "Float8Linear" in cname and isinstance(c, Rec) and c.get("recipe_name") is not None:
            put("quantize.linear.float8.recipe_name", c.get("recipe_name"), c.line, "Float8LinearConverter.Config(recipe_name=...)")
        if "NVFP4" in cname:
            convs[-1] = "quantize.linear.float8"
    if convs:
        put("model.converters", convs, spec.line, "model_registry(converters=...)")
    for section, attr in (("parallelism", "parallelism"), ("training", "training"), ("compile", "compile")):
        rec = cfg.get(attr)
        if isinstance(rec, Rec):
            for k, v in rec.kwargs.items():
                put(f"{section}.{k}", v, rec.line, f"{rec.func}({k}=...)")
    tr = cfg.get("training")
    if isinstance(tr, Rec) and "max_context_length" in tr.kwargs:
        ctx, tok = tr.get("max_context_length"), tr.get("num_tokens_per_microbatch_per_dp_rank")
        if isinstance(ctx, int) and isinstance(tok, int):
            put("training.seq_len", ctx, tr.line, "TrainingConfig(max_context_length=...)")
            put("training.local_batch_size", tok // ctx, tr.line, "num_tokens_per_microbatch_per_dp_rank / max_context_length")
    comp = cfg.get("compile")
    if isinstance(comp, Rec) and comp.get("enable_async_tensor_parallel"):
        put("parallelism.enable_async_tensor_parallel", True, comp.line, "CompileConfig(enable_async_tensor_parallel=True)")
    ac = cfg.kwargs.get("activation_checkpoint", "unset")
    if ac is None:
        values["activation_checkpoint.mode"] = ("none", f"{function}(): activation_checkpoint=None")
    elif isinstance(ac, Rec):
        mode = {"FullAC.Config": "full", "SelectiveAC.Config": "selective", "MemoryBudgetAC.Config": "memory_budget"}.get(ac.func)
        if mode is None:
            raise InputError(f"{path.name}:{ac.line}", ac.func, "FullAC.Config, SelectiveAC.Config, MemoryBudgetAC.Config or None")
        put("activation_checkpoint.mode", mode, ac.line, ac.func + "()")
        if mode == "selective":
            values["activation_checkpoint.selective_ac_option"] = ("op", f"{function}(): SelectiveAC (per-op only in 0.3.0)")
        if mode == "memory_budget" and ac.get("memory_budget") is not None:
            put("activation_checkpoint.memory_budget", ac.get("memory_budget"), ac.line, "memory_budget")
    defaults = {"activation_checkpoint.mode": "selective", "activation_checkpoint.selective_ac_option": "op",
                "parallelism.enable_sequence_parallel": True}
    s = TitanSettings(values, path, "0.3.0", defaults)
    d = titan_draft(s, path, "torchtitan-config", launch=launch)
    d.notes.append(f"torchtitan 0.3.0 config {path.name}:{function}(), read with ast; flavor shapes from torchtitan 0.2.2's "
                   "registry (the 0.3.0 parameter counts are the same, docs/research/titan_deepspeed.md B.3)")
    base = getattr(cfg, "imported", None)
    if base:
        d.notes.append(f"the config starts from {cfg.func}() of {base.rsplit('.', 1)[0]}, not read here: what it sets and "
                       f"{function}() does not is taken as torchtitan's default")
    from planner.check.edits import PyConfigEditor  # noqa: PLC0415

    d.editor = PyConfigEditor(path, text, function)
    return d
