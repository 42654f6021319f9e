"""Builds a system file's ``measured`` section from AIConfigurator's tables.

Reads (through :mod:`calculon.kernels.aic`) the GEMM, context attention and
NCCL tables of one GPU and reduces each to the regular grid the engine
interpolates (:mod:`calculon.kernels.tables`):

* GEMM: per datatype (bfloat16, fp8, nvfp4 where measured) latency over
  (m, n, k) on the table's n and k values and the m values of
  :data:`GEMM_M` it has (powers of two and the multiples of 512 up to
  4,096: the ``m + 1`` and step-16 rows are dropped, a few dozen points per
  axis).  A grid point the collection lacks is filled from its nearest
  measured neighbour along m (then k, then n: the (65,536, 65,536) weight
  is never measured) at that neighbour's FLOP/s (latency scaled by the
  FLOP ratio); ``filled`` counts them per datatype.
* attention: bfloat16 causal context attention (window 0, bfloat16 KV),
  latency over (head_dim, isl, batch x heads); where several rows share a
  point (batch and head splits, key/value head counts) their median.
* NCCL: per operation, latency of the 'half' (2-byte) rows over (GPU
  count, buffer bytes).

Latencies are kept in milliseconds, rounded to 5 significant digits.
Provenance: the package and version, the GPU folder and the device name the
tables name, and per table the collecting framework, its version, the
``collection_meta.yaml`` and the kernel sources.
"""

import numpy as np

from calculon.kernels import aic
from calculon.kernels.tables import MXFP8_GEMM_RATIO

#: m values kept from the GEMM tables (where present).
GEMM_M = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 1536, 2048, 2560,
          3072, 3584, 4096, 8192, 16384, 32768, 65536)
#: Table datatypes imported, in order.
GEMM_DTYPES = ('bfloat16', 'fp8', 'nvfp4')
DIGITS = 5


def _round(values):
  """Values rounded to :data:`DIGITS` significant digits (nested lists)."""
  arr = np.asarray(values, dtype=float)
  with np.errstate(divide='ignore', invalid='ignore'):
    mag = np.where(arr > 0, np.floor(np.log10(np.abs(arr))), 0)
  scale = 10.0 ** (DIGITS - 1 - mag)
  return (np.round(arr * scale) / scale).tolist()


def _fill_along(cube, flops, axis=0):
  """Fills NaN cells of ``cube`` (latency) from the nearest finite cell
  along ``axis`` at its FLOP/s; returns the filled cube and the count."""
  out = cube.copy()
  missing = np.argwhere(np.isnan(cube))
  for idx in missing:
    line = [slice(None) if d == axis else int(i) for d, i in enumerate(idx)]
    vals = cube[tuple(line)]
    have = np.flatnonzero(np.isfinite(vals))
    if len(have) == 0:
      continue
    near = have[np.argmin(np.abs(have - idx[axis]))]
    src = list(idx)
    src[axis] = near
    out[tuple(idx)] = cube[tuple(src)] * flops[tuple(idx)] / flops[tuple(src)]
  return out, int(len(missing))


def _provenance(framework, version, meta, frame):
  sources = sorted(str(s) for s in frame['kernel_source'].unique()) \
    if 'kernel_source' in frame else []
  return {'framework': framework, 'version': version,
          'collection_meta': meta, 'kernel_source': sources}


