"""Layer splits enumerated by brute force, the reference the search's split program is held to
(test_search_exact, test_split_schedules, test_bounds)."""

from __future__ import annotations

import itertools

from planner.engines import least_layers
from planner.search.split import split_unit


def unit_splits(layers: int, pp: int, unit: int):
    """Every split of ``layers // unit`` units into ``pp`` non-empty parts, in layers."""
    k = layers // unit
    for cuts in itertools.combinations(range(1, k), pp - 1):
        b = (0, *cuts, k)
        yield tuple(unit * (y - x) for x, y in zip(b, b[1:]))


def engine_splits(layers: int, pp: int, v: int, engine):
    """Every split the engine accepts with ``v`` chunks a stage (planner.engines.least_layers),
    in its split unit (planner.search.split.split_unit); none when the unit does not divide the layers."""
    u = split_unit(v, engine)
    if layers % u:
        return
    for parts in unit_splits(layers, pp, u):
        if all(n >= least_layers(i, pp, v, engine) for i, n in enumerate(parts)):
            yield parts
