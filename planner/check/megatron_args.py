"""Megatron-LM's command line as argparse reads it, from the flag table of the snapshot's parser
(``data/megatron_args.json``: arity, type, choices of every option) and the meaning of each flag
(``data/megatron_flags.yaml``: cost, unmodelled, ignored, rejected, legacy).

:func:`parse_argv` follows argparse (``allow_abbrev=False``, arguments.py:120): ``--flag value``
and ``--flag=value``; a value may not start with ``-`` unless it is a negative number; the
last occurrence of a flag wins; an unknown flag or a stray word is an error naming it.
"""

from __future__ import annotations

import difflib
import fnmatch
import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources

import yaml

from planner.check.bash_expand import text_of
from planner.errors import InputError

__all__ = ["FlagTable", "flag_table", "Parsed", "parse_argv"]

# Cost flags whose value only hints at the vocabulary: a template may leave them empty.
_SOFT = {"--tokenizer-model", "--vocab-file", "--tokenizer-type"}
_NEG = re.compile(r"^-\d+$|^-\d*\.\d+$")


@dataclass(frozen=True)
class FlagTable:
    arity: dict  # flag -> (nargs, type, choices, default)
    cost: dict
    unmodelled: dict
    ignored: tuple  # (reason, pattern)
    rejected: dict
    legacy: dict

    def role(self, flag: str, legacy: bool = False) -> tuple[str, str]:
        """(class, meaning) of a flag."""
        if legacy and flag in self.legacy:
            return "legacy", self.legacy[flag][2]
        for cls in ("cost", "unmodelled", "rejected"):
            table = getattr(self, cls)
            if flag in table:
                return cls, table[flag]
        for reason, pat in self.ignored:
            if fnmatch.fnmatchcase(flag, pat):
                return "ignored", reason
        return "unknown", ""

    def is_default(self, flag: str, values: list) -> bool:
        """The value given is the parser's default (a flag that changes nothing)."""
        spec = self.arity.get(flag)
        if spec is None or spec[0] != 1 or not values or spec[3] is None:
            return False
        try:
            return {"int": int, "float": float}.get(spec[1], str)(values[0]) == spec[3]
        except ValueError:
            return False

    def spec(self, flag: str, legacy: bool) -> tuple | None:
        if legacy and flag in self.legacy:
            n, choices, _ = self.legacy[flag]
            return (n, "int" if choices is None and n else ("str" if n else None), choices, None)
        return self.arity.get(flag)


@lru_cache(maxsize=1)
def flag_table() -> FlagTable:
    base = resources.files("planner.check") / "data"
    arity = json.loads((base / "megatron_args.json").read_text())["flags"]
    cls = yaml.safe_load((base / "megatron_flags.yaml").read_text())
    ignored = tuple((g["reason"], p) for g in cls["ignored"] for p in g["flags"])
    return FlagTable({k: tuple(v) for k, v in arity.items()}, dict(cls["cost"]), dict(cls["unmodelled"]), ignored,
                     dict(cls["rejected"]), {k: tuple(v) for k, v in cls["legacy"].items()})


@dataclass
class Parsed:
    """Flags as given: flag -> list of value strings (last occurrence), with the fields of
    every occurrence (for edits)."""

    values: dict = field(default_factory=dict)
    fields: dict = field(default_factory=dict)  # flag -> [(flag field, [value fields])] every occurrence
    order: list = field(default_factory=list)
    legacy: bool = False
    where: str = ""
    split_words: list = field(default_factory=list)  # flags whose quoted value the shell split into several words

    def has(self, flag: str) -> bool:
        return flag in self.values

    def one(self, flag: str, default=None):
        v = self.values.get(flag)
        return v[0] if v else default

    def many(self, flag: str, default=None):
        return self.values.get(flag, default)

    def int(self, flag: str, default=None):
        v = self.one(flag)
        return default if v is None else int(v)

    def line(self, flag: str) -> str:
        """``file:line`` of the (last) occurrence of ``flag``."""
        occ = self.fields.get(flag)
        if not occ:
            return self.where
        o = occ[-1][0][0].origin if occ[-1][0] else None
        return f"{_short(o.file)}:{o.line}" if o and o.line else self.where


def _short(path: str) -> str:
    return path.rsplit("/", 1)[-1]


