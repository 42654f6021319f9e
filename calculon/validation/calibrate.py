"""Calibration of a system file to measured runs, and cross-validation.

``calculon calibrate RUNS.csv SYSTEM.json -o CALIBRATED.json`` fits a few
physically meaningful parameters of a system file (:data:`PARAMETERS`) to
the measured runs that use it, so that the calibrated file -- an ordinary
system file -- gives the calibrated predictions to every command.

Parameters (each a multiplicative scale of the file's values, 1 = the file,
except the overheads, in seconds):

* ``matrix``: the matrix engine's efficiency curves (every datatype);
* ``matrix_narrow``: the float8 / float4 curves on top of ``matrix``
  (narrow-precision GEMMs reach a different share of their peak);
* ``vector``: the vector engine's and memory tier 1's efficiency curves
  (element-wise, memory-bound work);
* ``attention``, ``moe``: the optional ``fused_attention_efficiency`` and
  ``grouped_gemm_efficiency`` (1 when absent): fused attention kernels and
  grouped expert GEMMs reach a lower share of peak than dense GEMMs;
* ``net0``, ``net1``, ...: network tier i's efficiency;
* ``per_step_s``, ``per_microbatch_s``: the system's fixed overheads (the
  optional ``overhead`` field: host work the accelerators wait for).

A scale rewrites the curves (each efficiency multiplied, clamped to
(0, 1]); the fit is bounded so that the largest efficiency stays <= 1.

Fit (Isaev et al. leave calibration to the user; this follows the
recommendations of scipy's robust nonlinear least squares, Branch et al.
1999 trust-region reflective with a soft-L1 loss): residuals
``log(predicted / measured)`` of the runs, plus weak prior residuals
``log(theta / theta_prior) / sigma`` holding parameters the runs do not
inform near their prior (the file, or a pooled fit); network tiers, whose
file values are measured bus bandwidths, have a narrower prior
(:data:`MEASURED_SIGMA`).  Each run's prediction
is its fastest feasible execution, as in the published suite (with the
conventions' ``unstated.mode: default``, the fastest of those at the
framework defaults of the unstated settings, where one is feasible:
:func:`calculon.validation.mapping.choose`, the published suite's rule).
To keep a
fit fast the engine is linearized (:class:`Surrogate`): for every run its
fastest candidate executions are priced once at the prior and along a grid
of each parameter (one vectorized engine call per run, with an
array-valued system, :class:`ScaledSystem`); the prediction for any
parameters is then an interpolation, refined by re-linearizing at the fit.
Predictions of held-out runs are always exact engine evaluations.

Uncertainty: the covariance of the parameters from the Jacobian at the
solution, ``(J^T J)^-1 s^2`` (s^2 the residual variance), reported as
standard errors and correlations; a pair correlated beyond 0.95 is
warned about, and a parameter no run is sensitive to (or more parameters
than runs) is refused.
"""

import copy
from dataclasses import dataclass, field
import math

import numpy as np

from calculon.config.execution import DATATYPE_NAMES, NARROW_DATATYPES
from calculon.errors import ConfigError
from calculon.hardware import System
from calculon.hardware.network import Networks
from calculon.validation.system_files import CALIBRATED_NOTE

#: Names and meanings of the calibration parameters (``netN`` for any
#: tier N).
PARAMETERS = {
  'matrix': 'scale of the matrix-engine efficiency curves (every datatype)',
  'matrix_narrow': 'scale of the float8/float4 matrix curves, on top of '
  'matrix',
  'vector': 'scale of the vector-engine and memory-tier-1 efficiency curves',
  'attention': 'scale of the fused-attention efficiency '
  '(fused_attention_efficiency, 1 when the file has none)',
  'moe': 'scale of the grouped expert GEMM efficiency '
  '(grouped_gemm_efficiency, 1 when the file has none)',
  'net0': 'scale of network tier 0 efficiency',
  'net1': 'scale of network tier 1 efficiency',
  'clock': 'sustained over burst clock of the measured GEMM and attention '
  'tables (measured.sustained_clock, 1 when the file has none), within '
  '[0.8, 1]',
  'overlap': 'scale of every network tier\'s processor_usage (the share '
  'of the compute an overlapped transfer takes), the largest kept within '
  '[0.05, 0.30]',
  'per_step_s': 'fixed overhead per batch (s)',
  'per_microbatch_s': 'fixed overhead per microbatch of a replica (s)',
  'per_moe_block_s': 'host time per MoE block and microbatch (s), a floor '
  'under its GPU work (host-bound MoE layers)',
}
#: Parameters tried when --params is not given (the undetermined ones are
#: dropped, with a note).  No fixed host overhead is tried: a per-step
#: constant is told apart from the rest only by how step times differ
#: between a cluster's runs, which is mostly how their sizes differ, so it
#: absorbs size-dependent error -- fitted at 0.07-0.76 s on runs of 3-100 s
#: steps, it made held-out runs of 1-2 s steps 25-36 % too slow
#: (docs/accuracy.md, section 4); a per-microbatch one trades against the
#: matrix scale the same way -- fitted at 15 ms per microbatch beside
#: matrix 1.23 on the DGX H100 runs (2026-11-27), it priced every run's
#: GEMMs faster than the measured maximum matmul rate and taxed each
#: microbatch, and the search answered with fewer, larger microbatches
#: (its tuned-recipe median 1.087 -> 1.121).  ``--params per_step_s`` or
#: ``per_microbatch_s`` still fits them.
DEFAULT_PARAMETERS = ('matrix', 'matrix_narrow', 'net1',
                      'moe', 'net0', 'vector', 'attention', 'per_moe_block_s',
                      'clock', 'overlap')
#: Parameters the automatic choice tries only on systems with measured
#: tables: there the compute is taken from measurement, so what an
#: overlapped transfer costs it is among the few things left unmeasured;
#: on the datasheet files the matrix scale carries it (the two trade).
MEASURED_ONLY = ('overlap',)
OVERHEADS = ('per_step_s', 'per_microbatch_s', 'per_moe_block_s')
#: Overheads that are floors under the GPU work, not additions (the engine
#: prices them; the surrogate approximates them, :func:`surrogate_time`).
FLOORS = ('per_moe_block_s',)
#: Upper bounds of the overheads (s).
OVERHEAD_BOUNDS = {'per_step_s': 60.0, 'per_microbatch_s': 1.0,
                   'per_moe_block_s': 0.05}
#: Lowest scale of an efficiency.
MIN_SCALE = 0.1
#: Highest scale of the matrix curves: no GEMM of a training run beats
#: the measured maximum achievable matmul rate, which is the top step of
#: every bundled datasheet file's curves (their notes).
MATRIX_SCALE_MAX = 1.0
#: Bounds of the sustained clock (``measured.sustained_clock``): the
#: measured tables are timed in bursts at boost clock (the median of the
#: fastest iterations, as stas00/ml-engineering compute/accelerator/
#: benchmarks/mamf-finder.py does for its maximum achievable matmul
#: FLOPS), while a training step runs for seconds at the clock its power
#: limit sustains; at most 20 % below the burst, never above it.
CLOCK_BOUNDS = (0.8, 1.0)
#: Bounds of the largest tier's processor_usage under the ``overlap``
#: scale: the files' 0.15 is 20 of an H800's 132 SMs driving overlapped
#: communication (DeepSeek-AI 2024, DeepSeek-V3 section 3.2.2); Lee et al.
#: 2025 (arXiv 2507.03114) measured an average 18.9 % slowdown of compute
#: overlapped with communication (SM and memory-bandwidth contention
#: together); 0.05 to 0.30 brackets both.
OVERLAP_USAGE_BOUNDS = (0.05, 0.30)
#: Points (x = prior / theta: the time multiplier of a scaled component)
#: where the engine is evaluated along each parameter (the surrogate).
AXIS_POINTS = (0.55, 0.7, 0.85, 1.0, 1.2, 1.45, 1.8, 2.4)
#: Overhead values (s) the surrogate needs none for: they add exactly.
#: Candidates kept per run (the fastest at the linearization point).
TOP_CANDIDATES = 6
#: Correlation beyond which a pair of parameters is warned about.
CORRELATION_WARNING = 0.95
#: Expected error of one prediction (log units, ~10 %): the runs'
#: residuals are divided by it, so a prior of width PRIOR_SIGMA weighs like
#: (RESIDUAL_SIGMA / PRIOR_SIGMA)^2 of one fully sensitive run.
RESIDUAL_SIGMA = 0.1
#: Robust loss and its scale (in units of RESIDUAL_SIGMA): runs off by
#: more than about 10 % count less than quadratically.
LOSS, F_SCALE = 'cauchy', 1.0


