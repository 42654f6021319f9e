"""The sweep spec: what to search, read and validated at the door.

A sweep spec (YAML or JSON) lists applications, systems, variations of the
systems, processor counts, maximum batch sizes, datatypes and search
options; the cartesian product of these lists is the set of *points*, each
one optimal-execution search.  The format is documented in docs/sweep.md.

Every mistake raises :class:`~calculon.errors.ConfigError` naming the spec
file, the field, the value and what is allowed, before anything runs: the
files named are read and validated, and every varied system is built once
(so a variation that makes a system invalid, e.g. a network size of 2.4
processors, is reported here, not by a worker).
"""

from dataclasses import dataclass, field
import contextlib
import copy
import hashlib
import itertools
import json
import os
import re

from calculon import io
from calculon.config import Application
from calculon.config._schema import Reader, Spec, show
from calculon.config.execution import DATATYPE_NAMES, FIELD_SPECS
from calculon.errors import ConfigError

#: Top-level fields of a spec.
TOP_FIELDS = ('applications', 'systems', 'variations', 'num_procs',
              'max_batch_size', 'datatypes', 'search')
#: Variation modes: ``scale`` multiplies the system's value, ``value``
#: replaces it.
MODES = ('scale', 'value')
#: Columns every row has before the variation columns, and after them.
LEAD_COLUMNS = ('point_id', 'application', 'system')
POINT_COLUMNS = ('num_procs', 'max_batch_size', 'datatype')

_POSITIVE_INT = Spec('int', lo=1)


class _Reader(Reader):
  """A :class:`Reader` with optional fields."""

  def known(self, *names):
    """Declares fields as allowed (for :meth:`finish` and its message)."""
    self._used.update(names)
    return self

  def optional(self, name, spec, default):
    """The checked value of ``name``, or ``default`` when absent."""
    self.known(name)
    return self.get(name, spec) if name in self.obj else default


class _ListSpec(Spec):
  """Accepts anything (items are checked one by one); describes a list."""

  def __init__(self, text):
    super().__init__('list')
    self.text = text

  def describe(self):
    return self.text

  def accepts(self, value):
    return True
_SEGMENT = re.compile(r'^(\*|[A-Za-z_][A-Za-z0-9_]*)(?:\[(\*|\d+)\])?$')
_COLUMN = re.compile(r'^[A-Za-z_][A-Za-z0-9_.]*$')


@dataclass(frozen=True)
class SearchOptions:
  """Options of every point's search (``search:`` in the spec).

  Attributes:
    top_n: best executions kept per point (rows per feasible point).
    mbs_break: Calculon's -m rule.
    fused_activation: tuple of bools tried.
    tp_overlap, dp_overlap: try TP / DP communication overlap.
    framework: the framework preset searched (None: calculon for a
      Calculon application, else the recommended one).
  """
  top_n: int = 1
  mbs_break: bool = False
  fused_activation: tuple = (True,)
  tp_overlap: bool = True
  dp_overlap: bool = True
  framework: object = None

  def to_dict(self):
    out = {'top_n': self.top_n, 'mbs_break': self.mbs_break,
           'fused_activation': list(self.fused_activation),
           'tp_overlap': self.tp_overlap, 'dp_overlap': self.dp_overlap}
    if self.framework is not None:
      out['framework'] = self.framework
    return out


@dataclass(frozen=True)
class Variation:
  """One varied system field.

  Attributes:
    path: the field in the system JSON, e.g. 'networks[1].bandwidth';
      '*' matches every key or index ('matrix.*.tflops').
    mode: 'scale' (multiply the system's value) or 'value' (replace it).
    values: the factors or values (floats), in spec order.
    column: name of this variation's column in the output.
  """
  path: str
  mode: str
  values: tuple
  column: str

  def describe(self, value):
    """Short text of one setting, e.g. 'networks[1].bandwidth x0.5'."""
    v = _fmt(value)
    return f'{self.path} x{v}' if self.mode == 'scale' else \
      f'{self.path} = {v}'


