"""Measured kernel tables and their interpolation, over numpy columns.

Reads a system file's ``measured`` section (built by ``calculon
import-kernels`` from NVIDIA AIConfigurator's database, or by ``calculon
profile --device cuda``; :mod:`calculon.kernels.import_kernels`) and prices
from it:

* a GEMM at its own (m, n, k) and datatype (:meth:`MeasuredKernels.
  gemm_time_s`; the table's convention, ``x (m, k) @ W (n, k)^T``: m
  tokens, k inputs, n outputs);
* a fused causal attention kernel's forward from the context attention
  table (:meth:`MeasuredKernels.attention_flops_per_s`);
* an NCCL collective inside a node by operation, GPU count and message
  bytes (:meth:`MeasuredKernels.collective_time_s`).

Interpolation (:class:`LogGrid`): multilinear in the logarithms of the
coordinates on the logarithm of the latency, which reproduces every table
point exactly and, along each axis, stays between the two neighbouring
points (monotone where the table is).  It is also multilinear on the log of
the achieved FLOP/s, since log FLOP is linear in log m, log n, log k.  The
same rule as AIConfigurator's own SILICON-mode lookup, which interpolates
between the measured grid points (aic-core/rust/aiconfigurator-core/src/
perf_database/interpolation.rs and gemm.rs at 095f58a5), in log space here
because latency spans six decades.

Extrapolation outside a table (documented per axis, ``above`` / ``below``
slopes of log latency over log coordinate beyond the last point):

* GEMM m, n, k: above the largest measured size latency grows in proportion
  (slope 1: the large-GEMM throughput holds); below the smallest it is held
  (slope 0: a smaller GEMM is launch bound, no faster).
* attention: query-head count (batch x heads) above: slope 1; sequence
  above: slope 2 (causal work grows as s^2); head width above: slope 1;
  all held below.
* NCCL: message bytes above: slope 1 (bandwidth bound); below: held
  (latency bound); GPU count held both ways (a ring's per-GPU bytes,
  n (p - 1) / p, barely move beyond 4 GPUs; its latency steps, which grow
  with p, are then under-priced).

A datatype or operation the tables lack is priced by the system's curves
and network model (the caller's fallback; :func:`gemm_dtype_key` returns
None).

Public helpers for other modules (serving): :func:`gemm_time_s` and
:func:`collective_time_s` take a :class:`~calculon.hardware.System`.
"""

import numpy as np

#: Calculon datatype name -> the GEMM table's ``gemm_dtype``: float16 runs at
#: bfloat16's tensor-core rate (the H100/B200 datasheets give both the same
#: peak); float8 is per-tensor scaled FP8 (AIConfigurator's 'fp8'); float4
#: is NVFP4.  float32 has no table (curve).
GEMM_DTYPES = {'bfloat16': 'bfloat16', 'float16': 'bfloat16',
               'float8': 'fp8', 'float4': 'nvfp4'}
#: Calculon collective -> NCCL table op_name.
NCCL_OPS = {'all_gather': 'all_gather', 'reduce_scatter': 'reduce_scatter',
            'all_reduce': 'all_reduce', 'all_to_all': 'alltoall'}
#: Bytes per element of the table GEMM's ``x`` (M, K) operand that the
#: timed op spends quantizing it, per table datatype.  The collector times
#: TensorRT-LLM's ``Linear.forward`` on a bfloat16 ``x`` with pre-quantized
#: weights (ai-dynamo/aiconfigurator collector/trtllm/collect_gemm.py
#: ``run_gemm`` at 095f58a5): for 'fp8' without an input scale, so the
#: op's dynamic path computes the per-tensor scale (an amax read of x, 2
#: B/element) and casts x (2 B read + 1 B written), AIConfigurator's own
#: ``compute_scale`` (sol 2 m k bytes) and ``scale_matrix`` (sol 3 m k
#: bytes) terms, which it subtracts to price a GEMM whose input arrives
#: quantized (aic-core/rust/aiconfigurator-core/src/operators/gemm.rs
#: ``GemmOp::query``, ``low_precision_input``, at 095f58a5); for 'nvfp4'
#: with a static input scale, only the cast (2 B read, 0.5 B written, one
#: 1-byte scale per 16 elements).  Each entry: the separate kernels'
#: bytes per element, in launch order.
GEMM_INPUT_QUANTIZE_BYTES = {'bfloat16': (), 'fp8': (2.0, 3.0),
                             'nvfp4': (2.0 + 0.5 + 1.0 / 16,)}
