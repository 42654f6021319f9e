"""Feasibility: why an execution cannot run.

Provides the reason codes (:data:`OK` and the others, in the order
Calculon checks them) and their short names (:data:`REASON_NAMES`), and
:class:`FeasibilityTerms`: the network tiers' check
(:attr:`~FeasibilityTerms._network_check`), the reasons found before
pricing (``compile_reason``: network tiers, interleaving, offload), the
reason with the memory tiers' capacity (``reason``), ``feasible``, and
Calculon's messages (:meth:`~FeasibilityTerms.reason_message`).

Reads: ``app``, ``system``, ``exe``, ``tp``, ``pp``, ``dp``, ``cp``,
``ep``, ``interleaving`` (:mod:`~calculon.llm.terms.base`);
``blocks_per_proc`` (:mod:`~calculon.llm.terms.schedule`);
``mem1_bytes``, ``mem1_usable_bytes``, ``mem1_runtime_bytes``,
``mem2_bytes`` (:mod:`~calculon.llm.terms.memory`).
"""

from functools import cached_property

import numpy as np

from calculon.units import human_format

# Infeasibility reasons, in the order Calculon checks them.
OK = 0
NETWORK_TOO_SMALL = 1
NETWORK_NOT_FILLED = 2
INTERLEAVING_TOO_LARGE = 3
INTERLEAVING_NOT_FACTOR = 4
OFFLOAD_TOO_FEW_BLOCKS = 5
MEM1_TOO_SMALL = 6
MEM2_TOO_SMALL = 7
NON_FINITE = 8
ENGINE_ERROR = 9
#: Short names of the reasons (summaries, CSV).
REASON_NAMES = {
  OK: 'ok', NETWORK_TOO_SMALL: 'network tier too small',
  NETWORK_NOT_FILLED: 'network tier not filled',
  INTERLEAVING_TOO_LARGE: 'interleaving > blocks per processor',
  INTERLEAVING_NOT_FACTOR: 'interleaving does not divide blocks per processor',
  OFFLOAD_TOO_FEW_BLOCKS: 'offload needs >= 3 blocks per processor',
  MEM1_TOO_SMALL: 'memory tier 1 too small',
  MEM2_TOO_SMALL: 'memory tier 2 too small',
  NON_FINITE: 'non-finite batch time',
  ENGINE_ERROR: 'engine error',
}


