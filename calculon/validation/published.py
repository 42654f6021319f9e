"""Measured training runs: predicted vs measured batch time, for any CSV.

Input: one or more CSV files in the columns of
``../shared/measurements/published_runs.csv`` (:data:`~calculon.validation.
mapping.FACT_COLUMNS`; the bundled copies are ``validation/
published_runs.csv`` and ``validation/published_runs_2024_2026.csv``).
For every row this module

1. maps it onto the model by the conventions of ``validation/
   conventions.yaml`` (:mod:`calculon.validation.mapping`): application,
   system, the settings the row fixes, the unknown ones (searched), and
   every assumption made;
2. converts the measured figure to the time of one batch
   (:data:`~calculon.validation.mapping.CONVERSIONS`);
3. prices every candidate execution in one vectorized engine call and
   reports the fastest feasible one (published runs are tuned; or, with
   the conventions' ``unstated.mode: default``, the one at the framework
   defaults of the unstated settings where it is feasible:
   :func:`~calculon.validation.mapping.choose`) and the slowest (the range
   the unknowns span);
4. reports ``delta = 100 * (1 - predicted / measured)`` percent (positive:
   the model predicts a shorter time than was measured).

Rows it cannot price are listed with the reason.  A row whose every
candidate exceeds the memory of the system is still priced (the run did
run; the model's memory estimate is what is off) and flagged.
"""

from dataclasses import dataclass
import math
import os

import numpy as np
import pandas as pd

from calculon.errors import ConfigError
from calculon.io import read_runs_csv
from calculon.validation import conventions as conventions_mod
from calculon.validation.mapping import (
  AXES, CONVERSIONS, FACT_COLUMNS, FLOPS_CONVENTION_TEXT, OVERRIDE_COLUMNS,
  REQUIRED_COLUMNS, Mapper, candidate_columns, choose, execution_at,
  group_slug,
  measured_time_s, number, predicted_metric, source_group, text)

__all__ = ['CONVERSIONS', 'FACT_COLUMNS', 'default_runs', 'read_runs', 'run',
           'price', 'results_frame', 'summary', 'by_source', 'format_report']

#: The bundled measured-runs files (verbatim copies of the shared ones).
DEFAULT_RUNS = ('published_runs.csv', 'published_runs_2024_2026.csv')


def default_runs(base_dir):
  """Paths of the bundled runs files under ``base_dir/validation``."""
  return [os.path.join(base_dir, 'validation', name) for name in DEFAULT_RUNS]


def read_runs(paths):
  """The runs of one or more CSV files as one DataFrame of strings (blanks
  ''), with a ``file`` column; ids are given to rows without one (the
  source group's short name and a number, unique over all files).

  Raises:
    ConfigError: a missing file, a required column missing, or a duplicate
      id.
  """
  if isinstance(paths, str):
    paths = [paths]
  frames = []
  for path in paths:
    frame = read_runs_csv(path, REQUIRED_COLUMNS, FACT_COLUMNS,
                          'a runs file')
    frame['file'] = os.path.basename(path)
    frames.append(frame)
  frame = pd.concat(frames, ignore_index=True).fillna('')
  if 'id' not in frame.columns:
    frame['id'] = ''
  counts = {}
  ids = []
  for _, row in frame.iterrows():
    given = text(row['id'])
    if given:
      ids.append(given)
      continue
    slug = group_slug(source_group(row))
    counts[slug] = counts.get(slug, 0) + 1
    ids.append(f'{slug}-{counts[slug]:02d}')
  frame['id'] = ids
  dup = frame['id'][frame['id'].duplicated()]
  if len(dup):
    raise ConfigError(f"field 'id' = {dup.iloc[0]!r} is not allowed: ids must "
                      'be unique', field='id', value=dup.iloc[0])
  return frame


def ignored_columns(frame):
  """Columns of a runs frame the suite does not read."""
  known = set(FACT_COLUMNS) | set(OVERRIDE_COLUMNS) | {'file'}
  return [c for c in frame.columns if c not in known]


