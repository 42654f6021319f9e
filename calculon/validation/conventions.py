"""The conventions that map a measured run onto the model, as data.

``validation/conventions.yaml`` (documented in that file and in
docs/accuracy.md) holds every default and rule used to turn a row of a
measured-runs CSV into an application, an execution and a system: the
hardware table, the datatype and recomputation tables, the model families,
the rules implied by a source, framework or era, and the approximations
that notes may name.  This module only reads and checks it; no source has
code of its own.

Patterns are Python regular expressions matched case-insensitively with
``re.search``.
"""

from dataclasses import dataclass, field
import os
import re

from calculon.config.execution import (
  DATATYPE_NAMES, PRECISION_RECIPE_NAMES, RECOMPUTE_MODULES, RECOMPUTE_NAMES,
  SCALING_NAMES)
from calculon.config.application import OPTIONAL as APP_OPTIONAL
from calculon.errors import ConfigError

#: The execution settings a row's mapping searches when the row leaves
#: them unstated (the candidate axes of
#: :mod:`calculon.validation.mapping`), the names ``unstated.defaults``
#: entries may set.
SEARCHED_SETTINGS = (
  'microbatch_size', 'pipeline_interleaving', 'activation_recompute',
  'tensor_par_comm_type', 'tensor_par_overlap', 'data_par_overlap',
  'data_par_sharding', 'attention_kernel', 'fused_activation',
  'moe_comm_overlap')

#: FLOP conventions of a measured TFLOP/s or MFU figure (see
#: :func:`calculon.validation.mapping.convention_flops`).
FLOPS_CONVENTIONS = ('model_full', 'model_causal', 'megatron_eq3')
#: Fused attention kernels a rule may name (the ``attention_implementation``
#: setting): FlashAttention-2, FlashAttention-3, cuDNN's fused attention.
#: A hardware entry's ``attention_kernels`` says how fast each runs there
#: relative to the system file's ``fused_attention_efficiency`` (the best
#: kernel of that hardware); a kernel it does not list runs at the file's.
ATTENTION_IMPLEMENTATIONS = ('fa2', 'fa3', 'cudnn')
#: Datatypes gradients may be kept and reduced in (``gradient_datatype``).
GRADIENT_DATATYPES = ('float32', 'bfloat16', 'float16')

#: Settings a rule may fix (or restrict to a list searched) that are not
#: execution fields: how the measured figure's FLOP are counted, the fused
#: attention kernel a framework runs ('attention_implementation', see the
#: hardware table's ``attention_kernels``), and 'pipeline_microbatches'
#: ('pp': one microbatch per pipeline stage when the row states no
#: microbatch size, torchtitan's default).  Every execution field of the
#: registry (:mod:`calculon.config.registry`) may be set too, with the
#: values its spec allows, and ``framework`` names a preset of
#: ``frameworks/``.
MAPPING_SETTINGS = {
  'flops_convention': FLOPS_CONVENTIONS,
  'attention_implementation': ATTENTION_IMPLEMENTATIONS,
  'pipeline_microbatches': ('pp',),
}


def setting_names():
  """Every key a rule's ``set`` may hold."""
  from calculon.config import registry
  return tuple(registry.FIELDS['execution']) + tuple(MAPPING_SETTINGS)


#: How a row's unstated (searched) settings are priced (the ``unstated``
#: section's ``mode``): the fastest feasible candidate, or the framework's
#: default of each (the fastest feasible where that is infeasible).
UNSTATED_MODES = ('fastest', 'default')


#: CSV columns a pattern may look at (the parallel degrees as written, e.g.
#: ``pp: '^([2-9]|[1-9]\\d+)$'`` for pipeline parallelism).
MATCH_COLUMNS = ('source', 'model_name', 'gpu_type', 'dtype', 'recompute',
                 'seq_parallel', 'notes', 'measured_metric_name', 'tp', 'pp',
                 'dp', 'cp', 'trained_from')


def default_path(base_dir):
  """``BASE_DIR/validation/conventions.yaml``."""
  return os.path.join(base_dir, 'validation', 'conventions.yaml')


@dataclass
class Rule:
  """One rule: its name, patterns (column -> compiled regex), settings,
  reason; ``any``: one matching pattern suffices (else all)."""
  name: str
  match: dict
  settings: dict
  why: str
  any: bool = False

  def applies(self, row):
    hits = [bool(p.search(_text(row.get(col)))) for col, p in
            self.match.items()]
    return any(hits) if self.any else all(hits)


