"""The library entry points: ``emit_files(plan_doc, engine, rank)`` -> {file name: content},
plus the ``plan_summary.txt`` sidecar every bundle carries (provenance, predictions, the
rank layout and notes; the place for what a format cannot hold as comments)."""

from __future__ import annotations

from planner.emit import deepspeed as ds
from planner.emit import megatron as mg
from planner.emit import slurm as sl
from planner.emit import torchtitan as tt
from planner.emit.common import PlanView, fit_problem, load_plan_view, provenance_lines
from planner.emit.layout import RankLayout
from planner.errors import InputError

__all__ = ["ENGINES", "SUMMARY", "emit_bundle", "emit_files"]

ENGINES = ("megatron", "deepspeed", "torchtitan", "slurm", "all")
SUMMARY = "plan_summary.txt"
_LAYOUT_ROWS = 256


def _layout_lines(v: PlanView) -> list[str]:
    p = v.parallel
    lay = RankLayout(tp=p.tp, pp=p.pp, dp=p.dp, cp=p.cp, ep=p.ep, etp=p.etp)
    out = [
        "Rank layout (Megatron-core order tp-cp-ep-dp-pp, tp fastest; rank = node x gpus_per_node + local rank).",
    ]
    etp = getattr(p, "etp", None)
    if p.ep > 1 and etp not in (None, p.tp):
        out.append(f"Expert layers: ETP = {etp} (not tp), so the expert groups below (ETP = tp) do not apply; see Megatron's "
                   "--expert-tensor-parallel-size.")
    else:
        out.append("Expert layers: ETP = tp, EP carved from the dp x cp ranks of each stage (see planner/emit/layout.py).")
    for dim, token in (("tp", "tp"), ("cp", "cp"), ("dp", "dp"), ("pp", "pp"), ("ep", "expert:ep")):
        g = lay.groups(token)
        out.append(f"  {dim} groups ({len(g)} x {len(g[0])}): first {g[0]}" + (f", last {g[-1]}" if len(g) > 1 else ""))
    if p.tp * p.cp > v.gpus_per_node:
        out.append(f"  note: tp x cp = {p.tp * p.cp} spans more than one node ({v.gpus_per_node} GPUs).")
    if lay.world <= _LAYOUT_ROWS:
        out.append("  rank: node/local -> tp cp ep dp pp")
        for c in (lay.coords(r) for r in range(lay.world)):
            node, local = divmod(c.rank, v.gpus_per_node)
            out.append(f"  {c.rank:5d}: {node:3d}/{local:<3d} -> {c.tp} {c.cp} {c.ep} {c.dp} {c.pp}")
    else:
        out.append(f"  ({lay.world} ranks: per-rank table omitted; use planner.emit.layout.rank_coordinates)")
    return out


def _summary(v: PlanView, engine: str, files: dict[str, str], notes: list[str], skipped: dict[str, str]) -> str:
    lines = provenance_lines(v, f"engine '{engine}'", "see each file for its target version")
    lines += ["", "Files:"] + [f"  {name}" for name in sorted(files)] + [f"  {SUMMARY}"]
    if ds.DS_CONFIG in files:
        lines.append(f"  ({ds.DS_CONFIG} carries the provenance in a top-level \"_planner\" key, which "
                     "DeepSpeed's config parser ignores; JSON has no comments.)")
    if skipped:
        lines += ["", "Engines that cannot express this plan (skipped):"]
        lines += [f"  {eng}: {why}" for eng, why in skipped.items()]
    if notes:
        lines += ["", "Notes:"] + [f"  - {n}" for n in notes]
    lines += [""] + _layout_lines(v)
    return "\n".join(lines) + "\n"