@dataclass
class Result:
  """Outcome of one row.

  status: 'ok', 'infeasible' (every candidate fails for a reason other
  than memory) or 'not priced' (see ``case.missing`` / ``reason``);
  predicted_s / slowest_s: the fastest and the slowest feasible candidate
  (s); delta_pct / delta_slowest_pct: their deltas; execution: the chosen
  execution (JSON); over_memory: no candidate fits the memory, the fastest
  is priced anyway (the message in ``reason``); tried: candidates priced;
  predicted_mem_gib: memory tier 1 the chosen execution needs per GPU
  (GiB); delta_mem_pct: 100 x (1 - predicted / measured) against the peak
  memory the notes state (None without one).
  """
  case: object
  status: str
  predicted_s: float = None
  slowest_s: float = None
  delta_pct: float = None
  delta_slowest_pct: float = None
  execution: dict = None
  reason: str = ''
  over_memory: bool = False
  tried: int = 0
  predicted_mem_gib: float = None
  delta_mem_pct: float = None
  system_file: str = ''


def layer_time_s(ev):
  """Forward + backward time of the block(s) of one microbatch (s): forward,
  backward, recomputation and exposed (re)communication of TP; for a
  1-block model with PP = DP = 1 and one microbatch, the batch time without
  the optimizer step."""
  return (ev.fw_time_s + ev.bw_time_s + ev.recompute_time_s +
          ev.recomm_exposed_time_s + ev.tp_comm_exposed_time_s)


def case_times(case, system):
  """(times, feasible, reason codes) arrays over the candidate grid of
  ``case`` on ``system`` (a :class:`~calculon.hardware.System`): batch
  time, or the layer time for per-layer measurements (NaN for a candidate
  the row's framework does not support).

  Raises:
    ConfigError: a candidate does not fit the application or the system
      (TP not dividing the heads, an expert count EP does not divide...).
  """
  from calculon.llm import evaluate_columns
  from calculon.validation.mapping import candidate_allowed
  exe = candidate_columns(case)
  ev = evaluate_columns(case.priced_app, system, exe,
                        source=f'run {case.id}')
  shape = exe.shape
  with np.errstate(all='ignore'):
    if case.metric == 'layer_fwd_plus_bwd_ms':
      t = layer_time_s(ev)
    else:
      t = ev.total_time_s
  # What the framework does not support is not a candidate.
  t = np.where(candidate_allowed(case, exe),
               np.broadcast_to(np.asarray(t, dtype=float), shape), np.nan)
  feasible = np.broadcast_to(ev.feasible, shape) & np.isfinite(t)
  reason = np.broadcast_to(ev.reason, shape)
  return t, feasible, reason, ev


def price(case, system, measured_s=None):
  """Prices ``case`` on ``system`` (System): a :class:`Result`."""
  from calculon.llm.model import MEM1_TOO_SMALL
  if not case.expressible:
    return Result(case, 'not priced', reason='; '.join(case.missing))
  try:
    t, feasible, reason, ev = case_times(case, system)
  except ConfigError as err:
    # From the field on: the grid index of the execution means nothing here.
    message = str(err)
    at = message.find("field '")
    return Result(case, 'not priced', reason=message[at:] if at >= 0 else
                  message.split(': ', 1)[-1])
  measured_s = case.measured_s if measured_s is None else measured_s
  over = False
  ok = feasible
  if not ok.any():
    memory_only = (reason == MEM1_TOO_SMALL) & np.isfinite(t)
    if not memory_only.any():
      i = np.unravel_index(0, t.shape)
      return Result(case, 'infeasible', reason=ev.reason_message(i),
                    tried=t.size)
    ok, over = memory_only, True
  # The prediction: the fastest of the candidates the conventions choose
  # (all feasible ones, or those at the framework defaults); the slowest
  # of every feasible one (the range the unknowns span).
  chosen, fell_back = choose(case, ok)
  masked = np.where(chosen, t, np.inf)
  best = np.unravel_index(int(np.argmin(masked)), t.shape)
  worst = np.unravel_index(int(np.argmax(np.where(ok, t, -np.inf))), t.shape)
  fast, slow = float(t[best]), float(t[worst])
  res = Result(case, 'ok', predicted_s=fast, slowest_s=slow,
               execution=execution_at(case, best), tried=t.size,
               over_memory=over)
  if over:
    res.reason = 'no candidate fits the memory: ' + ev.reason_message(best)
  if fell_back:
    res.reason = '; '.join(filter(None, [res.reason, (
      'the framework defaults of the unstated settings are infeasible: the '
      'fastest feasible candidate priced')]))
  res.delta_pct = 100.0 * (1.0 - fast / measured_s)
  res.delta_slowest_pct = 100.0 * (1.0 - slow / measured_s)
  mem = np.broadcast_to(np.asarray(ev.mem1_bytes, dtype=float), t.shape)
  res.predicted_mem_gib = float(mem[best]) / 2**30
  measured_mem = case.measured_mem_gib
  if measured_mem:
    res.delta_mem_pct = 100.0 * (1.0 - res.predicted_mem_gib / measured_mem)
  return res


