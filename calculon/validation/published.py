"""Published training runs: predicted vs measured batch time.

Input: ``validation/published_runs.csv`` (built by
``validation/build_published_runs.py`` from the shared measurements; one row
per measured run, with its source and provenance notes).  For every row the
model can express, this module

1. converts the measured figure to the time of one batch (:func:`
   measured_time_s`, conversions in :data:`CONVERSIONS`),
2. builds the application and execution (settings mapped from the row,
   unknown settings searched, see :func:`candidates`) and prices it on the
   bundled system for its GPU,
3. reports ``delta = 100 * (1 - predicted / measured)`` percent (the
   reference's convention: positive when the model predicts a shorter time
   than was measured).

Rows it cannot express are listed with the missing features
(:func:`missing_features`); expressible rows the model finds infeasible
(memory) are reported as such.
"""

from dataclasses import dataclass, field
import itertools
import math
import os

import numpy as np
import pandas as pd

from calculon.errors import ConfigError
from calculon.io import read_json_file

#: Columns of the shared measurements file (copied verbatim).
FACT_COLUMNS = (
  'source', 'model_name', 'num_layers', 'hidden', 'ffn_hidden', 'attn_heads',
  'kv_heads', 'seq_len', 'vocab', 'num_gpus', 'gpu_type', 'tp', 'pp', 'dp',
  'cp', 'vp', 'global_batch_size', 'micro_batch_size', 'recompute',
  'seq_parallel', 'dtype', 'measured_metric_name', 'measured_value', 'notes')
#: Columns added by validation/build_published_runs.py.
ADDED_COLUMNS = ('id', 'source_short', 'mlp', 'block_layout', 'assumptions',
                 'assumptions_why', 'unsupported')
#: Keys of the ``assumptions`` column: the first four fill a blank fact
#: column, the others fix an option no column holds.
ASSUMPTION_KEYS = ('vp', 'micro_batch_size', 'recompute', 'seq_parallel',
                   'tensor_par_comm_type', 'tensor_par_overlap',
                   'data_par_overlap', 'optimizer_sharding')

#: Measured metrics and how each becomes a time (see measured_time_s).
CONVERSIONS = {
  'iteration_time_s': 'batch time = the measured iteration time (s)',
  'tokens_per_sec_per_gpu': 'batch time = B * s / (value * N) '
  '(B global batch, s sequence, N GPUs)',
  'tflops_per_gpu': 'batch time = F / (value * 1e12 * N), F = 96 B s l h^2 '
  '(1 + s/(6h) + V/(16 l h)) (Narayanan et al. 2021 eq. 3, counts the '
  'recomputed forward pass)',
  'mfu_pct': 'batch time = M / (value/100 * peak * N), M = 72 B s l h^2 '
  '(1 + s/(6h) + V/(12 l h)) (eq. 3 without recomputation; peak: the '
  "system's matrix TFLOP/s for the datatype)",
  'layer_fwd_plus_bwd_ms': 'time of one transformer layer, forward + '
  'backward of one microbatch = value / 1000 (s); predicted with a 1-block '
  'model: fw + bw + recompute + exposed TP communication',
}

#: GPU type (prefix) -> bundled system file; the GPU must say 80GB.
SYSTEMS = (('A100', 'a100_80g'), ('H100', 'h100_80g_nvl8'))
#: Processors per node (NVLink domain) of the bundled systems (tier 0 size).
NODE_GPUS = 8

RECOMPUTE = {'full': 'full', 'selective': 'attn_only', 'none': 'none'}
ALL_RECOMPUTE = ('none', 'attn_only', 'full')


def _blank(value):
  return value is None or (isinstance(value, float) and math.isnan(value)) \
    or (isinstance(value, str) and not value.strip())


def _int(value):
  return None if _blank(value) else int(round(float(value)))


def _text(value):
  return '' if _blank(value) else str(value).strip()


