"""Tokens of the restricted bash reader (:mod:`planner.check.bash`): words made of parts
(literal text, ``$NAME``/``${...}``, ``$(...)``/backticks, ``$((...))``), operators,
redirections with here-document bodies, and ``NAME=( ... )`` array literals.

Every piece of text keeps where it came from (:class:`Origin`: file and line, and whether it
is literal text an edit may rewrite in place), also after a string built by the script is
parsed again (``bash -c "$CMD"``, an ``sbatch <<EOF`` body): :class:`Src` maps each character of
the text being read back to its origin. Quoting follows the bash manual (sec. 3.1.2 Quoting,
3.5 Shell Expansions): backslash-newline is removed outside single quotes; inside double
quotes ``\\`` escapes only ``$ ` " \\`` and newline.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from planner.errors import InputError

__all__ = ["Origin", "Src", "Word", "Op", "Redir", "ArrayAssign", "lex"]


@dataclass(frozen=True)
class Origin:
    """Where a piece of text came from: ``file``:``line``; ``literal`` when it is written as is
    in that line (so an edit can replace it there), not computed (arithmetic, substitution)."""

    file: str
    line: int
    literal: bool = True


@dataclass
class Src:
    """Text to read plus the origin of each character (breakpoints: offset -> origin)."""

    text: str
    starts: list[int] = field(default_factory=list)
    origins: list[Origin] = field(default_factory=list)

    @classmethod
    def of_file(cls, text: str, file: str, first_line: int = 1) -> "Src":
        starts, origins, pos = [], [], 0
        for i, line in enumerate(text.split("\n")):
            starts.append(pos)
            origins.append(Origin(file, first_line + i))
            pos += len(line) + 1
        return cls(text, starts, origins)

    @classmethod
    def of_segments(cls, segs) -> "Src":
        """A string built by the script (segments of text with their origins), to read again."""
        text, starts, origins = [], [], []
        pos = 0
        for s in segs:
            if not s.text:
                continue
            starts.append(pos)
            origins.append(s.origin)
            text.append(s.text)
            pos += len(s.text)
        return cls("".join(text), starts or [0], origins or [Origin("<string>", 0, False)])

    def origin(self, pos: int) -> Origin:
        i = bisect.bisect_right(self.starts, pos) - 1
        return self.origins[max(i, 0)]

    def breaks(self) -> set[int]:
        return set(self.starts)


# Word parts: ("lit", text, pos, quoted) | ("param", content, pos, quoted) | ("cmd", text, pos, quoted)
# | ("arith", text, pos, quoted); pos is the offset of the part in the Src.
@dataclass
class Word:
    parts: list
    pos: int

    def literal(self) -> str | None:
        """The word's text when it is plain unquoted literal text (reserved words, names)."""
        if all(p[0] == "lit" and not p[3] for p in self.parts):
            return "".join(p[1] for p in self.parts)
        return None

    def flat(self) -> str:
        """The source-ish text (for messages)."""
        out = []
        for kind, text, _, _ in self.parts:
            out.append(text if kind == "lit" else {"param": "${%s}", "cmd": "$(%s)", "arith": "$((%s))"}[kind] % text)
        return "".join(out)


@dataclass
class Op:
    text: str
    pos: int


@dataclass
class Redir:
    op: str
    target: Word | None
    pos: int
    body: "Src | None" = None  # here-document text
    body_expand: bool = True


@dataclass
class ArrayAssign:
    name: str
    append: bool
    elements: list
    pos: int


_OPS = ("&&", "||", ";;", "|&", ";", "&", "|", "(", ")")
_META = set(" \t\n;&|()<>")


