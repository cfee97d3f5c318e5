"""A plan with tensor-parallel communication overlap launches Megatron with --tp-comm-overlap."""

import copy
import json
import shlex
from pathlib import Path

from planner.emit import emit_files

FIX = Path(__file__).parent / "fixtures"


def _megatron_words(doc: dict) -> list[str]:
    text = emit_files(doc, "megatron")["megatron_launch.sh"]
    return shlex.split(text, comments=True)


def test_tp_comm_overlap_flag_follows_the_plan():
    doc = json.loads((FIX / "llama70b_64gpu.json").read_text())
    on, off = copy.deepcopy(doc), copy.deepcopy(doc)
    for d, flag in ((on, True), (off, False)):
        for p in d["plans"]:
            p["parallel"]["tp_comm_overlap"] = flag
    par = on["plans"][0]["parallel"]
    words_on, words_off = _megatron_words(on), _megatron_words(off)
    assert "--tp-comm-overlap" not in words_off
    assert par["tp"] > 1 and par["sequence_parallel"], "fixture must use TP with sequence parallelism"
    assert "--tp-comm-overlap" in words_on and "--sequence-parallel" in words_on


def test_cli_engine_lists_match_the_emitters():
    """planner.cli.launch keeps its own copies (for a fast start-up); they must not drift."""
    import planner.cli.launch as launch_cli
    from planner.emit import ENGINES
    from planner.emit.slurm import SLURM_ENGINES

    assert tuple(ENGINES) == launch_cli.ENGINES
    assert tuple(SLURM_ENGINES) == launch_cli.SLURM_ENGINES
