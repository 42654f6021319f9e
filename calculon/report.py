"""Reports of one run: speed, time, memory, bandwidth, model summary.

Reporters read statistics (Calculon's, the extra ones and the per-layer
ones) and the configurations; they never reach into the model.  Sections
follow what training profilers print (speed, time, memory and system
reports, model summary).

* :func:`text_report` -- the human-readable report of ``calculon llm ... -``.
* :func:`write_run_report` -- the same as files: ``report.md``,
  ``summary.json``, CSV tables and PNG charts.
"""

import os

from calculon.config.execution import OPTIONAL_SPECS
from calculon.units import human_format

#: (label, name in the statistics' ``time_breakdown``) of the batch time's
#: terms, in the order the report shows them; they add up to the batch
#: time (:func:`calculon.llm.stats.time_breakdown`).  A term the engine
#: adds later and this table lacks is shown after them under its name.
TIME_PARTS = (
  ('forward', 'fw_time'),
  ('backward', 'bw_time'),
  ('recompute', 'recompute_time'),
  ('optimizer step', 'optim_step_time'),
  ('host optimizer step', 'host_optimizer_time'),
  ('embedding, LM head and loss', 'embedding_lm_head_time'),
  ('pipeline bubble', 'bubble_time'),
  ('TP communication (exposed)', 'tp_comm_exposed_time'),
  ('TP re-communication (exposed)', 'recomm_exposed_time'),
  ('PP communication (exposed)', 'pp_comm_exposed_time'),
  ('DualPipe mirrored stages (gradients, step)', 'pp_mirror_time'),
  ('DP communication (exposed)', 'dp_comm_exposed_time'),
  ('forward offload (exposed)', 'fw_offload_exposed_time'),
  ('backward offload (exposed)', 'bw_offload_exposed_time'),
  ('CP communication (exposed)', 'cp_comm_exposed_time'),
  ('FSDP communication (exposed)', 'fsdp_comm_exposed_time'),
  ('FSDP buffer copies', 'fsdp_copy_time'),
  ('EP dispatch/combine (exposed)', 'ep_comm_exposed_time'),
  ('fixed overhead', 'overhead_time'),
  ('MoE blocks waiting for the host', 'moe_host_time'),
)
TIME_LABELS = {key: label for label, key in TIME_PARTS}
#: (label, extra-statistic prefix) of the memory kinds.
MEMORY_KINDS = (
  ('weights', 'weights'),
  ('activations', 'activations'),
  ('activation checkpoints', 'checkpoints'),
  ('activation gradients', 'activation_gradients'),
  ('weight gradients', 'weight_gradients'),
  ('optimizer state', 'optimizer'),
)


#: The terms of the batch time that are the model's own computation on
#: the GPU: the blocks' forward and backward, their recomputation, the
#: optimizer step on the device, and the embedding, LM head and loss.
#: Every other term is an overhead (:data:`OVERHEAD_PARTS`): the host
#: optimizer step, the pipeline bubble, exposed communication (TP, PP,
#: DP, CP, FSDP, EP), exposed offload, FSDP's buffer copies, the fixed
#: overheads and the MoE host floor.
COMPUTE_TERMS = ('fw_time', 'bw_time', 'recompute_time', 'optim_step_time',
                 'embedding_lm_head_time')
#: The overheads: what can bind an execution (:func:`binding`).
OVERHEAD_PARTS = tuple(p for p in TIME_PARTS if p[1] not in COMPUTE_TERMS)
#: Share of usable memory tier 1 at or above which memory binds an
#: execution.
MEMORY_BINDS = 0.95
#: Share of the batch time below which the overheads together leave an
#: execution compute-bound.
COMPUTE_BOUND_OVERHEADS = 0.10


def breakdown_of(stats):
  """The batch time term by term from a statistics dict: its
  ``time_breakdown`` (name -> seconds), or, for a flat row of
  statistics without it (a CSV row, :func:`calculon.llm.stats.
  stat_arrays`), the statistics of those names that it has."""
  tb = stats.get('time_breakdown')
  if isinstance(tb, dict):
    return dict(tb)
  return {key: stats[key] or 0.0 for _, key in TIME_PARTS if key in stats}


