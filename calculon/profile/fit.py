"""From measurements to the system file's numbers (pure functions).

Curves are in the system file's format: ``[[threshold, efficiency], ...]``
with thresholds (GFLOP or MB, SI) strictly decreasing and ending at 0, and
efficiencies in (0, 1] (calculon/config/system.py).
"""

import math
import statistics

import numpy as np

#: Lowest efficiency written (the loader needs > 0).
EFFICIENCY_FLOOR = 0.001


def isotonic_increasing(values, weights=None):
  """Least-squares non-decreasing fit of ``values`` (pool adjacent
  violators; Barlow et al. 1972, "Statistical inference under order
  restrictions", ch. 1).

  Returns:
    list of floats, same length, non-decreasing.
  """
  weights = [1.0] * len(values) if weights is None else list(weights)
  blocks = []   # [mean, weight, count]
  for v, w in zip(values, weights):
    blocks.append([float(v), float(w), 1])
    while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
      m2, w2, c2 = blocks.pop()
      m1, w1, c1 = blocks.pop()
      blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, c1 + c2])
  out = []
  for mean, _, count in blocks:
    out += [mean] * count
  return out


def _round_down(x, digits=3):
  """``x`` rounded down to ``digits`` significant digits (> 0)."""
  if x <= 0:
    return 0.0
  exp = math.floor(math.log10(x)) - digits + 1
  return float(f'{math.floor(x / 10 ** exp)}e{exp}')


def bucket_medians(sizes, values, per_octave=1):
  """Groups points by size on a log2 grid (nearest power of 2); returns [(smallest size in the
  bucket, median value, count)] sorted by size."""
  groups = {}
  for s, v in zip(sizes, values):
    key = round(math.log2(s) * per_octave)
    groups.setdefault(key, []).append((s, v))
  out = []
  for key in sorted(groups):
    pts = groups[key]
    out.append((min(s for s, _ in pts), statistics.median(v for _, v in pts),
                len(pts)))
  return out


def efficiency_curve(sizes, throughputs, peak, unit_scale, monotone=True):
  """A system-file curve from measured (size, throughput) points.

  Args:
    sizes: operation sizes in base units (FLOP or bytes).
    throughputs: achieved rate of each point (FLOP/s or bytes/s).
    peak: the rate that efficiency 1 means.
    unit_scale: base units per threshold unit (1e9 for GFLOP, 1e6 for MB).
    monotone: fit a non-decreasing efficiency (larger operations are never
      less efficient: tiles fill, launch cost amortizes), else keep each
      bucket's median (memory, where caches make small copies faster).

  Returns:
    ``[[threshold, efficiency], ...]``, thresholds strictly decreasing to 0;
    a size gets the efficiency of the largest measured bucket not above it,
    and sizes below the smallest bucket get the smallest bucket's; a run of
    buckets with equal efficiency is written once.
  """
  buckets = bucket_medians(sizes, [t / peak for t in throughputs])
  effs = [b[1] for b in buckets]
  if monotone:
    effs = isotonic_increasing(effs, [b[2] for b in buckets])
  pts = []
  for (size, _, _), eff in zip(buckets, effs):
    threshold = _round_down(size / unit_scale)
    eff = round(min(1.0, max(EFFICIENCY_FLOOR, eff)), 4)
    if pts and threshold <= pts[-1][0]:
      pts[-1][1] = eff
      continue
    pts.append([threshold, eff])
  pts[0][0] = 0
  merged = []   # a run of equal efficiencies needs only its smallest size
  for t, e in pts:
    if not merged or merged[-1][1] != e:
      merged.append([t, e])
  return [[t if t else 0, e] for t, e in reversed(merged)]


def curve_lookup(curve, size, unit_scale):
  """Efficiency of ``size`` (base units) under calculon's rule: the first
  threshold <= size."""
  for threshold, eff in curve:
    if threshold * unit_scale <= size:
      return eff
  return curve[-1][1]


def theil_sen(x, y):
  """Robust line y = a + b x: b the median of pairwise slopes, a the median
  of y - b x (Theil 1950; Sen 1968).

  Returns:
    (intercept, slope).
  """
  x, y = np.asarray(x, float), np.asarray(y, float)
  slopes = [(y[j] - y[i]) / (x[j] - x[i]) for i in range(len(x))
            for j in range(i + 1, len(x)) if x[j] != x[i]]
  slope = float(np.median(slopes)) if slopes else 0.0
  return float(np.median(y - slope * x)), slope


#: calculon's (scalar, offset) per op for ring algorithms (Calculon's
#: network model; Thakur et al. 2005): n bytes among p peers move
#: n * scalar * (1 + offset / p) bytes -- exactly nccl-tests' bus factors.
CANONICAL_OPS = {'all_reduce': (2.0, -1.0), 'reduce_scatter': (1.0, -1.0),
                 'all_gather': (1.0, -1.0), 'p2p': (1.0, None)}


def network_tier(points, procs):
  """A network tier's numbers from collective measurements.

  calculon prices an operation of S bytes as t = L + S f / (B e)
  (calculon/hardware/network.py, f the op's bus factor through its
  (scalar, offset)).  Each op's asymptotic bus bandwidth is 1 / slope of a
  Theil-Sen line of t against S f over the larger half of its sizes (the
  large-size median of busbw = S f / t when the slope is not positive);
  the latency is the intercept of the same line for all-reduce over the
  smaller half.

  Args:
    points: dicts with op, bytes (S), seconds, busbw (bytes/s).
    procs: ranks measured.

  Returns:
    dict: bandwidth_Bps (the largest bus bandwidth of any op, asymptotic
    or measured, so that every efficiency is <= 1), efficiency (all-reduce
    asymptotic busbw / bandwidth), latency_s (>= 0), ops ({op: [scalar,
    offset]}: the canonical scalar times busbw_AR / busbw_op, so each op's
    time matches at large sizes), busbw_Bps (asymptotic, per op).

  Raises:
    ValueError: no all-reduce points.
  """
  by_op = {}
  for p in points:
    by_op.setdefault(p['op'], []).append(p)
  if 'all_reduce' not in by_op:
    raise ValueError('no all_reduce measurement')
  asym = {}
  for op, pts in by_op.items():
    pts = sorted(pts, key=lambda p: p['bytes'])
    factor = pts[0]['busbw'] * pts[0]['seconds'] / pts[0]['bytes']
    big = pts[len(pts) // 2:] if len(pts) >= 4 else pts
    _, slope = theil_sen([p['bytes'] * factor for p in big],
                         [p['seconds'] for p in big])
    if slope > 0:
      asym[op] = 1.0 / slope
    else:
      asym[op] = statistics.median(p['busbw'] for p in big)
  bandwidth = max(max(asym.values()), max(p['busbw'] for p in points))
  efficiency = min(1.0, asym['all_reduce'] / bandwidth)
  ar = sorted(by_op['all_reduce'], key=lambda p: p['bytes'])
  small = ar[:max(2, (len(ar) + 1) // 2)]
  factor = 2.0 * (procs - 1) / procs
  latency, _ = theil_sen([p['bytes'] * factor for p in small],
                         [p['seconds'] for p in small])
  ops = {}
  for op, (scalar, offset) in CANONICAL_OPS.items():
    ratio = asym['all_reduce'] / asym[op] if op in asym else 1.0
    ops[op] = [round(scalar * ratio, 4), offset]
  return {'bandwidth_Bps': bandwidth, 'efficiency': efficiency,
          'latency_s': max(0.0, latency), 'ops': ops, 'busbw_Bps': asym}