#: Parameters scaling an optional efficiency field of the system file.
_EFFICIENCY_FIELDS = {'attention': 'fused_attention_efficiency',
                      'moe': 'grouped_gemm_efficiency'}


def is_scale(name):
  return name not in OVERHEADS


def _narrow(dtype):
  return dtype in NARROW_DATATYPES


def _max_eff(curve):
  return max(e for _, e in curve)


#: Parameters a system's measured table replaces (``measured.<table>``):
#: calibration fits only what is not measured.
MEASURED_PARAMETERS = {'matrix': 'gemm', 'matrix_narrow': 'gemm',
                       'attention': 'attention', 'net0': 'nccl'}


def parameter_bounds(cfg, name, theta=None):
  """(low, high) of parameter ``name`` for system JSON ``cfg``: a scale
  keeps every efficiency it multiplies <= 1, and the matrix scales (the
  narrow one times the matrix one) at most :data:`MATRIX_SCALE_MAX` (the
  files' top step is the measured maximum achievable matmul rate).

  Raises:
    ConfigError: a parameter unknown, or a network tier the file lacks.
  """
  theta = theta or {}
  if name in OVERHEADS:
    return 0.0, OVERHEAD_BOUNDS[name]
  table = MEASURED_PARAMETERS.get(name)
  if table is not None and table in (cfg.get('measured') or {}):
    raise ConfigError(f"parameter {name!r} is not allowed: the system prices "
                      f"what it scales from its measured {table} table",
                      field='params', value=name)
  if name == 'clock':
    measured = cfg.get('measured') or {}
    if 'gemm' not in measured and 'attention' not in measured:
      raise ConfigError("parameter 'clock' is not allowed: the system has no "
                        'measured GEMM or attention table', field='params',
                        value=name)
    c = float(measured.get('sustained_clock', 1.0))
    return CLOCK_BOUNDS[0] / c, CLOCK_BOUNDS[1] / c
  if name == 'overlap':
    top = max(float(n.get('processor_usage', 0.0)) for n in cfg['networks'])
    if top <= 0:
      raise ConfigError("parameter 'overlap' is not allowed: no network tier "
                        'has a processor_usage', field='params', value=name)
    return OVERLAP_USAGE_BOUNDS[0] / top, OVERLAP_USAGE_BOUNDS[1] / top
  if name == 'matrix':
    top = max(_max_eff(d['gflops_efficiency']) for d in cfg['matrix'].values())
    return MIN_SCALE, min(1.0 / top, MATRIX_SCALE_MAX)
  if name == 'matrix_narrow':
    narrow = [d for k, d in cfg['matrix'].items() if _narrow(k)]
    if not narrow:
      raise ConfigError("parameter 'matrix_narrow' is not allowed: the system "
                        'has no float8/float4 matrix engine', field='params',
                        value=name)
    top = max(_max_eff(d['gflops_efficiency']) for d in narrow)
    matrix = min(1.0, theta.get('matrix', 1.0))
    return MIN_SCALE, min(1.0 / top, MATRIX_SCALE_MAX) / matrix
  if name == 'vector':
    top = max([_max_eff(d['gflops_efficiency'])
               for d in cfg['vector'].values()] +
              [_max_eff(cfg['mem1']['MB_efficiency'])])
    return MIN_SCALE, 1.0 / top
  if name in _EFFICIENCY_FIELDS:
    return MIN_SCALE, 1.0 / cfg.get(_EFFICIENCY_FIELDS[name], 1.0)
  if name.startswith('net') and name[3:].isdigit():
    tier = int(name[3:])
    if tier >= len(cfg['networks']):
      raise ConfigError(f"parameter {name!r} is not allowed: the system has "
                        f"{len(cfg['networks'])} network tier(s)",
                        field='params', value=name)
    return MIN_SCALE, 1.0 / cfg['networks'][tier]['efficiency']
  raise ConfigError(f'parameter {name!r} is not allowed: one of '
                    f"{', '.join(PARAMETERS)} (netN for tier N)",
                    field='params', value=name)


def check_parameters(cfg, names):
  """The parameter names, checked against the system (see
  :func:`parameter_bounds`)."""
  for name in names:
    parameter_bounds(cfg, name)
  if len(set(names)) != len(names):
    raise ConfigError(f'--params {",".join(names)} is not allowed: a '
                      'parameter is named twice', field='params')
  return list(names)


def _round(x):
  return float(f'{x:.6g}')


def _scaled_curve(curve, scale):
  return [[t, _round(min(1.0, max(e * scale, 1e-6)))] for t, e in curve]


def apply(cfg, theta, note=None):
  """A copy of system JSON ``cfg`` with the parameters ``theta`` (name ->
  value) written into it: curves multiplied (clamped to (0, 1]), network
  efficiencies multiplied, overheads set; ``note`` appended to ``notes``."""
  out = copy.deepcopy(cfg)
  m, n = theta.get('matrix', 1.0), theta.get('matrix_narrow', 1.0)
  for dtype, d in out['matrix'].items():
    s = m * (n if _narrow(dtype) else 1.0)
    if s != 1.0:
      d['gflops_efficiency'] = _scaled_curve(d['gflops_efficiency'], s)
  v = theta.get('vector', 1.0)
  if v != 1.0:
    for d in out['vector'].values():
      d['gflops_efficiency'] = _scaled_curve(d['gflops_efficiency'], v)
    out['mem1']['MB_efficiency'] = _scaled_curve(out['mem1']['MB_efficiency'],
                                                 v)
  for name, key in _EFFICIENCY_FIELDS.items():
    a = theta.get(name, 1.0)
    if a != 1.0:
      out[key] = _round(min(1.0, out.get(key, 1.0) * a))
  u = theta.get('overlap', 1.0)
  for i, net in enumerate(out['networks']):
    s = theta.get(f'net{i}', 1.0)
    if s != 1.0:
      net['efficiency'] = _round(min(1.0, net['efficiency'] * s))
    if u != 1.0 and net.get('processor_usage'):
      net['processor_usage'] = _round(min(0.99, net['processor_usage'] * u))
  c = theta.get('clock', 1.0)
  if c != 1.0 and out.get('measured'):
    out['measured'] = dict(out['measured'])
    out['measured']['sustained_clock'] = _round(min(
      1.0, float(out['measured'].get('sustained_clock', 1.0)) * c))
  if any(k in theta for k in OVERHEADS):
    over = dict(out.get('overhead', {}))
    for k in OVERHEADS:
      if k in theta:
        over[k] = _round(theta[k])
    out['overhead'] = over
  if note:
    notes = out.get('notes', [])
    notes = [notes] if isinstance(notes, str) else list(notes)
    out['notes'] = notes + ([note] if isinstance(note, str) else list(note))
  return out


def file_overheads(cfg):
  """name -> value (s) of every overhead (:data:`OVERHEADS`) of a system
  JSON (0 when absent)."""
  over = cfg.get('overhead') or {}
  return {k: float(over.get(k, 0.0)) for k in OVERHEADS}


# -- an array-valued system ----------------------------------------------------------

