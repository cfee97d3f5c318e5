"""Pipeline schedule simulation against the closed forms of Narayanan et al. 2021 sec. 2.2."""

from __future__ import annotations

import math
import random

import pytest

from planner.errors import InputError
from planner.report.schedule import EVENT_KINDS, Event, simulate_schedule, makespan_and_bubble

F_S, B_S = 1.0, 2.0


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


@pytest.mark.parametrize("kind", ["1f1b", "gpipe"])
@pytest.mark.parametrize("p,m", [(1, 1), (1, 5), (2, 1), (2, 4), (3, 2), (4, 4), (4, 8), (4, 13), (8, 8), (8, 32)])
def test_flush_schedules_match_closed_form(kind: str, p: int, m: int) -> None:
    s = simulate_schedule(p, 1, m, kind, F_S, B_S)
    makespan_s, bubble = makespan_and_bubble(s)
    assert _close(makespan_s, (m + p - 1) * (F_S + B_S))
    assert _close(bubble, (p - 1) / m)


@pytest.mark.parametrize("p,v,m", [(2, 2, 2), (2, 2, 4), (4, 2, 4), (4, 2, 8), (4, 3, 12), (4, 4, 16), (8, 2, 16), (3, 3, 6), (1, 2, 3)])
@pytest.mark.parametrize("f_s,b_s", [(1.0, 2.0), (1.0, 1.0), (0.37, 0.91)])
def test_interleaved_matches_closed_form(p: int, v: int, m: int, f_s: float, b_s: float) -> None:
    s = simulate_schedule(p, v, m, "interleaved", f_s, b_s)
    makespan_s, bubble = makespan_and_bubble(s)
    assert _close(makespan_s, (m + (p - 1) / v) * (f_s + b_s))
    assert _close(bubble, (p - 1) / (v * m))


def test_gpipe_and_1f1b_same_makespan_but_different_order() -> None:
    a = simulate_schedule(4, 1, 8, "1f1b", F_S, B_S)
    g = simulate_schedule(4, 1, 8, "gpipe", F_S, B_S)
    assert _close(a.makespan_s, g.makespan_s)
    first = [e.kind for e in g.stages[0] if e.kind in ("fwd", "bwd")]
    assert first == ["fwd"] * 8 + ["bwd"] * 8
    assert [e.kind for e in a.stages[0] if e.kind in ("fwd", "bwd")] != first


def _random_configs(n: int) -> list[dict]:
    rng = random.Random(1234)
    out = []
    for _ in range(n):
        kind = rng.choice(["1f1b", "gpipe", "interleaved"])
        p = rng.randint(1, 6)
        v = rng.randint(2, 4) if kind == "interleaved" else 1
        m = p * rng.randint(1, 4) if kind == "interleaved" else rng.randint(1, 12)
        out.append(dict(
            pp=p, vpp=v, num_microbatches=m, kind=kind,
            fwd_s=[rng.uniform(0.1, 1.0) for _ in range(p)],
            bwd_s=[rng.uniform(0.2, 2.0) for _ in range(p)],
            recompute_s=[rng.choice([0.0, rng.uniform(0.05, 0.8)]) for _ in range(p)],
            p2p_s=rng.choice([0.0, rng.uniform(0.01, 0.3)]),
            optimizer_s=[rng.uniform(0.0, 0.5) for _ in range(p)],
            dp_exposed_s=rng.choice([0.0, rng.uniform(0.0, 0.5)]),
        ))
    return out


@pytest.mark.parametrize("cfg", _random_configs(60))
def test_dependencies_hold_for_every_microbatch(cfg: dict) -> None:
    s = simulate_schedule(**cfg)
    p, v, m, p2p = s.pp, s.vpp, s.num_microbatches, cfg["p2p_s"]
    n_virtual = p * v
    fwd: dict[tuple[int, int], Event] = {}
    bwd: dict[tuple[int, int], Event] = {}
    rec: dict[tuple[int, int], Event] = {}
    for rank, events in enumerate(s.stages):
        for e in events:
            if e.kind in ("fwd", "bwd", "recompute"):
                key = (e.microbatch, e.chunk * p + rank)
                table = {"fwd": fwd, "bwd": bwd, "recompute": rec}[e.kind]
                assert key not in table
                table[key] = e
    keys = {(i, vs) for i in range(m) for vs in range(n_virtual)}
    assert set(fwd) == keys and set(bwd) == keys
    tol = 1e-9 * s.makespan_s
    for i in range(m):
        for vs in range(n_virtual):
            rank, chunk = vs % p, vs // p
            assert _close(fwd[(i, vs)].dur_s, cfg["fwd_s"][rank] / v)
            assert _close(bwd[(i, vs)].dur_s, cfg["bwd_s"][rank] / v)
            start_b = rec[(i, vs)].start_s if (i, vs) in rec else bwd[(i, vs)].start_s
            if (i, vs) in rec:
                assert rec[(i, vs)].end_s == bwd[(i, vs)].start_s  # recompute right before backward
            if vs > 0:
                assert fwd[(i, vs)].start_s >= fwd[(i, vs - 1)].end_s + p2p - tol
            if vs < n_virtual - 1:
                assert start_b >= bwd[(i, vs + 1)].end_s + p2p - tol
            assert start_b >= fwd[(i, vs)].end_s - tol
            assert fwd[(i, vs)].chunk == chunk


