"""A measured run (one CSV row) mapped onto the model, by conventions.

:func:`build_case` turns a row of a measured-runs CSV (the columns of
``../shared/measurements/published_runs.csv``, see :data:`FACT_COLUMNS`)
into a :class:`Case`: an application, a system, the execution settings the
row fixes and those it leaves unknown (searched), and every assumption made
on the way.  Nothing here knows a source: the defaults, the hardware table,
the model families and the rules implied by a framework or an era are data
(:mod:`calculon.validation.conventions`, ``validation/conventions.yaml``).

Facts a row may write in its ``notes`` as ``key=value`` (any source, any
order; documented in docs/accuracy.md): ``num_experts``, ``top_k``,
``moe_ffn_hidden``, ``shared_experts``, ``shared_ffn``, ``dense_layers=first
N``, ``moe_layer_freq``, ``capacity_factor``, ``ep``, ``etp``,
``router_groups``, ``router_group_topk`` (Mixture of Experts; the last two:
group-limited routing); ``q_lora_rank``, ``kv_lora_rank``, ``qk_head_dim``,
``qk_rope_dim``, ``v_head_dim`` (multi-head latent attention);
``head_dim`` or ``kv_channels`` (the attention head width when it is not
hidden / heads); ``peak_mem_GiB`` or ``mem_GiB`` (the measured peak memory
per GPU, GiB: compared with the memory the model needs, not used to price
the time).
"""

from dataclasses import dataclass, field
import math
import os
import re

import numpy as np

from calculon.config import parallel as P
from calculon.config import registry as _registry
from calculon.config.execution import (
  ATTENTION_KERNEL_NAMES, FIELD_SPECS, FIELDS, OPTIONAL_SPECS,
  RECOMPUTE_NAMES, json_value,
  recompute_modules_label, SHARDING_NAMES, TP_COMM_NAMES, TP_OVERLAP_NAMES)
from calculon.config.application import router_groups_fit
from calculon.config.system import OPTIONAL_EFFICIENCIES
from calculon.validation.conventions import SEARCHED_SETTINGS
from calculon.errors import ConfigError
from calculon.io import read_json_file
from calculon.validation.system_files import datasheet_path, relative

#: Columns of the shared measurements file, in its order.
FACT_COLUMNS = (
  'source', 'model_name', 'num_layers', 'hidden', 'ffn_hidden', 'attn_heads',
  'kv_heads', 'seq_len', 'vocab', 'num_gpus', 'gpu_type', 'tp', 'pp', 'dp',
  'cp', 'vp', 'global_batch_size', 'micro_batch_size', 'recompute',
  'seq_parallel', 'dtype', 'measured_metric_name', 'measured_value', 'notes')
#: Fact columns that hold counts: blank, or a whole number >= 1.
COUNT_COLUMNS = (
  'num_layers', 'hidden', 'ffn_hidden', 'attn_heads', 'kv_heads', 'seq_len',
  'vocab', 'num_gpus', 'tp', 'pp', 'dp', 'cp', 'vp', 'global_batch_size',
  'micro_batch_size')
#: Fact columns a file must have (the others may be absent: blank).
REQUIRED_COLUMNS = ('source', 'model_name', 'num_gpus', 'gpu_type',
                    'seq_len', 'measured_metric_name', 'measured_value')
#: Optional override columns (none is required; the former per-source
#: builder of validation/published_runs.csv wrote some of them): ``id`` (a name for the row), ``source_group``
#: (cross-validation group; default the first word of ``source``),
#: ``source_short`` (a label), ``system`` (a bundled system name or a JSON
#: path), ``mlp``, ``block_layout``, ``assumptions`` (``key=value; ...``
#: settings, see :data:`ASSUMPTION_ALIASES`), ``unsupported`` (reasons the
#: row cannot be priced), ``trained_from`` (YYYY-MM, when the run began
#: training, where its source says: the conventions' era rules read it
#: beside the source's date).  ``assumptions_why`` is informational.
OVERRIDE_COLUMNS = ('id', 'source_group', 'source_short', 'system', 'mlp',
                    'block_layout', 'assumptions', 'assumptions_why',
                    'unsupported', 'trained_from')

#: Measured metrics and how each becomes a time.
CONVERSIONS = {
  'iteration_time_s': 'batch time = the measured iteration time (s)',
  'tokens_per_sec_per_gpu': 'batch time = B * s / (value * N) '
  '(B global batch, s sequence, N GPUs)',
  'tflops_per_gpu': 'batch time = F / (value * 1e12 * N), F the FLOP of one '
  "batch in the source's convention (flops_convention)",
  'mfu_pct': 'batch time = F / (value / 100 * peak * N), peak the system '
  "file's matrix FLOP/s for the datatype",
  'layer_fwd_plus_bwd_ms': 'time of one transformer layer, forward + '
  'backward of one microbatch = value / 1000 (s); predicted with a 1-block '
  'model: fw + bw + recompute + exposed TP communication',
}
#: How an alias's value becomes its metric's: kind -> (what the
#: assumptions say, function of (value, GPUs, sequence)).
ALIAS_CONVERSIONS = {
  'same': ('as it is', lambda v, n, s: v),
  'ms': ('x 0.001', lambda v, n, s: v / 1e3),
  'per_gpu': ('divided by the GPUs', lambda v, n, s: v / n),
  'samples': ('times the sequence over the GPUs', lambda v, n, s: v * s / n),
  'fraction_or_pct': ('x 100 when at most 1 (a fraction)',
                      lambda v, n, s: v * 100 if v <= 1 else v),
}
#: Other names of the measured metrics, as logs and papers write them
#: (matched in lower case, '/' read as 'per', parentheses dropped, spaces
#: and dashes as '_': "Step time (ms)" is step_time_ms): name -> (the
#: metric of :data:`CONVERSIONS`, a kind of :data:`ALIAS_CONVERSIONS`;
#: 'samples' is samples per second of the whole job, 'per_gpu' a rate of
#: the whole job).  Megatron-LM's log prints "elapsed time per iteration
#: (ms)"; "TGS" is tokens per GPU per second.
METRIC_ALIASES = {
  **{name: ('iteration_time_s', 'same') for name in (
    'step_time_s', 'step_time', 'iteration_time', 'iter_time_s',
    'batch_time_s', 'time_per_step_s', 'time_per_iteration_s',
    'elapsed_time_per_iteration_s', 'seconds_per_step', 's_per_step')},
  **{name: ('iteration_time_s', 'ms') for name in (
    'iteration_time_ms', 'step_time_ms', 'iter_time_ms', 'batch_time_ms',
    'time_per_step_ms', 'elapsed_time_per_iteration_ms')},
  **{name: ('tokens_per_sec_per_gpu', 'same') for name in (
    'tokens_per_second_per_gpu', 'tokens_per_s_per_gpu', 'tok_per_s_per_gpu',
    'tokens_per_sec_per_device', 'tgs')},
  **{name: ('tokens_per_sec_per_gpu', 'per_gpu') for name in (
    'tokens_per_sec', 'tokens_per_second', 'tokens_per_s',
    'throughput_tokens_per_sec')},
  **{name: ('tokens_per_sec_per_gpu', 'samples') for name in (
    'samples_per_sec', 'samples_per_second', 'sequences_per_sec',
    'sequences_per_second')},
  **{name: ('tflops_per_gpu', 'same') for name in (
    'tflops', 'model_tflops_per_gpu', 'tflops_per_device',
    'tflop_per_s_per_gpu', 'tflops_per_s_per_gpu', 'tflop_per_s',
    'tflops_per_s')},
  **{name: ('mfu_pct', 'fraction_or_pct') for name in (
    'mfu', 'mfu_percent', 'mfu_%')},
}


#: Words that make a throughput name a rate of the whole job: prefixes
#: ('global_tokens_per_sec') and suffixes ('tokens_per_sec_total',
#: 'tflops_per_job').
JOB_PREFIXES = ('global_', 'total_', 'job_', 'cluster_')
JOB_SUFFIXES = ('_total', '_per_job', '_global', '_per_cluster', '_job')


