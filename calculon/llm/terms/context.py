"""Context parallelism: the ring that passes K and V between the CP ranks
of every attention layer.

Provides :class:`ContextTerms` and its :data:`~ContextTerms.CONCERN` (the
block terms ``block_cp_fw_exposed_s``, ``block_cp_bw_exposed_s``; the
batch term ``cp_comm_exposed_time_s``): the bytes of one ring step
(``block_cp_bytes``), what of a block's ring shows
(``block_cp_fw_exposed_s``, ``block_cp_bw_exposed_s``), and the ring over
the batch (``cp_comm_link_time_s``, ``cp_comm_exposed_time_s``).

Reads: ``system``, ``exe``, ``cp``, ``training``, ``io_bytes``,
``shape``, ``cp_usage`` (:mod:`~calculon.llm.terms.base`); ``block``
(:mod:`~calculon.llm.terms.blocks`); ``block_microbatches``
(:mod:`~calculon.llm.terms.schedule`).
"""

from functools import cached_property

import numpy as np

from calculon.config.execution import RECOMPUTE_NONE
from calculon.llm.terms.base import Concern, _hidden_behind


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
  def block_cp_fw_exposed_s(self):
    """Forward ring time not hidden: each of the cp - 1 transfers overlaps
    one attention step (1 / cp of the attention core's forward), which it
    slows (:func:`_hidden_behind`)."""
    fw, _ = self._cp_step_s
    steps = self.cp - 1
    return steps * _hidden_behind(fw, self.block.core_fw_time / self.cp,
                                  self.cp_usage)

  @cached_property
  def block_cp_bw_exposed_s(self):
    """Backward ring time not hidden by the attention core's backward (and
    the forward ring again when the attention core is recomputed)."""
    fw, bw = self._cp_step_s
    steps = self.cp - 1
    b = self.block
    exposed = steps * _hidden_behind(bw, b.core_bw_time / self.cp,
                                     self.cp_usage)
    redo = self.exe.activation_recompute != RECOMPUTE_NONE
    return exposed + np.where(redo & self.training,
                              self.block_cp_fw_exposed_s, 0)

  @cached_property
  def cp_comm_link_time_s(self):
    """Context-parallel ring communication on the link, whole batch."""
    fw, bw = self._cp_step_s
    return self.block_microbatches * (self.cp - 1) * (fw + bw)

  @cached_property
  def cp_comm_exposed_time_s(self):
    """Context-parallel ring communication not hidden, whole batch."""
    return self.block_microbatches * (self.block_cp_fw_exposed_s +
                         self.block_cp_bw_exposed_s)
