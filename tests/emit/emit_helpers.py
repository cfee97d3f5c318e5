"""Shared helpers for the emitter tests: fixtures, and parsing emitted shell scripts back."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from pathlib import Path

__all__ = ["FIXTURES", "ALL_PLANS", "load", "logical_lines", "command_words", "flags_after", "bash_n"]

FIXTURES = Path(__file__).parent / "fixtures"
ALL_PLANS = [("llama70b_64gpu", 1), ("llama70b_64gpu", 2), ("llama70b_64gpu", 3), ("tiny_moe_8gpu", 1),
             ("tiny_moe_8gpu", 2), ("gpt_dense_16gpu", 1), ("gpt_dense_16gpu", 2)]


def load(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def logical_lines(script: str) -> list[str]:
    """Lines with backslash-newline continuations joined, comments and blanks dropped."""
    joined = script.replace("\\\n", " ")
    return [ln.strip() for ln in joined.splitlines() if ln.strip() and not ln.strip().startswith("#")]


def command_words(script: str, first: str) -> list[str]:
    """shlex.split of the one logical line whose words start with ``first`` (e.g. torchrun)."""
    hits = [shlex.split(ln) for ln in logical_lines(script) if first in ln.split()[:3]]
    assert len(hits) == 1, f"expected one {first} line, found {len(hits)}"
    return hits[0]


def flags_after(words: list[str], start: int) -> dict[str, list[str]]:
    """--flag value... pairs from words[start:] -> {flag: [values]} (a bare flag maps to [])."""
    out: dict[str, list[str]] = {}
    key = None
    for w in words[start:]:
        if w.startswith("$"):  # user-supplied shell expansions ("${DATA_ARGS[@]}", "$@")
            key = None
        elif w.startswith("--"):
            assert w not in out, f"flag {w} given twice"
            key, out[w] = w, []
        elif key is not None:
            out[key].append(w)
    return out


def bash_n(path: Path) -> None:
    bash = shutil.which("bash")
    assert bash, "bash is needed to syntax-check emitted scripts"
    res = subprocess.run([bash, "-n", str(path)], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, f"bash -n {path.name}: {res.stderr}"
