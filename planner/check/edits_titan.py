"""Edits of torchtitan jobs: the settings a configuration needs (:func:`titan_settings`, the
0.2.2 section.key names; the reader's mapping in reverse), then

* a TOML file: each changed key rewritten on its line, or added under its section (comments
  and the rest of the file kept);
* a 0.3.0 config module: each changed keyword of the ``ParallelismConfig`` /
  ``TrainingConfig`` call rewritten in place (positions from ``ast``), missing ones added,
  the activation checkpointing class swapped.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import tomli_w

from planner.check.edits import CommandLineClash, Edit, unified_diff
from planner.emit.torchtitan import SCHEDULES as _NAMES  # the planner's schedule -> torchtitan's name
from planner.errors import InputError
from planner.specs import ParallelConfig

__all__ = ["titan_settings", "TomlFileEditor", "PyFileEditor"]


def titan_settings(cj, par: ParallelConfig) -> dict:
    """section.key -> value for ``par`` on torchtitan (only the keys the configuration decides)."""
    P, T = "parallelism.", "training."
    m = par.num_microbatches(cj.job.global_batch_size)
    out: dict = {}
    shard_deg = par.zero_shard_degree
    if par.zero == 0:
        if par.dp > 1 and par.tp * par.pp * par.cp * par.ep > 1:
            raise InputError("zero", 0, "2 or 3 on torchtitan when dp > 1 meets tp/pp/cp/ep (DDP only as the sole parallelism)")
        rep, shard = par.dp, 1
    elif shard_deg and shard_deg < par.dp * par.cp:
        shard = shard_deg // par.cp
        rep = par.dp // shard
    else:
        rep, shard = 1, par.dp
    out[P + "data_parallel_replicate_degree"] = rep
    out[P + "data_parallel_shard_degree"] = shard
    if par.zero in (2, 3):
        out[P + "fsdp_reshard_after_forward"] = "never" if par.zero == 2 else "default"
    out[P + "tensor_parallel_degree"] = par.tp
    out[P + "pipeline_parallel_degree"] = par.pp
    out[P + "context_parallel_degree"] = par.cp
    out[P + "expert_parallel_degree"] = par.ep
    if par.ep > 1:
        out[P + "expert_tensor_parallel_degree"] = par.etp if par.etp in (1, par.tp) else 1
    if par.pp > 1:
        if par.schedule not in _NAMES:
            raise InputError("schedule", par.schedule, "a schedule torchtitan has (" + ", ".join(_NAMES) + ")")
        out[P + "pipeline_parallel_schedule"] = _NAMES[par.schedule]
        out[P + "pipeline_parallel_microbatch_size"] = par.micro_batch_size
        lps = tuple(par.layers_per_stage or ())
        L = cj.model.layers
        n_stages = par.pp * par.vpp
        if par.schedule in ("zb-v", "dualpipe") or len(set(lps)) > 1 or L % n_stages:
            out[P + "module_fqns_per_model_part"] = _parts(lps, par.vpp, par.schedule, L)
        else:
            out[P + "pipeline_parallel_layers_per_stage"] = L // n_stages
            out[P + "pipeline_parallel_first_stage_less_layers"] = 0
            out[P + "pipeline_parallel_last_stage_less_layers"] = 0
        flushes = cj.flushes  # the job's pipeline runs per step, kept (1: one run of all m)
        if m % flushes:
            raise InputError("training.local_batch_size", f"{m} micro-batches", f"a multiple of the job's {flushes} pipeline flushes")
        out[T + "local_batch_size"] = par.micro_batch_size * m // flushes
    else:
        out[T + "local_batch_size"] = par.micro_batch_size
    out[T + "global_batch_size"] = cj.job.global_batch_size
    out["activation_checkpoint.mode"] = par.recompute
    if par.recompute == "selective":
        out["activation_checkpoint.selective_ac_option"] = "op"
    # async TP, the plan's tp_comm_overlap (0.2.2 parallelism.enable_async_tensor_parallel;
    # 0.3.0 CompileConfig.enable_async_tensor_parallel): needs torch.compile of the model
    out[P + "enable_async_tensor_parallel"] = bool(par.tp_comm_overlap and par.tp > 1)
    return out


# torchtitan's CompileConfig.components default (0.2.2 and 0.3.0 config: ["model", "loss"])
_COMPILE_COMPONENTS_DEFAULT = ["model", "loss"]


def _compile_for_async_tp(components) -> dict:
    """compile.* settings async TP needs: compile on, with "model" among the components
    (torchtitan raises otherwise: 0.2.2 distributed/tensor_parallel.py, 0.3.0 CompileConfig)."""
    comps = list(_COMPILE_COMPONENTS_DEFAULT if components is None else components)
    out = {"compile.enable": True}
    if "model" not in comps:
        out["compile.components"] = ["model"] + comps
    return out


def _parts(lps: tuple, vpp: int, schedule: str, layers: int) -> list:
    """``module_fqns_per_model_part``: virtual stage k (on rank k mod pp, or in a V) with its layers."""
    pp = len(lps)
    chunk = {}
    for r, n in enumerate(lps):
        base, extra = divmod(n, vpp)
        for v in range(vpp):
            k = (r if v == 0 else 2 * pp - 1 - r) if schedule in ("zb-v", "dualpipe") else v * pp + r
            # a short chunk at the model's ends, where the embedding or the output fills it
            chunk[k] = base + (1 if (v < extra if r == pp - 1 else v >= vpp - extra) else 0)
    out, start = [], 0
    for k in range(pp * vpp):
        names = [f"layers.{i}" for i in range(start, start + chunk[k])]
        start += chunk[k]
        out.append((["tok_embeddings"] if k == 0 else []) + names + (["norm", "output"] if k == pp * vpp - 1 else []))
    if start != layers:
        raise InputError("layers_per_stage", list(lps), f"a split of the {layers} layers")
    if any(not part for part in out):
        raise InputError("layers_per_stage", list(lps), f"at least one module in each of torchtitan's {pp * vpp} stages")
    return out


# What a torchtitan job does not set: the engine decides it (FSDP2 prefetch and overlap, SP with TP, SDPA).
TITAN_UNCONTROLLED = ("overlap_grad_reduce", "overlap_param_gather", "async_tp_allreduce", "sequence_parallel", "attention", "etp")


class TomlFileEditor:
    uncontrolled = TITAN_UNCONTROLLED

    def __init__(self, path, text, overrides: dict | None = None):
        # overrides: section.key -> (value, where) set on the launch script's command line, which wins over the file
        self.path, self.text, self.overrides = Path(path), text, dict(overrides or {})

    def edit(self, cj, par: ParallelConfig) -> Edit:
        import tomllib  # noqa: PLC0415

        doc = tomllib.loads(self.text)
        cur = {}
        for sec, body in doc.items():
            if isinstance(body, dict):
                for k, v in body.items():
                    cur[f"{sec}.{k}"] = v
        new = titan_settings(cj, par)
        old = titan_settings(cj, cj.parallel)
        if cur.get("parallelism.data_parallel_shard_degree") == -1 and new["parallelism.data_parallel_replicate_degree"] == \
                old["parallelism.data_parallel_replicate_degree"] and new["parallelism.data_parallel_shard_degree"] > 1:
            new["parallelism.data_parallel_shard_degree"] = -1  # still the rest of the world
        if new[_ASYNC_TP]:
            new.update({k: v for k, v in _compile_for_async_tp(cur.get("compile.components")).items() if cur.get(k) != v})
        lines = self.text.split("\n")
        summary = []
        clash = [(k, self.overrides[k][1], v) for k, v in new.items() if k in self.overrides and self.overrides[k][0] != v]
        if clash:  # the script's flags win over the TOML: the change is theirs to make
            where = clash[0][1].rsplit(" ", 1)[0]
            raise CommandLineClash(f"{where} command line", ", ".join(w.rsplit(" ", 1)[1] + _flag_value(self.overrides[k][0])
                                                                    for k, w, _ in clash),
                                   ", ".join(_flag(k, v) for k, _, v in clash) + " (the launch script's flags win over the TOML: "
                                   "change them there)")
        for key, value in new.items():
            if key in self.overrides:
                continue  # set on the command line, to this value
            have = cur.get(key)
            if key == "training.global_batch_size" and have in (None, -1):
                # left to torchtitan's default, local_batch_size x the data-parallel degree: written
                # only where the new layout would change that product
                if new["training.local_batch_size"] * par.dp == value:
                    continue
            elif have == value or (have is None and old.get(key) == value and key not in _ALWAYS):
                continue
            sec, name = key.rsplit(".", 1)
            lines = _toml_set(lines, sec, name, value)
            shown = _toml_value(value) if not isinstance(value, list) else f"[{len(value)} parts of {[sum(1 for m in x if m.startswith('layers.')) for x in value]} layers]"
            summary.append(f"[{sec}] {name} = {shown}" + (f" (was {have!r})" if have is not None else ""))
        if par.pp == 1:
            for key in ("pipeline_parallel_layers_per_stage", "module_fqns_per_model_part"):
                if f"parallelism.{key}" in cur:
                    lines = _toml_del(lines, "parallelism", key)
                    summary.append(f"[parallelism] {key} removed")
        elif "parallelism.module_fqns_per_model_part" in new and "parallelism.pipeline_parallel_layers_per_stage" in cur:
            lines = _toml_del(lines, "parallelism", "pipeline_parallel_layers_per_stage")
            summary.append("[parallelism] pipeline_parallel_layers_per_stage removed")
        elif "parallelism.pipeline_parallel_layers_per_stage" in new and "parallelism.module_fqns_per_model_part" in cur:
            lines = _toml_del(lines, "parallelism", "module_fqns_per_model_part")
            summary.append("[parallelism] module_fqns_per_model_part removed")
        text = "\n".join(lines)
        try:
            tomllib.loads(text)  # the edit is valid TOML
        except tomllib.TOMLDecodeError as exc:  # a layout the line editor does not handle (dotted keys, inline tables)
            raise InputError(str(self.path), "dotted keys or inline tables", f"[section] headers with one key = value per line to be "
                             f"edited here (the edited text would not parse: {exc}); make the change by hand") from None
        return Edit("torchtitan-toml", summary, {str(self.path): text}, unified_diff({str(self.path): self.text}, {str(self.path): text}))


def _flag_value(v) -> str:
    return "" if isinstance(v, bool) else f" {_toml_value(v)}"


def _flag(key: str, v) -> str:
    """The torchtitan command-line argument that sets ``key`` to ``v`` (tyro: ``--s.flag`` /
    ``--s.no_flag`` for booleans)."""
    if isinstance(v, bool):
        sec, _, name = key.rpartition(".")
        return f"--{key}" if v else f"--{sec}.no_{name}"
    return f"--{key} {_toml_value(v)}"


# written even where the file leaves them out: the degrees, and the first/last-stage "less layers"
# that go with pipeline_parallel_layers_per_stage (torchtitan's defaults are 1 each, the
# embedding and the output counted as layers; the editor's even split counts them as 0)
_ALWAYS = {"parallelism.tensor_parallel_degree", "parallelism.pipeline_parallel_degree",
           "parallelism.pipeline_parallel_first_stage_less_layers", "parallelism.pipeline_parallel_last_stage_less_layers"}
_ASYNC_TP = "parallelism.enable_async_tensor_parallel"


def _toml_value(v) -> str:
    return tomli_w.dumps({"x": v}).split("=", 1)[1].strip()


def _scan(line: str, depth: int, ml: str | None) -> tuple[int, str | None]:
    """(bracket depth, open multi-line string delimiter) after ``line``: brackets inside strings
    (basic ones with backslash escapes, literal ones, and triple-quoted ones that span lines) and
    in comments do not count."""
    i, n = 0, len(line)
    while i < n:
        if ml:
            j = line.find(ml, i)
            if j < 0:
                return depth, ml
            i, ml = j + 3, None
            continue
        if line.startswith('"""', i) or line.startswith("'''", i):
            ml, i = line[i:i + 3], i + 3
            continue
        ch = line[i]
        if ch in "\"'":
            i += 1
            while i < n and line[i] != ch:
                i += 2 if (ch == '"' and line[i] == "\\") else 1
            i += 1
            continue
        if ch == "#":
            break
        depth += ch in "[{"
        depth -= ch in "]}"
        i += 1
    return depth, ml