def memory_figure(stats, mem1_capacity_bytes=None):
  """(needed, usable) bytes of memory tier 1 per processor: what the
  busiest pipeline stage's processor needs (``proc_mem_tier1_cap_req``,
  with the allocator's fragmentation where the system file has
  ``memory_reserve``) and what a run may fill (``proc_mem_tier1_usable``:
  the capacity less the headroom and the memory held outside the
  allocator; the capacity where the statistics lack it)."""
  usable = stats.get('proc_mem_tier1_usable')
  if usable is None:
    usable = mem1_capacity_bytes
  return stats['proc_mem_tier1_cap_req'], usable


def binding(stats, mem1_capacity_bytes=None):
  """What binds an execution: ``memory`` when it needs at least
  :data:`MEMORY_BINDS` of the usable memory tier 1 (a faster option
  would not fit), else ``compute`` when its overheads (every term of the
  batch time but :data:`COMPUTE_TERMS`) take less than
  :data:`COMPUTE_BOUND_OVERHEADS` of the batch time, else the largest
  overhead (the bubble, an exposed communication, the host optimizer
  step, offload...).

  Args:
    stats: the statistics of ``calculon llm`` (a dict of seconds and
      bytes, with ``time_breakdown``).
    mem1_capacity_bytes: tier-1 capacity, used only where the statistics
      lack ``proc_mem_tier1_usable`` (Calculon's runs).

  Returns:
    {'term': 'memory', 'compute' or an overhead's label, 'memory_used':
    share of usable tier 1, 'memory_needed_bytes', 'memory_usable_bytes',
    'largest_overhead': label, 'overhead_s': its seconds,
    'overhead_share': its share of the batch time, 'overheads_share': the
    share of all overheads}.
  """
  total = stats['total_time']
  tb = breakdown_of(stats)
  over = {k: v or 0.0 for k, v in tb.items() if k not in COMPUTE_TERMS}
  key = max(over, key=lambda k: over[k]) if over else None
  seconds = over.get(key, 0.0)
  label = TIME_LABELS.get(key, key)
  needed, usable = memory_figure(stats, mem1_capacity_bytes)
  used = needed / usable if usable else 0.0
  share = sum(over.values()) / total if total else 0.0
  if used >= MEMORY_BINDS:
    term = 'memory'
  elif share < COMPUTE_BOUND_OVERHEADS:
    term = 'compute'
  else:
    term = label
  return {'term': term, 'memory_used': used, 'memory_needed_bytes': needed,
          'memory_usable_bytes': usable, 'largest_overhead': label,
          'overhead_s': seconds,
          'overhead_share': seconds / total if total else 0.0,
          'overheads_share': share}


def binding_text(b):
  """One line on what binds an execution (:func:`binding`'s dict)."""
  gib = 2 ** 30
  mem = (f"memory {b['memory_needed_bytes'] / gib:.1f} of "
         f"{b['memory_usable_bytes'] / gib:.1f} GiB usable") \
    if b.get('memory_usable_bytes') else \
    f"memory {100 * b['memory_used']:.0f} %"
  over = (f"overheads {100 * b['overheads_share']:.1f} % of the step, "
          f"largest {b['largest_overhead']} "
          f"{100 * b['overhead_share']:.1f} %")
  if b['term'] == 'compute':
    return f'compute-bound ({over}; {mem})'
  if b['term'] == 'memory':
    return f'memory-bound ({mem}; {over})'
  return f"bound by {b['term']} ({over}; {mem})"


