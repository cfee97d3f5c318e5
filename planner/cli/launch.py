"""``planner launch PLAN.json --engine ENGINE --out DIR``: launch configurations from a plan.

Thin edge over :mod:`planner.emit`: reads the plan document written by ``planner plan --json``,
emits the files for one engine (or all), and writes them all or none into DIR.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from planner.cli.app import app
from planner.errors import InputError

ENGINES = ("megatron", "deepspeed", "torchtitan", "slurm", "all")  # planner.emit.ENGINES (checked in tests)
SLURM_ENGINES = ("megatron", "deepspeed", "torchtitan")  # planner.emit.slurm.SLURM_ENGINES

__all__ = ["launch_command", "read_plan"]


def read_plan(path: Path) -> dict:
    """The plan document at ``path``; InputError when unreadable or not JSON."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError("PLAN", str(path), f"a readable plan file ({exc.strerror or exc})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError("PLAN", str(path), f"JSON written by `planner plan --json` ({exc.msg} at line {exc.lineno})") from None


@app.command("launch")
def launch_command(
    plan: Path = typer.Argument(..., help="Plan document written by `planner plan --json`."),
    engine: str = typer.Option(..., "--engine", help=f"One of: {', '.join(ENGINES)}."),
    out: Path = typer.Option(..., "--out", help="Directory to write the files into (created if missing)."),
    plan_rank: int = typer.Option(1, "--plan-rank", "--rank", "-r", help="Which ranked plan of the document to emit (--rank as explain and the pictures spell it)."),
    slurm_engine: Optional[str] = typer.Option(None, "--slurm-engine", help=f"Engine the sbatch script starts: {', '.join(SLURM_ENGINES)} (default: the plan's engine's)."),
    force: bool = typer.Option(False, "--force", help="Overwrite existing files."),
) -> None:
    """Write launch configurations (Megatron-LM, DeepSpeed, torchtitan, SLURM) for one plan.

    Examples:
      planner plan --json > plan.json && planner launch plan.json --engine all --out launch/
      planner launch plan.json --engine slurm --slurm-engine torchtitan --plan-rank 2 --out launch/ --force
    """
    if engine not in ENGINES:
        raise InputError("--engine", engine, "one of " + ", ".join(ENGINES))
    if slurm_engine is not None and slurm_engine not in SLURM_ENGINES:
        raise InputError("--slurm-engine", slurm_engine, "one of " + ", ".join(SLURM_ENGINES))
    from planner.emit import emit_bundle, write_files  # noqa: PLC0415 (lazy: keeps start-up fast)

    files, skipped = emit_bundle(read_plan(plan), engine, plan_rank, slurm_engine)
    written = write_files(files, out, force=force)
    for eng, why in skipped.items():
        typer.echo(f"skipped {eng}: {why}", err=True)
    for path in written:
        typer.echo(str(path))
