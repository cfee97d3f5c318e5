"""The moments at which a pipeline rank can reach its memory peak, from its schedule.

A rank runs its forward (F), backward (B) and, under Zero Bubble schedules, weight-gradient (W)
passes in the order its schedule gives; each micro-batch's activations on a model chunk are
held from its F to its B (the part a W pass needs, to its W). :func:`moments` walks that order
and returns, for every moment that could be the peak, how many micro-batches each chunk holds
(``held``), how many wait for their W (``pending``) and which chunks have run a backward already
(``done``: gradients an engine allocates at a chunk's first backward exist from then on). The
memory at a moment is linear in these counts, so the moments are priced as arrays at once
(:class:`MomentTable`).

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


__all__ = ["Moment", "MomentTable", "is_small_table", "moment_table", "most_held", "moments", "rank_ops", "steady_microbatches"]


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


def _interleaved_arrays(rank: int, pp: int, v: int, m: int):
    """Megatron's interleaved order as arrays (kind 0 F / 1 B, chunk, micro-batch) and the
    warm-up count: forward k runs chunk (k mod p v) div p of micro-batch (k div p v) p + k mod p,
    backward k the mirrored chunk (module doc)."""
    import numpy as np  # noqa: PLC0415

    total = m * v
    warm = min((pp - rank - 1) * 2 + (v - 1) * pp, total)
    group = pp * v
    steady = total - warm
    # forward k at position k (warm-up), then F(warm + j) at warm + 2j and B(j) at warm + 2j + 1
    f_pos = np.concatenate([np.arange(warm), warm + 2 * np.arange(steady)])
    b_pos = np.concatenate([warm + 2 * np.arange(steady) + 1, warm + 2 * steady + np.arange(total - steady)])
    k = np.arange(total)
    n = 2 * total
    kind, chunk, mb = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
    kind[f_pos], kind[b_pos] = 0, 1
    chunk[f_pos] = (k % group) // pp
    chunk[b_pos] = v - 1 - (k % group) // pp
    mb[f_pos] = mb[b_pos] = (k // group) * pp + k % pp
    return kind, chunk, mb, warm


def rank_ops(schedule: str, rank: int, pp: int, v: int, m: int) -> tuple[list[tuple[str, int, int]], int]:
    """The (kind, chunk, micro-batch) passes of one rank in order, and its warm-up forward count."""
    if schedule == "interleaved" and v > 1:
        kind, chunk, mb, warm = _interleaved_arrays(rank, pp, v, m)
        return [("FB"[a], int(c), int(k)) for a, c, k in zip(kind, chunk, mb)], warm
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


@dataclass(frozen=True)
class MomentTable:
    """Every moment of a rank's walk as arrays (one row a moment, one column a chunk), for
    vectorised pricing; ``moment(i)`` is row i as a :class:`Moment`."""

    is_b: np.ndarray
    chunk: np.ndarray
    mb: np.ndarray
    index: np.ndarray
    step: np.ndarray
    held: np.ndarray
    pending: np.ndarray
    done: np.ndarray
    warmup: int
    hpd: np.ndarray = None  # [held | pending | done], one product prices the three counts
    group: np.ndarray = None  # 0 forward, 1 forward of the last chunk, 2 + c backward of chunk c

    def moment(self, i: int) -> Moment:
        return Moment("B" if self.is_b[i] else "F", int(self.chunk[i]), int(self.mb[i]), int(self.index[i]),
                      tuple(int(x) for x in self.held[i]), tuple(int(x) for x in self.pending[i]),
                      tuple(int(x) for x in self.done[i]), self.warmup, int(self.step[i]))

    def __len__(self) -> int:
        return len(self.is_b)


# Tables are cached by size: a search prices the same small tables thousands of times; a deep
# pipeline's tables (tens of thousands of counts each) are kept for one candidate's ranks at a
# time, so the cache's memory stays bounded (tests/test_large_inputs.py).
_LARGE_COUNTS = 20_000


def is_small_table(schedule: str, pp: int, v: int, m: int) -> bool:
    """Whether a rank's moment table is small (its entries under ``_LARGE_COUNTS``): cheap to build
    and kept in the large cache of small tables."""
    return 2 * steady_microbatches(schedule, pp, m) * v * 3 * v <= _LARGE_COUNTS


def moment_table(schedule: str, rank: int, pp: int, v: int, m: int, split_backward: bool = False,
                 track_done: bool = True) -> MomentTable:
    """The moments of rank ``rank`` in step order (:func:`_moment_table`), cached."""
    cache = _small_table if is_small_table(schedule, pp, v, m) else _large_table
    return cache(schedule, rank, pp, v, m, split_backward, track_done)


def _moment_table(schedule: str, rank: int, pp: int, v: int, m: int, split_backward: bool = False,
                  track_done: bool = True) -> MomentTable:
    """The moments of rank ``rank`` (module doc) in step order. ``split_backward``: B passes keep
    what W needs (Zero Bubble); otherwise B frees it all. ``track_done``: whether gradients appear
    at a chunk's first backward (otherwise the done-sets are not told apart). Equal moments are
    kept once (the first); the table is read-only. Dropping the moments
    another covers would not change a peak, and costs more than it saves: a table is priced
    once per stage a search prices, with one matrix-vector product.

    The counts are running sums over the pass order, built as arrays (a 64-stage pipeline of 16
    chunks walks ~6,000 passes per rank): a forward's moment sees the counts after it, a
    backward's the counts before it (it frees what it held as it runs)."""
    import numpy as np  # noqa: PLC0415  (numpy on first use: CLI start-up)

    m_walk = steady_microbatches(schedule, pp, m)
    if schedule == "interleaved" and v > 1:
        kind, chunk, mbs, warm = _interleaved_arrays(rank, pp, v, m_walk)
    else:
        ops, warm = rank_ops(schedule, rank, pp, v, m_walk)
        kind = np.array(["FBW".index(k) for k, _, _ in ops], dtype=np.int64)
        chunk = np.array([c for _, c, _ in ops], dtype=np.int64)
        mbs = np.array([k for _, _, k in ops], dtype=np.int64)
    n = len(kind)
    is_f, is_b, is_w = kind == 0, kind == 1, kind == 2
    onehot = np.zeros((n, v))
    onehot[np.arange(n), chunk] = 1.0
    zb = split_backward and schedule in ("zb-h1", "zb-h2")
    held_after = np.cumsum(onehot * (is_f.astype(float) - is_b)[:, None], axis=0)
    pend_after = np.cumsum(onehot * ((is_b & zb).astype(float) - is_w)[:, None], axis=0)
    done_after = np.maximum.accumulate(onehot * is_b[:, None], axis=0) if track_done else np.zeros((n, v))

    def before(a):
        return np.vstack([np.zeros((1, v)), a[:-1]])

    bcol = is_b[:, None]
    held = np.where(bcol, before(held_after), held_after)
    pending = np.where(bcol, before(pend_after), pend_after)
    done = np.where(bcol, before(done_after), done_after)
    f_before = np.cumsum(is_f) - is_f  # forwards run before each pass
    idx = np.flatnonzero(~is_w)
    key = np.hstack([is_b[idx, None].astype(float), chunk[idx, None].astype(float), held[idx], pending[idx], done[idx]])
    k16 = np.ascontiguousarray(key, dtype=np.int16)  # counts are small integers: one byte string per row
    _, first = np.unique(k16.view(np.dtype((np.void, 2 * k16.shape[1]))).ravel(), return_index=True)
    sel = idx[np.sort(first)]  # the first pass of each distinct moment, in step order
    b = is_b[sel]
    # One block [held | pending | done], the three counts views of it: a cached table of a deep
    # pipeline holds its counts once (float64: pricing multiplies it without a cast).
    hpd = np.hstack([held[sel], pending[sel], done[sel]])
    t = MomentTable(is_b=b, chunk=chunk[sel], mb=mbs[sel], index=np.where(b, sel, f_before[sel]), step=sel,
                    held=hpd[:, :v], pending=hpd[:, v:2 * v], done=hpd[:, 2 * v:], warmup=warm)
    object.__setattr__(t, "hpd", hpd)
    # the row's kind for pricing: 0 forward, 1 forward of the last chunk, 2 + c backward of chunk c
    object.__setattr__(t, "group", np.where(t.is_b, 2 + t.chunk, (t.chunk == v - 1).astype(np.int64)))
    for a in (t.is_b, t.chunk, t.mb, t.index, t.step, t.held, t.pending, t.done, t.hpd, t.group):
        a.setflags(write=False)
    return t


_small_table = lru_cache(maxsize=8192)(_moment_table)


@lru_cache(maxsize=65536)
def most_held(schedule: str, rank: int, pp: int, v: int, m: int, split_backward: bool = False) -> int:
    """The most chunk-micro-batches rank ``rank`` holds at one moment of its step (the table's
    largest row sum), from a table built for it and not kept (the search's memory bound asks
    for many that are never priced)."""
    return int(_moment_table(schedule, rank, pp, v, m, split_backward, False).held.sum(axis=1).max())
_large_table = lru_cache(maxsize=160)(_moment_table)


def moments(schedule: str, rank: int, pp: int, v: int, m: int, split_backward: bool = False) -> tuple[Moment, ...]:
    """The moments of :func:`moment_table` as :class:`Moment` values, earliest first."""
    t = moment_table(schedule, rank, pp, v, m, split_backward)
    return tuple(t.moment(i) for i in range(len(t)))