class RunData:
  """Everything a report shows about one run (plain data).

  Args:
    app: Application config; exe: Execution config; system: System;
    stats: Calculon statistics dict (with 'layers' for the model summary);
    extra: extra statistics dict (see calculon.llm.stats.EXTRA_STATS).
    framework_settings: {field: value} the framework preset set (see
      :func:`calculon.frameworks.resolve.settings_of`).
  """

  def __init__(self, app, exe, system, stats, extra, framework_settings=None):
    self.app, self.exe, self.system = app, exe, system
    self.stats, self.extra = stats, extra
    self.framework_settings = framework_settings or {}

  @classmethod
  def from_model(cls, model):
    """From a run :class:`calculon.llm.Llm` (compiled and run)."""
    return cls(model.app.config, model.exe.config, model.sys,
               model.get_stats_json('summary'), model.get_extra_stats_json(),
               model.framework_settings)

  # -- tables (lists of rows) ------------------------------------------------
  def speed(self):
    s, x, exe = self.stats, self.extra, self.exe
    peak = self.system.config.matrix.peak_flops[exe.datatype] / 1e12
    return [
      ('batch time', s['total_time'], 's'),
      ('sample rate', s['sample_rate'], 'samples/s'),
      ('tokens per second', x['tokens_per_sec'], 'tokens/s'),
      ('model TFLOP/s per processor', x['model_tflops_per_proc'],
       f'TFLOP/s (peak {peak:g})'),
      ('MFU (model FLOP utilization)', 100 * x['mfu'],
       '% (whole attention matrix: PaLM, torchtitan)'),
      ('MFU, causal convention', 100 * x['mfu_causal'],
       '% (half the attention matrix: Megatron-LM 2025, NeMo)'),
      ('HFU (hardware FLOP utilization)', 100 * x['hfu'], '%'),
      ('compute efficiency (Calculon)', 100 * s['compute_efficiency'], '%'),
      ('system efficiency (Calculon)', 100 * s['system_efficiency'], '%'),
      ('total efficiency (Calculon)', 100 * s['total_efficiency'], '%'),
    ]

  def time_breakdown(self):
    """[(part, seconds, share of the batch time)]: the statistics'
    ``time_breakdown`` in :data:`TIME_PARTS`' order (then any term it
    lacks, under its name); the seconds add up to the batch time."""
    return [(label, seconds, share)
            for label, _, seconds, share in self.time_terms()]

  def time_terms(self):
    """[(part, name in ``time_breakdown``, seconds, share)] (see
    :meth:`time_breakdown`)."""
    total = self.stats['total_time']
    tb = breakdown_of(self.stats)
    keys = [key for _, key in TIME_PARTS] + \
      [key for key in tb if key not in TIME_LABELS]
    return [(TIME_LABELS.get(key, key), key, tb.get(key) or 0.0,
             (tb.get(key) or 0.0) / total if total else 0)
            for key in keys]

  def memory(self):
    """[(kind, tier-1 bytes, tier-2 bytes)] of the busiest stage's
    processor; with the system's ``memory_reserve``, the allocator's
    fragmentation as its own row, so tier 1 adds up to
    :meth:`memory_figure`'s needed bytes."""
    rows = [(label, self.extra[f'{key}_tier1_bytes'] or 0,
             self.extra[f'{key}_tier2_bytes'] or 0)
            for label, key in MEMORY_KINDS]
    frag = self.stats['proc_mem_tier1_cap_req'] - sum(r[1] for r in rows)
    if frag > 1e-9 * self.stats['proc_mem_tier1_cap_req']:
      rows.append(('allocator fragmentation', frag, 0))
    return rows

  def memory_figure(self):
    """(needed, usable) bytes of tier 1 per processor
    (:func:`memory_figure`)."""
    return memory_figure(self.stats, self.system.mem1.capacity_bytes)

  def binding(self):
    """What binds the run (:func:`binding`)."""
    return binding(self.stats, self.system.mem1.capacity_bytes)

  def capacities(self):
    return (self.system.mem1.capacity_bytes, self.system.mem2.capacity_bytes)

  def bandwidth(self):
    """[(requirement, needed bytes/s, available bytes/s or None)]."""
    s, exe, nets = self.stats, self.exe, self.system.networks.tiers

    def link(tier):
      n = nets[tier]
      return n.bandwidth_bytes_per_s * n.efficiency
    mem2 = self.system.mem2.bandwidth_bytes_per_s
    return [
      (f'TP overlap (tier {exe.tensor_par_net})', s['tp_bw_overlap_req'],
       link(exe.tensor_par_net)),
      (f'DP overlap, chunks (tier {exe.data_par_net})',
       s['dp_bw_overlap_req_chunk'], link(exe.data_par_net)),
      (f'DP overlap, last chunk (tier {exe.data_par_net})',
       s['dp_bw_overlap_req_tail'], link(exe.data_par_net)),
      ('activation offload (tier 2)', s['act_offload_bw_req'], mem2),
      ('weight offload (tier 2)', s['weight_offload_bw_req'], mem2),
      ('optimizer offload (tier 2)', s['optim_offload_bw_req'], mem2),
      ('offload as configured (tier 2)', s['offload_mem_bw_req'], mem2),
    ]

  def layers(self):
    """Per-layer rows of the model summary (one block, one microbatch)."""
    rows = []
    for layer in self.stats.get('layers', []):
      rows.append({
        'layer': layer['name'],
        'parameters': layer['parameters'],
        'fw_flops': layer['fw_flops'],
        'bw_flops': layer['agrad_flops'] + layer['wgrad_flops'],
        'fw_bytes': layer['fw_mem_accessed'],
        'fw_time_s': layer['fw_processing_time'],
        'agrad_time_s': layer['agrad_processing_time'],
        'wgrad_time_s': layer['wgrad_processing_time'],
        'tp_comm_time_s': layer['baseblock_fw_tp_comm_time'] +
        layer['baseblock_bw_tp_comm_time'],
        'activation_bytes': layer['activation'],
      })
    return rows


