"""A restricted bash reader: runs a launch script's shell logic without running its programs,
and returns the command lines it would start (:class:`Command`), every word with the file
and line it was written on.

What it does as bash does: variables, arrays (``NAME=( ... )``, ``+=``), ``export``/``unset``,
``${VAR:-default}`` and the other expansions (:mod:`planner.check.bash_expand`), ``$((...))``,
``if/elif/else``, ``case``, ``for``, ``&&``/``||``, ``[ ]``/``[[ ]]`` tests, functions,
``source``/``.``, ``bash -c``/``sh -c``/``eval`` (the string is read again), here-documents,
``sbatch`` (the batch script runs with ``SLURM_NNODES`` etc. from its options and ``#SBATCH``
lines) and ``srun``. What it does not: run programs. A command substitution gives what a
small set of commands would print (``pwd``, ``dirname``, ``basename``, ``echo``, ``printf``);
file tests (``-f``, ``-d``, ``-e``) are true, as on the machine the script was written for.
Every other command is recorded, with the launchers around it (``sbatch``, ``srun`` options).
The script's environment starts empty: ``${VAR:-default}`` takes the default, and
:attr:`Shell.defaults_used` says where.
"""

from __future__ import annotations

import fnmatch
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from planner.check.bash_expand import Expander, Seg, segs, text_of
from planner.check.bash_lex import ArrayAssign, Origin, Src, Word, lex_heredoc, lex_word, sub_src
from planner.check.bash_parse import AndOr, Case, For, FuncDef, Group, If, Pipeline, Simple, While, parse
from planner.errors import InputError

__all__ = ["Command", "Shell", "run_script", "Origin", "text_of"]

_MAX_LOOP = 1000
_MAX_DEPTH = 24
_NOOP = {"true", ":", "mkdir", "rm", "cp", "mv", "touch", "ln", "chmod", "chown", "sleep", "git", "trap", "wait", "shopt",
         "alias", "ulimit", "umask", "read", "module", "ml", "conda", "pip", "nvidia-smi", "cd", "pushd", "popd", "tee", "ls",
         "printenv", "env_parallel", "hash", "sync", "kill", "scancel", "squeue", "source_if_exists", "nvcc", "wget", "curl",
         "tar", "nc", "ssh", "scp", "rsync", "sed", "awk", "grep", "sort", "head", "tail", "uniq", "wc", "cut", "xargs"}


@dataclass
class Command:
    """One command line the script would start: its words (each a tuple of :class:`Seg`),
    the exported variables, and the launchers it runs under (``("sbatch", {...})``, ...)."""

    argv: list
    env: dict
    context: tuple
    origin: Origin

    def words(self) -> list[str]:
        return [text_of(f) for f in self.argv]


class _Exit(Exception):
    pass


class _Return(Exception):
    pass


