"""Dump the option table of Megatron-LM's argument parser (run with the snapshot first on
PYTHONPATH and tests/emit on sys.path for the CPU import shims): one JSON object
{option: [nargs, type, choices, default]} on stdout. tests/check/test_megatron_flags.py compares it
with planner/check/data/megatron_args.json; ``--write`` regenerates that file."""

from __future__ import annotations

import argparse
import enum
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "emit"))
import megatron_lm_shim  # noqa: E402,F401

import megatron.training.arguments as A  # noqa: E402

_ZERO = (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse._StoreConstAction, argparse.BooleanOptionalAction,
         argparse._HelpAction)


def table() -> dict:
    parser = A.add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))
    out = {}
    for act in parser._actions:
        if isinstance(act, argparse._HelpAction):
            continue
        nargs = 0 if isinstance(act, _ZERO) else (1 if act.nargs is None else act.nargs)
        typ = getattr(act.type, "__name__", None)
        typ = typ if typ in ("int", "float", "str") else ("str" if nargs else None)
        choices = [c.name if isinstance(c, enum.Enum) else str(c) for c in act.choices] if act.choices else None
        default = act.default.name if isinstance(act.default, enum.Enum) else act.default
        if not isinstance(default, (int, float, str, bool, type(None))):
            default = None
        for name in act.option_strings:
            out[name] = [nargs, typ, choices, default]
    return dict(sorted(out.items()))


if __name__ == "__main__":
    t = table()
    if "--write" in sys.argv:
        dest = Path(__file__).resolve().parents[2] / "planner" / "check" / "data" / "megatron_args.json"
        doc = {"source": "Megatron-LM snapshot (megatron-core 0.20.0): megatron/training/arguments.py add_megatron_arguments, "
                         "every option with [nargs, type, choices, default] (tests/check/megatron_parser_dump.py --write)",
               "flags": t}
        rows = ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in t.items())
        dest.write_text("{\n" + f' "source": {json.dumps(doc["source"])},\n "flags": {{\n' + rows + "\n }\n}\n")
    json.dump(t, sys.stdout)
