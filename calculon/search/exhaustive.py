"""Pricing every execution of a chunk, and keeping the best.

Provides :func:`evaluate_chunk` (a chunk's counts and its top-n),
:func:`chunk_rows` (every feasible execution of a chunk with its
statistics, for ``llm-all-executions``), :class:`ChunkResult`,
:func:`merge_best`, :func:`top_of`, :func:`mbs_break_mask` (Calculon's -m
rule), :func:`rate_reason` (rates and reasons with engine errors
isolated) and :class:`Best` (one kept execution with its tie key).  Reads
the grids (:mod:`calculon.search.grid`) and the engine
(:class:`calculon.llm.model.Evaluation`).

Ties: the best are the highest sample rates.  Under Calculon's preset,
equal rates keep Calculon's enumeration order (its stable sort: golden
parity of searches).  Under any other preset an equal rate goes to the
simpler execution: fewer offloads, then less memory (tier 1), then fewer
pipeline stages, then enumeration order (:func:`tie_key`); and the kept
executions are distinct: one that prices exactly as a better one (the
same rate, offloads, memory and stages: it differs only in a flag that
changes nothing, such as a TP communication type at TP 1) is not kept
(:func:`distinct`).

Near ties: a sample rate is no finer than the model that priced it, so
outside Calculon's preset executions within :data:`TIE_TOLERANCE` of the
best rate tie, and the best goes to the simplest of them (fewest virtual
pipeline stages, then fewest offloads, then the order above:
:func:`apply_ties`).  Each chunk keeps, besides its top-n, the best
execution of every (virtual stages, offloads) class and the rates near
its own best (:class:`ChunkResult` ``simplest``, ``near``); the branch
and bound prunes only below the n-th best rate less the tolerance, so
every execution within it of the best is priced.
"""

from dataclasses import dataclass, field
import logging

import numpy as np

from calculon.llm.model import Evaluation, OK, NON_FINITE, ENGINE_ERROR
from calculon.search.grid import Chunk, columns, execution_record, valid_mask


#: Relative sample-rate difference below which two executions tie (0.5
#: %): an order of magnitude below the model's resolution, its median
#: |error| on published runs of 6.6 % held out by source and 2.6 % on the
#: best-documented group (docs/accuracy.md), so a smaller difference is
#: no evidence that one execution is faster.  Llama 3 70B on 512 H100s
#: has its five best (VP 41, 40, 20, 10, 8) within 0.45 % of each other.
TIE_TOLERANCE = 0.005


def tie_tolerance(spec):
  """The tie tolerance of a search: :data:`TIE_TOLERANCE` (or the
  spec's ``tie_tolerance``) outside Calculon's space, 0 in it (golden
  parity: equal rates only, in Calculon's order)."""
  if not spec.modern:
    return 0.0
  return float(getattr(spec, 'tie_tolerance', TIE_TOLERANCE))


class Best(tuple):
  """One kept execution: the tuple (sample rate, group index, flat index
  in the group's grid), as earlier releases gave it, with its tie key
  (:func:`tie_key`) as the attribute ``tie``."""

  def __new__(cls, rate, group, flat, tie=()):
    self = super().__new__(cls, (rate, group, flat))
    self.tie = tie
    return self

  def __getnewargs__(self):
    return (self[0], self[1], self[2], self.tie)

  rate = property(lambda self: self[0])
  group = property(lambda self: self[1])
  flat = property(lambda self: self[2])


def sort_key(best):
  """The order of kept executions: rate descending, then the tie key,
  then enumeration order."""
  return (-best.rate, best.tie, best.group, best.flat)


def tie_key(spec, group, offloads, mem1_bytes):
  """What breaks a tie between equal sample rates (smaller first): none
  under Calculon's preset (enumeration order); otherwise the number of
  offloads, the memory of tier 1 and the pipeline stages."""
  if not spec.modern:
    return ()
  return (int(offloads), float(mem1_bytes), int(group.pp))


