"""Context parallelism: how the CP ranks of every attention layer
exchange K and V -- a ring passing one chunk a step, or one all-gather a
layer (``context_par_comm``).

Provides :class:`ContextTerms` and its :data:`~ContextTerms.CONCERN` (the
block terms ``block_cp_fw_exposed_s``, ``block_cp_bw_exposed_s``; the
batch term ``cp_comm_exposed_time_s``): the bytes of one rank's K/V chunk
(``block_cp_bytes``), what of a block's exchange shows
(``block_cp_fw_exposed_s``, ``block_cp_bw_exposed_s``), and the exchange
over the batch (``cp_comm_link_time_s``, ``cp_comm_exposed_time_s``).

Reads: ``system``, ``exe``, ``cp``, ``training``, ``io_bytes``,
``shape``, ``cp_usage`` (:mod:`~calculon.llm.terms.base`); ``block``
(:mod:`~calculon.llm.terms.blocks`); ``block_microbatches``
(:mod:`~calculon.llm.terms.schedule`).
"""

from functools import cached_property

import numpy as np

from calculon.config.execution import CP_COMM_ALL_GATHER, RECOMPUTE_NONE
from calculon.llm.terms.base import (
  Concern, _hidden_behind, _ranks_per_domain)


class ContextTerms:
  """The context-parallel ring (see the module)."""

  #: Exposed ring transfers of every block, where any execution has
  #: CP > 1.
  CONCERN = Concern(
    'context parallelism', lambda ev: bool(np.any(ev.cp > 1)),
    block_fw=('block_cp_fw_exposed_s',), block_bw=('block_cp_bw_exposed_s',),
    batch=('cp_comm_exposed_time_s',))

  @cached_property
  def block_cp_bytes(self):
    """Bytes of one forward ring step of context parallelism: the local K
    and V chunk sent to the next CP rank (Megatron-Core CP with
    TransformerEngine ``AttnFuncWithCPAndKVP2P``: cp - 1 steps per layer in
    forward; the backward ring carries K, V and their gradients, twice the
    bytes)."""
    e = self.exe
    kv = 2 * e.microbatch_size * self.shape.seq * self.shape.kv_local
    return np.where(self.cp > 1, kv * self.io_bytes, 0)

  @cached_property
  def _cp_step_s(self):
    net, tier = self.system.networks, self.exe.context_par_net
    fw = net.time_s('p2p', self.block_cp_bytes, 2, tier)
    bw = net.time_s('p2p', 2 * self.block_cp_bytes, 2, tier)
    on = self.cp > 1
    return np.where(on, fw, 0), np.where(on & self.training, bw, 0)

  @cached_property
  def _all_gather(self):
    """Executions whose CP ranks all-gather K and V (``context_par_comm``
    'all_gather'; else the ring)."""
    return np.asarray(self.exe.context_par_comm) == CP_COMM_ALL_GATHER

  @cached_property
  def _cp_gather_s(self):
    """(forward, backward) seconds of the all-gather exchange of one block
    and microbatch: the forward all-gathers the K and V chunks of the cp
    ranks (a buffer of cp chunks); the backward gathers them again and
    reduce-scatters their gradients, twice the buffer (Transformer Engine
    AttnFuncWithCPAndKVAllGather; Grattafiori et al. 2024, arXiv
    2407.21783, section 3.3.2; PyTorch's context parallelism passes the
    gradients round the ring instead, the same bytes).  The CP ranks fill
    a node after the TP ranks
    (:func:`~calculon.llm.terms.base._ranks_per_domain`)."""
    net, tier = self.system.networks, self.exe.context_par_net
    buffer = self.cp * self.block_cp_bytes
    in_node = _ranks_per_domain(net, self.cp, tier, self.tp)
    ag = net.collective_time_s('all_gather', buffer, self.cp, tier, in_node)
    rs = net.collective_time_s('reduce_scatter', 2 * buffer, self.cp, tier,
                               in_node)
    on = self.cp > 1
    return (np.where(on, ag, 0),
            np.where(on & self.training, ag + rs, 0))

  @cached_property
  def block_cp_fw_exposed_s(self):
    """Forward exchange time not hidden (:func:`_hidden_behind`, which
    also slows the compute it overlaps by the tier's processor usage).
    Ring: each of the cp - 1 transfers overlaps one attention step (1 / cp
    of the attention core's forward).  All-gather: the one gather overlaps
    the attention of the local chunk (1 / cp of it; PyTorch's
    _AllGatherRotater)."""
    fw, _ = self._cp_step_s
    window = self.block.core_fw_time / self.cp
    ring = (self.cp - 1) * _hidden_behind(fw, window, self.cp_usage)
    if not np.any(self._all_gather):
      return ring
    gather = _hidden_behind(self._cp_gather_s[0], window, self.cp_usage)
    return np.where(self._all_gather, gather, ring)

  @cached_property
  def block_cp_bw_exposed_s(self):
    """Backward exchange time not hidden by the attention core's backward
    (ring: each step behind 1 / cp of it; all-gather: the gather and the
    gradients' reduce-scatter behind the local chunk's 1 / cp), and the
    forward exchange again when the attention core is recomputed."""
    fw, bw = self._cp_step_s
    b = self.block
    window = b.core_bw_time / self.cp
    exposed = (self.cp - 1) * _hidden_behind(bw, window, self.cp_usage)
    if np.any(self._all_gather):
      exposed = np.where(self._all_gather, _hidden_behind(
        self._cp_gather_s[1], window, self.cp_usage), exposed)
    redo = self.exe.activation_recompute != RECOMPUTE_NONE
    return exposed + np.where(redo & self.training,
                              self.block_cp_fw_exposed_s, 0)

  @cached_property
  def cp_comm_link_time_s(self):
    """Context-parallel communication on the link, whole batch."""
    fw, bw = self._cp_step_s
    ring = self.block_microbatches * (self.cp - 1) * (fw + bw)
    if not np.any(self._all_gather):
      return ring
    gfw, gbw = self._cp_gather_s
    return np.where(self._all_gather,
                    self.block_microbatches * (gfw + gbw), ring)

  @cached_property
  def cp_comm_exposed_time_s(self):
    """Context-parallel ring communication not hidden, whole batch."""
    return self.block_microbatches * (self.block_cp_fw_exposed_s +
                         self.block_cp_bw_exposed_s)
