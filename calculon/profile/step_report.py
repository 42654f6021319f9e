"""Measured training step against calculon's prediction: tables and report.

Errors follow docs/accuracy.md: ``100 * (1 - predicted / measured)`` %
(positive: the model predicts less time than measured).  The prediction
goes through the public API only (``Llm.get_stats_json``).

Report sections, in the spirit of the Anemoi training profiler (its speed,
time, memory and system reports and model summary): speed (samples/s,
tokens/s), time per phase and per layer, memory, system, model summary.
"""

import os
import platform

from calculon.profile.layer_names import GEMM_LAYERS, LAYERS
from calculon.profile.outputs import save_figure_atomic, write_atomic


def error_pct(predicted, measured):
  """100 (1 - predicted / measured); None when either is missing or the
  measurement is 0."""
  if predicted is None or measured is None or measured == 0:
    return None
  return 100.0 * (1.0 - predicted / measured)


#: The layers calculon recomputes with attn_only (calculon/llm/block.py:
#: ``recompute=attn_re``; Korthikanti et al. 2022, section 5, selective
#: recomputation); with full, every layer.
ATTN_ONLY_RECOMPUTED = ('AttnBlock_Multihead_Key_Query',
                        'AttnBlock_Multihead_SoftMax',
                        'AttnBlock_Multihead_DropOut')


def recomputed_layers(recompute):
  """Names of the layers recomputed under ``recompute``."""
  if recompute == 'full':
    return LAYERS
  if recompute == 'attn_only':
    return ATTN_ONLY_RECOMPUTED
  return ()


def _mean(xs):
  return sum(xs) / len(xs) if xs else None


def measured_layers(measured):
  """Per layer and phase: seconds per block per microbatch in the fastest
  step, averaged over ranks.  Returns {layer: {'fw': s, 'bw': s,
  'recompute': s}}."""
  plan = measured['plan']
  per = plan['num_microbatches'] * plan['num_blocks']
  out = {}
  for rank in measured['ranks']:
    for row in rank['layers']:
      out.setdefault(row['name'], {}).setdefault(row['phase'], []).append(
        min(row['seconds']) / per)
  return {name: {ph: _mean(v) for ph, v in phases.items()}
          for name, phases in out.items()}


def compare(model, measured, plan, system_source):
  """The comparison as one dict (see :func:`report_lines`).

  Args:
    model: a run :class:`calculon.llm.Llm` of the same application and
      execution.
    measured: :func:`calculon.profile.step.run_step`'s result.
    plan: the :class:`~calculon.profile.step.StepPlan`.
    system_source: where the system came from (text).
  """
  stats = model.get_stats_json(include_layers=True)
  pred_layers = {l['name']: l for l in stats['layers']}
  meas_layers = measured_layers(measured)
  ranks = measured['ranks']
  nsteps = len(ranks[0]['step_s'])
  # The slowest rank sets each step's time; the fastest step is kept.
  steps = [max(r['step_s'][i] for r in ranks) for i in range(nsteps)]
  step_s = min(steps)
  recomputed = recomputed_layers(plan.recompute) if plan.training else ()
  rows = []
  for name in LAYERS:
    pred = pred_layers.get(name)
    meas = meas_layers.get(name, {})
    if pred is None:
      continue
    p_fw = pred['fw_processing_time']
    p_bw = (pred['agrad_processing_time'] + pred['wgrad_processing_time']) \
      if plan.training else 0.0
    m_fw, m_bw = meas.get('fw'), meas.get('bw', 0.0 if not plan.training
                                          else None)
    p_tot = p_fw + p_bw
    m_tot = None if m_fw is None or m_bw is None else m_fw + m_bw
    rows.append({'layer': name, 'gemm': name in GEMM_LAYERS,
                 'fw_flops': pred['fw_flops'],
                 'pred_fw_s': p_fw, 'meas_fw_s': m_fw,
                 'err_fw_pct': error_pct(p_fw, m_fw),
                 'pred_bw_s': p_bw, 'meas_bw_s': m_bw,
                 'err_bw_pct': error_pct(p_bw, m_bw),
                 'meas_recompute_s': meas.get('recompute'),
                 'pred_recompute_s': p_fw if name in recomputed else None,
                 'pred_total_s': p_tot, 'meas_total_s': m_tot,
                 'err_total_pct': error_pct(p_tot, m_tot)})
  best = steps.index(step_s)
  phases = {k: _mean([r['phases_s'][k][best] for r in ranks])
            for k in ranks[0]['phases_s']}
  nmb = plan.num_microbatches
  block_meas = sum(r['meas_total_s'] or 0 for r in rows)
  phase_rows = [
    ('forward', stats['fw_time'], phases['fw']),
    ('backward + recompute', stats['bw_time'] + stats['recompute_time'],
     phases['bw']),
    ('DP communication (exposed)', stats['dp_comm_exposed_time'],
     phases['dp_comm']),
    ('optimizer', stats['optim_step_time'], phases['optim']),
    ('step (batch)', stats['total_time'], step_s)]
  unattributed = None
  if phases['fw'] is not None:
    unattributed = phases['fw'] + phases['bw'] - \
      block_meas * nmb * plan.num_blocks
  gemm_errs = [abs(r['err_total_pct']) for r in rows
               if r['gemm'] and r['err_total_pct'] is not None]
  mem = ranks[0]['memory']
  if 'cuda_max_allocated_bytes' in mem:
    meas_mem, mem_kind = mem['cuda_max_allocated_bytes'], \
      'torch.cuda.max_memory_allocated'
  else:
    meas_mem = mem['rss_peak_bytes'] - mem['rss_base_bytes']
    mem_kind = 'peak RSS - RSS before the model was built'
  return {
    'plan': measured['plan'], 'system_source': system_source,
    'stats': {k: stats[k] for k in (
      'total_time', 'fw_time', 'bw_time', 'recompute_time',
      'optim_step_time', 'dp_comm_exposed_time', 'sample_rate',
      'proc_mem_tier1_cap_req', 'weight_space', 'act_space',
      'weight_grad_space', 'optimizer_space', 'act_grad_space')},
    'layers': rows, 'phases': phase_rows, 'step_s': step_s,
    'step_err_pct': error_pct(stats['total_time'], step_s),
    'max_gemm_err_pct': max(gemm_errs) if gemm_errs else None,
    'unattributed_s': unattributed,
    'memory': {'measured_bytes': meas_mem, 'how': mem_kind,
               'predicted_bytes': stats['proc_mem_tier1_cap_req'],
               'err_pct': error_pct(stats['proc_mem_tier1_cap_req'],
                                    meas_mem)},
    'layer_memory': ranks[0]['layer_memory'], 'params': ranks[0]['params'],
    'pred_params': {l['name']: l['weight'] / _bpe(plan.datatype)
                    for l in stats['layers']},
    'profiler_time_table': ranks[0]['profiler_time_table'],
    'profiler_memory_table': ranks[0]['profiler_memory_table'],
    'system_info': _system_info(plan.device, ranks[0]),
    'rank_step_s': [r['step_s'] for r in ranks],
    'step_mean_s': _mean(steps),
  }


