"""Fit the serving presets' bounded parameters on AIConfigurator's
silicon sample, cross-validated.

The parameters, per framework, bounded and physical:

* ``step_overhead_s`` in [0, 20 ms]: host time of every iteration that the
  GPU work does not hide (scheduling, input preparation, sampling,
  detokenization, launch gaps between graphs);
* ``roofline_efficiency`` in [0.5, 1]: the share of the roofline
  (max(FLOP time, bytes time)) the kernels reach, dividing every GPU time
  of a step;
* ``arrival_burst`` in [0, 1]: the share of a closed loop's users whose
  requests arrive together (equal-length requests that finished together:
  1 = synchronized waves, 0 = evenly staggered arrivals).

The rows: ``aiconfigurator_core/systems/silicon_sample.csv`` (package
aiconfigurator-core 0.12.0, Apache-2.0; not bundled: pass its path), its
aggregated runs of the models bundled here, less every run that
``../shared/measurements/serving_runs.csv`` cites (those stay unseen by
the fit); both TTFT and TPOT.  The physics of each row is priced once
(:func:`calculon.serving.price.price` with the three parameters at their
neutral values, keeping the steady state's inputs and its decode step
and piggybacked-decode cost at every running batch 1..C), so the
closed loop is re-priced at trial parameters exactly as the engine
prices it; the parameters are then found by grid search minimizing the
mean |log(predicted / measured)|.  Cross-validation:
leave one model out (fit on the others, predict the model's rows).

Run: ``python -m calculon.validation.serving_fit SILICON.csv [--every N]``.

Reads: the silicon sample, :mod:`calculon.validation.serving`.
"""

import argparse
import csv
import math
import os
import re
import sys
from types import SimpleNamespace

import numpy as np

from calculon.serving import batching

#: Silicon sample model paths -> the serving suite's model names.
MODEL = {
  'meta-llama/Llama-3.1-70B': 'Llama-3.1-70B',
  'meta-llama/Llama-3.1-8B-Instruct': 'Llama-3.1-8B',
  'nvidia/Llama-3.1-8B-Instruct-FP8': 'Llama-3.1-8B',
  'deepseek-ai/DeepSeek-R1': 'DeepSeek-R1',
  'deepseek-ai/DeepSeek-V3': 'DeepSeek-V3',
  'nvidia/DeepSeek-R1-NVFP4': 'DeepSeek-R1',
  'openai/gpt-oss-120b': 'gpt-oss-120b', 'Qwen/Qwen3-32B': 'Qwen3-32B',
  'nvidia/Qwen3-32B-NVFP4': 'Qwen3-32B',
  'Qwen/Qwen3-235B-A22B-FP8': 'Qwen3-235B-A22B'}
GPU = {'h100_sxm': 'H100 SXM', 'h200_sxm': 'H200 SXM', 'b200_sxm': 'B200',
       'gb200': 'GB200', 'b300_sxm': 'B300', 'gb300': 'GB300'}
OVERHEADS_S = np.arange(0, 20.01e-3, 0.5e-3)
BURSTS = np.linspace(0, 1, 11)
EFFICIENCIES = np.linspace(0.5, 1.0, 6)


def silicon_rows(path, exclude_ids, every=1):
  """The silicon sample's aggregated runs as serving-suite rows (TTFT and
  TPOT each), without ``exclude_ids``; every ``every``-th run."""
  runs = []
  with open(path, newline='', encoding='utf-8') as f:
    for r in csv.DictReader(f):
      if r['mode'] != 'agg' or r['model_path'] not in MODEL or \
          r['id'] in exclude_ids or r['system'] not in GPU:
        continue
      runs.append(r)
  runs.sort(key=lambda r: r['id'])
  out = []
  for r in runs[::every]:
    tp, pp = int(r['tp_size']), int(r['pp_size'])
    adp = int(r['attention_dp_size'] or 1) or 1
    conc = int(r['batch_size']) * adp
    notes = (f"attention_dp={adp}, moe_tp={r['moe_tp_size'] or 1}, "
             f"moe_ep={r['moe_ep_size'] or 1}; silicon_concurrency={conc}")
    base = dict(source='silicon ' + r['id'], model=MODEL[r['model_path']],
                gpu=GPU[r['system']], num_gpus=str(tp * pp * adp),
                tp=str(tp), pp=str(pp), ep='', precision=r['precision'],
                framework=r['backend'], isl=r['isl'], osl=r['osl'],
                concurrency_or_rate=f'concurrency={conc}', notes=notes)
    for metric, col in (('ttft_ms', 'silicon_ttft_ms'),
                        ('tpot_ms', 'silicon_tpot_ms')):
      if r[col]:
        out.append(dict(base, id=f"{r['id']}:{metric}", metric=metric,
                        value=r[col]))
  return out


