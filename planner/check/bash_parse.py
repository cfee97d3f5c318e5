"""Statements of the restricted bash reader: lists (``;`` ``&&`` ``||`` ``|`` ``&``, newlines),
simple commands with assignments and redirections, ``if/elif/else/fi``, ``for``, ``while``,
``case``, ``{ ...; }``, ``( ... )``, function definitions and ``[[ ... ]]`` (bash manual sec. 3.2
Shell Commands). The grammar is the one of the manual, cut to these forms.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from planner.check.bash_lex import ArrayAssign, Op, Redir, Src, Word, lex
from planner.errors import InputError

__all__ = ["Simple", "Pipeline", "AndOr", "If", "For", "While", "Case", "Group", "FuncDef", "parse"]

_RESERVED = {"if", "then", "elif", "else", "fi", "for", "in", "do", "done", "while", "until", "case", "esac", "{", "}", "function"}


@dataclass
class Simple:
    assigns: list  # (name, append, Word) or ArrayAssign
    words: list  # Word
    redirs: list  # Redir
    pos: int


@dataclass
class Pipeline:
    cmds: list
    negate: bool = False


@dataclass
class AndOr:
    items: list  # [(None|"&&"|"||", Pipeline)]


@dataclass
class If:
    clauses: list  # [(cond list, body list)]
    orelse: list | None


@dataclass
class For:
    var: str
    words: list | None
    body: list


@dataclass
class While:
    cond: list
    body: list
    until: bool = False


@dataclass
class Case:
    word: Word
    items: list  # [([Word], body list)]


@dataclass
class Group:
    body: list
    subshell: bool = False
    redirs: list = field(default_factory=list)


@dataclass
class FuncDef:
    name: str
    body: object


class _Parser:
    def __init__(self, tokens: list, src: Src):
        self.t, self.k, self.src = tokens, 0, src

    def fail(self, got: str, expected: str):
        tok = self.t[self.k] if self.k < len(self.t) else None
        pos = getattr(tok, "pos", len(self.src.text) - 1)
        o = self.src.origin(max(0, min(pos, len(self.src.text) - 1)))
        raise InputError(f"{o.file}:{o.line}", got, expected)

    def peek(self):
        return self.t[self.k] if self.k < len(self.t) else None

    def word_is(self, tok, *names) -> bool:
        return isinstance(tok, Word) and tok.literal() in names

    def skip_nl(self) -> None:
        while isinstance(self.peek(), Op) and self.peek().text in ("\n", ";"):
            self.k += 1

    def skip_newlines(self) -> None:
        while isinstance(self.peek(), Op) and self.peek().text == "\n":
            self.k += 1

    def expect_word(self, name: str) -> None:
        self.skip_nl()
        if not self.word_is(self.peek(), name):
            self.fail(getattr(self.peek(), "text", None) or (self.peek().flat() if isinstance(self.peek(), Word) else "end of file"),
                      f"'{name}'")
        self.k += 1

    # --- lists ----------------------------------------------------------------------------------
    def body(self, *enders: str) -> list:
        """Statements until one of the reserved words ``enders`` (not consumed) or the end."""
        out = []
        while True:
            self.skip_nl()
            tok = self.peek()
            if tok is None or (enders and self.word_is(tok, *enders)):
                return out
            if isinstance(tok, Op) and tok.text in (")", ";;"):
                return out  # the caller checks what closes its list
            out.append(self.and_or())
            tok = self.peek()
            if isinstance(tok, Op) and tok.text in (";", "&", "\n"):
                self.k += 1

    def and_or(self) -> AndOr:
        items = [(None, self.pipeline())]
        while isinstance(self.peek(), Op) and self.peek().text in ("&&", "||"):
            op = self.peek().text
            self.k += 1
            self.skip_newlines()
            items.append((op, self.pipeline()))
        return AndOr(items)

    def pipeline(self) -> Pipeline:
        negate = False
        if self.word_is(self.peek(), "!"):
            negate = True
            self.k += 1
        cmds = [self.command()]
        while isinstance(self.peek(), Op) and self.peek().text in ("|", "|&"):
            self.k += 1
            self.skip_newlines()
            cmds.append(self.command())
        return Pipeline(cmds, negate)

    # --- commands -------------------------------------------------------------------------------
    def command(self):
        tok = self.peek()
        if isinstance(tok, Op) and tok.text == "(":
            self.k += 1
            body = self.body()
            if not (isinstance(self.peek(), Op) and self.peek().text == ")"):
                self.fail("end of file", "')' closing a subshell")
            self.k += 1
            return Group(body, True, self.redirs())
        name = tok.literal() if isinstance(tok, Word) else None
        if name == "if":
            return self.if_()
        if name == "for":
            return self.for_()
        if name in ("while", "until"):
            self.k += 1
            cond = self.body("do")
            self.expect_word("do")
            body = self.body("done")
            self.expect_word("done")
            return While(cond, body, name == "until")
        if name == "case":
            return self.case()
        if name == "{":
            self.k += 1
            body = self.body("}")
            self.expect_word("}")
            return Group(body, False, self.redirs())
        if name == "function":
            self.k += 1
            fname = self.peek().literal() if isinstance(self.peek(), Word) else None
            self.k += 1
            if isinstance(self.peek(), Op) and self.peek().text == "(":
                self.k += 2
            self.skip_newlines()
            return FuncDef(fname or "?", self.command())
        if name and name not in _RESERVED and self._is_funcdef():
            self.k += 3
            self.skip_newlines()
            return FuncDef(name, self.command())
        if name == "[[":
            return self.dbracket()
        return self.simple()

    def _is_funcdef(self) -> bool:
        a = self.t[self.k + 1] if self.k + 1 < len(self.t) else None
        b = self.t[self.k + 2] if self.k + 2 < len(self.t) else None
        return isinstance(a, Op) and a.text == "(" and isinstance(b, Op) and b.text == ")"

    def redirs(self) -> list:
        out = []
        while isinstance(self.peek(), Redir):
            out.append(self.peek())
            self.k += 1
        return out

    def simple(self) -> Simple:
        assigns, words, redirs = [], [], []
        pos = getattr(self.peek(), "pos", 0)
        while True:
            tok = self.peek()
            if isinstance(tok, Redir):
                redirs.append(tok)
            elif isinstance(tok, ArrayAssign):
                if words:
                    words.append(Word([("lit", f"{tok.name}=(...)", tok.pos, True)], tok.pos))
                else:
                    assigns.append(tok)
            elif isinstance(tok, Word):
                a = None if words else _assignment(tok)
                if a is not None:
                    assigns.append(a)
                else:
                    words.append(tok)
            else:
                break
            self.k += 1
        if not (assigns or words or redirs):
            tok = self.peek()
            self.fail(getattr(tok, "text", "end of file"), "a command")
        return Simple(assigns, words, redirs, pos)

    def dbracket(self) -> Simple:
        """``[[ ... ]]``: everything up to ``]]`` is one test (``&&``, ``||``, ``(``, ``)`` included)."""
        pos = self.peek().pos
        words = []
        while True:
            tok = self.peek()
            if tok is None:
                self.fail("end of file", "']]'")
            self.k += 1
            if isinstance(tok, Op):
                words.append(Word([("lit", tok.text, tok.pos, False)], tok.pos))
                continue
            if isinstance(tok, Redir):  # < and > compare strings inside [[ ]]
                words.append(Word([("lit", tok.op, tok.pos, False)], tok.pos))
                if tok.target is not None:
                    words.append(tok.target)
                continue
            words.append(tok)
            if self.word_is(tok, "]]"):
                return Simple([], words, [], pos)

    def if_(self) -> If:
        self.k += 1
        clauses, orelse = [], None
        cond = self.body("then")
        self.expect_word("then")
        clauses.append((cond, self.body("elif", "else", "fi")))
        while True:
            self.skip_nl()
            tok = self.peek()
            if self.word_is(tok, "elif"):
                self.k += 1
                cond = self.body("then")
                self.expect_word("then")
                clauses.append((cond, self.body("elif", "else", "fi")))
            elif self.word_is(tok, "else"):
                self.k += 1
                orelse = self.body("fi")
            elif self.word_is(tok, "fi"):
                self.k += 1
                self.redirs()
                return If(clauses, orelse)
            else:
                self.fail(getattr(tok, "text", "end of file"), "'fi' closing an if")

    def for_(self) -> For:
        self.k += 1
        var = self.peek().literal() if isinstance(self.peek(), Word) else None
        if not var:
            self.fail("for", "a loop variable name")
        self.k += 1
        words = None
        self.skip_newlines()
        if self.word_is(self.peek(), "in"):
            self.k += 1
            words = []
            while isinstance(self.peek(), Word):
                words.append(self.peek())
                self.k += 1
        self.expect_word("do")
        body = self.body("done")
        self.expect_word("done")
        return For(var, words, body)

    def case(self) -> Case:
        self.k += 1
        word = self.peek()
        self.k += 1
        self.expect_word("in")
        items = []
        while True:
            self.skip_newlines()
            if self.word_is(self.peek(), "esac"):
                self.k += 1
                return Case(word, items)
            if isinstance(self.peek(), Op) and self.peek().text == "(":
                self.k += 1
            pats = []
            while isinstance(self.peek(), Word):
                pats.append(self.peek())
                self.k += 1
                if isinstance(self.peek(), Op) and self.peek().text == "|":
                    self.k += 1
            if not (isinstance(self.peek(), Op) and self.peek().text == ")"):
                self.fail("case", "a pattern followed by ')'")
            self.k += 1
            body = self.body("esac")
            items.append((pats, body))
            if isinstance(self.peek(), Op) and self.peek().text == ";;":
                self.k += 1


def _assignment(w: Word):
    """``NAME=value`` / ``NAME+=value`` as (name, append, value word), else None."""
    first = w.parts[0] if w.parts else None
    if first is None or first[0] != "lit" or first[3]:
        return None
    text = first[1]
    eq = text.find("=")
    if eq <= 0:
        return None
    name, append = text[:eq], False
    if name.endswith("+"):
        name, append = name[:-1], True
    if not name.isidentifier():
        return None
    rest = text[eq + 1:]
    parts = ([("lit", rest, first[2] + eq + 1, False)] if rest else []) + list(w.parts[1:])
    return (name, append, Word(parts, first[2] + eq + 1))


def parse(src: Src) -> list:
    """The statements of ``src``; InputError (file:line, what, expected) on a syntax error."""
    p = _Parser(lex(src), src)
    out = p.body()
    if p.peek() is not None:
        tok = p.peek()
        p.fail(getattr(tok, "text", None) or (tok.flat() if isinstance(tok, Word) else "?"), "a command (unbalanced ')' or ';;')")
    return out
