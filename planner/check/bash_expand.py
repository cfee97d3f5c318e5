"""Word expansion of the restricted bash reader (bash manual sec. 3.5): parameters
(``$NAME``, ``${NAME}``, ``${NAME:-word}`` and the other operators, ``${ARR[@]}``, ``$1``, ``$@``),
``$((arithmetic))``, ``$(command)``/backticks, then field splitting of unquoted results on
blanks. As bash does it: quotes inside an expanded value are ordinary characters (no second
quote removal), a quoted ``"${ARR[@]}"`` gives one field per element (none for an empty
array), pathname expansion leaves a pattern that matches no file as it is.

Values are segments of text with their :class:`planner.check.bash_lex.Origin`, so every field
of a command line knows the file and line it was written on.
"""

from __future__ import annotations

import ast
import fnmatch
import operator
import re
from dataclasses import dataclass

from planner.check.bash_lex import Origin, Src, Word, lex_word, sub_src
from planner.errors import InputError

__all__ = ["Seg", "Field", "Expander", "text_of", "segs"]


@dataclass(frozen=True)
class Seg:
    text: str
    origin: Origin


Field = tuple  # tuple[Seg, ...]


def text_of(f) -> str:
    return "".join(s.text for s in f)


def segs(text: str, origin: Origin) -> Field:
    return (Seg(text, origin),) if text else ()


_PARAM = re.compile(r"^(#?)([A-Za-z_][A-Za-z_0-9]*|[0-9]+|[@*#?$!\-])(\[[^\]]*\])?(.*)$", re.S)
_BLANK = " \t\n"


