"""Figures of search results: best sample rate over TP x PP (heatmap, 3-D)
and against one execution field.

Inputs are result tables (``llm-all-executions`` CSV/Parquet, or
``llm-optimal-execution`` JSON/CSV), read with
:func:`calculon.io.read_table`; each figure shows, for each value of the
plotted fields, the best (largest) value of the metric over all other
options.
"""

from calculon import outputs
from calculon.cli.main import EXIT_OK
from calculon.errors import ConfigError


def _table(path, *columns):
  from calculon.io import read_table
  frame = read_table(path)
  for col in columns:
    if col is not None and col not in frame.columns:
      raise ConfigError(
        f"{path}: no column {col!r}; columns are: "
        f"{', '.join(map(str, frame.columns[:40]))}"
        f"{' ...' if len(frame.columns) > 40 else ''}", source=path,
        field=col)
  if 'feasible' in frame.columns:
    frame = frame[frame['feasible'].astype(bool)]
  if frame.empty:
    raise ConfigError(f'{path}: no feasible execution to plot', source=path)
  return frame


def best_grid(frame, row, col, metric):
  """(row values, col values, matrix of the best metric; NaN where none)."""
  import numpy as np
  best = frame.groupby([row, col])[metric].max()
  rows = sorted(frame[row].unique())
  cols = sorted(frame[col].unique())
  grid = np.full((len(rows), len(cols)), np.nan)
  for (r, c), v in best.items():
    grid[rows.index(r), cols.index(c)] = v
  return rows, cols, grid


def heatmap(path, output, metric='sample_rate', title=None):
  """Best ``metric`` over tensor x pipeline parallelism, annotated."""
  import numpy as np
  from calculon.plots.common import figure, save
  frame = _table(path, 'tensor_par', 'pipeline_par', metric)
  tps, pps, grid = best_grid(frame, 'tensor_par', 'pipeline_par', metric)
  fig, ax = figure(1.2 + 0.8 * len(pps), 1.2 + 0.6 * len(tps))
  masked = np.ma.masked_invalid(grid)
  image = ax.imshow(masked, origin='lower', cmap='viridis', aspect='auto')
  ax.set_facecolor('#dddddd')
  ax.set_xticks(range(len(pps)), labels=[str(p) for p in pps])
  ax.set_yticks(range(len(tps)), labels=[str(t) for t in tps])
  ax.set_xlabel('pipeline parallelism (PP)')
  ax.set_ylabel('tensor parallelism (TP)')
  finite = grid[np.isfinite(grid)]
  threshold = finite.min() + 0.6 * (finite.max() - finite.min())
  for i in range(len(tps)):
    for j in range(len(pps)):
      value = grid[i, j]
      text = '-' if np.isnan(value) else f'{value:.3g}'
      ax.text(j, i, text, ha='center', va='center', fontsize=8,
              color='black' if np.isfinite(value) and value > threshold
              else 'white')
  fig.colorbar(image, ax=ax, label=f'best {metric}')
  ax.set_title(title or f'Best {metric} over TP x PP')
  return save(fig, output)


def versus(path, output, x, metric='sample_rate', hue=None, title=None):
  """Best ``metric`` for each value of field ``x`` (one line per ``hue``)."""
  import numpy as np
  from calculon.plots.common import figure, save
  frame = _table(path, x, metric, hue)
  fig, ax = figure()
  groups = [(None, frame)] if hue is None else sorted(
    frame.groupby(hue), key=lambda kv: str(kv[0]))
  for name, part in groups:
    best = part.groupby(x)[metric].max().sort_index()
    ax.plot(best.index, best.values, marker='o',
            label=None if name is None else f'{hue}={name}')
  if np.issubdtype(frame[x].dtype, np.number) and frame[x].min() > 0 and \
      frame[x].max() / frame[x].min() >= 8:
    ax.set_xscale('log', base=2)
  ax.set_xlabel(x)
  ax.set_ylabel(f'best {metric}')
  ax.grid(True, alpha=0.3)
  if hue is not None:
    ax.legend(fontsize=8)
  ax.set_title(title or f'Best {metric} vs {x}')
  return save(fig, output)


def surface(path, output, metric='sample_rate', title=None):
  """3-D view of the best ``metric`` over log2 TP x log2 PP."""
  import numpy as np
  from calculon.plots.common import save
  import matplotlib.pyplot as plt
  frame = _table(path, 'tensor_par', 'pipeline_par', metric)
  tps, pps, grid = best_grid(frame, 'tensor_par', 'pipeline_par', metric)
  fig = plt.figure(figsize=(7, 5.5))
  ax = fig.add_subplot(111, projection='3d')
  xs, ys = np.meshgrid(np.arange(len(pps)), np.arange(len(tps)))
  z = np.nan_to_num(grid, nan=0.0)
  ax.bar3d(xs.ravel(), ys.ravel(), np.zeros(z.size), 0.7, 0.7, z.ravel(),
           color=plt.colormaps['viridis'](z.ravel() / max(z.max(), 1e-30)),
           shade=True)
  ax.set_xticks(np.arange(len(pps)) + 0.35, labels=[str(p) for p in pps])
  ax.set_yticks(np.arange(len(tps)) + 0.35, labels=[str(t) for t in tps])
  ax.set_xlabel('PP')
  ax.set_ylabel('TP')
  ax.set_zlabel(f'best {metric}')
  ax.view_init(25, -135)
  ax.set_title(title or f'Best {metric} over TP x PP')
  return save(fig, output)


def add_plot_parsers(kinds):
  def common(p, with_metric=True):
    p.add_argument('results', help='result table: all-executions CSV/Parquet '
                   'or optimal-execution JSON/CSV')
    p.add_argument('output', help='image file (.png, .pdf, .svg)')
    p.add_argument('-m', '--metric', default='sample_rate',
                   help='statistic to plot (default sample_rate)')
    p.add_argument('-t', '--title', default=None, help='figure title')

  p = kinds.add_parser('heatmap', help='best metric over TP x PP',
                       description='Heatmap of the best metric over tensor x '
                       'pipeline parallelism.')
  common(p)
  p.set_defaults(func=_checked(lambda a: heatmap(
    a.results, a.output, a.metric, a.title)))
  p = kinds.add_parser('vs', help='best metric against one field',
                       description='Best metric for each value of --x (e.g. '
                       'data_par, pipeline_par, microbatch_size).')
  common(p)
  p.add_argument('--x', required=True, help='field on the x axis')
  p.add_argument('--hue', default=None, help='one line per value of this')
  p.set_defaults(func=_checked(lambda a: versus(
    a.results, a.output, a.x, a.metric, a.hue, a.title)))
  p = kinds.add_parser('3d', help='3-D view of the best metric over TP x PP')
  common(p)
  p.set_defaults(func=_checked(lambda a: surface(
    a.results, a.output, a.metric, a.title)))


def _checked(draw):
  """A handler: checks the image path, then draws (``draw(args)`` returns
  the path written)."""
  def run(args, log):
    outputs.check_output_path(args.output, outputs.IMAGE_KINDS,
                              what='figure')
    log.info(f'Plot: {draw(args)}')
    return EXIT_OK
  return run
