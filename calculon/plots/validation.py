"""Figures of ``calculon llm-validation``: measured vs predicted.

They read the validation's result tables (DataFrames of
:mod:`calculon.validation.seqsel` and :mod:`calculon.validation.published`),
never the model.
"""

import os

import numpy as np

from calculon.plots.common import figure, save

_PAPER, _OURS = '#7f7f7f', '#1f77b4'


def seqsel_bars(table, path):
  """Grouped bars of one Korthikanti et al. 2022 comparison (a
  :class:`~calculon.validation.seqsel.Table`): for every (model, mode) the
  paper's value and the model's, labeled with the delta.  Returns ``path``
  (PNG, PDF or SVG by extension)."""
  frame = table.frame
  labels = [f'{m}\n{mode}' for m, mode in zip(frame['model'], frame['mode'])]
  x = np.arange(len(frame))
  fig, ax = figure(max(7.0, 0.55 * len(frame) + 2), 4.8)
  width = 0.4
  ax.bar(x - width / 2, frame['profile'], width, label='paper (measured)',
         color=_PAPER)
  bars = ax.bar(x + width / 2, frame['calculon'], width, label='calculon',
                color=_OURS)
  for bar, d in zip(bars, frame['delta_pct']):
    ax.annotate(f'{d:+.1f}%', (bar.get_x() + bar.get_width() / 2,
                               bar.get_height()),
                ha='center', va='bottom', fontsize=7, rotation=90,
                xytext=(0, 2), textcoords='offset points')
  ax.set_xticks(x)
  ax.set_xticklabels(labels, fontsize=7, rotation=90)
  ax.set_title(f'{table.title}\nmean |delta| {table.mean_abs_delta_pct:.2f}%'
               f', max {table.max_abs_delta_pct:.2f}% (limits '
               f'{table.threshold_mean_pct:.1f}% / '
               f'{table.threshold_max_pct:.1f}%)', fontsize=9)
  ax.set_ylim(0, max(frame['profile'].max(), frame['calculon'].max()) * 1.2)
  ax.legend(fontsize=8)
  ax.grid(axis='y', alpha=0.3)
  return save(fig, path)


def seqsel_plots(tables, out_dir):
  """One bar chart per table, ``out_dir/seqsel_<key>.png``; returns the
  paths."""
  return [seqsel_bars(t, os.path.join(out_dir, f'seqsel_{t.key}.png'))
          for t in tables]


def _predicted(frame):
  return frame[frame['status'] == 'ok']


def source_colors(sources):
  """A distinct colour per source, in order of first appearance
  (matplotlib's ``tab10`` then ``Dark2`` and ``Set1``: 27 colours before
  one repeats), {source: colour}."""
  import matplotlib
  cycle = [matplotlib.colormaps[name](i) for name, n in
           (('tab10', 10), ('Dark2', 8), ('Set1', 9)) for i in range(n)]
  colors = {}
  for source in sources:
    colors.setdefault(source, cycle[len(colors) % len(cycle)])
  return colors


def files_caption(frame):
  """What the rows were priced on, for a title: 'datasheet files',
  'calibrated files' or both, from the ``system_file`` column (file name
  and kind, :func:`calculon.validation.system_files.label`); '' without
  it."""
  if 'system_file' not in frame.columns:
    return ''
  kinds = [k for k in ('datasheet', 'calibrated')
           if frame['system_file'].astype(str).str.endswith(f'({k})').any()]
  return ' and '.join(kinds) + ' files' if kinds else ''


def published_scatter(frame, path):
  """Log-log scatter of predicted vs measured time (s; a batch, or one layer
  for per-layer measurements) of the published runs, one colour per source
  (:func:`source_colors`), with the y = x line and ±20% bands; the title
  says which system files priced them (:func:`files_caption`).
  ``frame``: :func:`calculon.validation.published.results_frame`.  Returns
  ``path``."""
  ok = _predicted(frame)
  fig, ax = figure(9.0, 6.0)
  colors = source_colors(ok['source'])
  for source, part in ok.groupby('source', sort=False):
    ax.scatter(part['measured_s'], part['predicted_s'], label=source, s=28,
               alpha=0.85, edgecolors='black', linewidths=0.4,
               color=colors[source])
  lo = min(ok['measured_s'].min(), ok['predicted_s'].min()) / 2
  hi = max(ok['measured_s'].max(), ok['predicted_s'].max()) * 2
  line = np.array([lo, hi])
  ax.plot(line, line, color='black', lw=1, label='predicted = measured')
  ax.plot(line, line * 1.2, color='gray', lw=0.8, ls='--',
          label='±20 %')
  ax.plot(line, line / 1.2, color='gray', lw=0.8, ls='--')
  ax.set_xscale('log')
  ax.set_yscale('log')
  ax.set_xlim(lo, hi)
  ax.set_ylim(lo, hi)
  ax.set_aspect('equal')
  ax.set_xlabel('measured time (s; a step, or one layer)')
  ax.set_ylabel('predicted time (s)')
  caption = files_caption(ok)
  ax.set_title(f'Published runs: {len(ok)} predicted'
               + (f' on the {caption}' if caption else ''), fontsize=10)
  ax.legend(fontsize=7, loc='upper left', bbox_to_anchor=(1.02, 1),
            frameon=False, title='source', title_fontsize=8)
  ax.grid(which='both', alpha=0.2)
  return save(fig, path)


