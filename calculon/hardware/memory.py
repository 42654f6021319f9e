"""A memory tier: capacity and size-dependent bandwidth."""

from calculon.hardware.curve import StepCurve


class Memory:
  """One memory tier.

  Args:
    cfg: a :class:`~calculon.config.system.MemoryConfig`.

  Attributes:
    capacity_bytes: capacity in bytes (the JSON's GiB * 2**30).
    bandwidth_bytes_per_s: peak bandwidth (the JSON's GB/s * 1e9).
  """

  def __init__(self, cfg):
    self.cfg = cfg
    self.capacity_bytes = cfg.capacity_bytes
    self.bandwidth_bytes_per_s = cfg.bandwidth_bytes_per_s
    self._curve = StepCurve(cfg.efficiency.points)

  # Calculon-compatible names.
  @property
  def capacity(self):
    return self.capacity_bytes

  @property
  def bandwidth(self):
    return self.bandwidth_bytes_per_s

  def efficiency(self, op_bytes):
    """Fraction of peak bandwidth for accesses of ``op_bytes`` bytes."""
    return self._curve(op_bytes)

  def throughput_bytes_per_s(self, op_bytes):
    """Achieved bandwidth: peak * efficiency(op_bytes)."""
    return self.bandwidth_bytes_per_s * self._curve(op_bytes)

  def time_s(self, op_bytes):
    """Seconds to move ``op_bytes`` bytes (0 for 0 bytes)."""
    return op_bytes / self.throughput_bytes_per_s(op_bytes)
