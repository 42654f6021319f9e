"""The execution (parallelization strategy and options) configuration.

An execution is kept in two forms:

* :class:`Execution`, one execution read from JSON (the Calculon format, 23
  fields), and
* :class:`ExecutionColumns`, a struct of numpy arrays with one entry per
  execution (or any broadcastable shapes, which the search uses to evaluate a
  whole grid of strategies at once).  Categorical options are stored as small
  integer codes (see the ``*_NAMES`` tuples).

The rules that make an execution well-defined (``TP * PP * DP ==
num_procs``, the batch divides evenly...) are written once, vectorized, in
:data:`RULES`; a single JSON execution is checked as a batch of one.
"""

import dataclasses
from dataclasses import asdict

import numpy as np

from calculon.config._record import frozen_record
from calculon.config._schema import Reader, Spec, show
from calculon.errors import ConfigError

from calculon.config import parallel as _parallel
from calculon.config import registry as _registry
from calculon.config.registry import (  # noqa: F401 -- re-exported
  ATTENTION_KERNEL_NAMES, ATTENTION_NAMES, CHECKPOINT_LAYOUT_NAMES,
  CROSS_ENTROPY_NAMES, DATATYPE_BYTES, DATATYPE_NAMES, DISPATCHER_NAMES,
  MOE_OVERLAP_NAMES, NARROW_DATATYPES, OPTIMIZER_TRAFFIC_NAMES,
  PRECISION_RECIPE_NAMES, RECOMPUTE_MODULE_SETS, RECOMPUTE_MODULES,
  RECOMPUTE_NAMES, SCALING_NAMES, SHARDING_NAMES, TP_COMM_NAMES,
  TP_OVERLAP_NAMES)



def recompute_modules_label(value, source='<execution>',
                            field='recompute_modules'):
  """The canonical label of a list (or comma-separated string) of
  recompute modules.

  Raises:
    ConfigError: empty, a name not in :data:`RECOMPUTE_MODULES`, or a name
      twice.
  """
  allowed = ('a non-empty list of distinct names among ' +
             ', '.join(RECOMPUTE_MODULES))
  names = value.split(',') if isinstance(value, str) else value
  ok = isinstance(names, (list, tuple)) and names and all(
    isinstance(n, str) and n.strip() in RECOMPUTE_MODULES for n in names)
  names = [n.strip() for n in names] if ok else names
  if not ok or len(set(names)) != len(names):
    raise ConfigError(
      f"{source}: field '{field}' = {show(value)} is not "
      f'allowed: {allowed}', source=source, field=field, value=value,
      allowed=allowed)
  return ','.join(m for m in RECOMPUTE_MODULES if m in names)


def json_value(name, value):
  """An optional field's value as JSON writes it: ``recompute_modules``'
  canonical label as its list of names, every other value as is."""
  return value.split(',') if name == 'recompute_modules' else value


# Codes used by the engine.
RECOMPUTE_NONE, RECOMPUTE_ATTN_ONLY, RECOMPUTE_FULL, RECOMPUTE_SELECTIVE = \
  0, 1, 2, 3
TP_COMM_AR, TP_COMM_P2P_RS_AG, TP_COMM_RS_AG = 0, 1, 2
TP_OVERLAP_NONE, TP_OVERLAP_RING, TP_OVERLAP_PIPE = 0, 1, 2
ATTENTION_AUTO, ATTENTION_MULTIHEAD, ATTENTION_MULTIQUERY, \
  ATTENTION_GROUPED = -1, 0, 1, 2
SHARD_NONE, SHARD_OPTIMIZER, SHARD_GRADIENTS, SHARD_PARAMETERS = 0, 1, 2, 3
KERNEL_STANDARD, KERNEL_FLASH = 0, 1
RECIPE_UNIFORM, RECIPE_TE = 0, 1
SCALING_DELAYED, SCALING_CURRENT, SCALING_BLOCK = 0, 1, 2
CROSS_ENTROPY_FUSED, CROSS_ENTROPY_UNFUSED, CROSS_ENTROPY_COMPILED, \
  CROSS_ENTROPY_EAGER = 0, 1, 2, 3
