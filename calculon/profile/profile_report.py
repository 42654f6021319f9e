"""The summary and report of ``calculon profile`` (text, markdown, CSV,
PNG)."""

import json
import os

from calculon.profile.outputs import save_figure_atomic, write_atomic


def _headline(name, out, system):
  if not out.ok:
    return f'DEFAULT: {out.error}'
  engine, _, dt = name.partition('.')
  if engine in ('matrix', 'vector'):
    sect = system[engine][dt]
    curve = ', '.join(f'{e:g}@{t:g}' for t, e in sect['gflops_efficiency'])
    return f"peak {sect['tflops']:g} TFLOP/s; efficiency@GFLOP: {curve}"
  if name in ('mem1', 'mem2'):
    sect = system[name]
    curve = ', '.join(f'{e:g}@{t:g}' for t, e in sect['MB_efficiency'])
    return f"{sect['GBps']:g} GB/s, {sect['GiB']:g} GiB; efficiency@MB: " \
      f'{curve}'
  if name == 'network':
    tier = system['networks'][0]
    return (f"{tier['bandwidth']:g} GB/s x {tier['efficiency']:g}, latency "
            f"{tier['latency'] * 1e6:.1f} us, {tier['size']} procs")
  return 'ok'


def _load(meta):
  load = meta.get('system_info', {}).get('load_average')
  return f', load average {load[0]:g}' if load else ''


def summary_lines(result):
  """Human-readable summary: one line per benchmark, defaults, and the
  nccl-tests style table of the collectives."""
  m = result.meta
  lines = [f"profile: {m['device']}, {m['procs']} process(es) x "
           f"{m['threads_per_proc']} thread(s), backend {m['backend']}"
           f"{' (numpy BLAS + multiprocessing instead of torch)' if m['backend'] == 'numpy' else ''}"
           f"{', quick' if m['quick'] else ''}"
           f"{', CPU-time clock' if m.get('clock') == 'cpu' else ''}, "
           f"{m['wall_s']:.1f} s"
           f"{_load(m)}"]
  lines.append(f"{'benchmark':<16} {'status':<8} {'runs':>4} {'tries':>5}  "
               'result')
  for name, out in result.outcomes.items():
    status = 'ok' if out.ok else 'FAILED'
    lines.append(f'{name:<16} {status:<8} {len(out.runs):>4} '
                 f'{len(out.attempts):>5}  '
                 f'{_headline(name, out, result.system)}')
  if result.defaults:
    lines.append('Left at documented defaults (docs/profile.md): ' + '; '.join(
      f'{k} ({v})' for k, v in result.defaults.items()))
  net = result.outcomes.get('network')
  if net is not None and net.ok:
    lines.append('')
    lines += collective_table(net.best['points'], m['procs'])
  return lines


def collective_table(points, procs):
  """nccl-tests style rows: size, op, time, algbw, busbw."""
  lines = [f'Collectives among {procs} processes, nccl-tests conventions: '
           'algbw = S/t, busbw = algbw x factor (all_reduce 2(n-1)/n; '
           'all_gather, reduce_scatter, all_to_all (n-1)/n; p2p 1); GB/s = '
           '1e9 B/s.',
           f"{'op':<15} {'bytes':>12} {'time(us)':>11} {'algbw':>8} "
           f"{'busbw':>8} {'factor':>7}"]
  for p in points:
    flag = ' (emulated)' if p.get('emulated') else ''
    lines.append(f"{p['op']:<15} {p['bytes']:>12} {p['seconds'] * 1e6:>11.1f} "
                 f"{p['algbw'] / 1e9:>8.3f} {p['busbw'] / 1e9:>8.3f} "
                 f"{p['bus_factor']:>7.3f}{flag}")
  return lines


def _csv(rows, columns):
  import pandas as pd
  return pd.DataFrame(rows, columns=columns).to_csv(index=False)


def write_profile_report(result, folder):
  """Writes profile.json, profile.md, one CSV per benchmark and
  curves.png into ``folder`` (which exists)."""
  from calculon.profile.machine import profile_json, system_text
  write_atomic(os.path.join(folder, 'profile.json'),
               json.dumps(profile_json(result), indent=2, default=str))
  write_atomic(os.path.join(folder, 'system.json'), system_text(result.system))
  tables = {}
  for name, out in result.outcomes.items():
    if not out.ok:
      continue
    pts = out.best['points']
    cols = [c for c in pts[0] if c not in ('key', 'shape')]
    tables[name] = f'{name}.csv'
    write_atomic(os.path.join(folder, f'{name}.csv'), _csv(pts, cols))
  md = ['# calculon profile', '', '```'] + summary_lines(result) + ['```', '']
  md += ['Per-benchmark measurements (best of the runs per point): ' +
         ', '.join(f'[{v}]({v})' for v in tables.values()), '',
         'System file: [system.json](system.json); everything measured, '
         'with every try: [profile.json](profile.json).', '',
         '![efficiency curves](curves.png)', '']
  write_atomic(os.path.join(folder, 'profile.md'), '\n'.join(md))
  _plot_curves(result, os.path.join(folder, 'curves.png'))


def _plot_curves(result, path):
  import matplotlib
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
  for ax, engine in zip(axes[:2], ('matrix', 'vector')):
    for name, out in result.outcomes.items():
      if not (name.startswith(engine + '.') and out.ok):
        continue
      pts = out.best['points']
      peak = max(p['value'] for p in pts)
      ax.scatter([p['flops'] / 1e9 for p in pts],
                 [p['value'] / peak for p in pts], s=10, alpha=0.6,
                 label=f'{name} measured')
      curve = result.system[engine][name.partition('.')[2]][
        'gflops_efficiency']
      _steps(ax, curve, max(p['flops'] for p in pts) / 1e9, name)
    ax.set_xscale('log')
    ax.set_xlabel('GFLOP per operation')
    ax.set_ylabel('efficiency')
    ax.set_title(f'{engine} engine')
    ax.legend(fontsize=7)
  ax = axes[2]
  for name in ('mem1', 'mem2'):
    out = result.outcomes.get(name)
    if out is None or not out.ok:
      continue
    pts = out.best['points']
    ax.scatter([p['bytes'] / 1e6 for p in pts], [p['value'] / 1e9
                                                  for p in pts],
               s=10, label=f'{name} measured (GB/s)')
  ax.set_xscale('log')
  ax.set_xlabel('MB per operation')
  ax.set_ylabel('GB/s')
  ax.set_title('memory')
  ax.legend(fontsize=7)
  fig.tight_layout()
  save_figure_atomic(fig, path, dpi=110)
  plt.close(fig)


def _steps(ax, curve, xmax, name):
  xs, ys = [], []
  pts = list(reversed(curve))
  for i, (t, e) in enumerate(pts):
    lo = max(t, pts[1][0] / 4 if len(pts) > 1 and t == 0 else t)
    hi = pts[i + 1][0] if i + 1 < len(pts) else xmax
    xs += [lo, hi]
    ys += [e, e]
  ax.plot(xs, ys, lw=1.5, label=f'{name} curve (system file)')
