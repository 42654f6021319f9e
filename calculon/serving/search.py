"""Search deployments under service targets (``calculon serve-search``).

For ``gpus`` GPUs, a workload (isl, osl) and optional targets (TTFT,
TPOT), :func:`search` tries every worker parallelism that fits the model
(TP dividing the heads and widths and a multiple or divisor of the K/V
heads; PP dividing nothing but at most the blocks; for MoE models, EP
over the worker's GPUs with attention DP 1 or the worker's GPUs), every
replica count that fills the GPUs, a column of concurrencies per
replica (priced in one vectorized pass), aggregated, and disaggregated
with every prefill/decode split of the GPUs into workers of the same
worker size; it keeps the deployments that meet the targets and ranks
them by output tokens/s per GPU (ties: the higher tokens/s per user, then
the fewer GPUs per worker).

:func:`highest_rate` finds the highest request rate one deployment
serves within the targets (MLPerf Inference's Server scenario).

Reads: :mod:`calculon.serving.price`, :mod:`calculon.serving.deployment`.
"""

import numpy as np

from calculon.errors import ConfigError
from calculon.serving import deployment as D
from calculon.serving import frameworks
from calculon.serving.price import price

#: Concurrencies per replica the search prices (powers of two and their
#: midpoints, up to 4,096).
CONCURRENCIES = np.array(sorted({int(x) for k in range(13)
                                 for x in (2 ** k, 1.5 * 2 ** k)}))


def _divisors(n):
  return [d for d in range(1, n + 1) if n % d == 0]


def workers(app, gpus):
  """(tp, pp, attention_dp) of the workers to try: TP that fits the
  model, TP x PP x attention DP dividing ``gpus``, PP <= 4 (serving runs
  pipelines only when a model does not fit a node)."""
  out = []
  for tp in _divisors(gpus):
    if app.attn_heads % tp or app.hidden % tp or app.feedforward % tp:
      continue
    kv = app.kv_heads
    if kv is not None and not app.is_mla and kv % tp and tp % kv:
      continue
    for pp in (1, 2, 4):
      if gpus % (tp * pp) or pp > app.num_blocks:
        continue
      adps = [1]
      if app.is_moe and tp > 1:
        adps.append(tp)
      for adp in adps:
        wtp = tp // adp if adp > 1 else tp
        if adp > 1 and gpus % (wtp * pp * adp):
          continue
        out.append((wtp, pp, adp))
  return sorted(set(out))


def _fields(base, tp, pp, adp, app, ep=None):
  f = dict(base)
  f.update(tensor_par=tp, pipeline_par=pp, attention_dp=adp)
  if app.is_moe:
    f['expert_par'] = ep or tp * adp
    f['expert_tensor_par'] = 1
    if app.num_experts % f['expert_par']:
      return None
  return f


