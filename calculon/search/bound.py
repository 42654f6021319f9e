"""Exact pruning of the modern search space (branch and bound).

The modern space of a large model on many processors holds billions of
executions (Llama 3.1 405B on 16,384 GPUs: 0.9 billion).  Most of them are
far from the best, and a lower bound of their batch time proves it without
pricing them in full:

* :func:`rate_bound` (level 1, per group): the blocks' compute and the
  pipeline bubble that compute alone would make.  Groups are searched in
  order of this bound and a group whose bound is below the n-th best rate
  found so far is skipped.
* :func:`reduced_bound` (level 2, per grid cell): the full batch time of
  the cell with every offload off and no DP overlap, minus what those
  options could possibly hide.  The *inner* axes (:data:`INNER_AXES`: DP
  overlap and the three offloads) change only terms the bound leaves out
  or bounds from below, so one evaluation of the reduced grid bounds all
  16 inner combinations of each cell.
* :func:`search_group`: the cells whose bound reaches the threshold
  are expanded over the inner axes and priced in full, as flat batches.
* :func:`group_bound`: the level-1 bound of a whole group (the driver
  orders and skips groups by it).

Reads the grids (:mod:`calculon.search.grid`), the pricing of executions
(:mod:`calculon.search.exhaustive`) and the engine.

Every bound is a true lower bound of ``Evaluation.total_time_s`` (each
function says why), so the top-n is exactly the exhaustive search's; a
brute-force test checks it (tests/test_search.py), and a property test
checks both bounds against priced rates on random cells of the modern
space (tests/test_bound.py).

The bounds read only public terms of the engine: the block's totals, the
exposed time the concerns add to every block, term by term
(:meth:`~calculon.llm.terms.evaluation.Evaluation.concern_terms`, whose
sums are ``block_fw_extra_s`` and ``block_bw_extra_s``), blocks x
microbatches (``block_microbatches``), whether gradients are reduced at
the batch end (``dp_reduces_at_end``), the engine's bubble formula
(:meth:`~calculon.llm.terms.schedule.ScheduleTerms.bubble_s`), and
Evaluations that reuse the level-1 totals
(:meth:`~calculon.llm.terms.blocks.BlockTerms.reusing_totals`).
"""

import itertools

import numpy as np

from calculon.config import ExecutionColumns
from calculon.llm.model import (
  Evaluation, OK, NON_FINITE, ENGINE_ERROR, NETWORK_TOO_SMALL,
  NETWORK_NOT_FILLED, INTERLEAVING_TOO_LARGE, INTERLEAVING_NOT_FACTOR)
from calculon.search.exhaustive import ChunkResult, tie_tolerance
from calculon.search.grid import (
  Chunk, Group, axis_values, columns, count_valid, grid_columns, valid_mask)

#: Axes whose options the level-2 bound covers from below (see module).
INNER_AXES = ('data_par_overlap', 'weight_offload', 'activations_offload',
              'optimizer_offload')
#: Relative margin of the pruning test against rounding in the bounds.
PRUNE_MARGIN = 1e-9
#: Executions priced at once when expanding surviving cells.
FLAT_BATCH = 1 << 17
#: Infeasibility found before pricing that no inner option changes.
_STRUCTURAL = (NETWORK_TOO_SMALL, NETWORK_NOT_FILLED, INTERLEAVING_TOO_LARGE,
               INTERLEAVING_NOT_FACTOR)


