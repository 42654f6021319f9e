"""Accuracy of the model on the bundled measured runs, before and after
calibration, cross-validated (the numbers of docs/accuracy.md).

    python benchmarks/accuracy.py [--runs CSV ...] [--out DIR] [-b DIR] [--from measured|datasheet] [--every-parameter]

1. The published suite on the files the default calibrations start from
   (``--from measured``, the default: systems/X_measured.json, the
   datasheet file with the measured kernel tables, as
   validation/make_calibrated.py fits them; ``--from datasheet``:
   systems/X_datasheet.json): every row priced, uncalibrated, the fastest
   feasible execution of the unknown settings.
2. Leave one source out: for every source group, each of its runs is
   predicted with its cluster calibrated on the other groups' runs of that
   cluster, from the prior centres the other groups' runs of the other
   clusters give (or, when the cluster has too few, with the scales
   fitted on every other group's runs of every cluster).
3. Leave one run out: the same with one run held out at a time.
4. With ``--every-parameter``: the bound a per-system calibration has on
   these runs -- every parameter each cluster's runs determine (no
   information criterion), fitted in sample (held-out runs included, which
   no cross-validation can beat) and left one run out.

Prints the tables (markdown) and the time taken; ``--out DIR`` writes the
per-run predictions as CSV.
"""

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def markdown(summary):
  """docs/accuracy.md's table of a cross-validation summary."""
  from calculon.validation.calibrate import cv_cells
  lines = ['| source | runs | before: median \\|d\\| | within 10 % | '
           'within 20 % | bias | after: median \\|d\\| | within 10 % | '
           'within 20 % | bias |', '|---|---|---|---|---|---|---|---|---|---|']
  cells = cv_cells(summary, ' %')
  for name, r in summary.iterrows():
    row = [str(c[name]) for c in cells]
    lines.append(f"| {'**overall**' if name == 'overall' else name} | "
                 f"{int(r['rows'])} | " + ' | '.join(row) + ' |')
  return '\n'.join(lines)


def error_line(deltas):
  """Median |delta|, runs within 5 % and 10 %, of percentage errors."""
  import numpy as np
  d = np.abs(np.asarray(deltas, dtype=float))
  return (f'median |d| {np.median(d):.2f} %, {int((d <= 5).sum())} within '
          f'5 %, {int((d <= 10).sum())} within 10 % (of {len(d)})')


def every_parameter(prepared):
  """Section 4 of the docstring: (lines to print, in-sample DataFrame,
  leave-one-run-out DataFrame)."""
  import pandas as pd
  from calculon.validation import calibrate as C
  names = list(C.DEFAULT_PARAMETERS) + ['per_step_s']
  rows, lines = [], []
  for system in sorted({r.system for r in prepared.runs}):
    own = [r for r in prepared.runs if r.system == system]
    chosen = C.available(own, names) if len(own) >= 2 else []
    theta = None
    if chosen:
      theta = C.fit_refined(own, chosen, C.prior_of(own[0].cfg))[0].theta
    for r in own:
      after = (C.exact_prediction(r.case, r.cfg, theta)[0]
               if theta is not None else prepared.before[r.id])
      rows.append({'id': r.id, 'system': system, 'measured_s': r.measured_s,
                   'after_s': after, 'parameters': len(chosen),
                   'delta_after_pct': 100 * (1 - after / r.measured_s)})
  inside = pd.DataFrame(rows)
  lines.append('in sample, every determined parameter: ' +
               error_line(inside['delta_after_pct']))
  lines.append('  per cluster: ' + ', '.join(
    f'{k} {v["delta_after_pct"].abs().median():.1f} % ({len(v)} runs, '
    f'{v["parameters"].iloc[0]} parameters)'
    for k, v in inside.groupby('system')))
  loro = C.cross_validate(prepared, 'run', names=names)
  lines.append('leave one run out, every determined parameter: ' +
               error_line(loro['delta_after_pct']))
  return lines, inside, loro


def main(argv=None):
  from calculon.validation import published as P
  from calculon.validation import calibrate as C
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--runs', nargs='+', default=None)
  ap.add_argument('--out', default=None)
  ap.add_argument('-b', '--base-dir', default=None,
                  help='folder with models/, systems/ and validation/ '
                  '(default: the repository)')
  ap.add_argument('--from', dest='start', choices=('measured', 'datasheet'),
                  default='measured',
                  help='the files calibration starts from: the measured '
                  'kernel files, as the defaults are fitted (default), or '
                  'the datasheet files')
  ap.add_argument('--every-parameter', action='store_true',
                  help='also the bound of a per-system calibration: every '
                  'determined parameter, in sample and left one run out')
  args = ap.parse_args(argv)
  import tempfile
  with tempfile.TemporaryDirectory() as tmp:
    base = args.base_dir or ROOT
    if args.start == 'measured':
      from calculon.validation.system_files import measured_view
      base = measured_view(base, tmp)
    run(args, base, P, C)


def run(args, base, P, C):
  """The suite and the cross-validations on base folder ``base``."""
  t0 = time.time()
  print(f'(calibration starts from the {args.start} files)\n')
  suite = P.Suite(base, args.runs)
  frame = P.results_frame(P.run_suite(suite))
  t1 = time.time()
  print(P.format_report(frame))
  print(f'\n(published suite: {t1 - t0:.1f} s)\n')
  prepared = C.prepare(suite)
  t2 = time.time()
  print(f'(linearized {len(prepared.runs)} runs: {t2 - t1:.1f} s)\n')
  for mode, title in (('source', 'Leave one source out'),
                      ('run', 'Leave one run out')):
    t = time.time()
    cv = C.cross_validate(prepared, mode)
    print(f'## {title} ({time.time() - t:.1f} s)\n')
    print(markdown(C.cv_summary(cv)))
    print()
    by = cv.groupby('system')
    print('per cluster (after): ' + ', '.join(
      f'{k} {v["delta_after_pct"].abs().median():.1f} % ({len(v)})'
      for k, v in by))
    print()
    if args.out:
      os.makedirs(args.out, exist_ok=True)
      cv.to_csv(os.path.join(args.out, f'cv_{mode}.csv'), index=False)
  if args.every_parameter:
    t = time.time()
    lines, inside, loro = every_parameter(prepared)
    print(f'## Every parameter ({time.time() - t:.1f} s)\n')
    print('\n'.join(lines) + '\n')
    if args.out:
      inside.to_csv(os.path.join(args.out, 'every_in_sample.csv'),
                    index=False)
      loro.to_csv(os.path.join(args.out, 'every_cv_run.csv'), index=False)
  if args.out:
    frame.to_csv(os.path.join(args.out, 'published.csv'), index=False)
  print(f'(total {time.time() - t0:.1f} s)')


if __name__ == '__main__':
  main()