def _entries(lines: list[str]) -> list[tuple[int, int, str, str]]:
    """The file's logical lines: (first, past-the-last line, "table" | "key", name); a key's value
    may span lines (a multi-line array), whose inner lines are never taken for table headers."""
    out, i = [], 0
    while i < len(lines):
        s = lines[i].strip()
        m = re.match(r"^([A-Za-z0-9_.\-\"']+)\s*=", s)
        if s.startswith("[") and not s.startswith("[["):
            out.append((i, i + 1, "table", s.split("]")[0].strip("[ ")))
        elif m:
            j, (depth, ml) = i, _scan(s.split("=", 1)[1], 0, None)
            while (depth > 0 or ml) and j + 1 < len(lines):
                j += 1
                depth, ml = _scan(lines[j], depth, ml)
            out.append((i, j + 1, "key", m.group(1)))
            i = j
        i += 1
    return out


def _section_bounds(lines: list[str], sec: str, entries: list | None = None) -> tuple[int, int] | None:
    """Lines [header, next header) of table ``sec`` (``entries``: :func:`_entries` of ``lines``,
    scanned here when not given)."""
    start = None
    for a, _, kind, name in entries if entries is not None else _entries(lines):
        if kind == "table":
            if start is not None:
                return start, a
            if name == sec:
                start = a
    return (start, len(lines)) if start is not None else None


