"""The resolution rule, in one place: a field written in the execution >
the execution's framework preset > the field's absent value.

Provides :func:`resolve_columns` (vectorized: a search grid, a published
row's candidates or one execution), :func:`allowed_mask` (the executions a
preset supports: its option values, offload kinds and constraints),
:func:`resolve_execution` (one JSON execution against its application) and
:func:`settings_of` (what a preset set, for reports).  Reads
:mod:`calculon.config.registry` (fields, codes) and the preset
(:mod:`calculon.frameworks.preset`).

Rules are applied in the preset's file order; a case's conditions read the
fields as resolved so far (so ``precision_recipe`` is settled before the
behaviours that depend on it).
"""

import dataclasses

import numpy as np

from calculon.config import registry
from calculon.config.execution import (
  ExecutionColumns, FIELD_SPECS, OPTIONAL_SPECS, RECOMPUTE_MODULE_SETS,
  UNSET, check_rules, json_value)
from calculon.config._schema import show
from calculon.errors import ConfigError
from calculon.frameworks import constraints as C
from calculon.frameworks.preset import OFFLOAD_KINDS


def code_of(name, value):
  """The engine's code (or plain value) of ``value`` of execution field
  ``name`` (the field's codec, :meth:`calculon.config.registry.Field.code`)."""
  return registry.field('execution', name).code(value)


def value_of(name, code):
  """The JSON value of an engine code of execution field ``name``
  (:meth:`calculon.config.registry.Field.value`)."""
  return registry.field('execution', name).value(code)


def _column(cols, name):
  value = getattr(cols, name)
  if name == 'data_par_sharding':
    return cols.sharding
  if name == 'pipeline_schedule':
    # Left out, it is Calculon's 1F1B or interleaved 1F1B (the schedule
    # table), which a preset allows by name.
    from calculon.llm.terms.schedules import effective
    return effective(np.asarray(value), cols.pipeline_interleaving)
  return value


def _condition(cols, app, when):
  """Bool array (or scalar) where every condition of ``when`` holds."""
  ok = np.True_
  for key, cond in when.items():
    if key == 'vocab_split_only_even':
      from calculon.llm.space import only_vocab_split_is_even
      hit = only_vocab_split_is_even(
        app.num_blocks, cols.pipeline_par * cols.pipeline_interleaving) & \
        bool(app.has_vocab)
      ok = ok & (hit if cond else ~hit)
      continue
    if key == 'experts':
      ok = ok & np.bool_(bool(app.is_moe) == cond)
      continue
    col = _column(cols, key)
    if isinstance(cond, dict):
      if 'min' in cond:
        ok = ok & (col >= cond['min'])
      if 'max' in cond:
        ok = ok & (col <= cond['max'])
    else:
      ok = ok & np.isin(col, [code_of(key, v) for v in cond])
  return ok


def _cases(rule, cols, app):
  """[(case, where it applies)] with first-match semantics."""
  out, taken = [], np.False_
  for case in rule.cases:
    cond = _condition(cols, app, case.when) if case.when else np.True_
    out.append((case, cond & ~taken))
    taken = taken | cond
  return out


def _dtype(name):
  return registry.field('execution', name).dtype


def resolve_columns(preset, app, cols, written=()):
  """Fills the fields of ``cols`` that are not ``written`` with what the
  preset does (each rule's ``value`` where its case applies), in place.

  Args:
    preset: :class:`~calculon.frameworks.preset.Preset`.
    app: the :class:`~calculon.config.Application`.
    cols: :class:`~calculon.config.ExecutionColumns` (any shapes); the
      fields not written hold their absent value.
    written: names of the fields given explicitly (never changed).

  Returns:
    ``cols``.
  """
  # Conditions read other fields as resolved so far: pass again until
  # nothing changes (a preset's rules need not be listed in dependency
  # order; each pass can only settle more of them).
  initial = {n: getattr(cols, n) for n in preset.rules}
  initial['optimizer_sharding'] = cols.optimizer_sharding
  for _ in range(len(preset.rules) + 1):
    before = {n: getattr(cols, n) for n in preset.rules}
    _resolve_once(preset, app, cols, written, initial)
    if all(np.array_equal(before[n], getattr(cols, n)) for n in before):
      return cols
  raise RuntimeError(f'framework {preset.name}: its rules do not settle')


def _resolve_once(preset, app, cols, written, initial):
  """One pass of :func:`resolve_columns` over the preset's rules: each
  field not written is what its first applying case gives, else its value
  before any pass (``initial``), its conditions reading ``cols`` as they
  stand."""
  for name, rule in preset.rules.items():
    if name in written:
      continue
    current = initial[name]
    new = current
    for case, here in reversed(_cases(rule, cols, app)):
      value = case.value
      if value is None and len(case.values) == 1:
        value = case.values[0]
      if value is None:
        continue
      new = np.where(here, code_of(name, value), new)
    new = np.asarray(new, dtype=_dtype(name))
    setattr(cols, name, new[()] if new.ndim == 0 else new)
    if name == 'data_par_sharding' and 'optimizer_sharding' not in written:
      cols.optimizer_sharding = np.where(
        cols.data_par_sharding == UNSET, initial['optimizer_sharding'],
        cols.data_par_sharding != registry.SHARDING_NAMES.index('none'))


