"""Comparison with Korthikanti et al. 2022 (sequence parallelism and
selective recomputation).

Source of every measured number here: V. Korthikanti, J. Casper, S. Lym,
L. McAfee, M. Andersch, M. Shoeybi, B. Catanzaro, "Reducing Activation
Recomputation in Large Transformer Models", arXiv 2205.05198 (2022):

* Figure 1 -- memory per GPU of weights + gradients + optimizer state, and
  of activations, without recomputation ('none') and with sequence
  parallelism + selective recomputation ('seqsel'), in GiB (the values the
  reference, Calculon (Isaev et al., SC'23), read off the figure).
* Figure 7 -- activation memory of each recomputation mode as a percentage
  of 'none'.
* Table 5 -- end-to-end iteration time in seconds, 'full' recomputation vs.
  'seqsel'.

The runs are the paper's Table 3 configurations (22B, 175B (GPT-3), 530B
(MT-NLG), 1T), all without data parallelism: :data:`TABLE3`.  Their
execution files are generated from that table (:func:`write_executions`,
``validation/make_seqsel.py``) into ``validation/seqsel/{fig1,fig7,tab5}/``
and read back from there, as the reference does.

Delta convention (the reference's): ``delta = 100 * (1 - calc / profile)``
percent; positive when the model predicts less than was measured.  Each table
passes when the mean and the maximum of ``|delta|`` stay within its
:data:`THRESHOLDS`.
"""

from dataclasses import dataclass, field
import json
import math
import os

import pandas as pd

from calculon.errors import Infeasible
from calculon.hardware import System
from calculon.io import read_json_file
from calculon.validation import GIB_BYTES, abs_delta_summary

#: Models of the paper, in its order, with the bundled application file.
MODELS = ('megatron-22B', 'gpt3-175B', 'turing-530B', 'megatron-1T')

#: Table 3 of the paper: the parallel configuration of each model.  TP x PP
#: GPUs, no data parallelism; global batch; microbatch; interleaving (the
#: paper uses three interleaved stages for 175B and 530B only).
TABLE3 = {
  # model: (tensor_par, pipeline_par, batch_size, microbatch_size,
  #         pipeline_interleaving)
  'megatron-22B': (8, 1, 4, 4, 1),
  'gpt3-175B': (8, 8, 64, 1, 3),
  'turing-530B': (8, 35, 280, 1, 3),
  'megatron-1T': (8, 64, 512, 1, 1),
}

#: The paper's techniques as execution options: recomputation, TP
#: communication (rs_ag = sequence parallelism, which re-gathers its input in
#: the backward pass instead of storing it, paper section 4.2.2).
MODES = {
  'none': ('none', 'ar', False),
  'seq': ('none', 'rs_ag', True),
  'sel': ('attn_only', 'ar', False),
  'seqsel': ('attn_only', 'rs_ag', True),
  'full': ('full', 'ar', False),
}

#: Measured values.  Figure 1, GiB per GPU: (weights + gradients + optimizer
#: state, activations).
FIG1_PROFILE_GIB = {
  'megatron-22B': {'none': (45.5625, 59.25), 'seqsel': (45.5625, 9.5625)},
  'gpt3-175B': {'none': (45.5625, 66.84375),
                'seqsel': (45.5625, 12.3515625)},
  'turing-530B': {'none': (31.640625, 114.0234375),
                  'seqsel': (31.640625, 23.076171875)},
  'megatron-1T': {'none': (32.958984375, 131.25),
                  'seqsel': (32.958984375, 26.5625)},
}
#: Figure 7, activation memory in percent of 'none', modes none, seq, sel,
#: seqsel, full.
FIG7_PROFILE_PCT = {
  'megatron-22B': (100.00, 66.84, 49.42, 16.18, 7.64),
  'gpt3-175B': (100.00, 62.04, 56.53, 18.49, 8.71),
  'turing-530B': (100.00, 58.31, 62.04, 20.27, 9.42),
  'megatron-1T': (100.00, 58.31, 62.04, 20.27, 9.42),
}
FIG7_MODES = ('none', 'seq', 'sel', 'seqsel', 'full')
#: Table 5, iteration time in seconds: (full, seqsel).
TAB5_PROFILE_S = {
  'megatron-22B': (1.42, 1.10),
  'gpt3-175B': (18.13, 13.75),
  'turing-530B': (49.05, 37.83),
  'megatron-1T': (94.42, 71.49),
}
TAB5_MODES = ('full', 'seqsel')

