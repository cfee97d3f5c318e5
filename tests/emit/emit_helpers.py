"""Shared helpers for the emitter tests: fixtures, and parsing emitted shell scripts back."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from pathlib import Path

__all__ = ["FIXTURES", "ALL_PLANS", "MEGATRON_PLANS", "load", "logical_lines", "command_words", "flags_after", "bash_n"]

FIXTURES = Path(__file__).parent / "fixtures"
# Hand-written plan documents (engine-less: megatron-core, the default) and ones written by
# `planner plan --json` (llama405b_512gpu: --model llama3.1-405b --gpus 512 --tp 8 --pp 8 --vpp 8
# -s 8192 -b 512 --top 2; deepseek_v3_1024gpu: --model deepseek-v3 --gpus 1024 -s 4096 -b 4096
# --top 3; llama8b_fsdp_64gpu: --model llama3.1-8b --gpus 64 --pp 1 --zero 3 -s 8192 -b 256 --top 2).
ALL_PLANS = [("llama70b_64gpu", 1), ("llama70b_64gpu", 2), ("llama70b_64gpu", 3), ("tiny_moe_8gpu", 1),
             ("tiny_moe_8gpu", 2), ("gpt_dense_16gpu", 1), ("gpt_dense_16gpu", 2)]
# Plans megatron-core runs (llama70b_64gpu rank 2 is Megatron-FSDP with a pipeline: refused).
MEGATRON_PLANS = [fr for fr in ALL_PLANS if fr != ("llama70b_64gpu", 2)] + [
    ("llama405b_512gpu", 1), ("llama405b_512gpu", 2), ("deepseek_v3_1024gpu", 1), ("deepseek_v3_1024gpu", 2),
    ("deepseek_v3_1024gpu", 3), ("llama8b_fsdp_64gpu", 1), ("llama8b_fsdp_64gpu", 2)]


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