DISPATCH_ALLTOALL, DISPATCH_ALLGATHER, DISPATCH_DEEPEP = 0, 1, 2
MOE_OVERLAP_NONE, MOE_OVERLAP_SHARED, MOE_OVERLAP_COMPUTE = 0, 1, 2
CHECKPOINT_WHOLE, CHECKPOINT_AS_INPUT = 0, 1
OPTIMIZER_TRAFFIC_STATE, OPTIMIZER_TRAFFIC_FUSED_ADAM = 0, 1
WGRAD_ACCUMULATION_FUSED, WGRAD_ACCUMULATION_SEPARATE = 0, 1
CP_COMM_RING, CP_COMM_ALL_GATHER = 0, 1

def recomputes_module(columns, name):
  """Bool array: executions of ``columns`` whose selective recomputation
  recomputes Megatron-Core module ``name`` (one of
  :data:`RECOMPUTE_MODULES`); a ``recompute_modules`` code c is the bit
  mask c + 1 of :data:`RECOMPUTE_MODULES`."""
  bit = RECOMPUTE_MODULES.index(name)
  on = ((np.asarray(columns.recompute_modules) + 1) >> bit) & 1
  return np.asarray((columns.activation_recompute == RECOMPUTE_SELECTIVE)
                    & (on == 1))


#: Code of an optional categorical field left out (``attention_type``:
#: as the application's kv_heads say; ``gradient_datatype``: Calculon's).
UNSET = -1

#: JSON field -> (spec, categorical names or None), in the reference's
#: order: Calculon's 23 fields (:mod:`calculon.config.registry`).
FIELD_SPECS = {f.name: (f.spec, f.names)
               for f in _registry.EXECUTION if f.calculon}
FIELDS = tuple(FIELD_SPECS)

#: Fields beyond Calculon's that the engine reads: JSON field -> (spec,
#: categorical names or None, the value meaning "absent"), from the
#: registry.  Absent, each means exactly what Calculon means.
#: ``data_par_sharding`` absent follows ``optimizer_sharding`` (see
#: :func:`sharding_code`); ``gradient_datatype`` absent keeps Calculon's
#: gradients (in ``datatype``, with an fp32 accumulation buffer for the
#: block being computed).  ``framework`` is not an engine column: it is
#: resolved before (:mod:`calculon.frameworks`).
OPTIONAL_SPECS = {f.name: (f.spec, f.names, f.absent)
                  for f in _registry.EXECUTION
                  if not f.calculon and f.name != 'framework'}
#: Calculon fields that new-style executions may leave out, with what their
#: absence means (attention_type: as the application's kv_heads say;
#: optimizer_sharding: as data_par_sharding says).
RELAXED = ('attention_type', 'optimizer_sharding')
_FRAMEWORK_SPEC = _registry.field('execution', 'framework').spec
ALL_FIELDS = FIELDS + tuple(OPTIONAL_SPECS)
#: Every name an execution file may carry (for the did-you-mean).
KNOWN = tuple(_registry.FIELDS['execution']) + Reader.META_FIELDS


def sharding_code(optimizer_sharding, data_par_sharding):
  """Sharding level code from Calculon's flag and the new field.

  ``data_par_sharding`` absent (UNSET): Calculon's ``optimizer_sharding``,
  priced exactly as Calculon prices it.  Calculon's accounting shards the
  optimizer state *and* the gradients of the finished blocks (its
  ``block_weight_grad_space`` divides by DP), i.e. ZeRO-2's memory, with the
  reduce-scatter + all-gather communication that ZeRO-1 and ZeRO-2 share
  (Rajbhandari et al. 2020, sections 5 and 7): so ``true`` is the level
  ``gradients`` and ``false`` is ``none``.
  """
  return np.where(data_par_sharding == UNSET,
                  np.where(optimizer_sharding, SHARD_GRADIENTS, SHARD_NONE),
                  data_par_sharding)


def required_calculon():
  """Calculon's fields a Calculon file must write (all 23 but
  :data:`RELAXED`)."""
  return tuple(n for n in FIELD_SPECS if n not in RELAXED)


