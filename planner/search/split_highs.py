"""The layer-split program of :mod:`planner.search.split`, handed to HiGHS as arrays.

Same variables, objective and rows as the PuLP formulation in ``split.optimal_split`` (see
that module's docstring), built with numpy and passed through highspy's array interface: PuLP
builds each row from Python expression objects, which costs more than HiGHS takes to solve
these small programs. Two exact reformulations:

* each stage's memory row ``mem_i(n_i) <= capacity`` is affine in the integer ``k_i``, so it
  becomes a bound on ``k_i`` (floor/ceil of the same inequality: ``split.chunk_bounds``, which
  the caller has already computed for its feasibility precheck);
* the constant terms of the objective (stage intercepts) are dropped; they do not move the
  optimum.

Returns the chunk counts ``k_i`` or None (infeasible, or stopped by the time limit with no
integer solution). ``None`` from :func:`available` means: use the PuLP path.
"""

from __future__ import annotations

import numpy as np

from planner.search.split import StageAffine, _quiet, dp_branches

__all__ = ["available", "solve_split"]

_H: list = []


def available() -> bool:
    if not _H:
        try:
            import highspy  # noqa: PLC0415

            with _quiet():  # the constructor prints a banner on stdout
                h = highspy.Highs()
            h.setOptionValue("output_flag", False)
            h.setOptionValue("threads", 1)  # tiny programs: one thread avoids contention
            h.setOptionValue("mip_rel_gap", 0.0)  # exact optimum (the default 1e-4 may stop short)
            _H.append((h, highspy))
        except Exception:  # noqa: BLE001 - no usable highspy: the PuLP path is used
            _H.append(None)
    return _H[0] is not None


def solve_split(aff: StageAffine, kb: list[tuple[int, int]], v: int, layers: int, m: int, eta: float,
                overlap: bool, symmetric: list[int], time_limit_s: float | None = None) -> tuple[int, ...] | None:
    """Chunk counts (k_0 .. k_{pp-1}) of the optimal split; ``kb`` the stages' chunk bounds from
    their memory rows (:func:`planner.search.split.chunk_bounds`), ``symmetric`` the i with the
    row k_i <= k_{i+1} (the PuLP path's symmetry breaking)."""
    h, highspy = _H[0]
    pp = len(kb)
    ts = 1e3  # milliseconds, as the PuLP path: coefficients near 1
    inf = highspy.kHighsInf
    T, D, O = pp, pp + 1, pp + 2  # noqa: E741
    n = pp + 3
    lower = np.array([lo for lo, _ in kb] + [-inf, 0.0, 0.0])
    upper = np.array([hi for _, hi in kb] + [inf, inf, inf])
    cost = np.array([ts * a for a, _ in aff.time] + [m - 1.0 / v, 1.0, 1.0])
    rows_lo, rows_hi, starts, idx, val = [], [], [], [], []

    def row(lo: float, hi: float, entries: list[tuple[int, float]]) -> None:
        starts.append(len(idx))
        for j, c in entries:
            idx.append(j)
            val.append(c)
        rows_lo.append(lo)
        rows_hi.append(hi)

    row(layers / v, layers / v, [(i, 1.0) for i in range(pp)])  # sum_i k_i = L / v
    for i in symmetric:
        row(-inf, 0.0, [(i, 1.0), (i + 1, -1.0)])
    for i in range(pp):
        a, b = aff.time[i]
        row(ts * b, inf, [(T, 1.0), (i, -ts * a * v)])  # T >= t_i
        for sa, sb in dp_branches(aff.dp[i], ts, eta, overlap):
            row(sb, inf, [(D, 1.0), (i, -sa * v)])  # D >= branch
        oa, ob = aff.opt[i]
        row(ts * ob, inf, [(O, 1.0), (i, -ts * oa * v)])  # O >= opt_i
    h.clearModel()
    h.addVars(n, lower, upper)
    h.changeColsCost(n, np.arange(n, dtype=np.int32), cost)
    h.changeColsIntegrality(pp, np.arange(pp, dtype=np.int32), np.full(pp, highspy.HighsVarType.kInteger, dtype=np.uint8))
    h.addRows(len(rows_lo), np.array(rows_lo), np.array(rows_hi), len(idx), np.array(starts, dtype=np.int32),
              np.array(idx, dtype=np.int32), np.array(val))
    h.setOptionValue("time_limit", float(time_limit_s) if time_limit_s else inf)
    h.run()
    status = h.getModelStatus()
    if status != highspy.HighsModelStatus.kOptimal and not (
            status == highspy.HighsModelStatus.kTimeLimit and h.getInfo().primal_solution_status == 2):
        return None
    x = h.getSolution().col_value
    return tuple(int(round(x[i])) for i in range(pp))
