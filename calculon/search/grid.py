"""The search space as grids: what the search enumerates, and how.

Provides :class:`SearchSpec` (what to search: the application, system, GPU
count, batch, datatype, the framework preset whose options are the space,
the user's constraints), :class:`Group` (one TP x PP x CP layout and the
values along each option axis), :class:`Chunk` (a block of a group's
grid), :func:`groups`, :func:`chunks`, :func:`grid_columns` /
:func:`columns` (the execution columns of a grid, each axis along its own
dimension, the fields the preset sets resolved over them),
:func:`valid_mask` (the combinations enumerated), :func:`count_space` and
:func:`execution_record` (an execution written back as JSON).  Reads
:mod:`calculon.config` (fields, rules), :mod:`calculon.frameworks` (the
preset's options, behaviours and constraints) and
:mod:`calculon.llm.space` (Calculon's enumeration).

Two spaces.  Calculon's (the ``calculon`` preset): for every TP and PP,
DP is what is left, the batch is the largest multiple of DP not above the
maximum, and every combination of interleaving, recomputation, optimizer
sharding, TP communication type, all-gather redo, DP overlap, TP overlap,
the three offloads, fused activation, microbatch size and a network tier
for each parallelism, in Calculon's enumeration order (:data:`AXES`).  The
modern one (every other preset): also CP degrees and tiers, sharding
levels, attention kernels, selective recomputation, PP degrees that do not
divide the blocks and, with experts, EP, ETP, dispatchers and their
overlap (:data:`MODERN_AXES`, :data:`MOE_AXES`); along each axis the
values the preset supports, the combinations it does not support (its
conditional options, offload kinds and constraints) masked out.

Order and ties: executions are ordered as Calculon enumerates them (TP, PP,
then the axes in order).
"""

from dataclasses import dataclass, field

import numpy as np

from calculon.config import ExecutionColumns
from calculon.config import parallel as P
from calculon.config._schema import Reader
from calculon.config.execution import (
  ATTENTION_AUTO, ATTENTION_KERNEL_NAMES, DATATYPE_NAMES, FIELD_SPECS,
  NARROW_DATATYPES, OPTIONAL_SPECS, RECOMPUTE_FULL, RECOMPUTE_NAMES,
  SHARDING_NAMES, TP_COMM_NAMES, TP_COMM_RS_AG, TP_OVERLAP_NAMES, UNSET,
  recompute_modules_label)
from calculon.config.registry import DISPATCHER_NAMES, MOE_OVERLAP_NAMES
from calculon.llm import space

#: Grid axes in Calculon's enumeration order (outermost first).
AXES = ('pipeline_interleaving', 'activation_recompute', 'optimizer_sharding',
        'tensor_par_comm_type', 'seq_par_ag_redo', 'data_par_overlap',
        'tensor_par_overlap', 'weight_offload', 'activations_offload',
        'optimizer_offload', 'fused_activation', 'microbatch_size',
        'tensor_par_net', 'pipeline_par_net', 'data_par_net')
#: Grid axes of the modern space: Calculon's, with the sharding level in
#: place of optimizer_sharding, the attention kernel, and the CP tier.
MODERN_AXES = ('pipeline_interleaving', 'pipeline_schedule',
               'activation_recompute',
               'data_par_sharding', 'attention_kernel', 'tensor_par_comm_type',
               'seq_par_ag_redo', 'data_par_overlap', 'tensor_par_overlap',
               'weight_offload', 'activations_offload', 'optimizer_offload',
               'fused_activation', 'microbatch_size', 'tensor_par_net',
               'pipeline_par_net', 'data_par_net', 'context_par_net')
#: Grid axes of the modern space for a Mixture-of-Experts application: the
#: expert-parallel degree, its TP, the dispatcher, the overlap of its
#: communication and its tier join.
MOE_AXES = MODERN_AXES[:5] + ('expert_par', 'expert_tensor_par',
                              'moe_dispatcher', 'moe_comm_overlap') + \
  MODERN_AXES[5:] + ('expert_par_net',)
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
SPACES = ('auto', 'calculon', 'modern')
#: Axes holding flags.
BOOL_AXES = frozenset({'optimizer_sharding', 'seq_par_ag_redo',
                       'data_par_overlap', 'weight_offload',
                       'activations_offload', 'optimizer_offload',
                       'fused_activation'})