class _ScaledProcessor:
  """A processor whose efficiencies are multiplied by ``scale`` (and
  ``narrow`` for float8/float4), arrays broadcast along a leading axis."""

  def __init__(self, base, scale, narrow=1.0):
    self.base = base
    self.scale, self.narrow = scale, narrow

  def supports(self, dtype):
    return self.base.supports(dtype)

  def peak_flops(self, dtype):
    return self.base.peak_flops(dtype)

  def _time(self, code, op_flops):
    eff = self.base._curves[code](op_flops)
    s = self.scale * (self.narrow if _narrow(DATATYPE_NAMES[code]) else 1.0)
    eff = np.minimum(eff * s, 1.0)
    return op_flops / (self.base._peak[code] * eff)

  def time_s(self, dtype, op_flops):
    if np.ndim(dtype) == 0:
      return self._time(int(dtype), op_flops)
    out = 0.0
    for code in np.unique(dtype):
      out = np.where(dtype == code, self._time(int(code), op_flops), out)
    return out


class _ScaledMemory:
  def __init__(self, base, scale):
    self.base = base
    self.scale = scale
    self.capacity_bytes = base.capacity_bytes
    self.bandwidth_bytes_per_s = base.bandwidth_bytes_per_s

  def time_s(self, op_bytes):
    eff = np.minimum(self.base.efficiency(op_bytes) * self.scale, 1.0)
    return op_bytes / (self.bandwidth_bytes_per_s * eff)


class _ScaledNetworks(Networks):
  """Network tiers with each tier's efficiency multiplied by its scale
  (capped at 1): :class:`Networks` with its :meth:`rate` scaled."""

  def __init__(self, base, scales):
    self.__dict__.update(base.__dict__)
    self.scales = scales
    self.usage_scale = 1.0
    self.bw = np.array([t.bandwidth_bytes_per_s for t in base.tiers])
    self.eff = np.array([t.efficiency for t in base.tiers])

  def usage(self, tier):
    return np.minimum(self.processor_usage[tier] * self.usage_scale, 0.99)

  def rate(self, tier):
    rate = 0.0
    for t in range(len(self.tiers)):
      eff = np.minimum(self.eff[t] * self.scales[t], 1.0)
      rate = np.where(tier == t, self.bw[t] * eff, rate)
    return rate


class ScaledSystem(System):
  """The system of a JSON file with the calibration parameters applied on
  the fly, each parameter an array along a leading axis (K values): the
  engine then prices K parameter sets of every execution in one call
  (times gain that leading axis; feasibility does not depend on them).
  For one set it equals ``System(apply(cfg, theta))`` up to the rounding
  :func:`apply` writes.

  Args:
    cfg: system JSON object.
    theta: name -> scalar or 1-d array (same length K for all arrays).
    ndim: dimensions of the executions the system will price (the K axis
      is put in front of them).
  """

  def __init__(self, cfg, theta, ndim=1, source='<system>'):
    super().__init__(cfg, source)

    def arr(name, default):
      value = theta.get(name, default)
      if np.ndim(value) == 0:
        return float(value)
      return np.asarray(value, dtype=float).reshape((-1,) + (1,) * ndim)
    self.matrix = _ScaledProcessor(self.matrix, arr('matrix', 1.0),
                                   arr('matrix_narrow', 1.0))
    self.vector = _ScaledProcessor(self.vector, arr('vector', 1.0))
    self.mem1 = _ScaledMemory(self.mem1, arr('vector', 1.0))
    self.networks = _ScaledNetworks(self.networks, [
      arr(f'net{i}', 1.0) for i in range(len(self.networks.tiers))])
    self.networks.usage_scale = arr('overlap', 1.0)
    if self.measured is not None:
      self.measured = copy.copy(self.measured)
      self.measured.clock = self.measured.clock * arr('clock', 1.0)
    for name, key in _EFFICIENCY_FIELDS.items():
      base = cfg.get(key)
      scale = arr(name, 1.0)
      if base is not None or np.any(np.asarray(scale) != 1.0):
        setattr(self, key, np.minimum(1.0, (1.0 if base is None else base)
                                      * scale))
    # Overheads are added outside the engine (they add exactly); the MoE
    # host floor is not an addition: the engine prices it (scalar only).
    self.overhead_per_step_s = None
    self.overhead_per_microbatch_s = None
    host = theta.get('per_moe_block_s', 0.0)
    self.overhead_per_moe_block_s = float(host) if np.ndim(host) == 0 \
      else 0.0


# -- pricing a run at given parameters -----------------------------------------------

def engine_parameters(cfg):
  """Parameters that change the engine's times for system JSON ``cfg`` (the
  overheads add outside it)."""
  names = ['matrix']
  if any(_narrow(k) for k in cfg['matrix']):
    names.append('matrix_narrow')
  names += ['vector', 'attention', 'moe']
  names += [f'net{i}' for i in range(len(cfg['networks']))]
  measured = cfg.get('measured') or {}
  if 'gemm' in measured or 'attention' in measured:
    names.append('clock')
  if any(n.get('processor_usage') for n in cfg['networks']):
    names.append('overlap')
  return names


def _grid_times(case, cfg, theta):
  """(times, ok mask, microbatches, evaluation) of the candidate grid of
  ``case`` on system JSON ``cfg`` with parameters ``theta`` (scalars), the
  engine's times without overheads; ok: feasible, or -- when no candidate
  is -- those failing only for memory (the run ran: the model's memory
  estimate is what is off, as in the published suite)."""
  from calculon.llm import evaluate_columns
  from calculon.llm.model import MEM1_TOO_SMALL
  from calculon.validation.mapping import (candidate_allowed,
                                          candidate_columns, choose)
  from calculon.validation.published import layer_time_s
  exe = candidate_columns(case)
  system = ScaledSystem(cfg, {k: v for k, v in theta.items()
                              if k not in OVERHEADS or k in FLOORS},
                        ndim=len(exe.shape))
  ev = evaluate_columns(case.priced_app, system, exe, validate=False)
  shape = exe.shape
  with np.errstate(all='ignore'):
    t = layer_time_s(ev) if case.metric == 'layer_fwd_plus_bwd_ms' \
      else ev.total_time_s
  t = np.where(candidate_allowed(case, exe),
               np.broadcast_to(np.asarray(t, dtype=float), shape), np.nan)
  ok = np.broadcast_to(ev.feasible, shape) & np.isfinite(t)
  if not ok.any():
    ok = (np.broadcast_to(ev.reason, shape) == MEM1_TOO_SMALL) & np.isfinite(t)
  # The candidates the published suite chooses among (all, or those at the
  # framework defaults of the unstated settings): one convention.
  ok = choose(case, ok)[0]
  nmb = np.broadcast_to(ev.num_microbatches, shape).astype(float)
  return t, ok, nmb, ev


def _overhead(theta, nmb, layer):
  if layer:
    return 0.0
  return theta.get('per_step_s', 0.0) + theta.get('per_microbatch_s', 0.0) \
    * nmb


def exact_prediction(case, cfg, theta):
  """(predicted seconds, grid index) of ``case``: the fastest feasible
  candidate on system JSON ``cfg`` with parameters ``theta`` applied (the
  engine exactly, overheads included); (None, None) when nothing can be
  priced."""
  from calculon.validation.published import _dtype_code  # noqa: F401
  t, ok, nmb, _ = _grid_times(case, cfg, theta)
  if not ok.any():
    return None, None
  total = t + _overhead(theta, nmb, case.metric == 'layer_fwd_plus_bwd_ms')
  masked = np.where(ok, total, np.inf)
  best = np.unravel_index(int(np.argmin(masked)), t.shape)
  return float(masked[best]), best