#: Tables: key -> (title, figure folder, system file, modes).
TABLES = {
  'fig1_params_opt': ('Figure 1: weights + gradients + optimizer (GiB/GPU)',
                      'fig1', 'a100_80e', ('none', 'seqsel')),
  'fig1_activations': ('Figure 1: activations (GiB/GPU)', 'fig1',
                       'a100_80e', ('none', 'seqsel')),
  'fig7': ('Figure 7: activation memory (% of no recomputation)', 'fig7',
           'a100_80e', FIG7_MODES),
  'tab5': ('Table 5: iteration time (s)', 'tab5', 'a100_80g', TAB5_MODES),
}

#: Pass thresholds per table, percent: (mean |delta|, max |delta|).  Set a
#: little above the errors of this model, which are the reference's (these
#: runs have no data parallelism, where both give the same statistics):
#: Figure 1 weights + gradients + optimizer 8.49 / 10.84 (the paper's values
#: correspond to 18 bytes per parameter, the model's to 16), activations
#: 2.08 / 8.74; Figure 7 6.69 / 30.41; Table 5 3.65 / 8.87
#: (docs/accuracy.md).
THRESHOLDS = {
  'fig1_params_opt': (9.0, 11.5),
  'fig1_activations': (2.5, 9.5),
  'fig7': (7.0, 31.0),
  'tab5': (4.0, 9.5),
}


def execution_config(model, mode):
  """The execution JSON object of ``model`` (one of :data:`MODELS`) in
  ``mode`` (one of :data:`MODES`), from the paper's Table 3.

  Raises:
    KeyError: an unknown model or mode.
  """
  tp, pp, batch, mbs, interleaving = TABLE3[model]
  recompute, comm, redo = MODES[mode]
  return {
    'num_procs': tp * pp, 'tensor_par': tp, 'pipeline_par': pp,
    'data_par': 1, 'tensor_par_net': 0, 'pipeline_par_net': 1,
    'data_par_net': 1, 'batch_size': batch, 'microbatch_size': mbs,
    'datatype': 'float16', 'fused_activation': False,
    'attention_type': 'multihead', 'activation_recompute': recompute,
    'pipeline_interleaving': interleaving, 'optimizer_sharding': False,
    'tensor_par_comm_type': comm, 'tensor_par_overlap': 'none',
    'seq_par_ag_redo': redo, 'data_par_overlap': False,
    'weight_offload': False, 'activations_offload': False,
    'optimizer_offload': False, 'training': True,
  }


def _folder_modes():
  out = {}
  for _, folder, _, modes in TABLES.values():
    out.setdefault(folder, [])
    for m in modes:
      if m not in out[folder]:
        out[folder].append(m)
  return out


def execution_files():
  """[(relative path, JSON object)] of every execution file of the suite."""
  out = []
  for folder, modes in _folder_modes().items():
    for model in MODELS:
      for mode in modes:
        rel = os.path.join('validation', 'seqsel', folder,
                           f'{model}_{mode}.json')
        out.append((rel, execution_config(model, mode)))
  return out


def write_executions(base_dir):
  """Writes every execution file under ``base_dir``; returns their paths."""
  paths = []
  for rel, cfg in execution_files():
    path = os.path.join(base_dir, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'w') as fd:
      json.dump(cfg, fd, indent=2)
      fd.write('\n')
    paths.append(path)
  return paths


def read_system(base_dir, name):
  """The JSON object of ``systems/NAME.json`` (a hook tests may replace)."""
  return read_json_file(os.path.join(base_dir, 'systems', f'{name}.json'))