def _one(v: PlanView, engine: str, slurm_engine: str) -> tuple[dict[str, str], list[str]]:
    if engine == "megatron":
        return mg.megatron_files(v), mg.megatron_notes(v)
    if engine == "deepspeed":
        return ds.deepspeed_files(v), ds.deepspeed_notes(v)
    if engine == "torchtitan":
        return tt.torchtitan_files(v), tt.torchtitan_notes(v)
    if engine == "slurm":
        notes = {"megatron": mg.megatron_notes, "deepspeed": ds.deepspeed_notes, "torchtitan": tt.torchtitan_notes}
        if slurm_engine not in notes:
            raise InputError("slurm_engine", slurm_engine, "one of " + ", ".join(sl.SLURM_ENGINES))
        return sl.slurm_files(v, slurm_engine), notes[slurm_engine](v)
    raise InputError("engine", engine, "one of " + ", ".join(ENGINES))


def _target(v, eng: str) -> str:
    """The engine profile the ``eng`` files run (planner.emit.deepspeed.deepspeed_engine for DeepSpeed)."""
    if eng == "deepspeed":
        from planner.emit.deepspeed import deepspeed_engine  # noqa: PLC0415

        return deepspeed_engine(v)
    from planner.emit.megatron import MEGATRON_ENGINE  # noqa: PLC0415
    from planner.emit.torchtitan import TITAN_ENGINE  # noqa: PLC0415

    return {"megatron": MEGATRON_ENGINE, "torchtitan": TITAN_ENGINE}[eng]


def slurm_engine_of(v: PlanView) -> str:
    """The launcher family an sbatch script starts for the plan's own engine: torchtitan's
    ``run_train.sh`` for torchtitan plans, DeepSpeed's for DeepSpeed and Megatron-DeepSpeed ones,
    Megatron-LM's torchrun for the rest."""
    name = v.engine.name if v.engine is not None else ""
    return "torchtitan" if name == "torchtitan" else "deepspeed" if "deepspeed" in name else "megatron"


def emit_bundle(plan_doc: dict, engine: str, rank: int = 1, slurm_engine: str | None = None) -> tuple[dict[str, str], dict[str, str]]:
    """(files, skipped). ``engine="all"`` emits every engine that can express the plan (and an
    sbatch script for each) and reports the others in ``skipped`` (engine -> reason); it fails
    only when none can. A single engine that cannot express the plan raises InputError.
    ``slurm_engine`` None: the plan's own engine's launcher (:func:`slurm_engine_of`)."""
    if engine not in ENGINES:
        raise InputError("engine", engine, "one of " + ", ".join(ENGINES))
    v = load_plan_view(plan_doc, rank)
    slurm_engine = slurm_engine or slurm_engine_of(v)
    files: dict[str, str] = {}
    notes: list[str] = []
    skipped: dict[str, str] = {}
    if engine != "all":
        files, notes = _one(v, engine, slurm_engine)
    else:
        for eng in sl.SLURM_ENGINES:
            try:
                f, n = _one(v, eng, slurm_engine)
                f.update(sl.slurm_files(v, eng))
                if (why := fit_problem(v, _target(v, eng))) is not None:
                    raise InputError(eng, "a plan that does not fit", why)
            except InputError as exc:
                skipped[eng] = str(exc)
                if eng == "deepspeed":
                    from planner.emit.deepspeed import deepspeed_engine  # noqa: PLC0415

                    ds = deepspeed_engine(v)  # megatron-deepspeed for a plan of another engine with tp > 1
                    if ds != "deepspeed" and (v.engine is None or v.engine.name != ds):
                        skipped[eng] += f" (the DeepSpeed files of this plan run {ds}: tensor parallelism)"
                continue
            files.update(f)
            notes += [f"{eng}: {x}" for x in n]
        if not files:
            raise InputError("engine", "all", "a plan at least one engine can express: " + "; ".join(
                f"{k}: {w}" for k, w in skipped.items()))
    files[SUMMARY] = _summary(v, engine, files, notes, skipped)
    return files, skipped


def emit_files(plan_doc: dict, engine: str, rank: int = 1, slurm_engine: str | None = None) -> dict[str, str]:
    """File name -> content for ``engine`` in megatron, deepspeed, torchtitan, slurm, all."""
    return emit_bundle(plan_doc, engine, rank, slurm_engine)[0]
