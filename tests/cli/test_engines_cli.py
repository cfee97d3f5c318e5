"""``planner engines list|show``: every profile printed, sharding modes per ZeRO stage, bad
names (exit 2, one line), and the README's "Engines" table equal to what the profiles say."""

from __future__ import annotations

import re

import pytest

import planner.cli  # noqa: F401  (registers the commands)
from planner.cli.app import main
from planner.cli.engines import FEATURE_COLUMNS, feature_row, features_markdown, sharding_rows
from planner.engines import ENGINE_NAMES, get_engine

from conftest import ROOT


def run(capsys, *args):
    code = main(["engines", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_list_names_every_engine(capsys):
    code, out, err = run(capsys, "list")
    assert code == 0, err
    for name in ENGINE_NAMES:
        assert name in out


@pytest.mark.parametrize("name", ENGINE_NAMES)
def test_show_prints_features_sharding_and_sources(capsys, name):
    code, out, err = run(capsys, "show", name)
    assert code == 0, err
    e = get_engine(name)
    assert e.title in out and "Sharding modes" in out and "Sources" in out
    flat = " ".join(out.split())
    for zero, *_ in sharding_rows(e):
        assert re.search(rf"(^|\n){zero}\s", out), zero
    for src in e.sources:
        text = src if isinstance(src, str) else next(iter(src))
        assert " ".join(text.split())[:40] in flat
    for s in e.sharding:
        assert s.grad_sync in out and s.param_gather in out
    for n, f, b in e.loss_kernels:  # the loss's cross-entropy implementations and their bytes
        assert f"{n} {f:g} + {b:g} B/logit" in flat


def test_sharding_rows_follow_the_profile():
    tt = {row[0]: row for row in sharding_rows(get_engine("torchtitan"))}
    assert tt["3"][2:4] == ("microbatch", "layer") and tt["3"][5].startswith("step sync, step gather")
    ds = {row[0]: row for row in sharding_rows(get_engine("deepspeed"))}
    assert ds["2"][2] == "microbatch (all-reduce)" and ds["2"][5] == "not run"


def test_unknown_engine_is_one_line_exit_2(capsys):
    code, out, err = run(capsys, "show", "megatron-cor")
    assert code == 2 and err.count("\n") == 1 and "megatron-core" in err


def test_markdown_matches_the_profiles(capsys):
    code, out, _ = run(capsys, "list", "--markdown")
    assert code == 0 and out == features_markdown()
    rows = [r.strip("| ").split(" | ") for r in out.strip().splitlines()]
    assert tuple(rows[0]) == FEATURE_COLUMNS
    assert [tuple(r) for r in rows[2:]] == [feature_row(get_engine(n)) for n in ENGINE_NAMES]


def test_readme_engines_table_is_the_profiles():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    m = re.search(r"<!-- engines-table:[^\n]*-->\n(.*?)<!-- /engines-table -->", readme, flags=re.S)
    assert m, "README.md has no Engines table between the engines-table markers"
    assert m.group(1) == features_markdown(), "regenerate with: planner engines list --markdown"
