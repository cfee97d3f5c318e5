"""Changes expressed in the user's own format: changed flags of a launch script, a TOML or
Python-config diff, a JSON diff. Every edit is checked by reading the edited files back with
``planner check``'s own readers (:func:`verify`): ``Edit.verified`` says whether the job read
back is the configuration the change predicts.

* Megatron-LM scripts and flags files: :mod:`planner.check.edits_shell`.
* torchtitan TOML and 0.3.0 config modules: :mod:`planner.check.edits_titan`.
* DeepSpeed JSON and plan documents: here.
"""

from __future__ import annotations

import difflib
import json
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from planner.errors import InputError
from planner.specs import ParallelConfig

__all__ = ["CommandLineClash", "Edit", "edit_for", "option_edit", "verify", "unified_diff", "MegatronEditor", "TomlEditor", "PyConfigEditor", "JsonEditor", "PlanDocEditor"]


class CommandLineClash(InputError):
    """A change of settings a launch script's command line sets, over its job file (the change is
    the command line's to make: planner.check.edits_titan.TomlFileEditor)."""


@dataclass
class Edit:
    fmt: str
    summary: list  # one line per changed setting, in the format's own words
    files: dict  # path -> new text
    diff: str = ""
    verified: bool | None = None
    problem: str = ""
    command_line: list = field(default_factory=list)  # settings that live on planner check's command line (DeepSpeed degrees)

    def as_dict(self) -> dict:
        return {"format": self.fmt, "summary": list(self.summary), "diff": self.diff, "verified": self.verified,
                "problem": self.problem, "command_line": list(self.command_line)}


def unified_diff(old: dict, new: dict) -> str:
    out = []
    for path, text in new.items():
        a = old.get(path, "")
        if a == text:
            continue
        name = Path(path).name
        out.extend(difflib.unified_diff(a.splitlines(keepends=True), text.splitlines(keepends=True), f"a/{name}", f"b/{name}"))
    return "".join(out)


def edit_for(cj, par: ParallelConfig) -> Edit | None:
    """The edit of ``cj``'s files that runs ``par``, verified by reading it back."""
    if cj.editor is None:
        return None
    try:
        ed = cj.editor.edit(cj, par)
    except InputError as exc:
        what = "on the launch script's command line" if isinstance(exc, CommandLineClash) else "not expressible in this format"
        return Edit(cj.fmt, [f"{what}: {exc}"], {}, verified=False, problem=str(exc))
    if ed is not None and ed.files:
        verify(cj, ed, par)
    return ed


def option_edit(cj, flags: dict, job: dict) -> Edit | None:
    """The edit of ``cj``'s launch script that sets engine ``flags`` (flag -> state, as
    :meth:`planner.check.edits_shell.ShellEditor.edit_flags`), verified by reading it back: the
    same parallel configuration, and the job's fields in ``job`` set to their values there. None
    where the job's format has no such flags (only Megatron-LM scripts do)."""
    if not hasattr(cj.editor, "edit_flags"):
        return None
    ed = cj.editor.edit_flags(flags)
    if ed.files:
        verify(cj, ed, cj.parallel, job)
    return ed


def _same(a: ParallelConfig, b: ParallelConfig) -> list[str]:
    """Fields of two configurations that differ where it matters to the price."""
    da, db = a.as_dict(), b.as_dict()
    keys = [k for k in db if k not in ("zero_shard_degree",) or (da.get(k) or None) != (db.get(k) or None)]
    bad = [k for k in keys if da.get(k) != db.get(k)]
    if a.tp == 1 and b.tp == 1:
        bad = [k for k in bad if k not in ("sequence_parallel", "tp_comm_overlap", "async_tp_allreduce")]
    if a.dp * a.cp == 1 and b.dp * b.cp == 1:
        bad = [k for k in bad if k not in ("overlap_grad_reduce", "overlap_param_gather")]
    if a.ep == 1 and b.ep == 1:
        bad = [k for k in bad if k not in ("etp", "moe_a2a_overlap")]
    return bad