def _b(value):
  if value is None:
    return 'n/a'
  if value == 0:
    return '0 B'
  return human_format(value, 'bytes')


def _bw(value):
  if value is None:
    return 'n/a'
  return human_format(value, 'bandwidth')


def _bar(share, width=30):
  n = int(round(min(max(share, 0.0), 1.0) * width))
  return '#' * n + '.' * (width - n)


def header_lines(data):
  app, exe = data.app, data.exe
  model = (f'Model: {app.num_blocks} blocks, hidden {app.hidden}, '
           f'feedforward {app.feedforward}, {app.attn_heads} heads x '
           f'{app.attn_size}, sequence {app.seq_size} '
           f'({human_format(app.num_parameters())} parameters')
  if app.is_moe:
    model += f', {human_format(app.num_active_parameters())} active'
  model += ')'
  modern = [f'{k} {v}' for k, v in app.to_dict().items()
            if k not in app.FIELDS]
  run = (f'Run: {exe.num_procs} processors, TP={exe.tensor_par} '
         f'PP={exe.pipeline_par} DP={exe.data_par}')
  if exe.context_par != 1:
    run += f' CP={exe.context_par}'
  run += (f', batch {exe.batch_size}, microbatch {exe.microbatch_size}, '
          f"{exe.datatype}, {'training' if exe.training else 'inference'}, "
          f'recompute {exe.activation_recompute}, interleaving '
          f'{exe.pipeline_interleaving}')
  options = [f'{k} {_show(v)}' for k, v in exe.written_dict().items()
             if k in OPTIONAL_SPECS and v != OPTIONAL_SPECS[k][2]]
  lines = [model]
  if modern:
    lines.append('  ' + ', '.join(modern))
  lines.append(run)
  if options:
    lines.append('  ' + ', '.join(options))
  sets = [f'{k} {_show(v)}' for k, v in data.framework_settings.items()]
  if exe.framework is not None and (sets or exe.framework != 'calculon'):
    lines.append(f'Framework: {exe.framework}' + (
      ' (sets ' + ', '.join(sets) + ')' if sets else ''))
  return lines