@dataclass
class Point:
  """One search of a sweep.

  Attributes:
    id: 16 hex digits, a hash of everything the result depends on (names,
      variation values, the application and varied system JSON, processors,
      batch, datatype, search options): equal points have equal ids across
      runs and machines.
    params: column -> value of the point's parameters (application,
      system, one per variation, num_procs, max_batch_size, datatype).
    application: the application JSON object.
    system: the varied system JSON object.
    variant: the system and its variation values, as text (equal for
      points on the same varied system).
    label: readable description of the point (used in messages).
    search: :class:`SearchOptions`.
  """
  id: str
  params: dict
  application: dict
  system: dict
  variant: str
  label: str
  search: SearchOptions

  @property
  def num_procs(self):
    return self.params['num_procs']

  @property
  def max_batch_size(self):
    return self.params['max_batch_size']

  @property
  def datatype(self):
    return self.params['datatype']


@dataclass
class SweepSpec:
  """A validated sweep spec.

  Attributes:
    source: the spec file.
    applications: [(name, application JSON, [max batch sizes])].
    systems: [(name, system JSON)].
    variations: [:class:`Variation`].
    num_procs: [int]; datatypes: [str]; search: :class:`SearchOptions`.
  """
  source: str
  applications: list
  systems: list
  variations: list
  num_procs: list
  datatypes: list
  search: SearchOptions
  _variants: dict = field(default_factory=dict, repr=False)

  @property
  def param_columns(self):
    """Names of the point parameter columns, in row order."""
    return (['application', 'system'] + [v.column for v in self.variations]
            + list(POINT_COLUMNS))

  def variation_settings(self):
    """Every combination of variation values: list of tuples (one value per
    variation, in spec order); [()] without variations."""
    return list(itertools.product(*[v.values for v in self.variations]))

  def num_points(self):
    """Number of points (the size of the cartesian product)."""
    per_app = sum(len(mbs) for _, _, mbs in self.applications)
    return (per_app * len(self.systems) * len(self.variation_settings())
            * len(self.num_procs) * len(self.datatypes))

  def shape_text(self):
    """'2 applications x 1 system x 3 variations x ...' for messages."""
    parts = [_count(len(self.applications), 'application'),
             _count(len(self.systems), 'system')]
    if self.variations:
      parts.append(_count(len(self.variation_settings()),
                          'system variation'))
    parts.append(_count(len(self.num_procs), 'processor count'))
    mbs = sorted({len(m) for _, _, m in self.applications})
    parts.append(_count(mbs[0], 'max batch size') if len(mbs) == 1
                 else 'per-application batch sizes')
    parts.append(_count(len(self.datatypes), 'datatype'))
    return ' x '.join(parts)

  def points(self):
    """Every point, in spec order: applications, systems, variation
    settings, processor counts, batch sizes, datatypes (last fastest)."""
    out = []
    search = self.search.to_dict()
    for app_name, app, batches in self.applications:
      for sys_name, _ in self.systems:
        for setting in self.variation_settings():
          system, label = self._variants[(sys_name, setting)]
          for procs in self.num_procs:
            for batch in batches:
              for dtype in self.datatypes:
                params = {'application': app_name, 'system': sys_name}
                for var, value in zip(self.variations, setting):
                  params[var.column] = value
                params.update(num_procs=procs, max_batch_size=batch,
                              datatype=dtype)
                ident = point_id({
                  'params': params, 'application': app, 'system': system,
                  'variations': [[v.path, v.mode] for v in self.variations],
                  'search': search})
                out.append(Point(ident, params, app, system, label,
                                 f'{app_name} on {label}, {procs} procs, '
                                 f'max batch {batch}, {dtype}', self.search))
    return out