class Execution:
  """One execution strategy, as in Calculon's execution JSON.

  Every field, its values, what its absence means and its source are in the
  field registry (:data:`calculon.config.registry.EXECUTION`, listed in
  docs/reference/executions.md): Calculon's 23 fields (``attention_type``
  and ``optimizer_sharding`` may be left out when the application's
  ``kv_heads`` / ``data_par_sharding`` say), then the optional ones, whose
  absence means exactly what Calculon means.

  ``framework`` names the framework preset (``frameworks/NAME.json``) whose
  behaviours fill the fields the execution leaves out; ``written`` holds
  the names of the fields the JSON gave (they win over the preset);
  ``filled`` those an execution naming a framework left out that
  :mod:`calculon.config.fill` filled (a preset's value, or its first
  supported one, replaces them; the network tiers are placed from the
  system).  The
  preset is applied where the execution meets its application
  (:func:`calculon.frameworks.resolve_execution`); until then the fields
  left out hold their "absent" value.
  """
  @classmethod
  def from_dict(cls, cfg, source='<execution>'):
    """Reads and validates one execution.

    A Calculon file (no ``framework``) writes Calculon's 23 fields
    (:data:`RELAXED` aside); an execution naming a ``framework`` needs only
    its layout (:data:`calculon.config.fill.LAYOUT`): when it leaves out
    any other of Calculon's fields, the fields it leaves out are filled as
    :mod:`calculon.config.fill` says (``filled`` names them); one that
    writes them all means what it meant before.

    Raises:
      ConfigError: a field is unknown (with a did-you-mean over the
        registry's execution fields), missing (all of them, in one
        message), of the wrong type or out of range, or the fields
        contradict each other (see :data:`RULES`).
    """
    reader = Reader(cfg, source, known=KNOWN)
    modern = isinstance(cfg, dict) and 'framework' in cfg
    if modern:
      from calculon.config import fill
      required = fill.LAYOUT
    else:
      required = required_calculon()
    reader.check_names({n: FIELD_SPECS[n][0] for n in required})
    values = {}
    for name, (spec, _) in FIELD_SPECS.items():
      if name in cfg:
        values[name] = reader.get(name, spec)
      elif name in RELAXED:
        values[name] = None
    for name, (spec, _, default) in OPTIONAL_SPECS.items():
      values[name] = reader.get(name, spec) if name in cfg else default
    filled = ()
    if modern:
      values['framework'] = reader.get('framework', _FRAMEWORK_SPEC)
    if modern and not all(n in cfg for n in required_calculon()):
      extra = fill.defaults_for(values, cfg)
      values.update(extra)
      filled = tuple(extra) + tuple(
        n for n in fill.NETWORK_FIELDS if n not in cfg)
    values['recompute_modules'] = recompute_modules_label(
      values['recompute_modules'], source)
    reader.meta()
    reader.finish()
    values['written'] = frozenset(
      k for k in cfg if k in FIELD_SPECS or k in OPTIONAL_SPECS)
    values['filled'] = frozenset(filled)
    if values['optimizer_sharding'] is None and \
        values['data_par_sharding'] is None:
      reader.get('optimizer_sharding', FIELD_SPECS['optimizer_sharding'][0])
    exe = cls(**values)
    check_rules(ExecutionColumns.from_records([values]), source)
    return exe

  def written_dict(self):
    """The JSON object of the fields this execution was given (and its
    ``framework``), without what a preset filled in."""
    out = {k: v for k, v in self.to_dict().items() if k in self.written}
    for name in FIELDS:
      if name in self.written:
        out[name] = getattr(self, name)
    if self.framework is not None:
      out['framework'] = self.framework
    return out

  def to_dict(self):
    """The JSON object of this execution: Calculon's 23 fields (those left
    out stay out) and the optional fields that differ from their default."""
    out = {}
    for name in FIELDS:
      value = getattr(self, name)
      if value is not None or name not in RELAXED:
        out[name] = value
    for name, (_, _, default) in OPTIONAL_SPECS.items():
      value = getattr(self, name)
      if value != default:
        out[name] = json_value(name, value)
    if self.framework is not None:
      out['framework'] = self.framework
    return out

  @property
  def local_batch_size(self):
    """Samples per data-parallel replica per batch."""
    return _parallel.local_batch(self.batch_size, self.data_par)

  @property
  def num_microbatches(self):
    """Microbatches per replica per batch."""
    return _parallel.num_microbatches(self.batch_size, self.data_par,
                                      self.microbatch_size)