def verify(cj, ed: Edit, par: ParallelConfig, job: dict | None = None) -> None:
    """Write the edited files into a scratch folder (beside copies of the other files the job
    was read from), read them back, and compare the configuration with ``par`` (and the job's
    fields named in ``job`` with their values there)."""
    from planner.check.read import read_job  # noqa: PLC0415

    tmp = Path(tempfile.mkdtemp(prefix="planner-check-"))
    try:
        names = {}
        sources = set(cj.files) | set(ed.files)
        for src in sources:
            p = Path(src)
            if p.is_file():
                names[str(p)] = tmp / p.name
                shutil.copyfile(p, tmp / p.name)
        for p in Path(cj.files[0]).parent.glob("*.sh"):  # scripts a script sources or submits
            if str(p) not in names and p.is_file():
                shutil.copyfile(p, tmp / p.name)
        for path, text in ed.files.items():
            (tmp / Path(path).name).write_text(text)
        args = [str(names.get(f, tmp / Path(f).name)) + (f":{cj.editor.function}" if getattr(cj.editor, "function", None) and
                                                         f.endswith(".py") else "") for f in cj.files if f in names]
        o = getattr(cj, "overrides", None)
        if o is not None and ed.command_line:
            o = _with_command_line(o, ed.command_line)
        back = read_job(args, o)
        bad = [(k, getattr(back.parallel, k), getattr(par, k)) for k in _same(back.parallel, par)]
        if back.flushes != cj.flushes:  # pipeline runs per step (torchtitan's local batch)
            bad.append(("pipeline flushes", back.flushes, cj.flushes))
        want = {"global_batch_size": cj.job.global_batch_size, "seq_len": cj.job.seq_len, **(job or {})}  # a change keeps the batch
        bad += [(k, getattr(back.job, k), v) for k, v in want.items() if getattr(back.job, k) != v]
        ed.verified = not bad
        if bad:
            ed.problem = "read back differs in " + ", ".join(f"{k} ({a!r} vs {b!r})" for k, a, b in bad)
    except InputError as exc:
        ed.verified, ed.problem = False, f"the edited files do not read back: {exc}"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _with_command_line(o, cl: list):
    from dataclasses import replace  # noqa: PLC0415

    extra = dict(o.extra)
    for item in cl:
        k, _, v = item.partition(" ")
        extra[{"--tp": "parallel.tp", "--pp": "parallel.pp"}.get(k, k)] = int(v)
    return replace(o, extra=extra)


# --- JSON formats ------------------------------------------------------------------------------

def _json_text(doc: dict, old: str) -> str:
    """``doc`` as the text of the JSON file ``old``, changed in place where that is possible: each
    changed scalar is rewritten where its key occurs once in the file, new keys go into their
    object after its opening brace, in order, at the file's indentation and line ending; anything
    else (a removed key, a key named twice) re-writes the file at its indentation. The result
    always parses back to ``doc``."""
    try:
        text = _json_in_place(doc, json.loads(old), old, _indent_unit(old), "\r\n" if "\r\n" in old else "\n", {})
    except (ValueError, KeyError):
        text = None
    if text is not None and json.loads(text) == doc:
        return text
    out = json.dumps(doc, indent=_indent_unit(old), ensure_ascii=False) + "\n"
    return out.replace("\n", "\r\n") if "\r\n" in old else out


def _indent_unit(text: str) -> str:
    """The file's indentation step: the leading whitespace of its first indented line (2 spaces)."""
    import re  # noqa: PLC0415

    m = re.search(r"\n([ \t]+)\S", text)
    return m.group(1) if m else "  "


def _same_json(a, b) -> bool:
    """Equal as JSON values (1 is not true)."""
    return a == b and type(a) is type(b)


