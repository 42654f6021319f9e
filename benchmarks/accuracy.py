"""Accuracy of the model on the bundled measured runs, before and after
calibration, cross-validated (the numbers of docs/accuracy.md).

    python benchmarks/accuracy.py [--runs CSV ...] [--out DIR]

1. The published suite with the bundled (uncalibrated) system files: every
   row priced, the fastest feasible execution of the unknown settings.
2. Leave one source out: for every source group, each of its runs is
   predicted with its cluster calibrated on the other groups' runs of that
   cluster, from the prior centres the other groups' runs of the other
   clusters give (or, when the cluster has too few, with the scales
   fitted on every other group's runs of every cluster).
3. Leave one run out: the same with one run held out at a time.

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


def main(argv=None):
  from calculon.validation import published as P
  from calculon.validation import calibrate as C
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--runs', nargs='+', default=None)
  ap.add_argument('--out', default=None)
  args = ap.parse_args(argv)
  t0 = time.time()
  suite = P.Suite(ROOT, args.runs)
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
  if args.out:
    frame.to_csv(os.path.join(args.out, 'published.csv'), index=False)
  print(f'(total {time.time() - t0:.1f} s)')


if __name__ == '__main__':
  main()