def cited_ids(serving_runs):
  """Silicon-sample run ids that the serving suite's rows cite."""
  ids = set()
  with open(serving_runs, newline='', encoding='utf-8') as f:
    for r in csv.DictReader(f):
      m = re.search(r'row id=(\S+)', r['source'])
      if m:
        ids.add(m.group(1))
  return ids


def steady_inputs(rows, base_dir):
  """Prices each row once with the three parameters neutral; returns the
  rows the steady state can re-price (closed loops): list of dicts with
  the steady-state inputs, 'dec_table' and 'ride_table' (seconds of a
  decode step and of decodes piggybacked on a prefill iteration at the
  running batches 1..ceil(run)), the per-rank users and the measured
  value."""
  from calculon import io
  from calculon.errors import ConfigError
  from calculon.serving import deployment as D
  from calculon.serving.price import price
  from calculon.validation.serving import SERVER_KEY, deployment_of, \
    metric_kind
  out, cache = [], {}
  for row in rows:
    got = deployment_of(row, base_dir)
    if isinstance(got, str):
      continue
    app_path, sys_path, fields, _, _, kind = got
    if SERVER_KEY in fields:
      continue
    key = (app_path, sys_path, tuple(sorted(fields.items())))
    if key not in cache:
      try:
        app, system = io.load_application(app_path), io.load_system(sys_path)
        dep = D.resolve(D.read_deployment(fields, row['id']), app, system)
        dep.preset = dict(dep.preset, step_overhead_s=None,
                          arrival_burst=None, roofline_efficiency=None)
        res = price(app, system, dep)
      except ConfigError:
        res = None
      cache[key] = (res, dep if res is not None else None)
    res, dep = cache[key]
    if res is None or not res['feasible'] or 'steady' not in res:
      continue
    st = dict(res['steady'])
    grid = np.arange(1, math.ceil(float(np.ravel(st['run'])[0])) + 1.0)
    st['dec_table'] = np.ravel(np.asarray(st.pop('t_dec_of')(grid), float))
    st['ride_table'] = np.ravel(np.asarray(st.pop('t_ride_of')(grid), float))
    per_rank = max(math.ceil(fields['concurrency'] /
                             fields.get('attention_dp', 1)), 1)
    out.append(dict(st, kind=metric_kind(row['metric']),
                    measured=float(row['value']), per_rank=per_rank,
                    framework=fields['framework'], model=row['model']))
  return out


class Prepared(SimpleNamespace):
  """The items' steady-state inputs as arrays, built once for the many
  trial parameters of a fit (:func:`prepare`)."""


def prepare(items):
  """Items (from :func:`steady_inputs`) as a :class:`Prepared` of arrays;
  a :class:`Prepared` is returned as it is."""
  if isinstance(items, Prepared):
    return items
  p = Prepared()
  get = lambda k: np.array([float(np.ravel(i[k])[0]) for i in items])
  p.run, p.isl, p.osl = get('run'), get('isl'), get('osl')
  p.t_dec, p.tau, p.q = get('t_dec'), get('tau'), get('q')
  p.per_rank = get('per_rank')
  # Items without the term (a preset without a prefill dispatch) pay none.
  p.pre_host = np.array([float(np.ravel(i.get('prefill_host_s', 0.0))[0])
                         for i in items])
  p.measured = get('measured')
  p.mixed = np.array([bool(i['mixed']) for i in items])
  p.ttft = np.array([i['kind'] == 'ttft' for i in items])
  p.rows = np.arange(len(items))
  p.tables = all('dec_table' in i for i in items)
  if p.tables:
    width = max(len(i['dec_table']) for i in items)
    pad = lambda k: np.array([np.pad(i[k], (0, width - len(i[k])),
                                     mode='edge') for i in items])
    p.dec, p.ride = pad('dec_table'), pad('ride_table')
    p.top = np.array([len(i['dec_table']) for i in items])
  return p


def _table_of(p, table, efficiency, slope=None):
  """A vectorized step function from a prepared table (seconds at the
  batches 1, 2, ..., ceil(run)).  As the engine's decode step, a
  fractional batch c is priced at ceil(c) sequences, less (ceil(c) - c) x
  ``slope`` (per-sequence seconds that scale with c itself: the
  piggybacked decodes' FLOP at the prefill's per-token time)."""
  per = (0.0 if slope is None else slope) / efficiency

  def of(c):
    whole = np.clip(np.ceil(c), 1, p.top).astype(np.int64)
    return (table[p.rows, whole - 1] / efficiency -
            (whole - np.maximum(c, 1.0)) * per)
  return of