def read_runs(path):
  """The published runs as a DataFrame (strings kept, blanks as NaN).

  Raises:
    ConfigError: the file is missing, or a column is missing.
  """
  if not os.path.exists(path):
    raise ConfigError(f'{path}: no such file (build it with python '
                      'validation/build_published_runs.py)', source=path)
  frame = pd.read_csv(path, dtype=str, keep_default_na=False,
                      na_values=[''])
  missing = [c for c in FACT_COLUMNS + ADDED_COLUMNS if c not in frame.columns]
  if missing:
    raise ConfigError(f"{path}: missing column(s) {', '.join(missing)}",
                      source=path, field=missing[0],
                      allowed=', '.join(FACT_COLUMNS + ADDED_COLUMNS))
  return frame


#: Allowed values of each assumption key (None: an integer >= 1).
ASSUMPTION_VALUES = {
  'vp': None, 'micro_batch_size': None,
  'recompute': ('full', 'selective', 'none'), 'seq_parallel': ('y', 'n'),
  'tensor_par_comm_type': ('ar', 'p2p_rs_ag', 'rs_ag'),
  'tensor_par_overlap': ('none', 'ring', 'pipe'),
  'data_par_overlap': ('true', 'false'),
  'optimizer_sharding': ('true', 'false'),
}


def parse_assumptions(text, source='<assumptions>', row_id=None):
  """dict key -> value string of an ``assumptions`` cell (``k=v; k=v``).

  Raises:
    ConfigError: a setting without '=', a key not in
      :data:`ASSUMPTION_KEYS`, or a value its key does not allow.
  """
  out = {}
  for part in _text(text).split(';'):
    part = part.strip()
    if not part:
      continue
    key, sep, value = part.partition('=')
    key, value = key.strip(), value.strip()
    if not sep or key not in ASSUMPTION_KEYS:
      raise ConfigError(
        f"{source}: row {row_id}: field 'assumptions' = {part!r} is not "
        f"allowed: key=value with key one of {', '.join(ASSUMPTION_KEYS)}",
        source=source, field='assumptions', value=part,
        allowed=', '.join(ASSUMPTION_KEYS))
    allowed = ASSUMPTION_VALUES[key]
    ok = value.isdigit() and int(value) >= 1 if allowed is None \
      else value in allowed
    if not ok:
      what = 'an integer >= 1' if allowed is None else ', '.join(allowed)
      raise ConfigError(
        f"{source}: row {row_id}: assumption '{key}' = {value!r} is not "
        f'allowed: {what}', source=source, field='assumptions', value=value,
        allowed=what)
    out[key] = value
  return out


@dataclass
class Case:
  """One published run, mapped onto the model.

  Attributes:
    row: the CSV row (dict of strings / NaN).
    missing: features the model lacks (empty when expressible).
    approximations: how the row is approximated where expressible.
    app: application JSON object (None when not expressible).
    system_name: bundled system file (without .json).
    fixed: execution fields fixed by the row.
    searched: execution field -> list of values tried (unknown settings).
    measured_s: measured batch (or layer) time, seconds.
  """
  row: dict
  missing: list = field(default_factory=list)
  approximations: list = field(default_factory=list)
  app: dict = None
  system_name: str = None
  datatype: str = None
  fixed: dict = field(default_factory=dict)
  searched: dict = field(default_factory=dict)
  measured_s: float = None

  @property
  def id(self):
    return self.row['id']

  @property
  def metric(self):
    return self.row['measured_metric_name']

  @property
  def expressible(self):
    return not self.missing


def system_for(gpu_type):
  """Bundled system name for a GPU description, or None."""
  gpu = _text(gpu_type)
  for prefix, name in SYSTEMS:
    if gpu.startswith(prefix) and '80GB' in gpu:
      return name
  return None


