"""Exhaustive search over execution strategies, vectorized.

The space is Calculon's (``llm-optimal-execution``): for every TP and PP, DP
is what is left, the batch is the largest multiple of DP not above the
maximum, and every combination of interleaving, recomputation, optimizer
sharding, TP communication type, all-gather redo, DP overlap, TP overlap,
the three offloads, fused activation, microbatch size and a network tier for
each parallelism is tried.

For one (TP, PP) *group* the options form a grid: each option varies along
its own numpy axis (:data:`AXES`, in Calculon's enumeration order), so the
engine computes every intermediate only over the axes it depends on.  Two
options depend on others (the all-gather redo needs 'rs_ag' without full
recomputation; activation offload is not tried with full recomputation):
their invalid combinations are masked out and never counted.  A grid is cut
into *chunks* along its leading axes to bound memory.

Order and ties: executions are ordered as Calculon enumerates them (TP, PP,
then the axes in :data:`AXES` order); the best are the highest sample rates,
and equal rates keep that order, exactly as Calculon's stable sort does.
"""

from dataclasses import dataclass, field
import logging

import numpy as np

from calculon.config import ExecutionColumns
from calculon.config.execution import (
  DATATYPE_NAMES, RECOMPUTE_FULL, RECOMPUTE_NAMES, TP_COMM_NAMES,
  TP_COMM_RS_AG, TP_OVERLAP_NAMES)
from calculon.llm import space
from calculon.llm.model import (
  Evaluation, REASON_NAMES, OK, NON_FINITE, ENGINE_ERROR)
from calculon.parallel import imap

#: Grid axes in Calculon's enumeration order (outermost first).
AXES = ('pipeline_interleaving', 'activation_recompute', 'optimizer_sharding',
        'tensor_par_comm_type', 'seq_par_ag_redo', 'data_par_overlap',
        'tensor_par_overlap', 'weight_offload', 'activations_offload',
        'optimizer_offload', 'fused_activation', 'microbatch_size',
        'tensor_par_net', 'pipeline_par_net', 'data_par_net')
AXIS = {name: i for i, name in enumerate(AXES)}
#: Axes a chunk may be cut along (the -m rule needs whole microbatch and
#: network axes inside a chunk).
CUTTABLE = AXIS['microbatch_size']
#: Codes of the ordered option values.
RECOMPUTE_ORDER = [RECOMPUTE_NAMES.index(n) for n in ('full', 'attn_only',
                                                      'none')]
TP_COMM_ORDER = [TP_COMM_NAMES.index(n) for n in ('ar', 'p2p_rs_ag', 'rs_ag')]
TP_OVERLAP_ORDER = [TP_OVERLAP_NAMES.index(n) for n in ('none', 'ring',
                                                        'pipe')]
DEFAULT_CHUNK = 1 << 17


@dataclass
class SearchSpec:
  """What to search.

  Attributes:
    app: Application; system: System.
    num_procs: processors; max_batch_size: samples; datatype: name.
    fused_activation: list of bools to try.
    mbs_break: Calculon's -m: within each combination of the other options,
      stop at the first microbatch size (ascending) with no feasible
      execution.
    allow_tp_overlap, allow_dp_overlap: try TP / DP overlap.
  """
  app: object
  system: object
  num_procs: int
  max_batch_size: int
  datatype: str
  fused_activation: list = field(default_factory=lambda: [True])
  mbs_break: bool = False
  allow_tp_overlap: bool = True
  allow_dp_overlap: bool = True


@dataclass
class Group:
  """One (TP, PP) grid: scalars and the values along each axis."""
  index: int
  tp: int
  pp: int
  dp: int
  batch_size: int
  values: dict      # axis name -> list of codes/values

  @property
  def shape(self):
    return tuple(len(self.values[a]) for a in AXES)

  @property
  def size(self):
    return int(np.prod(self.shape))


