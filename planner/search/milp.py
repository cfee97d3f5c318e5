"""A small mixed-integer linear program, built as arrays and solved by HiGHS (or CBC via PuLP).

The layer-split program (:mod:`planner.search.split`) and the mixed-cluster placement program
(:mod:`planner.search.hetero`) are written once each, as a :class:`Program` (variables with
bounds, cost and integrality; rows ``lo <= sum_j a_j x_j <= hi``), and handed to a backend:

* ``highs``: highspy's array interface (``addVars``/``addRows``), solved to a zero relative MIP
  gap (HiGHS' default 1e-4 may stop short of the optimum) on one thread (tiny programs). The
  core class ``highspy._Highs`` is used: the public ``highspy.Highs`` prints a banner on
  stdout when it first enables its Python callbacks, which would corrupt ``--json`` output.
* ``pulp``: the same rows as a PuLP model on CBC (``PULP_CBC_CMD(msg=False, gapRel=0)``), used
  where highspy is not installed and by the tests that check both backends agree.

Nothing here touches process state: a :class:`Solution` says which solver answered, and the
caller counts its own solves (:class:`SolveStats`).

>>> p = Program()
>>> x = p.var(lo=0, hi=10, cost=-1.0, integer=True)
>>> p.row(-INF, 7.5, [(x, 1.0)])
>>> s = p.solve()
>>> s.ok, s.x[x]
(True, 7.0)
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

__all__ = ["INF", "Program", "Solution", "SolveStats", "highs_available", "BACKENDS"]

INF = float("inf")
BACKENDS = ("highs", "pulp")


def highs_available() -> bool:
    try:
        import highspy  # noqa: F401,PLC0415
    except ImportError:
        return False
    return hasattr(highspy, "_Highs")


@dataclass(frozen=True)
class Solution:
    """``ok``: an integer solution was found (optimal, or the best when the time limit hit);
    ``optimal``: proven optimal; ``x``: the variable values; ``solver``: who answered."""

    ok: bool
    optimal: bool
    x: tuple[float, ...]
    solver: str


@dataclass
class SolveStats:
    """Programs one search handed to a solver, and the solver that took the last one."""

    programs: int = 0
    solver: str = "none"
    ruled_out: int = 0  # programs answered without a solver (no split meets the memory rows)
    # candidates no layer split can fit, never priced: by the memory bound (planner.search.bounds.memory_bound_fn),
    # or as members of a micro-batch/recompute group whose least-memory member fits under no split (plan.GROUP_PRUNE)
    memory_pruned: int = 0
    time_pruned: int = 0  # candidates priced for time only: slower than the K-th best under any split
    notes: list = field(default_factory=list)

    def add(self, sol: Solution) -> None:
        self.programs += 1
        self.solver = sol.solver


class Program:
    """min c^T x  s.t.  lo_r <= A_r x <= hi_r,  l <= x <= u,  x_j integer where asked."""

    def __init__(self) -> None:
        self.lo: list[float] = []
        self.hi: list[float] = []
        self.cost: list[float] = []
        self.integer: list[bool] = []
        self.rows: list[tuple[float, float, list[tuple[int, float]]]] = []

    def var(self, lo: float = -INF, hi: float = INF, cost: float = 0.0, integer: bool = False) -> int:
        self.lo.append(float(lo))
        self.hi.append(float(hi))
        self.cost.append(float(cost))
        self.integer.append(bool(integer))
        return len(self.lo) - 1

    def row(self, lo: float, hi: float, entries: list[tuple[int, float]]) -> None:
        self.rows.append((float(lo), float(hi), [(int(j), float(c)) for j, c in entries]))

    def solve(self, time_limit_s: float | None = None, backend: str | None = None) -> Solution:
        """Solve with ``backend`` (None: highs where highspy is installed, else pulp)."""
        if backend is None:
            backend = "highs" if highs_available() else "pulp"
        if backend == "highs":
            return self._highs(time_limit_s)
        if backend == "pulp":
            return self._pulp(time_limit_s)
        raise ValueError(f"backend {backend!r}: expected one of {BACKENDS}")

    def _highs(self, time_limit_s: float | None) -> Solution:
        import highspy  # noqa: PLC0415  (lazy: only when a program is solved)
        import numpy as np  # noqa: PLC0415

        h = highspy._Highs()  # the core class: no banner on stdout (module docstring)
        h.setOptionValue("output_flag", False)
        h.setOptionValue("threads", 1)
        h.setOptionValue("mip_rel_gap", 0.0)
        h.setOptionValue("time_limit", float(time_limit_s) if time_limit_s else highspy.kHighsInf)
        n = len(self.lo)
        big = highspy.kHighsInf
        clip = lambda a: np.clip(np.array(a, dtype=float), -big, big)  # noqa: E731
        h.addVars(n, clip(self.lo), clip(self.hi))
        h.changeColsCost(n, np.arange(n, dtype=np.int32), np.array(self.cost))
        ints = [j for j, b in enumerate(self.integer) if b]
        if ints:
            h.changeColsIntegrality(len(ints), np.array(ints, dtype=np.int32),
                                    np.full(len(ints), highspy.HighsVarType.kInteger, dtype=np.uint8))
        starts, idx, val = [], [], []
        for _, _, entries in self.rows:
            starts.append(len(idx))
            for j, c in entries:
                idx.append(j)
                val.append(c)
        h.addRows(len(self.rows), clip([r[0] for r in self.rows]), clip([r[1] for r in self.rows]), len(idx),
                  np.array(starts, dtype=np.int32), np.array(idx, dtype=np.int32), np.array(val, dtype=float))
        h.run()
        status = h.getModelStatus()
        optimal = status == highspy.HighsModelStatus.kOptimal
        found = optimal or (status == highspy.HighsModelStatus.kTimeLimit and h.getInfo().primal_solution_status == 2)
        x = tuple(h.getSolution().col_value) if found else ()
        return Solution(found, optimal, x, "highs")

    def _pulp(self, time_limit_s: float | None) -> Solution:
        import pulp  # noqa: PLC0415  (lazy: ~0.2 s to import)

        prob = pulp.LpProblem("program", pulp.LpMinimize)
        new_var = getattr(prob, "add_variable", None)  # PuLP >= 3.3 attaches variables to the model
        mk = new_var if new_var else pulp.LpVariable
        xs = [mk(f"x{j}", lowBound=None if lo == -INF else lo, upBound=None if hi == INF else hi,
                 cat="Integer" if integer else "Continuous")
              for j, (lo, hi, integer) in enumerate(zip(self.lo, self.hi, self.integer))]
        prob += pulp.lpSum(c * xs[j] for j, c in enumerate(self.cost) if c)
        for lo, hi, entries in self.rows:
            expr = pulp.lpSum(c * xs[j] for j, c in entries)
            if lo == hi:
                prob += expr == lo
                continue
            if lo > -INF:
                prob += expr >= lo
            if hi < INF:
                prob += expr <= hi
        with warnings.catch_warnings():  # PuLP 3 deprecates the bundled-CBC class name; the solver is the same
            warnings.simplefilter("ignore", DeprecationWarning)
            solver = pulp.PULP_CBC_CMD(msg=False, gapRel=0.0, timeLimit=time_limit_s)
            status = prob.solve(solver)
        optimal = pulp.LpStatus[status] == "Optimal"
        found = optimal and all(x.value() is not None for x in xs)
        return Solution(found, optimal, tuple(float(x.value()) for x in xs) if found else (), "cbc via PuLP")