@dataclass
class Shell(Expander):
    script_name: str = "script"
    cwd: str = "."
    vars: dict = field(default_factory=dict)
    exported: set = field(default_factory=set)
    positional: list = field(default_factory=list)
    functions: dict = field(default_factory=dict)
    commands: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    defaults_used: dict = field(default_factory=dict)
    unset_used: set = field(default_factory=set)
    context: tuple = ()
    depth: int = 0
    output: list | None = None  # command substitution: what echo/printf print
    status: int = 0

    # --- entry points ---------------------------------------------------------------------------
    def run_src(self, src: Src) -> None:
        try:
            self._list(parse(src), src)
        except _Return:
            pass

    def run_file(self, path: Path, args: list | None = None) -> None:
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            raise InputError(str(path), "unreadable", f"a readable script ({exc.strerror or exc})") from None
        saved = self.positional
        if args is not None:
            self.positional = list(args)
        try:
            self.run_src(Src.of_file(text, str(path)))
        finally:
            if args is not None:
                self.positional = saved

    def child(self, **kw) -> "Shell":
        """A new shell (``bash -c``, ``sbatch``, ``$(...)``) with the exported variables (all of
        them for a subshell or a command substitution: ``kw['all_vars']``)."""
        if self.depth > _MAX_DEPTH:
            raise InputError(self.script_name, "nested shells", f"at most {_MAX_DEPTH} levels of bash -c / sbatch / $(...)")
        all_vars = kw.pop("all_vars", False)
        vars_ = dict(self.vars) if all_vars else {k: v for k, v in self.vars.items() if k in self.exported}
        sh = Shell(script_name=self.script_name, cwd=self.cwd, vars=vars_, exported=set(self.exported),
                   positional=list(self.positional) if all_vars else [], functions=dict(self.functions) if all_vars else {},
                   commands=self.commands, notes=self.notes, defaults_used=self.defaults_used, unset_used=self.unset_used,
                   context=self.context, depth=self.depth + 1)
        for k, v in kw.items():
            setattr(sh, k, v)
        return sh

    # --- statements -----------------------------------------------------------------------------
    def _list(self, stmts: list, src: Src) -> int:
        for st in stmts:
            self.status = self._and_or(st, src)
        return self.status

    def _and_or(self, st: AndOr, src: Src) -> int:
        status = 0
        for op, pipe in st.items:
            if op == "&&" and status != 0:
                continue
            if op == "||" and status == 0:
                continue
            status = self._pipeline(pipe, src)
        return status

    def _pipeline(self, pipe: Pipeline, src: Src) -> int:
        status = 0
        for cmd in pipe.cmds:
            status = self._command(cmd, src)
        return int(not status) if pipe.negate else status

    def _command(self, cmd, src: Src) -> int:
        if isinstance(cmd, Simple):
            return self._simple(cmd, src)
        if isinstance(cmd, If):
            for cond, body in cmd.clauses:
                if self._list(cond, src) == 0:
                    return self._list(body, src)
            return self._list(cmd.orelse, src) if cmd.orelse is not None else 0
        if isinstance(cmd, For):
            items = self.expand_all(cmd.words, src) if cmd.words is not None else list(self.positional)
            for item in items[:_MAX_LOOP]:
                self.vars[cmd.var] = item
                self._list(cmd.body, src)
            return 0
        if isinstance(cmd, While):
            for _ in range(_MAX_LOOP):
                ok = self._list(cmd.cond, src) == 0
                if ok == cmd.until:
                    return 0
                self._list(cmd.body, src)
            self.notes.append(f"a while loop ran {_MAX_LOOP} times without ending; the reader stopped it")
            return 0
        if isinstance(cmd, Case):
            text = text_of(self.expand_str(cmd.word, src))
            for pats, body in cmd.items:
                if any(fnmatch.fnmatchcase(text, text_of(self.expand_str(p, src))) for p in pats):
                    return self._list(body, src)
            return 0
        if isinstance(cmd, Group):
            if cmd.subshell:
                sh = self.child(all_vars=True)
                try:
                    sh._list(cmd.body, src)
                except _Exit:
                    pass
                return sh.status
            return self._list(cmd.body, src)
        if isinstance(cmd, FuncDef):
            self.functions[cmd.name] = (cmd.body, src)
            return 0
        return 0

    def _assign(self, a, src: Src, target: dict | None = None) -> None:
        target = self.vars if target is None else target
        if isinstance(a, ArrayAssign):
            elems = self.expand_all(a.elements, src)
            old = target.get(a.name)
            if a.append:
                base = old if isinstance(old, list) else ([old] if old else [])
                target[a.name] = base + elems
            else:
                target[a.name] = elems
            return
        name, append, word = a
        value = self.expand_str(word, src)
        if append:
            old = target.get(name)
            if isinstance(old, list):
                target[name] = old + [value]
                return
            value = tuple(old or ()) + value
        target[name] = value

    def _simple(self, cmd: Simple, src: Src) -> int:
        if cmd.words and cmd.words[0].literal() == "[[":
            return 0 if _test([text_of(self.expand_str(w, src)) for w in cmd.words[1:-1]]) else 1
        argv = self.expand_all(cmd.words, src)
        if not argv:
            for a in cmd.assigns:
                self._assign(a, src)
            return 0
        local: dict = {}
        for a in cmd.assigns:
            self._assign(a, src, local)
        name = text_of(argv[0])
        here = src.origin(cmd.pos)
        heredoc = next((r for r in cmd.redirs if r.op in ("<<", "<<-") and r.body is not None), None)
        if heredoc is not None:
            body = self.expand_str(lex_heredoc(heredoc.body), heredoc.body) if heredoc.body_expand else \
                segs(heredoc.body.text, Origin(here.file, here.line, False))
            heredoc = Src.of_segments(body) if heredoc.body_expand else Src(heredoc.body.text, heredoc.body.starts, heredoc.body.origins)
        return self._dispatch(name, argv, local, here, src, heredoc)

    # --- commands -------------------------------------------------------------------------------
    def _dispatch(self, name: str, argv: list, local: dict, here: Origin, src: Src, heredoc: Src | None) -> int:
        words = [text_of(f) for f in argv]
        if name in self.functions:
            body, fsrc = self.functions[name]
            saved = self.positional
            self.positional = argv[1:]
            try:
                self._command(body, fsrc)
            except _Return:
                pass
            finally:
                self.positional = saved
            return 0
        if name in ("export", "declare", "typeset", "local", "readonly"):
            for f, w in zip(argv[1:], words[1:]):
                if w.startswith("-"):
                    continue
                if "=" in w:
                    k, _, _ = w.partition("=")
                    if k.isidentifier():
                        self.vars[k] = _after_eq(f)
                        if name == "export" or "x" in "".join(x for x in words[1:] if x.startswith("-")):
                            self.exported.add(k)
                elif w.isidentifier() and name == "export":
                    self.exported.add(w)
            return 0
        if name == "unset":
            for w in words[1:]:
                if not w.startswith("-"):
                    self.vars.pop(w, None)
            return 0
        if name == "shift":
            n = int(words[1]) if len(words) > 1 and words[1].isdigit() else 1
            self.positional = self.positional[n:]
            return 0
        if name in ("exit", "return"):
            raise _Exit() if name == "exit" else _Return()
        if name == "false":
            return 1
        if name in ("set",):
            if "--" in words:
                self.positional = argv[words.index("--") + 1:]
            return 0
        if name in ("source", "."):
            if len(words) > 1:
                self.run_file(self._path(words[1], here), argv[2:] or None)
            return 0
        if name in ("[", "test"):
            return 0 if _test(words[1:-1] if name == "[" else words[1:]) else 1
        if name in ("echo", "printf"):
            if self.output is not None:
                out = " ".join(w for w in words[1:] if not (name == "echo" and w in ("-n", "-e")))
                if name == "printf" and len(words) > 1:
                    out = words[1].replace("%s", " ".join(words[2:])).replace("\\n", "\n")
                self.output.append(out)
            return 0
        if name in ("pwd",):
            if self.output is not None:
                self.output.append(self.cwd)
            return 0
        if name in ("dirname", "basename", "realpath", "readlink"):
            if self.output is not None and len(words) > 1:
                arg = words[-1]
                self.output.append(os.path.dirname(arg) or "." if name == "dirname" else
                                   os.path.basename(arg.rstrip("/")) if name == "basename" else arg)
            return 0
        if name in ("hostname", "whoami", "date", "uname", "id", "nproc"):
            if self.output is not None:
                self.output.append({"nproc": "8"}.get(name, name))
            return 0
        if name == "cat" and heredoc is not None:
            if self.output is not None:
                self.output.append(heredoc.text)
            return 0
        if name == "eval":
            self._reparse(argv[1:], local)
            return 0
        if name in ("bash", "sh", "zsh", "dash"):
            return self._shell(argv, words, local, here, heredoc)
        if name == "sbatch":
            return self._sbatch(argv, words, local, here, heredoc)
        if name == "srun":
            return self._srun(argv, words, local, here)
        if name == "env":
            i = 1
            while i < len(words) and ("=" in words[i] or words[i].startswith("-")):
                if "=" in words[i]:
                    k, _, _ = words[i].partition("=")
                    local[k] = _after_eq(argv[i])
                i += 1
            if i < len(argv):
                return self._dispatch(words[i], argv[i:], local, here, src, heredoc)
            return 0
        if name in ("command", "exec", "time", "nohup", "stdbuf", "numactl", "taskset") and len(argv) > 1:
            rest = [a for a in argv[1:]]
            while rest and text_of(rest[0]).startswith("-"):
                rest = rest[1:]
            if rest:
                return self._dispatch(text_of(rest[0]), rest, local, here, src, heredoc)
            return 0
        if name in _NOOP or name in ("which", "type", "cd"):
            return 0
        env = {k: text_of(self.vars[k]) for k in self.exported if k in self.vars and not isinstance(self.vars[k], list)}
        env.update({k: text_of(v) for k, v in local.items() if not isinstance(v, list)})
        self.commands.append(Command(argv, env, self.context, here))
        return 0

    def _path(self, name: str, here: Origin) -> Path:
        p = Path(name)
        if not p.is_absolute():
            p = Path(self.cwd) / p
        if not p.is_file():
            raise InputError(f"{here.file}:{here.line}", name, "a file the script sources or starts (next to the script)")
        return p

    def _reparse(self, argv: list, local: dict, sh: "Shell | None" = None) -> int:
        joined: list = []
        for i, f in enumerate(argv):
            if i:
                joined.append(Seg(" ", f[0].origin if f else Origin("<shell>", 0, False)))
            joined.extend(f)
        src = Src.of_segments(joined)
        target = sh or self
        try:
            target.run_src(src)
        except _Exit:
            if sh is None:
                raise
        return target.status

    def _shell(self, argv, words, local, here, heredoc) -> int:
        sh = self.child()
        sh.vars.update(local)
        i = 1
        while i < len(words) and words[i].startswith("-") and words[i] != "-c":
            i += 1
        try:
            if i < len(words) and words[i] == "-c":
                if i + 1 < len(argv):
                    sh.positional = argv[i + 3:]
                    return self._reparse([argv[i + 1]], local, sh)
                return 0
            if i < len(argv):
                sh.run_file(self._path(words[i], here), argv[i + 1:])
            elif heredoc is not None:
                sh.run_src(heredoc)
        except _Exit:
            pass
        return 0

    def _sbatch(self, argv, words, local, here, heredoc) -> int:
        opts, i = {}, 1
        while i < len(words) and words[i].startswith("-"):
            key, val, i = _slurm_option(words, i)
            opts[_slurm_key(key)] = val
            i += 1
        script_src = heredoc
        script_args = argv[i + 1:]
        if script_src is None and opts.get("wrap"):  # sbatch --wrap "CMD": the batch script is sh -c CMD
            script_src = Src.of_file(str(opts["wrap"]), here.file, here.line)
        if script_src is None and i < len(words):
            path = self._path(words[i], here)
            script_src = Src.of_file(path.read_text(encoding="utf-8", errors="replace"), str(path))
        if script_src is None:
            return 0
        for k, v in sbatch_directives(script_src.text).items():
            opts.setdefault(k, v)
        sh = self.child()
        sh.vars.update(local)
        sh.positional = script_args
        sh.in_batch(opts, Origin(here.file, here.line, False))
        try:
            sh.run_src(script_src)
        except _Exit:
            pass
        return 0

    def in_batch(self, opts: dict, origin: Origin, override: bool = True) -> None:
        """Run as sbatch runs a batch script with the options ``opts``: SLURM_NNODES and the other
        variables SLURM sets from them, and an ("sbatch", opts) context for the launch inside.
        ``override`` False keeps a variable the caller's environment already set."""
        self.context = self.context + (("sbatch", dict(opts)),)
        for var, key in (("SLURM_NNODES", "nodes"), ("SLURM_JOB_NUM_NODES", "nodes"), ("SLURM_NTASKS_PER_NODE", "ntasks-per-node"),
                         ("SLURM_GPUS_PER_NODE", "gpus-per-node")):
            if str(opts.get(key, "")).isdigit() and (override or var not in self.exported):
                self.vars[var] = segs(str(opts[key]), origin)
                self.exported.add(var)

    def _srun(self, argv, words, local, here) -> int:
        opts, i = {}, 1
        while i < len(words) and words[i].startswith("-"):
            key, val, i = _slurm_option(words, i)
            opts[_slurm_key(key)] = val
            i += 1
        if i >= len(argv):
            return 0
        saved = self.context
        self.context = self.context + (("srun", opts),)
        try:
            return self._dispatch(words[i], argv[i:], local, here, Src(""), None)
        finally:
            self.context = saved

    def substitute(self, src: Src) -> str:
        sh = self.child(all_vars=True, output=[])
        try:
            sh.run_src(src)
        except _Exit:
            pass
        return "\n".join(sh.output).rstrip("\n")


