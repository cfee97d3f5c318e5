"""Edits of a Megatron-LM launch script or flags file: the flags a configuration needs
(:func:`megatron_flags`), compared with the flags the script passes, applied where each one is
written. The bash reader knows the file and line of every word (:mod:`planner.check.bash_lex`):

* a changed value is rewritten where its text is written (``MICRO_BATCH_SIZE=1`` becomes
  ``MICRO_BATCH_SIZE=2`` when the flag reads the variable); a value computed by the script
  (``$((3*PP))``) is overridden instead by the flag repeated at the end of the command
  (argparse keeps the last occurrence);
* a flag to remove is cut from its line, with its values;
* a flag to add is appended to the end of the launch command.
"""

from __future__ import annotations

import re
from pathlib import Path

from planner.check.bash_expand import text_of
from planner.check.edits import Edit, unified_diff
from planner.emit.megatron import pipeline_layout
from planner.errors import InputError
from planner.specs import ParallelConfig

__all__ = ["ShellEditor", "megatron_flags"]

_PIPE = ("--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank", "--pipeline-model-parallel-layout",
         "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers", "--account-for-embedding-in-pipeline-split",
         "--account-for-loss-in-pipeline-split")
_REC = ("--recompute-granularity", "--recompute-method", "--recompute-num-layers", "--recompute-modules", "--recompute-activations",
        "--moe-layer-recompute", "--activations-checkpoint-method", "--activations-checkpoint-num-layers", "--checkpoint-activations",
        "--checkpoint-num-layers")
_SHARD = ("--use-distributed-optimizer", "--use-megatron-fsdp", "--data-parallel-sharding-strategy", "--use-torch-fsdp2",
          "--torch-fsdp2-no-reshard-after-forward", "--num-distributed-optimizer-instances")


