"""Network tiers and the time of point-to-point and collective operations."""

import numpy as np

from calculon.config.system import NETWORK_OPS


class Network:
  """One network tier (read-only view of its configuration).

  Attributes mirror :class:`~calculon.config.system.NetworkConfig`; ``size``,
  ``must_be_filled`` and ``processor_usage`` keep Calculon's names.
  """

  def __init__(self, cfg, index):
    self.cfg = cfg
    self.index = index
    self.size = cfg.size
    self.must_be_filled = cfg.must_be_filled
    self.processor_usage = cfg.processor_usage
    self.latency_s = cfg.latency_s
    self.bandwidth_bytes_per_s = cfg.bandwidth_bytes_per_s
    self.efficiency = cfg.efficiency

  def time(self, op, op_size, comm_size):
    """Calculon-compatible: seconds for one operation on this tier."""
    return Networks([self.cfg]).time_s(op, op_size, comm_size, 0)


class Networks:
  """All network tiers of a system, as lookup tables over the tier index.

  The time of an operation of ``n`` bytes among ``p`` peers on tier ``t`` is

      latency[t] + n * scalar[t] * (1 + offset[t] / p) / (bandwidth[t] * eff[t])

  where (scalar, offset) are the tier's constants for the operation: e.g. a
  ring all-reduce moves 2 (p-1)/p n bytes per processor, i.e. scalar 2,
  offset -1 (Calculon, network model; Thakur et al. 2005 for the ring
  algorithms).
  """

  def __init__(self, cfgs):
    self.tiers = [Network(c, i) for i, c in enumerate(cfgs)]
    self.size = np.array([c.size for c in cfgs], dtype=np.int64)
    self.must_be_filled = np.array([c.must_be_filled for c in cfgs], dtype=bool)
    self.processor_usage = np.array([c.processor_usage for c in cfgs])
    self.latency_s = np.array([c.latency_s for c in cfgs])
    self.effective_bw = np.array([c.bandwidth_bytes_per_s * c.efficiency
                                  for c in cfgs])
    self.scalar = {op: np.array([c.ops[op][0] for c in cfgs])
                   for op in NETWORK_OPS}
    self.offset = {op: np.array([c.ops[op][1] for c in cfgs])
                   for op in NETWORK_OPS}

  def __len__(self):
    return len(self.tiers)

  def time_s(self, op, op_bytes, peers, tier):
    """Seconds for operation ``op`` moving ``op_bytes`` among ``peers``.

    Args:
      op: 'p2p', 'reduce_scatter', 'all_gather' or 'all_reduce'.
      op_bytes: bytes of the operation's buffer (array or scalar).
      peers: participants (2 for p2p), array or scalar.
      tier: network tier index, array or scalar.
    """
    size = op_bytes * self.scalar[op][tier]
    size = size + (1 / peers * size) * self.offset[op][tier]
    return self.latency_s[tier] + size / self.effective_bw[tier]

  def usage(self, tier):
    """Fraction of processor compute used to drive tier ``tier``."""
    return self.processor_usage[tier]
