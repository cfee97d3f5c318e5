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
from planner.report.timeline_view import timeline_view
from planner.units import fmt_time

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
    assert any(f"step time {fmt_time(sched.makespan_s)}" in t for t in texts)
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


def _texts(svg: str) -> list[str]:
    return [t.text or "" for t in ET.fromstring(svg).iter(f"{SVG_NS}text")]


def test_legend_says_what_the_shades_are() -> None:
    texts = _texts(render_svg(_plan()))
    assert any("virtual chunk 0 (dark) to 1 (light)" in t for t in texts)
    one = simulate_schedule(4, 1, 8, "1f1b", 1.0, 2.0)
    assert not any("virtual chunk" in t for t in _texts(render_svg(one)))


def test_many_microbatches_are_summarised_with_a_marked_cut() -> None:
    """128 micro-batches: warm-up, a window of the steady state, a cut, the cool-down; what is
    drawn plus what the cut leaves out still adds up to the step time on every stage."""
    sched = simulate_schedule(4, 2, 128, "interleaved", 1.0, 2.0, p2p_s=0.01, optimizer_s=0.5)
    svg = render_svg(sched)
    root = ET.fromstring(svg)
    t1, t2 = float(root.attrib["data-cut-start-s"]), float(root.attrib["data-cut-end-s"])
    assert 0 < t1 < t2 < sched.makespan_s and (t2 - t1) > 0.5 * sched.makespan_s
    drawn = defaultdict(float)
    for r in _bars(svg):
        drawn[int(r.attrib["data-stage"])] += float(r.attrib["data-dur-s"])
    for g in root.iter(f"{SVG_NS}g"):
        if g.attrib.get("class") == "stage":
            stage = int(g.attrib["data-stage"])
            assert math.isclose(drawn[stage] + float(g.attrib["data-omitted-s"]), sched.makespan_s, rel_tol=1e-9)
    assert len(_bars(svg)) < 0.3 * sum(len(s) for s in sched.stages)  # no barcode
    cut = next(t for t in _texts(svg) if "not drawn" in t)
    view = timeline_view(sched, 0, 1000)
    assert f"{view.omitted_microbatches} micro-batches of steady state" in cut
    ticks = [float(t) for t in _texts(svg) if t.replace(".", "", 1).isdigit()]
    assert min(ticks) == 0 and max(ticks) > t2  # real times on both sides of the cut
    # the cut spans whole periods, so the pattern after it is in phase with the one before
    assert ((t2 - t1) / view.period_s) == pytest.approx(round((t2 - t1) / view.period_s))
    whole = render_svg(sched, summarise=False)
    assert "data-cut-start-s" not in whole and len(_bars(whole)) == sum(len(s) for s in sched.stages)


def test_short_schedules_are_drawn_whole() -> None:
    assert "data-cut-start-s" not in render_svg(_plan())
    assert not timeline_view(simulate_schedule(4, 1, 24, "1f1b", 1.0, 2.0), 0, 1000).cut


def test_png_of_a_summarised_schedule(tmp_path: Path) -> None:
    sched = simulate_schedule(8, 3, 120, "interleaved", 1.0, 2.0, p2p_s=0.01)
    out = write_png(sched, tmp_path / "long.png")
    assert out.read_bytes()[:8] == PNG_MAGIC


def test_write_svg_on_a_full_disk_is_bad_input_and_leaves_nothing(tmp_path: Path, monkeypatch) -> None:
    """An OS failure while writing (ENOSPC at fsync) is the user's folder, not a bug: InputError
    naming --out with the OS reason, the temporary removed."""
    import os

    def full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(InputError) as exc:
        write_svg(_plan(), tmp_path / "t.svg")
    assert exc.value.flag == "--out" and "No space left on device" in str(exc.value)
    assert list(tmp_path.iterdir()) == []
