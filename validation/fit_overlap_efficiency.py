"""Fits how much of an overlap a framework realizes
(``tensor_par_overlap_efficiency``) to measured A/B speedups of that
overlap, on runs outside the published suite.

    python validation/fit_overlap_efficiency.py [--field NAME] [--pairs CSV]
    python validation/fit_overlap_efficiency.py --layouts [CSV] [--min-tp N]

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

``--layouts`` fits the value from layouts of one model instead of A/B
pairs of the overlap: measured runs of the same configuration at
different TP (the same GPUs, batch, PP, VP and CP; DP takes the rest),
priced as above with the rows' own conventions (the fastest of the
overlap's candidates). A row at TP >= ``--min-tp`` (default 8) is priced
at the fitted value, its partner at a lower TP at 1 (it realizes the
overlap); the fitted value is the one whose predicted time ratios (the
higher TP's over the lower's) are closest, in least squares of their
logarithms, to the measured ones. A ratio, so that the level the datasheet
files miss by cancels: only how much slower the higher TP is enters.
Rows without a partner are listed and left out.

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

The bundled layouts (``--layouts``, default ``validation/layout_ab_runs.csv``):
NVIDIA's memory-tuning skill card (NVIDIA-NeMo/Megatron-Bridge
skills/nemo-mbridge-perf-memory-tuning/card.yaml @067f987df,
measured_results), Llama 3 70B SFT in FP8 current scaling on 32 H100: TP 4
PP 4 VP 5 at 704 and TP 8 PP 4 VP 5 at 508.7 TFLOP/s a GPU pair up (the
Megatron-Core presets' Transformer Engine overlap at TP 8); TP 4 PP 8 has
no partner.
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


def priced_s(suite, case, field, efficiency=None, overlapped=False):
  """Predicted time (s) of ``case``; the overlapped row at
  ``efficiency`` when given; ``overlapped``: only the candidates with the
  overlap (the fastest of its values the rules leave)."""
  from calculon.validation.published import price
  overlap, off, _ = FIELDS[field]
  axes = case.axes.get(overlap)
  if overlapped:
    values = [v for v in _overlap_values(case, overlap) if v != off]
    if not values:
      raise SystemExit(f'{case.id}: the rules leave no {overlap} but {off}')
    case.axes[overlap] = values
  if efficiency is not None:
    case.fixed[field] = float(efficiency)
  try:
    res = price(case, suite.system(case))
  finally:
    case.fixed.pop(field, None)
    if overlapped:
      case.axes[overlap] = axes
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


#: The columns two layouts of one configuration share (all but TP, DP).
LAYOUT_KEYS = ('num_layers', 'hidden', 'ffn_hidden',
               'attn_heads', 'kv_heads', 'seq_len', 'vocab', 'num_gpus',
               'gpu_type', 'pp', 'cp', 'vp', 'global_batch_size',
               'micro_batch_size', 'recompute', 'seq_parallel', 'dtype')
LAYOUTS = 'validation/layout_ab_runs.csv'


def _layout_key(case):
  row = case.row
  return tuple(str(row.get(k) or '').strip() for k in LAYOUT_KEYS)


def fit_layouts(suite, field='tensor_par_overlap_efficiency', min_tp=8):
  """(efficiency, rows, unpaired): the least-squares ``field`` for the
  rows at TP >= ``min_tp`` against their partners at a lower TP (priced
  at 1); per pair (name, measured ratio, predicted at 1, predicted at the
  fit) with ratio = higher TP's time / lower TP's; the ids of rows
  without a partner.

  Raises:
    SystemExit: a row is not priced, or no pair is found.
  """
  groups = {}
  for case in suite.cases:
    if not case.expressible:
      raise SystemExit(f"{case.id}: not priced: {'; '.join(case.missing)}")
    groups.setdefault(_layout_key(case), []).append(case)
  data, unpaired = [], []
  for cases in groups.values():
    high = [c for c in cases if int(c.row['tp']) >= min_tp]
    low = [c for c in cases if int(c.row['tp']) < min_tp]
    if not high or not low:
      unpaired += [c.id for c in cases]
      continue
    for h in high:
      for lo in low:
        name = (f"TP {lo.row['tp']} -> {h.row['tp']} (PP {h.row['pp']}, "
                f"VP {h.row['vp'] or 1}, {h.row['num_gpus']} GPUs)")
        data.append((name, h.measured_s / lo.measured_s,
                     priced_s(suite, lo, field, 1.0, True), h))
  if not data:
    raise SystemExit(f'no layouts pair up at TP >= {min_tp} and below')

  def loss(eff):
    return sum(math.log(priced_s(suite, h, field, eff, True) / t_low / m) ** 2
               for _, m, t_low, h in data)

  from scipy.optimize import minimize_scalar
  best = minimize_scalar(loss, bounds=(0.0, 1.0), method='bounded',
                         options={'xatol': 1e-4})
  eff = round(float(best.x), 3)
  rows = [(name, m, priced_s(suite, h, field, 1.0, True) / t_low,
           priced_s(suite, h, field, eff, True) / t_low,
           priced_s(suite, h, field, 0.0, True) / t_low,
           priced_s(suite, h, field, None) / t_low)
          for name, m, t_low, h in data]
  return eff, rows, unpaired


def main(argv=None):
  from calculon.validation.published import Suite
  p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  p.add_argument('--field', default='tensor_par_overlap_efficiency',
                 choices=sorted(FIELDS))
  p.add_argument('--pairs', help='A/B runs (default: the field\'s bundled '
                 'file)')
  p.add_argument('--layouts', nargs='?', const=LAYOUTS, metavar='CSV',
                 help='fit from layouts of one model at different TP '
                 f'instead (default file: {LAYOUTS})')
  p.add_argument('--min-tp', type=int, default=8,
                 help='with --layouts: the TP from which a row is priced at '
                 'the fitted value (default 8)')
  args = p.parse_args(argv)
  if args.layouts:
    suite = Suite(ROOT, [os.path.join(ROOT, args.layouts)])
    eff, rows, unpaired = fit_layouts(suite, args.field, args.min_tp)
    print('| layouts | measured time ratio | predicted at 1 | '
          f'predicted at {eff} | predicted at 0 | as the suite prices it |')
    print('|---|---|---|---|---|---|')
    for name, m, full, fitted, zero, suite_ratio in rows:
      print(f'| {name} | {m:.3f} | {full:.3f} | {fitted:.3f} | {zero:.3f} '
            f'| {suite_ratio:.3f} |')
    if unpaired:
      print('\nno partner (left out): ' + ', '.join(unpaired))
    print(f'\n{args.field} = {eff} (TP >= {args.min_tp})')
    return
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