_SLURM_VALUED = {"-N", "--nodes", "-n", "--ntasks", "--ntasks-per-node", "--gpus-per-node", "-G", "--gpus", "-p", "--partition",
                 "-A", "--account", "-t", "--time", "-J", "--job-name", "-o", "--output", "-e", "--error", "--export",
                 "--container-image", "--container-mounts", "--container-workdir", "--mpi", "--gres", "--mem", "--dependency",
                 "-c", "--cpus-per-task", "--qos", "-w", "--nodelist", "--exclude", "-x", "--wrap"}
_SLURM_ALIASES = {"-N": "nodes", "-n": "ntasks", "-G": "gpus", "-p": "partition", "-A": "account", "-t": "time", "-J": "job-name",
                  "-o": "output", "-e": "error", "-c": "cpus-per-task", "-w": "nodelist", "-x": "exclude"}


def _slurm_option(words: list, i: int) -> tuple[str, str, int]:
    """(option, value, index of its last word) of the sbatch/srun option at ``words[i]``:
    ``--nodes=4``, ``--nodes 4``, ``-N 4`` and ``-N4`` (a short option's value attached)."""
    w = words[i]
    key, eq, val = w.partition("=")
    if eq:
        return key, val, i
    if w in _SLURM_VALUED and i + 1 < len(words):
        return w, words[i + 1], i + 1
    if len(w) > 2 and w[1] != "-" and w[:2] in _SLURM_VALUED:
        return w[:2], w[2:], i
    return key, val, i


