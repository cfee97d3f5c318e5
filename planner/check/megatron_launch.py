"""Where the Megatron-LM job starts: the ``pretrain_*.py`` command among the commands a script
would run (:mod:`planner.check.bash`), the launcher around it, and the world size.

Launchers read: ``torchrun`` / ``python -m torch.distributed.run`` / ``torch.distributed.launch``
(``--nproc-per-node``/``--nproc_per_node``, ``--nnodes`` N or MIN:MAX, torch/distributed/run.py),
``srun`` and ``sbatch`` (``--nodes``/``-N``, ``--ntasks-per-node``, ``--gpus-per-node``,
``#SBATCH`` lines), ``deepspeed`` (``--num_gpus``, ``--num_nodes``), ``mpirun -np``. Prefixes such
as ``uv run``, ``nsys profile ...``, ``python -u`` are skipped. A plain ``python pretrain_gpt.py``
outside ``srun`` is one process.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from planner.check.bash import Command, Shell, run_script
from planner.check.bash_lex import Src, Word, lex
from planner.errors import InputError

__all__ = ["Launch", "find_launch", "flags_file_fields", "ENTRY"]

ENTRY = re.compile(r"(^|/)(pretrain_[a-z0-9_]+|train)\.py$")


@dataclass
class Launch:
    """The Megatron command line: the fields after the entry script, the world it runs on."""

    args: list  # fields (tuples of Seg)
    entry: str
    launcher: str
    nproc_per_node: int | None = None
    nnodes: int | None = None
    world: int | None = None
    world_where: str = ""
    env: dict = field(default_factory=dict)
    shell: Shell | None = None
    command: Command | None = None
    defaults: list = field(default_factory=list)  # environment variables the script took defaults for


def _int(s: str) -> int | None:
    s = s.split(":")[-1]
    return int(s) if s.isdigit() else None


def _torchrun_opts(words: list[str]) -> dict:
    out, i = {}, 0
    while i < len(words):
        w = words[i]
        key, eq, val = w.partition("=")
        key = key.replace("_", "-")
        if key in ("--nproc-per-node", "--nnodes", "--node-rank", "--master-addr", "--master-port", "--rdzv-id", "--rdzv-backend",
                   "--rdzv-endpoint", "--rdzv-conf", "--max-restarts", "--monitor-interval", "--log-dir", "--redirects", "--tee",
                   "--role", "--local-addr", "--start-method", "--rdzv_id", "--num-gpus", "--num-nodes", "--hostfile", "--include",
                   "--exclude", "--master_addr", "--master_port", "--launcher", "-np", "-n", "--npernode", "-N"):
            if not eq and i + 1 < len(words):
                val = words[i + 1]
                i += 1
            out[key] = val
        i += 1
    return out


def find_launch(path: Path) -> Launch:
    """The Megatron launch of the script at ``path`` (InputError when it starts none)."""
    sh = run_script(path)
    for cmd in sh.commands:
        words = cmd.words()
        k = next((i for i, w in enumerate(words) if ENTRY.search(w)), None)
        if k is None:
            continue
        pre = words[:k]
        launcher = next((w for w in pre if w in ("torchrun", "deepspeed", "mpirun", "mpiexec")), None)
        if launcher is None and "torch.distributed.run" in pre:
            launcher = "torchrun"
        if launcher is None and "torch.distributed.launch" in pre:
            launcher = "torchrun"
        launcher = launcher or "python"
        opts = _torchrun_opts(pre)
        ln = Launch(cmd.argv[k + 1:], words[k], launcher, env=dict(cmd.env), shell=sh, command=cmd, defaults=sorted(sh.defaults_used))
        o = cmd.origin
        here = f"{Path(o.file).name}:{o.line}"
        if launcher == "torchrun":
            ln.nproc_per_node = _int(opts.get("--nproc-per-node", "1") or "1") or None
            ln.nnodes = _int(opts.get("--nnodes", "1") or "1")
            if ln.nproc_per_node and ln.nnodes:
                ln.world = ln.nproc_per_node * ln.nnodes
                ln.world_where = f"{here} torchrun --nproc-per-node {ln.nproc_per_node} x --nnodes {ln.nnodes}"
        elif launcher == "deepspeed":
            ln.nproc_per_node = _int(opts.get("--num-gpus", "") or "")
            ln.nnodes = _int(opts.get("--num-nodes", "") or "") or 1
            if ln.nproc_per_node:
                ln.world = ln.nproc_per_node * ln.nnodes
                ln.world_where = f"{here} deepspeed --num_gpus {ln.nproc_per_node} x --num_nodes {ln.nnodes}"
        elif launcher in ("mpirun", "mpiexec"):
            ln.world = _int(opts.get("-np", opts.get("-n", "")) or "")
            ln.world_where = f"{here} {launcher} -np"
        # srun / sbatch around a per-task python: nodes x tasks per node
        slurm = {}
        for kind, o2 in cmd.context:
            slurm.update({k: v for k, v in o2.items() if v})
        if launcher == "python" and cmd.context:
            nodes, tasks = _int(str(slurm.get("nodes", ""))), _int(str(slurm.get("ntasks-per-node", "")))
            ntasks = _int(str(slurm.get("ntasks", "")))
            if nodes and tasks:
                ln.world, ln.nnodes, ln.nproc_per_node = nodes * tasks, nodes, tasks
                ln.world_where = f"{here} sbatch/srun --nodes {nodes} x --ntasks-per-node {tasks}"
            elif ntasks:
                ln.world = ntasks
                ln.world_where = f"{here} srun --ntasks {ntasks}"
        elif launcher == "python" and not cmd.context:
            ln.world, ln.nnodes, ln.nproc_per_node = 1, 1, 1
            ln.world_where = f"{here} a single python process (no launcher)"
        return ln
    starts = sorted({c.words()[0] for c in sh.commands if c.words()})
    raise InputError(str(path), "no pretrain_*.py launch", "a script that starts Megatron-LM (commands it runs: "
                     + (", ".join(starts[:6]) or "none") + ")")


def flags_file_fields(path: Path) -> list:
    """The words of a flags file (``--flag value`` over lines; ``#`` comments, ``\\``
    continuations and quotes as in a shell), each with its line."""
    text = path.read_text(encoding="utf-8", errors="replace")
    sh = Shell(script_name=path.name, cwd=str(path.parent.resolve()))
    src = Src.of_file(text, str(path))
    out = []
    for tok in lex(src):
        if isinstance(tok, Word):
            out.extend(sh.expand(tok, src))
    return out


def is_flags_file(path: Path) -> bool:
    """A file of Megatron flags: its first word (after comments) is a ``--flag``."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    for line in text.splitlines():
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        return s.startswith("--")
    return False


__all__ += ["is_flags_file"]