def _allowed_codes(name, case):
  """Codes a case allows; for ``recompute_modules`` every set of the
  modules its values name (a framework recomputes any set of its
  modules)."""
  if name != 'recompute_modules':
    return [code_of(name, v) for v in case.allowed]
  modules = {m for v in case.allowed for m in v.split(',')}
  return [i for i, label in enumerate(RECOMPUTE_MODULE_SETS)
          if set(label.split(',')) <= modules]


def option_mask(preset, app, cols, names=None):
  """Bool array: executions whose option fields (all, or ``names``) take a
  value the preset allows where it applies (behaviours are not checked:
  a written behaviour overrides the preset)."""
  ok = np.True_
  for name, rule in preset.options.items():
    if names is not None and name not in names:
      continue
    col = _column(cols, name)
    good, taken = np.False_, np.False_
    for case, here in _cases(rule, cols, app):
      good = good | (here & np.isin(col, _allowed_codes(name, case)))
      taken = taken | here
    absent = registry.field('execution', name).absent
    if absent is not registry.REQUIRED:
      good = good | (~taken & (col == code_of(name, absent)))
    # An option every value of the grid meets adds nothing: skipping it
    # keeps the mask over the axes that matter (a search's grid spans
    # many; a broadcast AND of each would build the whole grid).
    if not np.all(good):
      ok = ok & good
  return ok


def offload_mask(preset, cols):
  """Bool array: executions whose offloads are a kind the preset has."""
  if preset.offload_kinds is None:
    return np.True_
  ok = np.False_
  flags = {k: np.asarray(getattr(cols, f), dtype=bool)
           for k, f in OFFLOAD_KINDS.items()}
  for kind in preset.offload_kinds:
    match = np.True_
    for k, flag in flags.items():
      match = match & (flag if k in kind else ~flag)
    ok = ok | match
  return ok


def allowed_mask(preset, app, cols):
  """Bool array: executions the preset supports (its option values,
  offload kinds and constraints); all True for a preset that is not
  strict."""
  if not preset.strict:
    return np.True_
  return option_mask(preset, app, cols) & offload_mask(preset, cols) & \
    C.mask(preset, cols, app)


def _allowed_text(rule, cols, app, name):
  for case, here in _cases(rule, cols, app):
    if np.any(here):
      vals = ', '.join(show(json_value(name, v)) for v in case.allowed)
      return vals, case.source or rule.source
  return show(json_value(name, registry.field('execution', name).absent)), \
    rule.source


def _fill_supported(preset, app, cols, filled):
  """Where a field the execution left out (``filled``, see
  :mod:`calculon.config.fill`) holds a value ``preset`` does not support,
  puts the first value it supports there (the applying case's first), in
  place; True when it changed one."""
  changed = False
  for name, rule in preset.options.items():
    if name not in filled or np.all(option_mask(preset, app, cols, (name,))):
      continue
    for case, here in _cases(rule, cols, app):
      if np.any(here):
        setattr(cols, name, np.asarray(code_of(name, case.allowed[0]),
                                       dtype=_dtype(name))[()])
        changed = True
        break
    if name == 'data_par_sharding':
      cols.optimizer_sharding = np.asarray(
        cols.data_par_sharding != registry.SHARDING_NAMES.index('none'))
  return changed


#: How to price an execution its framework does not support (a preset
#: that is not strict).
ANYWAY = ("; to price it anyway, use \"framework\": \"common\" (or "
          '--framework common)')


def check_allowed(preset, app, cols, source='<execution>'):
  """Raises ConfigError where one execution (0-d ``cols``) uses what a
  strict preset does not support.

  Raises:
    ConfigError: names the field, the value, the framework, what it allows
      and the source.
  """
  if not preset.strict:
    return
  for name, rule in preset.options.items():
    if np.all(option_mask(preset, app, cols, (name,))):
      continue
    value = value_of(name, _column(cols, name))
    allowed, why = _allowed_text(rule, cols, app, name)
    raise ConfigError(
      f"{source}: field '{name}' = {show(value)} is not allowed with "
      f"framework '{preset.name}': it supports {allowed}"
      + (f' ({why})' if why else '') + ANYWAY, source=source, field=name,
      value=value, allowed=allowed)
  if not np.all(offload_mask(preset, cols)):
    kinds = '; '.join(' + '.join(sorted(k)) or 'none'
                      for k in preset.offload_kinds)
    raise ConfigError(
      f"{source}: field 'weight_offload'/'activations_offload'/"
      f"'optimizer_offload' is not allowed with framework "
      f"'{preset.name}': it offloads {kinds}"
      + (f' ({preset.offload_source})' if preset.offload_source else '')
      + ANYWAY, source=source, field='optimizer_offload')
  try:
    C.check(preset, cols, app, source)
  except ConfigError as err:
    raise ConfigError(str(err) + ANYWAY, source=err.source,
                      field=err.field) from None


