"""``planner check``: read a job in its engine's own format, predict it, say what is wrong with
it and what would help, as edits in the same format.

``check_files(["train.sh"], Overrides(gpus=64))`` -> :class:`planner.check.report.CheckReport`.

Layers: :mod:`~planner.check.bash` (a restricted bash reader), readers per format
(:mod:`~planner.check.megatron`, :mod:`~planner.check.torchtitan`,
:mod:`~planner.check.torchtitan_py`, :mod:`~planner.check.deepspeed`,
:mod:`~planner.check.plan_doc`), :mod:`~planner.check.read` (which reader),
:mod:`~planner.check.findings`, :mod:`~planner.check.changes`, :mod:`~planner.check.edits`,
:mod:`~planner.check.report`.
"""

from __future__ import annotations

import dataclasses

from planner.check.job import CheckedJob, Overrides
from planner.errors import InputError

__all__ = ["check_files", "check_job", "read_job", "Overrides", "CheckedJob"]


def read_job(files: list[str], overrides: Overrides | None = None) -> CheckedJob:
    from planner.check.read import read_job as _read  # noqa: PLC0415

    return _read(files, overrides)


def check_job(cj: CheckedJob, top: int = 5, time_limit_s: float | None = None, edits: bool = True):
    """Predict ``cj``, list its findings and its ``top`` best changes (with edits)."""
    from planner.check.changes import best_changes  # noqa: PLC0415
    from planner.check.findings import findings  # noqa: PLC0415
    from planner.check.report import CheckReport  # noqa: PLC0415
    from planner.check.job import estimate_as_written  # noqa: PLC0415

    try:
        e = estimate_as_written(cj)
    except InputError as exc:  # name the file and line the refused value was read from
        src = cj.sources.get(exc.field)
        if src is not None and src[1].kind == "file":
            raise InputError(f"{src[1].where} ({exc.field})", exc.value, exc.expected) from None
        raise
    # With pipeline flushes the changes are measured from the same configuration in one pipeline
    # run per step (the pipeline-flushes finding, which reports it): their gains are the change's
    # own, and their edits write the whole local batch.
    one = dataclasses.replace(cj, flushes=1)
    base = estimate_as_written(one) if cj.flushes > 1 else None
    found = findings(cj, e, base)
    if edits and cj.editor is not None:
        found = [_with_edit(cj, f) for f in found]
    if time_limit_s is None:
        from planner.search.plan import TIME_LIMIT_S  # noqa: PLC0415  (the CLI's --time-limit)

        time_limit_s = TIME_LIMIT_S.get()
    chs = best_changes(one, base or e, k=top, time_limit_s=time_limit_s) if top > 0 else []
    eds = []
    if edits and cj.editor is not None:
        from planner.check.edits import edit_for  # noqa: PLC0415

        eds = [edit_for(one, ch.parallel) for ch in chs]
    return CheckReport(cj, e, found, chs, eds, base)


def _with_edit(cj: CheckedJob, f):
    """The finding with the edit of the job's files that applies the option it names, in the
    files' own words (verified by reading them back), where it names one."""
    from planner.check.edits import edit_for, option_edit  # noqa: PLC0415

    if f.evidence.get("option") == "cross_entropy_loss_fusion":  # a job setting: Megatron-LM's flag
        # the fusion with its native implementation (a --cross-entropy-fusion-impl te goes: Megatron-LM refuses it)
        return dataclasses.replace(f, edit=option_edit(cj, {"--cross-entropy-loss-fusion": True, "--cross-entropy-fusion-impl": None},
                                                       {"cross_entropy": "native"}))
    if f.evidence.get("one_pipeline"):  # the same configuration in one pipeline run per step
        return dataclasses.replace(f, edit=edit_for(dataclasses.replace(cj, flushes=1), cj.parallel))
    if f.evidence.get("parallel"):  # an engine switch of the parallel configuration
        return dataclasses.replace(f, edit=edit_for(cj, cj.parallel.replace(**f.evidence["parallel"])))
    return f


def check_files(files: list[str], overrides: Overrides | None = None, top: int = 5, time_limit_s: float | None = None):
    return check_job(read_job(files, overrides), top, time_limit_s)