def _json_in_place(new: dict, old: dict, text: str, unit: str, nl: str, after: dict, parent: str | None = None) -> str | None:
    """``text`` with the scalars that differ between ``old`` and ``new`` replaced and the new keys
    inserted (``after``: where the last key inserted into each object ended); None when a change
    is not of that kind."""
    import re  # noqa: PLC0415

    if set(old) - set(new):
        return None  # a removed key
    for key, value in new.items():
        if key in old and _same_json(old[key], value):
            continue
        if key in old and isinstance(old[key], dict) and isinstance(value, dict):
            text = _json_in_place(value, old[key], text, unit, nl, after, key)
            if text is None:
                return None
            continue
        pattern = re.compile(r'("' + re.escape(key) + r'"\s*:\s*)(-?[0-9][0-9.eE+-]*|true|false|null|"(?:[^"\\]|\\.)*")')
        if key in old:
            hits = list(pattern.finditer(text))
            if len(hits) != 1 or isinstance(value, (dict, list)) or isinstance(old[key], (dict, list)):
                return None
            h = hits[0]
            text = text[:h.start(2)] + json.dumps(value, ensure_ascii=False) + text[h.end(2):]
            continue
        opener = re.compile(r"\A\s*\{" if parent is None else r'"' + re.escape(parent) + r'"\s*:\s*\{')
        hits = list(opener.finditer(text))
        if len(hits) != 1 or not old:
            return None
        at = after.get(parent, hits[0].end())
        first = re.compile(r"\s*(\S)").match(text, at)
        if first is not None and "\n" not in text[at:first.start(1)]:  # an object on one line: the key joins it there
            item = json.dumps(key, ensure_ascii=False) + ": " + json.dumps(value, ensure_ascii=False) + ", "
            text = text[:first.start(1)] + item + text[first.start(1):]
            after[parent] = first.start(1) + len(item)
            continue
        nxt = re.compile(r"\r?\n([ \t]*)\S").search(text, at)
        if nxt is None:
            return None
        indent = nxt.group(1)
        body = json.dumps(value, indent=unit, ensure_ascii=False).replace("\n", nl + indent)
        item = nl + indent + json.dumps(key, ensure_ascii=False) + ": " + body + ","
        text = text[:at] + item + text[at:]
        after[parent] = at + len(item)
    return text


