"""The plan of benchmarks, and the system file built from their results.

Mapping (docs/profile.md has the full table):

* ``matrix.<dtype>``: ``tflops`` = the best GEMM throughput measured (a
  MAMF-style measured peak: Bekman, ml-engineering, mamf-finder.py), and
  ``gflops_efficiency`` = the median efficiency of the shapes of each size
  octave, fitted non-decreasing in size;
* ``vector.<dtype>``: likewise over calculon's vector operations (layer
  norm, softmax, GeLU, dropout, residual add) in calculon's FLOP counts;
* ``mem1``: ``GBps`` = the best copy bandwidth, ``MB_efficiency`` per size;
  ``GiB`` from the device (CUDA) or psutil (host memory / processes);
* ``mem2``: a GPU's pinned host memory (slower of host-to-device and
  device-to-host per size); on the CPU there is no second tier;
* ``networks[0]``: the ``--procs`` local processes (see
  :func:`calculon.profile.fit.network_tier`).

A benchmark that keeps failing leaves its fields at :data:`DEFAULTS`.
"""

import math
import os

from calculon.profile.bench_network import OPS
from calculon.profile.fit import efficiency_curve, network_tier
from calculon.profile.runner import BenchSpec

#: Placeholder values written when a benchmark failed (marked as defaults
#: in the summary and in profile.json): per device, matrix / vector TFLOP/s
#: per datatype, mem1 and mem2 GB/s, network GB/s and latency (s).  They
#: are round orders of magnitude, not measurements.
DEFAULTS = {
  'cpu': {'matrix_tflops': 0.1, 'vector_tflops': 0.01, 'mem1_GBps': 10.0,
          'mem2_GBps': 1.0, 'net_GBps': 1.0, 'net_latency_s': 1e-4},
  'cuda': {'matrix_tflops': 100.0, 'vector_tflops': 10.0, 'mem1_GBps': 1000.0,
           'mem2_GBps': 16.0, 'net_GBps': 100.0, 'net_latency_s': 1e-5},
}

#: Why the file's processing mode is roofline: every curve is measured on
#: whole operations, memory traffic included, so an operation takes its
#: compute time or its memory time, whichever is larger; 'no_overlap'
#: would count the traffic twice.
PROCESSING_MODE = 'roofline'


#: ``--smoke`` sizes: every benchmark at tiny sizes, to check the setup
#: in seconds (the numbers then describe overheads, not the machine).
SMOKE_SIZES = {'gemm_flop': [2 ** 16, 2 ** 18], 'vector': [2 ** 10, 2 ** 12],
               'mem': [2 ** 12, 2 ** 14], 'net': [2 ** 12, 2 ** 14]}


def _cpu_sizes(quick):
  return {
    'gemm_flop': [2 ** e for e in range(23, 32, 2)] if quick else
    [2 ** e for e in range(21, 35)],
    'vector': [2 ** 14, 2 ** 17, 2 ** 20, 2 ** 22] if quick else
    [2 ** e for e in range(12, 25, 2)],
    'mem': [2 ** e for e in range(16, 27, 2)] if quick else
    [2 ** e for e in range(14, 29)],
    'net': [2 ** e for e in range(12, 25, 4)] if quick else
    [2 ** e for e in range(10, 27, 2)],
  }


def _cuda_sizes(quick):
  return {
    'gemm_flop': [2 ** e for e in range(27, 45, 3)] if quick else
    [2 ** e for e in range(25, 45)],
    'vector': [2 ** e for e in range(16, 29, 4)] if quick else
    [2 ** e for e in range(12, 29, 2)],
    'mem': [2 ** e for e in range(16, 31, 4)] if quick else
    [2 ** e for e in range(14, 31)],
    'net': [2 ** e for e in range(12, 29, 4)] if quick else
    [2 ** e for e in range(10, 29, 2)],
  }


def _round16(x):
  return max(16, int(round(x / 16.0)) * 16)


def gemm_shapes(flop_targets, device):
  """[b, m, n, k] shapes of about each target FLOP count, four families so
  that every size has each (2 b m n k = target): square n x n x n; a
  projection of 4n tokens, 4n x n x n; and attention-like batches of 16
  heads (head size d = 64 on a CPU, 128 on a GPU), scores n x n x d and
  context n x d x n."""
  d = 128 if device == 'cuda' else 64
  shapes = []
  for f in flop_targets:
    n = _round16((f / 2) ** (1 / 3))
    shapes.append([1, n, n, n])
    n = _round16((f / 8) ** (1 / 3))
    shapes.append([1, 4 * n, n, n])
    n = _round16((f / (2 * 16 * d)) ** 0.5)
    shapes.append([16, n, n, d])
    shapes.append([16, n, d, n])
  return shapes


def default_dtypes(device, backend, quick, capability=None):
  """Datatypes measured by default: float32 on the CPU (torch runs
  bfloat16 and float16 there too, mostly by conversion and slowly: ask for
  them with --dtypes); on CUDA float32, float16 and, by compute
  capability, bfloat16 (>= 8.0) and float8 (>= 8.9)."""
  if backend == 'numpy' or device == 'cpu':
    return ['float32']
  out = ['float32', 'float16']
  if capability is not None and capability >= (8, 0):
    out.append('bfloat16')
  if capability is not None and capability >= (8, 9):
    out.append('float8')
  return out