@dataclass
class Conventions:
  """The parsed conventions file (see the module docstring).

  Attributes:
    path: where it was read from.
    defaults: dict of the ``defaults`` section.
    hardware, datatypes, recompute, models: lists of dicts with a compiled
      ``match`` pattern, in file order.
    recompute_modules: the same, each naming a Megatron-Core module
      (``module``); every entry matching a selective row's recompute text
      adds its module.
    sp_yes, sp_no: patterns of the seq_parallel column.
    rules: list of :class:`Rule`; approximations: list of (Rule, text,
      unless_model): the text applies to a matching row unless its priced
      application sets one of the ``unless_model`` fields (the model
      prices that feature for it).
    unstated_mode: which candidate of the unstated settings a row is
      priced at, one of :data:`UNSTATED_MODES`; unstated_defaults: the
      ``unstated.defaults`` entries (dicts: setting, value, frameworks --
      a tuple of preset names or None for any -- and why), in file order.
  """
  path: str
  defaults: dict
  hardware: list
  datatypes: list
  recompute: list
  models: list
  recompute_modules: list
  sp_yes: object
  sp_no: object
  rules: list = field(default_factory=list)
  approximations: list = field(default_factory=list)
  unstated_mode: str = 'fastest'
  unstated_defaults: list = field(default_factory=list)

  def first(self, table, text):
    """The first entry of ``table`` whose pattern matches ``text``."""
    for entry in table:
      if entry['match'].search(_text(text)):
        return entry
    return None


def _text(value):
  if value is None or (isinstance(value, float) and value != value):
    return ''
  return str(value)


def _fail(path, where, value, allowed):
  raise ConfigError(f'{path}: field {where!r} = {value!r} is not allowed: '
                    f'{allowed}', source=path, field=where, value=value,
                    allowed=allowed)


def _regex(path, where, text):
  if not isinstance(text, str) or not text:
    _fail(path, where, text, 'a non-empty regular expression')
  try:
    return re.compile(text, re.IGNORECASE)
  except re.error as err:
    _fail(path, where, text, f'a valid regular expression ({err})')


def _entries(path, doc, name, what):
  """(where, entry) of the list ``doc[name]`` (absent: empty).

  Raises:
    ConfigError: not a list.
  """
  raw = doc.get(name, [])
  if not isinstance(raw, list):
    _fail(path, name, raw, f'a list of {what}')
  return [(f'{name}[{i}]', entry) for i, entry in enumerate(raw)]


def _check_keys(path, where, entry, allowed):
  """Raises ConfigError naming the first key of ``entry`` not in
  ``allowed``."""
  unknown = sorted(set(entry) - set(allowed))
  if unknown:
    _fail(path, f'{where}.{unknown[0]}', entry[unknown[0]],
          'one of ' + ', '.join(sorted(allowed)))


def _table(path, doc, name, keys):
  out = []
  for where, entry in _entries(path, doc, name, 'entries'):
    if not isinstance(entry, dict) or 'match' not in entry:
      _fail(path, where, entry, "an object with a 'match' pattern")
    _check_keys(path, where, entry, set(keys) | {'match', 'why'})
    item = dict(entry)
    item['match'] = _regex(path, f'{where}.match', entry['match'])
    out.append(item)
  return out


def _check_setting(path, where, key, value):
  """Checks one setting against :data:`MAPPING_SETTINGS` or the field
  registry (a list: each value)."""
  from calculon.config import registry
  if key not in setting_names():
    _fail(path, where, key, 'a setting: an execution field (see '
          'docs/reference/executions.md) or one of ' +
          ', '.join(MAPPING_SETTINGS))
  values = value if isinstance(value, list) else [value]
  for v in values:
    if key in MAPPING_SETTINGS:
      ok, text = v in MAPPING_SETTINGS[key], 'one of ' + ', '.join(
        MAPPING_SETTINGS[key])
    elif key == 'framework':
      from calculon import frameworks
      ok = v in frameworks.names()
      text = 'one of ' + ', '.join(frameworks.names())
    elif key == 'recompute_modules':
      ok, text = isinstance(v, str) and all(
        m in registry.RECOMPUTE_MODULES for m in v.split(',')), \
        'module names among ' + ', '.join(registry.RECOMPUTE_MODULES)
    else:
      spec = registry.field('execution', key).spec
      ok, text = spec.accepts(v), spec.describe()
    if not ok:
      _fail(path, f'{where}.{key}', v, text)