#: The constraints a user may put on the parallel degrees and the
#: microbatch (``--tp`` ...): SearchSpec.limits key -> the field.
LIMITS = {'tp': 'tensor_par', 'pp': 'pipeline_par', 'dp': 'data_par',
          'cp': 'context_par', 'ep': 'expert_par', 'mbs': 'microbatch_size'}


def within(ranges, value):
  """Whether ``value`` is in ``ranges`` (a tuple of inclusive (low, high)
  pairs; None: no constraint)."""
  return ranges is None or any(lo <= value <= hi for lo, hi in ranges)


@dataclass
class SearchSpec:
  """What to search.

  Attributes:
    app: Application; system: System.
    num_procs: processors; max_batch_size: samples; datatype: name.
    fused_activation: list of bools to try (Calculon's space; a preset
      that says which it supports overrides it).
    mbs_break: Calculon's -m: within each combination of the other options,
      stop at the first microbatch size (ascending) with no feasible
      execution.
    allow_tp_overlap, allow_dp_overlap: try TP / DP overlap.
    space: 'calculon' (Calculon's space exactly: the ``calculon`` preset),
      'modern' (the recommended preset's, unless ``framework`` names
      another) or 'auto' (``framework``'s, else Calculon's for a Calculon
      application, else the recommended preset's).
    framework: the framework preset whose options are the space and whose
      behaviours price every candidate (None: see ``space``).
    limits: {'tp'|'pp'|'dp'|'cp'|'ep'|'mbs': ((low, high), ...)}: only
      these sizes (the command line's --tp ...).
    no_offload: no weight, activation or optimizer offload.
    precision_recipe, gradient_datatype, quantization_scaling,
      recompute_modules: options every candidate of the modern space
      takes, overriding the preset (None: the preset's; gradient_datatype
      'calculon': Calculon's, absent).
    fields: {execution field: JSON value} every candidate of the modern
      space takes, overriding the preset (the command line's --set), where
      the field acts (a field the registry allows only with some values of
      another takes its absent value elsewhere).
    prune: skip chunks whose best possible sample rate is below the n-th
      best found so far (exact, see :mod:`calculon.search.bound`; modern
      space only).
    choices: {axis: [values]}: only these values of an axis the search
      varies (JSON values: names, booleans or numbers), within what the
      preset allows (modern space only; the published conventions' rules
      that list values, e.g. an era's recomputations).

  Raises (on construction):
    ConfigError: an unknown framework, a bad field value, or ``space``
      'calculon' with another framework.
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
  gradient_datatype: object = None
  quantization_scaling: object = None
  recompute_modules: object = None
  prune: bool = True
  framework: object = None
  limits: dict = field(default_factory=dict)
  no_offload: bool = False
  fields: dict = field(default_factory=dict)
  choices: dict = field(default_factory=dict)

  def __post_init__(self):
    from calculon import frameworks
    from calculon.errors import ConfigError
    from calculon.frameworks.resolve import code_of
    if self.space == 'calculon' and self.framework not in (
        None, frameworks.CALCULON):
      raise ConfigError(f"--space calculon is not allowed with framework "
                        f"'{self.framework}': Calculon's space is the "
                        "'calculon' preset's", field='space',
                        value=self.space)
    if self.framework is None:
      if self.space == 'calculon':
        self.framework = frameworks.CALCULON
      elif self.space == 'modern':
        self.framework = frameworks.RECOMMENDED
      else:
        self.framework = frameworks.CALCULON if self.app.is_calculon \
          else frameworks.RECOMMENDED
    self.preset = frameworks.load(self.framework, source='<search>')
    self.space = self.preset.space
    for key in self.limits:
      if key not in LIMITS:
        raise ConfigError(f"<search>: limit '{key}' is not allowed: one of "
                          + ', '.join(LIMITS), field=key)
    # Fields every candidate takes whatever the preset says.
    self.overrides = {}
    if self.gradient_datatype is not None:
      self.overrides['gradient_datatype'] = (
        None if self.gradient_datatype == 'calculon'
        else self.gradient_datatype)
    given = dict(self.fields)
    for name in ('precision_recipe', 'quantization_scaling'):
      if getattr(self, name) is not None:
        given[name] = getattr(self, name)
    for name, value in given.items():
      if name not in OPTIONAL_SPECS or name in self.axes:
        raise ConfigError(
          f"<search>: field '{name}' is not allowed here: an optional "
          'execution field the search does not vary (see '
          'docs/reference/executions.md)', field=name, value=value)
      if name == 'recompute_modules':
        value = recompute_modules_label(value, '<search>', name)
      else:
        Reader({name: value}, '<search>').get(name, OPTIONAL_SPECS[name][0])
      self.overrides[name] = value
    #: axis -> the engine codes of its :attr:`choices`.
    self.choice_codes = {}
    if self.choices and not self.modern:
      raise ConfigError("<search>: choices are not allowed in Calculon's "
                        'space (the calculon preset)', field='choices',
                        value=sorted(self.choices))
    for name, allowed in self.choices.items():
      if name not in self.axes or not isinstance(allowed, (list, tuple)) \
          or not allowed:
        raise ConfigError(
          f"<search>: choice '{name}' is not allowed: a non-empty list of "
          'values of an axis the search varies (' + ', '.join(self.axes)
          + ')', field=name, value=allowed)
      try:
        self.choice_codes[name] = {code_of(name, v) for v in allowed}
      except ValueError:
        raise ConfigError(f"<search>: choice '{name}' = {allowed!r} is not "
                          'allowed: values of the field (see '
                          'docs/reference/executions.md)', field=name,
                          value=allowed) from None
    if self.recompute_modules is not None:
      self.overrides['recompute_modules'] = recompute_modules_label(
        self.recompute_modules, source='<search>', field='recompute_modules')
    if self.precision_recipe is None and self.modern and \
        'precision_recipe' not in self.preset.rules:
      # A preset that says nothing: Transformer Engine for a narrow type.
      self.overrides['precision_recipe'] = 'transformer_engine' \
        if self.datatype in NARROW_DATATYPES else 'uniform'

  @property
  def modern(self):
    return self.space == 'modern'

  @property
  def axes(self):
    if not self.modern:
      return AXES
    return MOE_AXES if self.app.is_moe else MODERN_AXES

  def limit(self, key, value):
    """Whether a size is within the user's constraint ``key``."""
    return within(self.limits.get(key), value)


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


