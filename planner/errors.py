"""The one exception type for bad user input.

Everything that can fail on user input raises :class:`InputError` with the field,
the offending value and what was expected; the CLI turns it into one line on stderr
and exit code 2 (see README, "Exit codes").
"""

from __future__ import annotations

__all__ = ["InputError", "NoFeasiblePlan", "SolverFailure", "suggest", "ALIASES"]

import difflib


class InputError(ValueError):
    """Bad input: names the field, the value and what was expected.

    >>> str(InputError("parallel.tp", 3, "a divisor of the GPU count (8)"))
    'parallel.tp: got 3, expected a divisor of the GPU count (8)'
    """

    def __init__(self, field: str, value: object, expected: str, flag: str | None = None):
        self.field = field
        self.value = value
        self.expected = expected
        self.flag = flag  # the command-line flag that carries the field, where the CLI names it so (``--model``)
        super().__init__(f"{field}: got {value!r}, expected {expected}")

    def as_flag(self) -> "InputError":
        """The same error naming its command-line flag (the CLI's wording), or itself."""
        return self if self.flag is None else InputError(self.flag, self.value, self.expected)


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


# Names users bring from other tools (Megatron-LM, DeepSpeed, torchtitan, NeMo flags and
# long forms), mapped to the planner's own: the closest meaning comes before the closest spelling.
ALIASES: dict[str, str] = {
    "tensor-parallel": "tp", "tensor-model-parallel-size": "tp", "tensor-parallel-size": "tp", "tp-size": "tp",
    "tensor-parallel-degree": "tp", "tp-degree": "tp", "mp": "tp", "model-parallel": "tp",
    "pipeline-parallel": "pp", "pipeline-model-parallel-size": "pp", "pipeline-parallel-size": "pp", "pp-size": "pp",
    "pipeline-parallel-degree": "pp", "pp-degree": "pp", "num-stages": "pp", "pipeline-stages": "pp",
    "data-parallel": "dp", "data-parallel-size": "dp", "data-parallel-degree": "dp", "dp-size": "dp",
    "data-parallel-replicate-degree": "dp", "data-parallel-shard-degree": "dp",
    "context-parallel": "cp", "context-parallel-size": "cp", "context-parallel-degree": "cp", "cp-size": "cp",
    "expert-parallel": "ep", "expert-model-parallel-size": "ep", "expert-parallel-size": "ep",
    "expert-parallel-degree": "ep", "ep-size": "ep",
    "virtual-pipeline": "vpp", "virtual-pipeline-model-parallel-size": "vpp", "num-layers-per-virtual-pipeline-stage": "vpp",
    "interleave": "vpp", "virtual-stages": "vpp",
    "micro-batch": "micro-batch-size", "microbatch-size": "micro-batch-size", "mbs": "micro-batch-size",
    "local-batch-size": "micro-batch-size", "train-micro-batch-size-per-gpu": "micro-batch-size",
    "global-batch": "global-batch-size", "gbs": "global-batch-size", "batch-size": "global-batch-size",
    "train-batch-size": "global-batch-size", "seq-length": "seq-len", "sequence-length": "seq-len",
    "max-seq-len": "seq-len", "seq": "seq-len", "num-gpus": "gpus", "world-size": "gpus", "nproc": "gpus",
    "ngpus": "gpus", "gpu-count": "gpus", "nnodes": "gpus", "gpu-type": "gpu", "device": "gpu",
    "zero-stage": "zero", "zero-optimization": "zero", "activation-checkpointing": "recompute",
    "recompute-granularity": "recompute", "recompute-activations": "recompute", "gradient-checkpointing": "recompute",
    "ac": "recompute", "sp": "sequence-parallel", "tokens-per-second": "tokens-per-s", "ckpt-bandwidth": "ckpt-write-gbs",
}


def _tokens(name: str) -> list[str]:
    return [t for t in name.replace("_", "-").lower().split("-") if t]


def suggest(name: str, choices, aliases: dict[str, str] | None = None) -> str:
    """'did you mean a, b?' for the closest of ``choices``, or ''.

    Closest meaning first: an alias (``tensor-parallel`` -> ``tp``, :data:`ALIASES` or the
    ``aliases`` given), then the same family (choices that start with ``name``, or share its
    leading word: ``h100`` -> the H100 presets before ``gb200``), then a substring, and only
    then spelling (difflib edit ratio). Leading dashes are kept on the answer as the choices
    spell them.
    """
    choices = [str(c) for c in choices]
    bare = {c.lstrip("-").lower().replace("_", "-"): c for c in choices}  # file keys (global_batch_size) as flags are spelt
    key = name.lstrip("-").lower().replace("_", "-")
    key = key.split("=", 1)[0]
    table = {**ALIASES, **(aliases or {})}
    for k in (key, key.removeprefix("no-")):
        target = table.get(k)
        if target is not None and target.replace("_", "-") in bare:
            return f"did you mean {bare[target.replace('_', '-')]}?"
    close = [c for b, c in bare.items() if b.startswith(key)] if key else []
    if not close and _tokens(key):
        head = _tokens(key)[0]
        close = [c for b, c in bare.items() if _tokens(b) and _tokens(b)[0] == head]
    if close:
        close = sorted(close, key=lambda c: (-difflib.SequenceMatcher(None, key, c.lstrip("-").lower()).ratio(), c))[:3]
    if not close:
        close = [c for b, c in bare.items() if key and key in b][:3]
    if not close:
        hits = difflib.get_close_matches(key, list(bare), n=3, cutoff=0.4)
        close = [bare[h] for h in hits]
    return ("did you mean " + ", ".join(close) + "?") if close else ""