def groups(spec):
  """The (TP, PP) groups of the space, in Calculon's order."""
  app, system = spec.app, spec.system
  nets = list(range(system.num_networks))
  has_mem2 = system.mem2.capacity_bytes > 0
  out = []
  for tp in space.tensor_parallelisms(spec.num_procs, app.hidden,
                                      app.attn_heads):
    for pp in space.pipeline_parallelisms(spec.num_procs, tp, app.num_blocks):
      dp = space.data_parallelism(spec.num_procs, tp, pp)
      batch = space.batch_size_for(dp, spec.max_batch_size)
      if batch is None:
        continue
      mbs = space.microbatch_sizes(app.seq_size, tp, dp, batch)
      tf = [True, False]
      values = {
        'pipeline_interleaving': space.pipeline_interleavings(
          app.num_blocks, pp),
        'activation_recompute': RECOMPUTE_ORDER,
        'optimizer_sharding': tf if dp > 1 else [False],
        'tensor_par_comm_type': TP_COMM_ORDER,
        'seq_par_ag_redo': tf,
        'data_par_overlap': tf if dp > 1 and spec.allow_dp_overlap
        else [False],
        'tensor_par_overlap': TP_OVERLAP_ORDER
        if tp > 1 and spec.allow_tp_overlap else TP_OVERLAP_ORDER[:1],
        'weight_offload': tf if has_mem2 else [False],
        'activations_offload': tf if has_mem2 else [False],
        'optimizer_offload': tf if has_mem2 else [False],
        'fused_activation': list(spec.fused_activation),
        'microbatch_size': mbs,
        'tensor_par_net': nets if tp > 1 else [0],
        'pipeline_par_net': nets if pp > 1 else [0],
        'data_par_net': nets if dp > 1 else [0],
      }
      # The ppint axis with the (rarely) empty mbs list keeps size 0.
      out.append(Group(len(out), tp, pp, dp, batch, values))
  return out


def _axis_array(values, axis, dtype):
  shape = [1] * len(AXES)
  shape[axis] = len(values)
  return np.asarray(values, dtype=dtype).reshape(shape)


@dataclass
class Chunk:
  """A block of a group's grid: fixed values for the first ``len(prefix)``
  axes, the full range of the others.  ``offset`` is the flat (C-order)
  index of its first element in the group's grid."""
  group: Group
  prefix: tuple

  @property
  def shape(self):
    full = self.group.shape
    return (1,) * len(self.prefix) + full[len(self.prefix):]

  @property
  def size(self):
    return int(np.prod(self.shape))

  @property
  def offset(self):
    full = self.group.shape
    k = len(self.prefix)
    if k == 0:
      return 0
    return int(np.ravel_multi_index(self.prefix, full[:k])) * \
      int(np.prod(full[k:]))


def chunks(group, max_size=DEFAULT_CHUNK):
  """Cuts a group's grid along leading axes into chunks of at most
  ``max_size`` executions (never cutting the microbatch or network axes)."""
  shape = group.shape
  if group.size == 0:
    return []
  k = 0
  while k < CUTTABLE and int(np.prod(shape[k:])) > max_size:
    k += 1
  return [Chunk(group, tuple(int(i) for i in idx))
          for idx in np.ndindex(*shape[:k])]


def columns(spec, chunk):
  """:class:`ExecutionColumns` of a chunk (each axis its own dimension)."""
  g = chunk.group
  cols = {}
  scalars = {'num_procs': spec.num_procs, 'tensor_par': g.tp,
             'pipeline_par': g.pp, 'data_par': g.dp,
             'batch_size': g.batch_size}
  for name, value in scalars.items():
    cols[name] = np.int64(value)
  cols['datatype'] = np.int64(DATATYPE_NAMES.index(spec.datatype))
  cols['attention_type'] = np.int64(0)
  cols['training'] = np.bool_(True)
  k = len(chunk.prefix)
  for axis, name in enumerate(AXES):
    values = g.values[name]
    if axis < k:
      values = [values[chunk.prefix[axis]]]
    dtype = bool if name in _BOOL_AXES else np.int64
    cols[name] = _axis_array(values, axis, dtype)
  return ExecutionColumns(**cols)


_BOOL_AXES = {'optimizer_sharding', 'seq_par_ag_redo', 'data_par_overlap',
              'weight_offload', 'activations_offload', 'optimizer_offload',
              'fused_activation'}