def run_one(base_dir, model, folder, mode, system_cfg):
  """Statistics (Calculon's names and units) of one paper configuration.

  Raises:
    ConfigError: a file is missing or invalid.
    calculon.llm.Llm.Error: the run is infeasible on the system.
  """
  from calculon.llm import Llm
  app = Llm.Application(read_json_file(
    os.path.join(base_dir, 'models', f'{model}.json')))
  exe = Llm.Execution.from_json(read_json_file(os.path.join(
    base_dir, 'validation', 'seqsel', folder, f'{model}_{mode}.json')))
  system = System(system_cfg)
  llm = Llm(app)
  llm.compile(system, exe)
  llm.run(system)
  return llm.get_stats_json(False)


@dataclass
class Table:
  """One comparison.

  Attributes:
    key: name in :data:`TABLES`; title: what is compared (unit).
    frame: DataFrame, one row per (model, mode): ``model``, ``mode``,
      ``profile`` (measured), ``calculon`` (predicted), ``delta_pct``
      (``100 * (1 - calculon / profile)``), and for Table 5 ``mem_gib``
      (memory tier 1 needed per GPU, GiB).
    mean_abs_delta_pct, max_abs_delta_pct: over every cell, as the
      reference averages them (Figure 7's 'none' cells, 0 by definition,
      included).
    threshold_mean_pct, threshold_max_pct: the pass limits.
    system_file: the system file priced on and its kind
      (:func:`calculon.validation.system_files.label`).
  """
  key: str
  title: str
  frame: pd.DataFrame
  mean_abs_delta_pct: float
  max_abs_delta_pct: float
  threshold_mean_pct: float
  threshold_max_pct: float
  failures: list = field(default_factory=list)
  system_file: str = ''

  @property
  def passed(self):
    return not self.failures


def delta_pct(calc, profile):
  """The reference's delta in percent: ``100 * (1 - calc / profile)``."""
  return 100.0 * (1.0 - calc / profile)


def _table(key, rows, thresholds):
  frame = pd.DataFrame(rows)
  finite = frame['delta_pct'].dropna()
  mean, worst = abs_delta_summary(finite)
  lim_mean, lim_max = thresholds[key]
  failures = []
  if len(finite) < len(frame):
    failures.append(f'{len(frame) - len(finite)} run(s) infeasible or '
                    'without a value')
  if round(mean, 2) > lim_mean:
    failures.append(f'mean |delta| {mean:.2f}% > {lim_mean:.2f}%')
  if round(worst, 2) > lim_max:
    failures.append(f'max |delta| {worst:.2f}% > {lim_max:.2f}%')
  return Table(key, TABLES[key][0], frame, mean, worst, lim_mean, lim_max,
               failures)