class _Lexer:
    def __init__(self, src: Src, where: str):
        self.src, self.s, self.i, self.where = src, src.text, 0, where
        self.breaks = src.breaks()
        self.tokens: list = []
        self.pending_heredocs: list[tuple[Redir, str, bool]] = []

    def fail(self, what: str, expected: str):
        o = self.src.origin(min(self.i, max(len(self.s) - 1, 0)))
        raise InputError(f"{o.file}:{o.line}", what, expected)

    # --- top level ---------------------------------------------------------------------------
    def run(self) -> list:
        s = self.s
        while self.i < len(s):
            c = s[self.i]
            if c in " \t":
                self.i += 1
            elif c == "\\" and s.startswith("\\\n", self.i):
                self.i += 2
            elif c == "\n":
                self.tokens.append(Op("\n", self.i))
                self.i += 1
                self._heredoc_bodies()
            elif c == "#":
                while self.i < len(s) and s[self.i] != "\n":
                    self.i += 1
            elif c in "<>" or (c in "0123456789&" and self._redir_ahead()):
                self._redir()
            elif any(s.startswith(op, self.i) for op in _OPS):
                op = next(op for op in _OPS if s.startswith(op, self.i))
                self.tokens.append(Op(op, self.i))
                self.i += len(op)
            else:
                start = self.i
                w = self.word()
                name = w.literal()
                if name and self.i < len(s) and s[self.i] == "(" and (name.endswith("+=") or name.endswith("=")):
                    base = name[:-2] if name.endswith("+=") else name[:-1]
                    if base.isidentifier():
                        self.i += 1
                        self.tokens.append(ArrayAssign(base, name.endswith("+="), self._array_elements(), start))
                        continue
                self.tokens.append(w)
        return self.tokens

    def _redir_ahead(self) -> bool:
        j = self.i
        while j < len(self.s) and self.s[j].isdigit():
            j += 1
        if self.s.startswith("&>", self.i):
            return True
        return j > self.i and j < len(self.s) and self.s[j] in "<>"

    def _redir(self) -> None:
        s, start = self.s, self.i
        while self.i < len(s) and s[self.i].isdigit():
            self.i += 1
        for op in ("<<-", "<<<", "<<", ">>", "&>>", "&>", ">&", "<&", "<>", ">|", "<", ">"):
            if s.startswith(op, self.i):
                self.i += len(op)
                break
        if s.startswith(op, self.i - len(op)) and op in (">&", "<&"):
            j = self.i
            while j < len(s) and (s[j].isdigit() or s[j] == "-"):
                j += 1
            if j > self.i:  # 2>&1, >&-
                self.tokens.append(Redir(op, None, start))
                self.i = j
                return
        while self.i < len(s) and s[self.i] in " \t":
            self.i += 1
        if self.i >= len(s) or s[self.i] in _META:
            # A redirection without a target: template placeholders such as `VAR=<your path>`.
            self.tokens.append(Redir(op, None, start))
            return
        target = self.word()
        r = Redir(op, target, start)
        self.tokens.append(r)
        if op in ("<<", "<<-"):
            delim = "".join(p[1] for p in target.parts)
            quoted = any(p[3] for p in target.parts) or "\\" in s[target.pos:self.i]
            self.pending_heredocs.append((r, delim, op == "<<-"))
            r.body_expand = not quoted

    def _heredoc_bodies(self) -> None:
        for r, delim, strip in self.pending_heredocs:
            start, lines = self.i, []
            while self.i <= len(self.s):
                end = self.s.find("\n", self.i)
                end = len(self.s) if end < 0 else end
                line = self.s[self.i:end]
                self.i = end + 1
                if (line.lstrip("\t") if strip else line) == delim:
                    break
                lines.append(line)
            else:
                self.i = len(self.s)
            body = "\n".join(lines) + ("\n" if lines else "")
            r.body = Src(body, [0], [self.src.origin(start)])
            r.body.starts, r.body.origins = _shift(self.src, start, len(body))
        self.pending_heredocs = []
        self.i = min(self.i, len(self.s))

    def _array_elements(self) -> list:
        s, out = self.s, []
        while True:
            while self.i < len(s) and (s[self.i] in " \t\n" or s.startswith("\\\n", self.i)):
                self.i += 2 if s[self.i] == "\\" else 1
            if self.i >= len(s):
                self.fail("(", "an array literal closed by ')'")
            if s[self.i] == "#":
                while self.i < len(s) and s[self.i] != "\n":
                    self.i += 1
                continue
            if s[self.i] == ")":
                self.i += 1
                return out
            start = self.i
            w = self.word()
            if self.i == start:  # an operator inside ( ... ): bash refuses it too
                self.fail(s[self.i], "array elements (words) up to ')'")
            out.append(w)

    # --- words ---------------------------------------------------------------------------------
    def word(self, stop: str = "", raw: bool = False) -> Word:
        s, start, parts = self.s, self.i, []
        buf, bstart = [], self.i

        def flush():
            nonlocal buf
            if buf:
                parts.append(("lit", "".join(buf), bstart, False))
                buf = []

        while self.i < len(s):
            c = s[self.i]
            if self.i in self.breaks and buf:
                flush()
            if not buf:
                bstart = self.i
            if (c in _META and not raw) or (stop and c in stop):
                break
            if c == "\\":
                if s.startswith("\\\n", self.i):
                    flush()
                    self.i += 2
                    continue
                flush()
                if self.i + 1 < len(s):
                    parts.append(("lit", s[self.i + 1], self.i + 1, True))
                self.i += 2
                continue
            if c == "'":
                flush()
                end = s.find("'", self.i + 1)
                if end < 0:
                    self.fail("'", "a closing single quote")
                self._quoted_lit(parts, self.i + 1, end)
                self.i = end + 1
                continue
            if c == '"':
                flush()
                self.i += 1
                self._double(parts)
                continue
            if c == "$" and s.startswith("$'", self.i):
                flush()
                end = s.find("'", self.i + 2)
                if end < 0:
                    self.fail("$'", "a closing single quote")
                raw = s[self.i + 2:end]
                text = raw.replace("\\n", "\n").replace("\\t", "\t").replace("\\'", "'").replace("\\\\", "\\")
                parts.append(("lit", text, self.i + 2, True))
                self.i = end + 1
                continue
            if c in "$`":
                part = self._dollar(False)
                if part is not None:
                    flush()
                    parts.append(part)
                    continue
            buf.append(c)
            self.i += 1
        flush()
        return Word(parts, start)

    def _quoted_lit(self, parts: list, a: int, b: int) -> None:
        """Quoted literal text from a to b, cut where the origins change."""
        cuts = sorted(x for x in self.breaks if a < x < b)
        for lo, hi in zip([a] + cuts, cuts + [b]):
            parts.append(("lit", self.s[lo:hi], lo, True))
        if a == b:
            parts.append(("lit", "", a, True))

    def _double(self, parts: list, heredoc: bool = False) -> None:
        s, buf, bstart = self.s, [], self.i
        opened = len(parts)

        def flush():
            nonlocal buf
            if buf:
                parts.append(("lit", "".join(buf), bstart, True))
                buf = []

        while True:
            if self.i >= len(s):
                if heredoc:
                    break
                self.fail('"', "a closing double quote")
            c = s[self.i]
            if self.i in self.breaks and buf:
                flush()
            if not buf:
                bstart = self.i
            if c == '"' and not heredoc:
                self.i += 1
                break
            if c == "\\" and self.i + 1 < len(s) and s[self.i + 1] in ('$`\\\n' if heredoc else '$`"\\\n'):
                flush()
                if s[self.i + 1] != "\n":
                    parts.append(("lit", s[self.i + 1], self.i + 1, True))
                self.i += 2
                continue
            if c in "$`":
                part = self._dollar(True)
                if part is not None:
                    flush()
                    parts.append(part)
                    continue
            buf.append(c)
            self.i += 1
        flush()
        if len(parts) == opened:
            parts.append(("lit", "", self.i, True))  # "" is one empty word

    def _dollar(self, quoted: bool):
        s, i = self.s, self.i
        if s[i] == "`":
            end = i + 1
            while end < len(s) and s[end] != "`":
                end += 2 if s[end] == "\\" else 1
            if end >= len(s):
                self.fail("`", "a closing backtick")
            self.i = end + 1
            return ("cmd", s[i + 1:end], i + 1, quoted)
        if s.startswith("$((", i):
            end = _match(s, i + 3, "((", "))")
            if end < 0:
                self.fail("$((", "arithmetic closed by '))'")
            self.i = end + 2
            return ("arith", s[i + 3:end], i + 3, quoted)
        if s.startswith("$(", i):
            end = _match(s, i + 2, "(", ")")
            if end < 0:
                self.fail("$(", "a command substitution closed by ')'")
            self.i = end + 1
            return ("cmd", s[i + 2:end], i + 2, quoted)
        if s.startswith("${", i):
            end = _match(s, i + 2, "{", "}")
            if end < 0:
                self.fail("${", "a parameter expansion closed by '}'")
            self.i = end + 1
            return ("param", s[i + 2:end], i + 2, quoted)
        j = i + 1
        if j < len(s) and (s[j].isalpha() or s[j] == "_"):
            while j < len(s) and (s[j].isalnum() or s[j] == "_"):
                j += 1
            self.i = j
            return ("param", s[i + 1:j], i + 1, quoted)
        if j < len(s) and s[j] in "0123456789@*#?$!-":
            self.i = j + 1
            return ("param", s[j], j, quoted)
        return None