#: GEMM extrapolation slopes (log latency per log size) above / below the
#: table, per axis (m, n, k).
GEMM_ABOVE = (1.0, 1.0, 1.0)
GEMM_BELOW = (0.0, 0.0, 0.0)
#: Attention axes (head_dim, isl, heads): slopes above / below.
ATTENTION_ABOVE = (1.0, 2.0, 1.0)
ATTENTION_BELOW = (0.0, 0.0, 0.0)
#: NCCL axes (gpus, bytes): slopes above / below.
NCCL_ABOVE = (0.0, 1.0)
NCCL_BELOW = (0.0, 0.0)
#: FLOP of the context attention table's kernel at (head_dim d, isl s,
#: heads h = batch x query heads): two GEMMs (Q K^T, P V) of 2 h s^2 d
#: each, half the tiles under the causal mask: 2 h s^2 d.
ATTENTION_CAUSAL_SHARE = 0.5
#: The backward of fused attention over its forward, in time, until a
#: measured backward table exists: 2.5 x the forward's FLOP (five GEMMs
#: against two, Dao 2023, "FlashAttention-2", algorithm 2) at the backward's
#: lower rate: on H100 the forward reaches about 65 % of the bf16 peak and
#: the backward 1.5-1.75x FlashAttention-2's 35 % (0.57 at the midpoint;
#: Shah et al. 2024, "FlashAttention-3", arXiv 2407.08608, sections 1 and
#: 4.1): 2.5 x 0.65 / 0.57 = 2.86.
ATTENTION_BACKWARD_RATIO = 2.5 * 0.65 / (0.35 * 1.625)
#: A block-scaled 8-bit GEMM (MXFP8: 32-element blocks, one E8M0 scale
#: each, read by the tensor core's block-scaled MMA) over a per-tensor
#: scaled FP8 one of the same shape, in time, until a measured MXFP8 table
#: exists: Transformer Engine's own GEMM benchmark on a B300, pre-quantized
#: operands (the kernels alone, no casts), the 12 GEMMs (forward,
#: activation gradient, weight gradient) of a layer of hidden 4,096 and
#: feedforward 16,384 at 15,872 tokens: MXFP8 7.161 ms, FP8 current
#: scaling 6.812 ms per layer (NVIDIA/TransformerEngine
#: docs/examples/gemm_profiling/gemm_profiling.rst at d0067d0da, "Autocast
#: vs Pre-quantized"): 7.161 / 6.812 = 1.051.  ``calculon
#: import-kernels`` writes it as ``measured.block_scaled_gemm_ratio`` for
#: the Blackwell GPUs (B200, B300, GB200, GB300), whose tensor cores run
#: MXFP8; measured on the B300 and taken as the same for B200 and GB200,
#: whose fifth-generation tensor cores run the same block-scaled MMA.
MXFP8_GEMM_RATIO = round(7.161 / 6.812, 4)
#: Where :data:`MXFP8_GEMM_RATIO` comes from (the system files' note).
MXFP8_GEMM_SOURCE = (
  'Block-scaled 8-bit GEMMs (MXFP8) at the fp8 table x '
  'measured.block_scaled_gemm_ratio: Transformer Engine\'s GEMM benchmark '
  'on a B300 with pre-quantized operands, the 12 GEMMs of a layer of '
  'hidden 4,096 and feedforward 16,384 at 15,872 tokens, MXFP8 7.161 ms '
  'against FP8 current scaling 6.812 ms (NVIDIA/TransformerEngine '
  'docs/examples/gemm_profiling/gemm_profiling.rst at d0067d0da); '
  'measured on the B300, taken alike for the other Blackwell GPUs (the '
  'same block-scaled MMA)')