def point_id(canonical):
  """16 hex digits of the SHA-256 of ``canonical`` as sorted, compact JSON
  (floats as Python's shortest repr, so 0.5 and 0.50 agree)."""
  text = json.dumps(canonical, sort_keys=True, separators=(',', ':'),
                    allow_nan=False)
  return hashlib.sha256(text.encode('utf-8')).hexdigest()[:16]


def _count(n, what):
  return f'{n} {what}' + ('' if n == 1 else 's')


def _fmt(x):
  return str(int(x)) if float(x).is_integer() else repr(float(x))


# -- reading the file ---------------------------------------------------------

def _unique_pairs(source, pairs, line=None):
  keys = [k for k, _ in pairs]
  for k in keys:
    if keys.count(k) > 1:
      where = f' (line {line})' if line else ''
      raise ConfigError(f'{source}: field {show(k)} is given twice{where}',
                        source=source, field=str(k), value=k,
                        allowed='each field once')
  return dict(pairs)


def read_spec_file(filename):
  """Decoded YAML (or, for .json / .json.gz, JSON) of a spec file.

  Duplicate keys are errors (YAML and JSON parsers otherwise keep the last).

  Raises:
    ConfigError: missing or unreadable file, a syntax error (with its line),
      a duplicate key.
  """
  if io.is_json_extension(filename):
    # read_json_file reports missing files and syntax errors; decode again to
    # catch duplicate keys.
    io.read_json_file(filename)
    opener = __import__('gzip').open if filename.endswith('.gz') else open
    with opener(filename, 'rt', encoding='utf-8') as fd:
      return json.load(fd, object_pairs_hook=lambda p: _unique_pairs(
        filename, p))
  import yaml

  class Loader(yaml.SafeLoader):
    pass

  def mapping(loader, node, deep=False):
    loader.flatten_mapping(node)
    pairs = []
    for key_node, value_node in node.value:
      pairs.append((loader.construct_object(key_node, deep=deep),
                    loader.construct_object(value_node, deep=deep)))
    return _unique_pairs(filename, pairs, node.start_mark.line + 1)

  Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
                         mapping)
  # YAML 1.1 reads 1e-5 (no dot) as a string; read it as a number, as JSON
  # and YAML 1.2 do.
  Loader.add_implicit_resolver(
    'tag:yaml.org,2002:float', re.compile(
      r'^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$'),
    list('-+0123456789'))
  from calculon.io import read_text_file
  text = read_text_file(filename, 'sweep spec')
  try:
    return yaml.load(text, Loader=Loader)  # noqa: S506 -- a SafeLoader
  except yaml.YAMLError as err:
    mark = getattr(err, 'problem_mark', None)
    where = f' at line {mark.line + 1} column {mark.column + 1}' if mark \
      else ''
    problem = getattr(err, 'problem', None) or str(err)
    raise ConfigError(f'{filename}: not valid YAML: {problem}{where}',
                      source=filename) from None


def load_spec(filename):
  """Reads and validates a sweep spec.

  Paths of applications and systems are relative to the spec's folder.

  Returns:
    :class:`SweepSpec`.

  Raises:
    ConfigError: any problem in the spec or the files it names (the
      message names the file, the field, the value and what is allowed).
  """
  return parse_spec(read_spec_file(filename), filename)


