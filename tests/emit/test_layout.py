"""Rank layout: coordinates and groups in Megatron-core's tp-cp-ep-dp-pp order."""

from __future__ import annotations

import itertools

import pytest

from emit_helpers import load
from planner.emit.layout import (RankLayout, cp_groups, dp_groups, ep_groups, expert_dp_groups, layout_from_plan,
                                 pp_groups, rank_coordinates, tp_groups)
from planner.errors import InputError


def _partition(groups: list[list[int]], world: int, size: int) -> None:
    assert sorted(r for g in groups for r in g) == list(range(world))
    assert all(len(g) == size for g in groups)


def test_default_order_tp_fastest():
    lay = RankLayout(tp=8, pp=4, dp=2)
    assert tp_groups(lay)[0] == list(range(8))  # a TP group fills one 8-GPU node
    assert dp_groups(lay)[0] == [0, 8]
    assert pp_groups(lay)[0] == [0, 16, 32, 48]
    c = lay.coords(8 * 2 + 3)
    assert (c.tp, c.cp, c.dp, c.pp) == (3, 0, 0, 1)


@pytest.mark.parametrize("tp,cp,dp,pp,ep", [(2, 1, 2, 2, 2), (2, 2, 2, 2, 4), (4, 2, 1, 3, 1), (1, 1, 8, 1, 8)])
def test_groups_partition_and_match_coords(tp, cp, dp, pp, ep):
    lay = RankLayout(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep)
    world = lay.world
    coords = rank_coordinates(lay)
    for groups, size, dim in ((tp_groups(lay), tp, "tp"), (cp_groups(lay), cp, "cp"), (dp_groups(lay), dp, "dp"),
                              (pp_groups(lay), pp, "pp"), (ep_groups(lay), ep, "ep"), (expert_dp_groups(lay), dp * cp // ep, "edp")):
        _partition(groups, world, size)
        others = [d for d in ("tp", "cp", "dp", "pp", "ep", "edp") if d != dim]
        for g in groups:
            # members differ exactly in `dim`, covering 0..size-1 in order
            assert [getattr(coords[r], dim) for r in g] == list(range(size))
            if dim in ("tp", "cp", "dp", "pp"):
                for d in ("tp", "cp", "dp", "pp"):
                    if d != dim:
                        assert len({getattr(coords[r], d) for r in g}) == 1
            else:
                for d in ("tp", "pp", "ep", "edp"):
                    if d != dim and d in others:
                        assert len({getattr(coords[r], d) for r in g}) == 1


def test_layout_from_plan_and_errors():
    lay = layout_from_plan(load("tiny_moe_8gpu"), 1)
    assert (lay.tp, lay.pp, lay.dp, lay.ep, lay.world) == (2, 2, 2, 2, 8)
    with pytest.raises(InputError):
        RankLayout(tp=2, dp=3, ep=2)
    with pytest.raises(InputError):
        RankLayout(tp=2, order="tp-dp-pp")
    with pytest.raises(InputError):
        lay.coords(8)
    with pytest.raises(InputError):
        lay.groups("expert:cp")


def test_matches_megatron_core_rank_generator():
    pytest.importorskip("torch")
    ps = pytest.importorskip("megatron.core.parallel_state")
    for tp, cp, dp, pp, ep, etp in itertools.product([1, 2, 4], [1, 2], [1, 2, 4], [1, 2, 3], [1, 2, 4, 8], [None, 1, 2]):
        e = tp if etp is None else etp
        if (tp * dp * cp) % (ep * e):
            continue
        for order in ("tp-cp-ep-dp-pp", "tp-pp-dp-cp-ep"):
            try:
                lay = RankLayout(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, order=order, etp=etp)
            except InputError:
                continue
            dense = ps.RankGenerator(tp=tp, ep=1, dp=dp, pp=pp, cp=cp, order=order)
            # Megatron-core's expert_decoder_rank_generator: tp = etp, cp = 1, dp = the expert data degree
            expert = ps.RankGenerator(tp=e, ep=ep, dp=tp * dp * cp // (ep * e), pp=pp, cp=1, order=order)
            for tok in ("tp", "cp", "dp", "pp", "dp-cp", "tp-pp", "tp-cp"):
                assert lay.groups(tok) == dense.get_ranks(tok), (tok, tp, cp, dp, pp, ep, order)
            for tok in ("ep", "dp", "tp", "tp-ep", "tp-ep-pp"):
                assert lay.groups("expert:" + tok) == expert.get_ranks(tok), (tok, tp, cp, dp, pp, ep, order)