def rule_value(preset, app, name, **fields):
  """What ``preset`` sets field ``name`` to for an execution of which only
  ``fields`` (scalars, JSON values) are known -- its rule's conditions must
  read no other field -- or the field's absent value where no case
  applies (None when the rule only lists values to choose from)."""
  from types import SimpleNamespace
  rule = preset.rules.get(name)
  absent = registry.field('execution', name).absent
  if rule is None:
    return absent
  cols = SimpleNamespace(**{k: code_of(k, v) for k, v in fields.items()})
  for case, here in _cases(rule, cols, app):
    if bool(here):
      if case.value is not None:
        return case.value
      return case.values[0] if len(case.values) == 1 else None
  return absent


def settings_of(preset, cols, written=()):
  """{field: JSON value} of what the preset set in one execution (0-d
  ``cols``): its rules' fields not written, where it differs from the
  field's absent value."""
  out = {}
  for name in preset.rules:
    if name in written:
      continue
    value = value_of(name, _column(cols, name))
    absent = registry.field('execution', name).absent
    if value != json_value(name, absent) and not (
        name == 'data_par_sharding' and value == 'none'):
      out[name] = value
  return out


def resolve_execution(app, exe, framework=None, source='<execution>'):
  """One :class:`~calculon.config.Execution` resolved against its
  application: the preset of ``framework`` (else the execution's, else
  the default, :func:`calculon.frameworks.default_for`) fills the fields
  the execution did not write; a strict preset refuses what its framework
  does not support.

  Returns:
    (the resolved Execution, its framework's settings: {field: value}).

  Raises:
    ConfigError: an unknown framework, an unsupported option or offload,
      a broken constraint, or a resolved execution that breaks a rule.
  """
  from calculon.frameworks.catalog import default_for, load
  name = framework or exe.framework or default_for(app, exe)
  preset = load(name, source=source)
  record = exe.to_dict()
  cols = ExecutionColumns.from_records([record])
  for f in FIELD_SPECS:
    if f in ('optimizer_sharding', 'attention_type') and \
        getattr(exe, f) is None:
      continue
    setattr(cols, f, np.asarray(getattr(cols, f))[0])
  for f in OPTIONAL_SPECS:
    setattr(cols, f, np.asarray(getattr(cols, f))[0])
  if np.ndim(cols.optimizer_sharding):
    cols.optimizer_sharding = np.asarray(cols.optimizer_sharding)[0]
  if np.ndim(cols.attention_type):
    cols.attention_type = np.asarray(cols.attention_type)[0]
  written = exe.written if exe.written else frozenset(record)
  resolve_columns(preset, app, cols, written)
  if exe.filled and _fill_supported(preset, app, cols, exe.filled):
    resolve_columns(preset, app, cols, written)
  check_allowed(preset, app, cols, source)
  values = {}
  for f in preset.rules:
    if f in written:
      continue
    values[f] = value_of(f, getattr(cols, f))
  if 'recompute_modules' in values and values['recompute_modules']:
    values['recompute_modules'] = ','.join(values['recompute_modules'])
  if 'data_par_sharding' in values and exe.optimizer_sharding is not None \
      and 'optimizer_sharding' not in written:
    values['optimizer_sharding'] = values['data_par_sharding'] != 'none'
  resolved = dataclasses.replace(exe, framework=name, **values)
  check_rules(ExecutionColumns.from_records([resolved.to_dict()]), source)
  return resolved, settings_of(preset, cols, written)


def records_columns(app, records, framework=None, source='<execution>'):
  """1-d :class:`~calculon.config.ExecutionColumns` of JSON execution
  records, each resolved against ``app`` as ``calculon llm`` resolves it
  (:func:`resolve_execution`; ``framework`` as its ``--framework``).

  Raises:
    ConfigError: a record is not a valid execution, or its framework
      refuses it.
  """
  from calculon.config import Execution
  out = []
  for i, record in enumerate(records):
    where = source if len(records) == 1 else f'{source} {i}'
    exe = Execution.from_dict(dict(record), where)
    out.append(resolve_execution(app, exe, framework, where)[0].to_dict())
  for r in out:
    r.setdefault('attention_type', None)
    r.setdefault('optimizer_sharding', None)
  return ExecutionColumns.from_records(out)
