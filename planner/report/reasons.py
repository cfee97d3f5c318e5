"""Why a plan ranks where it does, in words: what bounds each plan's step, and what the top
plan trades against the runner-up.

Both read only the priced :class:`planner.cost.result.Estimate` (its ``time_breakdown_s``,
whose exposed terms add up to the step time, and its ``comm`` list for the link each kind of
communication crosses); nothing here prices anything.

* :func:`bound_label`: the largest exposed term with its share of the step, ``compute 71%``,
  ``bubble 18%``, ``dp ib 9%`` (communication on the scale-out network names it; on the
  NVLink/NVSwitch domain only the kind is named).
* :func:`recommendation`: one line for plan 1 against plan 2: how much faster, the knobs
  that differ, the term that saves the most time (and the one that costs the most, if any),
  and the memory difference. Plans closer than :data:`TIE_PCT` are said to tie: the cost
  model cannot rank them (its error on published runs is several percent, README "How good is
  the cost model").
"""

from __future__ import annotations

from planner.units import GIB, fmt_time, gib, plural

__all__ = ["TERMS", "TIE_PCT", "step_terms", "bound_label", "knob_changes", "recommendation"]

# (short name for the bound column, breakdown keys summed, comm kind for the link, phrase)
TERMS: tuple[tuple[str, tuple[str, ...], str | None, str], ...] = (
    ("compute", ("compute_s",), None, "compute"),
    ("recompute", ("recompute_s",), None, "recompute"),
    ("tp", ("tp_comm_exposed_s",), "tp", "exposed TP comm"),
    ("cp", ("cp_comm_exposed_s",), "cp", "exposed CP comm"),
    ("ep", ("ep_comm_exposed_s",), "ep", "exposed expert all-to-all"),
    ("pp", ("pp_comm_exposed_s",), "pp", "pipeline send/recv"),
    ("bubble", ("bubble_s",), None, "pipeline bubble"),
    ("dp", ("dp_comm_exposed_s",), "dp", "exposed DP/ZeRO comm"),
    ("host", ("host_exposed_s",), None, "exposed host (kernel launch) time"),
    ("optimizer", ("optimizer_s",), None, "optimizer step"),
    ("emb sync", ("embedding_sync_s",), None, "embedding sync"),
    ("overhead", ("overhead_s",), None, "step overhead"),
)
TIE_PCT = 0.1  # plans closer than this (% of step time) tie
_SCALE_UP = ("nvswitch", "nvlink", "xgmi", "pcie")
_NET_SHORT = {"infiniband": "ib", "ethernet": "eth", "omnipath": "opa", "roce": "roce"}


def _net(link: str) -> str:
    """``infiniband:network`` -> ``ib``, ``infiniband:spine`` -> ``ib:spine``; '' on the scale-up domain."""
    kind, _, tier = link.partition(":")
    if kind in _SCALE_UP or not kind:
        return ""
    kind = _NET_SHORT.get(kind, kind)
    return kind if tier in ("", "network") else f"{kind}:{tier}"


def step_terms(e) -> list[tuple[str, float, str]]:
    """(short name, exposed seconds, phrase) of every term of the step, largest first;
    compute and recompute are one ``compute`` term, as the cost model bounds them."""
    links = {c["kind"]: c.get("link", "") for c in (e.comm or [])}
    b = e.time_breakdown_s
    out = []
    for name, keys, kind, phrase in TERMS:
        t = sum(b.get(k, 0.0) for k in keys)
        if name == "recompute":
            continue
        if name == "compute":
            t += b.get("recompute_s", 0.0)
        net = _net(links.get(kind, "")) if kind else ""
        out.append((f"{name} {net}" if net else name, t, phrase))
    known = {k for _, keys, _, _ in TERMS for k in keys}
    for k, t in b.items():  # a term the cost model added later still counts, under its own name
        if k not in known:
            name = k.removesuffix("_s").replace("_exposed", "").replace("_", " ")
            out.append((name, t, name))
    return sorted(out, key=lambda x: -x[1])


def _by_term(e) -> dict:
    """Term name without its link (``dp``, not ``dp ib``) -> (exposed seconds, phrase): two plans
    whose data-parallel traffic crosses different links still compare it."""
    names = {n for n, _, _, _ in TERMS}
    out: dict = {}
    for name, t, phrase in step_terms(e):
        head = name.split(" ", 1)[0]
        key = head if head in names else name
        old = out.get(key, (0.0, phrase))
        out[key] = (old[0] + t, phrase)
    return out