class Suite:
  """The cases of a runs file, mapped once, and their systems.

  Args:
    base_dir: folder with models/, systems/ and validation/.
    paths: runs CSV file(s) (default: the bundled ones).
    conventions: path of the conventions file (default
      ``base_dir/validation/conventions.yaml``).
    framework: a preset every row is priced under (default: the one its
      source's rule names, see the conventions).
    unstated: 'fastest' or 'default': which candidate of a row's unstated
      settings is its prediction (default: the conventions' ``unstated.
      mode``; see ``validation/conventions.yaml``).

  Attributes: frame (the rows), cases (:class:`~calculon.validation.
  mapping.Case` per row, their ``measured_s`` set), mapper.
  """

  def __init__(self, base_dir, paths=None, conventions=None, framework=None,
               unstated=None):
    self.base_dir = base_dir
    self.paths = list(paths) if paths else default_runs(base_dir)
    conv = conventions_mod.load(conventions or
                                conventions_mod.default_path(base_dir))
    self.mapper = Mapper(base_dir, conv, framework, unstated)
    self.frame = read_runs(self.paths)
    self._systems = {}
    self.cases = []
    for rec in self.frame.to_dict('records'):
      case = self.mapper.build(rec)
      if case.expressible:
        try:
          system = self.system(case)
          peak = system.matrix.peak_flops(_dtype_code(case)) \
            if case.metric == 'mfu_pct' else None
          case.measured_s = measured_time_s(case, peak)
        except ConfigError as err:
          case.missing.append(str(err))
      self.cases.append(case)

  def system_json(self, case, override=None):
    """The system JSON of ``case`` (``override``: a JSON object replacing
    the bundled file, its per-row field changes still applied)."""
    from calculon.validation.mapping import apply_system_set
    if override is not None:
      return apply_system_set(override, case.system_set)
    return self.mapper.system_json(case)

  def system(self, case, override=None, key=None):
    """The :class:`~calculon.hardware.System` of ``case`` (cached)."""
    from calculon.hardware import System
    cache_key = (key, case.system_name, repr(sorted(
      case.system_set.items())))
    if override is None and cache_key in self._systems:
      return self._systems[cache_key]
    cfg = self.system_json(case, override)
    source = self.mapper.system_source(case) if override is None else \
      f'systems/{case.cluster or case.system_name}.json'
    system = System(cfg, source=source)
    if override is None or key is not None:
      self._systems[cache_key] = system
    return system

  def system_label(self, case, override=None):
    """The file :meth:`system` prices ``case`` on, as a table names it
    (:func:`calculon.validation.system_files.label`: file name and
    whether datasheet or calibrated)."""
    from calculon.validation.system_files import label
    if override is not None:
      return label(f'{case.cluster or case.system_name}.json', override)
    return label(self.mapper.system_source(case), self.mapper.system_json(case))


def _dtype_code(case):
  from calculon.config.execution import DATATYPE_NAMES
  return DATATYPE_NAMES.index(case.fixed['datatype'])


def run(base_dir, csv_paths=None, progress=None, conventions=None,
        systems=None, unstated=None):
  """Runs the published suite.

  Args:
    base_dir: folder with models/, systems/ and validation/.
    csv_paths: runs file(s) (default: the bundled ones).
    progress: callable(str) told of each row (verbose output), or None.
    conventions: conventions file (default: the bundled one).
    systems: optional dict calibration cluster (the system name unless
      the hardware table names one) -> JSON object replacing the bundled
      file for the rows of that cluster (calibrated systems; the rows'
      field changes are applied on top).
    unstated: 'fastest' or 'default' (see :class:`Suite`).

  Returns:
    list of :class:`Result`, one per row, in file order.

  Raises:
    ConfigError: a file or a row is malformed.
  """
  progress = progress or (lambda text_: None)
  suite = Suite(base_dir, csv_paths, conventions, unstated=unstated)
  return run_suite(suite, progress, systems)