def threads_per_proc(procs, threads=None):
  """CPU threads of each of ``procs`` processes sharing this machine:
  ``threads`` when given (--threads), else cores / procs."""
  if threads:
    return int(threads)
  try:
    cores = len(os.sched_getaffinity(0))
  except AttributeError:
    cores = os.cpu_count() or 1
  return max(1, cores // max(1, procs))


def plan(device, backend, procs, quick, dtypes, timeout_s, smoke=False,
         threads=None, clock='wall'):
  """The benchmarks of a profile, in the order they run (``clock`` for the
  compute and memory benchmarks; collectives are always timed on the wall
  clock, since waiting for a peer is their cost)."""
  sizes = _cuda_sizes(quick) if device == 'cuda' else _cpu_sizes(quick)
  if smoke:
    sizes = SMOKE_SIZES
  threads = threads_per_proc(procs, threads)
  min_time = 0.005 if smoke else 0.05 if quick else 0.2
  common = {'backend': backend, 'device': device, 'threads': threads,
            'min_time_s': min_time}
  local = dict(common, clock=clock)
  if device == 'cpu' and procs > 1:
    # The other processes of the node compute at the same time.
    local['copies'] = procs
  specs = []
  for dt in dtypes:
    specs.append(BenchSpec(f'matrix.{dt}', 'gemm', dict(
      local, dtype=dt, shapes=gemm_shapes(sizes['gemm_flop'], device)),
      timeout_s, threads))
  for dt in dtypes:
    specs.append(BenchSpec(f'vector.{dt}', 'vector', dict(
      local, dtype=dt, elements=sizes['vector']), timeout_s, threads))
  specs.append(BenchSpec('mem1', 'memcopy', dict(local, sizes=sizes['mem']),
                         timeout_s, threads))
  if device == 'cuda':
    specs.append(BenchSpec('mem2', 'host_device', dict(
      common, sizes=sizes['mem']), timeout_s, threads))
  if procs >= 2:
    specs.append(BenchSpec('network', 'collectives', dict(
      common, procs=procs, sizes=sizes['net'], ops=list(OPS),
      min_time_s=min_time / 2, timeout_s=timeout_s), timeout_s, threads))
  return specs


def _sig(x, digits=4):
  if x == 0:
    return 0.0
  return round(x, digits - 1 - int(math.floor(math.log10(abs(x)))))


def _engine(outcome, default_tflops):
  if outcome is None or not outcome.ok:
    return {'tflops': default_tflops, 'gflops_efficiency': [[0, 1.0]]}
  pts = outcome.best['points']
  peak = max(p['value'] for p in pts)
  curve = efficiency_curve([p['flops'] for p in pts],
                           [p['value'] for p in pts], peak, 1e9)
  return {'tflops': _sig(peak / 1e12), 'gflops_efficiency': curve}


def _memory(outcome, capacity_gib, default_gbps, pick_min=False):
  if outcome is None or not outcome.ok:
    return {'GiB': capacity_gib, 'GBps': default_gbps,
            'MB_efficiency': [[0, 1.0]]}
  by_size = {}
  for p in outcome.best['points']:
    rate = by_size.get(p['bytes'])
    by_size[p['bytes']] = p['value'] if rate is None else (
      min(rate, p['value']) if pick_min else max(rate, p['value']))
  peak = max(by_size.values())
  sizes = sorted(by_size)
  curve = efficiency_curve(sizes, [by_size[s] for s in sizes], peak, 1e6,
                           monotone=False)
  return {'GiB': capacity_gib, 'GBps': _sig(peak / 1e9),
          'MB_efficiency': curve}


def _network(outcome, procs, device):
  d = DEFAULTS[device]
  tier = {'bandwidth': d['net_GBps'], 'efficiency': 1.0, 'size': procs,
          'latency': d['net_latency_s'],
          'ops': {'p2p': [1.0, None], 'reduce_scatter': [1.0, -1],
                  'all_gather': [1.0, -1], 'all_reduce': [2.0, -1]},
          'must_be_filled': False, 'processor_usage': 0.0}
  if outcome is None or not outcome.ok:
    return tier, None
  fit = network_tier(outcome.best['points'], procs)
  tier.update(bandwidth=_sig(fit['bandwidth_Bps'] / 1e9),
              efficiency=round(min(1.0, max(0.001, fit['efficiency'])), 4),
              latency=_sig(fit['latency_s'], 3), ops=fit['ops'])
  return tier, fit


def system_from_outcomes(outcomes, device, procs, dtypes, mem1_gib, mem2_gib):
  """The system dict from benchmark outcomes (by name; a missing or failed
  one gives :data:`DEFAULTS`).

  Returns:
    (system dict, list of the fields left at defaults, network fit or None).
  """
  d = DEFAULTS[device]
  defaults = []
  system = {'matrix': {}, 'vector': {}}
  for dt in dtypes:
    for engine in ('matrix', 'vector'):
      out = outcomes.get(f'{engine}.{dt}')
      system[engine][dt] = _engine(out, d[f'{engine}_tflops'])
      if out is None or not out.ok:
        defaults.append(f'{engine}.{dt}')
  system['mem1'] = _memory(outcomes.get('mem1'), mem1_gib, d['mem1_GBps'])
  if not (outcomes.get('mem1') and outcomes['mem1'].ok):
    defaults.append('mem1')
  if device == 'cuda':
    system['mem2'] = _memory(outcomes.get('mem2'), mem2_gib, d['mem2_GBps'],
                             pick_min=True)
    if not (outcomes.get('mem2') and outcomes['mem2'].ok):
      defaults.append('mem2')
  else:
    # No second tier on a CPU: capacity 0 (an offload is infeasible).
    system['mem2'] = {'GiB': 0, 'GBps': d['mem2_GBps'],
                      'MB_efficiency': [[0, 1.0]]}
  system['processing_mode'] = PROCESSING_MODE
  tier, fit = _network(outcomes.get('network'), procs, device)
  if procs >= 2 and fit is None:
    defaults.append('networks[0]')
  system['networks'] = [tier]
  return system, defaults, fit