def _rules(path, doc, name, text_key=None):
  out = []
  for where, entry in _entries(path, doc, name, 'rules'):
    if not isinstance(entry, dict) or not isinstance(entry.get('match'),
                                                     dict):
      _fail(path, where, entry, "an object with a 'match' object of column "
            'patterns')
    _check_keys(path, where, entry,
                {'name', 'match', 'set', 'why', 'any'} if text_key is None
                else {'match', 'text', 'any', 'unless_model'})
    match = {}
    for col, pattern in entry['match'].items():
      if col not in MATCH_COLUMNS:
        _fail(path, f'{where}.match', col, 'a column, one of ' +
              ', '.join(MATCH_COLUMNS))
      match[col] = _regex(path, f'{where}.match.{col}', pattern)
    if text_key is None:
      settings = entry.get('set', {})
      if not isinstance(settings, dict):
        _fail(path, f'{where}.set', settings, 'an object of settings')
      for key, value in settings.items():
        _check_setting(path, f'{where}.set', key, value)
      out.append(Rule(str(entry.get('name', where)), match, dict(settings),
                      str(entry.get('why', '')), bool(entry.get('any'))))
    else:
      unless = entry.get('unless_model', [])
      if not isinstance(unless, list) or not all(
          isinstance(u, str) for u in unless):
        _fail(path, f'{where}.unless_model', unless,
              'a list of application fields')
      out.append((Rule(where, match, {}, '', bool(entry.get('any'))),
                  str(entry.get('text', '')), tuple(unless)))
  return out


def load(path):
  """Reads and checks a conventions file.

  Raises:
    ConfigError: the file is missing, not YAML, or an entry is malformed
      (the message names the entry and what is allowed).
  """
  import yaml
  from calculon.io import read_text_file
  text = read_text_file(path, 'conventions file')
  try:
    doc = yaml.safe_load(text)
  except yaml.YAMLError as err:
    raise ConfigError(f'{path}: not valid YAML: {err}', source=path) from None
  if not isinstance(doc, dict):
    _fail(path, 'the top level', doc, 'a mapping')
  defaults = doc.get('defaults', {})
  if not isinstance(defaults, dict):
    _fail(path, 'defaults', defaults, 'a mapping')
  for key, kind in (('ffn_per_hidden', 'number'),
                    ('gated_ffn_multiple_of', 'int')):
    if key in defaults and not (isinstance(defaults[key], (int, float))
                                and defaults[key] > 0):
      _fail(path, f'defaults.{key}', defaults[key], 'a positive number')
  if defaults.get('datatype', 'bfloat16') not in DATATYPE_NAMES:
    _fail(path, 'defaults.datatype', defaults.get('datatype'),
          'one of ' + ', '.join(DATATYPE_NAMES))
  if 'framework' in defaults:
    _check_setting(path, 'defaults', 'framework', defaults['framework'])
  if defaults.get('flops_convention', 'model_full') not in FLOPS_CONVENTIONS:
    _fail(path, 'defaults.flops_convention', defaults.get('flops_convention'),
          'one of ' + ', '.join(FLOPS_CONVENTIONS))
  hardware = _table(path, doc, 'hardware', ('system', 'set', 'unsupported',
                                            'cluster', 'attention_kernels'))
  for i, entry in enumerate(hardware):
    if ('system' in entry) == ('unsupported' in entry):
      _fail(path, f'hardware[{i}]', entry.get('system'),
            "exactly one of 'system' and 'unsupported'")
    kernels = entry.get('attention_kernels', {})
    if not isinstance(kernels, dict):
      _fail(path, f'hardware[{i}].attention_kernels', kernels,
            'a mapping of kernel name to a number in (0, 1]')
    for name, value in kernels.items():
      if name not in ATTENTION_IMPLEMENTATIONS:
        _fail(path, f'hardware[{i}].attention_kernels', name,
              'one of ' + ', '.join(ATTENTION_IMPLEMENTATIONS))
      if isinstance(value, bool) or not isinstance(value, (int, float)) or \
          not 0 < value <= 1:
        _fail(path, f'hardware[{i}].attention_kernels.{name}', value,
              'a number in (0, 1]')
  datatypes = _table(path, doc, 'datatypes', ('datatype', 'precision_recipe',
                                               'quantization_scaling'))
  for i, entry in enumerate(datatypes):
    if entry.get('datatype') not in DATATYPE_NAMES:
      _fail(path, f'datatypes[{i}].datatype', entry.get('datatype'),
            'one of ' + ', '.join(DATATYPE_NAMES))
    for key, names in (('precision_recipe', PRECISION_RECIPE_NAMES),
                       ('quantization_scaling', SCALING_NAMES)):
      if key in entry and entry[key] not in names:
        _fail(path, f'datatypes[{i}].{key}', entry[key],
              'one of ' + ', '.join(names))
  recompute = _table(path, doc, 'recompute', ('value', 'search',
                                              'approximate'))
  for i, entry in enumerate(recompute):
    if not entry.get('search') and entry.get('value') not in RECOMPUTE_NAMES:
      _fail(path, f'recompute[{i}].value', entry.get('value'),
            'one of ' + ', '.join(RECOMPUTE_NAMES) + ' (or search: true)')
  modules = _table(path, doc, 'recompute_modules', ('module',))
  for i, entry in enumerate(modules):
    if entry.get('module') not in RECOMPUTE_MODULES:
      _fail(path, f'recompute_modules[{i}].module', entry.get('module'),
            'one of ' + ', '.join(RECOMPUTE_MODULES))
  models = _table(path, doc, 'models', ('file', 'traits'))
  for i, entry in enumerate(models):
    for key in entry.get('traits', {}) or {}:
      if key not in APP_OPTIONAL:
        _fail(path, f'models[{i}].traits', key, 'an optional application '
              'field, one of ' + ', '.join(APP_OPTIONAL))
  mode, unstated = _unstated(path, doc)
  sp = doc.get('seq_parallel', {}) or {}
  return Conventions(
    unstated_mode=mode, unstated_defaults=unstated,
    path=path, defaults=defaults, hardware=hardware, datatypes=datatypes,
    recompute=recompute, models=models, recompute_modules=modules,
    sp_yes=_regex(path, 'seq_parallel.enabled', sp.get('enabled', r'^\s*y')),
    sp_no=_regex(path, 'seq_parallel.disabled', sp.get('disabled',
                                                      r'^\s*n')),
    rules=_rules(path, doc, 'rules'),
    approximations=_rules(path, doc, 'approximations', text_key='text'))