def rate_bound(ev):
  """Upper bound of the sample rate of every execution of an Evaluation
  (array over the axes the block's compute depends on).

  The batch time is at least the blocks' compute (forward, recomputation,
  backward and the optimizer step, :class:`~calculon.llm.block.BlockTotals`)
  and the TP communication they expose (the smaller of a base and an edge
  block's), the exposed time every concern adds to every block
  (:attr:`~calculon.llm.terms.evaluation.Evaluation.block_fw_extra_s` and
  ``block_bw_extra_s``: CP ring, FSDP and expert-parallel traffic; the
  batch terms of a concern include its block terms over every block and
  microbatch, :class:`~calculon.llm.terms.base.Concern`), the embedding and
  LM head's compute, plus the pipeline bubble those block times alone
  would make (the engine's
  :meth:`~calculon.llm.terms.schedule.ScheduleTerms.bubble_s`): every
  other term of ``total_time_s`` (exposed PP/DP communication, offload,
  the vocabulary's optimizer and DP...) is >= 0, the real base and edge
  block times are >= these, and the bubble grows with them (see
  ``bubble_s``).  So batch / bound >= every sample rate the executions
  reach.
  """
  b = ev.block
  train = ev.training
  # TP communication a block exposes whatever else is chosen: the smaller
  # of a base and an edge block's (both are >= it).
  fw = b.fw_time + np.minimum(b.base_fw_tp_exposed, b.edge_fw_tp_exposed)
  bw = np.where(train, b.re_time + b.agrad_time + b.wgrad_time +
                np.minimum(b.base_agrad_tp_exposed, b.edge_agrad_tp_exposed)
                + np.minimum(b.base_recomm_exposed, b.edge_recomm_exposed),
                0)
  # Exposed CP, FSDP and EP traffic, each term at its smallest over the
  # axes the block's compute does not depend on (their tiers, the
  # dispatcher...), so the bound keeps the block's axes only.  The sum of
  # the terms' minima is at most the minimum of their sum, so the bound
  # stays above every rate; reducing the terms one by one never builds
  # the grid of all their axes together.
  extra = _smallest_extra(ev, np.shape(fw + bw))
  per_block = fw + bw + extra
  compute = ev.block_microbatches * per_block + np.where(
    train, ev.blocks_per_proc * b.optim_time, 0)
  if ev.app.has_vocab:
    # The embedding and the head, with the end stages' block at its lower
    # bound where the split counts them (the engine's formula,
    # vocab_time_for_s, says why the sum stays a lower bound).
    vocab = ev.vocab_time_for_s(per_block)
    if ev.pipeline_layout is not None:
      # A layout's end stages add max(E - d b, 0) (>= 0, but falling as b
      # grows): bounded by 0 there.
      vocab = np.where(ev.pipeline_layout.given, 0.0, vocab)
    compute = compute + vocab
  # Every base and edge block at least per_block (forward and backward
  # together: the bubble weighs both alike).
  bubble = ev.bubble_s(per_block, per_block, 0.0, 0.0)
  with np.errstate(divide='ignore', invalid='ignore'):
    return ev.exe.batch_size / (compute + np.maximum(bubble, 0))


def _smallest_extra(ev, core):
  """A lower bound, over the axes a block's compute (shape ``core``) does
  not depend on, of the exposed time every concern adds to a block's
  forward and backward (``block_fw_extra_s + block_bw_extra_s``): the sum
  of each term's minimum over those axes (array broadcastable to
  ``core``)."""
  train = ev.training
  total = 0.0
  for kind in ('block_fw', 'block_bw'):
    for term in ev.concern_terms(kind):
      if kind == 'block_bw' and not (np.ndim(train) == 0 and train):
        term = np.where(train, term, 0)
      term = np.asarray(term)
      if term.ndim:
        shape = (1,) * (term.ndim - len(core)) + tuple(core)
        free = tuple(i for i in range(term.ndim)
                     if term.shape[i] > 1 and shape[i - term.ndim] == 1)
        if free:
          term = term.min(axis=free, keepdims=True)
      total = total + term
  return total


def max_bound(bound):
  """The largest entry of a bound array (+inf if any is NaN)."""
  bound = np.asarray(bound, dtype=float)
  if bound.size == 0:
    return -np.inf
  if np.isnan(bound).any():
    return np.inf
  return float(np.max(bound))


def reduced_values(group):
  """The group's axis values with the inner axes cut to ``False``."""
  values = dict(group.values)
  for name in INNER_AXES:
    values[name] = [False]
  return values


def reduced_group(group):
  """The group with its inner axes (:data:`INNER_AXES`) cut to one
  value: the grid the level-2 bound is computed on."""
  return Group(group.index, group.tp, group.pp, group.dp, group.batch_size,
               reduced_values(group), group.cp, group.axes)


