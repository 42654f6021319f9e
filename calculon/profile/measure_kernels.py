"""Measures a system file's ``measured`` section on this machine with torch.

``calculon profile --measure-kernels`` (:mod:`calculon.cli.profile`) builds
with it the same section ``calculon import-kernels`` builds from NVIDIA
AIConfigurator's database (:mod:`calculon.kernels.import_kernels`), in the
same layout, so :mod:`calculon.kernels.tables` prices from it unchanged:

* ``gemm``: latency of ``torch.nn.functional.linear(x, W)`` (x (m, k), W
  (n, k): the tables' ``x @ W^T`` convention) over (m, n, k) on the
  importer's m values (:data:`~calculon.kernels.import_kernels.GEMM_M`)
  and the n, k values of AIConfigurator's GEMM tables
  (:data:`GEMM_NK`), in bfloat16, and in 'fp8' where ``torch._scaled_mm``
  runs on the device: W cast to e4m3 beforehand, x quantized inside the
  timed op with a dynamic per-tensor scale (amax, scale, cast), as the
  table's TensorRT-LLM ``Linear`` does (ai-dynamo/aiconfigurator
  collector/trtllm/collect_gemm.py at 095f58a5; the engine takes that cast
  off again, :data:`~calculon.kernels.tables.GEMM_INPUT_QUANTIZE_BYTES`).
* ``attention``: causal bfloat16 ``torch.nn.functional.
  scaled_dot_product_attention`` forward (batch 1, ``heads`` query heads =
  batch x heads of the table, key/value heads equal) over (head_dim, isl,
  heads).
* ``nccl``: with NCCL and two or more GPUs, ``torch.distributed``
  all-gather, reduce-scatter, all-reduce and all-to-all of float16
  ('half') buffers over (GPU count, bytes): nccl-tests' sizes (the
  gathered output, the scattered input, the buffer, the send buffer),
  the slowest rank's median.

Points beyond a memory share of the device or a FLOP cap per call are not
run; the importer's rule fills them from the nearest measured point along
an axis at its FLOP/s (:func:`~calculon.kernels.import_kernels.
_fill_along`), and ``filled`` counts them.  Timing: ``warmup`` calls, then
the median of ``repeats`` timed calls, each between two
``torch.cuda.Event`` s on a GPU (synchronized once after the repeats) or
``time.perf_counter`` on a CPU.  What is skipped, and why, is recorded in
``source.skipped``.
"""

import datetime
import json
import os
import platform
import shutil
import statistics
import tempfile
import time

import numpy as np

from calculon.kernels.import_kernels import GEMM_M, _fill_along, _round
from calculon.profile.bench_network import collective_call

#: n and k of AIConfigurator's GEMM tables (aiconfigurator-core 0.12.0,
#: systems/data/h100_sxm/gemm/trtllm/1.3.0rc20, as imported into
#: systems/h100_sxm_80g_measured.json).
GEMM_NK = (32, 64, 128, 256, 512, 768, 1024, 1536, 2048, 2560, 3072, 3584,
           4096, 5120, 6144, 7168, 8192, 10240, 12288, 16384, 51200, 65536)
#: Axes of AIConfigurator's context attention table (same source).
ATTENTION_HEAD_DIM = (64, 128, 192, 256)
ATTENTION_ISL = (1, 16, 32, 64, 128, 256, 512, 1024, 1536, 2048, 3072,
                 4096, 6144, 8192, 10240, 12288, 16384)
ATTENTION_HEADS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 40, 48, 64,
                   80, 96, 128, 160, 192, 256, 320, 384, 512, 640, 768, 1024,
                   1280, 1536, 2048, 2560, 3072, 4096, 5120, 6144, 8192,
                   10240, 12288, 16384, 24576)
#: NCCL table: operations (AIConfigurator's op names) and bytes 512 B ...
#: 512 MiB (its range), GPU counts the powers of two up to the node's.
NCCL_OPS = ('all_gather', 'reduce_scatter', 'all_reduce', 'alltoall')
NCCL_BYTES = tuple(2 ** e for e in range(9, 30))