def valid_mask(cols):
  """Combinations Calculon enumerates: redo only with rs_ag and without full
  recomputation; activation offload not with full recomputation."""
  full = cols.activation_recompute == RECOMPUTE_FULL
  redo_ok = ~cols.seq_par_ag_redo | (
    (cols.tensor_par_comm_type == TP_COMM_RS_AG) & ~full)
  offload_ok = ~cols.activations_offload | ~full
  return redo_ok & offload_ok


def mbs_break_mask(feasible, valid):
  """Calculon's -m rule on a chunk: for each combination of the options
  before the microbatch size, keep microbatch sizes before the first one
  (ascending) with no feasible execution on any network assignment."""
  axis = AXIS['microbatch_size']
  any_ok = feasible.any(axis=(axis + 1, axis + 2, axis + 3), keepdims=True)
  enumerated = valid.any(axis=(axis + 1, axis + 2, axis + 3), keepdims=True)
  # A combination that is not enumerated (masked) does not break.
  fails = enumerated & ~any_ok
  before = np.cumsum(fails, axis=axis) - fails == 0
  return np.broadcast_to(before, feasible.shape)


@dataclass
class ChunkResult:
  """Counts and best executions of one chunk.

  ``best``: list of (sample_rate, group index, flat index in the group).
  """
  total: int = 0
  evaluated: int = 0
  feasible: int = 0
  reasons: dict = field(default_factory=dict)
  best: list = field(default_factory=list)


def _rate_reason(spec, chunk):
  """Sample rates and reason codes of a chunk (arrays of ``chunk.shape``).

  If evaluating the chunk raises, it is cut along its next axis and the
  parts are evaluated separately, down to single executions; an execution
  that still raises gets reason ENGINE_ERROR (and is logged), so one bad
  candidate never stops a search.  Non-finite batch times get NON_FINITE.
  """
  shape = chunk.shape
  try:
    ev = Evaluation(spec.app, spec.system, columns(spec, chunk))
    with np.errstate(all='ignore'):
      rate = np.broadcast_to(ev.sample_rate, shape)
      reason = np.broadcast_to(ev.reason, shape)
      bad = (reason == OK) & ~np.isfinite(rate)
    if bad.any():
      reason = np.where(bad, NON_FINITE, reason)
    return rate, reason
  except Exception as err:  # noqa: BLE001 -- isolate, count, go on
    k = len(chunk.prefix)
    if k == len(AXES):
      record = execution_record(spec, chunk.group, chunk.offset)
      logging.getLogger('calculon').error(
        'engine error for execution %s: %s: %s', record,
        type(err).__name__, err)
      return np.full(shape, np.nan), np.full(shape, ENGINE_ERROR)
    parts = [_rate_reason(spec, Chunk(chunk.group, chunk.prefix + (i,)))
             for i in range(chunk.group.shape[k])]
    return (np.concatenate([p[0] for p in parts], axis=k),
            np.concatenate([p[1] for p in parts], axis=k))


def evaluate_chunk(spec, chunk, top_n):
  """Evaluates a chunk; returns a :class:`ChunkResult` with its top-n."""
  shape = chunk.shape
  valid = np.broadcast_to(valid_mask(columns(spec, chunk)), shape)
  rate, reason = _rate_reason(spec, chunk)
  feasible = (reason == OK) & valid
  considered = valid
  if spec.mbs_break:
    considered = valid & mbs_break_mask(feasible, valid)
    feasible = feasible & considered
  res = ChunkResult(total=int(valid.sum()), evaluated=int(considered.sum()),
                    feasible=int(feasible.sum()))
  codes, counts = np.unique(reason[considered & ~feasible], return_counts=True)
  res.reasons = {int(c): int(n) for c, n in zip(codes, counts)}
  res.best = top_of(rate, feasible, top_n, chunk)
  return res