def group_bound(spec, group):
  """The level-1 bound of every execution of ``group`` (the largest
  :func:`rate_bound` over its reduced grid; -inf for an empty group, +inf
  when it cannot be bounded)."""
  if group.size == 0:
    return -np.inf
  try:
    with np.errstate(all='ignore'):
      ev = Evaluation(spec.app, spec.system,
                      columns(spec, Chunk(reduced_group(group), ())))
      return max_bound(rate_bound(ev))
  except Exception:  # noqa: BLE001 -- never prune what cannot be bounded
    return np.inf


def reduced_bound(ev, dp_overlap_possible):
  """Upper bound of the sample rate of every inner combination of each
  cell of a reduced grid (``ev`` priced with offloads off and no DP
  overlap; array over the reduced grid, -inf where the cell is infeasible
  for a reason no inner option changes).

  Why it bounds: with the offloads off, the offload terms are 0 (they are
  >= 0 otherwise) and the base and edge block times, hence the bubble (see
  :func:`rate_bound`), are at their smallest; every other term but the DP
  one does not depend on the inner axes.  The DP term priced here is the
  non-overlapped one; with DP overlap it is the DP time of one block plus
  exposed parts that are >= 0 (Calculon's overlap model), so the bound
  takes the smaller of the two when DP overlap is an option.
  """
  total = ev.total_time_s
  if dp_overlap_possible:
    plain = ev.dp_comm_exposed_time_s
    one_block = np.where(ev.dp_reduces_at_end, ev.block_dp_time_s, 0)
    total = total - plain + np.minimum(plain, one_block)
  with np.errstate(divide='ignore', invalid='ignore'):
    rate = ev.exe.batch_size / total
  rate = np.where(np.isnan(rate), np.inf, rate)
  structural = np.isin(ev.compile_reason, _STRUCTURAL)
  return np.where(structural, -np.inf, rate)


def expand(cells, group, axes):
  """Flat executions of surviving cells: every inner combination of each.

  Args:
    cells: int array (K, len(axes)) of indices into the group's axes (the
      inner axes' index is ignored).
  Returns:
    int array (K x combinations, len(axes)) of full indices, in
    enumeration order within each cell.
  """
  inner = [axes.index(a) for a in INNER_AXES]
  ranges = [range(len(group.values[a])) for a in INNER_AXES]
  combos = np.array(list(itertools.product(*ranges)), dtype=np.int64)
  full = np.repeat(cells, len(combos), axis=0)
  full[:, inner] = np.tile(combos, (len(cells), 1))
  return full


def flat_columns(spec, group, full):
  """:class:`ExecutionColumns` (1-d) of the executions at full indices
  ``full`` (int array (K, axes)) of ``group``'s grid."""
  return grid_columns(spec, group, {
    name: axis_values(group, name)[full[:, i]]
    for i, name in enumerate(group.axes)})


def cell_columns(spec, group, cells):
  """:class:`ExecutionColumns` of every inner combination of ``cells`` (int
  array (C, axes)): shape (C, n_1, ..., n_4), the cells along the first
  dimension, each inner axis along its own (so the block, which does not
  depend on the inner axes, is priced once per cell).  Returns (columns,
  shape); C-order flattening matches :func:`expand`."""
  axes = group.axes
  inner = [axes.index(a) for a in INNER_AXES]
  shape = (len(cells),) + tuple(len(group.values[a]) for a in INNER_AXES)
  nd = len(shape)
  placed = {}
  for i, name in enumerate(axes):
    values = axis_values(group, name)
    dims = [1] * nd
    if i in inner:
      j = 1 + inner.index(i)
      dims[j] = len(values)
      placed[name] = values.reshape(dims)
    else:
      dims[0] = len(cells)
      placed[name] = values[cells[:, i]].reshape(dims)
  return grid_columns(spec, group, placed), shape