class LogGrid:
  """Multilinear interpolation of log(value) over log(coordinates).

  Args:
    axes: one ascending 1-D sequence of positive coordinates per
      dimension (a single point is allowed: held along that axis).
    values: positive array of shape ``[len(a) for a in axes]`` (NaN
      nowhere).
    above, below: per axis, the slope of log value over log coordinate
      beyond the largest / below the smallest point.

  Raises:
    ValueError: shapes disagree, an axis is not strictly ascending, a
      value is not positive and finite.
  """

  def __init__(self, axes, values, above, below):
    self.axes = [np.asarray(a, dtype=float) for a in axes]
    values = np.asarray(values, dtype=float)
    if values.shape != tuple(len(a) for a in self.axes):
      raise ValueError(f'table of shape {values.shape} for axes of lengths '
                       f'{[len(a) for a in self.axes]}')
    for a in self.axes:
      if len(a) == 0 or np.any(a <= 0) or np.any(np.diff(a) <= 0):
        raise ValueError('axis not strictly ascending positive: '
                         f'{a.tolist()}')
    if not np.all(np.isfinite(values)) or np.any(values <= 0):
      raise ValueError('table values must be positive and finite')
    self.log_axes = [np.log(a) for a in self.axes]
    self.log_values = np.log(values)
    self.above = tuple(float(s) for s in above)
    self.below = tuple(float(s) for s in below)

  def __call__(self, *coords):
    """Interpolated values at ``coords`` (one array or scalar per axis,
    broadcast together; positive).  Returns an array of the broadcast
    shape."""
    coords = np.broadcast_arrays(*[np.asarray(c, dtype=float)
                                   for c in coords])
    shape = coords[0].shape
    flat = [np.log(np.maximum(c, 1e-300)).ravel() for c in coords]
    lo_idx, weights, extra = [], [], np.zeros(flat[0].shape)
    for d, (x, xs) in enumerate(zip(flat, self.log_axes)):
      if len(xs) == 1:
        lo_idx.append(np.zeros(x.shape, dtype=np.int64))
        weights.append(np.zeros(x.shape))
        extra += np.where(x > xs[0], self.above[d] * (x - xs[0]),
                          self.below[d] * (x - xs[0]))
        continue
      i = np.clip(np.searchsorted(xs, x, side='right') - 1, 0, len(xs) - 2)
      t = (x - xs[i]) / (xs[i + 1] - xs[i])
      extra += np.where(x > xs[-1], self.above[d] * (x - xs[-1]), 0.0) + \
        np.where(x < xs[0], self.below[d] * (x - xs[0]), 0.0)
      lo_idx.append(i)
      weights.append(np.clip(t, 0.0, 1.0))
    out = np.zeros(flat[0].shape)
    ndim = len(self.axes)
    for corner in range(1 << ndim):
      w = np.ones(flat[0].shape)
      idx = []
      for d in range(ndim):
        up = (corner >> d) & 1
        if up and len(self.axes[d]) == 1:
          w = None
          break
        w = w * (weights[d] if up else 1.0 - weights[d])
        idx.append(lo_idx[d] + up)
      if w is None:
        continue
      out += w * self.log_values[tuple(idx)]
    return np.exp(out + extra).reshape(shape)