class Expander:
    """Expansion over the shell's variables (``self.vars``: name -> Field or list of Field)."""

    vars: dict
    positional: list
    script_name: str
    defaults_used: dict
    unset_used: set
    notes: list

    # --- parameters -----------------------------------------------------------------------------
    def _get(self, name: str, sub: str | None):
        """(value, is_array) of a parameter; value None when unset."""
        if name.isdigit():
            n = int(name)
            if n == 0:
                return segs(self.script_name, Origin("<shell>", 0, False)), False
            return (self.positional[n - 1] if n <= len(self.positional) else None), False
        if name in "@*":
            return list(self.positional), True
        if name == "#":
            return segs(str(len(self.positional)), Origin("<shell>", 0, False)), False
        if name in "?$!-":
            return segs("0", Origin("<shell>", 0, False)), False
        v = self.vars.get(name)
        if sub is None:
            if isinstance(v, list):
                return (v[0] if v else ()), False
            return v, False
        key = sub[1:-1]
        if key in ("@", "*"):
            if v is None:
                return None, True
            return (v if isinstance(v, list) else [v]), True
        if isinstance(v, list):
            try:
                i = int(self.arith(key, Origin("<index>", 0, False)))
            except InputError:
                return None, False
            return (v[i] if -len(v) <= i < len(v) else None), False
        return (v if key in ("0", "") else None), False

    def param(self, content: str, pos: int, src: Src, quoted: bool):
        """The expansion of ``${content}``: a Field, or a list of Fields for ``[@]``/``$@``."""
        m = _PARAM.match(content)
        here = src.origin(pos)
        if not m:
            raise InputError(f"{here.file}:{here.line}", "${" + content + "}", "a parameter expansion this reader knows")
        length, name, sub, rest = m.groups()
        value, is_array = self._get(name, sub)
        if length:
            n = len(value) if is_array and value is not None else len(text_of(value or ()))
            return segs(str(n), Origin(here.file, here.line, False))
        unset = value is None
        empty = unset or (not value if is_array else text_of(value) == "")
        if rest:
            op = next((o for o in (":-", ":=", ":+", ":?", "-", "=", "+", "?", "%%", "%", "##", "#", "//", "/", "^^", ",,", ":")
                       if rest.startswith(o)), None)
            if op is None:
                raise InputError(f"{here.file}:{here.line}", "${" + content + "}", "a parameter operator bash has")
            wstart = pos + len(content) - len(rest) + len(op)
            word = lambda: self.expand_str(lex_word(sub_src(src, wstart, pos + len(content))), sub_src(src, wstart, pos + len(content)))  # noqa: E731
            if op in (":-", "-", ":=", "="):
                if (unset if op in ("-", "=") else empty):
                    dflt = word()
                    self.defaults_used.setdefault(name, here)
                    if op in (":=", "="):
                        self.vars[name] = dflt
                    return dflt
                return value
            if op in (":+", "+"):
                return () if (unset if op == "+" else empty) else word()
            if op in (":?", "?"):
                if empty:
                    self.notes.append(f"{here.file}:{here.line}: ${{{name}}} is unset (the script would stop here)")
                return value or ()
            if is_array:
                value = [self._trim(v, op, word) for v in value or []]
                return value
            return self._trim(value or (), op, word)
        if unset:
            self.unset_used.add(name)
            return [] if is_array else ()
        return value

    def _trim(self, value, op: str, word):
        text, pat = text_of(value), text_of(word())
        o = value[0].origin if value else Origin("<shell>", 0, False)
        o = Origin(o.file, o.line, False)
        if op in ("%", "%%"):
            cands = range(len(text), -1, -1) if op == "%" else range(0, len(text) + 1)
            for i in cands:
                if fnmatch.fnmatchcase(text[i:], pat):
                    return segs(text[:i], o)
            return value
        if op in ("#", "##"):
            cands = range(0, len(text) + 1) if op == "#" else range(len(text), -1, -1)
            for i in cands:
                if fnmatch.fnmatchcase(text[:i], pat):
                    return segs(text[i:], o)
            return value
        if op in ("/", "//"):
            a, _, b = pat.partition("/")
            return segs(text.replace(a, b) if op == "//" else text.replace(a, b, 1), o) if a else value
        if op == "^^":
            return segs(text.upper(), o)
        if op == ",,":
            return segs(text.lower(), o)
        if op == ":":
            nums = pat.split(":")
            try:
                off = int(nums[0] or 0)
                out = text[off:] if len(nums) == 1 else text[off:off + int(nums[1])]
            except ValueError:
                out = text
            return segs(out, o)
        return value

    # --- arithmetic -----------------------------------------------------------------------------
    def arith(self, expr: str, where: Origin) -> int:
        """``$((expr))``: integers, + - * / % ** and comparisons, names read as variables."""
        text = expr.strip()
        text = re.sub(r"\$\{?([A-Za-z_][A-Za-z_0-9]*)\}?", r"\1", text)
        try:
            tree = ast.parse(text.replace("&&", " and ").replace("||", " or "), mode="eval")
        except SyntaxError:
            raise InputError(f"{where.file}:{where.line}", f"$(({expr}))", "arithmetic this reader evaluates") from None
        return int(self._eval(tree.body, where, expr, 0))

    def _eval(self, node, where: Origin, expr: str, depth: int) -> int:
        ops = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Pow: operator.pow,
               ast.Mod: lambda a, b: int(a - b * int(a / b)), ast.Div: lambda a, b: int(a / b), ast.FloorDiv: lambda a, b: int(a / b)}
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name):
            v = self.vars.get(node.id)
            t = text_of(v[0] if isinstance(v, list) and v else v or ()).strip() or "0"
            if depth > 8:
                return 0
            try:
                return int(t, 0)
            except ValueError:
                return self.arith(t, where) if re.fullmatch(r"[\w+\-*/%() ]+", t) else 0
        if isinstance(node, ast.BinOp) and type(node.op) in ops:
            a, b = self._eval(node.left, where, expr, depth + 1), self._eval(node.right, where, expr, depth + 1)
            if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and b == 0:
                raise InputError(f"{where.file}:{where.line}", f"$(({expr}))", "no division by zero")
            return ops[type(node.op)](a, b)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd, ast.Not)):
            v = self._eval(node.operand, where, expr, depth + 1)
            return -v if isinstance(node.op, ast.USub) else (int(not v) if isinstance(node.op, ast.Not) else v)
        if isinstance(node, ast.Compare) and len(node.ops) == 1:
            cmp = {ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge, ast.Eq: operator.eq, ast.NotEq: operator.ne}
            if type(node.ops[0]) in cmp:
                return int(cmp[type(node.ops[0])](self._eval(node.left, where, expr, depth + 1), self._eval(node.comparators[0], where, expr, depth + 1)))
        if isinstance(node, ast.BoolOp):
            vals = [self._eval(v, where, expr, depth + 1) for v in node.values]
            return int(all(vals) if isinstance(node.op, ast.And) else any(vals))
        raise InputError(f"{where.file}:{where.line}", f"$(({expr}))", "arithmetic this reader evaluates (+ - * / % ** and comparisons)")

    # --- words ----------------------------------------------------------------------------------
    def _pieces(self, word: Word, src: Src) -> list:
        """(kind, payload) pieces: ("text", Field, splittable) or ("fields", [Field], splittable)."""
        out = []
        for kind, text, pos, quoted in word.parts:
            if kind == "lit":
                out.append(("text", segs(text, src.origin(pos)) if text else (), False, quoted))
                continue
            here = src.origin(pos)
            if kind == "param":
                v = self.param(text, pos, src, quoted)
                if isinstance(v, list):
                    out.append(("fields", v, not quoted, quoted))
                else:
                    out.append(("text", v, not quoted, quoted))
            elif kind == "arith":
                inner = self.expand_str(lex_word(sub_src(src, pos, pos + len(text))), sub_src(src, pos, pos + len(text)))
                out.append(("text", segs(str(self.arith(text_of(inner), here)), Origin(here.file, here.line, False)), not quoted, quoted))
            else:
                out.append(("text", segs(self.substitute(sub_src(src, pos, pos + len(text))), Origin(here.file, here.line, False)),
                            not quoted, quoted))
        return out

    def expand_str(self, word: Word, src: Src) -> Field:
        """One string, no field splitting (assignments, ``[[ ]]``, here-documents, quoted
        contexts); arrays join their elements with spaces."""
        out: list = []
        for kind, payload, _, _ in self._pieces(word, src):
            if kind == "fields":
                for i, f in enumerate(payload):
                    if i:
                        out.append(Seg(" ", f[0].origin if f else Origin("<shell>", 0, False)))
                    out.extend(f)
            else:
                out.extend(payload)
        return tuple(out)

    def expand(self, word: Word, src: Src) -> list:
        """The fields of one word (bash: expansion, then splitting of unquoted results)."""
        fields: list[list] = []
        cur: list | None = None  # None: no field started yet
        for kind, payload, split, quoted in self._pieces(word, src):
            items = payload if kind == "fields" else [payload]
            for n, item in enumerate(items):
                if kind == "fields" and n > 0:
                    if cur is not None:
                        fields.append(cur)
                    cur = None
                    if not split:
                        cur = []
                if not split:
                    cur = (cur if cur is not None else []) + list(item)
                    if quoted and cur is not None:
                        pass
                    continue
                for s in item:
                    chunk = ""
                    for ch in s.text:
                        if ch in _BLANK:
                            if chunk:
                                cur = (cur or []) + [Seg(chunk, s.origin)]
                                chunk = ""
                            if cur is not None:
                                fields.append(cur)
                                cur = None
                        else:
                            chunk += ch
                    if chunk:
                        cur = (cur or []) + [Seg(chunk, s.origin)]
            if kind == "text" and not split and quoted and cur is None:
                cur = []
        if cur is not None:
            fields.append(cur)
        return [tuple(f) for f in fields]

    def expand_all(self, words: list, src: Src) -> list:
        out = []
        for w in words:
            out.extend(self.expand(w, src))
        return out

    def substitute(self, src: Src) -> str:  # command substitution, provided by the shell
        raise NotImplementedError