def _slurm_key(key: str) -> str:
    return _SLURM_ALIASES.get(key, key.lstrip("-"))


def _after_eq(f) -> tuple:
    """The part of a ``NAME=value`` field after the first ``=``, origins kept."""
    out, seen = [], False
    for s in f:
        if seen:
            out.append(s)
        elif "=" in s.text:
            seen = True
            rest = s.text.split("=", 1)[1]
            if rest:
                out.append(Seg(rest, s.origin))
    return tuple(out)


def _test(args: list[str]) -> bool:
    """``test`` / ``[ ]`` / ``[[ ]]`` over expanded words; file tests are true."""
    def expr(i: int) -> tuple[bool, int]:
        v, i = term(i)
        while i < len(args) and args[i] in ("-o", "||"):
            w, i = term(i + 1)
            v = v or w
        return v, i

    def term(i: int) -> tuple[bool, int]:
        v, i = factor(i)
        while i < len(args) and args[i] in ("-a", "&&"):
            w, i = factor(i + 1)
            v = v and w
        return v, i

    def factor(i: int) -> tuple[bool, int]:
        if i >= len(args):
            return False, i
        a = args[i]
        if a == "!":
            v, j = factor(i + 1)
            return not v, j
        if a == "(":
            v, j = expr(i + 1)
            return v, j + 1
        if i + 2 < len(args) + 0 and i + 1 < len(args) and args[i + 1] in _BINARY:
            return _binary(a, args[i + 1], args[i + 2] if i + 2 < len(args) else ""), i + 3
        if a in ("-n", "-z") and i + 1 < len(args):
            return (bool(args[i + 1]) if a == "-n" else not args[i + 1]), i + 2
        if re.fullmatch(r"-[a-zA-Z]", a) and i + 1 < len(args):
            return True, i + 2  # file tests (-f, -d, -e, -x, ...): assumed true
        return bool(a), i + 1

    if not args:
        return False
    return expr(0)[0]


