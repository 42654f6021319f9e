"""A plan as a terminal table, JSON, CSV and a figure.

JSON: {"objective", "objective_unit", "application", "system", "inputs"
(every input with its source), "terms" (name -> [unit, description]),
"plans": [{"gpus", "status", "best", "objective_value", "execution",
"run": {term: value}, ...}]}.  CSV: one row per GPU count, the execution's
fields prefixed ``exe_``, then every term.
"""

import json
import math

from calculon import outputs
from calculon.plan import objective as O
from calculon.plan.run import TERMS

#: Output file kinds of ``-o``.
PLAN_KINDS = outputs.JSON_KINDS + outputs.CSV_KINDS


def _layout(exe):
  if exe is None:
    return '-'
  text = f"{exe['tensor_par']}/{exe['pipeline_par']}/{exe['data_par']}"
  cp = exe.get('context_par', 1)
  if cp > 1:
    text += f'/cp{cp}'
  ep = exe.get('expert_par', 1)
  if ep > 1:
    text += f'/ep{ep}'
  return text


_RECOMPUTE = {'none': 'none', 'full': 'full', 'selective': 'sel',
              'attn_only': 'attn'}
_SHARD = {'none': 'dp', 'optimizer': 'zero1', 'gradients': 'zero2',
          'parameters': 'fsdp'}


def _options(exe):
  if exe is None:
    return ''
  shard = exe.get('data_par_sharding') or (
    'optimizer' if exe.get('optimizer_sharding') else 'none')
  parts = [f"mbs{exe['microbatch_size']}",
           f"vp{exe['pipeline_interleaving']}",
           _RECOMPUTE.get(exe['activation_recompute'], '?'),
           _SHARD.get(shard, shard)]
  for degree, short in (('context_par', 'cp'), ('expert_par', 'ep')):
    if (exe.get(degree) or 1) > 1:
      parts.append(f'{short}{exe[degree]}')
  if exe.get('pipeline_schedule'):
    parts.append(exe['pipeline_schedule'])
  offloads = [short for field, short in (
    ('weight_offload', 'weights'), ('activations_offload', 'activations'),
    ('optimizer_offload', 'optimizer')) if exe.get(field)]
  if offloads:
    parts.append('offload:' + '+'.join(offloads))
  return ' '.join(parts)


def _num(value, fmt):
  if value is None or (isinstance(value, float) and not math.isfinite(value)):
    return '-'
  return format(value, fmt)


def _binds(binds):
  """What binds a row, short: compute, memory or the largest overhead
  (:func:`calculon.report.binding`)."""
  if not binds:
    return '-'
  return binds['term'].replace(' (exposed)', '').replace(
    'communication', 'comm')


def format_table(plan):
  """The plan as text: one line per GPU count, the best (objective) marked
  with '*'."""
  best = plan.best
  priced = plan.inputs.priced
  head = ['GPUs', 'TP/PP/DP', 'options', 'step s', 'MFU', 'binds',
          'goodput', 'days', 'GPU-h (M)', 'tok/day (B)', 'MW', 'MWh']
  if priced:
    head.append('cost $M')
  rows = []
  for r in plan.rows:
    run = r.run or {}
    line = [f"{r.gpus}{'*' if r is best else ''}", _layout(r.execution),
            _options(r.execution)]
    if r.status != 'ok':
      line += ['infeasible'] + [''] * (len(head) - 4)
      rows.append(line)
      continue
    line += [_num(run['step_s'], '.3f'), _num(run['mfu'] and
                                              100 * run['mfu'], '.1f') + '%',
             _binds(r.binds),
             _num(100 * run['goodput'], '.1f') + '%',
             _num(run['wall_days'], '.1f'),
             _num(run['gpu_hours'] and run['gpu_hours'] / 1e6, '.3f'),
             _num(run['tokens_per_day'] and run['tokens_per_day'] / 1e9,
                  '.1f'),
             _num(run['average_power_mw'], '.2f'),
             _num(run['energy_mwh'], ',.0f')]
    if priced:
      line.append(_num(run['cost_usd'] and run['cost_usd'] / 1e6, '.2f'))
    rows.append(line)
  widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
  lines = ['  '.join(str(x).rjust(w) for x, w in zip(head, widths))]
  lines += ['  '.join(str(x).rjust(w) for x, w in zip(row, widths))
            for row in rows]
  unit = O.UNITS[plan.objective]
  if best is not None:
    lines.append(f'* best for the objective {plan.objective} '
                 f'({_num(best.objective_value, ".6g")} {unit})')
  return '\n'.join(lines)