def _bpe(datatype):
  from calculon.config.execution import DATATYPE_BYTES
  return DATATYPE_BYTES[datatype]


def _system_info(device, rank0):
  from calculon.profile.machine import system_info
  info = system_info(device)
  info['threads_per_rank'] = rank0['threads']
  return info


def _f(x, scale=1e3, fmt='.3f'):
  return '-' if x is None else f'{x * scale:{fmt}}'


def _pct(x):
  return '-' if x is None else f'{x:+.1f}%'


def report_lines(c):
  """The report as text lines."""
  p = c['plan']
  batch = p['batch_size']
  lines = ['== speed ==',
           f"step (one batch of {batch} samples): measured "
           f"{c['step_s']:.4f} s, predicted {c['stats']['total_time']:.4f} s, "
           f"error {_pct(c['step_err_pct'])} (system: {c['system_source']})",
           f"samples/s: measured {batch / c['step_s']:.3f}, predicted "
           f"{c['stats']['sample_rate']:.3f}; tokens/s: measured "
           f"{batch * p['seq_size'] / c['step_s']:.1f}, predicted "
           f"{c['stats']['sample_rate'] * p['seq_size']:.1f}",
           f"fastest of {len(c['rank_step_s'][0])} steps (mean "
           f"{c['step_mean_s']:.4f} s); per-rank step times (s): " +
           '; '.join(', '.join(f'{t:.4f}' for t in r)
                     for r in c['rank_step_s']),
           '', '== time per phase (s per batch) ==',
           f"{'phase':<28} {'measured':>10} {'predicted':>10} {'error':>8}"]
  for name, pred, meas in c['phases']:
    lines.append(f'{name:<28} {_f(meas, 1, ".4f"):>10} '
                 f'{_f(pred, 1, ".4f"):>10} {_pct(error_pct(pred, meas)):>8}')
  lines += ['', '== time per layer (ms per block per microbatch; error = '
            '1 - predicted/measured) ==',
            f"{'layer':<30} {'fw meas':>8} {'fw pred':>8} {'fw err':>8} "
            f"{'bw meas':>8} {'bw pred':>8} {'bw err':>8} {'tot err':>8}"]
  recompute = p['recompute'] != 'none' and p['training']
  if recompute:
    lines[-1] += f" {'re meas':>8} {'re pred':>8}"
  for r in c['layers']:
    mark = '*' if r['gemm'] else ' '
    line = (
      f"{r['layer']:<29}{mark} {_f(r['meas_fw_s']):>8} {_f(r['pred_fw_s']):>8}"
      f" {_pct(r['err_fw_pct']):>8} {_f(r['meas_bw_s']):>8} "
      f"{_f(r['pred_bw_s']):>8} {_pct(r['err_bw_pct']):>8} "
      f"{_pct(r['err_total_pct']):>8}")
    if recompute:
      line += f" {_f(r['meas_recompute_s']):>8} {_f(r['pred_recompute_s']):>8}"
    lines.append(line)
  lines.append('* GEMM layer (matrix engine); largest |error| of a GEMM '
               f"layer: {_pct(c['max_gemm_err_pct'])}")
  if c['unattributed_s'] is not None:
    lines.append(f"forward + backward time outside the layers' modules "
                 f"(calculon's Fork layers: gradient accumulation; loss; "
                 f"framework): {c['unattributed_s']:.4f} s per batch")
  m = c['memory']
  lines += ['', '== memory ==',
            f"measured {m['measured_bytes'] / 2 ** 20:.1f} MiB ({m['how']}); "
            f"predicted tier-1 need {m['predicted_bytes'] / 2 ** 20:.1f} MiB "
            f"(weights {c['stats']['weight_space'] / 2 ** 20:.1f}, "
            f"activations {c['stats']['act_space'] / 2 ** 20:.1f}, weight "
            f"gradients {c['stats']['weight_grad_space'] / 2 ** 20:.1f}, "
            f"optimizer {c['stats']['optimizer_space'] / 2 ** 20:.1f}); "
            f"error {_pct(m['err_pct'])}"]
  s = c['system_info']
  lines += ['', '== system ==',
            f"{s.get('processor')}; {s.get('logical_cpus')} logical CPUs, "
            f"{s.get('memory_GiB')} GiB; threads per rank "
            f"{s.get('threads_per_rank')}; load average "
            f"{s.get('load_average')}; devices {s.get('devices', 'none')}",
            f"python {s.get('python')}, torch {s.get('torch')}, numpy "
            f"{s.get('numpy')}, calculon {s.get('calculon')}, "
            f"{platform.platform()}"]
  lines += ['', '== model summary (parameters per block) ==']
  for name, n in c['params'].items():
    if n:
      lines.append(f"{name:<30} torch {n:>10} calculon "
                   f"{c['pred_params'].get(name, 0):>10.0f}")
  return lines