_BINARY = {"=", "==", "!=", "<", ">", "-eq", "-ne", "-lt", "-le", "-gt", "-ge", "=~"}


def _binary(a: str, op: str, b: str) -> bool:
    if op in ("=", "=="):
        return fnmatch.fnmatchcase(a, b)
    if op == "!=":
        return not fnmatch.fnmatchcase(a, b)
    if op == "=~":
        return re.search(b, a) is not None
    if op in ("<", ">"):
        return (a < b) if op == "<" else (a > b)
    try:
        x, y = int(a), int(b)
    except ValueError:
        return False
    return {"-eq": x == y, "-ne": x != y, "-lt": x < y, "-le": x <= y, "-gt": x > y, "-ge": x >= y}[op]


def sbatch_directives(text: str) -> dict:
    """The options of a batch script's ``#SBATCH`` lines (long names: nodes, ntasks-per-node...):
    those before its first command, as sbatch reads them ("sbatch will stop processing further
    #SBATCH directives once the first non-comment non-whitespace line has been reached", sbatch(1))."""
    opts: dict = {}
    for line in text.splitlines():
        s = line.strip()
        if s and not s.startswith("#"):
            break
        m = re.match(r"^#SBATCH\s+(.*)$", s)
        if m is None:
            continue
        toks = m.group(1).split()
        j = 0
        while j < len(toks):
            key, val, j = _slurm_option(toks, j)
            opts.setdefault(_slurm_key(key), val)
            j += 1
    return opts


def run_script(path: str | Path, args: list[str] | None = None, env: dict | None = None) -> Shell:
    """Run the shell logic of the script at ``path`` and return the shell (its ``commands``). A
    script with ``#SBATCH`` lines is read as sbatch runs it (SLURM_NNODES etc. from them)."""
    p = Path(path)
    sh = Shell(script_name=p.name, cwd=str(p.parent.resolve()))
    sh.vars["PWD"] = segs(sh.cwd, Origin("<shell>", 0, False))
    for k, v in (env or {}).items():
        sh.vars[k] = segs(str(v), Origin("<environment>", 0, False))
        sh.exported.add(k)
    opts = sbatch_directives(p.read_text(encoding="utf-8", errors="replace")) if p.is_file() else {}
    if opts:
        sh.in_batch(opts, Origin(str(p), 0, False), override=False)  # the environment given wins
    origin = Origin("<arguments>", 0, False)
    try:
        sh.run_file(p, [segs(a, origin) for a in (args or [])])
    except _Exit:
        pass
    return sh