def run_suite(suite, progress=None, systems=None):
  """:func:`run` on an already mapped :class:`Suite`."""
  progress = progress or (lambda text_: None)
  results = []
  for case in suite.cases:
    if not case.expressible:
      res = Result(case, 'not priced', reason='; '.join(case.missing))
    else:
      cluster = case.cluster or case.system_name
      override = (systems or {}).get(cluster)
      system = suite.system(case, override, key=f'override {cluster}'
                            if override is not None else None)
      res = price(case, system)
      res.system_file = suite.system_label(case, override)
    progress(f'  {case.id} {text(case.row.get("model_name"))}: {res.status}'
             + (f' ({res.tried} execution(s) priced)' if res.tried else ''))
    results.append(res)
  return results


_RECOMPUTE_SHORT = {'full': 'full', 'attn_only': 'attn', 'selective': 'sel',
                    'none': 'none'}


def _choice(exe, case):
  """Short text of the searched settings chosen."""
  if exe is None:
    return ''
  parts = []
  for key in AXES:
    if len(case.axes.get(key, [])) <= 1:
      continue
    value = exe[key]
    if key == 'microbatch_size':
      parts.append(f'mbs {value}')
    elif key == 'pipeline_interleaving':
      parts.append(f'vp {value}')
    elif key == 'activation_recompute':
      parts.append(f'rc {_RECOMPUTE_SHORT[value]}')
    elif key == 'tensor_par_comm_type':
      parts.append(value)
    elif key == 'tensor_par_overlap':
      parts.append(f'tpo {value}')
    elif key == 'data_par_overlap':
      parts.append('dpo' if value else 'no dpo')
    elif key == 'data_par_sharding':
      parts.append(f'shard {value}')
    elif key == 'attention_kernel':
      parts.append(value)
    elif key == 'fused_activation':
      parts.append('fused' if value else 'unfused')
    elif key == 'moe_comm_overlap':
      parts.append(f'ep-overlap {value}')
  return ' '.join(parts)


def results_frame(results):
  """One row per run: id, source (group), model, GPUs, gpu, system,
  TP/PP/DP/CP, metric, measured value and time (s), predicted time (the
  fastest feasible execution) and in the measured unit, delta_pct, the
  slowest feasible time and its delta, status, chosen settings, the
  number of candidates, assumptions, approximations, reason."""
  rows = []
  for r in results:
    c = r.case
    row = c.row
    par = '/'.join(str(number(row.get(k)) or '?') for k in ('tp', 'pp', 'dp'))
    if (number(row.get('cp')) or 1) > 1:
      par += f"/cp{number(row.get('cp'))}"
    measured = c.measured_value
    rows.append({
      'id': c.id, 'source': c.group, 'file': row.get('file', ''),
      'model': text(row.get('model_name')), 'gpus': number(row.get('num_gpus')),
      'gpu': text(row.get('gpu_type')).split(' (')[0],
      'system': c.system_name or '', 'system_file': r.system_file,
      'tp_pp_dp': par, 'metric': c.metric,
      'measured': measured, 'measured_s': c.measured_s,
      'predicted_s': r.predicted_s,
      'predicted': None if r.predicted_s is None else predicted_metric(
        c.metric, r.predicted_s, c.measured_s, measured),
      'delta_pct': r.delta_pct, 'slowest_s': r.slowest_s,
      'delta_slowest_pct': r.delta_slowest_pct, 'status': r.status,
      'over_memory': r.over_memory,
      'measured_mem_gib': c.measured_mem_gib,
      'predicted_mem_gib': r.predicted_mem_gib,
      'delta_mem_pct': r.delta_mem_pct,
      'settings': _choice(r.execution, c) if r.status == 'ok' else '',
      'candidates': r.tried, 'assumptions': c.assumptions_text(),
      'approximations': '; '.join(c.approximations),
      'reason': r.reason,
    })
  return pd.DataFrame(rows)


