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
    self.rails = np.array([c.rails for c in cfgs], dtype=np.int64)
    self.has_rails = bool(np.any(self.rails[1:] > 1))
    steps = [getattr(c, 'step_latency_s', None) for c in cfgs]
    self.step_latency_s = np.array([np.nan if v is None else v
                                    for v in steps], dtype=float)
    self.has_steps = bool(np.any(~np.isnan(self.step_latency_s)))
    #: Measured NCCL tables for tier 0 (:class:`~calculon.kernels.tables.
    #: MeasuredKernels`, set by the system), or None.
    self.measured = None

  def __len__(self):
    return len(self.tiers)

  def time_s(self, op, op_bytes, peers, tier):
    """Seconds for operation ``op`` moving ``op_bytes`` among ``peers``.

    Args:
      op: 'p2p', 'reduce_scatter', 'all_gather' or 'all_reduce'.
      op_bytes: bytes of the operation's buffer (array or scalar).
      peers: participants (2 for p2p), array or scalar.
      tier: network tier index, array or scalar.

    With a measured NCCL table (the system file's ``measured.nccl``), a
    collective on tier 0 (inside a node) takes the table's time for its
    buffer and GPU count (:meth:`~calculon.kernels.tables.MeasuredKernels.
    collective_time_s`); the tiers above keep the model.
    """
    model = self.latency_s_of(op, peers, tier) + \
      self._bytes(op, op_bytes, peers, tier) / self.rate(tier)
    return self._measured_tier0(op, op_bytes, peers, tier, model)

  def _measured_tier0(self, op, op_bytes, peers, tier, model):
    """``model``, with the measured NCCL time where ``tier`` is 0."""
    measured = self.measured
    if measured is None or not measured.has_collective(op):
      return model
    if np.ndim(tier) == 0:
      if int(tier) != 0:
        return model
      return measured.collective_time_s(op, op_bytes, peers)
    on = np.asarray(tier) == 0
    if not on.any():
      return model
    return np.where(on, measured.collective_time_s(op, op_bytes, peers),
                    model)

  def latency_s_of(self, op, peers, tier, peers_per_domain=1):
    """Latency (s) of one ``op`` among ``peers`` on ``tier``.

    Calculon's model (the tier has no ``step_latency``): the tier's
    ``latency`` per operation.  With ``step_latency`` (NCCL's cost model,
    src/graph/tuning.cc ncclTopoTuneModel, v2.21): the base latency plus
    the steps of a ring, each at the latency of the tier it crosses: an
    all-reduce takes 2 (p - 1) steps, an all-gather or a reduce-scatter p
    - 1, of which k (nodes - 1) cross ``tier`` between the ``p /
    peers_per_domain`` nodes (k = 2 or 1) and the rest run on the tier
    below; a point-to-point transfer one step.  An all-reduce takes the
    cheaper of that ring and NCCL's tree, 2 ((g - 1) steps within a node
    + log2(nodes) between nodes).  An all-to-all keeps the base latency
    (NCCL has no cost model for it).  On tier 0 every step is on tier 0;
    above it, ``peers_per_domain`` (g, default 1: every peer in a node of
    its own) are the group's processors in one node.

    Args:
      op: an operation of :data:`~calculon.config.system.NETWORK_OPS`.
      peers, tier, peers_per_domain: arrays or scalars.
    """
    base = self.latency_s[tier]
    if not self.has_steps or op == 'all_to_all':
      return base
    t = np.asarray(tier)
    step = self.step_latency_s[t]
    below = self.step_latency_s[np.maximum(t - 1, 0)]
    below = np.where(np.isnan(below), step, below)
    p = np.maximum(np.asarray(peers, dtype=float), 1.0)
    g = np.where(t > 0, np.clip(peers_per_domain, 1, p), p)
    nodes = np.maximum(p / g, 1.0)
    if op == 'p2p':
      hops = np.where(t > 0, step, below)
      lat = base + hops
    else:
      k = 2.0 if op == 'all_reduce' else 1.0
      inter = k * (nodes - 1)
      lat = base + inter * step + (k * (p - 1) - inter) * below
      if op == 'all_reduce':
        tree = base + 2 * ((g - 1) * below + np.log2(nodes) * step)
        lat = np.minimum(lat, tree)
    return np.where(np.isnan(step), base, lat)

  def _bytes(self, op, op_bytes, peers, tier):
    """Bytes per processor of ``op`` on ``tier``: n x scalar x (1 + offset
    / p), in Calculon's order of operations."""
    size = op_bytes * self.scalar[op][tier]
    return size + (1 / peers * size) * self.offset[op][tier]

  def rate(self, tier):
    """Bytes per second a processor moves on tier ``tier`` (bandwidth x
    efficiency; array or scalar index)."""
    return self.effective_bw[tier]

  def collective_time_s(self, op, op_bytes, peers, tier, peers_per_domain):
    """:meth:`time_s` of a collective whose ``peers`` include
    ``peers_per_domain`` processors in each domain of the tier below
    ``tier`` (a node), on a tier with ``rails`` (its config): the ``g =
    min(peers_per_domain, rails)`` processors of a domain carry the traffic
    that crosses ``tier`` in parallel, each over its own link, while every
    ring hop inside the domain runs on the tier below at the same time:

        latency[t] + max(n_t / (g * bw[t] * eff[t]),
                         n_b / (bw[b] * eff[b]))

    with ``n_t``, ``n_b`` the bytes per processor of the operation under
    each tier's (scalar, offset) and ``b = t - 1`` (NCCL rings cross the
    node boundary once per node and channel, one NIC per channel; see
    :class:`calculon.config.system.NetworkConfig`).  Computed as ``n_t``
    over an effective rate, ``min(g * rate[t], rate[b] * n_t / n_b)``, so
    that the per-execution work is that of :meth:`time_s`.  With ``g = 1``,
    on tier 0, or on a tier without ``rails``: exactly :meth:`time_s`
    (Calculon's model, where each processor's whole share crosses the
    tier over its own link).

    Args:
      op: 'reduce_scatter', 'all_gather' or 'all_reduce'.
      op_bytes, peers, tier: as :meth:`time_s`.
      peers_per_domain: processors of the group in one domain of the tier
        below (array or scalar, >= 1).
    """
    if not self.has_rails:
      model = self.latency_s_of(op, peers, tier, peers_per_domain) + \
        self._bytes(op, op_bytes, peers, tier) / self.rate(tier)
      return self._measured_tier0(op, op_bytes, peers, tier, model)
    rate = self.rate(tier)
    below = np.maximum(np.asarray(tier) - 1, 0)
    g = np.where(np.asarray(tier) > 0,
                 np.clip(peers_per_domain, 1, self.rails[tier]), 1)
    # Bytes per processor crossing the tier over those inside the domain
    # (per byte of buffer: small arrays, not one per execution).
    ratio = self._bytes(op, 1.0, peers, tier) / self._bytes(op, 1.0, peers,
                                                            below)
    rate = np.where(g > 1, np.minimum(g * rate, self.rate(below) * ratio),
                    rate)
    model = self.latency_s_of(op, peers, tier, peers_per_domain) + \
      self._bytes(op, op_bytes, peers, tier) / rate
    return self._measured_tier0(op, op_bytes, peers, tier, model)

  def usage(self, tier):
    """Fraction of processor compute used to drive tier ``tier``."""
    return self.processor_usage[tier]
