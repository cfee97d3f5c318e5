"""``planner schema plan|estimate|validate``: the JSON Schema of each JSON output."""

from __future__ import annotations

from importlib import resources
from typing import Annotated

import typer

from planner.cli.app import app
from planner.errors import InputError

__all__ = ["schema_cmd", "SCHEMA_NAMES", "schema_text"]

SCHEMA_NAMES = ("plan", "estimate", "validate", "check")


def schema_text(name: str) -> str:
    """The shipped JSON Schema ``planner/schemas/<name>.json``."""
    if name not in SCHEMA_NAMES:
        from planner.io.presets import suggest  # noqa: PLC0415

        hint = suggest(name, SCHEMA_NAMES)
        raise InputError("NAME", name, ", ".join(SCHEMA_NAMES[:-1]) + f" or {SCHEMA_NAMES[-1]}" + (f" ({hint})" if hint else ""))
    return resources.files("planner.schemas").joinpath(f"{name}.json").read_text(encoding="utf-8")


@app.command("schema")
def schema_cmd(name: Annotated[str, typer.Argument(help="plan | estimate | validate | check.")]) -> None:
    """Print the JSON Schema (draft 2020-12) of a JSON output: `plan --json` (planner-plan/1),
    `estimate --json` (planner-estimate/1), `validate --json` (planner-validate/1) or `check --json`
    (planner-check/1).

    Examples:
      planner schema plan > plan.schema.json
      planner schema validate
    """
    typer.echo(schema_text(name), nl=False)
