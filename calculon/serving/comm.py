"""Serving's collectives: small all-reduces, expert all-to-alls, pipeline
sends.

A decode step all-reduces a few kilobytes per block: latency-bound.  NCCL
picks the cheapest of its protocols; :func:`all_reduce_time_s` takes the
cheaper of the system file's tier model (NCCL's Simple protocol, the
tier's ``latency`` and ``step_latency``) and NCCL's low-latency LL
protocol on tier 0 (NCCL src/graph/tuning.cc, v2.21: ``baseLat`` Ring/LL
6.6 us, ``hwLat`` NVLink Ring/LL 0.6 us per step; LL carries 4 bytes of
data in every 8-byte store, half the link rate).  The frameworks' own
one-shot all-reduces (TensorRT-LLM, vLLM and SGLang custom all-reduce)
are at least as fast for small messages; they are not priced separately.

Reads: the system's network tiers.
"""

import numpy as np

#: NCCL tuning.cc (v2.21) ``baseLat`` for Ring/LL (s).
LL_BASE_LATENCY_S = 6.6e-6
#: NCCL tuning.cc (v2.21) ``hwLat[NVLINK]`` for Ring/LL, per step (s).
LL_STEP_LATENCY_S = 0.6e-6
#: Share of the link rate the LL protocol keeps (4 data bytes per 8).
LL_BANDWIDTH_SHARE = 0.5


def all_reduce_time_s(system, nbytes, peers, tier=0):
  """Seconds of one all-reduce of ``nbytes`` among ``peers`` on ``tier``
  (0 for one peer); arrays broadcast."""
  nets = system.networks
  peers = np.asarray(peers)
  p = np.maximum(peers, 1)
  simple = nets.time_s('all_reduce', nbytes, p, tier)
  ring_bytes = 2.0 * (p - 1) / p * nbytes
  ll = LL_BASE_LATENCY_S + 2 * (p - 1) * LL_STEP_LATENCY_S + \
    ring_bytes / (nets.rate(tier) * LL_BANDWIDTH_SHARE)
  t = np.minimum(simple, ll) if tier == 0 else simple
  return np.where(peers > 1, t, 0.0)


def all_to_all_time_s(system, nbytes, peers, tier=0):
  """Seconds of one all-to-all where each GPU sends ``nbytes`` in all
  (the tier's all_to_all constants; 0 for one peer)."""
  peers = np.asarray(peers)
  t = system.networks.time_s('all_to_all', nbytes, np.maximum(peers, 1),
                             tier)
  return np.where(peers > 1, t, 0.0)


def p2p_time_s(system, nbytes, tier):
  """Seconds of one point-to-point send of ``nbytes`` on ``tier``."""
  return system.networks.time_s('p2p', nbytes, 2, tier)