def _preset_values(spec, name, values, code=True):
  """``values`` of axis ``name`` restricted to those the preset allows
  somewhere (its rule's values, under any condition); all of them when it
  has no rule or is not strict."""
  from calculon.frameworks.resolve import code_of
  rule = spec.preset.rules.get(name)
  if rule is None or not spec.preset.strict:
    return values
  allowed = [code_of(name, v) if code else v for v in rule.all_values]
  if name == 'data_par_sharding':
    allowed = [code_of(name, v) for v in rule.all_values]
  return [v for v in values if v in allowed]


def _option_values(spec, tp, pp, dp, dp_group, mbs, nets, has_mem2):
  """Values of the axes both spaces share, for one group (``dp_group``:
  the ranks DP communication spans, DP x CP)."""
  tf = [True, False]
  offload = tf if has_mem2 and not spec.no_offload else [False]
  values = {
    'tensor_par_comm_type': TP_COMM_ORDER,
    'seq_par_ag_redo': tf,
    'data_par_overlap': tf if dp_group > 1 and spec.allow_dp_overlap
    else [False],
    'tensor_par_overlap': TP_OVERLAP_ORDER
    if tp > 1 and spec.allow_tp_overlap else TP_OVERLAP_ORDER[:1],
    'weight_offload': offload,
    'activations_offload': offload,
    'optimizer_offload': offload,
    'fused_activation': list(spec.fused_activation),
    'microbatch_size': [m for m in mbs if spec.limit('mbs', m)],
    'tensor_par_net': nets if tp > 1 else [0],
    'pipeline_par_net': nets if pp > 1 else [0],
    'data_par_net': nets if dp > 1 else [0],
  }
  if spec.modern:
    for name in ('tensor_par_comm_type', 'seq_par_ag_redo',
                 'data_par_overlap', 'tensor_par_overlap'):
      values[name] = _preset_values(spec, name, values[name],
                                    code=name not in BOOL_AXES)
    if 'fused_activation' in spec.preset.rules and spec.preset.strict:
      values['fused_activation'] = [
        v for v in (True, False)
        if v in spec.preset.rules['fused_activation'].all_values]
    kinds = spec.preset.offload_kinds
    if kinds is not None and spec.preset.strict:
      from calculon.frameworks.preset import OFFLOAD_KINDS
      for kind, name in OFFLOAD_KINDS.items():
        if not any(kind in k for k in kinds):
          values[name] = [False]
  return values


