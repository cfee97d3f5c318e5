"""The one exception type for bad user input.

Everything that can fail on user input raises :class:`InputError` with the field,
the offending value and what was expected; the CLI turns it into one line on stderr
and exit code 2 (see README, "Exit codes").
"""

from __future__ import annotations

__all__ = ["InputError", "NoFeasiblePlan", "SolverFailure", "suggest"]

import difflib


class InputError(ValueError):
    """Bad input: names the field, the value and what was expected.

    >>> str(InputError("parallel.tp", 3, "a divisor of the GPU count (8)"))
    'parallel.tp: got 3, expected a divisor of the GPU count (8)'
    """

    def __init__(self, field: str, value: object, expected: str):
        self.field = field
        self.value = value
        self.expected = expected
        super().__init__(f"{field}: got {value!r}, expected {expected}")


class NoFeasiblePlan(RuntimeError):
    """No configuration fits; carries the nearest miss and what would make it fit (exit 1).

    >>> import planner
    >>> try:
    ...     planner.plan(planner.load_model("llama3.1-405b"), planner.make_cluster("h100-sxm5-80gb", 8), planner.Job(8192, 8))
    ... except planner.NoFeasiblePlan as exc:
    ...     print(exc.nearest.pp >= 1, len(exc.hints) > 0)
    True True
    """

    def __init__(self, message: str, nearest: object | None = None, hints: list[str] | None = None):
        self.nearest = nearest
        self.hints = list(hints or [])
        super().__init__(message)


class SolverFailure(RuntimeError):
    """The solver failed or hit its time limit (exit 3); carries the best plan found so far.

    >>> import planner
    >>> try:
    ...     planner.plan(planner.load_model("llama3.1-70b"), planner.make_cluster("h100-sxm5-80gb", 64),
    ...                  planner.Job(8192, 256), time_limit_s=1e-9)
    ... except planner.SolverFailure as exc:
    ...     print(type(exc.best).__name__)
    PlanResult
    """

    def __init__(self, message: str, best: object | None = None):
        self.best = best
        super().__init__(message)


def suggest(name: str, choices) -> str:
    """'did you mean a, b?' for the closest of ``choices`` (by spelling, then by substring), or ''."""
    choices = [str(c) for c in choices]
    close = difflib.get_close_matches(name.lower(), choices, n=3, cutoff=0.4)
    if not close:
        close = [c for c in choices if name.lower() in c][:3]
    return ("did you mean " + ", ".join(close) + "?") if close else ""