def _key_span(entries: list, b: tuple[int, int] | None, key: str) -> tuple[int, int] | None:
    """Lines [first, last) of ``key``'s entry in the table spanning lines ``b`` (None when it has none)."""
    if b is None:
        return None
    return next(((a, z) for a, z, kind, name in entries if kind == "key" and name == key and b[0] < a < b[1]), None)


def _toml_set(lines: list[str], sec: str, key: str, value) -> list[str]:
    text = f"{key} = {_toml_value(value)}"
    entries = _entries(lines)
    b = _section_bounds(lines, sec, entries)
    if b is None:
        while lines and not lines[-1].strip():
            lines = lines[:-1]
        return lines + ["", f"[{sec}]", text, ""]
    span = _key_span(entries, b, key)
    if span is not None:
        i, z = span
        comment = ""
        m = re.search(r"\s+#.*$", lines[i])
        if m and z == i + 1 and not isinstance(value, list):
            comment = m.group(0)
        return lines[:i] + [text + comment] + lines[z:]
    a, z = b
    last = max((e - 1 for s0, e, kind, _ in entries if kind == "key" and a < s0 < z), default=a)
    return lines[:last + 1] + [text] + lines[last + 1:]


def _toml_del(lines: list[str], sec: str, key: str) -> list[str]:
    entries = _entries(lines)
    span = _key_span(entries, _section_bounds(lines, sec, entries), key)
    return lines if span is None else lines[:span[0]] + lines[span[1]:]