def _with_fields(cls):
  """``cls`` as a frozen record whose fields are the registry's execution
  fields (:data:`calculon.config.registry.EXECUTION`): Calculon's 23
  required, the others defaulting to their absent value; then
  ``written`` and ``filled``."""
  kinds = {'int': int, 'bool': bool, 'str': str, 'number': float}
  notes = {}
  for f in _registry.EXECUTION:
    if f.required:
      notes[f.name] = kinds.get(f.spec.kind, object)
    else:
      notes[f.name] = object
      setattr(cls, f.name, f.absent)
  notes['written'] = frozenset
  cls.written = dataclasses.field(default=frozenset(), compare=False,
                                  repr=False)
  notes['filled'] = frozenset
  cls.filled = dataclasses.field(default=frozenset(), compare=False,
                                 repr=False)
  cls.__annotations__ = notes
  return frozen_record(cls)


Execution = _with_fields(Execution)


def _resolve_sharding_flag(record):
  """A record whose left-out optimizer_sharding follows data_par_sharding."""
  if record.get('optimizer_sharding') is not None:
    return record
  level = record.get('data_par_sharding')
  return dict(record, optimizer_sharding=level not in (None, 'none'))


def _kind_dtype(spec):
  return np.float64 if spec.kind == 'number' else \
    bool if spec.kind == 'bool' else np.int64


def _code(names, value):
  return UNSET if value is None else names.index(value)