def datatype_for(dtype):
  """Execution datatype of a row's dtype text, or None when not stated.

  'fp8' -> float8; any 16-bit format (fp16, bf16, mixed(16-bit)) ->
  float16 (bf16 runs at the float16 rate on A100/H100 tensor cores and
  stores 2 bytes)."""
  text = _text(dtype).lower()
  if text == 'fp8':
    return 'float8'
  if '16' in text:
    return 'float16'
  return None


def eq3_flops(batch, seq, layers, hidden, vocab, recompute=True):
  """FLOP of one batch of a GPT model (Narayanan et al. 2021, SC'21, eq. 3):
  ``96 B s l h^2 (1 + s/(6h) + V/(16 l h))`` with the recomputed forward pass
  (``recompute``), else ``72 B s l h^2 (1 + s/(6h) + V/(12 l h))`` (three
  passes instead of four for the layers; the logit layer unchanged)."""
  b, s, l, h, v = map(float, (batch, seq, layers, hidden, vocab))
  if recompute:
    return 96 * b * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))
  return 72 * b * s * l * h * h * (1 + s / (6 * h) + v / (12 * l * h))


def measured_time_s(row, peak_flops=None):
  """The measured figure of ``row`` as a time in seconds (a batch; one
  layer for 'layer_fwd_plus_bwd_ms'), by :data:`CONVERSIONS`.

  Args:
    row: dict with the fact columns.
    peak_flops: FLOP/s of one GPU (needed for 'mfu_pct').

  Raises:
    ConfigError: an unknown metric.
    ValueError: a value the conversion needs is blank.
  """
  metric = _text(row['measured_metric_name'])
  value = float(row['measured_value'])
  n = _int(row['num_gpus'])
  batch, seq = _int(row['global_batch_size']), _int(row['seq_len'])
  layers, hidden, vocab = (_int(row['num_layers']), _int(row['hidden']),
                           _int(row['vocab']))
  if metric == 'iteration_time_s':
    return value
  if metric == 'layer_fwd_plus_bwd_ms':
    return value / 1e3
  if metric == 'tokens_per_sec_per_gpu':
    return batch * seq / (value * n)
  if metric == 'tflops_per_gpu':
    return eq3_flops(batch, seq, layers, hidden, vocab) / (value * 1e12 * n)
  if metric == 'mfu_pct':
    if peak_flops is None:
      raise ValueError('mfu_pct needs the peak FLOP/s')
    return eq3_flops(batch, seq, layers, hidden, vocab, recompute=False) / (
      value / 100 * peak_flops * n)
  raise ConfigError(
    f"field 'measured_metric_name' = {metric!r} is not allowed: one of "
    f"{', '.join(CONVERSIONS)}", field='measured_metric_name', value=metric,
    allowed=', '.join(CONVERSIONS))


def predicted_metric(metric, time_s, measured_s, measured_value):
  """The predicted time expressed in the measured metric's unit (every
  conversion is value = constant / time, or time itself)."""
  if metric in ('iteration_time_s',):
    return time_s
  if metric == 'layer_fwd_plus_bwd_ms':
    return time_s * 1e3
  return measured_value * measured_s / time_s


def _factors(x):
  return [c for c in range(1, x + 1) if x % c == 0]


