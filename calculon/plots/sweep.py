"""``calculon plot sweep OUTPUT.parquet --x F --y F [--hue F]``: figures of a
sweep.

Two kinds, from the rows of one rank (default 0, each point's best
execution):

* ``line``: y against x, one line per value of ``--hue``;
* ``heatmap``: a grid with x across and ``--hue`` down, each cell coloured
  (and labelled) by y.

``--col`` draws one panel per value of a field.  When other point
parameters vary within a (panel, hue, x) cell, the rows are combined by
``--agg`` (default max: "the best over the other parameters") and the
command says which parameters it combined.  Points with no feasible
execution have no y: gaps in lines, blank cells in heatmaps.
"""

import math

from calculon.errors import ConfigError

KINDS = ('line', 'heatmap')
AGGREGATES = ('max', 'min', 'mean', 'median')


def add_plot_parsers(kinds):
  p = kinds.add_parser(
    'sweep', help='line or heatmap figures of a sweep output',
    description='Plot a sweep output (the folder written by calculon sweep): '
    'y against x, one line (or heatmap row) per value of --hue, one panel '
    'per value of --col. Example: calculon plot sweep out.parquet --x '
    'networks_1_bandwidth_scale --y sample_rate --hue application '
    '--col num_procs')
  p.add_argument('input', help='sweep output folder (OUTPUT.parquet)')
  p.add_argument('--x', required=True, metavar='FIELD',
                 help='column across (e.g. num_procs, a variation column)')
  p.add_argument('--y', required=True, metavar='FIELD',
                 help='numeric column plotted (line) or coloured (heatmap), '
                 'e.g. sample_rate, total_efficiency, total_time')
  p.add_argument('--hue', metavar='FIELD', default=None,
                 help='one line (heatmap: one row) per value of this column')
  p.add_argument('--col', metavar='FIELD', default=None,
                 help='one panel per value of this column')
  p.add_argument('--kind', choices=KINDS, default='line',
                 help='line (default) or heatmap')
  p.add_argument('--rank', type=int, default=0,
                 help='rows of this rank (0, the default: each point\'s best '
                 'execution)')
  p.add_argument('--where', action='append', default=[],
                 metavar='FIELD=VALUE',
                 help='keep the rows where FIELD equals VALUE (repeatable)')
  p.add_argument('--agg', choices=AGGREGATES, default='max',
                 help='combines rows of equal panel, hue and x when other '
                 'parameters vary (default max)')
  p.add_argument('--relative', metavar='X_VALUE', default=None,
                 help='divide y by its value at x = X_VALUE on the same '
                 'line (heatmap: row), e.g. --relative 1 for the speed-up '
                 'over the unscaled system')
  p.add_argument('--logx', action='store_true', help='log scale across '
                 '(base 2)')
  p.add_argument('--logy', action='store_true', help='log scale for y '
                 '(line)')
  p.add_argument('--sharey', action='store_true',
                 help='one y scale for every panel (line)')
  p.add_argument('--title', default=None, help='figure title')
  p.add_argument('-o', '--output', default=None,
                 help='figure file (.png, .pdf, .svg); default: INPUT with '
                 '.png instead of .parquet')
  p.set_defaults(func=run)


def default_output(folder):
  """'runs/out.parquet/' -> 'runs/out.png'."""
  base = folder.rstrip('/\\')
  if base.endswith('.parquet'):
    base = base[:-len('.parquet')]
  return base + '.png'


def param_columns(frame):
  """The point parameter columns of a sweep frame (between point_id and
  rank, by the schema's order)."""
  cols = list(frame.columns)
  if 'point_id' not in cols or 'rank' not in cols:
    return []
  return cols[cols.index('point_id') + 1:cols.index('rank')]


def _unit(name):
  from calculon.llm import STATS
  for stat in STATS:
    if stat.name == name:
      return stat.unit
  return None


def _check_column(frame, source, option, name, numeric=False):
  if name not in frame.columns:
    params = ', '.join(param_columns(frame))
    raise ConfigError(
      f'{source}: {option} {name!r} is not a column of this sweep; allowed: '
      f'a point parameter ({params}), rank, an execution field '
      '(tensor_par, ...) or a statistic (sample_rate, total_time, '
      'total_efficiency, ...)', source=source, field=option, value=name,
      allowed='a column of the sweep')
  if numeric:
    import pandas as pd
    col = frame[name]
    if not (pd.api.types.is_numeric_dtype(col) and
            not pd.api.types.is_bool_dtype(col)):
      raise ConfigError(f'{source}: {option} {name!r} is not numeric (it '
                        f'holds {col.dtype} values)', source=source,
                        field=option, value=name, allowed='a numeric column')


