"""Global rank -> parallel coordinates, and the rank groups of each dimension, in Megatron-core's
order.

Convention implemented (Megatron-core ``parallel_state.initialize_model_parallel`` and its
``RankGenerator``, launch_formats.md sec. 2.2, default ``order="tp-cp-ep-dp-pp"``):

* Dense (attention / non-expert) layers use the grid TP x CP x DP x PP = world. A rank is
  ``rank = sum(coord[d] * stride[d])`` with the dimensions taken in ``order``, the first one
  varying fastest: with the default order TP is fastest (TP groups are consecutive ranks, so
  they sit inside a node when tp <= GPUs per node), then CP, then DP, and PP slowest.
  EP has size 1 on this grid.
* Expert (MoE) layers use a second grid ETP x EP x EDP x PP = world over the *same* ranks,
  with CP size 1 (Megatron-core's ``expert_decoder_rank_generator``; ETP = TP by default when
  ``--expert-tensor-parallel-size`` is unset; the Megatron emitter passes it explicitly).
  EP is carved out of the tp x dp x cp ranks of each pipeline stage: EDP = tp * dp * cp /
  (etp * ep); with ETP = TP that is dp * cp / ep. With the default order the ep index of a
  rank is ``(rank // etp) % ep`` within its stage block and the expert-data index is
  ``(rank // (etp * ep)) % edp``.
* PP groups are identical on both grids (Megatron asserts this).

Groups are listed in Megatron's order (same ranks, same order as
``RankGenerator.get_ranks(token)``), so ``groups("dp")`` here equals Megatron's DP groups.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from planner.errors import InputError

__all__ = [
    "DEFAULT_ORDER",
    "RankCoord",
    "RankLayout",
    "layout_from_plan",
    "rank_coordinates",
    "groups",
    "tp_groups",
    "cp_groups",
    "dp_groups",
    "pp_groups",
    "ep_groups",
    "expert_dp_groups",
]

DEFAULT_ORDER = "tp-cp-ep-dp-pp"
_DIMS = ("tp", "cp", "ep", "dp", "pp")


class RankCoord(NamedTuple):
    """Coordinates of one global rank. ``tp, cp, dp, pp`` on the dense grid; ``ep`` and ``edp``
    (expert data-parallel index) on the expert grid (whose tensor index is the rank's expert
    tensor index, equal to ``tp`` where etp = tp)."""

    rank: int
    tp: int
    cp: int
    ep: int
    dp: int
    pp: int
    edp: int


def _generate(sizes: list[int], mask: list[bool]) -> list[list[int]]:
    """Orthogonal groups over a grid whose first dimension varies fastest.

    Each group holds the ranks that share every unmasked coordinate; groups are enumerated
    by the unmasked coordinates (first dimension fastest), ranks inside a group by the
    masked ones (first dimension fastest), as Megatron-core's
    ``generate_masked_orthogonal_rank_groups`` does.
    """
    strides, acc = [], 1
    for s in sizes:
        strides.append(acc)
        acc *= s
    masked = [i for i, m in enumerate(mask) if m]
    unmasked = [i for i, m in enumerate(mask) if not m]

    def enumerate_dims(dims: list[int]) -> list[int]:
        offsets = [0]
        for d in dims:  # first dim fastest: extend with the later dims as outer loops
            offsets = [o + k * strides[d] for k in range(sizes[d]) for o in offsets]
        return offsets

    inner = enumerate_dims(masked)
    return [[base + off for off in inner] for base in enumerate_dims(unmasked)]


@dataclass(frozen=True)
class RankLayout:
    """Parallel degrees plus the Megatron-core rank order; see the module docstring."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1
    order: str = DEFAULT_ORDER
    etp: int | None = None  # expert tensor parallelism; None: tp (Megatron-core's default)

    def __post_init__(self) -> None:
        if self.etp is None:
            object.__setattr__(self, "etp", self.tp)
        for d in (*_DIMS, "etp"):
            v = getattr(self, d)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InputError(f"layout.{d}", v, "a positive integer")
        names = self.order.lower().split("-")
        if sorted(names) != sorted(_DIMS):
            raise InputError("layout.order", self.order, "a permutation of tp, cp, ep, dp, pp joined by '-'")
        object.__setattr__(self, "order", "-".join(names))
        if (self.tp * self.dp * self.cp) % (self.ep * self.etp):
            raise InputError("layout.ep", self.ep, f"ep x etp ({self.ep} x {self.etp}) dividing tp x dp x cp "
                                                   f"({self.tp * self.dp * self.cp}): the expert grid tiles each stage")
        # Megatron-core: with PP not last, attention and MoE data-parallel sizes must match.
        if not names[-1] == "pp" and self.pp > 1 and self.expert_dp != self.dp:
            raise InputError("layout.order", self.order, "an order ending in pp when ep changes the data-parallel size")

    @property
    def world(self) -> int:
        return self.tp * self.cp * self.dp * self.pp

    @property
    def expert_dp(self) -> int:
        return self.tp * self.dp * self.cp // (self.ep * self.etp)

    def _sizes(self, expert: bool) -> dict[str, int]:
        if expert:
            return {"tp": self.etp, "cp": 1, "ep": self.ep, "dp": self.expert_dp, "pp": self.pp}
        return {"tp": self.tp, "cp": self.cp, "ep": 1, "dp": self.dp, "pp": self.pp}

    def _grid(self, expert: bool) -> tuple[list[str], list[int]]:
        names = self.order.split("-")
        sizes = self._sizes(expert)
        return names, [sizes[n] for n in names]

    def _decompose(self, rank: int, expert: bool) -> dict[str, int]:
        names, sizes = self._grid(expert)
        out, rest = {}, rank
        for n, s in zip(names, sizes):
            out[n] = rest % s
            rest //= s
        return out

    def coords(self, rank: int) -> RankCoord:
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.world:
            raise InputError("rank", rank, f"an integer in [0, {self.world})")
        dense = self._decompose(rank, expert=False)
        expert = self._decompose(rank, expert=True)
        return RankCoord(rank, dense["tp"], dense["cp"], expert["ep"], dense["dp"], dense["pp"], expert["dp"])

    def groups(self, token: str) -> list[list[int]]:
        """Rank groups for ``token``: a dimension or several joined by '-'.

        Dense grid: any of tp, cp, dp, pp (e.g. "tp", "dp-cp", "tp-pp").
        Expert grid: prefix "expert:" and use tp, ep, dp, pp (e.g. "expert:ep",
        "expert:dp" for expert data parallel, "expert:tp-ep").
        """
        expert = token.startswith("expert:")
        parts = (token[len("expert:"):] if expert else token).lower().split("-")
        allowed = ("tp", "ep", "dp", "pp") if expert else ("tp", "cp", "dp", "pp")
        if not parts or any(p not in allowed for p in parts) or len(set(parts)) != len(parts):
            raise InputError("layout.token", token, "dimensions among " + ", ".join(allowed) + (" after 'expert:'" if expert else ""))
        names, sizes = self._grid(expert)
        return _generate(sizes, [n in parts for n in names])