#: ``--quick``: a corner of each grid (seconds on a CPU).
QUICK = {'m': (1, 16, 128, 512), 'nk': (64, 256, 1024),
         'head_dim': (64, 128), 'isl': (16, 128, 512), 'heads': (1, 4, 16),
         'bytes': tuple(2 ** e for e in range(10, 25, 2))}
#: Warm-up calls and timed repeats per point (full, quick).
WARMUP, REPEATS = 3, 7
QUICK_WARMUP, QUICK_REPEATS = 1, 3
#: Share of the device's free memory one point's tensors may take.
MEMORY_SHARE = 0.4
#: FLOP cap of one call (None: no cap): a CPU would take hours over the
#: full grid's largest GEMMs; the capped points are filled.
MAX_FLOPS = {'cuda': None, 'cpu': 2e9}
#: Attention FLOP cap per call on any device (4 h s^2 d / 2 causal): the
#: largest heads x sequence points would need terabytes.
ATTENTION_MAX_FLOPS = {'cuda': 2e13, 'cpu': 2e9}
#: Largest finite e4m3 value (the dynamic scale maps amax(x) to it).
E4M3_MAX = 448.0


class Timer:
  """Median milliseconds of a call: CUDA events on 'cuda', perf_counter on
  'cpu'."""

  def __init__(self, torch, device, warmup, repeats):
    self.torch, self.device = torch, device
    self.warmup, self.repeats = int(warmup), int(repeats)

  @property
  def method(self):
    """The timing method, in words (provenance)."""
    how = ('torch.cuda.Event pairs around each call, synchronized after '
           'the repeats' if self.device == 'cuda' else
           'time.perf_counter around each call')
    return {'clock': how, 'warmup': self.warmup, 'repeats': self.repeats,
            'statistic': 'median'}

  def median_ms(self, fn):
    """Median ms of ``fn()`` over the repeats, after the warm-up."""
    torch = self.torch
    for _ in range(self.warmup):
      fn()
    if self.device == 'cuda':
      torch.cuda.synchronize()
      pairs = []
      for _ in range(self.repeats):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        pairs.append((start, end))
      torch.cuda.synchronize()
      return statistics.median(s.elapsed_time(e) for s, e in pairs)
    times = []
    for _ in range(self.repeats):
      start = time.perf_counter()
      fn()
      times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def _free_bytes(torch, device):
  if device == 'cuda':
    return float(torch.cuda.mem_get_info()[0])
  import psutil
  return float(psutil.virtual_memory().available)


def _oom_errors(torch):
  errs = [MemoryError]
  if hasattr(torch, 'OutOfMemoryError'):
    errs.append(torch.OutOfMemoryError)
  return tuple(errs)


def fp8_problem(torch, device):
  """None when ``torch._scaled_mm`` multiplies e4m3 matrices on
  ``device``, else why not (one line).

  A CPU is refused: its ``_scaled_mm`` is a reference emulation, not a
  float8 kernel (torch 2.13 on one Xeon core: 18 s for a 512 x 1024 x 1024
  GEMM that takes 3.4 ms in bfloat16), so its times measure nothing the
  engine prices and a quick run would take minutes."""
  if device != 'cuda':
    return (f'float8 on {device} is torch\'s reference emulation of '
            '_scaled_mm, not a float8 kernel')
  if not hasattr(torch, 'float8_e4m3fn') or not hasattr(torch, '_scaled_mm'):
    return f'torch {torch.__version__} has no float8_e4m3fn / _scaled_mm'
  try:
    x = torch.ones(16, 32, device=device).to(torch.float8_e4m3fn)
    w = torch.ones(16, 32, device=device).to(torch.float8_e4m3fn)
    one = torch.ones((), device=device)
    torch._scaled_mm(x, w.t(), scale_a=one, scale_b=one,
                     out_dtype=torch.bfloat16)
  except Exception as err:  # noqa: BLE001 -- any failure means no fp8
    return ('torch._scaled_mm fails on this device: ' +
            str(err).strip().splitlines()[0][:200])
  return None