def _unstated(path, doc):
  """(mode, defaults) of the ``unstated`` section (see
  :class:`Conventions`); absent: ('fastest', [])."""
  from calculon import frameworks
  AXES = SEARCHED_SETTINGS
  section = doc.get('unstated', {}) or {}
  if not isinstance(section, dict):
    _fail(path, 'unstated', section, "a mapping with 'mode' and 'defaults'")
  _check_keys(path, 'unstated', section, ('mode', 'defaults'))
  mode = section.get('mode', 'fastest')
  if mode not in UNSTATED_MODES:
    _fail(path, 'unstated.mode', mode, 'one of ' + ', '.join(UNSTATED_MODES))
  entries = section.get('defaults', []) or []
  if not isinstance(entries, list):
    _fail(path, 'unstated.defaults', entries, 'a list of entries')
  out = []
  for i, entry in enumerate(entries):
    where = f'unstated.defaults[{i}]'
    if not isinstance(entry, dict):
      _fail(path, where, entry, 'a mapping with setting, value and why')
    _check_keys(path, where, entry, ('setting', 'value', 'frameworks', 'why'))
    key = entry.get('setting')
    if key not in AXES:
      _fail(path, f'{where}.setting', key, 'one of ' + ', '.join(AXES))
    if 'value' not in entry or isinstance(entry['value'], list):
      _fail(path, f'{where}.value', entry.get('value'), 'one value')
    _check_setting(path, where, key, entry['value'])
    names = entry.get('frameworks')
    if names is not None:
      if not isinstance(names, list) or any(n not in frameworks.names()
                                             for n in names):
        _fail(path, f'{where}.frameworks', names, 'a list of presets among '
              + ', '.join(frameworks.names()))
      names = tuple(names)
    out.append({'setting': key, 'value': entry['value'], 'frameworks': names,
                'why': _text(entry.get('why'))})
  return mode, out