def error_stats(deltas):
  """Median |delta|, share within 10 % and 20 %, median signed delta,
  mean and max |delta| of an array of deltas (percent)."""
  d = np.asarray([x for x in deltas if x is not None and np.isfinite(x)],
                 dtype=float)
  if not len(d):
    return {'n': 0, 'median_abs_delta_pct': None, 'mean_abs_delta_pct': None,
            'max_abs_delta_pct': None, 'within_10pct': None,
            'within_20pct': None, 'median_delta_pct': None}
  a = np.abs(d)
  return {'n': int(len(d)), 'median_abs_delta_pct': float(np.median(a)),
          'mean_abs_delta_pct': float(a.mean()),
          'max_abs_delta_pct': float(a.max()),
          'within_10pct': float((a <= 10).mean()),
          'within_20pct': float((a <= 20).mean()),
          'median_delta_pct': float(np.median(d))}


def summary(frame):
  """Summary of :func:`results_frame`: counts (rows, predicted, infeasible,
  not priced, over memory) and, over the priced rows, the error statistics
  of :func:`error_stats`, plus the median range of the unknowns (slowest /
  fastest - 1, percent)."""
  ok = frame[frame['status'] == 'ok']
  out = {
    'rows': int(len(frame)),
    'predicted': int(len(ok)),
    'infeasible': int((frame['status'] == 'infeasible').sum()),
    'not_priced': int((frame['status'] == 'not priced').sum()),
    'over_memory': int(ok['over_memory'].sum()) if len(ok) else 0,
  }
  stats = error_stats(ok['delta_pct'])
  stats.pop('n')
  out.update(stats)
  if len(ok):
    spread = ok['slowest_s'] / ok['predicted_s'] - 1
    out['median_unknowns_range_pct'] = float(100 * spread.median())
  else:
    out['median_unknowns_range_pct'] = None
  # Memory, over the priced rows whose notes state a measured peak.
  out['memory'] = error_stats(ok['delta_mem_pct'] if len(ok) else [])
  return out


def by_source(frame, column='delta_pct'):
  """Per source group over the priced rows: rows, median signed delta,
  median |delta|, share within 10 %, max |delta| (percent)."""
  ok = frame[frame['status'] == 'ok']
  rows = {}
  for source, part in ok.groupby('source', sort=False):
    s = error_stats(part[column])
    rows[source] = {'rows': s['n'], 'median_delta_pct': s['median_delta_pct'],
                    'median_abs_delta_pct': s['median_abs_delta_pct'],
                    'within_10pct': s['within_10pct'],
                    'max_abs_delta_pct': s['max_abs_delta_pct']}
  return pd.DataFrame.from_dict(rows, orient='index')


def assumption_lines(ok, label='', flag=None):
  """Report lines 'Assumptions and approximations:' with, per row of
  ``ok`` (a results frame), its id, ``label`` and assumptions, its
  approximations when any, and its ``reason`` where column ``flag`` is
  true (None: never).  Shared by the published and whole-runs
  reports."""
  lines = ['', 'Assumptions and approximations:']
  for _, r in ok.iterrows():
    pad = ' ' * len(r['id'])
    lines.append(f"  {r['id']}: {label}{r['assumptions'] or '-'}")
    if r['approximations']:
      lines.append(f"  {pad}  approximations: {r['approximations']}")
    if flag is not None and r[flag]:
      lines.append(f"  {pad}  {r['reason']}")
  return lines