def _gemm_call(torch, dtype, x, w, w8, device):
  """The timed op for table datatype ``dtype`` on x (m, k), W (n, k)
  (``w8``: W in e4m3)."""
  import torch.nn.functional as F
  if dtype == 'bfloat16':
    return lambda: F.linear(x, w)
  one = torch.ones((), device=device)
  # cuBLASLt's FP8 GEMM wants rows in multiples of 16: a shorter x is
  # padded (the kernel computes the padded tile anyway).
  pad = (-x.shape[0]) % 16 if device == 'cuda' else 0
  xp = torch.nn.functional.pad(x, (0, 0, 0, pad)) if pad else x

  def fp8_linear():
    scale = (xp.abs().amax().float() / E4M3_MAX).clamp(min=1e-12)
    x8 = (xp / scale).to(torch.float8_e4m3fn)
    return torch._scaled_mm(x8, w8.t(), scale_a=scale, scale_b=one,
                            out_dtype=torch.bfloat16)
  return fp8_linear


def gemm_section(torch, device, dtypes, ms, nks, timer, max_flops=None,
                 log=None):
  """The ``gemm`` table (dict, :func:`calculon.kernels.import_kernels.
  gemm_section`'s layout) measured on ``device``.

  Args:
    dtypes: table datatypes to time ('bfloat16', 'fp8').
    ms, nks: ascending m values; n and k values (the same list).
    timer: a :class:`Timer`.
    max_flops: points of more FLOP (2 m n k) are not run (filled).

  Raises:
    RuntimeError: no datatype produced a complete table.
  """
  ms, ns, ks = list(ms), list(nks), list(nks)
  grid_m, grid_n, grid_k = np.meshgrid(ms, ns, ks, indexing='ij')
  flops = 2.0 * grid_m * grid_n * grid_k
  cubes = {d: np.full(flops.shape, np.nan) for d in dtypes}
  oom = _oom_errors(torch)
  gen = torch.Generator(device=device).manual_seed(0)
  budget = MEMORY_SHARE * _free_bytes(torch, device)
  for ki, k in enumerate(ks):
    cap = np.inf if max_flops is None else max_flops

    def runs(m, n):
      return 2.0 * m * n * k <= cap
    rows = max([m for m in ms if 4.0 * m * k <= budget / 4 and
                runs(m, ns[0])] or [ms[0]])
    x_all = torch.randn(rows, k, device=device, generator=gen,
                        dtype=torch.bfloat16)
    for ni, n in enumerate(ns):
      if 2.0 * n * k * 2 > budget / 4 or not runs(ms[0], n):
        continue
      w = torch.randn(n, k, device=device, generator=gen,
                      dtype=torch.bfloat16)
      w8 = w.to(torch.float8_e4m3fn) if 'fp8' in dtypes else None
      for mi, m in enumerate(ms):
        if m > rows or not runs(m, n) or 2.0 * m * n > budget / 2:
          continue
        x = x_all[:m]
        for dtype in dtypes:
          try:
            cubes[dtype][mi, ni, ki] = timer.median_ms(
              _gemm_call(torch, dtype, x, w, w8, device))
          except oom:
            if device == 'cuda':
              torch.cuda.empty_cache()
      del w, w8
    del x_all
    if device == 'cuda':
      torch.cuda.empty_cache()
    if log is not None:
      log.info(f'GEMM k={k}: {ki + 1}/{len(ks)}')
  out = dict(_table_provenance(torch, timer, [
    'torch.nn.functional.linear (bfloat16)',
    'torch._scaled_mm (fp8 e4m3, dynamic per-tensor x scale)'
    if 'fp8' in dtypes else None]), m=ms, n=ns, k=ks, latency_ms={},
    filled={})
  for dtype, cube in cubes.items():
    filled = int(np.isnan(cube).sum())
    for axis in (0, 2, 1):
      cube, _ = _fill_along(cube, flops, axis=axis)
    if np.isnan(cube).any() or not np.all(cube > 0):
      continue
    out['latency_ms'][dtype] = _round(cube)
    out['filled'][dtype] = filled
  if not out['latency_ms']:
    raise RuntimeError('no GEMM datatype gave a complete table')
  return out