@dataclass
class Run:
  """One measured run linearized for fitting (see :class:`Surrogate`).

  Attributes: case; system (name); cfg (its JSON, the row's field changes
  applied); measured_s; lin (parameters of the linearization); names (the
  engine parameters along the axes); times (K x C engine times of the C
  kept candidates at the K points: the linearization point, then
  AXIS_POINTS along each parameter); nmb (C microbatches); layer (a
  per-layer measurement: no overheads); for the MoE host floor, per
  candidate at the linearization point: gpu_mb (the stage's block GPU
  time per microbatch, s), moe_blocks (MoE blocks of the stage whose
  kernels the host launches one by one), bubble_factor (1 + bubble /
  block GPU time); None without experts.
  """
  case: object
  system: str
  cfg: dict
  measured_s: float
  lin: dict = field(default_factory=dict)
  names: list = field(default_factory=list)
  times: np.ndarray = None
  nmb: np.ndarray = None
  layer: bool = False
  gpu_mb: np.ndarray = None
  moe_blocks: np.ndarray = None
  bubble_factor: np.ndarray = None

  @property
  def id(self):
    return self.case.id

  @property
  def group(self):
    return self.case.group


def linearize(case, cfg, lin, measured_s, system_name):
  """A :class:`Run` of ``case`` linearized at parameters ``lin`` (every
  engine parameter; missing ones are 1): its fastest candidates, priced at
  ``lin`` and along :data:`AXIS_POINTS` of each engine parameter in one
  engine call.  None when nothing can be priced."""
  from calculon.llm import evaluate_columns
  from calculon.validation.mapping import execution_at, records_columns
  from calculon.validation.published import layer_time_s
  names = engine_parameters(cfg)
  lin = {k: lin.get(k, 1.0) for k in names}
  t, ok, nmb, _ = _grid_times(case, cfg, lin)
  if not ok.any():
    return None
  flat_t = np.where(ok, t, np.inf).reshape(-1)
  order = np.argsort(flat_t, kind='stable')
  keep = [i for i in order[:TOP_CANDIDATES] if np.isfinite(flat_t[i])]
  idx = [np.unravel_index(int(i), t.shape) for i in keep]
  records = [execution_at(case, i) for i in idx]
  cols = records_columns(case, records)
  points = [dict(lin)]
  for name in names:
    for x in AXIS_POINTS:
      if x != 1.0:
        point = dict(lin)
        point[name] = lin[name] / x
        points.append(point)
  theta = {k: np.array([p[k] for p in points]) for k in names}
  system = ScaledSystem(cfg, theta, ndim=1)
  ev = evaluate_columns(case.priced_app, system, cols, validate=False)
  with np.errstate(all='ignore'):
    times = layer_time_s(ev) if case.metric == 'layer_fwd_plus_bwd_ms' \
      else ev.total_time_s
  times = np.broadcast_to(np.asarray(times, dtype=float),
                          (len(points), len(records))).copy()
  gpu_mb = moe_blocks = bubble = None
  if case.app.get('num_experts'):
    shape = (len(points), len(records))

    def first(x):
      return np.broadcast_to(np.asarray(x, dtype=float), shape)[0].copy()
    with np.errstate(all='ignore'):
      gpu0 = first(ev.fw_time_s + ev.bw_time_s + ev.recompute_time_s)
      gpu_mb = gpu0 / first(ev.num_microbatches)
      moe_blocks = first(ev.moe_host_blocks_per_proc)
      bubble = 1.0 + np.where(gpu0 > 0, first(ev.bubble_time_s) / gpu0, 0.0)
  return Run(case=case, system=system_name, cfg=cfg, measured_s=measured_s,
             lin=lin, names=names, times=times,
             nmb=np.array([nmb[i] for i in idx]),
             layer=case.metric == 'layer_fwd_plus_bwd_ms',
             gpu_mb=gpu_mb, moe_blocks=moe_blocks, bubble_factor=bubble)


_XS = np.array(AXIS_POINTS)
_ORDER = np.argsort(_XS)


def surrogate_time(run, theta):
  """Predicted seconds of ``run`` for parameters ``theta`` (the fastest of
  its kept candidates): the engine times interpolated along each
  parameter's axis around the linearization point, added up (each
  component of the batch time scales with one parameter), plus the
  overheads, which add exactly."""
  base = run.times[0]
  total = base.copy()
  xs = _XS[_ORDER]
  k = 1
  for name in run.names:
    n = len(AXIS_POINTS) - 1
    if name in theta:
      x = run.lin[name] / theta[name]
      if x != 1.0:
        rows = np.empty((len(AXIS_POINTS), len(base)))
        j = 0
        for i, p in enumerate(AXIS_POINTS):
          rows[i] = base if p == 1.0 else run.times[k + j]
          j += p != 1.0
        ys = rows[_ORDER]
        if x <= xs[0]:
          f = ys[0] + (ys[1] - ys[0]) * (x - xs[0]) / (xs[1] - xs[0])
        elif x >= xs[-1]:
          f = ys[-1] + (ys[-1] - ys[-2]) * (x - xs[-1]) / (xs[-1] - xs[-2])
        else:
          hi = int(np.searchsorted(xs, x))
          w = (x - xs[hi - 1]) / (xs[hi] - xs[hi - 1])
          f = ys[hi - 1] * (1 - w) + ys[hi] * w
        total = total + (f - base)
    k += n
  total = total + _overhead(theta, run.nmb, run.layer)
  host = theta.get('per_moe_block_s', 0.0)
  if host and run.moe_blocks is not None:
    # The stage's GPU time per microbatch moves with the scales as the
    # whole does (approximately); the engine prices the floor exactly.
    with np.errstate(all='ignore'):
      gpu_mb = run.gpu_mb * np.where(base > 0, total / base, 1.0)
    short = np.maximum(0.0, host * run.moe_blocks - gpu_mb)
    total = total + short * run.nmb * run.bubble_factor
  return float(np.min(total))


# -- the fit ------------------------------------------------------------------------

@dataclass
class Fit:
  """Result of :func:`fit`: parameters (name -> value), their standard
  errors and correlation matrix (same order as ``names``), the warnings,
  the log residuals log(predicted / measured) of the runs, and the number
  of runs."""
  names: list
  theta: dict
  stderr: dict
  correlation: np.ndarray
  warnings: list
  residuals: np.ndarray
  runs: int
  prior: dict = field(default_factory=dict)


def _z(name, value, sigma_over):
  return math.log(value) if is_scale(name) else value / sigma_over[name]


def _theta(name, z, sigma_over):
  return math.exp(z) if is_scale(name) else z * sigma_over[name]


#: Prior widths: log scale (1.0: a factor e) and overheads (s).
PRIOR_SIGMA = 1.0
OVERHEAD_SIGMA = {'per_step_s': 2.0, 'per_microbatch_s': 0.05,
                  'per_moe_block_s': 0.01}


#: Narrower prior widths (log units) of the scales whose file values are
#: measurements of that very quantity, by name prefix: a network tier's
#: efficiency is the collective bus bandwidth nccl-tests measure over the
#: link rate (the bundled files: 78-82 % on NVLink across A100, H200 and
#: B200, 73-74 % per NIC across nodes; S. Bekman, "Machine Learning
#: Engineering", network/README.md), so a fit may move it by about a
#: quarter (0.25 in log), not by a factor e: a tier the runs exercise only
#: through work the model misprices (an all-to-all of MoE runs) must not
#: absorb that work's error and carry it to every other run on the tier.
MEASURED_SIGMA = {'net': 0.25}


def _prior_width(name, sigma):
  """Width of ``name``'s prior residual (z units): overheads 1 (their z
  is already in prior widths); scales ``sigma``, except that with the
  default width (:data:`PRIOR_SIGMA`) :data:`MEASURED_SIGMA` narrows the
  measured ones -- a width the caller chooses (``--prior-sigma``) holds
  for every scale."""
  if not is_scale(name):
    return 1.0
  if sigma == PRIOR_SIGMA:
    for prefix, width in MEASURED_SIGMA.items():
      if name.startswith(prefix):
        return width
  return sigma


def _bounds(runs, names, theta):
  lo, hi = [], []
  for name in names:
    b = [parameter_bounds(r.cfg, name, theta) for r in runs]
    lo.append(max(x for x, _ in b))
    hi.append(min(x for _, x in b))
  return lo, hi