def missing_features(row):
  """Features of ``row`` the model cannot express (empty list if none)."""
  out = []
  gpu = _text(row['gpu_type'])
  if system_for(gpu) is None:
    out.append(f'hardware {gpu.split(" (")[0]!r} (no system file: the bundled '
               'systems are A100 80 GB and H100 80 GB)')
  for item in _text(row['unsupported']).split(';'):
    if item.strip():
      out.append(item.strip())
  if _text(row['block_layout']) == 'parallel':
    out.append('parallel attention + MLP block (the model computes them one '
               'after the other)')
  tp, pp, dp, cp = (_int(row[k]) for k in ('tp', 'pp', 'dp', 'cp'))
  if None in (tp, pp, dp):
    out.append('TP/PP/DP not stated')
  if cp is not None and cp > 1:
    out.append(f'context parallelism (CP = {cp})')
  heads, kv = _int(row['attn_heads']), _int(row['kv_heads'])
  if kv is not None and kv not in (1, heads):
    out.append(f'grouped-query attention ({kv} KV heads for {heads} query '
               'heads)')
  recompute = _text(row['recompute'])
  if recompute and recompute not in RECOMPUTE:
    if 'microbatch-level' in recompute:
      out.append('microbatch-level activation recomputation')
    else:
      out.append(f'recomputation {recompute!r}')
  if _text(row['seq_parallel']) not in ('', 'y', 'n'):
    out.append(f"sequence parallelism {row['seq_parallel']!r}")
  if _blank(row['global_batch_size']):
    out.append('global batch not stated')
  if _blank(row['ffn_hidden']):
    out.append('MLP width (ffn_hidden) not stated')
  if datatype_for(row['dtype']) is None:
    out.append(f"datatype {_text(row['dtype']) or 'not stated'}")
  if _text(row['measured_metric_name']) in ('tflops_per_gpu', 'mfu_pct') \
     and _blank(row['vocab']):
    out.append('vocabulary not stated (the FLOP conversion needs it)')
  hidden = _int(row['hidden'])
  if heads and hidden and hidden % heads:
    out.append(f'head width hidden / heads = {hidden}/{heads} not an integer')
  if tp and not out:
    ffn = _int(row['ffn_hidden'])
    for what, size in (('attention heads', heads), ('hidden', hidden),
                       ('MLP width', ffn)):
      if size % tp:
        out.append(f'TP = {tp} does not divide the {what} ({size})')
  if not out:
    n = _int(row['num_gpus'])
    if tp * pp * dp * (cp or 1) != n:
      out.append(f'TP x PP x DP = {tp * pp * dp} is not the GPU count {n}')
    batch = _int(row['global_batch_size'])
    if batch % dp:
      out.append(f'global batch {batch} is not a multiple of DP = {dp}')
  return out