class MeasuredKernels:
  """The engine's view of a system's ``measured`` section.

  Args:
    cfg: a :class:`~calculon.config.system.MeasuredConfig`.

  Attributes:
    gemm_dtypes: GEMM table datatype keys present (set).
    has_attention, has_nccl: the section has those tables.
  """

  def __init__(self, cfg):
    self.cfg = cfg
    self._gemm = {}
    if cfg.gemm is not None:
      g = cfg.gemm
      for key, table in g['latency_ms'].items():
        self._gemm[key] = LogGrid((g['m'], g['n'], g['k']),
                                  np.asarray(table) * 1e-3, GEMM_ABOVE,
                                  GEMM_BELOW)
    self.gemm_dtypes = set(self._gemm)
    self._attention = None
    if cfg.attention is not None:
      a = cfg.attention
      lat = np.asarray(a['latency_ms']['bfloat16']) * 1e-3
      self._attention = LogGrid((a['head_dim'], a['isl'], a['heads']), lat,
                                ATTENTION_ABOVE, ATTENTION_BELOW)
    self.has_attention = self._attention is not None
    #: The system ``fused_attention_efficiency`` the attention table stands
    #: for (the file's when the table was imported), or None.
    self.attention_reference_efficiency = None if cfg.attention is None \
      else cfg.attention.get('fused_attention_efficiency')
    self._nccl = {}
    if cfg.nccl is not None:
      c = cfg.nccl
      for op, table in c['latency_ms'].items():
        self._nccl[op] = LogGrid((c['gpus'], c['bytes']),
                                 np.asarray(table) * 1e-3, NCCL_ABOVE,
                                 NCCL_BELOW)
    self.has_nccl = bool(self._nccl)
    self.nccl_max_gpus = max(cfg.nccl['gpus']) if self._nccl else 0
    #: Sustained over burst clock of the GEMM and attention tables (the
    #: file's ``measured.sustained_clock``, 1 without; a scalar, or an
    #: array along a leading axis in calibration): their times are divided
    #: by it.
    self.clock = 1.0 if getattr(cfg, 'sustained_clock', None) is None \
      else cfg.sustained_clock
    #: Time of a block-scaled 8-bit GEMM over the 'fp8' table's (the
    #: file's ``measured.block_scaled_gemm_ratio``, 1 without;
    #: :data:`MXFP8_GEMM_RATIO`).
    self.block_scaled_ratio = 1.0 if getattr(
      cfg, 'block_scaled_gemm_ratio', None) is None \
      else float(cfg.block_scaled_gemm_ratio)

  def terms(self):
    """The terms the tables price, in words (list of str): which of the
    engine's times came from measurement."""
    out = []
    if self._gemm:
      scaled = ''
      if 'fp8' in self._gemm and self.block_scaled_ratio != 1.0:
        scaled = f'; MXFP8 as fp8 x {self.block_scaled_ratio:.3f}'
      out.append('GEMM (' + ', '.join(sorted(self._gemm)) + scaled + ')')
    if self.has_attention:
      out.append('attention forward (backward x '
                 f'{ATTENTION_BACKWARD_RATIO:.2f})')
    if self._nccl:
      out.append('NCCL on tier 0 (' + ', '.join(sorted(self._nccl)) + ')')
    return out

  def describe(self):
    """One line: what is measured and where it comes from."""
    src = self.cfg.source or {}
    origin = ' '.join(str(src[k]) for k in ('package', 'package_version',
                                            'gpu') if src.get(k))
    table = self.cfg.gemm or self.cfg.attention or {}
    if table.get('framework'):
      origin += f" ({table['framework']} {table.get('version', '')})"
    return '; '.join(self.terms()) + (f' from {origin.strip()}'
                                      if origin.strip() else '')

  def gemm_dtype_key(self, dtype_name):
    """The GEMM table key for Calculon datatype ``dtype_name``, or None
    (no table: the curve prices it)."""
    key = GEMM_DTYPES.get(dtype_name)
    return key if key in self._gemm else None

  def gemm_time_s(self, key, m, n, k):
    """Seconds of one GEMM ``x (m, k) @ W (n, k)^T`` in table datatype
    ``key`` (arrays broadcast; a dimension of 0 takes 0 s), the table's
    time over :attr:`clock`."""
    t = self._gemm[key](np.maximum(m, 1e-9), np.maximum(n, 1e-9),
                        np.maximum(k, 1e-9))
    t = t / self.clock
    return np.where((np.asarray(m) > 0) & (np.asarray(n) > 0) &
                    (np.asarray(k) > 0), t, 0.0)

  def input_quantize_bytes(self, key, m, k):
    """Bytes of each kernel (a tuple, possibly empty) with which the table
    op of datatype ``key`` quantizes its ``x`` (``m``, ``k``) input
    (:data:`GEMM_INPUT_QUANTIZE_BYTES`; arrays broadcast)."""
    elems = np.asarray(m, float) * np.asarray(k, float)
    return tuple(b * elems for b in GEMM_INPUT_QUANTIZE_BYTES.get(key, ()))

  def attention_flops_per_s(self, head_dim, seq, heads):
    """Achieved FLOP/s of the measured causal attention forward at head
    width ``head_dim``, sequence ``seq`` and ``heads`` (batch x query
    heads), arrays broadcast: the table's FLOP (:data:`ATTENTION_CAUSAL_
    SHARE` of 4 h s^2 d) over its interpolated latency, times
    :attr:`clock`."""
    head_dim = np.maximum(head_dim, 1.0)
    seq = np.maximum(seq, 1.0)
    heads = np.maximum(heads, 1.0)
    flops = 4.0 * ATTENTION_CAUSAL_SHARE * heads * seq * seq * head_dim
    return flops / self._attention(head_dim, seq, heads) * self.clock

  def has_collective(self, op):
    """True when the NCCL table has Calculon collective ``op``."""
    return NCCL_OPS.get(op) in self._nccl

  def collective_time_s(self, op, op_bytes, gpus):
    """Seconds of NCCL collective ``op`` (Calculon's name) of an
    ``op_bytes`` buffer (nccl-tests' size: the gathered output of an
    all-gather, the input of a reduce-scatter, the buffer of an
    all-reduce, the send buffer of an all-to-all) among ``gpus`` GPUs of
    one node (arrays broadcast; 0 bytes or one GPU: 0 s)."""
    t = self._nccl[NCCL_OPS[op]](np.maximum(gpus, 1.0),
                                 np.maximum(op_bytes, 1.0))
    return np.where((np.asarray(op_bytes) > 0) & (np.asarray(gpus) > 1), t,
                    0.0)