def price_flat(spec, cols, shape=None, source=None, index=None):
  """(rate, reason, tier-1 memory) arrays of executions (``shape``: their
  broadcast shape, default 1-d), isolating engine errors: a batch that
  raises is halved along its first dimension until the failing cells are
  found (reason ENGINE_ERROR).  ``source``, ``index``: an Evaluation whose block totals
  the cells reuse, and the cells' indices into its grid (see
  :meth:`~calculon.llm.terms.blocks.BlockTerms.reusing_totals`)."""
  if shape is None:
    shape = np.broadcast_shapes(*(np.shape(getattr(cols, f))
                                  for f in vars(cols)))
  shape = tuple(shape) or (1,)
  try:
    if source is None:
      ev = Evaluation(spec.app, spec.system, cols)
    else:
      ev = Evaluation.reusing_totals(source, cols, index)
    with np.errstate(all='ignore'):
      rate = np.broadcast_to(ev.sample_rate, shape).astype(float)
      reason = np.broadcast_to(ev.reason, shape).astype(np.int64)
      mem1 = np.broadcast_to(ev.mem1_bytes, shape).astype(float)
    bad = (reason == OK) & ~np.isfinite(rate)
    return rate, np.where(bad, NON_FINITE, reason), mem1
  except Exception:  # noqa: BLE001 -- isolate, count, go on
    n = shape[0]
    if n == 1:
      return (np.full(shape, np.nan), np.full(shape, ENGINE_ERROR),
              np.full(shape, np.nan))
    half = n // 2
    parts = []
    for sl in (slice(0, half), slice(half, n)):
      sub = ExecutionColumns(**{
        f: (getattr(cols, f)[sl] if np.ndim(getattr(cols, f)) and
            np.shape(getattr(cols, f))[0] == n else getattr(cols, f))
        for f in vars(cols)})
      parts.append(price_flat(
        spec, sub, (len(range(n)[sl]),) + shape[1:], source,
        None if index is None else [ix[sl] for ix in index]))
    return tuple(np.concatenate([p[j] for p in parts]) for j in range(3))


#: Cells of a level-2 grid priced at once.
L2_CELLS = 1 << 18