def build_case(row, source='<published runs>'):
  """Maps one CSV row onto the model (see :class:`Case`).

  Rules (stated in docs/accuracy.md):

  * Application: blocks, hidden, MLP width (``mlp = gated``: SwiGLU's three
    h x f GEMMs as a plain MLP of width 1.5 f -- same weights and GEMM
    FLOP), heads, head width hidden / heads, sequence.  Embedding and logit
    layers are not modeled.
  * TP, PP, DP as stated; VP -> pipeline_interleaving; recompute full /
    selective / none -> full / attn_only / none; seq_parallel y -> rs_ag
    (all-gather redone in backward, as Megatron-LM does, but not with full
    recomputation), n -> ar (or the ``tensor_par_comm_type`` assumption);
    dtype fp8 -> float8, 16-bit -> float16; fused_activation false, no
    offloading; kv_heads = 1 -> multiquery attention.
  * Networks: Megatron-LM's rank order (TP innermost, then DP, then PP): a
    parallelism is on tier 0 (NVLink, 8 GPUs) when it and the ones inside
    it fit in a node, else on tier 1.
  * Unknown settings (blank and not assumed) are searched: microbatch
    (divisors of the local batch), interleaving (divisors of the blocks per
    stage), recomputation, sequence parallelism, TP overlap, DP overlap,
    optimizer sharding; the fastest feasible execution is taken (published
    runs are tuned).

  Raises:
    ConfigError: a malformed assumptions cell.
  """
  case = Case(row=row)
  case.missing = missing_features(row)
  if case.missing:
    return case
  rid = row['id']
  assumed = parse_assumptions(row['assumptions'], source, rid)
  facts = {'vp': row['vp'], 'micro_batch_size': row['micro_batch_size'],
           'recompute': row['recompute'], 'seq_parallel': row['seq_parallel']}
  for key in facts:
    if key in assumed and not _blank(facts[key]):
      raise ConfigError(
        f"{source}: row {rid}: assumption '{key}' is not allowed: the row "
        f'states {key} = {facts[key]!r}', source=source, field='assumptions',
        value=key, allowed='assumptions only for blank columns')
    if key in assumed:
      facts[key] = assumed[key]

  layers, hidden, heads = (_int(row[k]) for k in ('num_layers', 'hidden',
                                                  'attn_heads'))
  ffn, seq = _int(row['ffn_hidden']), _int(row['seq_len'])
  if _text(row['mlp']) == 'gated':
    ffn = ffn * 3 // 2
    case.approximations.append('gated MLP (SwiGLU) as a plain MLP of width '
                               '1.5 x ffn_hidden (same weights and FLOP)')
  case.app = {'hidden': hidden, 'feedforward': ffn, 'seq_size': seq,
              'attn_heads': heads, 'attn_size': hidden // heads,
              'num_blocks': layers}
  case.system_name = system_for(row['gpu_type'])
  case.datatype = datatype_for(row['dtype'])
  if 'bf16' in _text(row['dtype']).lower():
    case.approximations.append('bf16 priced as float16 (same rate, 2 bytes)')
  if 'Selene' not in _text(row['gpu_type']) and \
     case.system_name == 'a100_80g':
    case.approximations.append('cluster priced as the Selene-like A100 '
                               'system (a100_80g)')
  vocab = _int(row['vocab'])
  case.approximations.append(
    'embedding and logit layers not modeled' +
    (f' (V = {vocab})' if vocab else ''))
  if layers % _int(row['pp']):
    case.approximations.append(
      f"{layers} layers over PP = {_int(row['pp'])} stages: every stage "
      'priced with the largest share')

  tp, pp, dp = (_int(row[k]) for k in ('tp', 'pp', 'dp'))
  batch = _int(row['global_batch_size'])
  case.fixed = {
    'num_procs': tp * pp * dp, 'tensor_par': tp, 'pipeline_par': pp,
    'data_par': dp,
    'tensor_par_net': 0,
    'data_par_net': 0 if tp * dp <= NODE_GPUS else 1,
    'pipeline_par_net': 0 if tp * dp * pp <= NODE_GPUS else 1,
    'batch_size': batch, 'datatype': case.datatype,
    'fused_activation': False,
    'attention_type': 'multiquery' if _int(row['kv_heads']) == 1 and
    heads > 1 else 'multihead',
    'weight_offload': False, 'activations_offload': False,
    'optimizer_offload': False, 'training': True,
  }
  s = case.searched
  local = batch // dp
  if _blank(facts['micro_batch_size']):
    s['microbatch_size'] = [m for m in _factors(local) if (m * seq) % tp == 0]
  else:
    s['microbatch_size'] = [_int(facts['micro_batch_size'])]
  if pp == 1:
    s['pipeline_interleaving'] = [1]
  elif _blank(facts['vp']):
    s['pipeline_interleaving'] = _factors(-(-layers // pp))
  else:
    s['pipeline_interleaving'] = [_int(facts['vp'])]
  rec = _text(facts['recompute'])
  s['activation_recompute'] = [RECOMPUTE[rec]] if rec else list(ALL_RECOMPUTE)
  sp = _text(facts['seq_parallel'])
  if tp == 1:
    s['tensor_par_comm_type'] = ['ar']
  elif 'tensor_par_comm_type' in assumed:
    s['tensor_par_comm_type'] = [assumed['tensor_par_comm_type']]
  elif sp:
    s['tensor_par_comm_type'] = ['rs_ag' if sp == 'y' else 'ar']
  else:
    s['tensor_par_comm_type'] = ['ar', 'rs_ag']
  if tp == 1:
    s['tensor_par_overlap'] = ['none']
  elif 'tensor_par_overlap' in assumed:
    s['tensor_par_overlap'] = [assumed['tensor_par_overlap']]
  else:
    s['tensor_par_overlap'] = ['none', 'ring', 'pipe']
  for key in ('data_par_overlap', 'optimizer_sharding'):
    if dp == 1:
      s[key] = [False]
    elif key in assumed:
      s[key] = [assumed[key] == 'true']
    else:
      s[key] = [False, True]
  return case


def candidates(case):
  """DataFrame of every execution tried for ``case`` (the 23 fields), in a
  fixed order (the first of equally fast ones wins)."""
  keys = list(case.searched)
  rows = []
  for values in itertools.product(*(case.searched[k] for k in keys)):
    exe = dict(case.fixed)
    exe.update(zip(keys, values))
    exe['seq_par_ag_redo'] = (exe['tensor_par_comm_type'] == 'rs_ag' and
                              exe['activation_recompute'] != 'full')
    rows.append(exe)
  from calculon.config.execution import FIELDS
  return pd.DataFrame(rows, columns=list(FIELDS))


def layer_time_s(stats):
  """Forward + backward time of the block(s) of one microbatch (s): forward,
  backward, recomputation and exposed (re)communication of TP; for a
  1-block model with PP = DP = 1 and one microbatch, the batch time without
  the optimizer step."""
  return (stats['fw_time'] + stats['bw_time'] + stats['recompute_time'] +
          stats['recomm_exposed_time'] + stats['tp_comm_exposed_time'])


@dataclass
class Result:
  """Outcome of one row: ``status`` 'ok', 'infeasible' or 'not expressible';
  ``predicted_s`` (s) and ``delta_pct`` when ok; ``execution`` the chosen
  execution (dict); ``reason`` the infeasibility message; ``tried`` the
  number of executions priced."""
  case: Case
  status: str
  predicted_s: float = None
  delta_pct: float = None
  execution: dict = None
  reason: str = ''
  tried: int = 0


def predict(case, base_dir, systems=None):
  """Prices ``case`` (see :func:`build_case`): the fastest feasible of its
  candidates.  Returns a :class:`Result`."""
  from calculon.llm import evaluate
  if not case.expressible:
    return Result(case, 'not expressible')
  systems = {} if systems is None else systems
  if case.system_name not in systems:
    systems[case.system_name] = read_system(base_dir, case.system_name)
  system = systems[case.system_name]
  if case.metric == 'mfu_pct' or case.measured_s is None:
    peak = system['matrix'][case.datatype]['tflops'] * 1e12
    case.measured_s = measured_time_s(case.row, peak)
  frame = candidates(case)
  out = evaluate(case.app, system, frame, source=f'published run {case.id}')
  if case.metric == 'layer_fwd_plus_bwd_ms':
    time_s = layer_time_s(out)
  else:
    time_s = out['total_time']
  time_s = np.where(out['feasible'], time_s, np.inf)
  if not np.isfinite(time_s).any():
    least = int(np.argmin(out['proc_mem_tier1_cap_req'].to_numpy()))
    return Result(case, 'infeasible', reason=out['reason'].iloc[least],
                  execution=_record(out.iloc[least]), tried=len(out))
  best = int(np.argmin(time_s))
  pred = float(time_s[best])
  return Result(case, 'ok', predicted_s=pred,
                delta_pct=100.0 * (1.0 - pred / case.measured_s),
                execution=_record(out.iloc[best]), tried=len(out))


def _record(series):
  from calculon.config.execution import FIELDS
  rec = {}
  for f in FIELDS:
    v = series[f]
    rec[f] = v.item() if isinstance(v, np.generic) else v
  return rec


def read_system(base_dir, name):
  """JSON object of ``systems/NAME.json`` (a hook tests may replace)."""
  return read_json_file(os.path.join(base_dir, 'systems', f'{name}.json'))


def run(base_dir, csv_path=None, progress=None):
  """Runs the published suite.

  Args:
    base_dir: folder with systems/ and validation/published_runs.csv.
    csv_path: the runs file (default base_dir/validation/published_runs.csv).
    progress: callable(str) told of each row (verbose output), or None.

  Returns:
    list of :class:`Result`, one per CSV row, in file order.

  Raises:
    ConfigError: the file or a row is malformed.
  """
  progress = progress or (lambda text: None)
  path = csv_path or os.path.join(base_dir, 'validation',
                                  'published_runs.csv')
  frame = read_runs(path)
  ids = frame['id']
  if ids.duplicated().any():
    dup = ids[ids.duplicated()].iloc[0]
    raise ConfigError(f"{path}: field 'id' = {dup!r} is not allowed: ids "
                      'must be unique', source=path, field='id', value=dup)
  systems = {}
  results = []
  for rec in frame.to_dict('records'):
    case = build_case(rec, path)
    if case.expressible and case.metric != 'mfu_pct':
      case.measured_s = measured_time_s(rec)
    res = predict(case, base_dir, systems)
    progress(f'  {case.id} {rec["model_name"]}: {res.status}'
             + (f' ({res.tried} execution(s) priced)' if res.tried else ''))
    results.append(res)
  return results


def _choice(exe):
  if exe is None:
    return ''
  rec = {'full': 'full', 'attn_only': 'sel', 'none': 'none'}
  parts = [f"mbs {exe['microbatch_size']}"]
  if exe['pipeline_par'] > 1:
    parts.append(f"vp {exe['pipeline_interleaving']}")
  parts.append(f"rc {rec[exe['activation_recompute']]}")
  if exe['tensor_par'] > 1:
    parts.append(exe['tensor_par_comm_type'])
    if exe['tensor_par_overlap'] != 'none':
      parts.append(f"tpo {exe['tensor_par_overlap']}")
  if exe['data_par_overlap']:
    parts.append('dpo')
  if exe['optimizer_sharding']:
    parts.append('zero1')
  return ' '.join(parts)


def results_frame(results):
  """One row per published run: id, source, model, GPUs, TP/PP/DP, metric,
  measured value, measured_s, predicted_s, predicted value (same unit as
  measured), delta_pct, status, chosen settings, missing features,
  approximations, reason."""
  rows = []
  for r in results:
    row, c = r.case.row, r.case
    par = '/'.join(_text(row[k]).split('.')[0] or '?'
                   for k in ('tp', 'pp', 'dp'))
    rows.append({
      'id': c.id, 'source': row['source_short'],
      'model': row['model_name'], 'gpus': _int(row['num_gpus']),
      'gpu': _text(row['gpu_type']).split(' (')[0], 'tp_pp_dp': par,
      'metric': c.metric, 'measured': float(row['measured_value']),
      'measured_s': c.measured_s,
      'predicted_s': r.predicted_s,
      'predicted': None if r.predicted_s is None else predicted_metric(
        c.metric, r.predicted_s, c.measured_s, float(row['measured_value'])),
      'delta_pct': r.delta_pct, 'status': r.status,
      'settings': _choice(r.execution) if r.status == 'ok' else '',
      'missing': '; '.join(c.missing),
      'approximations': '; '.join(c.approximations),
      'reason': r.reason,
    })
  return pd.DataFrame(rows)


def summary(frame):
  """Summary of the predicted rows of :func:`results_frame`: counts (rows,
  predicted, infeasible, not expressible) and, over the predicted rows,
  |delta| median, mean and max (percent), the share within 10% and 20%,
  and the median signed delta (positive: the model is optimistic)."""
  ok = frame[frame['status'] == 'ok']
  err = ok['delta_pct'].abs()
  return {
    'rows': int(len(frame)),
    'predicted': int(len(ok)),
    'infeasible': int((frame['status'] == 'infeasible').sum()),
    'not_expressible': int((frame['status'] == 'not expressible').sum()),
    'median_abs_delta_pct': float(err.median()) if len(ok) else None,
    'mean_abs_delta_pct': float(err.mean()) if len(ok) else None,
    'max_abs_delta_pct': float(err.max()) if len(ok) else None,
    'within_10pct': float((err <= 10).mean()) if len(ok) else None,
    'within_20pct': float((err <= 20).mean()) if len(ok) else None,
    'median_delta_pct': float(ok['delta_pct'].median()) if len(ok) else None,
  }


def by_source(frame):
  """Per source (short name) over the predicted rows: rows, median signed
  delta, median and max |delta| (percent)."""
  ok = frame[frame['status'] == 'ok'].copy()
  ok['abs'] = ok['delta_pct'].abs()
  grouped = ok.groupby('source', sort=False)
  return pd.DataFrame({
    'rows': grouped.size(),
    'median_delta_pct': grouped['delta_pct'].median(),
    'median_abs_delta_pct': grouped['abs'].median(),
    'max_abs_delta_pct': grouped['abs'].max(),
  })


def format_report(frame, verbose=False):
  """Readable text: the conversions, the table of predicted rows, the
  summary, infeasible rows, and rows not expressible with their missing
  features (verbose: the approximations of each row too)."""
  lines = ['Conversions of the measured figures to a time:']
  for metric in dict.fromkeys(frame['metric']):
    lines.append(f'  {metric}: {CONVERSIONS.get(metric, "?")}')
  ok = frame[frame['status'] == 'ok']
  if len(ok):
    show = pd.DataFrame({
      'id': ok['id'], 'model': ok['model'].str.slice(0, 34),
      'GPUs': ok['gpus'], 'TP/PP/DP': ok['tp_pp_dp'],
      'metric': ok['metric'], 'measured': ok['measured'].map(_fmt),
      'predicted': ok['predicted'].map(_fmt),
      'meas. s': ok['measured_s'].map(_fmt),
      'pred. s': ok['predicted_s'].map(_fmt),
      'delta': ok['delta_pct'].map(lambda v: f'{v:+.1f}%'),
      'settings': ok['settings']})
    lines += ['', 'Predicted vs measured (delta = 100 * (1 - predicted / '
              'measured) on the time):', show.to_string(index=False)]
    if verbose:
      lines += ['', 'Approximations:']
      for _, r in ok.iterrows():
        lines.append(f"  {r['id']}: {r['approximations']}")
  s = summary(frame)
  lines += ['', f"Summary: {s['predicted']} of {s['rows']} rows predicted, "
            f"{s['infeasible']} infeasible, {s['not_expressible']} not "
            'expressible']
  if s['predicted']:
    lines.append(
      f"  |delta| median {s['median_abs_delta_pct']:.1f}%, mean "
      f"{s['mean_abs_delta_pct']:.1f}%, max {s['max_abs_delta_pct']:.1f}%; "
      f"within 10%: {100 * s['within_10pct']:.0f}%, within 20%: "
      f"{100 * s['within_20pct']:.0f}%; median delta "
      f"{s['median_delta_pct']:+.1f}% (positive: predicted faster)")
    per = by_source(frame)
    show = pd.DataFrame({
      'rows': per['rows'],
      'median delta': per['median_delta_pct'].map(lambda v: f'{v:+.1f}%'),
      'median |delta|': per['median_abs_delta_pct'].map(
        lambda v: f'{v:.1f}%'),
      'max |delta|': per['max_abs_delta_pct'].map(lambda v: f'{v:.1f}%')})
    show.index.name = None
    lines += ['', 'By source:', show.to_string()]
  bad = frame[frame['status'] == 'infeasible']
  if len(bad):
    lines += ['', 'Expressible but infeasible in the model:']
    for _, r in bad.iterrows():
      lines.append(f"  {r['id']} {r['model']}: {r['reason']}")
  no = frame[frame['status'] == 'not expressible']
  if len(no):
    lines += ['', 'Not expressible (missing feature):']
    for _, r in no.iterrows():
      lines.append(f"  {r['id']} {r['model']}: {r['missing']}")
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