def memory_line(data):
  """The one memory figure of a run: "needed X GiB of Y GiB usable"
  (tier 1, per processor of the busiest pipeline stage)."""
  needed, usable = data.memory_figure()
  gib = 2 ** 30
  return (f'Memory: needed {needed / gib:.1f} GiB of {usable / gib:.1f} GiB '
          'usable per processor (tier 1, busiest pipeline stage)')


def _show(value):
  """A field's value as a report shows it."""
  if isinstance(value, list):
    return ','.join(value)
  if isinstance(value, bool):
    return 'true' if value else 'false'
  return str(value)


def text_report(data, layers=True):
  """The readable report (a string) of :class:`RunData` ``data``."""
  lines = ['=' * 78] + header_lines(data) + ['', 'Speed']
  if getattr(data.system, 'measured', None) is not None:
    lines.insert(-1, 'Measured kernels: ' + data.system.measured.describe())
  for label, value, unit in data.speed():
    lines.append(f'  {label:<34} {value:>12.3f} {unit}')
  lines += ['', 'Time per batch (adds up to the batch time)']
  for label, seconds, share in data.time_breakdown():
    lines.append(f'  {label:<32} {seconds:>10.4f} s {100 * share:6.2f} % '
                 f'{_bar(share)}')
  lines.append(f"  {'total':<32} {data.stats['total_time']:>10.4f} s")
  lines.append('  ' + binding_text(data.binding()))
  cap1, cap2 = data.capacities()
  lines += ['', memory_line(data),
            'Memory per processor           tier 1        tier 2']
  for label, t1, t2 in data.memory():
    lines.append(f'  {label:<26} {_b(t1):>12}  {_b(t2):>12}')
  needed, usable = data.memory_figure()
  lines.append(f"  {'needed':<26} {_b(needed):>12}"
               f"  {_b(data.stats['proc_mem_tier2_cap_req']):>12}")
  lines.append(f"  {'usable':<26} {_b(usable):>12}  {_b(cap2):>12}")
  ub = data.stats.get('tp_overlap_buffer_space') or 0
  if ub:
    lines.append(f"  {'(TP overlap buffers)':<26} {_b(ub):>12}  {'':>12}"
                 '  outside the allocator, not usable')
  lines.append(f"  {'capacity':<26} {_b(cap1):>12}  {_b(cap2):>12}")
  lines += ['', 'Bandwidth needed (to hide the transfer) vs available']
  for label, need, have in data.bandwidth():
    lines.append(f'  {label:<34} {_bw(need):>14}  of {_bw(have)}')
  link = (f"TP {data.stats['tp_comm_link_time']:.4f}, "
          f"PP {data.stats['pp_comm_link_time']:.4f}, "
          f"DP {data.stats['dp_comm_link_time']:.4f}, "
          f"TP redo {data.stats['recomm_link_time']:.4f}")
  for label, key in (('CP', 'cp_comm_link_time'),
                     ('FSDP', 'fsdp_comm_link_time'),
                     ('EP', 'ep_comm_link_time')):
    if data.stats.get(key):
      link += f', {label} {data.stats[key]:.4f}'
  lines += ['', 'Communication on the link (s): ' + link]
  if layers and data.stats.get('layers'):
    lines += ['', 'Model summary (one block, one microbatch, one processor)',
              f"  {'layer':<30} {'params':>9} {'fw FLOP':>10} {'bw FLOP':>10} "
              f"{'fw ms':>8} {'bw ms':>8} {'act':>11}"]
    for row in data.layers():
      lines.append(
        f"  {row['layer']:<30} {human_format(row['parameters'], precision=1):>9} "
        f"{human_format(row['fw_flops'], precision=1):>10} "
        f"{human_format(row['bw_flops'], precision=1):>10} "
        f"{1e3 * row['fw_time_s']:>8.3f} "
        f"{1e3 * (row['agrad_time_s'] + row['wgrad_time_s']):>8.3f} "
        f"{_b(row['activation_bytes']):>11}")
  return '\n'.join(lines)


