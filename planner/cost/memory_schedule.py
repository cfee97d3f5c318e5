"""The moments at which a pipeline rank can reach its memory peak, from its schedule.

A rank runs its forward (F), backward (B) and, under Zero Bubble schedules, weight-gradient (W)
passes in the order its schedule gives; each micro-batch's activations on a model chunk are
held from its F to its B (the part a W pass needs, to its W). :func:`moments` walks that order
and returns, for every moment that could be the peak, how many micro-batches each chunk holds
(``held``), how many wait for their W (``pending``) and which chunks have run a backward already
(``done``: gradients an engine allocates at a chunk's first backward exist from then on). The
memory at a moment is linear in these counts with non-negative coefficients, so a moment whose
counts are all at most another's (same kind and chunk) is never the peak and is dropped.

Orders (each cited where it is built):

* ``1f1b``: rank r runs min(m, p - r) forwards, then one backward and one forward alternately
  (Narayanan et al. 2021 sec. 2.2.1; Megatron schedules.py forward_backward_pipelining_without_
  interleaving; torch.distributed.pipelining Schedule1F1B).
* ``interleaved``: (p - r - 1) 2 + (v - 1) p warm-up chunk forwards, then 1F1B; the k-th forward
  runs chunk (k mod p v) div p, the k-th backward chunk v - 1 - (k mod p v) div p (Megatron
  forward_backward_pipelining_with_interleaving; torch ScheduleInterleaved1F1B, same counts when
  p divides m).
* ``zb-h1`` / ``zb-h2``: the Zero Bubble schedules with 1F1B's and twice 1F1B's activation memory
  (Qi et al. 2024, ZB-H1/ZB-H2 and the automatic ZB-1p/ZB-2p whose limit is x p M_F,
  zb_schedules.py ``max_mem``): x p - r warm-up forwards, then B, F, and W passes deferred so that
  rank r keeps r of them pending; rank r then holds x p - r micro-batches and r pending W's, the
  scheduler's own peak p - r (1 - M_W/M_F) for ZB-1p.
* ``zb-v``: ZB-V's V-shaped placement holds p micro-batches on every rank (Qi et al. 2024,
  "Pipeline Parallelism with Controllable Memory": the same peak as 1F1B's first stage).
* ``dualpipe``: p + 1 micro-batches (DeepSeek-V3 tech report, Table 2).
* ``gpipe``: every forward before any backward (Huang et al. 2019).

Steady state repeats: after ~2p micro-batches every count pattern has occurred, so at most 3 p
micro-batches are walked (the peak of a longer step is the same).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

__all__ = ["Moment", "moments", "rank_ops", "steady_microbatches"]


@dataclass(frozen=True)
class Moment:
    """One candidate peak: at the end of a forward (``kind`` "F") or at a backward (``"B"``, of
    ``chunk``), with the counts described in the module doc; ``index``/``mb`` say where in the
    step it first happens (``warmup``: the rank's warm-up forward count)."""

    kind: str
    chunk: int
    mb: int
    index: int
    held: tuple[int, ...]
    pending: tuple[int, ...]
    done: tuple[int, ...]
    warmup: int
    step: int = 0

    def describe(self, m: int, v: int, pp: int = 2) -> str:
        where = f" of chunk {self.chunk}" if v > 1 else ""
        if self.kind == "F":
            tail = " (the last warm-up forward)" if pp > 1 and self.index == self.warmup - 1 and self.warmup < m * v else ""
            return f"forward of micro-batch {self.mb + 1}{where}{tail}, {sum(self.held)} chunk-micro-batches held"
        return f"backward of micro-batch {self.mb + 1}{where}, {sum(self.held)} chunk-micro-batches held"


def steady_microbatches(schedule: str, pp: int, m: int) -> int:
    """Micro-batches walked: enough for the schedule's steady state (module doc)."""
    if schedule == "gpipe":
        return m
    if pp <= 1:
        return min(m, 2)
    cap = 3 * pp
    return m if m <= cap else cap


def rank_ops(schedule: str, rank: int, pp: int, v: int, m: int) -> tuple[list[tuple[str, int, int]], int]:
    """The (kind, chunk, micro-batch) passes of one rank in order, and its warm-up forward count."""
    if schedule == "interleaved" and v > 1:
        total = m * v
        warm = min((pp - rank - 1) * 2 + (v - 1) * pp, total)
        group = pp * v

        def chunk(k: int, fwd: bool) -> int:
            c = (k % group) // pp
            return c if fwd else v - 1 - c

        def mb(k: int) -> int:
            return (k // group) * pp + k % pp

        ops = [("F", chunk(k, True), mb(k)) for k in range(warm)]
        for j in range(total - warm):
            ops.append(("F", chunk(warm + j, True), mb(warm + j)))
            ops.append(("B", chunk(j, False), mb(j)))
        ops += [("B", chunk(j, False), mb(j)) for j in range(max(0, total - warm), total)]
        return ops, warm
    fwd = [("F", c, 0) for c in range(v)]
    bwd = [("B", c, 0) for c in reversed(range(v))]

    def f(k: int) -> list:
        return [(a, c, k) for a, c, _ in fwd]

    def b(k: int) -> list:
        return [(a, c, k) for a, c, _ in bwd]

    if schedule == "gpipe":
        ops = [o for k in range(m) for o in f(k)] + [o for k in range(m) for o in b(k)]
        return ops, m * v
    if schedule in ("zb-h1", "zb-h2"):
        x = 1 if schedule == "zb-h1" else 2
        warm = max(1, min(m, x * pp - rank))
        ops = [o for k in range(warm) for o in f(k)]
        nxt, pending = warm, []
        for k in range(m):
            ops += b(k)
            pending.append(k)
            if len(pending) > rank:
                ops += [("W", c, pending.pop(0)) for c in range(v)]
            if nxt < m:
                ops += f(nxt)
                nxt += 1
        for k in pending:
            ops += [("W", c, k) for c in range(v)]
        return ops, warm * v
    if schedule == "zb-v":
        warm = min(m, pp)
    elif schedule == "dualpipe":
        warm = min(m, pp + 1)
    else:
        warm = min(m, pp - rank) if pp > 1 else 1
    ops = [o for k in range(warm) for o in f(k)]
    nxt = warm
    for k in range(m):
        ops += b(k)
        if nxt < m:
            ops += f(nxt)
            nxt += 1
    return ops, warm * v


def _dominated(a: Moment, b: Moment) -> bool:
    """``a`` is never above ``b``: same chunks done, no count higher (equal counts: the earlier is kept)."""
    return a.done == b.done and all(x <= y for x, y in zip(a.held, b.held)) and all(x <= y for x, y in zip(a.pending, b.pending))


@lru_cache(maxsize=8192)
def moments(schedule: str, rank: int, pp: int, v: int, m: int, split_backward: bool = False) -> tuple[Moment, ...]:
    """The moments of rank ``rank`` that can hold its peak (module doc), earliest first.
    ``split_backward``: B passes keep what W needs (Zero Bubble); otherwise B frees it all."""
    m_walk = steady_microbatches(schedule, pp, m)
    ops, warm = rank_ops(schedule, rank, pp, v, m_walk)
    held, pending, done = [0] * v, [0] * v, [0] * v
    keep: dict[tuple, list[Moment]] = {}
    f_count = 0
    for idx, (kind, c, k) in enumerate(ops):
        if kind == "W":
            pending[c] -= 1
            continue
        if kind == "F":
            held[c] += 1
            mo = Moment("F", c, k, f_count, tuple(held), tuple(pending), tuple(done), warm, idx)
            f_count += 1
            group = ("F", -1)
        else:
            mo = Moment("B", c, k, idx, tuple(held), tuple(pending), tuple(done), warm, idx)
            group = ("B", c)
            held[c] -= 1
            done[c] = 1
            if split_backward and schedule in ("zb-h1", "zb-h2"):
                pending[c] += 1
        lst = keep.setdefault(group, [])
        if any(_dominated(mo, o) for o in lst):
            continue
        lst[:] = [o for o in lst if not _dominated(o, mo)] + [mo]
    out = [mo for lst in keep.values() for mo in lst]
    out.sort(key=lambda x: x.step)
    return tuple(out)