def attention_section(torch, device, head_dims, isls, heads, timer,
                      max_flops, log=None):
  """The ``attention`` table (dict, :func:`calculon.kernels.import_kernels.
  attention_section`'s layout): causal bfloat16 SDPA forward latency over
  (head_dim, isl, heads), or None when no line could be measured."""
  import torch.nn.functional as F
  g_d, g_s, g_h = np.meshgrid(head_dims, isls, heads, indexing='ij')
  flops = 2.0 * g_h * g_s * g_s * g_d   # the tables' causal FLOP
  cube = np.full(flops.shape, np.nan)
  oom = _oom_errors(torch)
  gen = torch.Generator(device=device).manual_seed(0)
  budget = MEMORY_SHARE * _free_bytes(torch, device)
  for di, d in enumerate(head_dims):
    for si, s in enumerate(isls):
      for hi, h in enumerate(heads):
        # q, k, v and the output, bfloat16
        if flops[di, si, hi] > max_flops or 4.0 * h * s * d * 2 > budget:
          continue
        try:
          q, k, v = (torch.randn(1, h, s, d, device=device, generator=gen,
                                 dtype=torch.bfloat16) for _ in range(3))
          cube[di, si, hi] = timer.median_ms(
            lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
          del q, k, v
        except oom:
          if device == 'cuda':
            torch.cuda.empty_cache()
    if log is not None:
      log.info(f'attention head_dim={d}: {di + 1}/{len(head_dims)}')
  filled = int(np.isnan(cube).sum())
  cube, _ = _fill_along(cube, flops, axis=2)
  cube, _ = _fill_along(cube, flops, axis=1)
  if np.isnan(cube).any():
    return None
  return dict(_table_provenance(torch, timer, [
    'torch.nn.functional.scaled_dot_product_attention (is_causal, '
    'bfloat16; the backend torch picks)']), head_dim=list(head_dims),
    isl=list(isls), heads=list(heads), latency_ms={'bfloat16': _round(cube)},
    filled={'bfloat16': filled})


def _nccl_rank(rank, gpus, tmp, sizes, ops, warmup, repeats, backend):
  """One rank of :func:`nccl_section` (``torch.multiprocessing`` target):
  times each op and size; rank 0 writes ``rows.json`` [[op, bytes, ms],
  ...] with the slowest rank's median."""
  import datetime as dt
  import torch
  import torch.distributed as dist
  cuda = backend == 'nccl'
  if cuda:
    torch.cuda.set_device(rank)
  dev = torch.device('cuda', rank) if cuda else torch.device('cpu')
  dist.init_process_group(backend, init_method='file://' + os.path.join(
    tmp, 'rendezvous'), rank=rank, world_size=gpus,
    timeout=dt.timedelta(seconds=600))
  timer = Timer(torch, 'cuda' if cuda else 'cpu', warmup, repeats)
  rows = []
  for op in ops:
    for size in sizes:
      fn = collective_call(dist, torch, op, size, gpus, rank, dev,
                           torch.float16)
      dist.barrier()
      t = torch.tensor([timer.median_ms(fn)], device=dev)
      dist.all_reduce(t, op=dist.ReduceOp.MAX)
      rows.append([op, int(size), float(t.item())])
  if rank == 0:
    with open(os.path.join(tmp, 'rows.json'), 'w') as fd:
      json.dump(rows, fd)
  dist.barrier()
  dist.destroy_process_group()


def nccl_rows(gpus, sizes, ops, warmup, repeats, backend='nccl'):
  """[[op, bytes, ms], ...] of ``gpus`` local ranks (``backend`` 'nccl',
  or 'gloo' on the CPU for tests)."""
  import torch.multiprocessing as tmp_mp
  tmp = tempfile.mkdtemp(prefix='calculon-nccl-')
  try:
    tmp_mp.start_processes(_nccl_rank, args=(
      gpus, tmp, list(sizes), list(ops), warmup, repeats, backend),
      nprocs=gpus, start_method='spawn')
    with open(os.path.join(tmp, 'rows.json')) as fd:
      return json.load(fd)
  finally:
    shutil.rmtree(tmp, ignore_errors=True)


def nccl_problem(torch, device):
  """None when NCCL collectives can be measured, else why not (one
  line)."""
  if device != 'cuda':
    return 'NCCL needs --device cuda'
  import torch.distributed as dist
  if not dist.is_available() or not dist.is_nccl_available():
    return f'torch {torch.__version__} has no NCCL backend'
  if torch.cuda.device_count() < 2:
    return (f'{torch.cuda.device_count()} GPU visible: a collective needs '
            'two or more')
  return None


def nccl_table(rows_by_gpus, sizes, provenance):
  """The ``nccl`` table (dict, :func:`calculon.kernels.import_kernels.
  nccl_section`'s layout) from measured rows.

  Args:
    rows_by_gpus: {GPU count: [[op, bytes, ms], ...]} (:func:`nccl_rows`).
    sizes: the bytes axis (ascending).
    provenance: the table's provenance keys.

  Returns:
    the dict; an operation missing at some GPU count is left out, one
    missing at some sizes is filled along bytes (latency held, the
    importer's rule).
  """
  gpus = sorted(rows_by_gpus)
  sizes = list(sizes)
  out = dict(provenance, dtype='half', gpus=gpus, bytes=sizes,
             latency_ms={})
  for op in NCCL_OPS:
    grid = np.full((len(gpus), len(sizes)), np.nan)
    for gi, g in enumerate(gpus):
      for name, size, ms in rows_by_gpus[g]:
        if name == op and size in sizes:
          grid[gi, sizes.index(size)] = ms
    grid, _ = _fill_along(grid, np.ones_like(grid), axis=1)
    if not np.isnan(grid).any() and np.all(grid > 0):
      out['latency_ms'][op] = _round(grid)
  return out


def nccl_section(torch, sizes, timer, log=None):
  """The ``nccl`` table measured over the powers of two up to the visible
  GPU count and ``sizes`` (bytes), and why GPU counts were dropped (a
  failed count is left out).

  Returns:
    (table dict or None when no operation has a complete table, reason
    str or None).
  """
  count = torch.cuda.device_count()
  rows, failed = {}, []
  for g in (2, 4, 8, 16, 32, 64):
    if g > count:
      break
    try:
      rows[g] = nccl_rows(g, sizes, NCCL_OPS, timer.warmup, timer.repeats)
    except Exception as err:  # noqa: BLE001 -- a failed rank: recorded
      failed.append(f'{g} GPUs: ' + (str(err).strip().splitlines() or
                                     [type(err).__name__])[0][:200])
    if log is not None:
      log.info(f"NCCL {g} GPUs: {'done' if g in rows else 'failed'}")
  why = '; '.join(failed) or None
  if not rows:
    return None, why or 'no GPU count measured'
  table = nccl_table(rows, sizes, _table_provenance(torch, timer, [
    f'torch.distributed (NCCL {_nccl_version(torch)})']))
  if not table['latency_ms']:
    return None, why or 'no operation gave a complete table'
  return table, why


def _nccl_version(torch):
  ver = torch.cuda.nccl.version()
  return '.'.join(str(v) for v in ver) if isinstance(ver, tuple) else str(ver)


def _table_provenance(torch, timer, kernels):
  """Per-table provenance in the importer's keys: the collecting framework
  (calculon profile and its version), ``collection_meta`` (torch's
  version, the timing method) and the kernels timed."""
  from calculon import __version__
  return {'framework': 'calculon profile', 'version': __version__,
          'collection_meta': {'collector': 'calculon profile '
                              '--measure-kernels', 'torch': torch.__version__,
                              'timing': timer.method},
          'kernel_source': [k for k in kernels if k]}


def device_name(torch, device):
  """The device's name: the GPU's, or the CPU's."""
  if device == 'cuda':
    return torch.cuda.get_device_name(0)
  name = platform.processor() or platform.machine()
  try:
    with open('/proc/cpuinfo') as fd:
      for line in fd:
        if line.startswith('model name'):
          name = line.split(':', 1)[1].strip()
          break
  except OSError:
    pass
  return name


def measured_section(device='cuda', quick=False, log=None, threads=None):
  """The ``measured`` section (dict) measured on this machine.

  Args:
    device: 'cuda' (the first visible GPU; NCCL over the visible ones) or
      'cpu'.
    quick: a corner of each grid (:data:`QUICK`), fewer repeats.
    log: a logger for progress (optional).

  Returns:
    {'source': provenance, 'gemm': ..., 'attention': ..., 'nccl': ...}
    (attention and nccl only when measured; ``source.skipped`` says why
    not).

  Raises:
    RuntimeError: torch sees no CUDA device, or no GEMM table came out.
  """
  from calculon.profile.timing import setup_torch
  torch = setup_torch(device, threads or os.cpu_count() or 1)
  warmup, repeats = (QUICK_WARMUP, QUICK_REPEATS) if quick else \
    (WARMUP, REPEATS)
  timer = Timer(torch, device, warmup, repeats)
  skipped = {}
  dtypes = ['bfloat16']
  why = fp8_problem(torch, device)
  if why is None:
    dtypes.append('fp8')
  else:
    skipped['gemm.fp8'] = why
  gemm = gemm_section(torch, device, dtypes,
                      QUICK['m'] if quick else GEMM_M,
                      QUICK['nk'] if quick else GEMM_NK, timer,
                      MAX_FLOPS[device], log)
  for d in dtypes:
    if d not in gemm['latency_ms']:
      skipped[f'gemm.{d}'] = 'no complete table (every point failed)'
  attention = attention_section(
    torch, device, QUICK['head_dim'] if quick else ATTENTION_HEAD_DIM,
    QUICK['isl'] if quick else ATTENTION_ISL,
    QUICK['heads'] if quick else ATTENTION_HEADS, timer,
    ATTENTION_MAX_FLOPS[device], log)
  if attention is None:
    skipped['attention'] = 'no complete table (every point failed)'
  nccl = None
  why = nccl_problem(torch, device)
  if why is None:
    nccl, why = nccl_section(torch, QUICK['bytes'] if quick else NCCL_BYTES,
                             timer, log)
  if why is not None:
    skipped['nccl'] = why
  source = {
    'built_by': 'calculon profile --measure-kernels',
    'package': 'torch', 'package_version': torch.__version__,
    'device': device_name(torch, device), 'device_kind': device,
    'cuda': torch.version.cuda if device == 'cuda' else None,
    'gpu': torch.cuda.get_device_name(0) if device == 'cuda' else None,
    'date': datetime.datetime.now(datetime.timezone.utc).strftime(
      '%Y-%m-%dT%H:%M:%SZ'),
    'timing': timer.method, 'quick': bool(quick),
    'skipped': skipped or None,
  }
  out = {'source': {k: v for k, v in source.items() if v is not None},
         'gemm': gemm}
  if attention is not None:
    out['attention'] = attention
  if nccl is not None:
    out['nccl'] = nccl
  ratio = block_scaled_ratio(torch, device) \
    if 'fp8' in gemm['latency_ms'] else None
  if ratio is not None:
    out['block_scaled_gemm_ratio'] = ratio
  return out


def block_scaled_ratio(torch, device):
  """``measured.block_scaled_gemm_ratio`` for this machine's GPU: on a
  Blackwell GPU (compute capability 10 or above, whose tensor cores run
  MXFP8) :data:`~calculon.kernels.tables.MXFP8_GEMM_RATIO`, the ratio
  Transformer Engine measured on a B300 (the fp8 table is timed with
  per-tensor scales, not MXFP8); None elsewhere (CPU, Hopper and older:
  block-scaled FP8 is priced at the fp8 table)."""
  from calculon.kernels.tables import MXFP8_GEMM_RATIO
  if device != 'cuda':
    return None
  major, _ = torch.cuda.get_device_capability(0)
  return MXFP8_GEMM_RATIO if major >= 10 else None