def _match(s: str, i: int, open_: str, close: str) -> int:
    """Index of the ``close`` that balances ``open_`` from i (quotes skipped), or -1."""
    depth = 1
    while i < len(s):
        if s[i] == "\\":
            i += 2
            continue
        if s[i] == "'" and close != "}":
            end = s.find("'", i + 1)
            i = (end + 1) if end >= 0 else len(s)
            continue
        if s[i] == '"':
            j = i + 1
            while j < len(s) and s[j] != '"':
                j += 2 if s[j] == "\\" else 1
            i = j + 1
            continue
        if s.startswith(close, i):
            depth -= 1
            if depth == 0:
                return i
            i += len(close)
            continue
        if s.startswith(open_, i) or (open_ == "{" and s.startswith("${", i)):
            depth += 1
            i += 2 if s.startswith("${", i) else len(open_)
            continue
        i += 1
    return -1


def _shift(src: Src, start: int, length: int) -> tuple[list[int], list[Origin]]:
    """The breakpoints of ``src`` from ``start`` on, relative to ``start``."""
    starts, origins = [0], [src.origin(start)]
    for s0, o in zip(src.starts, src.origins):
        if start < s0 < start + length:
            starts.append(s0 - start)
            origins.append(o)
    return starts, origins


def sub_src(src: Src, start: int, end: int) -> Src:
    """The part ``start:end`` of ``src`` as its own Src (origins kept)."""
    starts, origins = _shift(src, start, end - start)
    return Src(src.text[start:end], starts, origins)


def lex(src: Src, where: str = "script") -> list:
    """The tokens of ``src``; InputError (file:line, what, expected) on unbalanced quoting."""
    return _Lexer(src, where).run()


def lex_word(src: Src) -> Word:
    """All of ``src`` as one word (the word of ``${NAME:-word}``, a here-document body):
    blanks and operators are text, quotes and expansions are read as in a word."""
    lx = _Lexer(src, "word")
    return lx.word(raw=True)


def lex_heredoc(src: Src) -> Word:
    """A here-document body with an unquoted delimiter as one word: expansions are done,
    quotes are plain characters (bash manual 3.6.6)."""
    lx = _Lexer(src, "here-document")
    parts: list = []
    lx._double(parts, heredoc=True)
    return Word(parts, 0)


__all__ += ["sub_src", "lex_word", "lex_heredoc"]