class ExecutionColumns:
  """Executions as a struct of numpy arrays (one attribute per field).

  Integer fields are int64 arrays, flags are bool arrays, categorical fields
  are int64 codes into the ``*_NAMES`` tuples (``datatype`` indexes
  :data:`DATATYPE_NAMES`; :data:`UNSET` for an optional categorical field
  left out).  Arrays may have any mutually broadcastable shapes.  The
  optional fields (:data:`OPTIONAL_SPECS`) may be omitted and take their
  "absent" value; ``optimizer_sharding`` left out (None) follows
  ``data_par_sharding``.
  """

  def __init__(self, **columns):
    missing = [f for f in FIELDS if f not in columns]
    if missing:
      raise TypeError(f'missing execution columns: {missing}')
    for name in FIELDS:
      setattr(self, name, columns[name])
    for name, (spec, names, default) in OPTIONAL_SPECS.items():
      value = columns.get(name)
      if value is None:
        value = np.float64(default) if spec.kind == 'number' else \
          np.bool_(default) if spec.kind == 'bool' else \
          np.int64(_code(names, default) if names is not None or
                   default is None else default)
      setattr(self, name, value)
    if self.optimizer_sharding is None:
      self.optimizer_sharding = np.asarray(
        (self.data_par_sharding != UNSET) &
        (self.data_par_sharding != SHARD_NONE))
    if self.attention_type is None:
      self.attention_type = np.int64(ATTENTION_AUTO)

  @property
  def sharding(self):
    """Sharding level codes (see :func:`sharding_code`)."""
    return sharding_code(self.optimizer_sharding, self.data_par_sharding)

  @property
  def shape(self):
    """Broadcast shape of all columns."""
    return np.broadcast_shapes(*(np.shape(getattr(self, f))
                                 for f in ALL_FIELDS))

  @classmethod
  def from_records(cls, records):
    """Builds columns from dicts already checked against the field specs
    (optional fields may be missing or None)."""
    records = [_resolve_sharding_flag(r) for r in records]
    cols = {}
    for name, (spec, names) in FIELD_SPECS.items():
      vals = [r.get(name) for r in records]
      if name in RELAXED and all(v is None for v in vals):
        if name == 'attention_type':
          cols[name] = np.full(len(vals), ATTENTION_AUTO, dtype=np.int64)
        continue
      if names is not None:
        cols[name] = np.array([_code(names, v) for v in vals],
                              dtype=np.int64)
      elif spec.kind == 'bool':
        cols[name] = np.array(vals, dtype=bool)
      else:
        cols[name] = np.array(vals, dtype=np.int64)
    cols.setdefault('optimizer_sharding', None)
    for name, (spec, names, default) in OPTIONAL_SPECS.items():
      vals = [r.get(name, default) for r in records]
      if name == 'recompute_modules':
        vals = [default if v is None else recompute_modules_label(v)
                for v in vals]
      if names is not None:
        cols[name] = np.array([_code(names, v) for v in vals],
                              dtype=np.int64)
      else:
        if default is None:
          # An integer left out (None) is UNSET.
          vals = [UNSET if v is None else v for v in vals]
        cols[name] = np.array(vals, dtype=_kind_dtype(spec))
    return cls(**cols)

  @classmethod
  def from_frame(cls, frame, source='<executions>'):
    """Builds columns from a pandas DataFrame with the 23 execution fields
    (and any optional ones).

    Extra columns are ignored.  Values are checked column by column; an
    optional column may hold nulls (absent).

    Raises:
      ConfigError: a column is missing or holds a value its field does not
        accept (the message names the first offending row).
    """
    cols = {}
    n = len(frame)
    specs = [(name, spec, names, False, None)
             for name, (spec, names) in FIELD_SPECS.items()]
    specs += [(name, spec, names, True, default)
              for name, (spec, names, default) in OPTIONAL_SPECS.items()]
    for name, spec, names, optional, default in specs:
      if name not in frame.columns:
        if optional:
          continue
        raise ConfigError(
          f"{source}: missing column '{name}' ({spec.describe()})",
          source=source, field=name, allowed=spec.describe())
      raw = frame[name].to_numpy()
      absent = np.zeros(n, dtype=bool)
      if optional:
        absent = np.array([v is None or (isinstance(v, float) and v != v)
                           for v in raw.astype(object)], dtype=bool)
      if names is not None:
        codes = np.full(n, -2, dtype=np.int64)
        as_str = raw.astype(object)
        allowed = spec.choices if spec.choices is not None else names
        for i, label in enumerate(names):
          if label in allowed:
            codes[as_str == label] = i
        if optional:
          codes[absent] = _code(names, default)
        bad = codes == -2
        arr = codes
      elif spec.kind == 'bool':
        if raw.dtype == bool:
          arr, bad = raw, np.zeros(n, dtype=bool)
        else:
          obj = raw.astype(object)
          is_bool = np.array([isinstance(v, (bool, np.bool_)) for v in obj],
                             dtype=bool)
          arr = np.where(is_bool, obj, False).astype(bool)
          bad = ~is_bool
      elif spec.kind == 'number':
        obj = raw.astype(object)
        if optional:
          obj = np.where(absent, default, obj)
        ok = np.array([spec.accepts(v) for v in obj], dtype=bool)
        arr = np.where(ok, obj, default).astype(np.float64)
        bad = ~ok
      else:
        if raw.dtype.kind in 'iu':
          arr = raw.astype(np.int64)
          bad = np.zeros(n, dtype=bool)
        else:
          obj = raw.astype(object)
          is_int = np.array([isinstance(v, (int, np.integer))
                             and not isinstance(v, (bool, np.bool_))
                             for v in obj], dtype=bool)
          if optional:
            is_int |= absent
            obj = np.where(absent, UNSET if default is None else default,
                           obj)
          arr = np.where(is_int, obj, 0).astype(np.int64)
          bad = ~is_int
        bad |= (arr < (spec.lo if spec.lo is not None else -2**62)) & \
          ~absent
      if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise ConfigError(
          f"{source}: row {frame.index[row]!r}: field '{name}' = "
          f'{show(_plain(raw[row]))} is not allowed: {spec.describe()} '
          f'({int(bad.sum())} bad rows)',
          source=source, field=name, value=raw[row], allowed=spec.describe())
      cols[name] = arr
    return cls(**cols)

  def record(self, index=()):
    """The execution at ``index`` as a JSON-ready dict (Calculon format; the
    optional fields only where they differ from their default)."""
    out = {}
    shape = self.shape
    for name, (spec, names) in FIELD_SPECS.items():
      arr = np.broadcast_to(getattr(self, name), shape)
      value = arr[index]
      if names is not None:
        if int(value) == UNSET:
          continue
        out[name] = names[int(value)]
      elif spec.kind == 'bool':
        out[name] = bool(value)
      else:
        out[name] = int(value)
    for name, (spec, names, default) in OPTIONAL_SPECS.items():
      value = np.broadcast_to(getattr(self, name), shape)[index]
      value = float(value) if spec.kind == 'number' else \
        bool(value) if spec.kind == 'bool' else int(value)
      if names is not None:
        value = None if value == UNSET else names[value]
      elif default is None and value == UNSET:
        value = None
      if value != default:
        out[name] = json_value(name, value)
    return out

  def to_frame(self):
    """All executions as a pandas DataFrame (flattened, Calculon values; an
    optional field is a column only when some execution sets it)."""
    import pandas as pd
    shape = self.shape
    data = {}
    for name, (spec, names) in FIELD_SPECS.items():
      arr = np.broadcast_to(getattr(self, name), shape).reshape(-1)
      if names is not None:
        data[name] = _labels(names, arr)
      else:
        data[name] = arr
    for name, (spec, names, default) in OPTIONAL_SPECS.items():
      arr = np.broadcast_to(getattr(self, name), shape).reshape(-1)
      code = _code(names, default) if names is not None or default is None \
        else default
      if np.all(arr == code):
        continue
      data[name] = _labels(names, arr) if names is not None else arr
    return pd.DataFrame(data)