def _job_rate(key):
  """(metric, kind) of a throughput name marked as the whole job's
  (:data:`JOB_PREFIXES`, :data:`JOB_SUFFIXES`), or None: the rate of the
  name without the mark, divided by the GPUs (samples: times the sequence
  over the GPUs); times and MFU are not rates of a job."""
  bases = [key[len(p):] for p in JOB_PREFIXES if key.startswith(p)]
  bases += [key[:-len(x)] for x in JOB_SUFFIXES if key.endswith(x)]
  for base in bases:
    metric, kind = METRIC_ALIASES.get(base, (base, 'same') if base in
                                      CONVERSIONS else (None, None))
    if metric in ('tokens_per_sec_per_gpu', 'tflops_per_gpu') and \
        kind in ('same', 'per_gpu') and 'per_gpu' not in base and \
        'per_device' not in base and base != 'tgs':
      return metric, 'per_gpu'
    if kind == 'samples':
      return metric, 'samples'
  return None


def canonical_metric(name):
  """(metric of :data:`CONVERSIONS`, kind of :data:`ALIAS_CONVERSIONS`) of
  a measured metric name (itself, 'same', when it is one;
  :data:`METRIC_ALIASES`; a throughput named as the whole job's, e.g.
  ``global_tokens_per_sec`` or ``tflops_total``, per GPU by
  :func:`_job_rate`), or (name, None) when unknown."""
  if name in CONVERSIONS:
    return name, 'same'
  key = name.strip().lower().replace('/', ' per ')
  key = re.sub(r'[\s_-]+', '_', re.sub(r'[()]', ' ', key)).strip('_')
  if key in CONVERSIONS:
    return key, 'same'
  if key in METRIC_ALIASES:
    return METRIC_ALIASES[key]
  return _job_rate(key) or (name, None)


#: FLOP conventions (the ``flops_convention`` setting).
FLOPS_CONVENTION_TEXT = {
  'model_full': 'model FLOP, whole attention matrix (PaLM appendix B 6N + '
  '12LHQT; torchtitan)',
  'model_causal': 'model FLOP, causal half of the attention matrix '
  '(Megatron-LM num_floating_point_operations since 2025; NeMo)',
  'megatron_eq3': 'Narayanan et al. 2021 eq. 3: model FLOP of the blocks x '
  '4/3 (the recomputed forward pass) + the logits layer',
}

#: Keys of the ``assumptions`` override column: settings (see
#: :func:`calculon.validation.conventions.setting_names`) and the older names
#: (vp, micro_batch_size, recompute, seq_parallel, optimizer_sharding).
ASSUMPTION_ALIASES = {
  'vp': 'pipeline_interleaving', 'micro_batch_size': 'microbatch_size',
  'recompute': 'activation_recompute', 'seq_parallel': 'seq_parallel',
  'optimizer_sharding': 'data_par_sharding',
}
#: Settings searched when nothing fixes them, in the order of the grid axes.
AXES = SEARCHED_SETTINGS
#: Categorical execution fields and their names (the execution schema's).
CATEGORIES = {name: entry[1] for name, entry in
              {**FIELD_SPECS, **OPTIONAL_SPECS}.items()
              if entry[1] is not None}
#: The largest microbatch searched.
MAX_MICROBATCH = 64
#: A ``trained_from`` cell: the month a run began training, YYYY-MM.
_TRAINED_FROM_RE = re.compile(r'^\d{4}-(0[1-9]|1[0-2])$')
#: The sharding an unstated data_par_sharding may be: none or ZeRO-1 (the
#: distributed optimizer), the sharding every framework offers; gradient
#: and parameter sharding (ZeRO-2/3, FSDP) change the step enough that a
#: source using them names them (ZeRO, Rajbhandari et al., arXiv 1910.02054,
#: section 5; FSDP, Zhao et al., arXiv 2304.11277).
UNSTATED_SHARDING = ('none', 'optimizer')
#: Offloads to the host a search may choose where the row states none: no
#: offload (ZeRO-Offload, Ren et al., arXiv 2101.06840, and activation
#: offloading are techniques a source that used them names; a stated
#: layout's unstated offload is off as well).
UNSTATED_OFFLOADS = ('weight_offload', 'activations_offload',
                     'optimizer_offload')
#: Notes keys (see the module docstring) -> application / execution field.
NOTES_KEYS = {
  'num_experts': 'num_experts', 'top_k': 'top_k',
  'moe_ffn_hidden': 'moe_ffn_hidden', 'shared_experts': 'shared_experts',
  'shared_ffn': 'shared_expert_ffn_hidden', 'moe_layer_freq':
  'moe_layer_freq', 'capacity_factor': 'capacity_factor',
  'q_lora_rank': 'q_lora_rank', 'kv_lora_rank': 'kv_lora_rank',
  'qk_head_dim': 'qk_nope_head_dim', 'qk_rope_dim': 'qk_rope_head_dim',
  'v_head_dim': 'v_head_dim', 'ep': 'expert_par', 'etp': 'expert_tensor_par',
  'router_groups': 'moe_router_num_groups',
  'router_group_topk': 'moe_router_group_topk',
}
_NOTES_RE = re.compile(
  r'\b(num_experts|top_k|moe_ffn_hidden|shared_experts|shared_ffn|'
  r'moe_layer_freq|capacity_factor|q_lora_rank|kv_lora_rank|qk_head_dim|'
  r'qk_rope_dim|v_head_dim|ep|etp|dense_layers|router_groups|'
  r'router_group_topk|head_dim(?:\(kv_channels\))?|'
  r'kv_channels)\s*=\s*(first\s+)?([0-9]+(?:\.[0-9]+)?)', re.IGNORECASE)


def blank(value):
  """True for None, NaN and empty strings."""
  return value is None or (isinstance(value, float) and math.isnan(value)) \
    or (isinstance(value, str) and not value.strip())


def text(value):
  """The cell as a stripped string ('' when blank)."""
  return '' if blank(value) else str(value).strip()


def _is_count(cell):
  """Whether a non-blank cell is a whole number >= 1."""
  try:
    value = float(cell)
  except ValueError:
    return False
  return math.isfinite(value) and value >= 1 and value == int(value)


def number(value):
  """The cell as an integer (None when blank or not a number)."""
  if blank(value):
    return None
  try:
    x = float(str(value).strip())
  except ValueError:
    return None
  return int(round(x)) if math.isfinite(x) else None


#: A measured peak memory per GPU in the notes (GiB).
_MEMORY_RE = re.compile(
  r'\b(?:peak_)?mem(?:ory)?_GiB\s*=\s*([0-9]+(?:\.[0-9]+)?)', re.IGNORECASE)


def measured_memory_gib(notes):
  """The measured peak memory per GPU a notes cell states
  (``peak_mem_GiB=83.9`` or ``mem_GiB=...``), GiB; None when it states
  none."""
  m = _MEMORY_RE.search(text(notes))
  return float(m.group(1)) if m else None


def notes_facts(notes):
  """dict of the ``key=value`` facts of a notes cell (see the module)."""
  out = {}
  for key, _, value in _NOTES_RE.findall(text(notes)):
    key = key.lower()
    if key.startswith('head_dim') or key == 'kv_channels':
      key = 'head_dim'
    num = float(value)
    out.setdefault(key, num if key == 'capacity_factor' else int(num))
  return out


def source_group(row):
  """Cross-validation group of a row: its ``source_group`` column, else the
  first word of its source (the author or the repository)."""
  given = text(row.get('source_group'))
  if given:
    return given
  words = text(row.get('source')).split()
  return words[0] if words else '(no source)'


def group_slug(group):
  """A short lowercase name of a group (ids): the part after the last '/'."""
  slug = re.sub(r'[^a-z0-9]+', '-', group.split('/')[-1].lower()).strip('-')
  return slug[:24] or 'run'


