"""Running a search: the whole space, on worker processes.

Provides :func:`optimal_executions` (the top-n of the space: exhaustive in
Calculon's space and with -m, branch and bound otherwise),
:func:`all_executions` (every feasible execution with its statistics,
streamed) and :class:`SearchResult`.  Reads the grids
(:mod:`calculon.search.grid`), the chunk pricing
(:mod:`calculon.search.exhaustive`), the bounds
(:mod:`calculon.search.bound`) and :mod:`calculon.parallel`.
"""

from dataclasses import dataclass
import time

import numpy as np

from calculon.parallel import imap
from calculon.search import bound as B
from calculon.search.exhaustive import (
  apply_ties, chunk_rows, evaluate_chunk, merge_best, merge_near,
  merge_simplest, tie_tolerance)
from calculon.search.grid import (
  DEFAULT_CHUNK, MODERN_CHUNK, REDUCED_CHUNK, Chunk, chunks, groups,
  valid_count)


@dataclass
class SearchResult:
  """Outcome of a search.

  Attributes:
    best: [:class:`~calculon.search.exhaustive.Best` (sample rate, group
      index, flat index, tie key)], best first.
    total: executions in the space; evaluated: considered (fewer with -m);
    feasible: feasible among those; reasons: {reason code: count} of the
    infeasible ones; elapsed_s: wall time; partial: interrupted before the
    end; groups: the space's groups (to rebuild executions); pruned:
    executions the bounds proved slower than the best, not priced; ties:
    executions within ``tie_tolerance`` (relative) of the best rate, the
    best among them the simplest
    (:func:`~calculon.search.exhaustive.apply_ties`; 0 in Calculon's
    space).
  """
  best: list
  total: int
  evaluated: int
  feasible: int
  reasons: dict
  elapsed_s: float
  partial: bool
  groups: list
  pruned: int = 0
  ties: int = 0
  tie_tolerance: float = 0.0

  @property
  def rate_per_s(self):
    """Executions evaluated per second of wall time."""
    return self.evaluated / self.elapsed_s if self.elapsed_s > 0 else 0.0


_WORKER = {}


def _setup(spec, groups_, top_n, chunk_size, threshold=None):
  _WORKER.update(spec=spec, groups=groups_, top_n=top_n, chunk=chunk_size,
                 threshold=threshold)


def _best_task(task):
  gi, prefix = task
  spec, g = _WORKER['spec'], _WORKER['groups'][gi]
  return evaluate_chunk(spec, Chunk(g, prefix), _WORKER['top_n'])


def _bound_task(task):
  gi, _ = task
  spec, g = _WORKER['spec'], _WORKER['groups'][gi]
  shared = _WORKER.get('threshold')
  return B.search_group(spec, g, _WORKER['top_n'],
                        (lambda: shared.value) if shared is not None
                        else (lambda: 0.0))


def _group_bound_task(gi):
  return B.group_bound(_WORKER['spec'], _WORKER['groups'][gi])


def tasks_of(groups_, chunk_size):
  """(group index, chunk prefix) of every chunk, in enumeration order."""
  return [(g.index, c.prefix) for g in groups_ for c in chunks(g, chunk_size)]


class _Threshold:
  """The n-th best rate so far, shared with worker processes (a
  multiprocessing value) or kept here."""

  def __init__(self, workers):
    if workers > 1:
      from calculon.parallel import _context
      self.shared = _context().Value('d', 0.0, lock=False)
    else:
      self.shared = _LocalValue()

  @property
  def value(self):
    return self.shared.value

  def set(self, value):
    self.shared.value = value


class _LocalValue:
  value = 0.0