def published_residuals(frame, path):
  """Horizontal bars of each published run's delta (percent, ``100 * (1 -
  predicted / measured)``), one colour per source (:func:`source_colors`,
  legend beside the axes), each bar labelled with its value, the ±10% and
  ±20% bands shaded; the title says which system files priced them
  (:func:`files_caption`).  Returns ``path``."""
  from matplotlib.patches import Patch
  ok = _predicted(frame)
  fig, ax = figure(10.0, max(4.0, 0.2 * len(ok) + 1.8))
  y = np.arange(len(ok))[::-1]
  colors = source_colors(ok['source'])
  ax.axvspan(-20, 20, color='#e6e6e6', lw=0, zorder=0)
  ax.axvspan(-10, 10, color='#cccccc', lw=0, zorder=0)
  deltas = ok['delta_pct'].astype(float).to_numpy()
  ax.barh(y, deltas, color=[colors[s] for s in ok['source']], zorder=2,
          height=0.75)
  for yy, d in zip(y, deltas):
    ax.annotate(f'{d:+.1f}', (d, yy), xytext=(2 if d >= 0 else -2, 0),
                textcoords='offset points', va='center',
                ha='left' if d >= 0 else 'right', fontsize=5, zorder=3)
  ax.axvline(0, color='black', lw=0.8, zorder=3)
  ax.set_yticks(y)
  ax.set_yticklabels([f"{i} {m[:40]}" for i, m in zip(ok['id'], ok['model'])],
                     fontsize=6)
  ax.set_ylim(-1, len(ok))
  if len(deltas):
    span = max(25.0, np.nanmax(np.abs(deltas)) * 1.15)
    ax.set_xlim(-span, span)
  ax.set_xlabel('delta = 100 (1 - predicted / measured) %\n'
                '(positive: the model predicts a faster step)')
  handles = [Patch(color=c, label=s) for s, c in colors.items()]
  handles += [Patch(color='#cccccc', label='within ±10 %'),
              Patch(color='#e6e6e6', label='within ±20 %')]
  ax.legend(handles=handles, fontsize=7, loc='upper left',
            bbox_to_anchor=(1.02, 1), frameon=False, title='source',
            title_fontsize=8)
  caption = files_caption(ok)
  ax.set_title(f'Published runs: residuals of {len(ok)} rows'
               + (f' on the {caption}' if caption else ''), fontsize=10)
  ax.grid(axis='x', alpha=0.3, zorder=1)
  return save(fig, path)


def published_plots(frame, out_dir):
  """Scatter and residuals, ``out_dir/published_scatter.png`` and
  ``out_dir/published_residuals.png``; returns the paths."""
  return [published_scatter(frame, os.path.join(out_dir,
                                                'published_scatter.png')),
          published_residuals(frame, os.path.join(out_dir,
                                                  'published_residuals.png'))]


def search_check_plot(frame, path):
  """Horizontal bars of the search's best over the measured throughput,
  one per searched row (``frame``: :func:`calculon.validation.
  search_check.results_frame`), tuned recipes dark and marked ``*``, the
  others light, with lines at 1.0 (the measured), 1.10 and 1.25 (issue
  34's median and maximum for tuned rows).  Returns ``path``."""
  import pandas as pd
  ok = frame[frame['status'] == 'ok'].copy()
  ok['_r'] = pd.to_numeric(ok['ratio_measured'], errors='coerce')
  ok = ok[ok['_r'].notna()]
  tuned = ok['tuned'].astype(bool).to_numpy()
  fig, ax = figure(7.5, max(4.0, 0.16 * len(ok) + 1.5))
  y = np.arange(len(ok))[::-1]
  ax.barh(y, ok['_r'], color=np.where(tuned, _OURS, '#aec7e8'),
          edgecolor='black', linewidth=0.3)
  for x, style, label in ((1.0, '-', 'measured'), (1.10, '--', '1.10'),
                          (1.25, ':', '1.25')):
    ax.axvline(x, color='black', lw=0.9, ls=style, label=label)
  ax.set_yticks(y)
  ax.set_yticklabels([f"{i}{'*' if t else ''} {str(m)[:30]}" for i, m, t in
                      zip(ok['id'], ok['model'], tuned)], fontsize=5)
  ax.set_ylim(-1, len(ok))
  if len(ok):
    ax.set_xlim(min(0.8, ok['_r'].min() - 0.05), ok['_r'].max() * 1.05)
  t = ok['_r'][tuned]
  ax.set_xlabel("search's best / measured throughput (tokens/s/GPU)")
  ax.set_title("The search in each row's framework preset vs measured\n"
               f'tuned recipes (*, dark): {len(t)}'
               + (f', median {t.median():.2f}, max {t.max():.2f}' if len(t)
                  else '') + f'; other rows: {len(ok) - len(t)}', fontsize=9)
  ax.legend(fontsize=7, loc='lower right')
  ax.grid(axis='x', alpha=0.3)
  return save(fig, path)
