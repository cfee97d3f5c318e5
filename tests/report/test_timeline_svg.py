"""SVG/PNG timeline of a simulated schedule."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

import pytest

from planner.errors import InputError
from planner.report.schedule import simulate_schedule
from planner.report.timeline_svg import nice_ticks, render_svg, write_png, write_svg

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SVG_NS = "{http://www.w3.org/2000/svg}"


def _plan(**extra):
    return simulate_schedule(4, 2, 8, "interleaved", 1.0, 2.0, **extra)


def _bars(svg: str) -> list[ET.Element]:
    root = ET.fromstring(svg)
    assert root.tag == f"{SVG_NS}svg"
    return [r for r in root.iter(f"{SVG_NS}rect") if "data-kind" in r.attrib]


@pytest.mark.parametrize(
    "extra",
    [{}, dict(recompute_s=0.7, p2p_s=0.03, optimizer_s=0.4, dp_exposed_s=[0.1, 0.0, 0.3, 0.2])],
)
def test_interleaved_svg_rows_sum_to_makespan(extra: dict) -> None:
    sched = _plan(**extra)
    svg = render_svg(sched)
    bars = _bars(svg)
    per_stage: dict[int, list[float]] = defaultdict(list)
    for r in bars:
        assert r.attrib["data-kind"] in {"fwd", "bwd", "recompute", "p2p", "idle", "optimizer", "dp_comm"}
        per_stage[int(r.attrib["data-stage"])].append(float(r.attrib["data-dur-s"]))
        assert float(r.attrib["data-start-s"]) >= 0.0
    assert sorted(per_stage) == [0, 1, 2, 3]
    for stage, durs in per_stage.items():
        assert math.isclose(math.fsum(durs), sched.makespan_s, rel_tol=1e-9), stage
        assert len(durs) == len(sched.stages[stage])


def test_svg_bars_are_to_scale_and_titled() -> None:
    sched = _plan()
    root = ET.fromstring(render_svg(sched, width_px=1000))
    texts = [t.text or "" for t in root.iter(f"{SVG_NS}text")]
    assert any(f"step time {sched.makespan_s:.6g} s" in t for t in texts)
    assert "time (s)" in texts
    for kind in ("fwd", "bwd", "idle"):
        assert kind in texts  # legend entries
    bars = _bars(render_svg(sched, width_px=1000))
    widths = defaultdict(float)
    for r in bars:
        widths[r.attrib["data-stage"]] += float(r.attrib["width"])
    for w in widths.values():
        assert math.isclose(w, widths["0"], rel_tol=1e-3)
    fwd0 = [r for r in bars if r.attrib["data-kind"] == "fwd" and r.attrib["data-stage"] == "0"]
    assert fwd0[0].attrib["data-microbatch"] == "0" and fwd0[0].attrib["data-chunk"] == "0"
    assert {"0", "7"} <= set(texts)  # micro-batch numbers inside wide bars


def test_nice_ticks() -> None:
    assert nice_ticks(10.0) == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
    assert nice_ticks(0.033)[:3] == [0.0, 0.005, 0.01]
    assert nice_ticks(0.0) == [0.0]
    for span in (0.0123, 1.0, 7.3, 35.1, 1234.0):
        ticks = nice_ticks(span)
        assert 3 <= len(ticks) <= 12 and ticks[-1] <= span * (1 + 1e-9)


def test_write_svg_atomic_and_no_clobber(tmp_path: Path) -> None:
    sched = _plan()
    out = tmp_path / "timeline.svg"
    assert write_svg(sched, out) == out
    ET.parse(out)
    with pytest.raises(InputError) as exc:
        write_svg(sched, out)
    assert exc.value.field == "path"
    out.write_text("old")
    write_svg(sched, out, force=True)
    assert out.read_text().startswith("<svg")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["timeline.svg"]  # no temp files left
    with pytest.raises(InputError):
        write_svg(sched, tmp_path / "missing_dir" / "t.svg")


def test_write_png_magic(tmp_path: Path) -> None:
    sched = _plan(recompute_s=0.5, p2p_s=0.05, optimizer_s=0.3)
    out = write_png(sched, tmp_path / "timeline.png")
    assert out.read_bytes()[:8] == PNG_MAGIC
    with pytest.raises(InputError):
        write_png(sched, out)
    write_png(simulate_schedule(2, 1, 3, "gpipe", 1e-3, 2e-3), out, force=True)
    assert out.read_bytes()[:8] == PNG_MAGIC
    assert sorted(p.name for p in tmp_path.iterdir()) == ["timeline.png"]


def test_render_svg_rejects_bad_width() -> None:
    with pytest.raises(InputError):
        render_svg(_plan(), width_px=10)