def _parse_where(frame, source, text):
  import pandas as pd
  if '=' not in text:
    raise ConfigError(f'{source}: --where {text!r} is not allowed: '
                      'FIELD=VALUE', source=source, field='--where',
                      value=text, allowed='FIELD=VALUE')
  name, value = text.split('=', 1)
  _check_column(frame, source, '--where', name)
  col = frame[name]
  if pd.api.types.is_bool_dtype(col) or name in ('feasible',):
    if value.lower() not in ('true', 'false'):
      raise ConfigError(f'{source}: --where {text!r}: {name} holds true or '
                        'false', source=source, field='--where', value=text)
    return col == (value.lower() == 'true')
  if pd.api.types.is_numeric_dtype(col):
    try:
      number = float(value)
    except ValueError:
      raise ConfigError(f'{source}: --where {text!r}: {name} holds numbers',
                        source=source, field='--where', value=text) from None
    return col.astype(float) == number
  return col.astype(str) == value


def select(frame, source, x, y, hue=None, col=None, rank=0, where=(),
           agg='max', log=None, relative=None):
  """The values plotted: a DataFrame with columns col?, hue?, x, y (one row
  per cell, y combined by ``agg``; divided by the y at x = ``relative`` of
  the same panel and hue when given).

  Raises:
    ConfigError: unknown or non-numeric columns, a bad --where, no row
      left, or no x equal to ``relative``.
  """
  for option, name in (('--x', x), ('--hue', hue), ('--col', col)):
    if name is not None:
      _check_column(frame, source, option, name)
  _check_column(frame, source, '--y', y, numeric=True)
  keep = frame['rank'] == rank if 'rank' in frame.columns else None
  for text in where:
    cond = _parse_where(frame, source, text)
    keep = cond if keep is None else keep & cond
  rows = frame[keep] if keep is not None else frame
  if rows.empty:
    raise ConfigError(f'{source}: no row has rank {rank}' +
                      (' and ' + ' and '.join(where) if where else ''),
                      source=source, field='--where', value=list(where))
  keys = [k for k in (col, hue, x) if k is not None]
  if len(set(keys)) != len(keys):
    raise ConfigError(f'{source}: --x, --hue and --col must be different '
                      f'columns, got {keys}', source=source, field='--x',
                      value=keys)
  others = [p for p in param_columns(rows) if p not in keys]
  varying = [(p, rows.groupby(keys, dropna=False)[p].nunique(dropna=False)
              .max()) for p in others]
  varying = [(p, n) for p, n in varying if n > 1]
  if varying and log is not None:
    what = ', '.join(f'{p} ({n} values)' for p, n in varying)
    log.info(f'Combined by {agg} over: {what} (fix them with --where, or '
             'use them as --hue or --col)')
  cells = rows.groupby(keys, dropna=False, sort=True)[y].agg(agg)
  cells = cells.reset_index()
  if relative is not None:
    cells = _relative(cells, source, x, y, keys[:-1], relative)
  return cells


def _relative(cells, source, x, y, groups, text):
  import pandas as pd
  values = _sorted_values(cells[x])
  match = [v for v in values if _fmt(v) == text or str(v) == text]
  if not match and pd.api.types.is_numeric_dtype(cells[x]):
    try:
      match = [v for v in values if float(v) == float(text)]
    except ValueError:
      match = []
  if not match:
    raise ConfigError(
      f'{source}: --relative {text!r} is not a value of {x} (it has: '
      + ', '.join(_fmt(v) for v in values) + ')', source=source,
      field='--relative', value=text, allowed=[_fmt(v) for v in values])
  base = cells[cells[x] == match[0]]
  if groups:
    ref = cells.merge(base[groups + [y]].rename(columns={y: '_base'}),
                      on=groups, how='left')['_base'].to_numpy()
  else:
    ref = base[y].iloc[0]
  out = cells.copy()
  out[y] = cells[y].to_numpy() / ref
  return out


def _sorted_values(series):
  values = list(dict.fromkeys(series.tolist()))
  try:
    return sorted(values)
  except TypeError:
    return values


def _fmt(v):
  if isinstance(v, float) and v.is_integer():
    return str(int(v))
  return str(v)


def _cell_text(v):
  if v is None or (isinstance(v, float) and math.isnan(v)):
    return ''
  return f'{v:.3g}'