def detect_legacy(words: list[str]) -> list[str]:
    """The flags of the 2021 engine (``legacy``) that the current parser does not have."""
    t = flag_table()
    return [w.split("=", 1)[0] for w in words if w.split("=", 1)[0] in t.legacy and w.split("=", 1)[0] not in t.arity
            or (w.split("=", 1)[0] == "--checkpoint-activations")]


def parse_argv(fields: list, where: str, legacy: bool = False, extra: dict | None = None) -> Parsed:
    """Parse ``pretrain_gpt.py`` arguments (fields with origins) as Megatron-LM's argparse does;
    InputError(file:line flag, value, expected) on an unknown flag, a missing or mistyped value."""
    t = flag_table()
    out = Parsed(legacy=legacy, where=where)
    words = [text_of(f) for f in fields]
    i = 0

    def loc(k: int) -> str:
        o = fields[k][0].origin if fields[k] else None
        return f"{_short(o.file)}:{o.line}" if o and o.line else where

    while i < len(words):
        w = words[i]
        if not w.startswith("-") or _NEG.match(w):
            prev = out.order[-1] if out.order else None
            occ = out.fields.get(prev, [])
            last = occ[-1][1][-1] if occ and occ[-1][1] else None
            if last and fields[i] and last[0].origin == fields[i][0].origin and ((extra or {}).get(prev) or t.spec(prev, legacy) or (0, None))[1] == "str":
                # One quoted element word-split by an unquoted ${ARR[@]}: argparse would reject the
                # extra words ("unrecognized arguments"); read them as the value they were meant to be.
                out.values[prev] = [out.values[prev][-1] + " " + w]
                occ[-1] = (occ[-1][0], occ[-1][1] + [fields[i]])
                if prev not in out.split_words:
                    out.split_words.append(prev)
                i += 1
                continue
            raise InputError(f"{loc(i)}", w, "a pretrain_gpt.py flag (argparse: unrecognized argument)")
        flag, eq, inline = w.partition("=")
        spec = extra[flag][:3] + (None,) if extra and flag in extra else t.spec(flag, legacy)
        if spec is None:
            close = difflib.get_close_matches(flag, list(t.arity), n=2, cutoff=0.75)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise InputError(f"{loc(i)}", flag, f"a flag of Megatron-LM's pretrain_gpt.py{hint}")
        nargs, typ, choices, _ = spec
        vals: list[int] = []
        if eq:
            if nargs == 0:
                raise InputError(f"{loc(i)} {flag}", inline, "no value (a switch)")
            vals_text = [inline]
            j = i + 1
        else:
            j = i + 1
            want = {0: 0, 1: 1}.get(nargs, nargs if isinstance(nargs, int) else None)
            while j < len(words) and (want is None or len(vals) < want):
                nxt = words[j]
                if nxt.startswith("-") and not _NEG.match(nxt) and len(nxt) > 1:
                    break
                vals.append(j)
                j += 1
            vals_text = [words[k] for k in vals]
            if (want and len(vals) < want) or (nargs == "+" and not vals):
                role, _ = t.role(flag, legacy)
                if role != "cost" or flag in _SOFT:  # a template's empty placeholder (--vocab-file ${BPE_VOCAB_FILE}, $3)
                    out.order.append(flag)
                    out.values[flag] = [""]
                    out.fields.setdefault(flag, []).append((fields[i], []))
                    i = j
                    continue
                raise InputError(f"{loc(i)} {flag}", None, f"{want or 'at least one'} value(s)")
        for v in vals_text:
            if typ == "int":
                try:
                    int(v)
                except ValueError:
                    raise InputError(f"{loc(i)} {flag}", v, "an integer (argparse type=int)") from None
            elif typ == "float":
                try:
                    float(v)
                except ValueError:
                    raise InputError(f"{loc(i)} {flag}", v, "a number (argparse type=float)") from None
            if choices and v not in choices:
                raise InputError(f"{loc(i)} {flag}", v, "one of " + ", ".join(choices))
        out.values[flag] = vals_text
        out.fields.setdefault(flag, []).append((fields[i], [fields[k] for k in vals]))
        out.order.append(flag)
        i = j
    return out


__all__.append("detect_legacy")