def distinct(ordered):
  """``ordered`` (sorted by :func:`sort_key`) without the entries that
  price exactly as the one before them (equal rate and tie key; only
  where there is a tie key: Calculon's space keeps every execution)."""
  out = []
  for b in ordered:
    if out and b.tie and b.tie == out[-1].tie and b.rate == out[-1].rate:
      continue
    out.append(b)
  return out


def merge_best(best, more, top_n):
  """Merges two best lists (see :func:`sort_key`, :func:`distinct`)."""
  return distinct(sorted(best + more, key=sort_key))[:top_n]


@dataclass
class ChunkResult:
  """Counts and best executions of one chunk.

  ``best``: list of :class:`Best`.
  """
  total: int = 0
  evaluated: int = 0
  feasible: int = 0
  reasons: dict = field(default_factory=dict)
  best: list = field(default_factory=list)
  pruned: int = 0
  #: {(virtual stages, offloads): Best}: each class's best (near ties).
  simplest: dict = field(default_factory=dict)
  #: Sample rates within the tie tolerance of the chunk's best.
  near: object = None

  def add(self, spec, group, cells, rate, reason, mem1, top_n):
    """Counts executions priced at the grid indices ``cells`` (int array
    (n, axes)) of ``group``, with their sample rates, reason codes and
    tier-1 memory (arrays (n,)), and keeps the ``top_n`` best feasible
    ones (:func:`sort_key`)."""
    feasible = reason == OK
    self.evaluated += len(cells)
    self.feasible += int(feasible.sum())
    codes, n = np.unique(reason[~feasible], return_counts=True)
    for c, m in zip(codes, n):
      self.reasons[int(c)] = self.reasons.get(int(c), 0) + int(m)
    if feasible.any():
      flat = np.ravel_multi_index(cells[feasible].T, group.shape)
      vals = rate[feasible]
      offloads = _offloads_at(group, cells[feasible])
      mem = mem1[feasible]
      order = _order(spec, vals, offloads, mem, flat)
      self.best = merge_best(self.best, _first_distinct(
        spec, group, order, vals, flat, offloads, mem, top_n), top_n)
      self.merge_ties(spec, *_ties_of(spec, group, cells[feasible], vals,
                                      flat, offloads, mem))

  def merge_ties(self, spec, simplest, near):
    """Adds another part's class bests and near rates (:func:`_ties_of`)."""
    self.simplest = merge_simplest(self.simplest, simplest)
    self.near = merge_near(self.near, near, tie_tolerance(spec))


def _offloads_at(group, cells):
  """Offloads of each execution at grid indices ``cells``."""
  n = np.zeros(len(cells), dtype=np.int64)
  for name in ('weight_offload', 'activations_offload', 'optimizer_offload'):
    i = group.axes.index(name)
    n += np.asarray(group.values[name], dtype=bool)[cells[:, i]]
  return n


def _vp_at(group, cells):
  """Virtual pipeline stages of each execution at grid indices
  ``cells``."""
  i = group.axes.index('pipeline_interleaving')
  return np.asarray(group.values['pipeline_interleaving'],
                    dtype=np.int64)[cells[:, i]]


def simplicity(vp, offloads):
  """The near-tie order of an execution (smaller is simpler): its
  virtual pipeline stages, then its offloads."""
  return (int(vp), int(offloads))


def _ties_of(spec, group, cells, rate, flat, offloads, mem1):
  """({(virtual stages, offloads): Best}, rates near the best) of the
  feasible executions at grid indices ``cells`` (n, axes) with their
  rates, flat indices, offloads and tier-1 memory (n,); ({}, None) in
  Calculon's space."""
  tol = tie_tolerance(spec)
  if not tol or not len(rate):
    return {}, None
  vp = _vp_at(group, cells)
  order = _order(spec, rate, offloads, mem1, flat)
  key = vp[order] * 4 + offloads[order]
  _, first = np.unique(key, return_index=True)
  simplest = {}
  for j in first:
    o = order[j]
    simplest[simplicity(vp[o], offloads[o])] = Best(
      float(rate[o]), group.index, int(flat[o]),
      tie_key(spec, group, offloads[o], mem1[o]))
  near = rate[rate >= rate.max() * (1.0 - tol)]
  return simplest, np.sort(near)[::-1]