def determined(runs, names, prior, sigma=PRIOR_SIGMA):
  """(determined names, reasons of the others): a parameter is determined
  when some run's time changes by 1 % or more over a 10 % change of it, and
  the runs' Jacobian has full rank (no parameter is a combination of
  others: singular value ratio above 1e-3); there must be more runs than
  parameters."""
  if not names:
    return [], []
  reasons = []
  jac = _data_jacobian(runs, names, prior)
  ok = []
  for j, name in enumerate(names):
    # Scales: d log(time) / d log(scale) >= 0.1 for some run; overheads:
    # one prior width (OVERHEAD_SIGMA) changes some run by >= 1 %.
    need = 0.1 if is_scale(name) else 0.01
    if np.max(np.abs(jac[:, j])) < need:
      reasons.append(f'{name}: no run is sensitive to it')
    else:
      ok.append(j)
  if ok:
    sv = np.linalg.svd(jac[:, ok], compute_uv=False)
    if len(sv) and sv[-1] < 1e-3 * sv[0]:
      reasons.append('the runs cannot separate ' + ', '.join(
        names[j] for j in ok) + ' (their Jacobian is rank deficient)')
      return [], reasons
  kept = [names[j] for j in ok]
  if len(runs) <= len(kept):
    reasons.append(f'{len(runs)} run(s) cannot determine {len(kept)} '
                   'parameter(s): fewer runs than parameters + 1')
    return [], reasons
  return kept, reasons


def _data_jacobian(runs, names, theta):
  """d log(prediction) / d z of each run (z: log scale, overhead / sigma)."""
  base = np.array([math.log(surrogate_time(r, theta)) for r in runs])
  jac = np.zeros((len(runs), len(names)))
  for j, name in enumerate(names):
    # Scales step down: an efficiency of 1 (a file without
    # fused_attention_efficiency...) cannot go up, so the other side is
    # flat.
    # A floor is flat until it exceeds the GPU work: its sensitivity is
    # the secant over one prior width.
    step = -1e-3 if is_scale(name) else OVERHEAD_SIGMA[name] * (
      1.0 if name in FLOORS else 1e-3)
    t = dict(theta)
    t[name] = theta.get(name, 1.0 if is_scale(name) else 0.0)
    t[name] = t[name] * math.exp(step) if is_scale(name) else t[name] + step
    new = np.array([math.log(surrogate_time(r, t)) for r in runs])
    jac[:, j] = (new - base) / (step if is_scale(name) else
                                step / OVERHEAD_SIGMA[name])
  return jac


def fit(runs, names, prior, sigma=PRIOR_SIGMA, start=None,
        group_weights=True):
  """Fits parameters ``names`` to ``runs`` (a list of :class:`Run`) by
  robust nonlinear least squares on their surrogates.

  Args:
    prior: name -> the prior value (also the value of the parameters not
      fitted); sigma: width of the scales' prior (log).
    start: starting values (default: the prior).
    group_weights: weigh each source group (``Run.group``) by 1 /
      sqrt(its runs), so that a source with many runs does not outvote
      the others (runs of one source share hidden settings).

  Returns:
    :class:`Fit`.
  """
  from scipy.optimize import least_squares
  prior = dict(prior)
  theta0 = dict(prior)
  if start:
    theta0.update({k: v for k, v in start.items() if k in names})
  meas = np.array([math.log(r.measured_s) for r in runs])
  over = OVERHEAD_SIGMA
  # Runs of one source share its hidden settings and software: each source
  # group weighs as one run per sqrt(runs) (its runs' squared residuals
  # average instead of adding up).
  counts = {}
  for r in runs:
    counts[r.group] = counts.get(r.group, 0) + 1
  weight = np.array([1.0 / math.sqrt(counts[r.group]) for r in runs]) \
    if group_weights else np.ones(len(runs))

  def unpack(z):
    theta = dict(prior)
    for name, v in zip(names, z):
      theta[name] = _theta(name, v, over)
    return theta

  def residuals(z):
    theta = unpack(z)
    pred = np.array([surrogate_time(r, theta) for r in runs])
    data = weight * (np.log(pred) - meas) / RESIDUAL_SIGMA
    pri = []
    for name, v in zip(names, z):
      p = _z(name, prior[name], over)
      pri.append((v - p) / _prior_width(name, sigma))
    return np.concatenate([data, pri])

  lo, hi = _bounds(runs, names, prior)
  z_lo = [_z(n, max(l, 1e-9), over) if is_scale(n) else l / over[n]
          for n, l in zip(names, lo)]
  z_hi = [_z(n, h, over) for n, h in zip(names, hi)]
  # Trust-region reflective scales steps by the distance to the bounds, so
  # it must start inside them: the overheads at a fifth of their prior
  # width, every variable at least 2 % of its range from a bound.  A second
  # start below the prior guards against a local minimum.
  def inside(z):
    return [min(max(v, a + 0.02 * (b - a)), b - 0.02 * (b - a))
            for v, a, b in zip(z, z_lo, z_hi)]
  # A floor is flat below the runs' GPU times: it starts at one width.
  z0 = inside([_z(n, theta0[n], over) if is_scale(n) else
               max(_z(n, theta0[n], over), 1.0 if n in FLOORS else 0.2)
               for n in names])
  z1 = inside([v - 0.2 if is_scale(n) else v for n, v in zip(names, z0)])
  z = np.array([])
  if names:
    best = None
    for start_z in (z0, z1):
      res = least_squares(residuals, start_z, bounds=(z_lo, z_hi),
                          method='trf', loss=LOSS, f_scale=F_SCALE,
                          diff_step=1e-4, ftol=1e-10, xtol=1e-10,
                          gtol=1e-10)
      if best is None or res.cost < best.cost - 1e-12:
        best = res
    z = best.x
  theta = unpack(z)
  data = np.log(np.array([surrogate_time(r, theta) for r in runs])) - meas
  stderr, corr, warnings = {}, np.eye(len(names)), []
  if names:
    jac = weight[:, None] * _data_jacobian(runs, names, theta) / \
      RESIDUAL_SIGMA
    m, n = jac.shape
    pri = np.diag([1.0 / _prior_width(k, sigma) for k in names])
    a = jac.T @ jac + pri.T @ pri
    scaled = weight * data / RESIDUAL_SIGMA
    s2 = float(scaled @ scaled) / max(m - n, 1)
    try:
      cov = np.linalg.inv(a) * max(s2, 1e-12)
    except np.linalg.LinAlgError:
      cov = np.full((n, n), np.nan)
    sd = np.sqrt(np.abs(np.diag(cov)))
    with np.errstate(all='ignore'):
      try:
        dcov = np.linalg.inv(jac.T @ jac)
        dsd = np.sqrt(np.abs(np.diag(dcov)))
        corr = dcov / np.outer(dsd, dsd)
      except np.linalg.LinAlgError:
        corr = cov / np.outer(sd, sd)
    for j, name in enumerate(names):
      stderr[name] = theta[name] * sd[j] if is_scale(name) else \
        sd[j] * over[name]
    for j, name in enumerate(names):
      low, high = lo[j], hi[j]
      at_high = theta[name] >= high * (1 - 1e-4)
      at_low = theta[name] <= low * (1 + 1e-4) + (0 if is_scale(name)
                                                   else 1e-6)
      if at_high or at_low:
        want = ('more than the file can express (an efficiency of 1, or the '
                'overhead limit)') if at_high else (
          'less (a negative overhead)' if not is_scale(name) else
          'a lower efficiency than the bound')
        warnings.append(f'{name} stopped at its bound ({theta[name]:.4g}): '
                        f'the runs ask for {want}; its standard error does '
                        'not hold')
    for i in range(n):
      for j in range(i + 1, n):
        if abs(corr[i, j]) > CORRELATION_WARNING:
          warnings.append(f'{names[i]} and {names[j]} are strongly '
                          f'correlated (rho = {corr[i, j]:+.2f}): the runs '
                          'hardly tell them apart; consider fitting only '
                          'one of them')
  return Fit(names=list(names), theta=theta, stderr=stderr, correlation=corr,
             warnings=warnings, residuals=data, runs=len(runs),
             prior=dict(prior))