def optimal_executions(spec, top_n=1, workers=1, chunk_size=None,
                       on_progress=None):
  """Searches the whole space and keeps the ``top_n`` fastest executions
  (ties: :func:`calculon.search.exhaustive.sort_key`; outside Calculon's
  space rates within :func:`~calculon.search.exhaustive.tie_tolerance`
  of the best tie and go to the simplest execution,
  :func:`~calculon.search.exhaustive.apply_ties`).

  Memory is O(top_n + chunk) per process.  Ctrl-C (KeyboardInterrupt) stops
  the search and returns what was found, with ``partial=True``.

  In the modern space (``spec.prune``, not with -m) the search is branch
  and bound (:mod:`calculon.search.bound`): groups are searched in order of
  a level-1 bound and skipped when it is below the n-th best rate found so
  far; within a group, a level-2 bound per cell of the reduced grid decides
  which cells are priced in full.  The bounds never underestimate a rate,
  so the top-n is exactly the exhaustive one.

  Args:
    spec: :class:`~calculon.search.grid.SearchSpec`.
    top_n: how many best executions to keep.
    workers: processes.
    chunk_size: maximum executions per chunk (default: DEFAULT_CHUNK, or
      for the pruned modern search cells of the reduced grid per task).
    on_progress: called with the number of executions of each finished chunk.
  """
  start = time.perf_counter()
  groups_ = groups(spec)
  counts = {g.index: valid_count(spec, g) for g in groups_}
  total = sum(counts.values())
  best, evaluated, feasible, reasons = [], 0, 0, {}
  pruned = 0
  partial = False
  prune = spec.modern and spec.prune and not spec.mbs_break
  if chunk_size is None:
    chunk_size = REDUCED_CHUNK if prune else (
      MODERN_CHUNK if spec.modern else DEFAULT_CHUNK)
  threshold = _Threshold(workers) if prune else None
  tol = tie_tolerance(spec)
  simplest, near = {}, None
  order = groups_
  group_bound = {}
  if prune:
    bounds = list(imap(_group_bound_task, [g.index for g in groups_],
                       workers, initializer=_setup,
                       initargs=(spec, groups_, top_n, chunk_size)))
    order = [groups_[i] for i in np.argsort(-np.asarray(bounds),
                                            kind='stable')]
    group_bound = dict(zip([g.index for g in groups_], bounds))

  def tasks():
    nonlocal pruned
    for g in order:
      if not prune:
        for c in chunks(g, chunk_size):
          yield (g.index, c.prefix)
        continue
      if threshold.value > 0 and \
          group_bound[g.index] * (1 + B.PRUNE_MARGIN) < threshold.value:
        pruned += counts[g.index]
        if on_progress is not None:
          on_progress(counts[g.index])
        continue
      yield (g.index, ())

  try:
    for res in imap(_bound_task if prune else _best_task, tasks(), workers,
                    initializer=_setup,
                    initargs=(spec, groups_, top_n, chunk_size,
                              threshold.shared if prune else None),
                    ordered=False):
      best = merge_best(best, res.best, top_n)
      evaluated += res.evaluated
      feasible += res.feasible
      pruned += res.pruned
      for code, n in res.reasons.items():
        reasons[code] = reasons.get(code, 0) + n
      simplest = merge_simplest(simplest, res.simplest)
      near = merge_near(near, res.near, tol)
      if prune and len(best) >= top_n:
        threshold.set(best[top_n - 1][0] * (1.0 - tol))
      if on_progress is not None:
        on_progress(res.total)
  except KeyboardInterrupt:
    partial = True
  best, ties = apply_ties(spec, groups_, best, simplest, near, top_n)
  return SearchResult(best, total, evaluated, feasible, reasons,
                      time.perf_counter() - start, partial, groups_, pruned,
                      ties, tol)


def _rows_task(task):
  gi, prefix = task
  spec, g = _WORKER['spec'], _WORKER['groups'][gi]
  return chunk_rows(spec, Chunk(g, prefix))


def all_executions(spec, workers=1, chunk_size=DEFAULT_CHUNK // 4):
  """Yields, in enumeration order, one (columns, total, reasons) per chunk
  (see :func:`calculon.search.exhaustive.chunk_rows`); at most a few
  chunks are in memory at once."""
  groups_ = groups(spec)
  yield from imap(_rows_task, tasks_of(groups_, chunk_size), workers,
                  initializer=_setup, initargs=(spec, groups_, 0, chunk_size),
                  ordered=True)