def merge_simplest(a, b):
  """Two {class: Best} merged, each class keeping its best
  (:func:`sort_key`)."""
  out = dict(a)
  for k, v in b.items():
    if k not in out or sort_key(v) < sort_key(out[k]):
      out[k] = v
  return out


def merge_near(a, b, tol):
  """Two arrays of near rates merged: those within ``tol`` of the best
  of both."""
  if a is None or not len(a):
    return b
  if b is None or not len(b):
    return a
  both = np.concatenate([a, b])
  return np.sort(both[both >= both.max() * (1.0 - tol)])[::-1]


def apply_ties(spec, groups_, best, simplest, near, top_n):
  """The kept executions with near ties given to the simplest.

  Args:
    spec: the search's spec (:func:`tie_tolerance`).
    groups_: the space's groups (to find a kept execution's class).
    best: the kept :class:`Best` list (:func:`sort_key` order).
    simplest: {(virtual stages, offloads): Best} over the whole space.
    near: sample rates within the tolerance of each part's best.
    top_n: how many to keep.

  Returns:
    (the list: every execution within the tolerance of the best rate, of
    ``best`` and the class bests, ordered by :func:`simplicity` then
    :func:`sort_key`, then the rest of ``best``; at most ``top_n``, how
    many executions of the space lie within the tolerance of the best
    rate).  ``best`` and 0 in Calculon's space.
  """
  tol = tie_tolerance(spec)
  if not tol or not best:
    return best, 0
  top = best[0].rate
  floor = top * (1.0 - tol)
  ties = 0 if near is None else int(np.sum(np.asarray(near) >= floor))

  def cls(b):
    g = groups_[b.group]
    cells = np.asarray(np.unravel_index(b.flat, g.shape)).reshape(1, -1)
    return simplicity(_vp_at(g, cells)[0], _offloads_at(g, cells)[0])
  pool = {(b.group, b.flat): b for b in best if b.rate >= floor}
  for b in simplest.values():
    if b.rate >= floor:
      pool.setdefault((b.group, b.flat), b)
  tied = sorted(pool.values(), key=lambda b: (cls(b), sort_key(b)))
  rest = [b for b in best if (b.group, b.flat) not in pool]
  return (tied + rest)[:top_n], max(ties, 1)


def _first_distinct(spec, group, order, rate, flat, offloads, mem1, top_n):
  """The first ``top_n`` distinct :class:`Best` of the entries taken in
  ``order`` (index arrays over ``rate``, ``flat``...)."""
  out = []
  for o in order:
    b = Best(float(rate[o]), group.index, int(flat[o]),
             tie_key(spec, group, offloads[o], mem1[o]))
    if out and b.tie and b.tie == out[-1].tie and b.rate == out[-1].rate:
      continue
    out.append(b)
    if len(out) == top_n:
      break
  return out


def _order(spec, rate, offloads, mem1, flat):
  """Indices sorted by :func:`sort_key` within one group."""
  if not spec.modern:
    return np.lexsort((flat, -rate))
  return np.lexsort((flat, mem1, offloads, -rate))