def format_inputs(plan):
  """Short lines on the inputs: the checkpoint policy, the interruption
  rate, the storage, the power, and which come from the defaults."""
  inp = plan.inputs
  rel, pw, sto, pol = inp.reliability, inp.power, inp.storage, inp.policy
  lines = [
    f'Tokens: {inp.tokens:.4g}; framework: {inp.framework or "default"} '
    f'(checkpoints {pol.mode}, parallel save {str(pol.parallel_save).lower()}'
    f', parallel load {str(pol.parallel_load).lower()})',
    f'Interruptions: {rel.unplanned_per_gpu_hour:.3g} unplanned + '
    f'{rel.planned_per_gpu_hour:.3g} planned per GPU-hour (x N^'
    f'{rel.job_size_exponent:g}); restart {rel.restart_s:g} s',
    f'Storage: write {sto.write_GBps:g} GB/s, read {sto.read_GBps:g} GB/s, '
    f'{sto.node_GBps:g} GB/s per node',
    f'Power: GPU {pw.gpu_idle_w:g}-{pw.gpu_busy_w:g} W, node overhead '
    f'{pw.node_overhead_w:g} W per {pw.gpus_per_node} GPUs, fabric '
    f'{pw.network_w_per_gpu:g} W/GPU, PUE {pw.pue:g}']
  if inp.defaults:
    lines.append('Documented defaults used (the system file has no such '
                 f"section): {', '.join(inp.defaults)} (docs/plan.md)")
  if plan.objective == 'cost' and not inp.priced:
    lines.append('No --price: the cost objective ranks by GPU-hours')
  return '\n'.join(lines)


def _clean(value):
  if isinstance(value, float) and not math.isfinite(value):
    return None
  return value


def to_json(plan, application, system):
  """The plan as a JSON-ready dict (see the module docstring)."""
  best = plan.best
  plans = []
  for r in plan.rows:
    plans.append({
      'gpus': r.gpus, 'status': r.status, 'best': r is best,
      'objective_value': _clean(r.objective_value),
      'searched_by_rate': r.searched, 'proven': r.proven,
      'elapsed_s': r.elapsed_s, 'reason': r.reason,
      'execution': r.execution, 'run': r.run, 'binds': r.binds})
  return {'objective': plan.objective,
          'objective_unit': O.UNITS[plan.objective],
          'application': application, 'system': system,
          'inputs': plan.inputs.describe(),
          'terms': {k: list(v) for k, v in TERMS.items()},
          'plans': plans}


def to_csv(plan):
  """The plan as CSV text: one row per GPU count."""
  import csv
  import io
  best = plan.best
  exe_keys = []
  for r in plan.rows:
    for k in (r.execution or {}):
      if k not in exe_keys:
        exe_keys.append(k)
  head = ['gpus', 'status', 'best', 'objective', 'objective_value'] + \
    [f'exe_{k}' for k in exe_keys] + list(TERMS) + ['reason']
  buffer = io.StringIO()
  writer = csv.writer(buffer, lineterminator='\n')
  writer.writerow(head)
  for r in plan.rows:
    run = r.run or {}
    exe = r.execution or {}
    writer.writerow(
      [r.gpus, r.status, r is best, plan.objective,
       '' if r.objective_value is None else repr(r.objective_value)] +
      [json.dumps(exe[k]) if isinstance(exe.get(k), list) else exe.get(k, '')
       for k in exe_keys] +
      ['' if run.get(t) is None else repr(run[t]) for t in TERMS] +
      [r.reason])
  return buffer.getvalue()