def parse_spec(doc, source, base_dir=None):
  """Validates a decoded spec (see :func:`load_spec`); ``base_dir`` (default:
  the folder of ``source``) anchors relative paths."""
  if base_dir is None:
    base_dir = os.path.dirname(os.path.abspath(source))
  if doc is None:
    doc = {}
  reader = _Reader(doc, source)
  reader.known(*TOP_FIELDS).finish()   # unknown fields first (typos)
  apps = _read_applications(reader, base_dir)
  systems = _read_systems(reader, base_dir)
  variations = _read_variations(reader) if 'variations' in doc else []
  num_procs = _int_list(reader, 'num_procs')
  default_batches = _int_list(reader, 'max_batch_size') \
    if 'max_batch_size' in doc else None
  dtypes = _list_of(reader, 'datatypes',
                    Spec('str', choices=DATATYPE_NAMES))
  search = _read_search(reader) if 'search' in doc else SearchOptions()
  applications = []
  for name, cfg, batches, path in apps:
    if batches is None:
      if default_batches is None:
        raise ConfigError(
          f"{source}: missing field 'max_batch_size' (an integer >= 1 or a "
          f'list of them), needed by application {show(name)} which has '
          'no max_batch_size of its own', source=source,
          field='max_batch_size', allowed='an integer >= 1 or a list of them')
      batches = default_batches
    applications.append((name, cfg, batches))
  taken = set(LEAD_COLUMNS) | set(POINT_COLUMNS) | set(FIELD_SPECS) | {
    'rank', 'feasible', 'reason'}
  from calculon.sweep.store import STAT_COLUMNS, TAIL_COLUMNS
  taken |= set(STAT_COLUMNS) | set(TAIL_COLUMNS)
  for var in variations:
    if var.column in taken:
      raise ConfigError(
        f"{source}: field 'variations.{var.path}.name' = {show(var.column)} "
        'is not allowed: a column name not used by another column',
        source=source, field=f'variations.{var.path}.name', value=var.column,
        allowed='a column name not used by another column')
    taken.add(var.column)
  spec = SweepSpec(source, applications, [(n, c) for n, c, _ in systems],
                   variations, num_procs, dtypes, search)
  _build_variants(spec, {n: p for n, _, p in systems})
  return spec


def _entries(reader, name, kind):
  """Entries of 'applications' or 'systems': a path or {file, name, ...}."""
  items = _list_of(reader, name, None,
                   what=f'a path to a {kind} JSON file or an object with '
                   '"file" and optionally "name"')
  out = []
  for i, item in enumerate(items):
    where = f'{name}[{i}]'
    if isinstance(item, str):
      sub = None
      path = item
    elif isinstance(item, dict):
      sub = _Reader(item, reader.source, where).known('file', 'name')
      path = sub.get('file', Spec('str'))
    else:
      reader.fail(where, item, f'a path to a {kind} JSON file, or an object '
                  'with "file" and optionally "name"')
    if not path:
      reader.fail(where, item, f'a path to a {kind} JSON file')
    out.append((where, sub, path))
  return out


def _resolve(base_dir, path):
  return path if os.path.isabs(path) else os.path.normpath(
    os.path.join(base_dir, path))


def _name(reader, sub, path, where, seen, kind):
  if sub is not None and 'name' in sub.obj:
    name = sub.get('name', Spec('str'))
    if not name.strip() or name != name.strip():
      sub.fail('name', name, 'a non-empty string')
  else:
    name = os.path.basename(path)
    for ext in ('.gz', '.json'):
      if name.endswith(ext):
        name = name[:-len(ext)]
  if name in seen:
    raise ConfigError(
      f"{reader.source}: field '{where}': {kind} name {show(name)} is "
      f'used twice ({seen[name]} and {path}): give one a "name"',
      source=reader.source, field=where, value=name,
      allowed=f'distinct {kind} names')
  seen[name] = path
  return name


@contextlib.contextmanager
def _within(source, where):
  """Prefixes errors of a file named by the spec with the spec's field."""
  try:
    yield
  except ConfigError as err:
    raise ConfigError(f"{source}: field '{where}': {err}", source=err.source,
                      field=err.field, value=err.value,
                      allowed=err.allowed) from None


def _read_applications(reader, base_dir):
  out, seen = [], {}
  for where, sub, path in _entries(reader, 'applications', 'application'):
    full = _resolve(base_dir, path)
    name = _name(reader, sub, path, where, seen, 'application')
    batches = None
    if sub is not None:
      if 'max_batch_size' in sub.obj:
        batches = _int_list(sub, 'max_batch_size')
      sub.known('max_batch_size').finish()
    with _within(reader.source, where):
      cfg = io.load_application(full).to_dict()
    out.append((name, cfg, batches, full))
  return out