def predict(items, overhead, burst, efficiency=1.0):
  """TTFT or TPOT (ms) of each item at the parameters (arrays).  Items
  from :func:`steady_inputs` carry the decode step and the piggybacked
  decodes' cost as tables over the running batch, so the fit prices a
  closed loop as :func:`calculon.serving.price.price` does; ``items``
  may be a :func:`prepare` of them."""
  p = prepare(items)
  t_dec, tau = p.t_dec / efficiency, p.tau / efficiency
  group = np.clip(np.round(burst * p.run), 1, p.run)
  dec_of = ride_of = None
  if p.tables:
    dec_of = _table_of(p, p.dec, efficiency)
    ride_of = _table_of(p, p.ride, efficiency, slope=p.tau)
  out_m = batching.closed_loop(p.run, p.isl, p.osl, t_dec, tau, p.q, True,
                               group, overhead, dec_of, ride_of,
                               prefill_host_s=p.pre_host)
  out_u = batching.closed_loop(p.run, p.isl, p.osl, t_dec, tau, p.q, False,
                               group, overhead, prefill_host_s=p.pre_host)
  pick = lambda k: np.where(p.mixed, out_m[k], out_u[k])
  W, ttft, X = pick('latency_s'), pick('ttft_s'), pick('requests_per_s')
  cycle = p.per_rank / X
  tpot = np.where(p.osl > 1, (W - ttft) / np.maximum(p.osl - 1, 1), 0.0)
  ttft = ttft + (cycle - W)
  return np.where(p.ttft, ttft, tpot) * 1e3


def fit(items):
  """(overhead_s, burst, efficiency) minimizing the mean |log(pred /
  measured)| over the grids."""
  p = prepare(items)
  best = (math.inf, 0.0, 0.0, 1.0)
  for e in EFFICIENCIES:
    for o in OVERHEADS_S:
      for b in BURSTS:
        err = np.mean(np.abs(np.log(predict(p, o, b, e) / p.measured)))
        if err < best[0]:
          best = (err, o, b, e)
  return best[1:]


def median_abs_pct(items, pred):
  meas = np.array([i['measured'] for i in items])
  return float(np.median(np.abs(100 * (pred / meas - 1))))


def main(argv=None):
  ap = argparse.ArgumentParser(prog='python -m calculon.validation.'
                               'serving_fit', description=__doc__.split(
                                 '\n\n')[0])
  ap.add_argument('silicon', help='aiconfigurator_core/systems/'
                  'silicon_sample.csv')
  ap.add_argument('--every', type=int, default=4,
                  help='fit on every N-th run (default 4)')
  ap.add_argument('--cache', default=None, help='pickle of the priced '
                  'rows (written when missing, read when present)')
  ap.add_argument('--runs', default=None, help='serving_runs.csv whose '
                  'cited runs are left out (default ../shared/...)')
  args = ap.parse_args(argv)
  base = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
  runs = args.runs or os.path.join(os.path.dirname(base), 'shared',
                                   'measurements', 'serving_runs.csv')
  rows = silicon_rows(args.silicon, cited_ids(runs), args.every)
  if args.cache and os.path.exists(args.cache):
    import pickle
    with open(args.cache, 'rb') as f:
      items = pickle.load(f)
  else:
    items = steady_inputs(rows, base)
    if args.cache:
      import pickle
      with open(args.cache, 'wb') as f:
        pickle.dump(items, f)
  print(f'{len(rows)} silicon rows, {len(items)} priced closed loops')
  for fw in ('trtllm', 'vllm', 'sglang'):
    sub = [i for i in items if i['framework'] == fw]
    if not sub:
      continue
    o, b, e = fit(sub)
    by = {k: [i for i in sub if i['kind'] == k] for k in ('ttft', 'tpot')}
    base_err = {k: median_abs_pct(v, predict(v, 0.0, 0.0))
                for k, v in by.items()}
    fit_err = {k: median_abs_pct(v, predict(v, o, b, e))
               for k, v in by.items()}
    # Leave one model out.
    cv = {'ttft': [], 'tpot': []}
    for model in sorted({i['model'] for i in sub}):
      train = [i for i in sub if i['model'] != model]
      test = [i for i in sub if i['model'] == model]
      if not train:
        continue
      pred = predict(test, *fit(train))
      for i, p in zip(test, pred):
        cv[i['kind']].append(abs(100 * (p / i['measured'] - 1)))
    cv = {k: float(np.median(v)) if v else None for k, v in cv.items()}
    print(f'{fw}: {len(sub)} rows ({len({i["model"] for i in sub})} '
          f'models); step_overhead_s = {o:.5f}, arrival_burst = {b:.2f}, '
          f'roofline_efficiency = {e:.2f}; '
          f'median |error| TTFT/TPOT: unfitted {base_err["ttft"]:.1f} / '
          f'{base_err["tpot"]:.1f} %, fitted {fit_err["ttft"]:.1f} / '
          f'{fit_err["tpot"]:.1f} %, leave-one-model-out '
          f'{cv["ttft"]:.1f} / {cv["tpot"]:.1f} %', flush=True)
  return 0


if __name__ == '__main__':
  sys.exit(main())