def layout_from_plan(plan_doc: dict, rank: int = 1, order: str = DEFAULT_ORDER) -> RankLayout:
    """The rank layout of the plan ranked ``rank`` in a ``planner plan --json`` document."""
    from planner.emit.common import load_plan_view  # noqa: PLC0415  (keep layout importable alone)

    p = load_plan_view(plan_doc, rank).parallel
    return RankLayout(tp=p.tp, pp=p.pp, dp=p.dp, cp=p.cp, ep=p.ep, order=order, etp=p.etp)


def rank_coordinates(layout: RankLayout) -> list[RankCoord]:
    """Every global rank's coordinates, indexed by rank."""
    return [layout.coords(r) for r in range(layout.world)]


def groups(layout: RankLayout, dim: str) -> list[list[int]]:
    return layout.groups(dim)


def tp_groups(layout: RankLayout) -> list[list[int]]:
    return layout.groups("tp")


def cp_groups(layout: RankLayout) -> list[list[int]]:
    return layout.groups("cp")


def dp_groups(layout: RankLayout) -> list[list[int]]:
    """Pure data-parallel groups (gradients of dense layers are reduced over ``dp-cp``)."""
    return layout.groups("dp")


def pp_groups(layout: RankLayout) -> list[list[int]]:
    return layout.groups("pp")


def ep_groups(layout: RankLayout) -> list[list[int]]:
    return layout.groups("expert:ep")


def expert_dp_groups(layout: RankLayout) -> list[list[int]]:
    return layout.groups("expert:dp")