def _read_systems(reader, base_dir):
  out, seen = [], {}
  for where, sub, path in _entries(reader, 'systems', 'system'):
    full = _resolve(base_dir, path)
    name = _name(reader, sub, path, where, seen, 'system')
    if sub is not None:
      sub.finish()
    with _within(reader.source, where):
      cfg = io.read_json_file(full)
      io.load_system(full)  # validates
    out.append((name, cfg, full))
  return out


def _list_of(reader, name, spec, numbers=False, what=None):
  """A non-empty list (a lone value counts as a list of one) whose items
  satisfy ``spec`` (None: any), without duplicates."""
  what = what or (spec.describe() if spec else 'items')
  allowed = f'{what}, or a non-empty list of them'
  value = reader.get(name, _ListSpec(allowed))
  items = value if isinstance(value, list) else [value]
  if value is None or not items:
    reader.fail(name, value, allowed)
  for i, item in enumerate(items):
    if spec is not None and not spec.accepts(item):
      reader.fail(f'{name}[{i}]' if isinstance(value, list) else name, item,
                  spec.describe())
  keys = [json.dumps(float(x) if numbers else x, sort_keys=True)
          for x in items]
  for i, k in enumerate(keys):
    if keys.index(k) != i:
      reader.fail(f'{name}[{i}]', items[i],
                  f'each value once ({show(items[i])} is already listed)')
  return list(items)


_ANY = _ListSpec('any value')


def _int_list(reader, name):
  return [int(v) for v in _list_of(reader, name, _POSITIVE_INT)]


def _read_search(reader):
  sub = _Reader(reader.get('search', Spec('dict')), reader.source, 'search')
  defaults = SearchOptions()
  opt = sub.optional
  top_n = opt('top_n', _POSITIVE_INT, defaults.top_n)
  mbs_break = opt('mbs_break', Spec('bool'), defaults.mbs_break)
  fused = opt('fused_activation', _ANY, True)
  if fused is True or fused is False:
    fused = (fused,)
  elif fused == 'both':
    fused = (False, True)
  else:
    sub.fail('fused_activation', fused, 'true, false or "both"')
  tp = opt('tp_overlap', Spec('bool'), defaults.tp_overlap)
  dp = opt('dp_overlap', Spec('bool'), defaults.dp_overlap)
  framework = opt('framework', Spec('str'), None)
  if framework is not None:
    from calculon import frameworks
    frameworks.load(framework, source=f'{reader.source}: search.framework')
  sub.finish()
  return SearchOptions(int(top_n), mbs_break, fused, tp, dp, framework)


def _default_column(path, mode):
  text = re.sub(r'\[(\d+)\]', r'_\1', path).replace('[*]', '_all')
  text = text.replace('*', 'all').replace('.', '_')
  return text + ('_scale' if mode == 'scale' else '')


def _read_variations(reader):
  obj = reader.get('variations', Spec('dict', nullable=True)) or {}
  out = []
  for path, body in obj.items():
    where = f'variations.{path}'
    if not isinstance(path, str) or not all(
        _SEGMENT.match(s) for s in path.split('.')):
      raise ConfigError(
        f"{reader.source}: field 'variations' has key {show(path)}, which is "
        'not allowed: a path of a numeric field of the system JSON, e.g. '
        '"networks[1].bandwidth", "mem1.GiB", "matrix.*.tflops"',
        source=reader.source, field='variations', value=path,
        allowed='a system field path')
    modes = [m for m in MODES if m in body] if isinstance(body, dict) \
      else []
    if len(modes) != 1:
      raise ConfigError(
        f"{reader.source}: field '{where}' = {show(body)} is not allowed: "
        'an object with exactly one of "scale" (factors) or "value" '
        '(values), and optionally "name"', source=reader.source, field=where,
        value=body, allowed='one of "scale" or "value"')
    sub = _Reader(body, reader.source, where).known('name')
    mode = modes[0]
    spec = Spec('number', lo=0, lo_open=(mode == 'scale'))
    values = tuple(float(v) for v in _list_of(sub, mode, spec, numbers=True))
    column = _default_column(path, mode)
    if 'name' in body:
      column = sub.get('name', Spec('str'))
      if not _COLUMN.match(column):
        sub.fail('name', column, 'a column name: letters, digits, "_" and '
                 '".", not starting with a digit')
    sub.finish()
    out.append(Variation(path, mode, values, column))
  return out