@dataclass
class Case:
  """One measured run mapped onto the model.

  Attributes:
    row: the CSV row (dict of strings; blanks '').
    id, group: a name and the cross-validation group.
    missing: reasons the row cannot be priced (empty when it can).
    assumptions: list of (setting, value, why) not stated by the columns.
    approximations: texts of what the model prices differently.
    app: application JSON object.
    system_name: bundled system (file name without .json) or a path;
    system_set: field changes of the system for this row (dotted path ->
      value); cluster: its calibration unit (default: the system name).
    fixed: execution fields fixed (JSON values).
    axes: searched setting -> list of values (one value: fixed).
    flops_convention, flops_approximate: how a TFLOP/s or MFU figure is
      converted (approximate: the vocabulary or the convention is assumed).
    measured_s: measured batch (or layer) time in seconds (set when the
      system is known).
    priced_blocks: blocks the engine prices when they differ from the
      model's (an uneven pipeline layout priced by its largest virtual
      stage; see :attr:`priced_app`), else None.
    defaults: searched setting -> the framework default the row is priced
      at (conventions ``unstated.mode: default``; empty in mode
      ``fastest``): see :func:`choose`.
  """
  row: dict
  id: str = ''
  group: str = ''
  missing: list = field(default_factory=list)
  assumptions: list = field(default_factory=list)
  approximations: list = field(default_factory=list)
  app: dict = None
  system_name: str = None
  system_set: dict = field(default_factory=dict)
  cluster: str = None
  attention_kernels: dict = field(default_factory=dict)
  fixed: dict = field(default_factory=dict)
  axes: dict = field(default_factory=dict)
  flops_convention: str = 'model_full'
  flops_approximate: bool = False
  measured_s: float = None
  priced_blocks: int = None
  defaults: dict = field(default_factory=dict)

  @property
  def priced_app(self):
    """The application the engine prices: :attr:`app`, with
    :attr:`priced_blocks` blocks where set (the measured figure's FLOP
    conversion keeps the model's own count)."""
    if self.priced_blocks is None or self.app is None:
      return self.app
    return dict(self.app, num_blocks=self.priced_blocks)

  @property
  def metric(self):
    """The measured metric, one of :data:`CONVERSIONS` when the row's
    name is one or an alias of one (:data:`METRIC_ALIASES`)."""
    return canonical_metric(text(self.row.get('measured_metric_name')))[0]

  @property
  def measured_value(self):
    """The measured value in :attr:`metric`'s unit (None when it is not
    a number or the metric is unknown)."""
    _, kind = canonical_metric(text(self.row.get('measured_metric_name')))
    gpus, seq = (number(self.row.get(k)) for k in ('num_gpus', 'seq_len'))
    try:
      value = float(text(self.row.get('measured_value')))
    except ValueError:
      return None
    if kind is None or (kind in ('per_gpu', 'samples') and not gpus) or (
        kind == 'samples' and not seq):
      return None
    return ALIAS_CONVERSIONS[kind][1](value, gpus, seq)

  @property
  def measured_mem_gib(self):
    """Measured peak memory per GPU from the notes (GiB), or None."""
    return measured_memory_gib(self.row.get('notes'))

  @property
  def expressible(self):
    return not self.missing

  def assume(self, key, value, why):
    self.assumptions.append((key, value, why))

  def assumptions_text(self):
    """``key=value; ...`` of the assumptions."""
    return '; '.join(f'{k}={_show(v)}' for k, v, _ in self.assumptions)

  def candidates(self):
    """Number of executions searched."""
    return int(np.prod([len(v) for v in self.axes.values()])) \
      if self.axes else 0


def _show(value):
  if isinstance(value, list):
    return '|'.join(_show(v) for v in value)
  if isinstance(value, bool):
    return 'true' if value else 'false'
  if isinstance(value, dict) and set(value) == {'times'}:
    return f"x {value['times']}"
  return str(value)


def _factors(x):
  return [c for c in range(1, x + 1) if x % c == 0]


def _load_model(base_dir, name, cache):
  if name not in cache:
    path = os.path.join(base_dir, 'models', f'{name}.json')
    cfg = read_json_file(path)
    cache[name] = {k: v for k, v in cfg.items()
                   if k not in ('name', 'source', 'notes')}
  return dict(cache[name])


def _load_system(base_dir, name, cache):
  if name not in cache:
    cache[name] = read_json_file(datasheet_path(base_dir, name))
  return cache[name]


#: Fields of a system file whose absence means 1: the optional
#: efficiencies and the measured tables' sustained clock.
ABSENT_IS_ONE = OPTIONAL_EFFICIENCIES + ('sustained_clock',)
#: Sections a system file may lack (``measured``: the kernel tables).
OPTIONAL_SECTIONS = ('measured',)


def apply_system_set(cfg, changes):
  """A copy of system JSON ``cfg`` with dotted-path ``changes`` applied
  (``mem1.GiB``, ``networks[0].size``...).  A value ``{'times': x}``
  multiplies the field instead (a kernel slower than the file's best, on
  top of whatever the file says, calibrated or not).  A ``{'times': x}``
  change of a field whose absence means 1 (:data:`ABSENT_IS_ONE`) sets an
  absent one to x; one under an optional section the file lacks
  (:data:`OPTIONAL_SECTIONS`: ``measured.sustained_clock`` on a file
  without tables) has nothing to scale and is not applied.

  Raises:
    ConfigError: a path that does not exist in ``cfg``.
  """
  import copy
  out = copy.deepcopy(cfg)
  for path, value in changes.items():
    obj = out
    parts = re.findall(r'[^.\[\]]+', path)
    times = isinstance(value, dict) and 'times' in value
    for i, part in enumerate(parts):
      key = int(part) if part.isdigit() else part
      last = i == len(parts) - 1
      try:
        if not last and times and key in OPTIONAL_SECTIONS and \
            key not in obj:
          break
        if last and times:
          current = obj[key] if key not in ABSENT_IS_ONE else obj.get(key)
          obj[key] = (1.0 if current is None else current) * value['times']
        elif last:
          obj[key]   # must exist
          obj[key] = value
        else:
          obj = obj[key]
      except (KeyError, IndexError, TypeError):
        raise ConfigError(f"system field '{path}' is not allowed: it does not "
                          'exist in the system file', field=path,
                          value=value) from None
  return out


