"""Regenerate the terminal pictures of README: what `planner plan` and `planner plan --explain`
print, as SVG files under docs/img/.

Each command runs as a user would run it (``python -m planner ARGS``), in colour
(``FORCE_COLOR=1``) at 80 columns; its output is replayed into a recording rich console
(``Console(record=True)``) and exported with ``Console.export_svg``. Run from the repository
root after changing what a command prints:

    python docs/terminal_pictures.py            # every picture
    python docs/terminal_pictures.py plan       # one of them

``PICTURES`` is the list (an entry whose arguments are None is skipped).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "docs" / "img"
WIDTH = 80

# name -> (arguments after `planner`, title of the picture's window)
PICTURES: dict[str, tuple[list[str] | None, str]] = {
    "plan": (["plan"], "planner plan"),
    "plan-explain": (["plan", "--top", "3", "--explain"], "planner plan --top 3 --explain"),
    "check": (["check", "examples/train_llama3_70b.sh"], "planner check examples/train_llama3_70b.sh"),
}


def run(args: list[str]) -> str:
    """The command's stdout with its colours (ANSI), at WIDTH columns."""
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE")}
    env.update(FORCE_COLOR="1", COLUMNS=str(WIDTH), TERM="xterm-256color")
    p = subprocess.run([sys.executable, "-m", "planner", *args], capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
    if p.returncode != 0:
        raise SystemExit(f"planner {' '.join(args)} exited {p.returncode}: {p.stderr.strip()}")
    return p.stdout


def picture(name: str) -> Path | None:
    from rich.console import Console
    from rich.text import Text

    args, title = PICTURES[name]
    if args is None:
        print(f"skipped {name}: no arguments yet (a hook for a command still being built)")
        return None
    con = Console(record=True, width=WIDTH, force_terminal=True, color_system="truecolor", file=open(os.devnull, "w"))
    con.print(Text(f"$ planner {' '.join(args)}", style="bold"))
    con.print(Text.from_ansi(run(args)), end="")
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"{name}.svg"
    svg = con.export_svg(title=title)
    # rich's template loads Fira Code from a web CDN; keep the picture self-contained (local
    # font or the viewer's monospace fallback) and byte-stable
    svg = "\n".join(line for line in svg.splitlines() if "url(\"https://" not in line).replace('local("FiraCode-Regular"),', 'local("FiraCode-Regular");').replace('local("FiraCode-Bold"),', 'local("FiraCode-Bold");')
    path.write_text(svg + "\n")
    print(f"wrote {path.relative_to(REPO) if path.is_relative_to(REPO) else path}")
    return path


def main(names: list[str]) -> None:
    for name in names or list(PICTURES):
        if name not in PICTURES:
            raise SystemExit(f"unknown picture {name!r}: one of {', '.join(PICTURES)}")
        picture(name)


if __name__ == "__main__":
    main(sys.argv[1:])