def bound_label(e) -> str:
    """The largest exposed term and its share of the step: ``compute 71%``, ``dp ib 9%``;
    ``memory!`` when the plan does not fit."""
    if not e.fits:
        return "memory!"
    name, t, _ = step_terms(e)[0]
    share = 100 * t / e.step_time_s if e.step_time_s > 0 else 0.0
    return f"{name} {share:.0f}%"


def knob_changes(a, b, limit: int = 3) -> list[str]:
    """What differs between two resolved configurations, as ``tp 4 vs 8`` (a's value first)."""
    out = []
    for field, label in (("tp", "tp"), ("pp", "pp"), ("dp", "dp"), ("cp", "cp"), ("ep", "ep"), ("vpp", "vpp"),
                         ("schedule", "schedule"), ("micro_batch_size", "mb"), ("recompute", "recompute"), ("zero", "ZeRO"),
                         ("sequence_parallel", "sp")):
        x, y = getattr(a, field, None), getattr(b, field, None)
        if x != y:
            if isinstance(x, bool) or isinstance(y, bool):
                x, y = ("on" if x else "off"), ("on" if y else "off")
            out.append(f"{label} {x} vs {y}")
    if not out and tuple(a.layers_per_stage or ()) != tuple(b.layers_per_stage or ()):
        out.append("layer split " + "/".join(map(str, a.layers_per_stage)) + " vs " + "/".join(map(str, b.layers_per_stage)))
    return out[:limit]


def _memory(e1, e2) -> str:
    d = (e1.memory_peak_bytes - e2.memory_peak_bytes) / GIB
    if abs(d) < 0.05:
        return "the same peak memory"
    return f"{abs(d):.1f} GiB {'more' if d > 0 else 'less'} memory"


def recommendation(plans: list) -> str:
    """One line: why plan 1 comes first (against plan 2), or that it is the only plan."""
    if not plans:
        return ""
    p1 = plans[0]
    if len(plans) == 1:
        return f"recommended: #1, the only plan asked for or found ({fmt_time(p1.estimate.step_time_s)} per step, bound by {bound_label(p1.estimate)})"
    p2 = plans[1]
    e1, e2 = p1.estimate, p2.estimate
    pct = 100 * (e2.step_time_s - e1.step_time_s) / e2.step_time_s if e2.step_time_s > 0 else 0.0
    knobs = knob_changes(p1.parallel, p2.parallel)
    if getattr(p1.estimate, "engine", None) != getattr(p2.estimate, "engine", None):  # --engine auto
        knobs = [f"{p1.estimate.engine} vs {p2.estimate.engine}", *knobs][:3]
    t1, t2 = _by_term(e1), _by_term(e2)
    deltas = sorted(((t2.get(k, (0.0, ""))[0] - t1[k][0], t1[k][1]) for k in t1), key=lambda x: x[0])
    gain, gain_phrase = deltas[-1]
    cost, cost_phrase = deltas[0]
    parts = []
    if gain > 0:
        parts.append(f"{'a smaller' if gain_phrase == 'pipeline bubble' else 'less'} {gain_phrase} "
                     f"(-{fmt_time(gain)})")
    if cost < 0 and -cost > 0.1 * max(gain, 1e-12):
        parts.append(f"{'a larger' if cost_phrase == 'pipeline bubble' else 'more'} {cost_phrase} (+{fmt_time(-cost)})")
    parts.append(_memory(e1, e2))
    if pct < TIE_PCT:
        head = f"recommended: #1 ties with #2 ({', '.join([*knobs, f'{pct:.2f}% apart'])})"
    else:
        head = f"recommended: #1 is {pct:.1f}% faster than #2" + (f" ({', '.join(knobs)})" if knobs else "")
    line = f"{head}: {', '.join(parts)}"
    near = [p for p in plans if p.estimate.step_time_s <= e1.step_time_s * 1.01]
    if len(near) > 1:
        roomy = min(near, key=lambda p: (p.estimate.memory_peak_bytes, p.rank))
        line += (f"; {plural(len(near) - 1, 'other plan')} within 1% of #1, closer than the cost model can rank:"
                 f" pick among them by memory headroom (#{roomy.rank} needs the least, {gib(roomy.estimate.memory_peak_bytes)} GiB)")
    return line
