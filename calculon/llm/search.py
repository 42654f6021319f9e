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
from calculon.config._schema import Reader
from calculon.config.execution import (
  ATTENTION_AUTO, ATTENTION_KERNEL_NAMES, CHECKPOINT_AS_INPUT, DATATYPE_NAMES,
  DISPATCHER_NAMES,
  MOE_OVERLAP_NAMES, NARROW_DATATYPES, OPTIMIZER_TRAFFIC_FUSED_ADAM,
  PRECISION_RECIPE_NAMES, RECOMPUTE_FULL, RECOMPUTE_MODULE_SETS,
  RECOMPUTE_NAMES, SCALING_NAMES, CROSS_ENTROPY_NAMES, OPTIONAL_SPECS,
  recompute_modules_label,
  SHARDING_NAMES, TP_COMM_NAMES, TP_COMM_RS_AG, TP_OVERLAP_NAMES, UNSET)
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
#: Grid axes of the modern space: Calculon's, with the sharding level in
#: place of optimizer_sharding, the attention kernel, and the CP tier.
MODERN_AXES = ('pipeline_interleaving', 'activation_recompute',
               'data_par_sharding', 'attention_kernel', 'tensor_par_comm_type',
               'seq_par_ag_redo', 'data_par_overlap', 'tensor_par_overlap',
               'weight_offload', 'activations_offload', 'optimizer_offload',
               'fused_activation', 'microbatch_size', 'tensor_par_net',
               'pipeline_par_net', 'data_par_net', 'context_par_net')
#: Grid axes of the modern space for a Mixture-of-Experts application: the
#: expert-parallel degree, its TP, the dispatcher, the overlap of its
#: communication and its tier join.
MOE_AXES = MODERN_AXES[:4] + ('expert_par', 'expert_tensor_par',
                              'moe_dispatcher', 'moe_comm_overlap') + \
  MODERN_AXES[4:] + ('expert_par_net',)
AXIS = {name: i for i, name in enumerate(AXES)}
#: Axes a chunk may be cut along (the -m rule needs whole microbatch and
#: network axes inside a chunk).
CUTTABLE = AXIS['microbatch_size']
#: Codes of the ordered option values.
RECOMPUTE_ORDER = [RECOMPUTE_NAMES.index(n) for n in ('full', 'attn_only',
                                                      'none')]
MODERN_RECOMPUTE_ORDER = [RECOMPUTE_NAMES.index(n) for n in (
  'full', 'attn_only', 'selective', 'none')]
TP_COMM_ORDER = [TP_COMM_NAMES.index(n) for n in ('ar', 'p2p_rs_ag', 'rs_ag')]
TP_OVERLAP_ORDER = [TP_OVERLAP_NAMES.index(n) for n in ('none', 'ring',
                                                        'pipe')]
SHARDING_ORDER = [SHARDING_NAMES.index(n) for n in (
  'none', 'optimizer', 'gradients', 'parameters')]
KERNEL_ORDER = [ATTENTION_KERNEL_NAMES.index(n) for n in ('standard',
                                                          'flash')]