def search(app, system, base, gpus, ttft_ms=None, tpot_ms=None, top=5,
           disaggregated=True):
  """The best deployments (list of dicts: 'fields' (the deployment
  JSON), 'figures' (from :func:`~calculon.serving.price.price`, scalars),
  'meets' (bool)), best first, at most ``top``; plus every point priced
  (for the chart): a list of (per_gpu, per_user, meets).

  Args:
    base: deployment fields shared by every candidate (framework,
      datatypes, isl, osl...).
  """
  rows, points = [], []

  def consider(fields, res, conc_col, replicas, gpus_used):
    ok = np.broadcast_to(res['feasible'], np.shape(res['tpot_ms'])) & \
      np.isfinite(res['tpot_ms'])
    meets = ok.copy()
    if ttft_ms is not None:
      meets &= res['ttft_ms'] <= ttft_ms
    if tpot_ms is not None:
      meets &= res['tpot_ms'] <= tpot_ms
    per_gpu = res['output_tokens_per_s'] * replicas / gpus
    per_user = res['output_tokens_per_s_per_user']
    for i in range(np.size(per_gpu)):
      if not ok.flat[i]:
        continue
      points.append((float(np.ravel(per_gpu)[i]), float(np.ravel(
        per_user)[i]), bool(meets.flat[i])))
      if not meets.flat[i]:
        continue
      fig = {k: float(np.ravel(v)[i]) if np.size(v) > 1 else float(
        np.ravel(v)[0]) for k, v in res.items()
        if k in ('ttft_ms', 'tpot_ms', 'latency_ms', 'output_tokens_per_s',
                 'output_tokens_per_s_per_user', 'input_tokens_per_s',
                 'concurrency', 'gpus')}
      fig['output_tokens_per_s_per_gpu'] = float(np.ravel(per_gpu)[i])
      fig['replicas'] = replicas
      out = dict(fields)
      out['concurrency'] = int(np.ravel(conc_col)[i])
      rows.append({'fields': out, 'figures': fig, 'meets': True})

  for tp, pp, adp in workers(app, gpus):
    fields = _fields(base, tp, pp, adp, app)
    if fields is None:
      continue
    try:
      dep = D.resolve(D.read_deployment(fields, '<search>'), app, system,
                      '<search>')
    except ConfigError:
      continue
    size = tp * pp * adp
    replicas = gpus // size
    conc = CONCURRENCIES[CONCURRENCIES <= dep.max_num_seqs * adp]
    res = price(app, system, dep, concurrency=conc)
    if not res['feasible']:
      continue
    consider(fields, res, conc, replicas, gpus)
    if not disaggregated or gpus // size < 2 or \
        'disaggregated' not in frameworks.modes(dep.preset):
      continue
    workers_total = gpus // size
    for x in range(1, workers_total):
      y = workers_total - x
      dfields = dict(fields, mode='disaggregated', prefill_workers=x,
                     decode_workers=y)
      try:
        ddep = D.resolve(D.read_deployment(dfields, '<search>'), app,
                         system, '<search>')
      except ConfigError:
        continue
      dconc = conc[conc <= ddep.max_num_seqs * adp * y]
      dres = price(app, system, ddep, concurrency=dconc * y)
      if dres['feasible']:
        consider(dfields, dres, dconc * y, 1, gpus)
  rows.sort(key=lambda r: (-r['figures']['output_tokens_per_s_per_gpu'],
                           -r['figures']['output_tokens_per_s_per_user'],
                           r['fields']['tensor_par'] *
                           r['fields']['pipeline_par']))
  return rows[:top], points


def highest_rate(app, system, fields, ttft_ms=None, tpot_ms=None,
                 iterations=40):
  """The highest Poisson request rate (requests/s, the whole deployment)
  one deployment serves within the targets, and its figures.

  The open loop (:func:`calculon.serving.batching.open_loop`) is feasible
  while prefill takes less than the whole GPU and the running batch stays
  within the limits; the rate is found by bisection in log space between
  a rate that meets the targets and one that does not (the figures grow
  with the rate).  As MLPerf Inference's Server scenario (mlcommons/
  inference loadgen/mlperf.conf: the highest ``target_qps`` whose TTFT
  and TPOT stay within ``ttft_latency`` and ``tpot_latency``), with the
  model's mean figures in place of the 99th percentiles.

  Args:
    fields: deployment fields without a load (a ``request_rate`` is set
      here).
    ttft_ms, tpot_ms: targets, or None.

  Returns:
    (rate, figures of :func:`~calculon.serving.price.price`), or (None,
    None) when not even a rate of 1e-4 requests/s meets them.

  Raises:
    ConfigError: the fields do not make a deployment.
  """
  def meets(rate):
    dep = D.resolve(D.read_deployment(dict(fields, request_rate=rate),
                                      '<server>'), app, system, '<server>')
    res = price(app, system, dep)
    ok = bool(res['feasible'])
    if ok and ttft_ms is not None:
      ok = float(np.ravel(res['ttft_ms'])[0]) <= ttft_ms
    if ok and tpot_ms is not None:
      ok = float(np.ravel(res['tpot_ms'])[0]) <= tpot_ms
    return ok, res

  lo, hi = 1e-4, 1.0
  ok, res = meets(lo)
  if not ok:
    return None, None
  best = res
  while True:
    ok, res = meets(hi)
    if not ok:
      break
    lo, best, hi = hi, res, hi * 4
    if hi > 1e7:
      return lo, best
  for _ in range(iterations):
    mid = (lo * hi) ** 0.5
    ok, res = meets(mid)
    if ok:
      lo, best = mid, res
    else:
      hi = mid
    if hi / lo < 1.0005:
      break
  return lo, best


def pareto(points):
  """The Pareto front of (per_gpu, per_user) points: no other point is
  at least as good in both and better in one.  Sorted by per_user."""
  pts = sorted(set((a, b) for a, b, _ in points), key=lambda p: (-p[1],
                                                                 -p[0]))
  front, best = [], -1.0
  for a, b in pts:
    if a > best:
      front.append((a, b))
      best = a
  return sorted(front, key=lambda p: p[1])