class JsonEditor:
    """A DeepSpeed JSON (and, for Megatron-DeepSpeed, the script beside it)."""

    uncontrolled = ("overlap_param_gather", "async_tp_allreduce", "sequence_parallel", "tp_comm_overlap", "attention", "schedule",
                    "vpp", "etp")

    def __init__(self, path: Path, doc: dict, script_editor=None):
        self.path, self.doc, self.script = Path(path), doc, script_editor

    def edit(self, cj, par: ParallelConfig) -> Edit:
        old = cj.parallel
        doc = json.loads(json.dumps(self.doc))
        summary, command_line = [], []
        m = par.num_microbatches(cj.job.global_batch_size)
        for key, value in (("train_micro_batch_size_per_gpu", par.micro_batch_size), ("gradient_accumulation_steps", m),
                           ("train_batch_size", cj.job.global_batch_size)):
            # a key the file leaves out is one DeepSpeed infers (runtime/config.py
            # _set_batch_related_parameters): the global batch from micro x accumulation x dp, the
            # accumulation from the global batch, or 1 without it; written only where that differs
            inferred = key == "train_batch_size" or (key == "gradient_accumulation_steps" and ("train_batch_size" in doc or value == 1))
            if key in doc or not inferred:
                if doc.get(key) != value:
                    summary.append(f"{key}: {doc.get(key)} -> {value}")
                doc[key] = value
        zero = dict(doc.get("zero_optimization") or {})
        if zero.get("stage", 0) != par.zero:
            summary.append(f"zero_optimization.stage: {zero.get('stage', 0)} -> {par.zero}")
            zero["stage"] = par.zero
        want_overlap = bool(par.overlap_grad_reduce) and par.zero >= 1
        have = zero.get("overlap_comm", zero.get("stage", 0) == 3)
        if par.zero >= 1 and bool(have) != want_overlap:
            summary.append(f"zero_optimization.overlap_comm: {have} -> {want_overlap}")
            zero["overlap_comm"] = want_overlap
        if zero or "zero_optimization" in doc:  # a file without the block keeps none for no change
            doc["zero_optimization"] = zero
        if par.recompute != old.recompute:
            if par.recompute == "none":
                doc.pop("activation_checkpointing", None)
                if "pipeline" in doc:
                    doc["pipeline"]["activation_checkpoint_interval"] = 0
                summary.append("activation_checkpointing: removed")
            else:
                doc.setdefault("activation_checkpointing", {"partition_activations": par.tp > 1, "contiguous_memory_optimization": False,
                                                            "cpu_checkpointing": False})
                summary.append("activation_checkpointing: added (the model must call deepspeed.checkpointing)")
        interval = 1 if par.recompute == "full" else 0
        if par.pp > 1 and ("pipeline" in doc or interval):  # 0 is DeepSpeed's default (runtime/config.py, the pipeline block)
            doc.setdefault("pipeline", {})["activation_checkpoint_interval"] = interval
        files = {str(self.path): _json_text(doc, self.path.read_text())}
        if self.script is not None:
            sub = self.script.edit(cj, par, only=("tp", "pp", "cp", "micro_batch_size", "recompute"))
            files.update(sub.files)
            summary += sub.summary
        else:
            tp_src = cj.sources.get("parallel.tp")
            if par.tp != old.tp:
                if "tensor_parallel" in doc or par.tp > 1:
                    doc.setdefault("tensor_parallel", {})["autotp_size"] = par.tp
                    files[str(self.path)] = _json_text(doc, self.path.read_text())
                    summary.append(f"tensor_parallel.autotp_size: {old.tp} -> {par.tp}")
                elif tp_src and tp_src[1].kind == "flag":
                    command_line.append(f"--tp {par.tp}")
            lps = list(par.layers_per_stage or ())
            if par.pp != old.pp or (par.pp > 1 and lps != list(old.layers_per_stage or ())):
                command_line.append(f"--pp {par.pp}")
                uneven = len(set(lps)) > 1
                summary.append(f"pipeline degree {old.pp} -> {par.pp}: PipelineModule(num_stages={par.pp}) in the training script"
                               + (f", layers per stage {lps} (partition_method: a custom partition; the JSON cannot hold it)" if uneven else ""))
        ed = Edit("deepspeed", summary, files, command_line=command_line)
        ed.diff = unified_diff({str(self.path): self.path.read_text()}, {k: v for k, v in files.items() if k == str(self.path)})
        if self.script is not None:
            ed.diff += "".join(unified_diff({k: Path(k).read_text()}, {k: v}) for k, v in files.items() if k != str(self.path))
        return ed


class PlanDocEditor:
    def __init__(self, path: Path, doc: dict, rank: int):
        self.path, self.doc, self.rank = Path(path), doc, rank

    def edit(self, cj, par: ParallelConfig) -> Edit:
        doc = json.loads(json.dumps(self.doc))
        chosen = next(p for p in doc["plans"] if p.get("rank") == self.rank)
        old = dict(chosen.get("parallel") or {})
        new = par.as_dict()
        new["num_microbatches"] = par.num_microbatches(cj.job.global_batch_size)
        summary = [f"plans[rank {self.rank}].parallel.{k}: {old.get(k)!r} -> {v!r}" for k, v in new.items() if old.get(k) != v]
        chosen["parallel"] = {**old, **new}
        chosen.pop("predicted", None)  # the prediction was of the old configuration
        text = _json_text(doc, self.path.read_text())
        return Edit("plan", summary, {str(self.path): text}, unified_diff({str(self.path): self.path.read_text()}, {str(self.path): text}))


def MegatronEditor(path, parsed, fields, launch):  # noqa: N802  (a factory kept under the readers' name)
    from planner.check.edits_shell import ShellEditor  # noqa: PLC0415

    return ShellEditor(path, parsed, fields, launch)


def TomlEditor(path, text, overrides=None):  # noqa: N802
    from planner.check.edits_titan import TomlFileEditor  # noqa: PLC0415

    return TomlFileEditor(path, text, overrides)


def PyConfigEditor(path, text, function):  # noqa: N802
    from planner.check.edits_titan import PyFileEditor  # noqa: PLC0415

    return PyFileEditor(path, text, function)