def compare(base_dir, thresholds=None, progress=None):
  """Runs the three comparisons.

  Args:
    base_dir: folder with models/, systems/ and validation/seqsel/.
    thresholds: dict key -> (mean, max) percent; default :data:`THRESHOLDS`.
    progress: callable(str) told of each run (verbose output), or None.

  Returns:
    list of :class:`Table` (fig1_params_opt, fig1_activations, fig7, tab5).

  Raises:
    ConfigError: a file is missing or invalid.

  A configuration the model finds infeasible (e.g. with a modified system)
  gets no value (NaN) and fails its table.
  """
  thresholds = dict(THRESHOLDS if thresholds is None else thresholds)
  progress = progress or (lambda text: None)
  systems = {}
  infeasible = []

  def stats(folder, system_name, model, mode):
    if system_name not in systems:
      systems[system_name] = read_system(base_dir, system_name)
    progress(f'  running {model} {mode} (validation/seqsel/{folder}, '
             f'systems/{system_name}.json)')
    try:
      return run_one(base_dir, model, folder, mode, systems[system_name])
    except Infeasible as err:
      infeasible.append(f'{model} {mode} ({folder}): {err}')
      progress(f'    infeasible: {err}')
      return None

  nan = float('nan')
  params, acts = [], []
  for model in MODELS:
    for mode in TABLES['fig1_params_opt'][3]:
      s = stats('fig1', TABLES['fig1_params_opt'][2], model, mode)
      p_params, p_act = FIG1_PROFILE_GIB[model][mode]
      calc = nan if s is None else (s['weight_space'] + s['weight_grad_space']
                                    + s['optimizer_space']) / GIB_BYTES
      params.append({'model': model, 'mode': mode, 'profile': p_params,
                     'calculon': calc, 'delta_pct': delta_pct(calc, p_params)})
      calc = nan if s is None else s['act_space'] / GIB_BYTES
      acts.append({'model': model, 'mode': mode, 'profile': p_act,
                   'calculon': calc, 'delta_pct': delta_pct(calc, p_act)})
  fig7 = []
  for model in MODELS:
    raw = {}
    for mode in FIG7_MODES:
      s = stats('fig7', TABLES['fig7'][2], model, mode)
      raw[mode] = nan if s is None else \
        s['act_space'] + s['act_checkpoint_size']
    for mode, profile in zip(FIG7_MODES, FIG7_PROFILE_PCT[model]):
      calc = 100.0 * raw[mode] / raw['none']
      fig7.append({'model': model, 'mode': mode, 'profile': profile,
                   'calculon': calc, 'delta_pct': delta_pct(calc, profile)})
  tab5 = []
  for model in MODELS:
    for mode, profile in zip(TAB5_MODES, TAB5_PROFILE_S[model]):
      s = stats('tab5', TABLES['tab5'][2], model, mode)
      calc = nan if s is None else s['total_time']
      mem = nan if s is None else s['proc_mem_tier1_cap_req'] / GIB_BYTES
      tab5.append({'model': model, 'mode': mode, 'profile': profile,
                   'calculon': calc, 'delta_pct': delta_pct(calc, profile),
                   'mem_gib': mem})
  from calculon.validation.system_files import label
  tables = [_table('fig1_params_opt', params, thresholds),
            _table('fig1_activations', acts, thresholds),
            _table('fig7', fig7, thresholds),
            _table('tab5', tab5, thresholds)]
  for t in tables:
    name = TABLES[t.key][2]
    t.system_file = label(f'{name}.json', systems[name])
  return tables


def format_table(table):
  """The readable text of one :class:`Table`: one line per model, for each
  mode the measured value, ours and the delta; then mean/max |delta|, the
  thresholds and the verdict."""
  frame = table.frame
  modes = list(dict.fromkeys(frame['mode']))
  has_mem = 'mem_gib' in frame.columns
  cols = {}
  for mode in modes:
    part = frame[frame['mode'] == mode].set_index('model')
    cols[(mode, 'paper')] = part['profile'].map(lambda v: f'{v:.2f}')
    cols[(mode, 'calculon')] = part['calculon'].map(
      lambda v: 'infeasible' if math.isnan(v) else f'{v:.2f}')
    cols[(mode, 'delta')] = part['delta_pct'].map(
      lambda v: '' if math.isnan(v) else f'{v:+.2f}%')
    if has_mem:
      cols[(mode, 'GiB')] = part['mem_gib'].map(
        lambda v: '' if math.isnan(v) else f'{v:.2f}')
  wide = pd.DataFrame(cols).reindex(list(dict.fromkeys(frame['model'])))
  wide.index.name = None
  verdict = 'PASS' if table.passed else 'FAIL: ' + '; '.join(table.failures)
  return '\n'.join([
    f'{table.title}' + (f' -- priced on systems/{table.system_file}'
                        if table.system_file else ''),
    wide.to_string(),
    f'mean |delta| {table.mean_abs_delta_pct:.2f}% (threshold '
    f'{table.threshold_mean_pct:.2f}%), max |delta| '
    f'{table.max_abs_delta_pct:.2f}% (threshold '
    f'{table.threshold_max_pct:.2f}%): {verdict}'])


def tables_frame(tables):
  """Every row of every table as one long DataFrame (column ``table``)."""
  parts = []
  for t in tables:
    f = t.frame.copy()
    f.insert(0, 'table', t.key)
    f['system_file'] = t.system_file
    parts.append(f)
  return pd.concat(parts, ignore_index=True)