def _labels(names, codes):
  """Names of codes (None for UNSET)."""
  table = np.asarray(list(names) + [None], dtype=object)
  return table[np.where(codes == UNSET, len(names), codes)]


@frozen_record
class Rule:
  """One consistency rule between execution fields.

  ``bad(c)`` returns a boolean mask of executions that break the rule;
  ``message(c, i)`` explains the failure of execution ``i`` (an index into the
  broadcast shape) naming the field, its value and what is allowed.
  """
  field: str
  bad: object
  message: object


def _plain(value):
  return value.item() if isinstance(value, np.generic) else value


def _v(c, name, i):
  arr = np.broadcast_to(getattr(c, name), c.shape)
  value = arr[i]
  if isinstance(value, np.generic):
    value = value.item()
  return value


def _requires_rule(f):
  """A :class:`Rule` from a registry field's ``requires`` (other field,
  values, why): a value other than the absent one only where the other
  field takes one of the values."""
  other, values, why = f.requires
  other_f = _registry.field('execution', other)
  codes = [other_f.code(v) for v in values]
  absent = f.code(f.absent)

  def column(c, name):
    return c.sharding if name == 'data_par_sharding' else getattr(c, name)

  def bad(c):
    return (np.asarray(getattr(c, f.name)) != absent) & ~np.isin(
      column(c, other), codes)

  def label(name, code):
    g = _registry.field('execution', name)
    if g.names is None:
      return code
    value = g.names[code]
    return value.split(',') if name == 'recompute_modules' else value

  def message(c, i):
    code = np.broadcast_to(column(c, other), c.shape)[i]
    need = ' or '.join(show(v) for v in values)
    return (f'= {show(label(f.name, _v(c, f.name, i)))} is not allowed '
            f'with {other} = {show(label(other, int(code)))}: it needs '
            f'{other} = {need} ({why})')
  return Rule(f.name, bad, message)


def _procs_message(c, i):
  text = (f"= {_v(c, 'num_procs', i)} is not allowed: must equal "
          'tensor_par * pipeline_par * data_par')
  values = (f"{_v(c, 'tensor_par', i)} * {_v(c, 'pipeline_par', i)} * "
            f"{_v(c, 'data_par', i)}")
  if _v(c, 'context_par', i) != 1:
    text += ' * context_par'
    values += f" * {_v(c, 'context_par', i)}"
  return f'{text} = {values}'