class Mapper:
  """Maps rows onto the model with one set of conventions.

  Args:
    base_dir: folder with models/ and systems/.
    conventions: a :class:`~calculon.validation.conventions.Conventions`.
    framework: a preset every row is priced under (default: its rules').
    unstated: 'fastest' or 'default' (:data:`~calculon.validation.
      conventions.UNSTATED_MODES`): how the unstated settings are priced
      (default: the conventions' ``unstated.mode``).
  """

  def __init__(self, base_dir, conventions, framework=None, unstated=None):
    from calculon.validation.conventions import UNSTATED_MODES
    self.base_dir = base_dir
    self.conv = conventions
    self.framework = framework
    self.unstated = unstated or conventions.unstated_mode
    if self.unstated not in UNSTATED_MODES:
      raise ConfigError(f"field 'unstated' = {self.unstated!r} is not "
                        f"allowed: one of {', '.join(UNSTATED_MODES)}",
                        field='unstated', value=self.unstated)
    self._models = {}
    self._systems = {}

  def system_json(self, case):
    """The system JSON object of ``case`` (its field changes applied):
    the datasheet file of its system (:func:`~calculon.validation.
    system_files.datasheet_path`)."""
    cfg = _load_system(self.base_dir, case.system_name, self._systems)
    return apply_system_set(cfg, case.system_set) if case.system_set else cfg

  def system_source(self, case):
    """The file :meth:`system_json` reads, as ``systems/NAME.json``."""
    return relative(self.base_dir,
                    datasheet_path(self.base_dir, case.system_name))

  # -- the parts of a case ---------------------------------------------------------
  def _hardware(self, case):
    row = case.row
    given = text(row.get('system'))
    if given:
      case.system_name = given
      return
    entry = self.conv.first(self.conv.hardware, row.get('gpu_type'))
    if entry is None:
      case.missing.append(f"hardware {text(row.get('gpu_type'))!r} matches "
                          'no entry of the hardware table')
    elif 'unsupported' in entry:
      case.missing.append(str(entry['unsupported']))
    else:
      case.system_name = entry['system']
      case.cluster = entry.get('cluster')
      case.attention_kernels = dict(entry.get('attention_kernels') or {})
      for path, value in (entry.get('set') or {}).items():
        case.system_set[path] = value
        case.assume(f'system.{path}', value, entry.get('why', 'hardware '
                                                       'table'))

  def _model(self, case, facts):
    """The application, from the columns, the notes facts, the family file
    and traits, and the defaults (in that precedence)."""
    row, d = case.row, self.conv.defaults
    entry = self.conv.first(self.conv.models, row.get('model_name'))
    base, traits, why = {}, {}, ''
    if entry is not None:
      why = entry.get('why', '')
      if entry.get('file'):
        base = _load_model(self.base_dir, entry['file'], self._models)
        why = why or f"models/{entry['file']}.json (the model name)"
      traits = dict(entry.get('traits') or {})
    col = {k: number(row.get(k)) for k in (
      'num_layers', 'hidden', 'ffn_hidden', 'attn_heads', 'kv_heads',
      'seq_len', 'vocab')}
    app = {}

    def pick(field_, column, fallback_key=None):
      if column is not None and col[column] is not None:
        app[field_] = col[column]
      elif field_ in base:
        app[field_] = base[field_]
        case.assume(field_, base[field_], why)
    pick('num_blocks', 'num_layers')
    pick('hidden', 'hidden')
    pick('attn_heads', 'attn_heads')
    app['seq_size'] = col['seq_len']
    for need in ('num_blocks', 'hidden', 'attn_heads'):
      if need not in app:
        case.missing.append(f'{need} not stated (neither in the columns nor '
                            'by a model the name points to)')
    if case.missing:
      return None
    # Application fields of the family (bundled file, then traits).
    same_shape = base and base.get('hidden') == app['hidden'] and \
      base.get('attn_heads') == app['attn_heads']
    for key, value in base.items():
      if key in ('num_blocks', 'hidden', 'attn_heads', 'seq_size',
                 'feedforward', 'kv_heads', 'vocab_size', 'attn_size'):
        continue
      if not same_shape and key in ('q_lora_rank', 'kv_lora_rank',
                                    'qk_nope_head_dim', 'qk_rope_head_dim',
                                    'v_head_dim'):
        continue
      app[key] = value
    for key, value in traits.items():
      if key != 'vocab_size' and key not in app:
        app[key] = value
    if text(row.get('mlp')):
      app['mlp'] = text(row['mlp'])
    if text(row.get('block_layout')):
      app['block_layout'] = text(row['block_layout'])
    # Mixture of Experts and MLA facts from the notes.
    for key in ('num_experts', 'top_k', 'moe_ffn_hidden', 'shared_experts',
                'shared_ffn', 'moe_layer_freq', 'capacity_factor',
                'q_lora_rank', 'kv_lora_rank', 'qk_head_dim', 'qk_rope_dim',
                'v_head_dim', 'router_groups', 'router_group_topk'):
      if key in facts:
        app[NOTES_KEYS[key]] = facts[key]
    # Group-limited routing the family file has but the row's experts do
    # not fit (another expert count): dropped, and said.
    groups = app.get('moe_router_num_groups')
    if groups and 'router_groups' not in facts and (
        not app.get('num_experts') or not app.get('top_k') or
        router_groups_fit(app['num_experts'], app['top_k'], groups,
                          app.get('moe_router_group_topk', groups))):
      app.pop('moe_router_num_groups')
      app.pop('moe_router_group_topk', None)
      case.approximations.append('group-limited routing of the model family '
                                 'left out (it does not fit the row\'s '
                                 'experts)')
    if 'dense_layers' in facts:
      app['first_dense_blocks'] = facts['dense_layers']
    if app.get('shared_experts') == 0:
      app.pop('shared_expert_ffn_hidden', None)
    mla = 'kv_lora_rank' in app
    # Head width.
    if mla:
      for key in ('qk_nope_head_dim', 'qk_rope_head_dim', 'v_head_dim'):
        if key not in app:
          case.missing.append(f'multi-head latent attention without {key}')
          return None
      app['attn_size'] = app['qk_nope_head_dim'] + app['qk_rope_head_dim']
    elif 'head_dim' in facts:
      app['attn_size'] = facts['head_dim']
    elif same_shape and 'attn_size' in base:
      app['attn_size'] = base['attn_size']
      if base['attn_size'] * app['attn_heads'] != app['hidden']:
        case.assume('attn_size', base['attn_size'], why)
    else:
      if app['hidden'] % app['attn_heads']:
        case.missing.append(f"head width hidden / heads = {app['hidden']}/"
                            f"{app['attn_heads']} is not an integer (state "
                            'head_dim=... in the notes)')
        return None
      app['attn_size'] = app['hidden'] // app['attn_heads']
    # K/V heads.
    if mla:
      app.pop('kv_heads', None)
    elif col['kv_heads'] is not None:
      app['kv_heads'] = col['kv_heads']
    elif same_shape and base.get('kv_heads'):
      app['kv_heads'] = base['kv_heads']
      case.assume('kv_heads', base['kv_heads'], why)
    elif re.search('palm', text(row.get('model_name')), re.IGNORECASE):
      app['kv_heads'] = 1
    # MLP width.
    if col['ffn_hidden'] is not None:
      app['feedforward'] = col['ffn_hidden']
    elif same_shape and 'feedforward' in base:
      app['feedforward'] = base['feedforward']
      case.assume('feedforward', base['feedforward'], why)
    else:
      ffn = int(round(d.get('ffn_per_hidden', 4) * app['hidden']))
      what = f"{d.get('ffn_per_hidden', 4)}h (plain MLP default)"
      if app.get('mlp') == 'gated':
        mult = int(d.get('gated_ffn_multiple_of', 256))
        ffn = -(-int(2 * ffn / 3) // mult) * mult
        what = f'2/3 x 4h rounded up to {mult} (gated MLP default)'
      app['feedforward'] = ffn
      case.assume('feedforward', ffn, what)
    if app.get('num_experts') and 'moe_ffn_hidden' not in app:
      app['moe_ffn_hidden'] = app['feedforward']
    # Vocabulary (not for a single-layer measurement).
    if case.metric == 'layer_fwd_plus_bwd_ms':
      for key in ('vocab_size', 'tied_embeddings', 'position_embedding'):
        app.pop(key, None)
    elif col['vocab'] is not None:
      app['vocab_size'] = col['vocab']
    elif same_shape and base.get('vocab_size'):
      app['vocab_size'] = base['vocab_size']
      case.assume('vocab_size', base['vocab_size'], why)
    elif traits.get('vocab_size'):
      app['vocab_size'] = traits['vocab_size']
      case.assume('vocab_size', traits['vocab_size'], why or 'model family')
    else:
      for key in ('tied_embeddings', 'position_embedding'):
        app.pop(key, None)
      case.approximations.append('vocabulary unknown: embedding, LM head and '
                                 'loss not priced')
      case.flops_approximate = True
    if app.get('num_experts') is None:
      for key in ('top_k', 'moe_ffn_hidden', 'shared_experts',
                  'shared_expert_ffn_hidden', 'first_dense_blocks',
                  'moe_layer_freq', 'capacity_factor'):
        app.pop(key, None)
    if not mla:
      for key in ('q_lora_rank', 'kv_lora_rank', 'qk_nope_head_dim',
                  'qk_rope_head_dim', 'v_head_dim'):
        app.pop(key, None)
    return app

  def _datatype(self, case, system):
    row, d = case.row, self.conv.defaults
    have = set(system['matrix']) & set(system['vector'])
    entry = self.conv.first(self.conv.datatypes, row.get('dtype'))
    scaling = None if entry is None else entry.get('quantization_scaling')
    if entry is None:
      dtype, recipe = d.get('datatype', 'bfloat16'), 'uniform'
      stated = text(row.get('dtype'))
      case.assume('datatype', dtype,
                  f'dtype column {stated!r} not understood (datatypes '
                  'table): the default' if stated else
                  'not stated: the default')
    else:
      dtype = entry['datatype']
      recipe = entry.get('precision_recipe', 'uniform')
      if entry.get('why'):
        case.assume('datatype', dtype, entry['why'])
    sixteen = {'bfloat16': 'float16', 'float16': 'bfloat16'}
    if dtype not in have and sixteen.get(dtype) in have:
      case.assume('datatype', sixteen[dtype], f'{dtype} is not in the system '
                  'file; the other 16-bit type has the same tensor-core rate')
      dtype = sixteen[dtype]
    if dtype not in have:
      case.missing.append(f'datatype {dtype} (the system file has '
                          f"{', '.join(sorted(have))})")
    case.fixed['datatype'] = dtype
    case.fixed['precision_recipe'] = recipe
    if scaling is not None and recipe == 'transformer_engine':
      case.fixed['quantization_scaling'] = scaling
      case.assume('quantization_scaling', scaling,
                  f"dtype column {row.get('dtype')!r} (datatypes table)")

  def _settings(self, case):
    """Settings from the rules, then the ``assumptions`` override column:
    setting -> (value or list, why)."""
    out = {}
    for rule in self.conv.rules:
      if rule.applies(case.row):
        for key, value in rule.settings.items():
          out[key] = (value, f'{rule.name}: {rule.why}' if rule.why
                      else rule.name)
    for key, value in _parse_assumptions(case.row, case.id).items():
      out[key] = (value, 'the assumptions column')
    return out

  # -- the case -------------------------------------------------------------------
  def build(self, row, case_id=None):
    """The :class:`Case` of ``row`` (a dict of cells).

    Raises:
      ConfigError: a malformed override column (assumptions).
    """
    case = Case(row=row)
    case.id = text(row.get('id')) or case_id or '?'
    case.group = source_group(row)
    for reason in text(row.get('unsupported')).split(';'):
      if reason.strip():
        case.missing.append(reason.strip())
    metric = case.metric
    raw = text(row.get('measured_metric_name'))
    if metric not in CONVERSIONS:
      case.missing.append(f'metric {metric!r} (the conversions know '
                          f"{', '.join(CONVERSIONS)} and their aliases)")
    elif raw != metric:
      rule = ALIAS_CONVERSIONS[canonical_metric(raw)[1]][0]
      case.assume('measured_metric_name', metric,
                  f'{raw!r} read as {metric} (the value {rule})')
    measured = text(row.get('measured_value'))
    try:
      if not 0 < float(measured) < math.inf:
        case.missing.append(f'measured value {measured!r} is not a positive '
                            'number')
    except ValueError:
      case.missing.append(f'measured value {measured!r} is not a number')
    for col in COUNT_COLUMNS:
      cell = text(row.get(col))
      if cell and not _is_count(cell):
        case.missing.append(f"column '{col}' = {cell!r} is not allowed: blank "
                            'or a whole number >= 1')
    cell = text(row.get('trained_from'))
    if cell and not _TRAINED_FROM_RE.match(cell):
      case.missing.append(f"column 'trained_from' = {cell!r} is not allowed: "
                          'blank or a month YYYY-MM (e.g. 2023-01)')
    self._hardware(case)
    facts = notes_facts(row.get('notes'))
    if number(row.get('seq_len')) is None:
      case.missing.append('sequence length not stated')
    if number(row.get('num_gpus')) is None:
      case.missing.append('GPU count (num_gpus) not stated')
    if case.missing:
      return case
    app = self._model(case, facts)
    if app is None:
      return case
    case.app = app
    system = self.system_json(case)
    self._datatype(case, system)
    for rule, text_, unless in self.conv.approximations:
      if rule.applies(row) and not any(app.get(k) for k in unless):
        case.approximations.append(text_)
    self._execution(case, facts, system)
    return case

  def _execution(self, case, facts, system):
    row, app, fixed = case.row, case.app, case.fixed
    n = number(row.get('num_gpus'))
    tp, pp, dp, cp = (number(row.get(k)) for k in ('tp', 'pp', 'dp', 'cp'))
    cp = cp or 1
    tp = tp or (None if n is None else None)
    if tp is None or pp is None:
      case.missing.append('TP and PP not stated')
      return
    if dp is None and n is not None and n % P.procs(tp, pp, 1, cp) == 0:
      dp = n // P.procs(tp, pp, 1, cp)
      case.assume('dp', dp, 'GPUs / (TP x PP x CP)')
    if dp is None:
      case.missing.append('DP not stated and not derivable')
      return
    if n is not None and not P.procs_match(n, tp, pp, dp, cp):
      case.missing.append(f'TP x PP x DP x CP = {P.procs(tp, pp, dp, cp)} '
                          'is not '
                          f'the GPU count {n}')
      return
    batch = number(row.get('global_batch_size'))
    if batch is None:
      case.missing.append('global batch not stated')
      return
    if not P.batch_splits(batch, dp):
      case.missing.append(f'global batch {batch} is not a multiple of DP = '
                          f'{dp}')
      return
    settings = self._settings(case)
    ep = number(facts.get('ep')) if 'ep' in facts else 1
    etp = facts.get('etp', 1)
    if app.get('num_experts') is None:
      ep, etp = 1, 1
    elif 'ep' not in facts:
      case.assume('expert_par', 1, 'not stated')
    if 'expert_tensor_par' in settings and 'etp' not in facts:
      etp = settings['expert_tensor_par'][0]
    nets = system['networks']

    def tier(product):
      for i, net in enumerate(nets):
        if net['size'] >= product and (not net['must_be_filled'] or
                                       net['size'] % product == 0):
          return i
      return len(nets) - 1
    fixed.update({
      'num_procs': P.procs(tp, pp, dp, cp), 'tensor_par': tp,
      'pipeline_par': pp,
      'data_par': dp, 'context_par': cp, 'batch_size': batch,
      'tensor_par_net': tier(tp) if tp > 1 else 0,
      'context_par_net': tier(tp * cp) if cp > 1 else 0,
      'data_par_net': tier(tp * cp * dp) if dp > 1 else 0,
      'pipeline_par_net': tier(tp * cp * dp * pp) if pp > 1 else 0,
      'expert_par': ep, 'expert_tensor_par': etp,
      'expert_par_net': tier(ep * etp) if ep > 1 else 0,
      'moe_dispatcher': 'alltoall', 'expert_imbalance': 1.0,
      'weight_offload': False, 'activations_offload': False,
      'optimizer_offload': False, 'training': True,
    })
    # The framework: its preset fills every field the row and the rules
    # leave out (resolved per candidate, :func:`candidate_columns`).
    fixed['framework'], why = self._framework(settings)
    case.assume('framework', fixed['framework'], why)
    for key, (value, why) in self._rule_fields(case, settings, pp).items():
      fixed[key] = value
      case.assume(key, value, why)
    if 'attention_implementation' in settings:
      value, why = settings['attention_implementation']
      kernel = value[0] if isinstance(value, list) else value
      factor = case.attention_kernels.get(kernel)
      if factor is not None:
        case.system_set['fused_attention_efficiency'] = {'times': factor}
        case.assume('system.fused_attention_efficiency', f'x {factor}',
                    f'{why}; {kernel} on this hardware (hardware table)')
    if 'flops_convention' in settings:
      case.flops_convention = settings['flops_convention'][0]
    else:
      case.flops_convention = self.conv.defaults.get('flops_convention',
                                                     'model_full')
      if metric_needs_flops(case.metric):
        case.flops_approximate = True
        case.assume('flops_convention', case.flops_convention,
                    'no rule names the FLOP convention of the source')
    if case.flops_approximate and metric_needs_flops(case.metric):
      case.approximations.append('FLOP conversion of the measured figure '
                                 'approximate')
    self._axes(case, settings, tp, pp, dp, cp, batch)

  def _framework(self, settings):
    """The framework preset of a row: (name, why)."""
    if self.framework is not None:
      return self.framework, 'the --framework option'
    if 'framework' in settings:
      value, why = settings['framework']
      return (value[0] if isinstance(value, list) else value), why
    return (self.conv.defaults.get('framework', 'common'),
            'no rule names the framework of the source: the conventions '
            'default')

  def _rule_fields(self, case, settings, pp):
    """Execution fields other than the axes a rule fixes (never searched):
    field -> (value, why).  A value the row's columns fixed wins (the dtype
    column's scaling); the MoE ones only for MoE; the pipeline split only
    with PP (``pp`` None: not known, left out)."""
    out = {}
    for key, (value, why) in settings.items():
      # Of Calculon's fields only the activation offload a recipe states
      # (Megatron-Core cpu_offloading_num_layers); the others are the row's.
      if (key not in OPTIONAL_SPECS and key != 'activations_offload') or \
          key in AXES or \
          key in ('expert_tensor_par',) or (
            key in case.fixed and key in _DATATYPE_TABLE_FIELDS):
        continue
      if key.startswith(('moe_', 'expert_')) and not case.app.get(
          'num_experts'):
        continue
      if key == 'pipeline_split_counts_vocab' and (pp or 1) == 1:
        continue
      out[key] = (value[0] if isinstance(value, list) else value, why)
    return out

  def search_settings(self, case, axes, stated=None):
    """What the conventions say of a row whose layout a search chooses
    (the whole-runs suite's rows that state no TP and PP): the framework
    and the rules' settings, as the published suite applies them to a
    stated layout.

    Args:
      case: a :class:`Case` built from the row (``case.app`` set).
      axes: the names of the axes the search varies.
      stated: {axis: [values]} the row's text states (taken before the
        unstated bounds; recorded by the caller).

    Returns:
      (framework, fields, choices): the preset's name (also set in
      ``case.fixed``); {field: value} the rules fix; {axis: [values]} the
      rules restrict the search to.  Each is recorded in
      ``case.assumptions``.
    """
    settings = self._settings(case)
    framework, why = self._framework(settings)
    case.fixed['framework'] = framework
    case.assume('framework', framework, why)
    fields = {}
    for key, (value, why) in self._rule_fields(case, settings, None).items():
      if key in axes:
        continue
      fields[key] = value
      case.assume(key, value, why)
    choices = {}
    for key, (value, why) in settings.items():
      if key not in axes:
        continue
      if key.startswith(('moe_', 'expert_')) and not case.app.get(
          'num_experts'):
        continue
      choices[key] = list(value) if isinstance(value, list) else [value]
      case.assume(key, choices[key] if len(choices[key]) > 1
                  else choices[key][0], why)
    self._stated_search_columns(case, axes, fields, choices)
    choices.update({k: list(v) for k, v in (stated or {}).items()
                    if k in axes})
    self._unstated_search_bounds(case, axes, fields, choices)
    return framework, fields, choices

  def _unstated_search_bounds(self, case, axes, fields, choices):
    """A searched row's sharding and offloads that nothing states, bounded
    as a stated layout's are (:data:`UNSTATED_SHARDING`, no offload:
    :data:`UNSTATED_OFFLOADS`), so a search chooses only the layout and
    the settings the published suite searches; ``choices`` restricted in
    place and each bound recorded in ``case.assumptions``."""
    def unset(key):
      return key in axes and key not in choices and key not in fields
    if unset('data_par_sharding'):
      choices['data_par_sharding'] = list(UNSTATED_SHARDING)
      case.assume('data_par_sharding', list(UNSTATED_SHARDING),
                  'unstated: searched among no sharding and ZeRO-1, as a '
                  'stated layout\'s (ZeRO-2/3 and FSDP are named where used)')
    for key in UNSTATED_OFFLOADS:
      if unset(key):
        choices[key] = [False]
        case.assume(key, False, 'unstated: not offloaded, as a stated '
                    'layout (offloading is named where used)')

  def _take_recompute(self, case, rec_text, entry):
    """Whether the recompute table's ``entry`` for a row's recompute cell
    ``rec_text`` fixes the recomputation (not None, not a 'search' entry);
    if so its approximation is noted and, for a selective entry naming
    modules, ``recompute_modules`` fixed in ``case``."""
    if entry is None or entry.get('search'):
      return False
    if entry.get('approximate'):
      case.approximations.append(entry['approximate'])
    modules = [m['module'] for m in self.conv.recompute_modules
               if m['match'].search(rec_text)]
    if entry['value'] == 'selective' and modules:
      label = recompute_modules_label(sorted(set(modules)))
      case.fixed['recompute_modules'] = label
      case.assume('recompute_modules', label,
                  f'recompute column {rec_text!r} (recompute_modules '
                  'table)')
    return True

  def _stated_search_columns(self, case, axes, fields, choices):
    """The recompute and seq_parallel cells of a searched row, as a stated
    layout reads them (the recompute table, with the modules it names;
    'yes' to sequence parallelism: the TP communication rs_ag),
    restricting ``choices`` and adding to ``fields`` in place; a cell the
    tables do not read leaves its axis as it was."""
    row = case.row
    rec_text = text(row.get('recompute'))
    entry = self.conv.first(self.conv.recompute, rec_text) if rec_text \
      else None
    if 'activation_recompute' in axes:
      if self._take_recompute(case, rec_text, entry):
        choices['activation_recompute'] = [entry['value']]
        case.assume('activation_recompute', entry['value'],
                    f'recompute {rec_text!r} (recompute table)')
        if 'recompute_modules' in case.fixed:
          fields['recompute_modules'] = case.fixed['recompute_modules']
    sp = text(row.get('seq_parallel'))
    if sp and self.conv.sp_yes.search(sp) and \
        'tensor_par_comm_type' in axes:
      choices['tensor_par_comm_type'] = ['rs_ag']
      case.assume('tensor_par_comm_type', 'rs_ag', f'seq_parallel {sp!r} '
                  '(sequence parallelism: reduce-scatter / all-gather)')

  def _axes(self, case, settings, tp, pp, dp, cp, batch):
    row, app, axes = case.row, case.app, case.axes
    seq = app['seq_size']
    ruled = set()

    def from_rule(key, allowed, default):
      """A rule's value restricted to ``allowed`` (default: search all)."""
      if key in settings:
        ruled.add(key)
        value, why = settings[key]
        values = value if isinstance(value, list) else [value]
        values = [v for v in values if v in allowed] or list(allowed)
        case.assume(key, values if len(values) > 1 else values[0], why)
        return values
      return list(default)

    # Microbatch.
    local = P.local_batch(batch, dp)
    mbs = number(row.get('micro_batch_size'))
    if mbs is not None:
      axes['microbatch_size'] = [mbs]
    else:
      ok = [m for m in _factors(local) if m <= MAX_MICROBATCH and
            P.tp_splits_tokens(P.tokens_per_microbatch(m, seq, cp), tp)]
      per_stage = local // pp if pp > 1 and local % pp == 0 else None
      if 'pipeline_microbatches' in settings and per_stage in ok:
        # One microbatch per pipeline stage (the framework's default).
        _, why = settings['pipeline_microbatches']
        axes['microbatch_size'] = [per_stage]
        case.assume('microbatch_size', per_stage,
                    f'{why}; local batch {local} / PP {pp}')
      else:
        axes['microbatch_size'] = from_rule('microbatch_size', ok, ok)
    # Interleaving.
    blocks = app['num_blocks']
    if pp > 1 and _counts_vocab(case, pp, number(row.get('vp')) or 1):
      blocks += 2
    per_stage = int(P.split_blocks(blocks, pp)[0])
    divisors = _factors(per_stage)
    vp = number(row.get('vp'))
    if pp == 1:
      axes['pipeline_interleaving'] = [1]
    elif vp is not None:
      if per_stage % vp:
        # The framework lays the blocks out over PP x VP virtual stages as
        # evenly as it can (an explicit layout); the slowest stage holds
        # VP chunks of the largest size.  Every stage is priced with that
        # (the bubble and the PP transfers at the stated VP).
        chunk = -(-per_stage // vp)
        case.priced_blocks = chunk * vp * pp - (blocks - app['num_blocks'])
        case.approximations.append(
          f'VP {vp} does not divide the {per_stage} blocks per stage (the '
          f'framework lays stages out unevenly): every stage priced with '
          f'{chunk * vp} blocks, {chunk} per virtual stage (the largest)')
      axes['pipeline_interleaving'] = [vp]
    else:
      axes['pipeline_interleaving'] = from_rule('pipeline_interleaving',
                                                divisors, divisors)
    if blocks % pp and case.priced_blocks is None:
      case.approximations.append(f'{blocks} blocks over PP = {pp} stages: '
                                 'every stage priced with the largest share')
    # Recomputation.
    rec_text = text(row.get('recompute'))
    entry = self.conv.first(self.conv.recompute, rec_text) if rec_text \
      else None
    if self._take_recompute(case, rec_text, entry):
      axes['activation_recompute'] = [entry['value']]
    else:
      axes['activation_recompute'] = from_rule(
        'activation_recompute', RECOMPUTE_NAMES,
        ('none', 'selective', 'full'))
      if rec_text and entry is None and 'activation_recompute' not in ruled:
        ruled.add('activation_recompute')
        case.assume('activation_recompute',
                    list(axes['activation_recompute']),
                    f'recompute column {rec_text!r} not understood '
                    '(recompute table): searched')
    # TP communication (sequence parallelism).
    sp = text(row.get('seq_parallel'))
    if tp == 1:
      axes['tensor_par_comm_type'] = ['ar']
    elif sp and self.conv.sp_yes.search(sp):
      axes['tensor_par_comm_type'] = ['rs_ag']
    else:
      if sp and not self.conv.sp_no.search(sp):
        case.approximations.append(
          f'seq_parallel column {sp!r} not understood (neither yes nor no): '
          'the TP communication is searched')
      allowed = ['ar', 'p2p_rs_ag'] if sp and self.conv.sp_no.search(sp) \
        else ['ar', 'p2p_rs_ag', 'rs_ag']
      if pp == 1:
        allowed.remove('p2p_rs_ag')
      values = from_rule('tensor_par_comm_type', TP_COMM_NAMES, allowed)
      if pp == 1:
        values = ['ar' if v == 'p2p_rs_ag' else v for v in values]
      values = [v for v in dict.fromkeys(values) if v in allowed] or allowed
      axes['tensor_par_comm_type'] = values
    axes['tensor_par_overlap'] = ['none'] if tp == 1 else from_rule(
      'tensor_par_overlap', TP_OVERLAP_NAMES, TP_OVERLAP_NAMES)
    axes['data_par_overlap'] = [False] if dp == 1 else from_rule(
      'data_par_overlap', (False, True), (False, True))
    if dp * cp == 1:
      axes['data_par_sharding'] = ['none']
    else:
      axes['data_par_sharding'] = from_rule(
        'data_par_sharding', SHARDING_NAMES, UNSTATED_SHARDING)
    axes['attention_kernel'] = from_rule('attention_kernel',
                                         ATTENTION_KERNEL_NAMES,
                                         ATTENTION_KERNEL_NAMES)
    axes['fused_activation'] = from_rule('fused_activation', (False, True),
                                         (False, True))
    if not app.get('num_experts'):
      axes['moe_comm_overlap'] = ['none']
    else:
      allowed = ['none', 'compute'] + (['shared_experts']
                                       if app.get('shared_experts') else [])
      axes['moe_comm_overlap'] = from_rule('moe_comm_overlap',
                                           allowed, allowed)
    for key in axes:
      if len(axes[key]) <= 1:
        continue
      default = self._unstated_default(case, key, axes[key]) \
        if self.unstated == 'default' else None
      if default is not None:
        case.defaults[key] = default[0]
        case.assume(key, default[0], f'unstated: {default[1]} (the '
                    'fastest feasible of ' + _show(list(axes[key])) +
                    ' where it is infeasible)')
      elif key not in ruled:
        # A rule's list was named with its reason (from_rule).
        case.assume(key, list(axes[key]), 'unknown: searched')

  def _unstated_default(self, case, key, values):
    """(value, why) a row's unstated setting ``key`` is priced at when the
    conventions price unstated settings at the framework's default: the
    preset's own value where its rule gives one among ``values`` (its
    conditions reading only what the row fixes), else the first
    ``unstated.defaults`` entry for ``key`` naming the row's preset (or
    any) whose value ``values`` holds; None where neither does."""
    from calculon.frameworks.resolve import rule_value
    preset = preset_of(case)
    if key in preset.rules:
      known = {k: v for k, v in case.fixed.items()
               if k in FIELDS and k != 'framework' and
               not isinstance(v, (list, dict))}
      known.update({k: v[0] for k, v in case.axes.items() if len(v) == 1})
      try:
        value = rule_value(preset, AppFacts(case.priced_app), key, **known)
      except (AttributeError, KeyError, ValueError, TypeError):
        value = None
      if value is not None and value in values:
        return value, (f'the {preset.name} preset\'s default '
                       f'(frameworks/{preset.name}.json)')
    for entry in self.conv.unstated_defaults:
      if entry['setting'] != key or entry['value'] not in values:
        continue
      if entry['frameworks'] is not None and \
          preset.name not in entry['frameworks']:
        continue
      return entry['value'], (f'the {preset.name} default: ' + entry['why']
                              if entry['why'] else f'the {preset.name} '
                              'default (conventions unstated.defaults)')
    return None


#: Fields the datatypes table sets from the dtype column (a row's fact: a
#: rule does not override them).
_DATATYPE_TABLE_FIELDS = ('datatype', 'precision_recipe',
                          'quantization_scaling')


class AppFacts:
  """What a preset's conditions read of an application JSON object:
  ``num_blocks``, ``has_vocab``, ``is_moe``."""

  def __init__(self, app):
    self.num_blocks = app['num_blocks']
    self.has_vocab = app.get('vocab_size') is not None
    self.is_moe = app.get('num_experts') is not None


def preset_of(case):
  """The framework preset of ``case`` (:mod:`calculon.frameworks`)."""
  from calculon import frameworks
  return frameworks.load(case.fixed.get('framework', 'common'))


def _counts_vocab(case, pp, vp):
  """Whether the pipeline split of ``case`` counts the embedding and the
  loss as a block each, with PP ``pp`` and VP ``vp``: as the row's rules
  fixed it, else as its framework does."""
  if 'pipeline_split_counts_vocab' in case.fixed:
    return bool(case.fixed['pipeline_split_counts_vocab'])
  from calculon.frameworks.resolve import rule_value
  return bool(rule_value(preset_of(case), AppFacts(case.app),
                         'pipeline_split_counts_vocab', pipeline_par=pp,
                         pipeline_interleaving=vp))


def metric_needs_flops(metric):
  return metric in ('tflops_per_gpu', 'mfu_pct')


def _parse_assumptions(row, row_id):
  """Settings of the ``assumptions`` override column.

  Raises:
    ConfigError: a part without '=', an unknown key or a bad value.
  """
  from calculon.validation.conventions import _check_setting, setting_names
  out = {}
  for part in text(row.get('assumptions')).split(';'):
    part = part.strip()
    if not part:
      continue
    key, sep, value = part.partition('=')
    key, value = key.strip(), value.strip()
    key = ASSUMPTION_ALIASES.get(key, key)
    allowed = setting_names() + ('seq_parallel',)
    if not sep or key not in allowed:
      raise ConfigError(
        f"row {row_id}: field 'assumptions' = {part!r} is not allowed: "
        f"key=value with key one of {', '.join(allowed)}",
        field='assumptions', value=part, allowed=', '.join(allowed))
    if key == 'seq_parallel':
      key, value = 'tensor_par_comm_type', {'y': 'rs_ag', 'n': 'ar'}.get(
        value, value)
    elif key == 'data_par_sharding' and value in ('true', 'false'):
      value = 'optimizer' if value == 'true' else 'none'
    elif key == 'activation_recompute':
      value = {'selective': 'selective'}.get(value, value)
    if value in ('true', 'false'):
      value = value == 'true'
    elif re.fullmatch(r'[0-9]+', value):
      value = int(value)
    elif re.fullmatch(r'[0-9]*\.[0-9]+', value):
      value = float(value)
    try:
      _check_setting('assumptions', f'row {row_id}', key, value)
    except ConfigError as err:
      raise ConfigError(f"row {row_id}: assumption '{key}' = {value!r} is "
                        f'not allowed: {err.allowed}', field='assumptions',
                        value=value, allowed=err.allowed) from None
    out[key] = value
  return out


# -- the measured figure as a time ---------------------------------------------------

def convention_flops(app, batch, convention):
  """FLOP of one training batch of ``batch`` sequences in a convention
  (:data:`FLOPS_CONVENTION_TEXT`); ``app`` a JSON object or Application.

  ``megatron_eq3`` generalizes Narayanan et al. 2021 eq. 3 (96 B s l h^2
  (1 + s/(6h) + V/(16 l h))): the blocks' model FLOP x 4/3 plus the logits
  layer; for a GPT block (MHA, f = 4h) it is eq. 3 exactly.
  """
  from calculon.config import Application
  from calculon.llm.flops import model_flops_per_token
  if not isinstance(app, Application):
    app = Application.from_dict(app)
  tokens = float(batch) * app.seq_size
  if convention == 'model_causal':
    return model_flops_per_token(app, 'causal') * tokens
  full = model_flops_per_token(app, 'full') * tokens
  if convention == 'model_full':
    return full
  logits = 6.0 * app.hidden * app.vocab_size * tokens if app.has_vocab \
    else 0.0
  return 4.0 / 3.0 * (full - logits) + logits


def measured_time_s(case, peak_flops=None):
  """The measured figure of ``case`` as a time in seconds (a batch; one
  layer for 'layer_fwd_plus_bwd_ms'), by :data:`CONVERSIONS`.

  Raises:
    ConfigError: an unknown metric.
    ValueError: 'mfu_pct' without ``peak_flops``.
  """
  row = case.row
  metric = case.metric
  value = case.measured_value
  n = number(row.get('num_gpus'))
  batch = number(row.get('global_batch_size'))
  if metric == 'iteration_time_s':
    return value
  if metric == 'layer_fwd_plus_bwd_ms':
    return value / 1e3
  if metric == 'tokens_per_sec_per_gpu':
    return batch * case.app['seq_size'] / (value * n)
  if metric == 'tflops_per_gpu':
    flops = convention_flops(case.app, batch, case.flops_convention)
    return flops / (value * 1e12 * n)
  if metric == 'mfu_pct':
    if peak_flops is None:
      raise ValueError('mfu_pct needs the peak FLOP/s')
    # MFU counts model FLOP only (Chowdhery et al. 2022, appendix B): eq. 3
    # without its recomputed pass is the whole-matrix model FLOP.
    convention = 'model_causal' if case.flops_convention == 'model_causal' \
      else 'model_full'
    flops = convention_flops(case.app, batch, convention)
    return flops / (value / 100 * peak_flops * n)
  raise ConfigError(
    f"field 'measured_metric_name' = {metric!r} is not allowed: one of "
    f"{', '.join(CONVERSIONS)}", field='measured_metric_name', value=metric,
    allowed=', '.join(CONVERSIONS))


def predicted_metric(metric, time_s, measured_s, measured_value):
  """The predicted time in the measured metric's unit (every conversion is
  value = constant / time, or the time itself)."""
  if metric == 'iteration_time_s':
    return time_s
  if metric == 'layer_fwd_plus_bwd_ms':
    return time_s * 1e3
  return measured_value * measured_s / time_s


# -- the candidate executions ---------------------------------------------------------

def candidate_columns(case):
  """:class:`~calculon.config.ExecutionColumns` of every execution searched
  for ``case``: each searched setting varies along its own axis (in
  :data:`AXES` order), so the engine prices the grid without repeating
  work; the fields neither the row nor a rule fixes are the framework's
  (:func:`calculon.frameworks.resolve.resolve_columns`, per candidate)."""
  from calculon.config import ExecutionColumns
  from calculon.frameworks.resolve import resolve_columns
  n = len(AXES)
  cols = {}
  for i, key in enumerate(AXES):
    values = case.axes[key]
    if key in CATEGORIES:
      codec = _registry.field('execution', key)
      arr = np.array([codec.code(v) for v in values], dtype=np.int64)
    elif key in ('data_par_overlap', 'fused_activation'):
      arr = np.array(values, dtype=bool)
    else:
      arr = np.array(values, dtype=np.int64)
    shape = [1] * n
    shape[i] = len(values)
    cols[key] = arr.reshape(shape)
  for key, value in case.fixed.items():
    if key == 'framework':
      continue
    if key in CATEGORIES:
      cols[key] = np.int64(_registry.field('execution', key).code(value))
    elif isinstance(value, bool):
      cols[key] = np.bool_(value)
    elif isinstance(value, float):
      cols[key] = np.float64(value)
    else:
      cols[key] = np.int64(value)
  # Resolved by the framework (Calculon requires the column).
  cols.setdefault('seq_par_ag_redo', np.bool_(False))
  cols['optimizer_sharding'] = None
  cols['attention_type'] = None
  missing = [f for f in FIELDS if f not in cols]
  if missing:
    raise AssertionError(f'candidate columns miss {missing}')
  exe = ExecutionColumns(**cols)
  written = (set(case.fixed) | set(AXES)) - {'framework'}
  return resolve_columns(preset_of(case), AppFacts(case.priced_app), exe,
                         written)


def default_mask(case, shape):
  """Bool array of grid ``shape`` (:func:`candidate_columns`): the
  candidates at every default of ``case.defaults`` (all, without any)."""
  mask = np.ones(shape, dtype=bool)
  for i, key in enumerate(AXES):
    if key not in case.defaults:
      continue
    hit = np.array([v == case.defaults[key] for v in case.axes[key]])
    dims = [1] * len(AXES)
    dims[i] = hit.size
    mask = mask & hit.reshape(dims)
  return mask


def choose(case, ok):
  """(mask, fell_back): the candidates of the grid ``ok`` (bool, the ones
  that may be priced) the prediction is the fastest of -- those at the
  row's framework defaults (:attr:`Case.defaults`) where any of them is in
  ``ok``, else every one of ``ok`` (fell_back True: the defaults are
  infeasible, the search decides).  Without defaults (conventions
  ``unstated.mode: fastest``): ``ok`` itself.  The published suite and
  calibration both choose through this (one convention)."""
  if not case.defaults:
    return ok, False
  at_default = ok & default_mask(case, ok.shape)
  if at_default.any():
    return at_default, False
  return ok, True


def candidate_allowed(case, exe):
  """Bool array over ``exe`` (:func:`candidate_columns`): the candidates
  the row's framework supports (its options, offload kinds and
  constraints: :func:`calculon.frameworks.resolve.allowed_mask`); the
  others are not priced."""
  from calculon.frameworks.resolve import allowed_mask
  return np.broadcast_to(allowed_mask(preset_of(case), AppFacts(
    case.priced_app), exe), exe.shape)


def records_columns(case, records):
  """:class:`~calculon.config.ExecutionColumns` (1-d) of execution records
  of ``case`` (:func:`execution_at`), the framework's fields resolved as in
  :func:`candidate_columns`."""
  from calculon.config import ExecutionColumns
  from calculon.frameworks.resolve import resolve_columns
  records = [dict(r, optimizer_sharding=r.get('optimizer_sharding'),
                  attention_type=r.get('attention_type')) for r in records]
  cols = ExecutionColumns.from_records(records)
  written = (set(case.fixed) | set(AXES) | {'seq_par_ag_redo'}) - \
    {'framework'}
  return resolve_columns(preset_of(case), AppFacts(case.priced_app), cols,
                         written)


def execution_at(case, index):
  """The JSON execution at grid ``index`` (a tuple) of
  :func:`candidate_columns`: the fields the row and its rules fix, the
  searched ones, Calculon's (``seq_par_ag_redo`` as the framework sets
  it) and ``framework``; the framework's other fields are left out (they
  resolve to the same values)."""
  exe = dict(case.fixed)
  for key, i in zip(AXES, index):
    exe[key] = case.axes[key][i]
  if 'seq_par_ag_redo' not in exe:
    from calculon.frameworks.resolve import rule_value
    exe['seq_par_ag_redo'] = bool(rule_value(
      preset_of(case), AppFacts(case.priced_app), 'seq_par_ag_redo',
      tensor_par_comm_type=exe['tensor_par_comm_type'],
      activation_recompute=exe['activation_recompute']))
  if 'recompute_modules' in exe:
    exe['recompute_modules'] = json_value('recompute_modules',
                                          exe['recompute_modules'])
  return exe