def _calculon_groups(spec):
  app, system = spec.app, spec.system
  nets = list(range(system.num_networks))
  has_mem2 = system.mem2.capacity_bytes > 0
  out = []
  for tp in space.tensor_parallelisms(spec.num_procs, app.hidden,
                                      app.attn_heads):
    if not spec.limit('tp', tp):
      continue
    for pp in space.pipeline_parallelisms(spec.num_procs, tp, app.num_blocks):
      dp = space.data_parallelism(spec.num_procs, tp, pp)
      if not (spec.limit('pp', pp) and spec.limit('dp', dp)):
        continue
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


def _degree_allowed(spec, name, value):
  """Whether a parallel degree is one the preset supports (a rule on
  ``name`` without conditions)."""
  rule = spec.preset.rules.get(name)
  if rule is None or not spec.preset.strict:
    return True
  return value in rule.all_values


def _modern_groups(spec):
  """(TP, PP, CP) groups of the modern space: TP divides the hidden size,
  the heads, the feedforward width and fits the K/V heads (a multiple or a
  divisor of them); PP up to the blocks (blocks / PP rounded up per stage);
  CP with 2 CP dividing the sequence; DP the processors left; each within
  the preset and the user's limits."""
  app, system = spec.app, spec.system
  nets = list(range(system.num_networks))
  has_mem2 = system.mem2.capacity_bytes > 0
  kv = app.kv_heads
  n = spec.num_procs
  out = []
  for tp in space.factors(n):
    if not all(P.tp_divides(size, tp) for size in (
        app.hidden, app.attn_heads, app.feedforward)):
      continue
    if kv is not None and not P.kv_heads_fit_tp(kv, tp):
      continue
    if not (spec.limit('tp', tp) and _degree_allowed(spec, 'tensor_par',
                                                     tp)):
      continue
    for pp in space.factors(n // tp):
      if pp > app.num_blocks or not spec.limit('pp', pp) or \
          not _degree_allowed(spec, 'pipeline_par', pp):
        continue
      for cp in space.factors(n // (tp * pp)):
        if not P.cp_splits_sequence(app.seq_size, cp):
          continue
        if not (spec.limit('cp', cp) and _degree_allowed(
            spec, 'context_par', cp)):
          continue
        dp = n // P.procs(tp, pp, 1, cp)
        if not spec.limit('dp', dp):
          continue
        batch = P.largest_batch(dp, spec.max_batch_size)
        if batch is None:
          continue
        mbs = [c for c in space.factors(P.local_batch(batch, dp))
               if P.tp_splits_tokens(
                 P.tokens_per_microbatch(c, app.seq_size, cp), tp)]
        bpp = int(P.split_blocks(app.num_blocks, pp)[0])
        dpcp = dp * cp
        values = _option_values(spec, tp, pp, dp, dpcp, mbs, nets, has_mem2)
        interleavings = space.factors(bpp) if pp > 1 else [1]
        if pp > 1 and app.has_vocab:
          # A framework's split may count the embedding and the loss as
          # blocks (PP x VP dividing the blocks + 2): their virtual stages
          # too (the engine refuses those that do not divide its stages).
          more = space.factors(int(P.split_blocks(app.num_blocks + 2,
                                                  pp)[0]))
          interleavings = sorted(set(interleavings) | set(more))
        values.update({
          'pipeline_interleaving': _preset_values(
            spec, 'pipeline_interleaving', interleavings, code=False),
          'pipeline_schedule': _schedule_values(spec, pp),
          'activation_recompute': _preset_values(
            spec, 'activation_recompute', MODERN_RECOMPUTE_ORDER),
          'data_par_sharding': _preset_values(
            spec, 'data_par_sharding',
            SHARDING_ORDER if dpcp > 1 else SHARDING_ORDER[:1]),
          'attention_kernel': _preset_values(spec, 'attention_kernel',
                                             KERNEL_ORDER),
          'context_par_net': nets if cp > 1 else [0],
        })
        if app.is_moe:
          values['expert_par'] = [
            e for e in space.factors(app.num_experts)
            if P.experts_fold(tp, dp, cp, e, 1) and spec.limit('ep', e) and
            _degree_allowed(spec, 'expert_par', e)]
          values['expert_tensor_par'] = sorted(
            {1, tp} & {t for t in space.factors(tp)
                       if app.moe_ffn_hidden % t == 0})
          values['moe_dispatcher'] = _preset_values(
            spec, 'moe_dispatcher', list(range(len(DISPATCHER_NAMES))))
          values['moe_comm_overlap'] = _preset_values(
            spec, 'moe_comm_overlap', list(range(len(MOE_OVERLAP_NAMES))))
          values['expert_par_net'] = nets
        _apply_choices(spec, values)
        out.append(Group(len(out), tp, pp, dp, batch, values, cp, spec.axes))
  return out


def _schedule_values(spec, pp):
  """Codes of the ``pipeline_schedule`` axis of a group: Calculon's 1F1B
  and interleaved 1F1B (left out, UNSET: which one the interleaving
  says), then the other schedules the preset lists (a preset that names
  none keeps Calculon's alone, so its search is what it was); UNSET alone
  with PP = 1.  :func:`valid_mask` leaves out the combinations the
  schedule table forbids."""
  from calculon.llm.terms.schedules import legacy
  rule = spec.preset.rules.get('pipeline_schedule')
  if pp == 1 or rule is None:
    return [UNSET]
  from calculon.frameworks.resolve import code_of
  listed = {code_of('pipeline_schedule', v) for v in rule.all_values}
  return [UNSET] + sorted(c for c in listed if not legacy(c))


def _apply_choices(spec, values):
  """Restricts a group's axis values to :attr:`SearchSpec.choices`."""
  for name, keep in spec.choice_codes.items():
    values[name] = [v for v in values[name] if v in keep]


def groups(spec):
  """The (TP, PP[, CP]) groups of the space, in enumeration order."""
  return _modern_groups(spec) if spec.modern else _calculon_groups(spec)


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


def axis_values(group, name):
  """The values of axis ``name`` of ``group`` as a numpy array of the
  engine's dtype."""
  return np.asarray(group.values[name],
                    dtype=bool if name in BOOL_AXES else np.int64)


#: Scalar fields of a grid (never axes).
_SCALARS = ('num_procs', 'tensor_par', 'pipeline_par', 'data_par',
            'batch_size', 'datatype', 'attention_type', 'training',
            'context_par')


def grid_columns(spec, group, axes):
  """:class:`ExecutionColumns` of executions of ``group`` whose axis values
  are the arrays ``axes`` (axis name -> array, mutually broadcastable:
  each axis along its own dimension, or flat cells along one), the
  preset's fields resolved over them
  (:func:`calculon.frameworks.resolve.resolve_columns`)."""
  from calculon.frameworks.resolve import resolve_columns
  cols = {
    'num_procs': np.int64(spec.num_procs), 'tensor_par': np.int64(group.tp),
    'pipeline_par': np.int64(group.pp), 'data_par': np.int64(group.dp),
    'batch_size': np.int64(group.batch_size),
    'datatype': np.int64(DATATYPE_NAMES.index(spec.datatype)),
    'attention_type': np.int64(0 if spec.app.kv_heads is None
                               else ATTENTION_AUTO),
    'training': np.bool_(True),
  }
  if spec.modern:
    cols['context_par'] = np.int64(group.cp)
    for name, value in spec.overrides.items():
      cols[name] = _code(name, value)
    cols['optimizer_sharding'] = None
  cols.update(axes)
  exe = ExecutionColumns(**cols)
  if spec.modern:
    written = set(_SCALARS) | set(axes) | set(spec.overrides)
    resolve_columns(spec.preset, spec.app, exe, written)
    _only_where_they_act(spec, exe)
  return exe


def _only_where_they_act(spec, exe):
  """An override of a field the registry allows only with some values of
  another (recompute modules with selective recomputation, FSDP's copies
  with 'parameters'...) takes its absent value elsewhere."""
  from calculon.config import registry
  from calculon.frameworks.resolve import code_of
  for name in spec.overrides:
    f = registry.field('execution', name)
    if f.requires is None:
      continue
    other, values, _ = f.requires
    col = exe.sharding if other == 'data_par_sharding' else \
      getattr(exe, other)
    here = np.isin(col, [code_of(other, v) for v in values])
    value = np.where(here, getattr(exe, name), code_of(name, f.absent))
    setattr(exe, name, value.astype(np.asarray(getattr(exe, name)).dtype))


def _code(name, value):
  from calculon.frameworks.resolve import code_of
  code = code_of(name, value)
  if isinstance(code, bool):
    return np.bool_(code)
  return np.int64(code) if not isinstance(code, float) else np.float64(code)


def columns(spec, chunk):
  """:class:`ExecutionColumns` of a chunk (each axis its own dimension)."""
  g = chunk.group
  n = len(g.axes)
  k = len(chunk.prefix)
  axes = {}
  for axis, name in enumerate(g.axes):
    values = axis_values(g, name)
    if axis < k:
      values = values[chunk.prefix[axis]:chunk.prefix[axis] + 1]
    shape = [1] * n
    shape[axis] = len(values)
    axes[name] = values.reshape(shape)
  return grid_columns(spec, g, axes)


def valid_mask(cols, spec=None):
  """Combinations the search enumerates: redo only with rs_ag and without
  full recomputation; activation offload not with full recomputation.
  Modern space with experts: EP x ETP divides TP x DP x CP, and without
  expert parallelism (EP = 1) only the first dispatcher, overlap and tier
  (they would price the same execution again).  With ``spec``: only what
  its framework preset supports (option values under their conditions,
  offload kinds, constraints,
  :func:`calculon.frameworks.resolve.allowed_mask`)."""
  full = cols.activation_recompute == RECOMPUTE_FULL
  redo_ok = ~cols.seq_par_ag_redo | (
    (cols.tensor_par_comm_type == TP_COMM_RS_AG) & ~full)
  offload_ok = ~cols.activations_offload | ~full
  ok = redo_ok & offload_ok
  sched = np.asarray(cols.pipeline_schedule)
  if np.any(sched != UNSET):
    # The schedule table's constraints (chunks a rank holds, ranks,
    # microbatches), as the execution rules check them.
    from calculon.llm.terms.schedules import violation
    nmb = P.num_microbatches(cols.batch_size, cols.data_par,
                             cols.microbatch_size)
    ok = ok & (violation(sched, cols.pipeline_par, cols.pipeline_interleaving,
                         nmb) == 0)
  first = np.asarray(cols.pipeline_first_stage_blocks)
  last = np.asarray(cols.pipeline_last_stage_blocks)
  if spec is not None and (np.any(first != UNSET) or np.any(last != UNSET)):
    # A layout the stages cannot split (the engine's check).
    from calculon.llm.terms.schedule import layout_violation
    from calculon.llm.terms.schedules import effective
    ok = ok & (layout_violation(
      spec.app.num_blocks, cols.pipeline_par, cols.pipeline_interleaving,
      first, last, effective(sched, cols.pipeline_interleaving)) == 0)
  if spec is not None and spec.modern:
    from calculon.frameworks.resolve import allowed_mask
    ok = ok & allowed_mask(spec.preset, spec.app, cols)
  ep = cols.expert_par
  if np.ndim(ep) == 0 and ep == 1 and np.ndim(cols.expert_tensor_par) == 0:
    return ok
  fits = P.experts_fold(cols.tensor_par, cols.data_par, cols.context_par,
                        ep, cols.expert_tensor_par)
  single = (ep > 1) | ((cols.moe_dispatcher == 0) &
                       (cols.moe_comm_overlap == 0) &
                       (cols.expert_par_net == 0))
  return ok & fits & single


def count_valid(spec, cols, shape):
  """Valid executions among the broadcast grid ``shape`` of ``cols``."""
  mask = valid_mask(cols, spec)
  other = int(np.prod([n for n, m in zip(
    shape, np.shape(mask) or (1,) * len(shape)) if m == 1]))
  return int(np.sum(mask)) * other


def valid_count(spec, group):
  """Executions of a group the search enumerates (valid combinations);
  counted once per spec and group (the command's progress total and the
  driver's both read it)."""
  if group.size == 0:
    return 0
  cache = spec.__dict__.setdefault('_valid_counts', {})
  key = (group.index, group.tp, group.pp, group.dp, group.cp,
         group.batch_size, group.shape)
  if key not in cache:
    cache[key] = count_valid(spec, columns(spec, Chunk(group, ())),
                             group.shape)
  return cache[key]


def count_space(spec):
  """Number of executions the search enumerates (without -m)."""
  return sum(valid_count(spec, g) for g in groups(spec))


def _values_at(spec, group, flat):
  """{field: JSON value} of every field of the execution at ``flat`` in
  ``group``'s grid, as priced (``optimizer_sharding``: Calculon's flag of
  the sharding level; ``attention_type`` None when the application's
  kv_heads decide)."""
  from calculon.frameworks.resolve import value_of
  idx = np.unravel_index(flat, group.shape)
  cols = columns(spec, Chunk(group, tuple(int(i) for i in idx)))
  shape = cols.shape

  def at(x):
    return np.broadcast_to(x, shape).reshape(-1)[0]
  out = {name: value_of(name, at(getattr(cols, name)))
         for name in list(FIELD_SPECS) + list(OPTIONAL_SPECS)
         if name != 'optimizer_sharding'}
  out['optimizer_sharding'] = bool(at(cols.sharding) != 0)
  return out


def execution_record(spec, group, flat):
  """The execution (JSON dict) at ``flat`` in ``group``'s grid.

  Calculon's space: Calculon's 23 fields.  The modern space: Calculon's
  fields, ``framework``, and only the other fields whose value differs
  from what the preset resolves without them (so that ``calculon llm``
  prices the record exactly as the search did; the preset's behaviours
  are not written).
  """
  from calculon.config import Execution
  from calculon.errors import ConfigError
  from calculon.frameworks import resolve_execution
  values = _values_at(spec, group, flat)
  record = {name: values[name] for name in FIELD_SPECS}
  if record['attention_type'] is None:
    del record['attention_type']
  if not spec.modern:
    return record
  record['framework'] = spec.framework
  if group.cp != 1:
    record['context_par'] = group.cp
  def exact(rec):
    """Whether ``rec`` is accepted and resolves to the priced values;
    raises ConfigError when refused, else returns the fields that
    differ."""
    resolved, _ = resolve_execution(spec.app, Execution.from_dict(
      rec, '<search>'), source='<search>')
    return [name for name in OPTIONAL_SPECS
            if getattr(resolved, name) != _json_internal(name, values[name])]

  refused = False
  for _ in range(len(OPTIONAL_SPECS) + 1):
    try:
      differ = exact(record)
    except ConfigError:
      # A short record can read differently from the priced execution
      # before the preset resolves it (Calculon's optimizer_sharding
      # alone means gradients sharded; a quantization scaling needs its
      # precision recipe written): write every field that is not at its
      # absent value, then drop again what is not needed.
      full = dict(record, **{
        name: values[name] for name in OPTIONAL_SPECS
        if _json_internal(name, values[name]) != _absent_json(name)})
      if full == record:
        raise
      record, refused = full, True
      continue
    if not differ:
      break
    for name in differ:
      record[name] = values[name]
  else:
    raise RuntimeError(f'execution_record: {record} does not resolve to '
                       'the priced execution')
  if refused:
    for name in [n for n in OPTIONAL_SPECS if n in record]:
      shorter = {k: v for k, v in record.items() if k != name}
      try:
        if not exact(shorter):
          record = shorter
      except ConfigError:
        pass
  return record


def _absent_json(name):
  """What an optional field's absence means, as a JSON value (None where
  the registry gives no plain value)."""
  from calculon.config import registry
  absent = registry.field('execution', name).absent
  return absent if isinstance(absent, (bool, int, float, str)) else None


def _json_internal(name, value):
  """A JSON value as :class:`~calculon.config.Execution` holds it
  (recompute_modules: its label)."""
  if name == 'recompute_modules' and isinstance(value, list):
    return ','.join(value)
  return value


def reason_summary(reasons):
  """{reason name: count} from {reason code: count}."""
  from calculon.llm.model import REASON_NAMES
  return {REASON_NAMES.get(code, str(code)): n for code, n in
          sorted(reasons.items())}