class FeasibilityTerms:
  """Feasibility of the executions (see the module)."""

  @cached_property
  def _network_check(self):
    """(reason, tier) of the first network tier that is too small or not
    filled, in tier order (Calculon's check)."""
    e, nets = self.exe, self.system.networks
    shape = np.broadcast_shapes(np.shape(self.tp), np.shape(self.pp),
                                np.shape(self.dp), np.shape(e.tensor_par_net),
                                np.shape(e.pipeline_par_net),
                                np.shape(e.data_par_net), np.shape(self.cp),
                                np.shape(e.context_par_net))
    reason = np.zeros(shape, dtype=np.int64)
    tier_of = np.zeros(shape, dtype=np.int64)
    for tier in range(len(nets) - 1, -1, -1):
      size = 1
      used = False
      for degree, net in ((self.tp, e.tensor_par_net),
                          (self.pp, e.pipeline_par_net),
                          (self.dp, e.data_par_net),
                          (self.cp, e.context_par_net)):
        on = (degree > 1) & (net == tier)
        size = size * np.where(on, degree, 1)
        used = used | on
      if self.app.is_moe:
        # Experts are folded onto TP x DP x CP ranks; their group of EP
        # ranks must fit its own tier.
        ep_on = (self.ep > 1) & (e.expert_par_net == tier)
        used = used | ep_on
        size = np.maximum(size, np.where(ep_on, self.ep, 1))
      too_small = used & (size > nets.size[tier])
      not_filled = used & ~too_small & nets.must_be_filled[tier] & (
        nets.size[tier] % size != 0)
      bad = too_small | not_filled
      reason = np.where(bad, np.where(too_small, NETWORK_TOO_SMALL,
                                      NETWORK_NOT_FILLED), reason)
      tier_of = np.where(bad, tier, tier_of)
    return reason, tier_of

  @cached_property
  def compile_reason(self):
    """Reason code of infeasibilities found before pricing (network tiers,
    interleaving, offload); OK (0) when none."""
    reason = self._network_check[0]
    bpp, ppi = self.blocks_per_proc, self.interleaving
    e = self.exe
    reason = np.where(reason != OK, reason, np.where(
      ppi > bpp, INTERLEAVING_TOO_LARGE, np.where(
        bpp % ppi != 0, INTERLEAVING_NOT_FACTOR, OK)))
    offload = e.weight_offload | e.activations_offload | e.optimizer_offload
    return np.where(reason != OK, reason,
                    np.where(offload & (bpp <= 2), OFFLOAD_TOO_FEW_BLOCKS, OK))

  @cached_property
  def reason(self):
    """Reason code of infeasibility (see REASON_NAMES); OK (0) if feasible.
    Memory tier 1 is too small where what the allocator holds
    (``mem1_bytes``) exceeds what it may fill (``mem1_usable_bytes``: the
    capacity, less the system's headroom and the memory held outside the
    allocator when the system file has ``memory_reserve``)."""
    reason = self.compile_reason
    reason = np.where(reason != OK, reason, np.where(
      self.mem1_bytes > self.mem1_usable_bytes, MEM1_TOO_SMALL,
      np.where(self.mem2_bytes > self.system.mem2.capacity_bytes,
               MEM2_TOO_SMALL, OK)))
    return reason

  @cached_property
  def feasible(self):
    """True where the execution can run."""
    return self.reason == OK

  def reason_message(self, index=()):
    """Calculon's error message for the execution at ``index`` ('' if ok)."""
    def at(x):
      return np.broadcast_to(x, self.exe.shape)[index]
    code = int(at(self.reason))
    if code == OK:
      return ''
    if code in (NETWORK_TOO_SMALL, NETWORK_NOT_FILLED):
      tier = int(at(self._network_check[1]))
      net = self.system.networks
      used = []
      size = 1
      for label, degree, chosen in (
          ('TP', self.tp, self.exe.tensor_par_net),
          ('PP', self.pp, self.exe.pipeline_par_net),
          ('DP', self.dp, self.exe.data_par_net),
          ('CP', self.cp, self.exe.context_par_net)):
        d, c = int(at(degree)), int(at(chosen))
        if d > 1 and c == tier:
          used.append(f'{label}={d}')
          size *= d
      ep = int(at(self.ep))
      if ep > 1 and int(at(self.exe.expert_par_net)) == tier and \
          ep > size:
        used = [f'EP={ep}']
        size = ep
      detail = f"{' x '.join(used)} = {size} processors, tier size " \
        f'{int(net.size[tier])}'
      if code == NETWORK_TOO_SMALL:
        return f"Network tier{tier} isn't big enough ({detail})"
      return f"Network tier{tier} isn't fully used ({detail})"
    if code == INTERLEAVING_TOO_LARGE:
      return ('Pipeline interleaving must be less than or equal to the number '
              'of blocks per processor')
    if code == INTERLEAVING_NOT_FACTOR:
      return ('Pipeline interleaving must be a factor value of the number of '
              'blocks per processor')
    if code == OFFLOAD_TOO_FEW_BLOCKS:
      return 'Offloading requires each processor to handle at least 3 blocks'
    if code == MEM1_TOO_SMALL:
      if self.system.memory_reserve is not None:
        r = self.system.memory_reserve
        return (f"Mem tier1 needs "
                f"{human_format(at(self.mem1_bytes), 'bytes')} in the "
                f"allocator but only "
                f"{human_format(at(self.mem1_usable_bytes), 'bytes')} of "
                f"{human_format(self.system.mem1.capacity_bytes, 'bytes')} "
                f"may be filled ({100 * r.headroom:g} % headroom, "
                f"{human_format(at(self.mem1_runtime_bytes), 'bytes')} "
                f"outside the allocator)")
      return (f"Mem tier1 needs {human_format(at(self.mem1_bytes), 'bytes')} "
              f"but only has "
              f"{human_format(self.system.mem1.capacity_bytes, 'bytes')}")
    return (f"Mem tier2 needs {human_format(at(self.mem2_bytes), 'bytes')} "
            f"but only has "
            f"{human_format(self.system.mem2.capacity_bytes, 'bytes')}")