def _broken(holds):
  """The executions breaking a rule of :mod:`calculon.config.parallel`
  (which says where it holds)."""
  return np.logical_not(holds)


def _schedule_violation(c):
  """Reason codes of the schedule table's constraints
  (:func:`calculon.llm.terms.schedules.violation`)."""
  from calculon.llm.terms.schedules import violation
  nmb = _parallel.num_microbatches(c.batch_size, c.data_par,
                                   c.microbatch_size)
  return violation(c.pipeline_schedule, c.pipeline_par,
                   c.pipeline_interleaving, nmb)


def _schedule_bad(c):
  if np.all(np.asarray(c.pipeline_schedule) == UNSET):
    return np.False_
  return _schedule_violation(c) != 0


def _schedule_message(c, i):
  from calculon.config.registry import PIPELINE_SCHEDULE_NAMES
  from calculon.llm.terms.schedules import violation_message
  name = PIPELINE_SCHEDULE_NAMES[_v(c, 'pipeline_schedule', i)]
  code = int(np.broadcast_to(_schedule_violation(c), c.shape)[i])
  return (f'= {show(name)} is not allowed with pipeline_par = '
          f"{_v(c, 'pipeline_par', i)}, pipeline_interleaving = "
          f"{_v(c, 'pipeline_interleaving', i)}: it "
          f'{violation_message(code, name)} (the schedule table, '
          'calculon/llm/terms/schedules.py)')


