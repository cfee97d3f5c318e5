"""The one exception type for bad user input.

Everything that can fail on user input raises :class:`InputError` with the field,
the offending value and what was expected; the CLI turns it into one line on stderr
and exit code 2 (see README, "Exit codes").
"""

from __future__ import annotations

__all__ = ["InputError", "NoFeasiblePlan", "SolverFailure"]


class InputError(ValueError):
    """Bad input: names the field, the value and what was expected."""

    def __init__(self, field: str, value: object, expected: str):
        self.field = field
        self.value = value
        self.expected = expected
        super().__init__(f"{field}: got {value!r}, expected {expected}")


class NoFeasiblePlan(RuntimeError):
    """No configuration fits; carries the nearest miss and what would make it fit (exit 1)."""

    def __init__(self, message: str, nearest: object | None = None, hints: list[str] | None = None):
        self.nearest = nearest
        self.hints = list(hints or [])
        super().__init__(message)


class SolverFailure(RuntimeError):
    """The solver failed or hit its time limit (exit 3); carries the best plan found so far."""

    def __init__(self, message: str, best: object | None = None):
        self.best = best
        super().__init__(message)