# --- 0.3.0 config modules ----------------------------------------------------------------------

_CALL_OF = {"parallelism": "ParallelismConfig", "training": "TrainingConfig"}
_AC = {"none": "None", "full": "FullAC.Config()", "selective": "SelectiveAC.Config()"}


class PyFileEditor:
    uncontrolled = TITAN_UNCONTROLLED

    def __init__(self, path, text, function):
        self.path, self.text, self.function = Path(path), text, function

    def edit(self, cj, par: ParallelConfig) -> Edit:
        new = titan_settings(cj, par)
        old = titan_settings(cj, cj.parallel)
        tree = ast.parse(self.text)
        fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == self.function)
        calls = {name: [c for c in ast.walk(fn) if isinstance(c, ast.Call) and ast.unparse(c.func) == name]
                 for name in ("ParallelismConfig", "TrainingConfig", "Trainer.Config")}
        repl: list[tuple[int, int, str]] = []  # (start offset, end offset, text)
        offs = _offsets(self.text)
        summary = []
        wanted: dict = {"ParallelismConfig": {}, "TrainingConfig": {}}
        for key, value in new.items():
            sec, name = key.split(".", 1)
            if key == _ASYNC_TP:
                continue  # 0.3.0 keeps it in CompileConfig (below)
            if sec in _CALL_OF and old.get(key) != value:
                if sec == "training" and name == "local_batch_size":
                    continue
                wanted[_CALL_OF[sec]][name] = value
        if new["training.local_batch_size"] != old["training.local_batch_size"]:
            tr = calls["TrainingConfig"][0] if calls["TrainingConfig"] else None
            if tr is not None and any(k.arg == "num_tokens_per_microbatch_per_dp_rank" for k in tr.keywords):
                ctx = next((ast.unparse(k.value) for k in tr.keywords if k.arg == "max_context_length"), str(cj.job.seq_len))
                wanted["TrainingConfig"]["num_tokens_per_microbatch_per_dp_rank"] = _Raw(f"{new['training.local_batch_size']} * {ctx}")
            else:
                wanted["TrainingConfig"]["local_batch_size"] = new["training.local_batch_size"]
        for cls, kw in wanted.items():
            if not kw:
                continue
            kw = {k: v for k, v in kw.items() if k != "global_batch_size" or cls == "TrainingConfig"}
            call = calls[cls][0] if calls[cls] else None
            if call is None:
                trainer = calls["Trainer.Config"][0] if calls["Trainer.Config"] else None
                arg = {"ParallelismConfig": "parallelism", "TrainingConfig": "training"}[cls]
                body = f"{arg}={cls}(" + ", ".join(f"{k}={_py(v)}" for k, v in kw.items()) + ")"
                if trainer is None:
                    raise InputError(f"{self.path.name}:{self.function}", f"no {cls}(...) call", f"a config that sets {arg} (edit it by hand)")
                repl.append(_insert_arg(trainer, body, offs))
                summary.append(f"{self.function}(): add {body}")
                continue
            for k, v in kw.items():
                hit = next((x for x in call.keywords if x.arg == k), None)
                if hit is not None:
                    a, b = offs(hit.value.lineno, hit.value.col_offset), offs(hit.value.end_lineno, hit.value.end_col_offset)
                    if self.text[a:b] != _py(v):
                        repl.append((a, b, _py(v)))
                        summary.append(f"{cls}({k}={self.text[a:b]} -> {_short(_py(v))})")
                else:
                    repl.append(_insert_arg(call, f"{k}={_py(v)}", offs))
                    summary.append(f"{cls}(add {k}={_short(_py(v))})")
        if par.recompute != cj.parallel.recompute:
            trainer = calls["Trainer.Config"][0] if calls["Trainer.Config"] else None
            hit = next((x for x in trainer.keywords if x.arg == "activation_checkpoint"), None) if trainer else None
            if hit is not None:
                a, b = offs(hit.value.lineno, hit.value.col_offset), offs(hit.value.end_lineno, hit.value.end_col_offset)
                repl.append((a, b, _AC[par.recompute]))
            elif trainer is not None:
                repl.append(_insert_arg(trainer, f"activation_checkpoint={_AC[par.recompute]}", offs))
            else:
                raise InputError(f"{self.path.name}:{self.function}", "activation checkpointing", "a Trainer.Config(...) call to set it in")
            summary.append(f"activation_checkpoint={_AC[par.recompute]}")
        if new[_ASYNC_TP] != old[_ASYNC_TP]:
            self._async_tp(fn, tree, calls, new[_ASYNC_TP], repl, summary, offs)
        text = self.text
        for a, b, t in sorted(repl, key=lambda x: -x[0]):
            text = text[:a] + t + text[b:]
        ast.parse(text)
        return Edit("torchtitan-config", summary, {str(self.path): text}, unified_diff({str(self.path): self.text}, {str(self.path): text}))


    def _async_tp(self, fn, tree, calls, on: bool, repl: list, summary: list, offs) -> None:
        """0.3.0's CompileConfig(enable_async_tensor_parallel=...), with enable=True and "model"
        among the components when on (CompileConfig.__post_init__ raises otherwise)."""
        comp = [c for c in ast.walk(fn) if isinstance(c, ast.Call) and ast.unparse(c.func) == "CompileConfig"]
        if comp:
            call = comp[0]
            kw = {"enable_async_tensor_parallel": on}
            if on:
                comps = next((x.value for x in call.keywords if x.arg == "components"), None)
                try:
                    names = ast.literal_eval(comps) if comps is not None else None
                except ValueError:
                    raise InputError(f"{self.path.name}:{self.function}", ast.unparse(comps),
                                     "a literal list for CompileConfig(components=...) to add 'model' to (edit it by hand)") from None
                kw.update({k.split(".", 1)[1]: v for k, v in _compile_for_async_tp(names).items()})
            for k, v in kw.items():
                hit = next((x for x in call.keywords if x.arg == k), None)
                if hit is None:
                    repl.append(_insert_arg(call, f"{k}={_py(v)}", offs))
                    summary.append(f"CompileConfig(add {k}={_py(v)})")
                else:
                    a, b = offs(hit.value.lineno, hit.value.col_offset), offs(hit.value.end_lineno, hit.value.end_col_offset)
                    if self.text[a:b] != _py(v):
                        repl.append((a, b, _py(v)))
                        summary.append(f"CompileConfig({k}={self.text[a:b]} -> {_py(v)})")
            return
        if not on:
            return  # no CompileConfig: async TP is already off
        trainer = calls["Trainer.Config"][0] if calls["Trainer.Config"] else None
        imported = any(isinstance(n, ast.ImportFrom) and any(a.name == "CompileConfig" and a.asname is None for a in n.names)
                       for n in tree.body)
        if trainer is None or not imported or any(x.arg == "compile" for x in trainer.keywords):
            raise InputError(f"{self.path.name}:{self.function}", "async tensor parallelism",
                             "a Trainer.Config(...) call and CompileConfig imported from torchtitan.config to set "
                             "compile=CompileConfig(enable=True, enable_async_tensor_parallel=True) in (edit it by hand)")
        body = "compile=CompileConfig(enable=True, enable_async_tensor_parallel=True)"
        repl.append(_insert_arg(trainer, body, offs))
        summary.append(f"{self.function}(): add {body}")


def _insert_arg(call: ast.Call, text: str, offs) -> tuple[int, int, str]:
    """Add an argument after the call's last one (or inside the empty parentheses)."""
    last = max(list(call.args) + [k.value for k in call.keywords], key=lambda n: (n.end_lineno, n.end_col_offset), default=None)
    if last is None:
        end = offs(call.end_lineno, call.end_col_offset) - 1
        return (end, end, text)
    at = offs(last.end_lineno, last.end_col_offset)
    return (at, at, ", " + text)


def _short(text: str) -> str:
    return text if len(text) <= 80 else text[:60] + f"... ({len(text)} characters)"


class _Raw(str):
    pass


def _py(v) -> str:
    return str(v) if isinstance(v, _Raw) else repr(v)


def _offsets(text: str):
    starts = [0]
    for line in text.split("\n"):
        starts.append(starts[-1] + len(line) + 1)
    lines = text.split("\n")

    def at(lineno: int, col: int) -> int:
        # ast columns are UTF-8 byte offsets
        line = lines[lineno - 1]
        return starts[lineno - 1] + len(line.encode("utf-8")[:col].decode("utf-8", errors="ignore"))

    return at