RULES = (
  Rule('num_procs',
       lambda c: _broken(_parallel.procs_match(
         c.num_procs, c.tensor_par, c.pipeline_par, c.data_par,
         c.context_par)), _procs_message),
  Rule('batch_size',
       lambda c: _broken(_parallel.batch_splits(c.batch_size, c.data_par)),
       lambda c, i: f"= {_v(c, 'batch_size', i)} is not allowed: must be a "
       f"multiple of data_par = {_v(c, 'data_par', i)}"),
  Rule('microbatch_size',
       lambda c: _broken(_parallel.microbatch_divides(
         c.batch_size, c.data_par, c.microbatch_size)),
       lambda c, i: f"= {_v(c, 'microbatch_size', i)} is not allowed: must "
       "divide the local batch size batch_size / data_par = "
       + str(_parallel.local_batch(_v(c, 'batch_size', i),
                                   _v(c, 'data_par', i)))),
  Rule('activation_recompute',
       lambda c: (c.activation_recompute != RECOMPUTE_NONE) & ~c.training,
       lambda c, i: f"= {show(RECOMPUTE_NAMES[_v(c, 'activation_recompute', i)])}"
       ' is not allowed: recomputation exists only when training; use '
       '"none" with training = false'),
  Rule('pipeline_interleaving',
       lambda c: _broken(_parallel.interleaving_needs_pp(
         c.pipeline_par, c.pipeline_interleaving)),
       lambda c, i: f"= {_v(c, 'pipeline_interleaving', i)} is not allowed: "
       "must be 1 when pipeline_par = 1"),
  Rule('pipeline_schedule', _schedule_bad, _schedule_message),
  Rule('optimizer_sharding',
       lambda c: c.optimizer_sharding & (c.data_par * c.context_par <= 1),
       lambda c, i: '= true is not allowed: optimizer sharding needs '
       'data_par > 1' + (' or context_par > 1'
                         if _v(c, 'context_par', i) != 1 else '')),
  Rule('data_par_sharding',
       lambda c: (c.data_par_sharding != UNSET) & (
         c.optimizer_sharding != (c.data_par_sharding != SHARD_NONE)),
       lambda c, i: f"= {show(SHARDING_NAMES[_v(c, 'data_par_sharding', i)])}"
       ' is not allowed with optimizer_sharding = '
       f"{show(bool(_v(c, 'optimizer_sharding', i)))}: leave "
       'optimizer_sharding out, or make it true exactly when the level is '
       'not "none"'),
  Rule('data_par_sharding',
       lambda c: (c.data_par_sharding > SHARD_NONE) & ~c.training,
       lambda c, i: f"= {show(SHARDING_NAMES[_v(c, 'data_par_sharding', i)])}"
       ' is not allowed: sharding over data parallelism exists only when '
       'training; use "none"'),
  Rule('expert_par',
       lambda c: _broken(_parallel.experts_fold(
         c.tensor_par, c.data_par, c.context_par, c.expert_par,
         c.expert_tensor_par)),
       lambda c, i: f"= {_v(c, 'expert_par', i)} is not allowed: "
       'expert_par * expert_tensor_par = '
       f"{_v(c, 'expert_par', i) * _v(c, 'expert_tensor_par', i)} must divide "
       'tensor_par * data_par * context_par = '
       f"{_v(c, 'tensor_par', i) * _v(c, 'data_par', i) * _v(c, 'context_par', i)}"
       ' (experts are folded onto the TP x DP x CP ranks of a pipeline stage, '
       'Megatron-Core MoE parallel folding)'),
  Rule('precision_recipe',
       lambda c: (c.precision_recipe == RECIPE_TE) & (
         (c.datatype != DATATYPE_NAMES.index('float8')) &
         (c.datatype != DATATYPE_NAMES.index('float4'))),
       lambda c, i: '= "transformer_engine" is not allowed with datatype '
       f"{show(DATATYPE_NAMES[_v(c, 'datatype', i)])}: it needs a narrow "
       'datatype ("float8" or "float4")'),
  Rule('tensor_par_overlap',
       lambda c: (c.tensor_par_overlap != TP_OVERLAP_NONE) & (c.tensor_par <= 1),
       lambda c, i: f"= {show(TP_OVERLAP_NAMES[_v(c, 'tensor_par_overlap', i)])}"
       ' is not allowed: TP communication overlap needs tensor_par > 1; use '
       '"none"'),
  *(_requires_rule(f) for f in _registry.EXECUTION if f.requires),
  Rule('seq_par_ag_redo',
       lambda c: c.seq_par_ag_redo & (c.tensor_par_comm_type != TP_COMM_RS_AG),
       lambda c, i: '= true is not allowed: redoing the all-gather needs '
       'tensor_par_comm_type = "rs_ag" (sequence parallelism)'),
  Rule('seq_par_ag_redo',
       lambda c: c.seq_par_ag_redo & (c.activation_recompute == RECOMPUTE_FULL),
       lambda c, i: '= true is not allowed with activation_recompute = '
       '"full" (full recomputation already redoes the all-gather)'),
  Rule('data_par_overlap',
       lambda c: c.data_par_overlap & ~c.training,
       lambda c, i: '= true is not allowed: DP communication exists only '
       'when training'),
  Rule('data_par_overlap',
       lambda c: c.data_par_overlap & (c.data_par * c.context_par <= 1),
       lambda c, i: '= true is not allowed: DP overlap needs data_par * '
       'context_par > 1 (the gradients are reduced over the DP x CP ranks)'),
  Rule('optimizer_offload',
       lambda c: c.optimizer_offload & ~c.training,
       lambda c, i: '= true is not allowed: the optimizer runs only when '
       'training'),
)


def rule_violations(columns):
  """Boolean mask (broadcast shape) of executions breaking any rule."""
  bad = np.zeros(columns.shape, dtype=bool)
  for rule in RULES:
    bad |= rule.bad(columns)
  return bad


def check_rules(columns, source='<execution>'):
  """Raises ConfigError for the first execution that breaks a rule.

  Raises:
    ConfigError: names the source, the execution (for batches), the field,
      its value and what is allowed.
  """
  shape = columns.shape
  with np.errstate(divide='ignore'):
    for rule in RULES:
      bad = np.broadcast_to(rule.bad(columns), shape)
      if bad.any():
        i = tuple(int(x) for x in np.argwhere(bad)[0])
        where = f' execution {i[0] if len(i) == 1 else i}:' \
          if shape not in ((), (1,)) else ''
        field = rule.field
        raise ConfigError(
          f"{source}:{where} field '{field}' {rule.message(columns, i)}",
          source=source, field=field, value=_v(columns, field, i))