def gemm_section(root, gpu, framework=None, version=None):
  """The ``gemm`` table (dict) of GPU folder ``gpu``."""
  path, fw, ver, meta = aic.find_table(root, gpu, 'gemm', framework, version)
  frame = aic.read_table(path, ('gemm_dtype', 'm', 'n', 'k', 'latency'))
  have = [d for d in GEMM_DTYPES if d in set(frame['gemm_dtype'])]
  sub = frame[frame['gemm_dtype'].isin(have)]
  ms = [m for m in GEMM_M if m in set(sub['m'])]
  ns = sorted(int(v) for v in sub['n'].unique())
  ks = sorted(int(v) for v in sub['k'].unique())
  sub = sub[sub['m'].isin(ms)]
  out = dict(_provenance(fw, ver, meta, sub), m=ms, n=ns, k=ks,
             latency_ms={}, filled={})
  grid_m, grid_n, grid_k = np.meshgrid(ms, ns, ks, indexing='ij')
  flops = 2.0 * grid_m * grid_n * grid_k
  for dtype in have:
    rows = sub[sub['gemm_dtype'] == dtype].groupby(['m', 'n', 'k'])[
      'latency'].median()
    cube = np.full((len(ms), len(ns), len(ks)), np.nan)
    mi = {v: i for i, v in enumerate(ms)}
    ni = {v: i for i, v in enumerate(ns)}
    ki = {v: i for i, v in enumerate(ks)}
    for (m, n, k), lat in rows.items():
      cube[mi[m], ni[n], ki[k]] = lat
    filled = int(np.isnan(cube).sum())
    for axis in (0, 2, 1):
      cube, _ = _fill_along(cube, flops, axis=axis)
    if np.isnan(cube).any():
      continue
    out['latency_ms'][dtype] = _round(cube)
    out['filled'][dtype] = filled
  return out


def attention_section(root, gpu, framework=None, version=None):
  """The ``attention`` table (dict) of GPU folder ``gpu``, or None when
  it has no bfloat16 causal rows."""
  path, fw, ver, meta = aic.find_table(root, gpu, 'attention', framework,
                                       version)
  frame = aic.read_table(path, ('batch_size', 'isl', 'num_heads',
                                'head_dim', 'latency'))
  keep = np.ones(len(frame), dtype=bool)
  for col, value in (('window_size', 0), ('attn_dtype', 'bfloat16'),
                     ('kv_cache_dtype', 'bfloat16'), ('beam_width', 1)):
    if col in frame:
      keep &= (frame[col] == value).to_numpy()
  sub = frame[keep].copy()
  if sub.empty:
    return None
  sub['heads'] = sub['batch_size'] * sub['num_heads']
  med = sub.groupby(['head_dim', 'isl', 'heads'])['latency'].median()
  dims = sorted(int(v) for v in sub['head_dim'].unique())
  isls = sorted(int(v) for v in sub['isl'].unique())
  heads = sorted(int(v) for v in sub['heads'].unique())
  cube = np.full((len(dims), len(isls), len(heads)), np.nan)
  di = {v: i for i, v in enumerate(dims)}
  si = {v: i for i, v in enumerate(isls)}
  hi = {v: i for i, v in enumerate(heads)}
  for (d, s, h), lat in med.items():
    cube[di[d], si[s], hi[h]] = lat
  g_d, g_s, g_h = np.meshgrid(dims, isls, heads, indexing='ij')
  flops = 2.0 * g_h * g_s * g_s * g_d
  filled = int(np.isnan(cube).sum())
  cube, _ = _fill_along(cube, flops, axis=2)
  cube, _ = _fill_along(cube, flops, axis=1)
  if np.isnan(cube).any():
    return None
  return dict(_provenance(fw, ver, meta, sub), head_dim=dims, isl=isls,
              heads=heads, latency_ms={'bfloat16': _round(cube)},
              filled={'bfloat16': filled})


def nccl_section(root, gpu, version=None):
  """The ``nccl`` table (dict) of GPU folder ``gpu``."""
  path, fw, ver, meta = aic.find_table(root, gpu, 'nccl', 'nccl', version)
  frame = aic.read_table(path, ('op_name', 'nccl_dtype', 'num_gpus',
                                'message_size', 'latency'))
  sub = frame[frame['nccl_dtype'] == 'half']
  gpus = sorted(int(v) for v in sub['num_gpus'].unique())
  sizes = sorted(int(v) for v in sub['message_size'].unique())
  out = dict(_provenance(fw, ver, meta, sub), dtype='half', gpus=gpus,
             bytes=[2 * s for s in sizes], latency_ms={})
  for op in sorted(sub['op_name'].unique()):
    med = sub[sub['op_name'] == op].groupby(['num_gpus', 'message_size'])[
      'latency'].median()
    grid = np.full((len(gpus), len(sizes)), np.nan)
    for (g, s), lat in med.items():
      grid[gpus.index(g), sizes.index(s)] = lat
    grid, _ = _fill_along(grid, np.ones_like(grid), axis=1)
    if np.isnan(grid).any():
      continue
    out['latency_ms'][str(op)] = _round(grid)
  return out