# -- choosing the parameters ---------------------------------------------------------

def available(runs, names):
  """``names`` restricted to parameters every run's system has."""
  out = []
  for name in names:
    try:
      for r in runs:
        parameter_bounds(r.cfg, name)
    except ConfigError:
      continue
    out.append(name)
  return out


def auto_candidates(runs, candidates=DEFAULT_PARAMETERS):
  """``candidates`` the automatic choice tries on ``runs``: those every
  run's system has (:func:`available`), :data:`MEASURED_ONLY` ones only
  when every run's system has measured tables."""
  measured = all(r.cfg.get('measured') for r in runs)
  return [n for n in available(runs, candidates)
          if n not in MEASURED_ONLY or measured]


#: Runs per parameter the automatic choice asks for.
RUNS_PER_PARAMETER = 3


def auto_parameters(runs, prior, candidates=DEFAULT_PARAMETERS):
  """The parameters of ``candidates`` the runs determine (see
  :func:`determined`), keeping at most one per :data:`RUNS_PER_PARAMETER`
  runs; when more are determined than that, the pursuit (:func:`_pursuit`)
  chooses among them, each only while it pays for itself; in the order
  given; (names, notes on those dropped)."""
  names = auto_candidates(runs, candidates)
  notes = []
  limit = len(runs) // RUNS_PER_PARAMETER
  if len(names) > limit:
    chosen = _pursuit(runs, names, prior, limit)
    left = [n for n in names if n not in chosen]
    if left:
      notes.append(
        f"{', '.join(left)}: left out, {len(runs)} runs fit at most "
        f'{limit} parameter(s) ({RUNS_PER_PARAMETER} runs each), chosen by '
        'how much of the error each explains, each while it pays for itself '
        '(Bayesian information criterion)')
    names = chosen
  while names:
    kept, reasons = determined(runs, names, prior)
    if kept == names:
      return names, notes
    notes += reasons
    names = kept if kept and kept != names else names[:-1]
  return [], notes


def pays_for_itself(gain, rss, n):
  """Whether one more parameter that removes ``gain`` of the residual sum of
  squares ``rss`` (both in squared log units) over ``n`` runs lowers the
  Bayesian information criterion n ln(RSS / n) + k ln(n) (Schwarz 1978,
  "Estimating the dimension of a model", Ann. Statist. 6(2)): the new sum
  must be below exp(-ln(n) / n) of the old (about 17 % less for 15 runs,
  10 % for 34).  False for n < 2 or rss <= 0."""
  if n < 2 or rss <= 0:
    return False
  return rss - gain < math.exp(-math.log(n) / n) * rss


def _pursuit(runs, names, prior, limit):
  """Up to ``limit`` of ``names`` chosen by orthogonal matching pursuit on
  the runs linearized at the prior (Pati et al. 1993): each step adds the
  parameter whose Jacobian column, with those already chosen, removes the
  most of the (source-weighted) log errors; it stops when a step removes
  less than 1 % of them, or when the best one does not pay for itself
  by the Bayesian information criterion (:func:`pays_for_itself`)."""
  if limit <= 0:
    return []
  counts = {}
  for r in runs:
    counts[r.group] = counts.get(r.group, 0) + 1
  w = np.array([1.0 / math.sqrt(counts[r.group]) for r in runs])
  resid = w * np.array([math.log(surrogate_time(r, prior) / r.measured_s)
                        for r in runs])
  jac = w[:, None] * _data_jacobian(runs, names, prior)
  total = float(resid @ resid)
  chosen, left = [], resid
  while len(chosen) < limit:
    best, best_left = None, None
    for j, name in enumerate(names):
      if name in chosen or not np.any(jac[:, j]):
        continue
      cols = jac[:, [names.index(c) for c in chosen] + [j]]
      coef, *_ = np.linalg.lstsq(cols, resid, rcond=None)
      rest = resid - cols @ coef
      if best is None or rest @ rest < best_left @ best_left:
        best, best_left = name, rest
    if best is None:
      break
    rss = float(left @ left)
    gain = rss - float(best_left @ best_left)
    if gain < 0.01 * total or not pays_for_itself(gain, rss, len(runs)):
      break
    chosen.append(best)
    left = best_left
  return [n for n in names if n in chosen]


def prior_of(cfg, names=()):
  """The file's values of the parameters: scales 1, overheads as written."""
  prior = {k: 1.0 for k in PARAMETERS if is_scale(k)}
  for i in range(len(cfg['networks'])):
    prior[f'net{i}'] = 1.0
  prior.update(file_overheads(cfg))
  for name in names:
    prior.setdefault(name, 1.0)
  return prior


def relinearize(runs, theta):
  """The runs linearized again at ``theta`` (their candidates re-searched
  with the engine at those parameters)."""
  out = []
  for r in runs:
    new = linearize(r.case, r.cfg, {k: theta.get(k, 1.0) for k in r.names},
                    r.measured_s, r.system)
    out.append(new if new is not None else r)
  return out


def fit_refined(runs, names, prior, sigma=PRIOR_SIGMA, refine=2):
  """:func:`fit`, then ``refine`` times: linearize the runs at the fitted
  parameters and fit again (same prior), stopping when no parameter moves
  by 0.1 %.  Returns (Fit, the runs as last linearized)."""
  result = fit(runs, names, prior, sigma)
  for _ in range(refine):
    runs = relinearize(runs, result.theta)
    new = fit(runs, names, prior, sigma, start=result.theta)
    moved = max([abs(math.log(new.theta[k] / result.theta[k]))
                 if is_scale(k) else abs(new.theta[k] - result.theta[k])
                 for k in names] + [0.0])
    result = new
    if moved < 1e-3:
      break
  return result, runs


# -- cross-validation -------------------------------------------------------------------

@dataclass
class Prepared:
  """Runs ready for calibration: ``runs`` (:class:`Run`, linearized at the
  file's values) and ``before`` (id -> exact uncalibrated prediction, s)."""
  runs: list
  before: dict


def prepare(suite, progress=None, systems=None):
  """Linearizes every priced row of a :class:`~calculon.validation.
  published.Suite` at its system file's values (``systems``: optional name
  -> JSON replacing a bundled file).  Rows the model cannot price are left
  out."""
  from calculon.validation.mapping import apply_system_set
  progress = progress or (lambda text_: None)
  runs, before = [], {}
  for case in suite.cases:
    if not case.expressible or case.measured_s is None:
      continue
    base = (systems or {}).get(case.system_name)
    cfg = suite.system_json(case) if base is None else apply_system_set(
      base, case.system_set)
    try:
      run = linearize(case, cfg, prior_of(cfg), case.measured_s,
                      case.cluster or case.system_name)
    except ConfigError:
      continue
    if run is None:
      continue
    # The file's overheads and MoE host floor, as the engine prices them.
    before[case.id] = surrogate_time(run, prior_of(cfg))
    runs.append(run)
    progress(f'  linearized {case.id}')
  return Prepared(runs, before)


def population_centre(others, sigma=PRIOR_SIGMA):
  """Prior centres of a cluster's scales from the runs of *other* clusters
  (empirical-Bayes partial pooling: each cluster's file-to-measured
  scales are taken as draws from one population, whose centre the other
  clusters' pooled fit estimates; A. Gelman et al., "Bayesian Data
  Analysis", 3rd ed., 2013, chapter 5, hierarchical models).  The
  datasheet files share their optimism (section 4 of docs/accuracy.md: a
  held-out source inherits it), so a cluster with few runs starts from
  what the others measured instead of from its file.

  Args:
    others: :class:`Run` list of other clusters (every scale is relative
      to its own file).

  Returns:
    dict scale name -> centre (the pooled fit's value; overheads are
    cluster-specific and keep their file values); {} when the runs
    determine nothing.
  """
  if len(others) < 2:
    return {}
  prior = prior_of(others[0].cfg)
  prior.update({k: 1.0 for r in others for k in r.names})
  chosen = available(others, auto_parameters(others, prior)[0])
  if not any(is_scale(k) for k in chosen):
    return {}
  # Overheads are fitted too (else a scale absorbs them), not returned.
  theta = fit(others, chosen, prior, sigma).theta
  return {k: theta[k] for k in chosen if is_scale(k)}