def gemm_time_s(system, m, n, k, dtype):
  """Seconds of the GEMM ``x (m, k) @ W (n, k)^T`` on ``system`` (a
  :class:`~calculon.hardware.System`) in Calculon datatype ``dtype``
  (name): from the system's measured GEMM table when it has one for the
  datatype (the inference Linear layer the table times, its input cast
  included: what serving runs), else from its matrix engine's curve at 2
  m n k FLOP.  Arrays broadcast."""
  from calculon.config.execution import DATATYPE_NAMES
  kernels = system.measured
  key = None if kernels is None else kernels.gemm_dtype_key(dtype)
  if key is not None:
    return kernels.gemm_time_s(key, m, n, k)
  flops = 2.0 * np.asarray(m, float) * n * k
  return system.matrix.time_s(DATATYPE_NAMES.index(dtype), flops)


def collective_time_s(system, op, op_bytes, gpus, tier=0):
  """Seconds of collective ``op`` ('all_gather', 'reduce_scatter',
  'all_reduce', 'all_to_all') of an ``op_bytes`` buffer among ``gpus``
  processors on network tier ``tier`` of ``system``: the measured NCCL
  table on tier 0 when the system has one, else the network model
  (:meth:`calculon.hardware.network.Networks.time_s`)."""
  return system.networks.time_s(op, op_bytes, gpus, tier)