def rate_reason(spec, chunk, ev=None):
  """Sample rates, reason codes and tier-1 memory of a chunk (arrays of
  ``chunk.shape``).

  If evaluating the chunk raises, it is cut along its next axis and the
  parts are evaluated separately, down to single executions; an execution
  that still raises gets reason ENGINE_ERROR (and is logged), so one bad
  candidate never stops a search.  Non-finite batch times get NON_FINITE.
  """
  shape = chunk.shape
  try:
    if ev is None:
      ev = Evaluation(spec.app, spec.system, columns(spec, chunk))
    with np.errstate(all='ignore'):
      rate = np.broadcast_to(ev.sample_rate, shape)
      reason = np.broadcast_to(ev.reason, shape)
      mem1 = np.broadcast_to(ev.mem1_bytes, shape)
      bad = (reason == OK) & ~np.isfinite(rate)
    if bad.any():
      reason = np.where(bad, NON_FINITE, reason)
    return rate, reason, mem1
  except Exception as err:  # noqa: BLE001 -- isolate, count, go on
    k = len(chunk.prefix)
    if k == len(chunk.group.axes):
      record = execution_record(spec, chunk.group, chunk.offset)
      logging.getLogger('calculon').error(
        'engine error for execution %s: %s: %s', record,
        type(err).__name__, err)
      return (np.full(shape, np.nan), np.full(shape, ENGINE_ERROR),
              np.full(shape, np.nan))
    parts = [rate_reason(spec, Chunk(chunk.group, chunk.prefix + (i,)))
             for i in range(chunk.group.shape[k])]
    return tuple(np.concatenate([p[j] for p in parts], axis=k)
                 for j in range(3))


def evaluate_chunk(spec, chunk, top_n):
  """Evaluates a chunk; returns a :class:`ChunkResult` with its top-n."""
  shape = chunk.shape
  valid = np.broadcast_to(valid_mask(columns(spec, chunk), spec), shape)
  rate, reason, mem1 = rate_reason(spec, chunk)
  feasible = (reason == OK) & valid
  considered = valid
  if spec.mbs_break:
    considered = valid & mbs_break_mask(feasible, valid, chunk.group.axes)
    feasible = feasible & considered
  res = ChunkResult(total=int(valid.sum()), evaluated=int(considered.sum()),
                    feasible=int(feasible.sum()))
  codes, counts = np.unique(reason[considered & ~feasible], return_counts=True)
  res.reasons = {int(c): int(n) for c, n in zip(codes, counts)}
  res.best = top_of(spec, rate, feasible, mem1, top_n, chunk)
  if tie_tolerance(spec) and feasible.any():
    idx = np.flatnonzero(feasible.reshape(-1))
    cells = np.stack(np.unravel_index(idx, shape), axis=1)
    cells[:, :len(chunk.prefix)] += np.asarray(chunk.prefix, dtype=np.int64)
    mem = np.broadcast_to(mem1, shape).reshape(-1)[idx]
    res.merge_ties(spec, *_ties_of(
      spec, chunk.group, cells, rate.reshape(-1)[idx], chunk.offset + idx,
      _offloads_at(chunk.group, cells), mem))
  return res


def top_of(spec, rate, feasible, mem1, top_n, chunk):
  """The ``top_n`` best feasible entries of a chunk as :class:`Best`
  (:func:`sort_key`)."""
  flat_rate = rate.reshape(-1)
  idx = np.flatnonzero(feasible.reshape(-1))
  if len(idx) == 0:
    return []
  vals = flat_rate[idx]
  if len(idx) > top_n:
    kth = _kth_distinct_rate(vals, top_n) if spec.modern else \
      np.partition(vals, len(vals) - top_n)[len(vals) - top_n]
    keep = vals >= kth
    idx, vals = idx[keep], vals[keep]
  offset = chunk.offset
  group = chunk.group
  cells = np.stack(np.unravel_index(idx, chunk.shape), axis=1)
  cells[:, :len(chunk.prefix)] += np.asarray(chunk.prefix, dtype=np.int64)
  offloads = _offloads_at(group, cells)
  mem = np.broadcast_to(mem1, chunk.shape).reshape(-1)[idx]
  order = _order(spec, vals, offloads, mem, idx)
  return _first_distinct(spec, group, order, vals, offset + idx, offloads,
                         mem, top_n)


