"""Fits how much of an overlap a framework realizes
(``tensor_par_overlap_efficiency``) to measured A/B speedups of that
overlap, on runs outside the published suite.

    python validation/fit_overlap_efficiency.py [--field NAME] [--pairs CSV]

``--pairs`` (default: the field's file below) holds measured runs in the
columns of ``validation/published_runs.csv``, two per configuration, the
same but for the overlap: the notes of both name the pair
(``pair=NAME``), and the conventions' rules set the overlap field
(``tensor_par_overlap``, ``moe_comm_overlap``) of one and not of the
other. Each row is priced as the published suite prices it, on the
datasheet system files (the calibrated ones are fitted on runs priced with
this value: fitting it on them would go round in a circle), with the row's
own framework preset; the fitted value is the one in [0, 1] whose
predicted speedups (time without the overlap over time with it) are
closest, in least squares of their logarithms, to the measured ones.
Prints the table and the value.

The bundled pairs:

* ``validation/tp_overlap_pairs.csv`` (``tensor_par_overlap_efficiency``,
  the torchtitan preset): torchtitan's own A/B measurement of PyTorch's
  async TP (benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md,
  torchtitan 2887250bb), Llama 3 70B with float8 tensorwise (FSDP 32 x
  TP 8) and Llama 3 8B in bfloat16 (FSDP 8 x TP 8). The table's other rows
  are left out: its 70B bfloat16 pair is in the published suite (held out
  here so that no suite row enters the fit), its 8B float8 tensorwise
  baseline too, and its float8 rowwise baselines are flagged there as
  anomalously slow (torchtitan issue #1207).
"""

import argparse
import math
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

#: field -> (the overlap field it qualifies, its value without the
#: overlap, the bundled pairs).
FIELDS = {
  'tensor_par_overlap_efficiency': (
    'tensor_par_overlap', 'none', 'validation/tp_overlap_pairs.csv'),
}


def pair_name(case):
  """The ``pair=NAME`` of a row's notes."""
  m = re.search(r'pair=([\w-]+)', str(case.row.get('notes') or ''))
  if not m:
    raise SystemExit(f'{case.id}: notes name no pair (pair=NAME)')
  return m.group(1)


def _overlap_values(case, overlap):
  value = case.fixed.get(overlap) or case.axes.get(overlap, ['none'])
  return [value] if isinstance(value, str) else list(value)


def priced_s(suite, case, field, efficiency=None):
  """Predicted time (s) of ``case``; the overlapped row at
  ``efficiency`` when given."""
  from calculon.validation.published import price
  if efficiency is not None:
    case.fixed[field] = float(efficiency)
  try:
    res = price(case, suite.system(case))
  finally:
    case.fixed.pop(field, None)
  if res.status != 'ok':
    raise SystemExit(f'{case.id}: {res.status}: {res.reason}')
  return res.predicted_s


def fit(suite, field='tensor_par_overlap_efficiency'):
  """(efficiency, rows): the least-squares efficiency of ``field`` and,
  per pair, (name, measured speedup, predicted at 1, predicted at the
  fit)."""
  overlap, off, _ = FIELDS[field]
  pairs = {}
  for case in suite.cases:
    if not case.expressible:
      raise SystemExit(f"{case.id}: not priced: {'; '.join(case.missing)}")
    values = _overlap_values(case, overlap)
    if len(values) != 1:
      raise SystemExit(f'{case.id}: {overlap} is not fixed by the rules '
                       f'({"|".join(values)})')
    pairs.setdefault(pair_name(case), {})[values[0] != off] = case
  data = []
  for name, two in pairs.items():
    if set(two) != {False, True}:
      raise SystemExit(f'pair {name}: needs one row without the overlap '
                       'and one with it')
    plain, over = two[False], two[True]
    measured = plain.measured_s / over.measured_s
    data.append((name, measured, priced_s(suite, plain, field), over))

  def loss(eff):
    return sum(math.log(t_plain / priced_s(suite, over, field, eff) / m) ** 2
               for _, m, t_plain, over in data)

  from scipy.optimize import minimize_scalar
  best = minimize_scalar(loss, bounds=(0.0, 1.0), method='bounded',
                         options={'xatol': 1e-4})
  eff = round(float(best.x), 3)
  rows = [(name, m, t_plain / priced_s(suite, over, field, 1.0),
           t_plain / priced_s(suite, over, field, eff))
          for name, m, t_plain, over in data]
  return eff, rows


def main(argv=None):
  from calculon.validation.published import Suite
  p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  p.add_argument('--field', default='tensor_par_overlap_efficiency',
                 choices=sorted(FIELDS))
  p.add_argument('--pairs', help='A/B runs (default: the field\'s bundled '
                 'file)')
  args = p.parse_args(argv)
  pairs = args.pairs or os.path.join(ROOT, FIELDS[args.field][2])
  suite = Suite(ROOT, [pairs])
  eff, rows = fit(suite, args.field)
  print('| pair | measured speedup | predicted at 1 | '
        f'predicted at {eff} |')
  print('|---|---|---|---|')
  for name, m, full, fitted in rows:
    print(f'| {name} | {m:.3f} | {full:.3f} | {fitted:.3f} |')
  print(f'\n{args.field} = {eff}')


if __name__ == '__main__':
  main()