def top_of(rate, feasible, top_n, chunk):
  """The ``top_n`` best feasible entries of a chunk as (rate, group, flat)
  tuples, ties kept in enumeration order."""
  flat_rate = rate.reshape(-1)
  idx = np.flatnonzero(feasible.reshape(-1))
  if len(idx) == 0:
    return []
  vals = flat_rate[idx]
  if len(idx) > top_n:
    kth = np.partition(vals, len(vals) - top_n)[len(vals) - top_n]
    keep = vals >= kth
    idx, vals = idx[keep], vals[keep]
  order = np.lexsort((idx, -vals))[:top_n]
  offset = chunk.offset
  return [(float(vals[o]), chunk.group.index, offset + int(idx[o]))
          for o in order]


def merge_best(best, more, top_n):
  """Merges two best lists (rate desc, then enumeration order)."""
  merged = sorted(best + more, key=lambda t: (-t[0], t[1], t[2]))
  return merged[:top_n]


def execution_record(spec, group, flat):
  """The execution (Calculon JSON dict) at ``flat`` in ``group``'s grid."""
  idx = np.unravel_index(flat, group.shape)
  rec = {'num_procs': spec.num_procs, 'tensor_par': group.tp,
         'pipeline_par': group.pp, 'data_par': group.dp}
  vals = {name: group.values[name][int(i)] for name, i in zip(AXES, idx)}
  rec.update({
    'tensor_par_net': int(vals['tensor_par_net']),
    'pipeline_par_net': int(vals['pipeline_par_net']),
    'data_par_net': int(vals['data_par_net']),
    'batch_size': group.batch_size,
    'microbatch_size': int(vals['microbatch_size']),
    'datatype': spec.datatype,
    'fused_activation': bool(vals['fused_activation']),
    'attention_type': 'multihead',
    'activation_recompute': RECOMPUTE_NAMES[vals['activation_recompute']],
    'pipeline_interleaving': int(vals['pipeline_interleaving']),
    'optimizer_sharding': bool(vals['optimizer_sharding']),
    'tensor_par_comm_type': TP_COMM_NAMES[vals['tensor_par_comm_type']],
    'tensor_par_overlap': TP_OVERLAP_NAMES[vals['tensor_par_overlap']],
    'seq_par_ag_redo': bool(vals['seq_par_ag_redo']),
    'data_par_overlap': bool(vals['data_par_overlap']),
    'weight_offload': bool(vals['weight_offload']),
    'activations_offload': bool(vals['activations_offload']),
    'optimizer_offload': bool(vals['optimizer_offload']),
    'training': True,
  })
  return rec


def valid_count(spec, group):
  """Executions of a group Calculon enumerates (valid combinations)."""
  if group.size == 0:
    return 0
  cols = columns(spec, Chunk(group, ()))
  mask = valid_mask(cols)
  # The mask varies along few axes: count there, scale by the others.
  other = int(np.prod([n for n, m in zip(group.shape, np.shape(mask))
                       if m == 1]))
  return int(np.sum(mask)) * other


def count_space(spec):
  """Number of executions Calculon would enumerate (without -m)."""
  return sum(valid_count(spec, g) for g in groups(spec))


def reason_summary(reasons):
  """{reason name: count} from {reason code: count}."""
  return {REASON_NAMES.get(code, str(code)): n for code, n in
          sorted(reasons.items())}




# -- running a search on worker processes --------------------------------------

@dataclass
class SearchResult:
  """Outcome of a search.

  Attributes:
    best: [(sample_rate, group index, flat index)], best first.
    total: executions in the space; evaluated: considered (fewer with -m);
    feasible: feasible among those; reasons: {reason code: count} of the
    infeasible ones; elapsed_s: wall time; partial: interrupted before the
    end; groups: the space's groups (to rebuild executions).
  """
  best: list
  total: int
  evaluated: int
  feasible: int
  reasons: dict
  elapsed_s: float
  partial: bool
  groups: list

  @property
  def rate_per_s(self):
    """Executions evaluated per second of wall time."""
    return self.evaluated / self.elapsed_s if self.elapsed_s > 0 else 0.0


_WORKER = {}


def _setup(spec, groups_, top_n, chunk_size):
  _WORKER.update(spec=spec, groups=groups_, top_n=top_n, chunk=chunk_size)


