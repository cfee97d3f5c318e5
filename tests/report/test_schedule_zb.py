"""The zero-bubble schedules in the simulator against the closed forms of
:func:`planner.cost.step.pipeline_form` (Qi et al. 2024, Table 1): ZB-H1 and ZB-H2 bubbles by
hand for equal F = B = W, and the simulated span equal to the closed form wherever W <= F."""

from __future__ import annotations

import pytest

from planner.cost.step import pipeline_form, pipeline_time
from planner.errors import InputError
from planner.report.schedule import simulate_schedule


def _span(s) -> float:
    """Longest per-stage span, first forward to last pipeline op (optimizer post-validation)."""
    return max(max(e.end_s for e in st if e.kind in ("fwd", "bwd", "wgrad"))
               - min(e.start_s for e in st if e.kind == "fwd") for st in s.stages)


def test_hand_computed_bubbles_equal_passes():
    # p = 4, m = 8, F = B = W = 1 s: 1F1B (p-1)(F+B+W) = 9, ZB-H1 (p-1)(F+B-W) = 3, ZB-H2 0.
    one = simulate_schedule(4, 1, 8, "1f1b", 1.0, 2.0)
    h1 = simulate_schedule(4, 1, 8, "zb-h1", 1.0, 2.0, wgrad_s=1.0)
    h2 = simulate_schedule(4, 1, 8, "zb-h2", 1.0, 2.0, wgrad_s=1.0)
    assert one.makespan_s == pytest.approx(24 + 9)
    assert h1.makespan_s == pytest.approx(24 + 3)
    assert _span(h2) == pytest.approx(24.0)
    # ZB-H2's staircase: the last stage starts (p - 1) forwards late.
    assert h2.makespan_s == pytest.approx(24 + 3)


@pytest.mark.parametrize("kind", ["zb-h1", "zb-h2"])
@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 12), (8, 16), (8, 32), (16, 64)])
@pytest.mark.parametrize("fbw", [(1, 1, 1), (1, 1.2, 0.8), (1, 2, 0.5), (1.3, 1, 1), (1, 1, 0.6)])
def test_simulated_span_is_the_closed_form(kind, p, m, fbw):
    f, b, w = fbw
    s = simulate_schedule(p, 1, m, kind, f, b + w, wgrad_s=w)
    closed = pipeline_time([f + b + w] * p, [w] * p, [f] * p, m, pipeline_form(kind, m, 1, p))
    assert _span(s) == pytest.approx(closed, rel=1e-12)


def test_weight_gradients_all_run_and_memory_limit_holds():
    p, m = 4, 12
    for kind, limit in (("zb-h1", p), ("zb-h2", 2 * p - 1)):
        s = simulate_schedule(p, 1, m, kind, 1.0, 2.0, wgrad_s=1.0)
        for st in s.stages:
            assert sorted(e.microbatch for e in st if e.kind == "wgrad") == list(range(m))
            # in flight = forwards started minus weight gradients done, at every forward's start
            for e in st:
                if e.kind == "fwd":
                    started = sum(1 for x in st if x.kind == "fwd" and x.start_s <= e.start_s)
                    done = sum(1 for x in st if x.kind == "wgrad" and x.end_s <= e.start_s)
                    assert started - done <= limit, (kind, e)


def test_stages_tile_the_makespan():
    s = simulate_schedule(4, 1, 8, "zb-h1", [1.0, 1.1, 0.9, 1.2], [2.0, 2.1, 1.9, 2.6], wgrad_s=[0.8, 0.9, 0.7, 1.0],
                          p2p_s=0.01, optimizer_s=0.3)
    for st in s.stages:
        assert st[0].start_s == 0.0 and st[-1].end_s == s.makespan_s
        assert all(a.end_s == b.start_s for a, b in zip(st, st[1:]))


def test_wgrad_must_be_below_the_backward():
    with pytest.raises(InputError) as exc:
        simulate_schedule(2, 1, 4, "zb-h1", 1.0, 1.0, wgrad_s=1.0)
    assert exc.value.field == "wgrad_s"