def _markdown_table(columns, rows):
  out = ['| ' + ' | '.join(columns) + ' |',
         '|' + '|'.join('---' for _ in columns) + '|']
  for row in rows:
    out.append('| ' + ' | '.join(str(c) for c in row) + ' |')
  return '\n'.join(out)


def write_run_report(directory, data):
  """Writes the report of :class:`RunData` ``data`` into ``directory``
  (created if missing), each file atomically (:mod:`calculon.outputs`).

  Files: ``report.md`` (all sections), ``report.txt`` (the text report),
  ``summary.json`` (execution, statistics, extra statistics),
  ``time_breakdown.csv``, ``memory.csv``, ``bandwidth.csv``, ``layers.csv``,
  ``time_breakdown.png`` (stacked bar), ``memory.png`` (memory by kind and
  tier against capacity).

  Returns:
    list of the paths written.

  Raises:
    calculon.outputs.WriteError: a file cannot be written.
  """
  import pandas as pd
  from calculon import io, outputs
  outputs.ensure_dir(directory)
  path = lambda name: os.path.join(directory, name)  # noqa: E731
  written = []
  time_df = pd.DataFrame(data.time_terms(),
                         columns=['part', 'term', 'seconds', 'share'])
  mem_df = pd.DataFrame(data.memory(),
                        columns=['kind', 'tier1_bytes', 'tier2_bytes'])
  bw_df = pd.DataFrame(data.bandwidth(), columns=[
    'requirement', 'needed_bytes_per_s', 'available_bytes_per_s'])
  layers_df = pd.DataFrame(data.layers())
  for name, frame in (('time_breakdown.csv', time_df), ('memory.csv', mem_df),
                      ('bandwidth.csv', bw_df), ('layers.csv', layers_df)):
    outputs.write_text(path(name), frame.to_csv(index=False))
    written.append(path(name))
  stats = {k: v for k, v in data.stats.items() if k != 'layers'}
  io.write_json_file({'application': data.app.to_dict(),
                      'execution': data.exe.to_dict(), 'stats': stats,
                      'extra_stats': data.extra, 'binds': data.binding(),
                      'memory': dict(zip(('needed_bytes', 'usable_bytes'),
                                         data.memory_figure()))},
                     path('summary.json'))
  written.append(path('summary.json'))
  outputs.write_text(path('report.txt'), text_report(data) + '\n')
  written.append(path('report.txt'))
  written += _charts(directory, data)

  cap1, cap2 = data.capacities()
  md = ['# calculon run report', ''] + [f'- {h}' for h in header_lines(data)]
  md += ['', '## Speed', '', _markdown_table(
    ['metric', 'value', 'unit'],
    [(label, f'{value:.4g}', unit) for label, value, unit in data.speed()])]
  md += ['', '## Time per batch', '', '![time](time_breakdown.png)', '',
         _markdown_table(['part', 'seconds', '% of batch'],
                         [(p, f'{s:.4f}', f'{100 * f:.2f}')
                          for p, s, f in data.time_breakdown()] +
                         [('**total**', f"{data.stats['total_time']:.4f}",
                           '100.00')])]
  needed, usable = data.memory_figure()
  md += ['', binding_text(data.binding())[:1].upper() +
         binding_text(data.binding())[1:] + '.']
  md += ['', '## Memory per processor', '', memory_line(data) + '.', '',
         '![memory](memory.png)', '',
         _markdown_table(['kind', 'tier 1', 'tier 2'],
                         [(k, _b(a), _b(b)) for k, a, b in data.memory()] +
                         [('**needed**', _b(needed),
                           _b(data.stats['proc_mem_tier2_cap_req'])),
                          ('usable', _b(usable), _b(cap2)),
                          ('capacity', _b(cap1), _b(cap2))])]
  md += ['', '## Bandwidth needed vs available', '', _markdown_table(
    ['requirement', 'needed', 'available'],
    [(r, _bw(n), _bw(a)) for r, n, a in data.bandwidth()])]
  md += ['', '## Model summary (one block, one microbatch)', '',
         _markdown_table(
           ['layer', 'parameters', 'fw FLOP', 'bw FLOP', 'fw bytes',
            'fw ms', 'agrad ms', 'wgrad ms', 'activation'],
           [(r['layer'], human_format(r['parameters'], precision=2),
             human_format(r['fw_flops'], precision=2),
             human_format(r['bw_flops'], precision=2),
             _b(r['fw_bytes']), f"{1e3 * r['fw_time_s']:.3f}",
             f"{1e3 * r['agrad_time_s']:.3f}",
             f"{1e3 * r['wgrad_time_s']:.3f}", _b(r['activation_bytes']))
            for r in data.layers()])]
  outputs.write_text(path('report.md'), '\n'.join(md) + '\n')
  written.append(path('report.md'))
  return written


