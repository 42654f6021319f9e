"""A framework preset: what a training framework does, supports and
requires, as data (``frameworks/NAME.json``).

Provides :class:`Preset` (read and checked from its JSON object against the
field registry) and :class:`Rule` (one field's values under conditions).
Reads :mod:`calculon.config.registry` (which fields exist, which are
behaviours, what each accepts) and :mod:`calculon.frameworks.constraints`
(the constraint kinds a preset may name).

A preset's JSON object::

  {
    "name": "megatron-core",             # = the file's stem
    "title": "...", "era": "...", "source": "...", "notes": "...",
    "strict": true,                      # written options must be allowed
    "space": "modern",                   # or "calculon" (Calculon's grid)
    "fields": {FIELD: RULE, ...},        # execution fields it sets/allows
    "offload": {"kinds": [[], ["optimizer"], ...], "optimizer_step":
                "host"|"device", "source": "..."},
    "constraints": [{"check": KIND, "value": N, "source": "..."}, ...],
    "run": {...}                         # whole-run facts (checkpoints)
  }

A RULE is one case or a list of cases under ``"cases"``; a case is
``{"value": V}`` (what the framework does: the one value it takes when the
execution does not say) or ``{"values": [V, ...]}`` (what it supports: the
search tries each), or both (``value`` among ``values``: the default of a
choice the search does not vary), optionally with ``"when": {FIELD:
[values] | {"min": n, "max": m}, ...}`` (every condition must hold; the
pseudo-field ``vocab_split_only_even`` is true where PP x VP divides the
blocks plus two and not the blocks alone, ``experts`` where the application
has experts), and a ``"source"``.  The first
case whose conditions hold applies; where none does, the field keeps its
absent value (the registry's).
"""

from calculon.config import registry
from calculon.errors import ConfigError

#: What a case may name as a condition besides execution fields.
PSEUDO_CONDITIONS = ('vocab_split_only_even', 'experts')
#: What may be offloaded to memory tier 2 (the execution's three flags).
OFFLOAD_KINDS = {'weights': 'weight_offload',
                 'activations': 'activations_offload',
                 'optimizer': 'optimizer_offload'}
SPACES = ('calculon', 'modern')
_TOP_KEYS = ('name', 'title', 'era', 'source', 'notes', 'strict', 'space',
             'fields', 'offload', 'constraints', 'run')


def _fail(source, where, value, allowed):
  from calculon.config._schema import show
  raise ConfigError(f"{source}: field '{where}' = {show(value)} is not "
                    f'allowed: {allowed}', source=source, field=where,
                    value=value, allowed=allowed)


def _check_value(source, where, name, value):
  """Checks one value of execution field ``name``; returns it canonical."""
  f = registry.field('execution', name)
  if name == 'recompute_modules':
    from calculon.config.execution import recompute_modules_label
    return recompute_modules_label(value, source, where)
  if not f.spec.accepts(value):
    _fail(source, where, value, f.spec.describe())
  return value


class Case:
  """One case of a :class:`Rule`: conditions, the value taken, the values
  allowed."""

  __slots__ = ('when', 'value', 'values', 'source')

  def __init__(self, when, value, values, source):
    self.when, self.value, self.values, self.source = \
      when, value, values, source

  @property
  def allowed(self):
    """The values allowed under this case."""
    return self.values if self.values is not None else (self.value,)


class Rule:
  """A field's cases (first match applies), see the module docstring."""

  __slots__ = ('field', 'cases', 'source')

  def __init__(self, field, cases, source):
    self.field, self.cases, self.source = field, cases, source

  @property
  def fixed(self):
    """True when every case has one value and no list: the framework does
    it (a behaviour), nothing to choose."""
    return all(c.values is None for c in self.cases)

  @property
  def all_values(self):
    """Every value any case allows, in first-seen order."""
    out = []
    for case in self.cases:
      for v in case.allowed:
        if v not in out:
          out.append(v)
    return out

  @classmethod
  def read(cls, source, name, raw):
    where = f'fields.{name}'
    if name not in registry.FIELDS['execution'] or name == 'framework':
      _fail(source, 'fields', name, 'an execution field (see '
            'docs/reference/executions.md)')
    if not isinstance(raw, dict):
      _fail(source, where, raw, 'an object: {"value": V} or {"values": '
            '[...]} or {"cases": [...]}')
    if 'cases' in raw:
      extra = set(raw) - {'cases', 'source'}
      if extra or not isinstance(raw['cases'], list) or not raw['cases']:
        _fail(source, where, raw, 'an object with a non-empty "cases" list '
              '(and a "source")')
      items = [(f'{where}.cases[{i}]', c) for i, c in enumerate(raw['cases'])]
    else:
      items = [(where, raw)]
    cases = []
    for w, item in items:
      cases.append(cls._case(source, name, w, item))
    return cls(name, tuple(cases), raw.get('source', ''))

  @staticmethod
  def _case(source, name, where, raw):
    if not isinstance(raw, dict):
      _fail(source, where, raw, 'an object')
    extra = sorted(set(raw) - {'when', 'value', 'values', 'source'})
    if extra:
      _fail(source, f'{where}.{extra[0]}', raw[extra[0]],
            'one of when, value, values, source')
    if 'value' not in raw and 'values' not in raw:
      _fail(source, where, raw, 'a "value" or a "values" list')
    value = values = None
    if 'value' in raw:
      value = _check_value(source, f'{where}.value', name, raw['value'])
    if 'values' in raw:
      if not isinstance(raw['values'], list) or not raw['values']:
        _fail(source, f'{where}.values', raw['values'], 'a non-empty list')
      values = tuple(_check_value(source, f'{where}.values', name, v)
                     for v in raw['values'])
      if value is not None and value not in values:
        _fail(source, f'{where}.value', value, 'one of its "values"')
    when = {}
    for key, cond in (raw.get('when') or {}).items():
      w = f'{where}.when.{key}'
      if key in PSEUDO_CONDITIONS:
        if not isinstance(cond, bool):
          _fail(source, w, cond, 'true or false')
        when[key] = cond
        continue
      if key not in registry.FIELDS['execution'] or key == 'framework':
        _fail(source, f'{where}.when', key, 'an execution field or one of '
              + ', '.join(PSEUDO_CONDITIONS))
      f = registry.field('execution', key)
      if isinstance(cond, dict):
        if f.spec.kind != 'int' or not cond or set(cond) - {'min', 'max'} \
            or not all(isinstance(v, int) for v in cond.values()):
          _fail(source, w, cond, '{"min": n, "max": m} (integer fields)')
        when[key] = dict(cond)
      elif isinstance(cond, list) and cond:
        when[key] = tuple(_check_value(source, w, key, v) for v in cond)
      else:
        _fail(source, w, cond, 'a non-empty list of values or {"min": n, '
              '"max": m}')
    return Case(when, value, values, raw.get('source', ''))