# -- applying variations ------------------------------------------------------

def _leaves(obj, segments, trail=''):
  """(container, key, path) of every field ``segments`` matches.

  Raises:
    LookupError: with a message, when a segment matches nothing.
  """
  if not segments:
    return [(None, None, trail)]
  head, rest = segments[0], segments[1:]
  m = _SEGMENT.match(head)
  key, index = m.group(1), m.group(2)
  if not isinstance(obj, dict):
    raise LookupError(f'{trail or "the top level"} is not an object')
  keys = list(obj) if key == '*' else [key]
  if key != '*' and key not in obj:
    have = ', '.join(show(k) for k in obj)
    raise LookupError(f'{trail or "the top level"} has no field {show(key)} '
                      f'(it has: {have})')
  out = []
  for k in keys:
    here = f'{trail}.{k}' if trail else k
    targets = [(obj, k, here)]
    if index is not None:
      seq = obj[k]
      if not isinstance(seq, list):
        raise LookupError(f'{here} is not a list')
      idx = range(len(seq)) if index == '*' else [int(index)]
      for i in idx:
        if i >= len(seq):
          raise LookupError(f'{here} has {len(seq)} entries (0 to '
                            f'{len(seq) - 1}), not [{i}]')
      targets = [(seq, i, f'{here}[{i}]') for i in idx]
    for container, ck, path in targets:
      if rest:
        out.extend(_leaves(container[ck], rest, path))
      else:
        out.append((container, ck, path))
  return out


def variation_leaves(system, path):
  """The fields of ``system`` (a JSON dict) that ``path`` names, as
  (container, key, concrete path).

  Raises:
    LookupError: the path matches nothing or a matched field is not a number.
  """
  leaves = _leaves(system, path.split('.'))
  if not leaves:
    raise LookupError('it matches no field')
  for container, key, where in leaves:
    value = container[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
      raise LookupError(f'{where} = {show(value)} is not a number')
  return leaves


def apply_variations(system, variations, setting):
  """A copy of ``system`` (JSON dict) with each variation's value of
  ``setting`` applied; integer fields stay integers when the result is whole.

  Raises:
    LookupError: a path matches no numeric field.
  """
  out = copy.deepcopy(system)
  for var, value in zip(variations, setting):
    for container, key, _ in variation_leaves(out, var.path):
      old = container[key]
      new = old * value if var.mode == 'scale' else value
      if isinstance(old, int) and float(new).is_integer():
        new = int(new)
      container[key] = new
  return out


def _build_variants(spec, paths):
  """Builds and validates every (system, variation setting) once."""
  from calculon.hardware import System
  settings = spec.variation_settings()
  for name, cfg in spec.systems:
    for var in spec.variations:
      try:
        variation_leaves(cfg, var.path)
      except LookupError as err:
        raise ConfigError(
          f"{spec.source}: field 'variations.{var.path}' is not allowed for "
          f'system {show(name)} ({paths[name]}): {err}',
          source=spec.source, field=f'variations.{var.path}', value=var.path,
          allowed='a path of a numeric field present in every system') \
          from None
    for setting in settings:
      varied = apply_variations(cfg, spec.variations, setting)
      desc = ', '.join(v.describe(x) for v, x in zip(spec.variations,
                                                     setting))
      label = name + (f' ({desc})' if desc else '')
      System(varied, f'{spec.source}: system {label}')
      spec._variants[(name, setting)] = (varied, label)