def measured_section(gpu, folder=None, framework=None, version=None,
                     nccl_version=None):
  """The ``measured`` section (dict) for AIConfigurator GPU folder ``gpu``.

  Args:
    folder: a folder of the database layout (None: the installed
      ``aiconfigurator-core``).
    framework, version: the collecting framework and version of the GEMM
      and attention tables (None: :func:`calculon.kernels.aic.find_table`'s
      default, TensorRT-LLM's newest).
    nccl_version: the NCCL version of the collective table (None: the
      newest).

  Raises:
    ConfigError: the database, GPU, framework or version is not there.
  """
  root = aic.data_root(folder)
  gemm = gemm_section(root, gpu, framework, version)
  attention = attention_section(root, gpu, framework, version)
  nccl = nccl_section(root, gpu, nccl_version)
  device = None
  path = aic.find_table(root, gpu, 'gemm', gemm['framework'],
                        gemm['version'])[0]
  frame = aic.read_table(path)
  if 'device' in frame:
    device = str(frame['device'].iloc[0])
  package_version = aic.package_version() if folder is None else \
    aic.folder_package_version(folder)
  source = {
    'package': aic.PACKAGE if package_version else None,
    'package_version': package_version,
    'folder': None if folder is None else str(folder),
    'gpu': gpu, 'device': device,
    'license': 'Apache-2.0 (NVIDIA AIConfigurator)',
    'built_by': 'calculon import-kernels',
  }
  source = {k: v for k, v in source.items() if v is not None}
  out = {'source': source, 'gemm': gemm, 'nccl': nccl}
  if attention is not None:
    out['attention'] = attention
  if gpu in BLOCK_SCALED_FP8_GPUS and 'fp8' in gemm['latency_ms']:
    out['block_scaled_gemm_ratio'] = MXFP8_GEMM_RATIO
  return out


#: GPU folders whose tensor cores run MXFP8 (Blackwell): their files carry
#: ``measured.block_scaled_gemm_ratio`` (:data:`~calculon.kernels.tables.
#: MXFP8_GEMM_RATIO`).  Hopper's block-scaled FP8 (128-element blocks,
#: scales applied outside the MMA) is another kernel, left at the 'fp8'
#: table.
BLOCK_SCALED_FP8_GPUS = ('b200_sxm', 'b300_sxm', 'gb200', 'gb300')


#: GPU folders of the database for the bundled system files' GPUs.
GPU_FOLDERS = {'a100': 'a100_sxm', 'h100': 'h100_sxm', 'h200': 'h200_sxm',
               'b200': 'b200_sxm', 'b300': 'b300_sxm', 'gb200': 'gb200',
               'gb300': 'gb300'}


def system_text(data):
  """A system file's JSON text: indented as :func:`calculon.io.json_text`
  writes it, with each innermost list of numbers (the measured tables'
  rows) on one line, so that a table of thousands of points stays a few
  hundred lines."""
  import json
  import re
  from calculon.io import _clean
  text = json.dumps(_clean(data), indent=2)
  number = r'-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?'
  pattern = re.compile(r'\[\s*(' + number + r'(?:,\s*' + number +
                       r')*)\s*\]')
  return pattern.sub(lambda m: '[' + ', '.join(
    re.split(r',\s*', m.group(1))) + ']', text)


def with_measured(base, section, note):
  """System file dict ``base`` (unchanged) with ``measured`` = ``section``
  and ``note`` appended to its ``notes``.  The attention table records the
  base's ``fused_attention_efficiency`` (absent: 1) as the one it stands
  for (:meth:`calculon.llm.layers.FlashAttention._measured_time_s`)."""
  out = dict(base)
  if 'attention' in section:
    section = dict(section)
    section['attention'] = dict(
      section['attention'], fused_attention_efficiency=float(
        base.get('fused_attention_efficiency', 1.0)))
  notes = out.get('notes', [])
  notes = [notes] if isinstance(notes, str) else list(notes)
  out['notes'] = notes + [note]
  out['measured'] = section
  return out