@pytest.mark.parametrize("cfg", _random_configs(60))
def test_events_tile_zero_to_makespan(cfg: dict) -> None:
    s = simulate_schedule(**cfg)
    assert len(s.stages) == s.pp
    for events in s.stages:
        assert events[0].start_s == 0.0
        assert events[-1].end_s == s.makespan_s
        for a, b in zip(events, events[1:]):
            assert a.end_s == b.start_s  # exact: no gap, no overlap
        for e in events:
            assert e.kind in EVENT_KINDS and e.end_s > e.start_s
            assert (e.microbatch is None) == (e.kind in ("idle", "optimizer", "dp_comm"))
        assert math.isclose(math.fsum(e.dur_s for e in events), s.makespan_s, rel_tol=1e-9)


def test_tail_is_dp_comm_then_optimizer_and_excluded_from_bubble() -> None:
    s = simulate_schedule(2, 1, 4, "1f1b", F_S, B_S, optimizer_s=0.5, dp_exposed_s=[0.25, 2.75])
    # Rank 0 ends its last backward at (m + p - 1)(f + b) = 15 s, rank 1 one backward earlier.
    end0 = (4 + 2 - 1) * (F_S + B_S) + 0.25 + 0.5
    end1 = (4 + 2 - 1) * (F_S + B_S) - B_S + 2.75 + 0.5
    assert _close(s.makespan_s, max(end0, end1))
    assert [e.kind for e in s.stages[0]][-3:] == ["dp_comm", "optimizer", "idle"]
    assert [e.kind for e in s.stages[1]][-2:] == ["dp_comm", "optimizer"]
    _, bubble = makespan_and_bubble(s)
    assert _close(bubble, 1 / 4)


def test_p2p_and_recompute_lengthen_critical_path() -> None:
    s = simulate_schedule(4, 1, 8, "1f1b", F_S, B_S, recompute_s=F_S, p2p_s=0.1)
    base = simulate_schedule(4, 1, 8, "1f1b", F_S, B_S)
    assert s.makespan_s > base.makespan_s + 8 * F_S
    assert any(e.kind == "p2p" for e in s.stages[0]) and not any(e.kind == "p2p" for e in base.stages[0])


@pytest.mark.parametrize("p,v,m", [(4, 2, 8), (4, 2, 4), (2, 3, 6), (8, 2, 16)])
def test_interleaved_warmup_follows_megatron(p: int, v: int, m: int) -> None:
    s = simulate_schedule(p, v, m, "interleaved", F_S, B_S)
    total = m * v
    for rank, events in enumerate(s.stages):
        order = [e for e in events if e.kind in ("fwd", "bwd")]
        first_b = next(k for k, e in enumerate(order) if e.kind == "bwd")
        warmup = min((p - rank - 1) * 2 + (v - 1) * p, total)
        assert first_b == (warmup + 1 if warmup < total else total)
        fwd_order = [(e.microbatch, e.chunk) for e in order if e.kind == "fwd"]
        assert fwd_order[: 2 * p] == [(i, 0) for i in range(p)] + [(i, 1 % v) for i in range(p)]


@pytest.mark.parametrize("p,m", [(4, 8), (4, 2), (3, 7)])
def test_1f1b_warmup_and_single_chunk(p: int, m: int) -> None:
    s = simulate_schedule(p, 1, m, "1f1b", F_S, B_S)
    for rank, events in enumerate(s.stages):
        order = [e.kind for e in events if e.kind in ("fwd", "bwd")]
        warmup = min(p - rank - 1, m)
        assert order.index("bwd") == (warmup + 1 if warmup < m else m)
        assert all(e.chunk in (0, None) for e in events)


@pytest.mark.parametrize(
    "kwargs,field",
    [
        (dict(pp=4, vpp=2, num_microbatches=6, kind="interleaved"), "num_microbatches"),
        (dict(pp=4, vpp=1, num_microbatches=8, kind="interleaved"), "vpp"),
        (dict(pp=4, vpp=2, num_microbatches=8, kind="1f1b"), "vpp"),
        (dict(pp=4, vpp=1, num_microbatches=8, kind="zb"), "kind"),
        (dict(pp=0, vpp=1, num_microbatches=8, kind="1f1b"), "pp"),
        (dict(pp=2, vpp=1, num_microbatches=0, kind="gpipe"), "num_microbatches"),
        (dict(pp=2.0, vpp=1, num_microbatches=2, kind="gpipe"), "pp"),
    ],
)
def test_bad_structure_raises_input_error(kwargs: dict, field: str) -> None:
    with pytest.raises(InputError) as exc:
        simulate_schedule(fwd_s=F_S, bwd_s=B_S, **kwargs)
    assert exc.value.field == field


@pytest.mark.parametrize(
    "kwargs,field",
    [
        (dict(fwd_s=[1.0, 1.0]), "fwd_s"),
        (dict(fwd_s=0.0), "fwd_s"),
        (dict(bwd_s=-1.0), "bwd_s"),
        (dict(bwd_s=float("nan")), "bwd_s"),
        (dict(recompute_s=-0.1), "recompute_s"),
        (dict(p2p_s=-0.1), "p2p_s"),
        (dict(optimizer_s="1"), "optimizer_s"),
        (dict(dp_exposed_s=[0.0, 0.0, 0.0, float("inf")]), "dp_exposed_s"),
    ],
)
def test_bad_durations_raise_input_error(kwargs: dict, field: str) -> None:
    args = dict(pp=4, vpp=1, num_microbatches=8, kind="1f1b", fwd_s=F_S, bwd_s=B_S)
    args.update(kwargs)
    with pytest.raises(InputError) as exc:
        simulate_schedule(**args)
    assert exc.value.field == field