def megatron_flags(par: ParallelConfig, old: ParallelConfig, model, legacy: bool, layers: int) -> dict:
    """flag -> desired state (a list of values, True for a switch, None for absent) for the
    settings that differ between ``old`` and ``par``."""
    want: dict = {}
    if par.tp != old.tp:
        want["--tensor-model-parallel-size"] = [str(par.tp)]
    if par.pp != old.pp:
        want["--pipeline-model-parallel-size"] = [str(par.pp)]
    if par.cp != old.cp:
        want["--context-parallel-size"] = [str(par.cp)]
    if par.ep != old.ep:
        want["--expert-model-parallel-size"] = [str(par.ep)]
    if model.moe is not None and (par.etp != old.etp or par.tp != old.tp):
        want["--expert-tensor-parallel-size"] = [str(par.etp)]
    sp_old, sp_new = bool(old.sequence_parallel and old.tp > 1), bool(par.sequence_parallel and par.tp > 1)
    if sp_old != sp_new:
        want["--sequence-parallel"] = True if sp_new else None
    if par.micro_batch_size != old.micro_batch_size:
        want["--micro-batch-size"] = [str(par.micro_batch_size)]
    lps_new = tuple(par.layers_per_stage or ())
    if (par.pp, par.vpp, lps_new) != (old.pp, old.vpp, tuple(old.layers_per_stage or ())):
        for f in _PIPE:
            want[f] = None
        even = len(set(lps_new)) <= 1
        if par.pp > 1 and not even:
            mid = set(lps_new[1:-1])
            if len(mid) <= 1 and all(n % par.vpp == 0 for n in lps_new):
                want["--decoder-first-pipeline-num-layers"] = [str(lps_new[0])]
                want["--decoder-last-pipeline-num-layers"] = [str(lps_new[-1])]
                if par.vpp > 1:
                    want["--num-virtual-stages-per-pipeline-rank"] = [str(par.vpp)]
            else:
                want["--pipeline-model-parallel-layout"] = [pipeline_layout(lps_new, par.vpp, model.mtp_layers)]
        elif par.vpp > 1:
            if (layers // par.pp) % par.vpp == 0:
                want["--num-virtual-stages-per-pipeline-rank"] = [str(par.vpp)]
            else:
                want["--pipeline-model-parallel-layout"] = [pipeline_layout(lps_new, par.vpp, model.mtp_layers)]
    if par.recompute != old.recompute:
        for f in _REC:
            want[f] = None
        if par.recompute == "selective":
            if legacy:
                raise InputError("recompute", "selective", "none or full on the 2021 engine (megatron-legacy)")
            want["--recompute-granularity"] = ["selective"]
        elif par.recompute == "full":
            if legacy:
                want["--activations-checkpoint-method"] = ["uniform"]
            else:
                want.update({"--recompute-granularity": ["full"], "--recompute-method": ["uniform"], "--recompute-num-layers": ["1"]})
    if par.zero != old.zero or (par.zero_shard_degree or 0) != (old.zero_shard_degree or 0):
        for f in _SHARD:
            want[f] = None
        if legacy and par.zero:
            raise InputError("zero", par.zero, "0 on the 2021 engine (megatron-legacy has no distributed optimizer)")
        if par.zero >= 1:
            want["--use-distributed-optimizer"] = True
        if par.zero >= 2:
            want["--use-megatron-fsdp"] = True
            want["--data-parallel-sharding-strategy"] = ["optim_grads" if par.zero == 2 else "optim_grads_params"]
            want["--ckpt-format"] = ["fsdp_dtensor"]
        if par.zero_shard_degree and par.zero >= 1 and par.zero_shard_degree < par.dp * par.cp:
            want["--num-distributed-optimizer-instances"] = [str(par.dp * par.cp // par.zero_shard_degree)]
    fsdp = par.zero >= 2
    if legacy and bool(par.overlap_grad_reduce) != bool(old.overlap_grad_reduce):
        want["--DDP-impl"] = ["torch" if par.overlap_grad_reduce else "local"]
    if bool(par.overlap_grad_reduce) != bool(old.overlap_grad_reduce) and not fsdp and not legacy:
        want["--overlap-grad-reduce"] = True if par.overlap_grad_reduce else None
    if bool(par.overlap_param_gather) != bool(old.overlap_param_gather) and par.zero in (1, 2) and not legacy:
        want["--overlap-param-gather"] = True if par.overlap_param_gather else None
        if par.overlap_param_gather:
            want["--overlap-grad-reduce"] = True
    elif bool(old.overlap_param_gather) and not par.overlap_param_gather and par.zero == 0:
        want["--overlap-param-gather"] = None
    tco_new = bool(par.tp_comm_overlap and sp_new)
    if tco_new != bool(old.tp_comm_overlap and sp_old):
        want["--tp-comm-overlap"] = True if tco_new else None
    if bool(par.moe_a2a_overlap) != bool(old.moe_a2a_overlap):
        want["--overlap-moe-expert-parallel-comm"] = True if par.moe_a2a_overlap else None
    new_d, old_d = par.moe_dispatcher or "alltoall", old.moe_dispatcher or "alltoall"
    if new_d != old_d:
        want["--moe-token-dispatcher-type"] = ["alltoall" if new_d == "alltoall" else "flex"]
        want["--moe-flex-dispatcher-backend"] = None if new_d == "alltoall" else [new_d]
        want["--moe-enable-deepep"] = None  # deprecated; Megatron refuses it beside a backend or without flex
    new_g, old_g = par.cuda_graph or "none", old.cuda_graph or "none"
    if new_g != old_g:
        want["--cuda-graph-impl"] = None if new_g == "none" else ["local" if new_g == "layer" else "full_iteration"]
        want["--enable-cuda-graph"] = want["--external-cuda-graph"] = None  # deprecated; refused beside --cuda-graph-impl
        want["--cuda-graph-modules"] = want["--cuda-graph-scope"] = None  # whole layers or the step (full_iteration refuses modules)
        if new_g == "full_iteration":
            want["--no-check-for-nan-in-loss-and-grad"] = True
    return want


def a2a_overlap_companions(want: dict, parsed) -> None:
    """The flags Megatron-core asks for beside ``--overlap-moe-expert-parallel-comm``
    (transformer_config.py): the alltoall or flex dispatcher (Megatron's default is allgather),
    no ``--moe-shared-expert-overlap``; and, when the overlap goes, no ``--delay-wgrad-compute``
    (which needs it)."""
    state = want.get("--overlap-moe-expert-parallel-comm", "unchanged")
    if state is True:
        if (parsed.one("--moe-token-dispatcher-type") or "allgather") not in ("alltoall", "flex"):
            want["--moe-token-dispatcher-type"] = ["alltoall"]
        if parsed.has("--moe-shared-expert-overlap"):
            want["--moe-shared-expert-overlap"] = None
    elif state is None and parsed.has("--delay-wgrad-compute"):
        want["--delay-wgrad-compute"] = None


class ShellEditor:
    uncontrolled = ("async_tp_allreduce", "attention")

    def __init__(self, path, parsed, fields, launch):
        self.path, self.parsed, self.fields, self.launch = Path(path), parsed, fields, launch

    # --- the source text ----------------------------------------------------------------------
    def _lines(self, texts: dict, file: str) -> list[str]:
        if file not in texts:
            texts[file] = Path(file).read_text(encoding="utf-8", errors="replace")
        return texts[file].split("\n")

    def edit(self, cj, par: ParallelConfig, only: tuple | None = None) -> Edit:
        p = self.parsed
        want = megatron_flags(par, cj.parallel, cj.model, p.legacy, cj.model.layers)
        a2a_overlap_companions(want, p)
        if only is not None:
            # Megatron-DeepSpeed's script beside its JSON: the degrees, and the micro-batch and
            # recompute it states as Megatron flags (--micro-batch-size, --checkpoint-activations /
            # --recompute-*, DeepSpeed's --deepspeed-activation-checkpointing)
            keep = {"tp": ("--tensor-model-parallel-size",), "pp": ("--pipeline-model-parallel-size",) + _PIPE, "cp": ("--context-parallel-size",),
                    "micro_batch_size": ("--micro-batch-size",), "recompute": _REC + ("--deepspeed-activation-checkpointing",)}
            if "recompute" in only and par.recompute == "none" and cj.parallel.recompute != "none":
                want["--deepspeed-activation-checkpointing"] = None
            allowed = {f for k in only for f in keep[k]}
            want = {f: v for f, v in want.items() if f in allowed}
        return self.edit_flags(want)

    def edit_flags(self, want: dict) -> Edit:
        """The script with each flag of ``want`` in its desired state (a list of values, True for
        a switch, None for absent): changed in place where it is written, else appended to the
        launch command."""
        p = self.parsed
        texts: dict = {}
        edits: dict = {}  # file -> {line index: new line}
        appended: list[str] = []
        summary: list[str] = []
        for flag, state in want.items():
            present = p.has(flag)
            if state is None:
                if present:
                    self._remove(flag, texts, edits, summary)
                continue
            if present and state is True:
                continue
            if present and p.many(flag) == state:
                continue
            if present and isinstance(state, list) and self._set(flag, state, texts, edits):
                summary.append(f"{flag} {' '.join(map(_quote, p.many(flag)))} -> {' '.join(map(_quote, state))}")
                continue
            words = [flag] + (state if isinstance(state, list) else [])
            if present and isinstance(state, list):
                summary.append(f"{flag} {' '.join(map(_quote, p.many(flag)))} -> {' '.join(map(_quote, state))} (repeated at the end of the command: the last one wins)")
            else:
                summary.append(f"add {' '.join(map(_quote, words))}")
            appended.extend(words)
        if appended:
            self._append(appended, texts, edits)
        if any(f == "--use-megatron-fsdp" and v is True for f, v in want.items()):
            summary.append("note: Megatron-FSDP needs CUDA_DEVICE_MAX_CONNECTIONS unset or > 1 (arguments.py validate_args)")
        new_files = {}
        for file, changes in edits.items():
            lines = self._lines(texts, file)
            for i, text in changes.items():
                lines[i] = text
            new_files[file] = "\n".join(lines)
        ed = Edit("megatron", summary, new_files)
        ed.diff = unified_diff({f: Path(f).read_text(encoding="utf-8", errors="replace") for f in new_files}, new_files)
        return ed

    def _line_of(self, seg_origin) -> tuple[str, int] | None:
        if seg_origin is None or not seg_origin.literal or not seg_origin.line or not Path(seg_origin.file).is_file():
            return None
        return seg_origin.file, seg_origin.line - 1

    def _get(self, texts, edits, file, i) -> str:
        return edits.get(file, {}).get(i, self._lines(texts, file)[i])

    def _put(self, edits, file, i, text) -> None:
        edits.setdefault(file, {})[i] = text

    def _remove(self, flag: str, texts, edits, summary) -> None:
        for flag_field, values in self.parsed.fields.get(flag, []):
            loc = self._line_of(flag_field[0].origin if flag_field else None)
            if loc is None:
                summary.append(f"remove {flag} (built by the script; edit it by hand)")
                continue
            file, i = loc
            line = self._get(texts, edits, file, i)
            new, left = _cut_words(line, flag, len(values))
            j = i
            while left and line.rstrip().endswith("\\") and j + 1 < len(self._lines(texts, file)):
                j += 1
                line2 = self._get(texts, edits, file, j)
                line2_new, left = _cut_first(line2, left)
                self._put(edits, file, j, line2_new)
                line = line2
            self._put(edits, file, i, new)
            summary.append(f"remove {flag}" + (f" {' '.join(text_of(v) for v in values)}" if values else ""))

    def _set(self, flag: str, values: list[str], texts, edits) -> bool:
        """Rewrite the last occurrence's values where their text is written."""
        occ = self.parsed.fields.get(flag, [])
        if not occ or len(occ[-1][1]) != len(values) or any(_quote(v) != v for v in values):
            return False  # (a value that needs quoting is appended quoted instead)
        plan = []
        for field, new in zip(occ[-1][1], values):
            if len(field) != 1:
                return False
            loc = self._line_of(field[0].origin)
            if loc is None:
                return False
            line = self._get(texts, edits, *loc)
            old = field[0].text
            # the value right after the flag where both are on the line (another flag's equal value
            # on the same line stays), else the value's word wherever the script writes it
            rep = _replace_after_flag(line, flag, old, new) if len(values) == 1 else None
            rep = rep if rep is not None else _replace_value(line, old, new)
            if rep is None:
                return False
            plan.append((loc, rep))
        for (file, i), rep in plan:
            self._put(edits, file, i, rep)
        return True

    def _append(self, words: list[str], texts, edits) -> None:
        """Append ``words`` to the end of the launch command (the end of a flags file)."""
        add = " ".join(_quote(w) for w in words)
        if self.launch is None or self.launch.command is None:
            file = str(self.path)
            lines = self._lines(texts, file)
            last = max(i for i, ln in enumerate(lines) if ln.strip() or i == 0)
            self._put(edits, file, last, self._get(texts, edits, file, last).rstrip() + " " + add)
            return
        o = self.launch.command.origin
        file = o.file if Path(o.file).is_file() else str(self.path)
        lines = self._lines(texts, file)
        i = o.line - 1
        first = self.launch.command.words()[0]
        close = _string_end(self._get(texts, edits, file, i), first)
        if close is not None:  # the command is the text of a string (CMD="python ... "): add inside it
            line = self._get(texts, edits, file, i)
            self._put(edits, file, i, line[:close].rstrip() + " " + add + line[close:])
            return
        while i + 1 < len(lines) and self._get(texts, edits, file, i).rstrip().endswith("\\"):
            i += 1
        line = self._get(texts, edits, file, i)
        body, comment = _split_comment(line)
        self._put(edits, file, i, body.rstrip() + " " + add + (" " + comment if comment else ""))


def _string_end(line: str, word: str) -> int | None:
    """Where the double-quoted string that holds ``word`` closes on ``line``, or None when the
    word is not inside such a string (or the string goes on to the next line)."""
    q, start = None, None
    for k, ch in enumerate(line):
        if q == '"' and ch == "\\":
            continue
        if q is None and ch in "'\"":
            q, start = ch, k
        elif q is not None and ch == q and (k == 0 or line[k - 1] != "\\"):
            if q == '"' and word in line[start:k]:
                return k
            q = None
    return None


def _quote(w: str) -> str:
    """``w`` as one shell word: bare when it holds no character the shell treats specially
    (parentheses, globs, pipes...), else single-quoted."""
    return w if re.fullmatch(r"[\w.,:/=+\-@%]+", w) else "'" + w.replace("'", "'\\''") + "'"


def _split_comment(line: str) -> tuple[str, str]:
    """(code, comment) of a shell line: a # that starts a word outside quotes."""
    q = None
    for i, ch in enumerate(line):
        if q:
            if ch == q:
                q = None
        elif ch in "'\"":
            q = ch
        elif ch == "#" and (i == 0 or line[i - 1] in " \t"):
            return line[:i], line[i:]
    return line, ""


def _tokens(line: str) -> list[tuple[int, int, str]]:
    """(start, end, bare text) of the blank-separated words of ``line`` (quotes kept in the
    span, stripped in the text)."""
    out, i, n = [], 0, len(line)
    while i < n:
        while i < n and line[i] in " \t":
            i += 1
        if i >= n or line[i] == "#":
            break
        start, q = i, None
        while i < n and (q or line[i] not in " \t"):
            if q and line[i] == q:
                q = None
            elif not q and line[i] in "'\"":
                q = line[i]
            i += 1
        out.append((start, i, line[start:i]))
    return out


def _bare(tok: str) -> str:
    return tok.strip("\"'()")


def _cut_words(line: str, flag: str, n_values: int) -> tuple[str, int]:
    """Remove ``flag`` (or ``flag=value``) and the next ``n_values`` words from ``line``;
    (new line, values still to remove on the next lines)."""
    toks = _tokens(line)
    for k, (a, b, t) in enumerate(toks):
        bare = _bare(t)
        if bare == flag or bare.startswith(flag + "="):
            left = 0 if "=" in bare else n_values
            end_k = k
            while left and end_k + 1 < len(toks) and toks[end_k + 1][2] != "\\":
                end_k += 1
                left -= 1
            start, end = a, toks[end_k][1]
            text = line[start:end]
            keep = "".join(ch for ch in text if ch in "\"'") if text.count('"') % 2 or text.count("'") % 2 else ""
            lead = len(text) - len(text.lstrip("("))
            trail = len(text) - len(text.rstrip(")"))
            keep = text[:lead] + keep + (text[len(text) - trail:] if trail else "")  # an array's ( and ) stay
            new = line[:start] + keep + line[end:]
            new = re.sub(r'(^|\s)(""|\'\')(?=\s|$)', r"\1", new)
            return re.sub(r"(?<=\S)[ \t]{2,}", " ", new.rstrip()) if new.strip() else "", left
    for a, b, t in toks:  # inside a quoted element: "--fp8-format hybrid"
        if len(t) > 1 and t[0] in "\"'" and t[-1] == t[0]:
            inner = t[1:-1].split()
            if flag in inner:
                k = inner.index(flag)
                rest = inner[:k] + inner[k + 1 + n_values:]
                rep = (t[0] + " ".join(rest) + t[0]) if rest else ""
                new = line[:a] + rep + line[b:]
                return (new.rstrip() if new.strip() else ""), 0
    body, comment = _split_comment(line)  # inside a string: VAR="... --flag value ..."
    m = re.search(r"(?<![\w\-])" + re.escape(flag) + r"(?:=\S+|" + r"(?:[ \t]+[^\s\"'\\]+)" * n_values + r")?(?=[\s\"']|$)", body)
    if m:
        new = body[:m.start()] + body[m.end():]
        new = re.sub(r"(?<=\S)[ \t]{2,}", " ", new)
        new = re.sub(r"(?<=[\s(])(\"\s*\"|'\s*')(?=[\s)]|$)", "", new)  # an element left empty
        return new.rstrip() + comment if (new + comment).strip() else "", 0
    return line, 0


def _cut_first(line: str, n: int) -> tuple[str, int]:
    toks = [t for t in _tokens(line) if t[2] != "\\"]
    if not toks:
        return line, n
    k = min(n, len(toks))
    return line[:toks[0][0]] + line[toks[k - 1][1]:].lstrip(), n - k


def _replace_after_flag(line: str, flag: str, old: str, new: str) -> str | None:
    """``line`` with the value ``old`` that follows ``flag`` (``--flag old`` or ``--flag=old``)
    replaced by ``new``; None when the line does not hold the flag with that value."""
    body, comment = _split_comment(line)
    pat = re.compile(r"(?<!\S)" + re.escape(flag) + r"(=|\s+)(['\"]?)" + re.escape(old) + r"(\2)(?![\w.])")
    matches = list(pat.finditer(body))
    if not matches:
        return None
    m = matches[-1]  # the last occurrence wins, as in argparse
    start = m.start(0) + len(flag) + len(m.group(1)) + len(m.group(2))
    return body[:start] + new + body[start + len(old):] + comment


def _replace_value(line: str, old: str, new: str) -> str | None:
    """``line`` with the word ``old`` (a value, ``NAME=old``, ``${NAME:-old}``) replaced by ``new``."""
    pat = re.compile(r"(?<![\w.\-])" + re.escape(old) + r"(?![\w.])")
    body, comment = _split_comment(line)
    m = pat.search(body)
    if m is None:
        return None
    return body[:m.start()] + new + body[m.end():] + comment