def _kth_distinct_rate(vals, top_n):
  """The ``top_n``-th largest distinct value of ``vals`` (or the smallest
  when there are fewer): every entry at or above it may be among the
  ``top_n`` distinct executions."""
  m = top_n
  while True:
    m = min(4 * m, len(vals))
    top = np.partition(vals, len(vals) - m)[len(vals) - m:]
    unique = np.unique(top)
    if len(unique) >= top_n or m == len(vals):
      return unique[-min(top_n, len(unique))]


def mbs_break_mask(feasible, valid, axes):
  """Calculon's -m rule on a chunk: for each combination of the options
  before the microbatch size, keep microbatch sizes before the first one
  (ascending) with no feasible execution on any network assignment."""
  axis = axes.index('microbatch_size')
  nets = tuple(range(axis + 1, len(axes)))
  any_ok = feasible.any(axis=nets, keepdims=True)
  enumerated = valid.any(axis=nets, keepdims=True)
  # A combination that is not enumerated (masked) does not break.
  fails = enumerated & ~any_ok
  before = np.cumsum(fails, axis=axis) - fails == 0
  return np.broadcast_to(before, feasible.shape)


def chunk_rows(spec, chunk):
  """Every feasible execution of a chunk with all its statistics.

  Returns:
    (columns dict name -> 1-d array in enumeration order, total executions,
    infeasible reason counts).  Execution fields hold Calculon values
    (strings for categorical fields; the modern space adds every optional
    field as priced and ``framework``).  A part of the chunk that makes the
    engine raise is isolated as in :func:`evaluate_chunk` and counted as
    ENGINE_ERROR.
  """
  from calculon.config.execution import FIELD_SPECS, OPTIONAL_SPECS, UNSET
  from calculon.llm.stats import stat_arrays
  cols = columns(spec, chunk)
  shape = chunk.shape
  valid = np.broadcast_to(valid_mask(cols, spec), shape)
  try:
    ev = Evaluation(spec.app, spec.system, cols)
    with np.errstate(all='ignore'):
      reason = np.broadcast_to(ev.reason, shape)
      rate = np.broadcast_to(ev.sample_rate, shape)
      reason = np.where((reason == OK) & ~np.isfinite(rate), NON_FINITE,
                        reason)
      keep = valid & (reason == OK)
      out = {}
      fields = [(n, names) for n, (_, names) in FIELD_SPECS.items()]
      if spec.modern:
        fields += [(n, names) for n, (_, names, _) in OPTIONAL_SPECS.items()]
      for name, names in fields:
        arr = np.broadcast_to(getattr(cols, name), shape)[keep]
        if names:
          table = np.asarray(list(names) + [None], dtype=object)
          arr = table[np.where(arr == UNSET, len(names), arr)]
        out[name] = arr
      if spec.modern:
        out['framework'] = np.full(int(keep.sum()), spec.framework,
                                   dtype=object)
      from calculon.llm.stats import CALCULON_STAT_NAMES, STAT_NAMES
      names = STAT_NAMES if spec.modern else CALCULON_STAT_NAMES
      for name, arr in stat_arrays(ev, names).items():
        out[name] = arr[keep]
  except Exception:  # noqa: BLE001 -- isolate the failing executions
    k = len(chunk.prefix)
    if k == len(chunk.group.axes):
      rate_reason(spec, chunk)  # logs the error
      return {}, int(valid.sum()), ({ENGINE_ERROR: 1} if valid.all() else {})
    out, n, why = {}, 0, {}
    for i in range(chunk.group.shape[k]):
      rows, m, w = chunk_rows(spec, Chunk(chunk.group, chunk.prefix + (i,)))
      for name, arr in rows.items():
        out.setdefault(name, []).append(arr)
      n += m
      for code, c in w.items():
        why[code] = why.get(code, 0) + c
    return {name: np.concatenate(parts) for name, parts in out.items()}, n, why
  codes, counts = np.unique(reason[valid & ~keep], return_counts=True)
  return out, int(valid.sum()), {int(c): int(n) for c, n in zip(codes, counts)}