def write_step_report(c, folder):
  """step.md, step.json (the whole comparison), layers.csv, phases.csv,
  layer_memory.csv, layers.png."""
  import json
  import pandas as pd
  lines = report_lines(c)
  write_atomic(os.path.join(folder, 'step.json'),
               json.dumps(c, indent=2, default=str))
  md = ['# calculon profile-step', '', '```'] + lines + ['```', '',
        '![predicted vs measured per layer](layers.png)', '',
        '## torch.profiler: operators by self time', '', '```',
        c['profiler_time_table'], '```', '',
        '## torch.profiler: operators by memory', '', '```',
        c['profiler_memory_table'], '```', '']
  write_atomic(os.path.join(folder, 'step.md'), '\n'.join(md))
  write_atomic(os.path.join(folder, 'layers.csv'),
               pd.DataFrame(c['layers']).to_csv(index=False))
  write_atomic(os.path.join(folder, 'phases.csv'), pd.DataFrame(
    c['phases'], columns=['phase', 'predicted_s', 'measured_s']).to_csv(
      index=False))
  mem_rows = [{'range': k, **v} for k, v in c['layer_memory'].items()]
  write_atomic(os.path.join(folder, 'layer_memory.csv'),
               pd.DataFrame(mem_rows).to_csv(index=False))
  _plot_layers(c, os.path.join(folder, 'layers.png'))


def _plot_layers(c, path):
  import matplotlib
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  import numpy as np
  rows = [r for r in c['layers'] if r['meas_total_s'] is not None]
  names = [r['layer'] for r in rows]
  y = np.arange(len(rows))
  fig, ax = plt.subplots(figsize=(10, 0.42 * len(rows) + 1.5))
  h = 0.2
  series = (('meas_fw_s', 'forward measured', '#1f77b4', None),
            ('pred_fw_s', 'forward predicted', '#1f77b4', '//'),
            ('meas_bw_s', 'backward measured', '#ff7f0e', None),
            ('pred_bw_s', 'backward predicted', '#ff7f0e', '//'))
  for i, (key, label, color, hatch) in enumerate(series):
    vals = [(r[key] or 0) * 1e3 for r in rows]
    ax.barh(y + (i - 1.5) * h, vals, h, label=label, color=color,
            alpha=0.9 if hatch is None else 0.45, hatch=hatch)
  ax.set_yticks(y)
  ax.set_yticklabels(names, fontsize=8)
  ax.invert_yaxis()
  ax.set_xlabel('ms per block per microbatch')
  ax.set_title(f"predicted vs measured per layer (step error "
               f"{_pct(c['step_err_pct'])})")
  ax.legend(fontsize=8)
  fig.tight_layout()
  save_figure_atomic(fig, path, dpi=110)
  plt.close(fig)
