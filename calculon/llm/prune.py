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
* :func:`evaluate_survivors`: the cells whose bound reaches the threshold
  are expanded over the inner axes and priced in full, as flat batches.

Every bound is a true lower bound of ``Evaluation.total_time_s`` (each
function says why), so the top-n is exactly the exhaustive search's; a
brute-force test checks it.
"""

import itertools

import numpy as np

from calculon.config import ExecutionColumns
from calculon.llm.model import (
  Evaluation, OK, NON_FINITE, ENGINE_ERROR, NETWORK_TOO_SMALL,
  NETWORK_NOT_FILLED, INTERLEAVING_TOO_LARGE, INTERLEAVING_NOT_FACTOR)

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
  plus the pipeline bubble those compute times alone would make: every
  other term of ``total_time_s`` (exposed communication, offload, the
  embedding and LM head...) is >= 0, the real base and edge block times are
  >= their compute, and the bubble grows with them (its coefficients
  (PP - 1 + extra) (blocks per chunk - 1) - reduction / 2 and PP - 1 +
  extra - reduction / 2 are >= 0 because the reduction is at most PP - 1
  blocks).  So batch / bound >= every sample rate the executions reach.
  """
  b = ev.block
  train = ev.training
  fw = b.fw_time
  bw = np.where(train, b.re_time + b.agrad_time + b.wgrad_time, 0)
  per_block = fw + bw
  compute = ev._mult * per_block + np.where(
    train, ev.blocks_per_proc * b.optim_time, 0)
  pp, nmb = ev.pp, ev.num_microbatches
  missing = nmb % pp
  extra = np.where(missing != 0, (ev.interleaving - 1) * (pp - missing), 0)
  bpc = ev.blocks_per_chunk
  red = ev.bubble_reduction_blocks
  bubble = ((pp - 1 + extra) * bpc - red) * per_block
  with np.errstate(divide='ignore', invalid='ignore'):
    return ev.exe.batch_size / (compute + np.maximum(bubble, 0))


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
    one_block = np.where(ev._dp_active, ev.block_dp_time_s, 0)
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


def flat_columns(spec, group, full, base_cols):
  """:class:`ExecutionColumns` (1-d) of the executions at full indices
  ``full`` of ``group``'s grid; ``base_cols`` gives the scalar columns."""
  from calculon.llm.search import _BOOL_AXES
  cols = {}
  for name in vars(base_cols):
    cols[name] = getattr(base_cols, name)
  for i, name in enumerate(group.axes):
    values = np.asarray(group.values[name],
                        dtype=bool if name in _BOOL_AXES else np.int64)
    cols[name] = values[full[:, i]]
  cols['optimizer_sharding'] = None
  return ExecutionColumns(**cols)


def price_flat(spec, cols):
  """(rate, reason) arrays of 1-d executions, isolating engine errors: a
  batch that raises is halved until the failing executions are found
  (reason ENGINE_ERROR)."""
  n = np.broadcast_shapes(*(np.shape(getattr(cols, f)) for f in vars(cols)))
  n = n[0] if n else 1
  try:
    ev = Evaluation(spec.app, spec.system, cols)
    with np.errstate(all='ignore'):
      rate = np.broadcast_to(ev.sample_rate, (n,)).astype(float)
      reason = np.broadcast_to(ev.reason, (n,)).astype(np.int64)
    bad = (reason == OK) & ~np.isfinite(rate)
    return rate, np.where(bad, NON_FINITE, reason)
  except Exception:  # noqa: BLE001 -- isolate, count, go on
    if n == 1:
      return np.full(1, np.nan), np.full(1, ENGINE_ERROR)
    half = n // 2
    parts = []
    for sl in (slice(0, half), slice(half, n)):
      sub = ExecutionColumns(**{
        f: (getattr(cols, f)[sl] if np.ndim(getattr(cols, f)) else
            getattr(cols, f)) for f in vars(cols)})
      parts.append(price_flat(spec, sub))
    return (np.concatenate([p[0] for p in parts]),
            np.concatenate([p[1] for p in parts]))