def format_report(frame, verbose=False, cases=None):
  """Readable text: the conversions, the table of priced rows (with the
  range of the unknowns), the summary, per source, and the rows not priced
  with the reason (verbose: assumptions and approximations of each row)."""
  from calculon.validation.system_files import priced_on_line
  lines = ['Conversions of the measured figures to a time:']
  for metric in dict.fromkeys(frame['metric']):
    if metric in CONVERSIONS:
      lines.append(f'  {metric}: {CONVERSIONS[metric]}')
  lines.append('  FLOP conventions: ' + '; '.join(
    f'{k}: {v}' for k, v in FLOPS_CONVENTION_TEXT.items()))
  ok = frame[frame['status'] == 'ok']
  if len(ok):
    show = pd.DataFrame({
      'id': ok['id'], 'model': ok['model'].str.slice(0, 30),
      'GPUs': ok['gpus'], 'system file': ok['system_file'],
      'TP/PP/DP': ok['tp_pp_dp'], 'metric': ok['metric'].str.replace(
        '_per_gpu', '/gpu'),
      'measured': ok['measured'].map(_fmt),
      'predicted': ok['predicted'].map(_fmt),
      'meas. s': ok['measured_s'].map(_fmt),
      'pred. s': ok['predicted_s'].map(_fmt),
      'delta': ok['delta_pct'].map(lambda v: f'{v:+.1f}%'),
      'slowest': ok['delta_slowest_pct'].map(lambda v: f'{v:+.1f}%'),
      'settings': ok['settings'] + np.where(ok['over_memory'],
                                            ' [over memory]', '')})
    lines += ['', 'Predicted vs measured (delta = 100 * (1 - predicted / '
              'measured) on the time; fastest feasible execution, and the '
              'slowest one the unknown settings allow):',
              show.to_string(index=False), priced_on_line(ok['system_file'])]
    if verbose:
      lines += assumption_lines(ok, 'assumptions: ', 'over_memory')
  s = summary(frame)
  lines += ['', f"Summary: {s['predicted']} of {s['rows']} rows predicted, "
            f"{s['infeasible']} infeasible, {s['not_priced']} not priced"
            + (f" ({s['over_memory']} priced over the memory the model "
               'estimates)' if s['over_memory'] else '')]
  if s['predicted']:
    lines.append(
      f"  |delta| median {s['median_abs_delta_pct']:.1f}%, mean "
      f"{s['mean_abs_delta_pct']:.1f}%, max {s['max_abs_delta_pct']:.1f}%; "
      f"within 10%: {100 * s['within_10pct']:.0f}%, within 20%: "
      f"{100 * s['within_20pct']:.0f}%; median delta "
      f"{s['median_delta_pct']:+.1f}% (positive: predicted faster); "
      f"unknown settings span {s['median_unknowns_range_pct']:.0f}% "
      '(median slowest / fastest - 1)')
    per = by_source(frame)
    show = pd.DataFrame({
      'rows': per['rows'],
      'median delta': per['median_delta_pct'].map(lambda v: f'{v:+.1f}%'),
      'median |delta|': per['median_abs_delta_pct'].map(
        lambda v: f'{v:.1f}%'),
      'within 10%': per['within_10pct'].map(lambda v: f'{100 * v:.0f}%'),
      'max |delta|': per['max_abs_delta_pct'].map(lambda v: f'{v:.1f}%')})
    lines += ['', 'By source:', show.to_string(),
              priced_on_line(ok['system_file'])]
    mem = ok[ok['delta_mem_pct'].notna()]
    if len(mem):
      m = s['memory']
      show = pd.DataFrame({
        'id': mem['id'], 'model': mem['model'].str.slice(0, 30),
        'measured GiB': mem['measured_mem_gib'].map(_fmt),
        'predicted GiB': mem['predicted_mem_gib'].map(_fmt),
        'delta': mem['delta_mem_pct'].map(lambda v: f'{v:+.1f}%')})
      lines += ['', 'Memory per GPU, where the notes state the measured peak '
                '(delta = 100 * (1 - predicted / measured); the execution '
                'priced above):', show.to_string(index=False),
                f"  {m['n']} rows: |delta| median "
                f"{m['median_abs_delta_pct']:.1f}%, within 10%: "
                f"{100 * m['within_10pct']:.0f}%, within 20%: "
                f"{100 * m['within_20pct']:.0f}%; median delta "
                f"{m['median_delta_pct']:+.1f}% (positive: predicted less)",
                '  ' + priced_on_line(mem['system_file'])]
  bad = frame[frame['status'] == 'infeasible']
  if len(bad):
    lines += ['', 'Priced but infeasible in the model:']
    for _, r in bad.iterrows():
      lines.append(f"  {r['id']} {r['model']}: {r['reason']}")
  no = frame[frame['status'] == 'not priced']
  if len(no):
    lines += ['', 'Not priced (reason):']
    for _, r in no.iterrows():
      lines.append(f"  {r['id']} {r['model']}: {r['reason']}")
  return '\n'.join(lines)


def _fmt(v):
  if v is None or (isinstance(v, float) and math.isnan(v)):
    return ''
  v = float(v)
  if abs(v) >= 1000:
    return f'{v:.0f}'
  if abs(v) >= 10:
    return f'{v:.2f}'
  return f'{v:.4g}'