DEFAULT_CHUNK = 1 << 17
#: Chunk size of the modern space: its per-chunk work (the blocks, the
#: embedding and the head) is larger, so larger chunks amortize it.
MODERN_CHUNK = 1 << 19
#: Cells of the reduced grid per task of the pruned modern search (each
#: cell stands for up to 16 executions).
REDUCED_CHUNK = 1 << 20
#: Relative margin of the pruning test against rounding in the bounds.
PRUNE_MARGIN = 1e-9
SPACES = ('auto', 'calculon', 'modern')


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
    space: 'calculon' (Calculon's space exactly), 'modern' (also CP degrees
      and tiers, the four sharding levels, the FlashAttention kernel,
      selective recomputation, and PP degrees that do not divide the
      blocks), or 'auto' (Calculon's for a Calculon application, else
      modern).
    precision_recipe, gradient_datatype: fixed execution fields of every
      candidate of the modern space (None: 'transformer_engine' for a
      narrow datatype, else 'uniform'; 'float32' gradients).
    quantization_scaling: the casts' scaling of every candidate of the
      modern space ('delayed', 'current' or 'block'; acts only with the
      Transformer Engine recipe).
    recompute_modules: the modules selective recomputation recomputes in
      every selective candidate of the modern space (a list among
      :data:`~calculon.config.execution.RECOMPUTE_MODULES`; None: the
      attention core, Korthikanti et al.'s).
    fsdp_buffer_copies: FSDP candidates of the modern space copy the
      gathered weights and the gradients on the compute stream (PyTorch
      FSDP2; the other candidates' records leave it out).
    cross_entropy_kernel: the loss's kernels in every candidate of the
      modern space ('fused' or 'unfused').
    moe_probs_in_activation: with experts, every candidate of the modern
      space applies the router probabilities in the experts' activation
      (Megatron-Core since core_v0.13.0; see the execution field).
    prune: skip chunks whose best possible sample rate is below the n-th
      best found so far (exact, see :func:`chunk_rate_bound`; modern space
      only).
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
  space: str = 'auto'
  precision_recipe: object = None
  gradient_datatype: object = 'float32'
  quantization_scaling: str = 'delayed'
  recompute_modules: object = None
  fsdp_buffer_copies: bool = False
  cross_entropy_kernel: str = 'fused'
  moe_probs_in_activation: bool = True
  prune: bool = True

  def __post_init__(self):
    if self.space == 'auto':
      self.space = 'calculon' if self.app.is_calculon else 'modern'
    if self.precision_recipe is None:
      self.precision_recipe = 'transformer_engine' \
        if self.datatype in NARROW_DATATYPES else 'uniform'
    # Checked as an execution field is (one-line ConfigError).
    Reader({'cross_entropy_kernel': self.cross_entropy_kernel},
           '<search>').get('cross_entropy_kernel',
                           OPTIONAL_SPECS['cross_entropy_kernel'][0])
    if self.recompute_modules is not None:
      self.recompute_modules = recompute_modules_label(
        self.recompute_modules, source='<search>',
        field='recompute_modules').split(',')

  @property
  def modern(self):
    return self.space == 'modern'

  @property
  def axes(self):
    if not self.modern:
      return AXES
    return MOE_AXES if self.app.is_moe else MODERN_AXES


@dataclass
class Group:
  """One (TP, PP, CP) grid: scalars and the values along each axis."""
  index: int
  tp: int
  pp: int
  dp: int
  batch_size: int
  values: dict      # axis name -> list of codes/values
  cp: int = 1
  axes: tuple = AXES

  @property
  def shape(self):
    return tuple(len(self.values[a]) for a in self.axes)

  @property
  def size(self):
    return int(np.prod(self.shape))

  @property
  def cuttable(self):
    """Leading axes a chunk may be cut along (not the microbatch size or
    the network tiers after it)."""
    return self.axes.index('microbatch_size')


def _option_values(spec, tp, pp, dp, dp_group, mbs, nets, has_mem2):
  """Values of the axes both spaces share, for one group (``dp_group``:
  the ranks DP communication spans, DP x CP)."""
  tf = [True, False]
  return {
    'tensor_par_comm_type': TP_COMM_ORDER,
    'seq_par_ag_redo': tf,
    'data_par_overlap': tf if dp_group > 1 and spec.allow_dp_overlap
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


def _calculon_groups(spec):
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
      values = _option_values(spec, tp, pp, dp, dp, mbs, nets, has_mem2)
      values.update({
        'pipeline_interleaving': space.pipeline_interleavings(
          app.num_blocks, pp),
        'activation_recompute': RECOMPUTE_ORDER,
        'optimizer_sharding': [True, False] if dp > 1 else [False],
      })
      # The ppint axis with the (rarely) empty mbs list keeps size 0.
      out.append(Group(len(out), tp, pp, dp, batch, values))
  return out


def _modern_groups(spec):
  """(TP, PP, CP) groups of the modern space: TP divides the hidden size,
  the heads, the feedforward width and fits the K/V heads (a multiple or a
  divisor of them); PP up to the blocks (blocks / PP rounded up per stage);
  CP with 2 CP dividing the sequence; DP the processors left."""
  app, system = spec.app, spec.system
  nets = list(range(system.num_networks))
  has_mem2 = system.mem2.capacity_bytes > 0
  kv = app.kv_heads
  n = spec.num_procs
  out = []
  for tp in space.factors(n):
    if app.hidden % tp or app.attn_heads % tp or app.feedforward % tp:
      continue
    if kv is not None and kv % tp and tp % kv:
      continue
    for pp in space.factors(n // tp):
      if pp > app.num_blocks:
        continue
      for cp in space.factors(n // (tp * pp)):
        if cp > 1 and app.seq_size % (2 * cp):
          continue
        dp = n // (tp * pp * cp)
        batch = space.batch_size_for(dp, spec.max_batch_size)
        if batch is None:
          continue
        seq = app.seq_size // cp
        mbs = [c for c in space.factors(batch // dp) if (c * seq) % tp == 0]
        bpp = -(-app.num_blocks // pp)
        dpcp = dp * cp
        values = _option_values(spec, tp, pp, dp, dpcp, mbs, nets, has_mem2)
        values.update({
          'pipeline_interleaving': space.factors(bpp) if pp > 1 else [1],
          'activation_recompute': MODERN_RECOMPUTE_ORDER,
          'data_par_sharding': SHARDING_ORDER if dpcp > 1
          else SHARDING_ORDER[:1],
          'attention_kernel': KERNEL_ORDER,
          'context_par_net': nets if cp > 1 else [0],
        })
        if app.is_moe:
          folded = tp * dp * cp
          values['expert_par'] = [e for e in space.factors(app.num_experts)
                                  if folded % e == 0]
          values['expert_tensor_par'] = sorted(
            {1, tp} & {t for t in space.factors(tp)
                       if app.moe_ffn_hidden % t == 0})
          values['moe_dispatcher'] = list(range(len(DISPATCHER_NAMES)))
          values['moe_comm_overlap'] = list(range(len(MOE_OVERLAP_NAMES)))
          values['expert_par_net'] = nets
        out.append(Group(len(out), tp, pp, dp, batch, values, cp, spec.axes))
  return out


def groups(spec):
  """The (TP, PP[, CP]) groups of the space, in enumeration order."""
  return _modern_groups(spec) if spec.modern else _calculon_groups(spec)


def _axis_array(values, axis, dtype, naxes=len(AXES)):
  shape = [1] * naxes
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
  while k < group.cuttable and int(np.prod(shape[k:])) > max_size:
    k += 1
  return [Chunk(group, tuple(int(i) for i in idx))
          for idx in np.ndindex(*shape[:k])]


def columns(spec, chunk):
  """:class:`ExecutionColumns` of a chunk (each axis its own dimension)."""
  g = chunk.group
  axes = g.axes
  cols = {}
  scalars = {'num_procs': spec.num_procs, 'tensor_par': g.tp,
             'pipeline_par': g.pp, 'data_par': g.dp,
             'batch_size': g.batch_size}
  for name, value in scalars.items():
    cols[name] = np.int64(value)
  cols['datatype'] = np.int64(DATATYPE_NAMES.index(spec.datatype))
  cols['attention_type'] = np.int64(0 if spec.app.kv_heads is None
                                    else ATTENTION_AUTO)
  cols['training'] = np.bool_(True)
  if spec.modern:
    cols['context_par'] = np.int64(g.cp)
    cols['precision_recipe'] = np.int64(PRECISION_RECIPE_NAMES.index(
      spec.precision_recipe))
    cols['gradient_datatype'] = np.int64(
      UNSET if spec.gradient_datatype is None
      else DATATYPE_NAMES.index(spec.gradient_datatype))
    cols['quantization_scaling'] = np.int64(SCALING_NAMES.index(
      spec.quantization_scaling))
    if spec.recompute_modules is not None:
      # Acts only where activation_recompute is selective (the engine
      # reads it so); records of the others leave it out.
      cols['recompute_modules'] = np.int64(RECOMPUTE_MODULE_SETS.index(
        ','.join(spec.recompute_modules)))
    cols['cross_entropy_kernel'] = np.int64(CROSS_ENTROPY_NAMES.index(
      spec.cross_entropy_kernel))
    if spec.fsdp_buffer_copies:
      # Acts only with data_par_sharding 'parameters' (the engine reads it
      # so); records of the others leave it out.
      cols['fsdp_buffer_copies'] = np.bool_(True)
    if spec.app.is_moe and spec.moe_probs_in_activation:
      cols['moe_probs_in_activation'] = np.bool_(True)
    cols['optimizer_sharding'] = None
    # Modern frameworks checkpoint the block input as each rank holds it
    # (sequence-sharded with sequence parallelism).
    cols['checkpoint_layout'] = np.int64(CHECKPOINT_AS_INPUT)
    # Modern frameworks overlapping DP communication also gather the
    # updated weights behind the next forward pass (Megatron-Core
    # --overlap-param-gather); it acts only with data_par_overlap.
    cols['param_gather_overlap'] = np.bool_(True)
    # Their column-parallel linear layers hide the backward TP all-reduce
    # (reduce-scatter, redone all-gather) behind their GEMMs (Megatron-LM
    # LinearWithGradAccumulationAndAsyncCommunication, Transformer Engine
    # Linear); it acts only with TP > 1 and tensor_par_overlap 'none'.
    cols['tensor_par_async_backward'] = np.bool_(True)
    # Their interleaved schedule overlaps the pipeline transfers of the
    # 1F1B steady state (Megatron-Core --overlap-p2p-communication, on by
    # default); it acts only with PP > 1 and interleaving.
    cols['pipeline_par_overlap'] = np.bool_(True)
    # Their optimizer step makes every pass of a mixed-precision Adam step
    # (gradient norm, fused Adam, the copy into the 16-bit weights).
    cols['optimizer_traffic'] = np.int64(OPTIMIZER_TRAFFIC_FUSED_ADAM)
    # With dropout, the residual addition's kernel applies it (Megatron-LM
    # bias_dropout_add_fused_train, on by default).
    if spec.app.dropout:
      cols['fused_dropout_add'] = np.bool_(True)
    # Transformer Engine all-gathers the quantized GEMM inputs of a narrow
    # recipe (the FP8 norm output, the FP8 output gradient: TE
    # module/layernorm_linear.py, module/base.py grad_output_preprocess).
    cols['tensor_par_narrow_all_gather'] = np.bool_(
      spec.precision_recipe == 'transformer_engine')
    # Where PP divides the blocks plus two and not the blocks alone, the
    # split counts the embedding and the LM head as a block each
    # (Megatron-Core --account-for-embedding-in-pipeline-split and
    # --account-for-loss-in-pipeline-split: its only even split then).
    if spec.app.has_vocab and space.only_vocab_split_is_even(
        spec.app.num_blocks, g.pp):
      cols['pipeline_split_counts_vocab'] = np.bool_(True)
  k = len(chunk.prefix)
  for axis, name in enumerate(axes):
    values = g.values[name]
    if axis < k:
      values = [values[chunk.prefix[axis]]]
    dtype = bool if name in _BOOL_AXES else np.int64
    cols[name] = _axis_array(values, axis, dtype, len(axes))
  return ExecutionColumns(**cols)


_BOOL_AXES = {'optimizer_sharding', 'seq_par_ag_redo', 'data_par_overlap',
              'weight_offload', 'activations_offload', 'optimizer_offload',
              'fused_activation'}


def valid_mask(cols):
  """Combinations Calculon enumerates: redo only with rs_ag and without full
  recomputation; activation offload not with full recomputation.  Modern
  space with experts: EP x ETP divides TP x DP x CP, and without expert
  parallelism (EP = 1) only the first dispatcher, overlap and tier (they
  would price the same execution again)."""
  full = cols.activation_recompute == RECOMPUTE_FULL
  redo_ok = ~cols.seq_par_ag_redo | (
    (cols.tensor_par_comm_type == TP_COMM_RS_AG) & ~full)
  offload_ok = ~cols.activations_offload | ~full
  ok = redo_ok & offload_ok
  ep = cols.expert_par
  if np.ndim(ep) == 0 and ep == 1 and np.ndim(cols.expert_tensor_par) == 0:
    return ok
  folded = cols.tensor_par * cols.data_par * cols.context_par
  fits = folded % (ep * cols.expert_tensor_par) == 0
  single = (ep > 1) | ((cols.moe_dispatcher == 0) &
                       (cols.moe_comm_overlap == 0) &
                       (cols.expert_par_net == 0))
  return ok & fits & single


def mbs_break_mask(feasible, valid, axes=AXES):
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
  pruned: int = 0

  def add(self, group, cells, rate, reason, top_n):
    """Counts executions priced at the grid indices ``cells`` (int array
    (n, axes)) of ``group``, with their sample rates and reason codes
    (arrays (n,)), and keeps the ``top_n`` best feasible ones (ties by
    flat index, Calculon's order)."""
    feasible = reason == OK
    self.evaluated += len(cells)
    self.feasible += int(feasible.sum())
    codes, n = np.unique(reason[~feasible], return_counts=True)
    for c, m in zip(codes, n):
      self.reasons[int(c)] = self.reasons.get(int(c), 0) + int(m)
    if feasible.any():
      flat = np.ravel_multi_index(cells[feasible].T, group.shape)
      vals = rate[feasible]
      order = np.lexsort((flat, -vals))[:top_n]
      self.best = merge_best(self.best, [
        (float(vals[o]), group.index, int(flat[o])) for o in order], top_n)


def _rate_reason(spec, chunk, ev=None):
  """Sample rates and reason codes of a chunk (arrays of ``chunk.shape``).

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
      bad = (reason == OK) & ~np.isfinite(rate)
    if bad.any():
      reason = np.where(bad, NON_FINITE, reason)
    return rate, reason
  except Exception as err:  # noqa: BLE001 -- isolate, count, go on
    k = len(chunk.prefix)
    if k == len(chunk.group.axes):
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
    considered = valid & mbs_break_mask(feasible, valid, chunk.group.axes)
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


def _count_valid(cols, shape):
  """Valid executions among the broadcast grid ``shape`` of ``cols``."""
  mask = valid_mask(cols)
  other = int(np.prod([n for n, m in zip(
    shape, np.shape(mask) or (1,) * len(shape)) if m == 1]))
  return int(np.sum(mask)) * other


def evaluate_reduced_chunk(spec, chunk, top_n, threshold, group):
  """Branch and bound on a chunk of a group's reduced grid (inner axes
  cut to one value, :mod:`calculon.llm.prune`): bounds every cell, then
  prices in full, over every inner combination, the cells whose bound
  reaches ``threshold`` (the n-th best rate so far; 0: no pruning).

  Returns:
    :class:`ChunkResult` whose flat indices refer to ``group``'s full grid.
  """
  import itertools
  from calculon.llm import prune as P
  shape = chunk.shape
  axes = group.axes
  cols = columns(spec, chunk)
  res = ChunkResult()
  # Valid executions of the chunk over every inner combination.
  for combo in itertools.product(*(group.values[a] for a in P.INNER_AXES)):
    for name, value in zip(P.INNER_AXES, combo):
      setattr(cols, name, np.bool_(value))
    res.total += _count_valid(cols, shape)
  cols = columns(spec, chunk)
  try:
    ev = Evaluation(spec.app, spec.system, cols)
    with np.errstate(all='ignore'):
      bound = np.broadcast_to(P.reduced_bound(
        ev, len(group.values['data_par_overlap']) > 1), shape).reshape(-1)
  except Exception:  # noqa: BLE001 -- never prune what cannot be bounded
    bound = np.full(int(np.prod(shape)), np.inf)
  keep = np.flatnonzero(bound * (1 + P.PRUNE_MARGIN) >= threshold)
  if len(keep):
    cells = np.stack(np.unravel_index(keep, shape), axis=1)
    cells[:, :len(chunk.prefix)] += np.asarray(chunk.prefix, dtype=np.int64)
    survivors = P.expand(cells, group, axes)
    base = columns(spec, Chunk(group, ()))
    for start in range(0, len(survivors), P.FLAT_BATCH):
      part = survivors[start:start + P.FLAT_BATCH]
      pcols = P.flat_columns(spec, group, part, base)
      valid = np.broadcast_to(valid_mask(pcols), (len(part),))
      if not valid.all():
        part = part[valid]
        pcols = P.flat_columns(spec, group, part, base)
      if not len(part):
        continue
      rate, reason = P.price_flat(spec, pcols)
      res.add(group, part, rate, reason, top_n)
  res.pruned = res.total - res.evaluated
  return res


def merge_best(best, more, top_n):
  """Merges two best lists (rate desc, then enumeration order)."""
  merged = sorted(best + more, key=lambda t: (-t[0], t[1], t[2]))
  return merged[:top_n]


def execution_record(spec, group, flat):
  """The execution (JSON dict) at ``flat`` in ``group``'s grid: Calculon's
  23 fields, and in the modern space the optional fields that differ from
  their default."""
  idx = np.unravel_index(flat, group.shape)
  chunk = Chunk(group, tuple(int(i) for i in idx))
  record = columns(spec, chunk).record((0,) * len(group.axes))
  if record.get('activation_recompute') != 'selective':
    record.pop('recompute_modules', None)
  if record.get('precision_recipe') != 'transformer_engine':
    record.pop('quantization_scaling', None)
  if record.get('data_par_sharding') != 'parameters':
    record.pop('fsdp_buffer_copies', None)
  return record


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
  pruned: int = 0

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


def reduced_group(group):
  """The group with its inner axes (:data:`prune.INNER_AXES`) cut to one
  value: the grid the level-2 bound is computed on."""
  from calculon.llm.prune import reduced_values
  return Group(group.index, group.tp, group.pp, group.dp, group.batch_size,
               reduced_values(group), group.cp, group.axes)


def _bound_task(task):
  from calculon.llm.prune import search_group
  gi, _ = task
  spec, g = _WORKER['spec'], _WORKER['groups'][gi]
  shared = _WORKER.get('threshold')
  return search_group(spec, g, _WORKER['top_n'],
                      (lambda: shared.value) if shared is not None
                      else (lambda: 0.0))


def _group_bound_task(gi):
  from calculon.llm.prune import max_bound, rate_bound
  spec, g = _WORKER['spec'], _WORKER['groups'][gi]
  if g.size == 0:
    return -np.inf
  try:
    with np.errstate(all='ignore'):
      ev = Evaluation(spec.app, spec.system,
                      columns(spec, Chunk(reduced_group(g), ())))
      return max_bound(rate_bound(ev))
  except Exception:  # noqa: BLE001 -- never prune what cannot be bounded
    return np.inf


def tasks_of(groups_, chunk_size):
  """(group index, chunk prefix) of every chunk, in enumeration order."""
  return [(g.index, c.prefix) for g in groups_ for c in chunks(g, chunk_size)]


class _Threshold:
  """The n-th best rate so far, shared with worker processes (a
  multiprocessing value) or kept here."""

  def __init__(self, workers):
    self.shared = None
    self.local = 0.0
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
  """Searches the whole space and keeps the ``top_n`` fastest executions.

  Memory is O(top_n + chunk) per process.  Ctrl-C (KeyboardInterrupt) stops
  the search and returns what was found, with ``partial=True``.

  In the modern space (``spec.prune``, not with -m) the search is branch
  and bound (:mod:`calculon.llm.prune`): groups are searched in order of a
  level-1 bound and skipped when it is below the n-th best rate found so
  far; within a group, a level-2 bound per cell of the reduced grid decides
  which cells are priced in full.  The bounds never underestimate a rate,
  so the top-n is exactly the exhaustive one (ties keep enumeration order,
  as without pruning).

  Args:
    spec: :class:`SearchSpec`.
    top_n: how many best executions to keep.
    workers: processes.
    chunk_size: maximum executions per chunk (default: DEFAULT_CHUNK, or
      for the pruned modern search cells of the reduced grid per task).
    on_progress: called with the number of executions of each finished chunk.
  """
  import time
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
          group_bound[g.index] * (1 + PRUNE_MARGIN) < threshold.value:
        pruned += counts[g.index]
        if on_progress is not None:
          on_progress(counts[g.index])
        continue
      yield (g.index, ())

  try:
    for res in imap(_bound_task if prune else _best_task, tasks(), workers,
                    initializer=_setup,
                    initargs=(spec, groups_, top_n, chunk_size,
                              threshold.shared if prune and workers > 1
                              else (threshold.shared if prune else None)),
                    ordered=False):
      best = merge_best(best, res.best, top_n)
      evaluated += res.evaluated
      feasible += res.feasible
      pruned += res.pruned
      for code, n in res.reasons.items():
        reasons[code] = reasons.get(code, 0) + n
      if prune and len(best) >= top_n:
        threshold.set(best[top_n - 1][0])
      if on_progress is not None:
        on_progress(res.total)
  except KeyboardInterrupt:
    partial = True
  return SearchResult(best, total, evaluated, feasible, reasons,
                      time.perf_counter() - start, partial, groups_, pruned)


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
  from calculon.config.execution import FIELD_SPECS, OPTIONAL_SPECS
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
      fields = [(n, names) for n, (_, names) in FIELD_SPECS.items()]
      if spec.modern:
        fields += [(n, names) for n, (_, names, _) in OPTIONAL_SPECS.items()]
      for name, names in fields:
        arr = np.broadcast_to(getattr(cols, name), shape)[keep]
        if names:
          table = np.asarray(list(names) + [None], dtype=object)
          arr = table[np.where(arr == UNSET, len(names), arr)]
        out[name] = arr
      from calculon.llm.stats import CALCULON_STAT_NAMES, STAT_NAMES
      names = STAT_NAMES if spec.modern else CALCULON_STAT_NAMES
      for name, arr in stat_arrays(ev, names).items():
        out[name] = arr[keep]
  except Exception:  # noqa: BLE001 -- isolate the failing executions
    k = len(chunk.prefix)
    if k == len(chunk.group.axes):
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