def write(plan, path, application, system):
  """Writes the plan to ``path`` (.json[.gz] or .csv[.gz]) atomically.

  Raises:
    calculon.outputs.WriteError: it cannot be written.
  """
  if outputs.extension_of(path, outputs.JSON_KINDS):
    text = json.dumps(to_json(plan, application, system), indent=2) + '\n'
  else:
    text = to_csv(plan)
  outputs.write_text(path, text, rescue=True)


def plot(plan, path, model=None, system=None):
  """Days and cost (GPU-hours without a price) against the GPU count, one
  panel each, both axes from zero, the best count marked and every point
  of the days labelled with its goodput; the title names the model, the
  system and the tokens; written atomically.

  Args:
    plan: :class:`~calculon.plan.plan.Plan`.
    path: the PNG (or other image) to write.
    model, system: names for the title (e.g. the application's ``name``
      and the system file's name); left out when None.

  Raises:
    calculon.outputs.WriteError: it cannot be written.
  """
  from calculon.plots.common import plt, save
  from calculon.units import human_format
  ok = [r for r in plan.rows if r.status == 'ok']
  fig, (left, right) = plt.subplots(1, 2, figsize=(11.0, 4.8))
  xs = [r.gpus for r in ok]
  days = [r.run['wall_days'] for r in ok]
  if plan.inputs.priced:
    ys = [r.run['cost_usd'] / 1e6 for r in ok]
    ylabel = 'cost (million USD)'
  else:
    ys = [r.run['gpu_hours'] / 1e6 for r in ok]
    ylabel = 'GPU-hours (millions)'
  compute_days = [r.run['compute_s'] / 86400.0 for r in ok]
  left.plot(xs, days, 'o-', color='tab:blue', label='wall-clock days',
            zorder=3)
  left.plot(xs, compute_days, 's--', color='tab:gray', alpha=0.7,
            label='computation only (goodput 100 %)', zorder=2)
  right.plot(xs, ys, 'o-', color='tab:red', label=ylabel, zorder=3)
  best = plan.best
  if best is not None:
    left.plot([best.gpus], [best.run['wall_days']], '*', color='gold',
              markersize=16, markeredgecolor='black', zorder=4,
              label=f'best ({plan.objective})')
    right.plot([best.gpus], [ys[ok.index(best)]], '*', color='gold',
               markersize=16, markeredgecolor='black', zorder=4)
  for ax, label, values in ((left, 'days', days + compute_days),
                            (right, ylabel, ys)):
    if len(set(xs)) > 1:
      ax.set_xscale('log', base=2)
    ax.set_xticks(xs)
    ax.set_xticklabels([str(x) for x in xs], rotation=45)
    ax.minorticks_off()
    ax.margins(x=0.1)
    ax.set_xlabel('GPUs')
    ax.set_ylabel(label)
    ax.set_ylim(0, 1.2 * max(values, default=1.0) or 1.0)
    ax.grid(True, alpha=0.3)
  for r, d in zip(ok, days):
    left.annotate(f"goodput {100 * r.run['goodput']:.1f} %", (r.gpus, d),
                  textcoords='offset points', xytext=(0, 10), ha='center',
                  fontsize=8, color='tab:blue')
  left.legend(fontsize=8, loc='upper right')
  right.legend(fontsize=8, loc='lower right')
  left.set_title('Time to train')
  right.set_title('Cost' if plan.inputs.priced else 'GPU-hours')
  title = []
  if model:
    title.append(str(model))
  if system:
    title.append(f'on {system}')
  tokens = f'{human_format(plan.inputs.tokens, precision=1)} tokens'
  if ok:
    tokens += f", batch {ok[0].execution['batch_size']}"
  fig.suptitle((' '.join(title) + ': ' if title else '') + tokens,
               fontsize=11)
  save(fig, path, rescue=True)
  return path