def _charts(directory, data):
  from calculon.plots.common import figure, save
  import numpy as np
  paths = []
  # Time breakdown: one horizontal stacked bar, a segment per part.
  fig, ax = figure(9, 3.2)
  left = 0.0
  cmap = __import__('matplotlib').colormaps['tab20']
  for i, (label, seconds, share) in enumerate(data.time_breakdown()):
    if seconds <= 0:
      continue
    ax.barh([0], [seconds], left=left, color=cmap(i), edgecolor='white',
            label=f'{label} ({100 * share:.1f}%)')
    left += seconds
  ax.set_yticks([])
  ax.set_xlabel('seconds per batch')
  b = data.binding()
  ax.set_title(f"Batch time {data.stats['total_time']:.3f} s: "
               f"{binding_text(b).split(' (')[0]} (overheads "
               f"{100 * b['overheads_share']:.1f} % of the step)")
  ax.set_xlim(0, max(left, data.stats['total_time']))
  ax.legend(loc='upper center', bbox_to_anchor=(0.5, -0.35), ncol=3,
            fontsize=7, frameon=False)
  paths.append(save(fig, os.path.join(directory, 'time_breakdown.png')))

  # Memory: one panel per tier (own scale), stacked by kind, vs capacity.
  import matplotlib.pyplot as plt
  rows = data.memory()
  gib = 2 ** 30
  caps = data.capacities()
  tiers = [0, 1] if any(t2 for _, _, t2 in rows) else [0]
  fig, axes = plt.subplots(1, len(tiers), figsize=(5.5 * len(tiers) + 1, 4.5),
                           squeeze=False)
  for ax, tier in zip(axes[0], tiers):
    bottom = 0.0
    for i, row in enumerate(rows):
      value = row[1 + tier] / gib
      ax.bar([0], [value], bottom=bottom, color=cmap(2 * i), width=0.6,
             label=f'{row[0]} ({value:.1f} GiB)')
      bottom += value
    cap = caps[tier] / gib
    needed = bottom
    limit = cap
    if tier == 0:
      needed, usable = (x / gib for x in data.memory_figure())
      limit = usable
      if usable < cap:
        ax.axhline(usable, color='darkorange', linestyle='-')
        ax.annotate(f'usable {usable:.1f} GiB', (0, usable),
                    textcoords='offset points', xytext=(0, -11),
                    ha='center', fontsize=8, color='darkorange')
    if cap < 1e6:
      ax.axhline(cap, color='red', linestyle='--')
      ax.annotate(f'capacity {cap:g} GiB', (0, cap), textcoords='offset points',
                  xytext=(0, 4), ha='center', fontsize=8, color='red')
      ax.set_ylim(0, max(cap, bottom) * 1.15)
    ax.set_xticks([])
    ax.set_title(f'tier {tier + 1}: needed {needed:.1f} GiB of '
                 f'{limit:.1f} GiB ' + ('usable' if tier == 0 else
                                        'capacity'), fontsize=10)
    ax.set_ylabel('GiB per processor')
    ax.set_xlim(-0.5, 0.5)
    ax.legend(fontsize=7, loc='upper left', bbox_to_anchor=(1.02, 1),
              frameon=False)
  paths.append(save(fig, os.path.join(directory, 'memory.png')))
  return paths