class Preset:
  """A framework preset (see the module docstring).

  Attributes:
    name, title, era, source, notes: text.
    strict: written option values must be among the preset's.
    space: 'calculon' (Calculon's search grid) or 'modern'.
    rules: {field: :class:`Rule`} in file order.
    offload_kinds: tuple of frozensets of ``OFFLOAD_KINDS`` keys allowed
      together (None: any combination).
    optimizer_step: where the optimizer step runs with optimizer offload
      ('host' or 'device'; None without offload).
    offload_source: its source.
    constraints: tuple of :class:`~calculon.frameworks.constraints.
      Constraint`.
    run: dict of whole-run facts (checkpoint saving...).
    path: the file it was read from.
  """

  def __init__(self, raw, source):
    from calculon.config._schema import Reader, Spec
    from calculon.frameworks import constraints as C
    reader = Reader(raw, source)
    self.path = source
    self.name = reader.get('name', Spec('str'))
    for key in ('title', 'era', 'source', 'notes'):
      setattr(self, key, reader.get(key, Spec('str')) if key in raw else '')
    self.strict = reader.get('strict', Spec('bool')) \
      if 'strict' in raw else True
    self.space = reader.get('space', Spec('str', choices=SPACES)) \
      if 'space' in raw else 'modern'
    fields = reader.get('fields', Spec('dict')) if 'fields' in raw else {}
    self.rules = {name: Rule.read(source, name, rule)
                  for name, rule in fields.items()}
    self.offload_kinds = None
    self.optimizer_step = None
    self.offload_source = ''
    if 'offload' in raw:
      off = reader.get('offload', Spec('dict'))
      sub = Reader(off, source, 'offload')
      kinds = sub.get('kinds', Spec('list'))
      out = []
      for i, kind in enumerate(kinds):
        if not isinstance(kind, list) or not all(k in OFFLOAD_KINDS
                                                 for k in kind):
          _fail(source, f'offload.kinds[{i}]', kind, 'a list among ' +
                ', '.join(OFFLOAD_KINDS))
        out.append(frozenset(kind))
      self.offload_kinds = tuple(out)
      if 'optimizer_step' in off:
        self.optimizer_step = sub.get('optimizer_step', Spec(
          'str', choices=('host', 'device')))
      if 'source' in off:
        self.offload_source = sub.get('source', Spec('str'))
      sub.finish()
    cons = reader.get('constraints', Spec('list')) \
      if 'constraints' in raw else []
    self.constraints = tuple(C.Constraint.read(source, f'constraints[{i}]', c)
                             for i, c in enumerate(cons))
    self.run = reader.get('run', Spec('dict')) if 'run' in raw else {}
    if 'checkpoint' in self.run:
      sub = Reader(self.run['checkpoint'], source, 'run.checkpoint')
      sub.get('mode', Spec('str', choices=('blocking', 'async')))
      for key in ('parallel_save', 'parallel_load'):
        sub.get(key, Spec('bool'))
      sub.get('background_slowdown', Spec('number', lo=0, hi=1,
                                          hi_open=True))
      if 'source' in self.run['checkpoint']:
        sub.get('source', Spec('str'))
      sub.finish()
    reader.finish()

  @property
  def behaviours(self):
    """{field: Rule} of the registry's behaviour fields it sets."""
    return {n: r for n, r in self.rules.items()
            if registry.field('execution', n).behaviour}

  @property
  def options(self):
    """{field: Rule} of the other fields it sets or allows."""
    return {n: r for n, r in self.rules.items()
            if not registry.field('execution', n).behaviour}

  def offload_allowed(self, kinds):
    """Whether offloading ``kinds`` (a set of OFFLOAD_KINDS keys) together
    is something this framework does."""
    return self.offload_kinds is None or frozenset(kinds) in \
      self.offload_kinds

  def __repr__(self):
    return f'Preset({self.name})'