def plot(cells, x, y, hue=None, col=None, kind='line', logx=False,
         logy=False, title=None, ylabel=None, sharey=False):
  """Draws ``cells`` (from :func:`select`); returns the figure."""
  import numpy as np
  from calculon.plots import common
  plt = common.plt
  panels = _sorted_values(cells[col]) if col else [None]
  ncols = len(panels) if len(panels) <= 3 else min(
    4, math.ceil(math.sqrt(len(panels))))
  nrows = math.ceil(len(panels) / ncols)
  fig, axes = plt.subplots(nrows, ncols, figsize=(4.4 * ncols + 0.6,
                                                  3.6 * nrows + 0.6),
                           squeeze=False,
                           sharey=bool(sharey and kind == 'line'))
  unit = _unit(y)
  ylabel = ylabel or (f'{y} ({unit})' if unit else y)
  hues = _sorted_values(cells[hue]) if hue else [None]
  xs = _sorted_values(cells[x])
  numeric_x = all(isinstance(v, (int, float, np.integer, np.floating))
                  and not isinstance(v, bool) for v in xs)
  colors = plt.rcParams['axes.prop_cycle'].by_key()['color']
  for k, panel in enumerate(panels):
    ax = axes[k // ncols][k % ncols]
    part = cells[cells[col] == panel] if col else cells
    if kind == 'line':
      for j, h in enumerate(hues):
        sub = part[part[hue] == h] if hue else part
        sub = sub.set_index(x)[y].reindex(xs)
        pos = xs if numeric_x else list(range(len(xs)))
        ax.plot(pos, sub.to_numpy(dtype=float), marker='o',
                color=colors[j % len(colors)],
                label=_fmt(h) if hue else None)
      if not numeric_x:
        ax.set_xticks(range(len(xs)), [_fmt(v) for v in xs])
      elif logx:
        ax.set_xscale('log', base=2)
        ax.set_xticks(xs, [_fmt(v) for v in xs])
      if logy:
        ax.set_yscale('log')
      if k % ncols == 0:
        ax.set_ylabel(ylabel)
      ax.grid(True, alpha=0.3)
      if hue and k == 0:
        ax.legend(title=hue, fontsize='small')
    else:
      grid = np.full((len(hues), len(xs)), np.nan)
      for _, row in part.iterrows():
        i = hues.index(row[hue]) if hue else 0
        grid[i, xs.index(row[x])] = row[y]
      image = ax.imshow(np.ma.masked_invalid(grid), aspect='auto',
                        cmap='viridis')
      ax.set_xticks(range(len(xs)), [_fmt(v) for v in xs])
      ax.set_yticks(range(len(hues)), [_fmt(h) for h in hues] if hue
                    else [''])
      if hue:
        ax.set_ylabel(hue)
      finite = grid[np.isfinite(grid)]
      mid = (finite.min() + finite.max()) / 2 if finite.size else 0
      for i in range(len(hues)):
        for j in range(len(xs)):
          ax.text(j, i, _cell_text(grid[i, j]), ha='center', va='center',
                  fontsize='small',
                  color='black' if grid[i, j] > mid else 'white')
      fig.colorbar(image, ax=ax, label=ylabel)
    ax.set_xlabel(x)
    if col:
      ax.set_title(f'{col} = {_fmt(panel)}', fontsize='medium')
  for k in range(len(panels), nrows * ncols):
    axes[k // ncols][k % ncols].set_visible(False)
  fig.suptitle(title or (f'{y} vs {x}' + (f' by {hue}' if hue else '')))
  return fig


def run(args, log):
  from calculon.cli.main import EXIT_OK
  from calculon import outputs
  from calculon.sweep.store import read_sweep
  output = args.output or default_output(args.input)
  outputs.check_output_path(output, outputs.IMAGE_KINDS, what='figure',
                            option='-o/--output' if args.output else None)
  frame = read_sweep(args.input)
  cells = select(frame, args.input, args.x, args.y, args.hue, args.col,
                 args.rank, args.where, args.agg, log, args.relative)
  ylabel, title = None, args.title
  if args.relative is not None:
    ylabel = f'{args.y} (relative)'
    title = title or (f'{args.y} relative to {args.x} = {args.relative}' +
                      (f' by {args.hue}' if args.hue else ''))
  fig = plot(cells, args.x, args.y, args.hue, args.col, args.kind,
             args.logx, args.logy, title, ylabel, args.sharey)
  from calculon.plots import common
  path = common.save(fig, output)
  log.info(f'Plot: {path} ({len(cells)} cells)')
  return EXIT_OK
