"""A compute engine (matrix or vector unit) with per-datatype throughput."""

import numpy as np

from calculon.config.execution import DATATYPE_NAMES
from calculon.hardware.curve import StepCurve


class Processor:
  """Peak FLOP/s and size-dependent efficiency per datatype.

  Args:
    cfg: a :class:`~calculon.config.system.ProcessorConfig`.

  Datatypes are passed as codes (indices into
  :data:`~calculon.config.execution.DATATYPE_NAMES`), scalar or array.
  """

  def __init__(self, cfg):
    self.cfg = cfg
    self._peak = {DATATYPE_NAMES.index(d): f for d, f in cfg.peak_flops.items()}
    self._curves = {DATATYPE_NAMES.index(d): StepCurve(c.points)
                    for d, c in cfg.efficiency.items()}

  def supports(self, dtype):
    """True when datatype code ``dtype`` (int) has a throughput here."""
    return int(dtype) in self._peak

  def peak_flops(self, dtype):
    """Peak FLOP/s for datatype code(s) ``dtype``."""
    return self._per_dtype(dtype, lambda d: self._peak[d])

  def throughput_flops_per_s(self, dtype, op_flops):
    """Achieved FLOP/s for operations of ``op_flops`` FLOP each.

    Formula: peak * efficiency(op_flops) (Calculon, processor model).
    """
    return self._per_dtype(
      dtype, lambda d: self._peak[d] * self._curves[d](op_flops), op_flops)

  def time_s(self, dtype, op_flops):
    """Seconds to run an operation of ``op_flops`` FLOP."""
    return op_flops / self.throughput_flops_per_s(dtype, op_flops)

  def _per_dtype(self, dtype, fn, like=None):
    if np.ndim(dtype) == 0:
      return fn(int(dtype))
    codes = np.unique(dtype)
    if len(codes) == 1:
      return fn(int(codes[0]))
    shape = np.broadcast_shapes(np.shape(dtype), np.shape(like))
    out = np.zeros(shape)
    for code in codes:
      out = np.where(dtype == code, fn(int(code)), out)
    return out