def _best_task(task):
  gi, prefix = task
  spec, g = _WORKER['spec'], _WORKER['groups'][gi]
  return evaluate_chunk(spec, Chunk(g, prefix), _WORKER['top_n'])


def tasks_of(groups_, chunk_size):
  """(group index, chunk prefix) of every chunk, in enumeration order."""
  return [(g.index, c.prefix) for g in groups_ for c in chunks(g, chunk_size)]


def optimal_executions(spec, top_n=1, workers=1, chunk_size=DEFAULT_CHUNK,
                       on_progress=None):
  """Searches the whole space and keeps the ``top_n`` fastest executions.

  Memory is O(top_n + chunk) per process.  Ctrl-C (KeyboardInterrupt) stops
  the search and returns what was found, with ``partial=True``.

  Args:
    spec: :class:`SearchSpec`.
    top_n: how many best executions to keep.
    workers: processes.
    chunk_size: maximum executions per chunk.
    on_progress: called with the number of executions of each finished chunk.
  """
  import time
  start = time.perf_counter()
  groups_ = groups(spec)
  total = sum(valid_count(spec, g) for g in groups_)
  best, evaluated, feasible, reasons = [], 0, 0, {}
  partial = False
  try:
    for res in imap(_best_task, tasks_of(groups_, chunk_size), workers,
                    initializer=_setup,
                    initargs=(spec, groups_, top_n, chunk_size),
                    ordered=False):
      best = merge_best(best, res.best, top_n)
      evaluated += res.evaluated
      feasible += res.feasible
      for code, n in res.reasons.items():
        reasons[code] = reasons.get(code, 0) + n
      if on_progress is not None:
        on_progress(res.total)
  except KeyboardInterrupt:
    partial = True
  return SearchResult(best, total, evaluated, feasible, reasons,
                      time.perf_counter() - start, partial, groups_)


def _rows_task(task):
  gi, prefix = task
  spec, g = _WORKER['spec'], _WORKER['groups'][gi]
  return chunk_rows(spec, Chunk(g, prefix))


def chunk_rows(spec, chunk):
  """Every feasible execution of a chunk with all its statistics.

  Returns:
    (columns dict name -> 1-d array in enumeration order, total executions,
    infeasible reason counts).  Execution fields hold Calculon values
    (strings for categorical fields).  A part of the chunk that makes the
    engine raise is isolated as in :func:`evaluate_chunk` and counted as
    ENGINE_ERROR.
  """
  from calculon.config.execution import FIELD_SPECS
  from calculon.llm.stats import stat_arrays
  cols = columns(spec, chunk)
  shape = chunk.shape
  valid = np.broadcast_to(valid_mask(cols), shape)
  try:
    ev = Evaluation(spec.app, spec.system, cols)
    with np.errstate(all='ignore'):
      reason = np.broadcast_to(ev.reason, shape)
      rate = np.broadcast_to(ev.sample_rate, shape)
      reason = np.where((reason == OK) & ~np.isfinite(rate), NON_FINITE,
                        reason)
      keep = valid & (reason == OK)
      out = {}
      for name, (fspec, names) in FIELD_SPECS.items():
        arr = np.broadcast_to(getattr(cols, name), shape)[keep]
        out[name] = np.asarray(names, dtype=object)[arr] if names else arr
      for name, arr in stat_arrays(ev).items():
        out[name] = arr[keep]
  except Exception:  # noqa: BLE001 -- isolate the failing executions
    k = len(chunk.prefix)
    if k == len(AXES):
      _rate_reason(spec, chunk)  # logs the error
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


def all_executions(spec, workers=1, chunk_size=DEFAULT_CHUNK // 4):
  """Yields, in enumeration order, one (columns, total, reasons) per chunk
  (see :func:`chunk_rows`); at most a few chunks are in memory at once."""
  groups_ = groups(spec)
  yield from imap(_rows_task, tasks_of(groups_, chunk_size), workers,
                  initializer=_setup, initargs=(spec, groups_, 0, chunk_size),
                  ordered=True)