def search_group(spec, group, top_n, threshold_of):
  """Branch and bound over one group (see the module): the level-1 bound
  over the axes it depends on, then, in order of that bound, level-2
  bounds of the surviving level-1 cells over every other axis (the inner
  axes cut), then the full pricing of the surviving level-2 cells over
  every inner combination, in order of their bound.  The threshold is the
  larger of ``threshold_of()`` (the shared n-th best rate less the tie
  tolerance) and this group's own n-th best so far less the tie tolerance
  (:func:`~calculon.search.exhaustive.tie_tolerance`: every near tie is
  priced).

  Returns:
    :class:`~calculon.search.exhaustive.ChunkResult` (flat indices in
    ``group``'s full grid; ``pruned`` = valid executions not priced).
  """
  res = ChunkResult()
  axes = group.axes
  naxes = len(axes)
  reduced = reduced_group(group)
  base = columns(spec, Chunk(reduced, ()))
  # Valid executions of the group (every inner combination).
  for combo in itertools.product(*(group.values[a] for a in INNER_AXES)):
    values = dict(reduced.values)
    values.update({name: [value] for name, value in zip(INNER_AXES, combo)})
    fixed = Group(group.index, group.tp, group.pp, group.dp,
                  group.batch_size, values, group.cp, group.axes)
    res.total += count_valid(spec, columns(spec, Chunk(fixed, ())),
                             reduced.shape)

  tol = tie_tolerance(spec)

  def threshold():
    own = res.best[top_n - 1][0] if len(res.best) >= top_n else 0.0
    return max(threshold_of(), own * (1.0 - tol))

  ev1 = None
  try:
    with np.errstate(all='ignore'):
      ev1 = Evaluation(spec.app, spec.system, base)
      l1 = np.asarray(rate_bound(ev1), dtype=float)
  except Exception:  # noqa: BLE001 -- bound nothing, price everything
    ev1 = None
    l1 = np.full((1,) * naxes, np.inf)
  l1 = np.where(np.isnan(l1), np.inf, l1)
  if l1.ndim < naxes:
    l1 = l1.reshape((1,) * (naxes - l1.ndim) + l1.shape)
  dep = [i for i in range(naxes) if l1.shape[i] > 1]
  l1 = l1.reshape([l1.shape[i] for i in dep]) if dep else l1.reshape(())
  order = np.argsort(-l1.reshape(-1), kind='stable')
  bounds1 = l1.reshape(-1)[order]

  def level1_cells(sl):
    if not dep:
      return np.zeros((len(order[sl]), 0), dtype=np.int64)
    return np.stack(np.unravel_index(order[sl], l1.shape), axis=1)
  free = [i for i in range(naxes) if i not in dep]
  free_shape = [len(reduced.values[axes[i]]) for i in free]
  per_cell = int(np.prod(free_shape)) if free_shape else 1
  batch = max(1, L2_CELLS // max(per_cell, 1))
  priced = 0
  for start in range(0, len(order), batch):
    t = threshold()
    if t > 0 and bounds1[start] * (1 + PRUNE_MARGIN) < t:
      break
    part = level1_cells(slice(start, start + batch))
    part = part[bounds1[start:start + batch] * (1 + PRUNE_MARGIN) >= t] \
      if t > 0 else part
    if not len(part):
      continue
    # Level 2: the surviving level-1 cells along one leading dimension,
    # every other axis along its own.
    placed = {}
    k = len(part)
    for i, name in enumerate(axes):
      values = axis_values(reduced, name)
      shape = [1] * (naxes + 1)
      if i in dep:
        shape[0] = k
        placed[name] = values[part[:, dep.index(i)]].reshape(shape)
      else:
        shape[1 + i] = len(values)
        placed[name] = values.reshape(shape)
    grid = grid_columns(spec, reduced, placed)
    full_shape = (k,) + tuple(1 if i in dep else len(reduced.values[axes[i]])
                              for i in range(naxes))
    index = []
    for i in range(naxes):
      dims = [1] * (naxes + 1)
      if i in dep:
        dims[0] = k
        index.append(part[:, dep.index(i)].reshape(dims))
      else:
        dims[1 + i] = len(reduced.values[axes[i]])
        index.append(np.arange(dims[1 + i]).reshape(dims))
    try:
      with np.errstate(all='ignore'):
        if ev1 is None:
          ev2 = Evaluation(spec.app, spec.system, grid)
        else:
          ev2 = Evaluation.reusing_totals(ev1, grid, index)
        l2 = np.broadcast_to(reduced_bound(
          ev2, len(group.values['data_par_overlap']) > 1), full_shape)
        valid = np.broadcast_to(valid_mask(grid, spec), full_shape)
    except Exception:  # noqa: BLE001 -- never prune what cannot be bounded
      l2 = np.full(full_shape, np.inf)
      valid = np.ones(full_shape, dtype=bool)
    t = threshold()
    keep = valid & ((l2 * (1 + PRUNE_MARGIN) >= t) if t > 0 else True)
    idx = np.argwhere(keep)
    if not len(idx):
      continue
    lb = l2[keep]
    idx = idx[np.argsort(-lb, kind='stable')]
    lb = np.sort(lb)[::-1]
    cells = np.zeros((len(idx), naxes), dtype=np.int64)
    for j, i in enumerate(dep):
      cells[:, i] = part[idx[:, 0], j]
    for i in free:
      cells[:, i] = idx[:, 1 + i]
    # Full pricing of the surviving cells over the inner combinations,
    # best bound first.
    combos = int(np.prod([len(group.values[a]) for a in INNER_AXES]))
    step = max(1, FLAT_BATCH // combos)
    for s0 in range(0, len(cells), step):
      t = threshold()
      if t > 0 and lb[s0] * (1 + PRUNE_MARGIN) < t:
        break
      sub = cells[s0:s0 + step]
      sub = sub[lb[s0:s0 + step] * (1 + PRUNE_MARGIN) >= t] if t > 0 \
        else sub
      if not len(sub):
        continue
      gcols, gshape = cell_columns(spec, group, sub)
      inner_ndim = len(gshape) - 1
      rate, reason, mem1 = price_flat(
        spec, gcols, gshape, ev1,
        [sub[:, i].reshape((-1,) + (1,) * inner_ndim) for i in range(naxes)])
      ok = np.broadcast_to(valid_mask(gcols, spec), gshape).reshape(-1)
      full = expand(sub, group, axes)[ok]
      rate, reason = rate.reshape(-1)[ok], reason.reshape(-1)[ok]
      mem1 = np.broadcast_to(mem1, gshape).reshape(-1)[ok]
      if not len(full):
        continue
      res.add(spec, group, full, rate, reason, mem1, top_n)
      priced += len(full)
  res.pruned = res.total - res.evaluated
  return res