def _fold_theta(train, system, names, sigma, min_runs=2, population=True,
                cache=None):
  """Parameters for ``system`` from training runs: a fit on its own runs
  (prior: its file's values, or with ``population`` the centres that the
  training runs of the other clusters give, :func:`population_centre`), or
  -- when it has too few for any parameter -- on every training run of
  every system (pooled; the fitted scales are relative to each file).
  ``cache``: dict reused across calls (the centre of one set of other
  runs is fitted once).  Returns (theta, how)."""
  own = [r for r in train if r.system == system]
  if len(own) >= min_runs:
    prior = prior_of(own[0].cfg)
    centre = {}
    if population:
      cache = {} if cache is None else cache
      others = [r for r in train if r.system != system]
      key = tuple(sorted(r.id for r in others))
      if key not in cache:
        cache[key] = population_centre(others, sigma)
      centre = cache[key]
      prior.update({k: v for k, v in centre.items() if k in prior})
    chosen = names if names is not None else auto_parameters(own, prior)[0]
    chosen = available(own, chosen)
    pooled = ', pooled prior' if centre else ''
    if chosen:
      return (fit(own, chosen, prior, sigma).theta,
              f'own ({len(own)} runs{pooled})')
    if centre:
      return prior, f'pooled prior ({len(own)} own runs fit nothing)'
  if not train:
    return None, 'uncalibrated (no training runs)'
  prior = prior_of(train[0].cfg)
  prior.update({k: 1.0 for r in train for k in r.names})
  chosen = names if names is not None else auto_parameters(train, prior)[0]
  chosen = available(train, chosen)
  if not chosen:
    return None, 'uncalibrated (nothing determined)'
  return fit(train, chosen, prior, sigma).theta, f'pooled ({len(train)} runs)'


def cross_validate(prepared, mode='source', names=None, sigma=PRIOR_SIGMA,
                   systems=None, progress=None, population=True, extra=()):
  """Held-out predictions: ``mode`` 'source' (leave one source group out:
  fit on every other group, predict the held-out one) or 'run' (leave one
  run out).  Each held-out run's system is calibrated on the training runs
  of that system (or pooled over all training runs when it has too few,
  see :func:`_fold_theta`), and the run is priced exactly by the engine
  with those parameters.  ``systems``: restrict to runs of these systems.
  ``population``: the prior centres from the other clusters' training runs
  (:func:`population_centre`); ``extra``: runs of other clusters that
  train but are never held out (a single cluster's calibration passes the
  rest of the runs files here); a held-out source's runs leave them too.

  Returns a DataFrame: id, source, system, measured_s, before_s, after_s,
  delta_before_pct, delta_after_pct, how (the calibration used).
  """
  import pandas as pd
  progress = progress or (lambda text_: None)
  runs = [r for r in prepared.runs if systems is None or r.system in systems]
  all_runs = list(prepared.runs) + list(extra)
  centres = {}
  if mode == 'source':
    folds = [(g, [r for r in runs if r.group == g])
             for g in dict.fromkeys(r.group for r in runs)]
  elif mode == 'run':
    folds = [(r.id, [r]) for r in runs]
  else:
    raise ConfigError(f"--cv {mode!r} is not allowed: 'source' or 'run'",
                      field='cv', value=mode)
  rows = []
  for key, held in folds:
    held_ids = {r.id for r in held}
    held_groups = {r.group for r in held} if mode == 'source' else set()
    train = [r for r in all_runs if r.id not in held_ids and
             r.group not in held_groups]
    cache = {}
    for r in held:
      if r.system not in cache:
        cache[r.system] = _fold_theta(train, r.system, names, sigma,
                                      population=population, cache=centres)
      theta, how = cache[r.system]
      if theta is None:
        after = prepared.before[r.id]
      else:
        after, _ = exact_prediction(r.case, r.cfg, theta)
      rows.append({'id': r.id, 'source': r.group, 'system': r.system,
                   'measured_s': r.measured_s,
                   'before_s': prepared.before[r.id], 'after_s': after,
                   'how': how})
    progress(f'  fold {key}: {len(held)} run(s) held out')
  frame = pd.DataFrame(rows)
  if len(frame):
    frame['delta_before_pct'] = 100 * (1 - frame['before_s'] /
                                       frame['measured_s'])
    frame['delta_after_pct'] = 100 * (1 - frame['after_s'] /
                                      frame['measured_s'])
  return frame


def cv_summary(frame):
  """Per source and overall: rows, and before / after calibration the
  median |delta|, share within 10 % and 20 %, median signed delta."""
  import pandas as pd
  from calculon.validation.published import error_stats
  rows = {}
  parts = [(s, p) for s, p in frame.groupby('source', sort=False)]
  parts.append(('overall', frame))
  for source, part in parts:
    b = error_stats(part['delta_before_pct'])
    a = error_stats(part['delta_after_pct'])
    rows[source] = {
      'rows': a['n'],
      'before_median_abs': b['median_abs_delta_pct'],
      'before_within_10': b['within_10pct'],
      'before_within_20': b['within_20pct'],
      'before_bias': b['median_delta_pct'],
      'after_median_abs': a['median_abs_delta_pct'],
      'after_within_10': a['within_10pct'],
      'after_within_20': a['within_20pct'],
      'after_bias': a['median_delta_pct']}
  return pd.DataFrame.from_dict(rows, orient='index')


#: Columns of :func:`cv_summary` as printed: (column, kind, text header).
CV_COLUMNS = (
  ('before_median_abs', 'pct', 'before |d| med'),
  ('before_within_10', 'share', '<=10%'),
  ('before_within_20', 'share', '<=20%'),
  ('before_bias', 'signed', 'bias'),
  ('after_median_abs', 'pct', 'after |d| med'),
  ('after_within_10', 'share', '<=10% '),
  ('after_within_20', 'share', '<=20% '),
  ('after_bias', 'signed', 'bias '))


def cv_cells(summary, unit='%'):
  """The cells of :func:`cv_summary` as text, one Series per entry of
  :data:`CV_COLUMNS` (blank for a missing value); ``unit`` follows each
  number ('%', or ' %' for docs/accuracy.md)."""
  fmt = {'pct': lambda v: f'{v:.1f}{unit}',
         'share': lambda v: f'{100 * v:.0f}{unit}',
         'signed': lambda v: f'{v:+.1f}{unit}'}
  return [summary[col].map(
    lambda v, f=fmt[kind]: '' if v is None or v != v else f(v))
    for col, kind, _ in CV_COLUMNS]


def format_cv(summary, title):
  """Text table of :func:`cv_summary`."""
  import pandas as pd
  show = pd.DataFrame({'rows': summary['rows'], **{
    head: cells for (_, _, head), cells in zip(CV_COLUMNS,
                                               cv_cells(summary))}})
  return f'{title}\n{show.to_string()}'


# -- calibrating one system file ---------------------------------------------------------

@dataclass
class Calibration:
  """Outcome of :func:`calibrate_system`: the selected runs (their ids),
  the parameters fitted (:class:`Fit`), the notes on parameters left out,
  the calibrated system JSON, the exact predictions before and after
  (DataFrame), the cross-validation frames (name -> DataFrame), and the
  prior centres the other clusters gave (name -> value; empty without
  them)."""
  ids: list
  fit: Fit
  dropped: list
  calibrated: dict
  predictions: object
  cv: dict
  cluster: str
  centre: dict = None


