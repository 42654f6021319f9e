"""Expert parallelism: the token dispatch and combine of the MoE blocks.

Provides :class:`ExpertTerms` and its :data:`~ExpertTerms.CONCERN` (the
block terms ``block_ep_fw_exposed_s``, ``block_ep_bw_exposed_s``; the
batch term ``ep_comm_exposed_time_s``): what of a block's dispatch and
combine shows behind the compute ``moe_comm_overlap`` lets it hide
(``block_ep_fw_exposed_s``, ``block_ep_bw_exposed_s``), the routed
experts' weights of the busiest stage (``expert_weight_bytes``), and the
traffic over the batch (``ep_comm_link_time_s``,
``ep_comm_exposed_time_s``).

Reads: ``app``, ``exe``, ``training``, ``ep_usage``
(:mod:`~calculon.llm.terms.base`); ``block``
(:mod:`~calculon.llm.terms.blocks`); ``blocks_per_proc``,
``block_microbatches`` (:mod:`~calculon.llm.terms.schedule`).
"""

from functools import cached_property

import numpy as np

from calculon.llm.terms.base import Concern, _hidden_behind


class ExpertTerms:
  """Expert-parallel dispatch and combine (see the module)."""

  #: Exposed dispatch and combine of every block, for a Mixture-of-Experts
  #: model.
  CONCERN = Concern(
    'expert parallelism', lambda ev: bool(ev.app.is_moe),
    block_fw=('block_ep_fw_exposed_s',), block_bw=('block_ep_bw_exposed_s',),
    batch=('ep_comm_exposed_time_s',))

  def _ep_hiding_s(self, stage):
    """Compute the token dispatch and combine of a block may hide behind
    (``moe_comm_overlap``): the shared experts ('shared_experts',
    Megatron-Core --moe-shared-expert-overlap), or everything but the
    routed experts ('compute': the other microbatch's compute, Megatron-Core
    --overlap-moe-expert-parallel-comm, DeepSeek-V3's DualPipe)."""
    from calculon.config.execution import (
      MOE_OVERLAP_COMPUTE, MOE_OVERLAP_SHARED)
    b, mode = self.block, self.exe.moe_comm_overlap
    if stage == 'fw':
      shared, rest = b.shared_fw_time, b.fw_time - b.experts_fw_time
    else:
      shared = b.shared_bw_time
      rest = b.agrad_time + b.wgrad_time - b.experts_bw_time
    return np.where(mode == MOE_OVERLAP_SHARED, shared,
                    np.where(mode == MOE_OVERLAP_COMPUTE, rest, 0))

  @cached_property
  def block_ep_fw_exposed_s(self):
    """Forward dispatch and combine of a block not hidden, plus the compute
    they slow while hidden (:func:`_hidden_behind`)."""
    return _hidden_behind(self.block.ep_fw_time, self._ep_hiding_s('fw'),
                          self.ep_usage)

  @cached_property
  def block_ep_bw_exposed_s(self):
    """Backward dispatch and combine (and the forward ones again when
    the block is recomputed) not hidden."""
    b = self.block
    return _hidden_behind(b.ep_bw_time + b.ep_re_time,
                          self._ep_hiding_s('bw'), self.ep_usage)

  @cached_property
  def expert_weight_bytes(self):
    """Routed-expert weights of the busiest stage (before FSDP sharding)."""
    if not self.app.is_moe:
      return 0.0
    return self.block.expert_weight_bytes * self.blocks_per_proc

  @cached_property
  def ep_comm_link_time_s(self):
    """Expert-parallel token dispatch and combine on the link, batch."""
    if not self.app.is_moe:
      return 0.0
    b = self.block
    return self.block_microbatches * (b.ep_fw_time + b.ep_bw_time +
                                      b.ep_re_time)

  @cached_property
  def ep_comm_exposed_time_s(self):
    """Expert-parallel communication not hidden, whole batch."""
    if not self.app.is_moe:
      return 0.0
    return self.block_microbatches * (self.block_ep_fw_exposed_s +
                         np.where(self.training, self.block_ep_bw_exposed_s,
                                  0))