def select_runs(suite, system_name, cluster=None, all_rows=False):
  """Cases of ``suite`` that use ``system_name`` (their calibration cluster
  equal to ``cluster``, default the system name), or every priced case
  (``all_rows``)."""
  cluster = cluster or system_name
  out = []
  for case in suite.cases:
    if not case.expressible or case.measured_s is None:
      continue
    if all_rows or (case.cluster or case.system_name) == cluster:
      out.append(case)
  return out


def calibrate_system(suite, cfg, cases, names=None, sigma=PRIOR_SIGMA,
                     refine=2, cv=('source', 'run'), cluster='system',
                     progress=None, note=None, population=()):
  """Fits system JSON ``cfg`` to ``cases`` (mapped runs of a
  :class:`~calculon.validation.published.Suite`).

  Args:
    names: parameters to fit (None: :func:`auto_parameters`); explicit
      names that the runs do not determine are refused.
    sigma: prior width of the scales (log); refine: re-linearizations.
    cv: cross-validations to run ('source', 'run').
    note: text added to the calibrated file's notes.
    population: linearized :class:`Run` list of *other* clusters (e.g.
      :func:`prepare` on the same runs files, this cluster's runs left
      out): the prior centres of the scales become their pooled fit
      (:func:`population_centre`), the calibrated file carries those
      centres for the scales its own runs do not fit, and the
      cross-validation trains on them too (never holding them out).

  Returns:
    :class:`Calibration`.

  Raises:
    ConfigError: no runs, a parameter unknown, or more parameters than the
      runs determine.
  """
  import pandas as pd
  from calculon.validation.mapping import apply_system_set
  progress = progress or (lambda text_: None)
  if not cases:
    raise ConfigError('no measured run uses this system: map runs to it '
                      '(their gpu_type, or a system column) or use '
                      '--all-rows', field='runs')
  # Field changes shared by every run (e.g. a memory size) become part of
  # the calibrated file; the others stay with their runs.
  # A multiplying change ({'times': x}: a slower kernel named by the runs'
  # framework) stays with the runs, so that the file keeps the hardware's
  # value and a run priced on it applies its own factor once.
  common = {k: v for k, v in cases[0].system_set.items()
            if not isinstance(v, dict)
            and all(k in c.system_set and c.system_set[k] == v
                    for c in cases)}
  base = apply_system_set(cfg, common) if common else copy.deepcopy(cfg)
  runs = []
  for case in cases:
    row_cfg = apply_system_set(base, {k: v for k, v in case.system_set.items()
                                      if k not in common})
    try:
      run = linearize(case, row_cfg, prior_of(row_cfg), case.measured_s,
                      cluster)
    except ConfigError as err:
      progress(f'  {case.id}: not priced on this system ({err})')
      continue
    if run is not None:
      runs.append(run)
  if not runs:
    raise ConfigError('no measured run can be priced on this system',
                      field='runs')
  file_prior = prior_of(base)
  prior = dict(file_prior)
  population = [r for r in population if r.system != cluster]
  centre = {k: v for k, v in population_centre(population, sigma).items()
            if k in prior}
  prior.update(centre)
  dropped = []
  if names is None:
    names, dropped = auto_parameters(runs, prior)
    # Nothing pays for itself: with the other clusters' centres, those are
    # the calibration (as cross-validation's folds take them); without,
    # there is nothing to write.
    if not names and not centre:
      raise ConfigError('the runs determine no parameter: ' + '; '.join(
        dropped or ['too few runs']), field='params')
  else:
    names = check_parameters(base, names)
    kept, reasons = determined(runs, names, prior)
    if kept != list(names):
      raise ConfigError(
        f"--params {','.join(names)} is not allowed: the {len(runs)} run(s) "
        'cannot determine them: ' + '; '.join(reasons) + ' (fit fewer '
        'parameters, or give more runs)', field='params',
        value=','.join(names))
  if names:
    result, runs = fit_refined(runs, names, prior, sigma, refine)
  else:
    result = Fit(names=[], theta=dict(prior), stderr={},
                 correlation=np.zeros((0, 0)), warnings=[],
                 residuals=np.array([math.log(surrogate_time(r, prior) /
                                              r.measured_s) for r in runs]),
                 runs=len(runs), prior=dict(prior))
  rows = []
  for r in runs:
    before, _ = exact_prediction(r.case, r.cfg, file_prior)
    after, _ = exact_prediction(r.case, r.cfg, result.theta)
    rows.append({'id': r.id, 'source': r.group, 'measured_s': r.measured_s,
                 'before_s': before, 'after_s': after})
  predictions = pd.DataFrame(rows)
  predictions['delta_before_pct'] = 100 * (1 - predictions['before_s'] /
                                           predictions['measured_s'])
  predictions['delta_after_pct'] = 100 * (1 - predictions['after_s'] /
                                          predictions['measured_s'])
  frames = {}
  prepared = Prepared(
    runs=[linearize(r.case, r.cfg, prior_of(r.cfg), r.measured_s, cluster)
          for r in runs],
    before=dict(zip(predictions['id'], predictions['before_s'])))
  for mode in cv:
    if mode == 'source' and len({r.group for r in runs}) < 2:
      progress('  one source: no leave-one-source-out cross-validation')
      continue
    frames[mode] = cross_validate(prepared, mode, names=None, sigma=sigma,
                                  progress=progress, extra=population)
  text = note_text(result, len(runs), note)
  if centre:
    text.append(f'Prior centres from {len(population)} run(s) of other '
                'clusters (their pooled fit; kept where these runs fit '
                'nothing): ' + '; '.join(f'{k} = {_fmt(v, k)}' for k, v in
                                         centre.items()) + '.')
  if common:
    text.append('Field changes of the hardware table shared by every run '
                'written in: ' + '; '.join(f'{k} = {v}' for k, v in
                                           common.items()) + '.')
  written = {k: result.theta[k] for k in list(names) + list(centre)}
  calibrated = apply(base, written, note=text)
  return Calibration(ids=[r.id for r in runs], fit=result, dropped=dropped,
                     calibrated=calibrated, predictions=predictions,
                     cv=frames, cluster=cluster, centre=centre)


def note_text(result, runs, extra=None):
  """The notes a calibrated file carries: what was fitted, to how many
  runs, each value with its standard error."""
  parts = [f'{k} = {_fmt(result.theta[k], k)} +/- '
           f'{_fmt(result.stderr.get(k, float("nan")), k)}'
           for k in result.names]
  fitted = '; '.join(parts) if parts else (
    'no parameter pays for itself, so only the prior centres below apply')
  text = (f'{CALIBRATED_NOTE} on {runs} measured run(s): '
          + fitted + '. Scales multiply the efficiencies of the '
          'uncalibrated file (clamped to 1); overheads in seconds.')
  return [text] + ([extra] if extra else [])


def _fmt(value, name):
  if value is None or value != value:
    return 'nan'
  return f'{value:.4g}' if is_scale(name) else f'{value:.4g} s'


def format_fit(result, prior, dropped=(), centre=None):
  """Text table of a fit: parameter, file value, (with ``centre``, the
  prior centre the other clusters gave), fitted value, standard error,
  meaning; then the warnings and the parameters left out."""
  mid = f" {'prior':>10}" if centre else ''
  lines = [f"{'parameter':<18} {'file':>10}{mid} {'fitted':>10} "
           f"{'std err':>10}  meaning"]
  for k in result.names:
    c = f' {_fmt(centre.get(k, prior[k]), k):>10}' if centre else ''
    lines.append(f'{k:<18} {_fmt(prior[k], k):>10}{c} '
                 f'{_fmt(result.theta[k], k):>10} '
                 f'{_fmt(result.stderr.get(k), k):>10}  '
                 f"{PARAMETERS.get(k, 'scale of network tier ' + k[3:])}")
  for w in result.warnings:
    lines.append(f'warning: {w}')
  for d in dropped:
    lines.append(f'not fitted: {d}')
  return '\n'.join(lines)
