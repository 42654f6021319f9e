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
``block_microbatches``, ``num_microbatches``, ``interleaving``
(:mod:`~calculon.llm.terms.schedule`).
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
    routed experts ('compute' without a backward pass to pair with: the
    other microbatch's forward); a training step's 'compute' is priced by
    :meth:`_paired_exposed_s`."""
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
  def _paired_exposed_s(self):
    """(forward, backward) dispatch and combine of a block not hidden
    under ``moe_comm_overlap`` 'compute', the 1F1B all-to-all overlap that
    runs one microbatch's forward of the block beside another's backward
    (Megatron-Core --overlap-moe-expert-parallel-comm; DeepSeek-V3's
    DualPipe pairs the same four pieces: DeepSeek-AI 2024, arXiv
    2412.19437, section 3.2.1, figure 4).

    Megatron-Core's layer schedule
    (megatron/core/models/common/model_chunk_schedule_plan.py
    TransformerLayerSchedulePlan.run at d98e8a64dd) runs, communication
    stream against compute stream: the backward combine against the
    forward's computation before the dispatch (attention, norms, router,
    permutation, shared experts); the forward and the backward dispatch
    against the routed experts' backward and forward; the forward combine
    against the backward's computation before its dispatch.  So each phase
    shows what its transfer exceeds of its compute, the compute it hides
    behind slowed by the tier's processor usage
    (:func:`~calculon.llm.layers.hidden_behind`)::

      C_b vs A_f;  D_f + D_b vs E_b + E_f;  C_f vs A_b

    with the dispatch D and the combine C each half of a pass's transfer
    (equal sizes; the backward's includes recomputation's), E the routed
    experts' time (the ``Moe_Experts`` layers) and A the rest of the
    block's pass.  The second phase's excess is split evenly between the
    passes.

    The passes of the warm-up and cool-down run alone, every transfer
    exposed: without PP the first microbatch's forward and the last one's
    backward ("executed alone, no a2a overlapping",
    megatron/core/pipeline_parallel/combined_1f1b.py
    combined_1f1b_schedule_for_no_pipelining); with PP the first stage's
    warm-up forwards, 2 (PP - 1) + (VP - 1) PP + 1 of its M x VP chunk
    passes (schedules.py get_pp_rank_microbatches: the interleaved
    warm-up, microbatch_group_size_per_vp_stage = PP, plus one with the
    overlap), and as many cool-down backwards; PP without interleaving
    (which Megatron-Core does not overlap) counts PP.  Seconds per block
    and microbatch, averaged over the batch, arrays over the
    executions."""
    b, u = self.block, self.ep_usage
    ep_f, ep_b = b.ep_fw_time, b.ep_bw_time + b.ep_re_time
    c_f = d_f = 0.5 * ep_f
    c_b = d_b = 0.5 * ep_b
    e_f, e_b = b.experts_fw_time, b.experts_bw_time
    a_f = b.fw_time - e_f
    a_b = b.agrad_time + b.wgrad_time - e_b
    middle = _hidden_behind(d_f + d_b, e_f + e_b, u)
    fw = _hidden_behind(c_f, a_b, u) + 0.5 * middle
    bw = _hidden_behind(c_b, a_f, u) + 0.5 * middle
    share = self._unpaired_share
    return (1.0 - share) * fw + share * ep_f, (1.0 - share) * bw + share * ep_b

  @cached_property
  def _unpaired_share(self):
    """Share of a stage's chunk passes the 1F1B all-to-all overlap runs
    alone (see :meth:`_paired_exposed_s`): warm-up passes over the M x VP
    chunk passes of the first stage, at most 1."""
    pp = np.asarray(self.exe.pipeline_par)
    vp = np.maximum(np.asarray(self.interleaving), 1)
    warm = np.where(pp > 1, np.where(vp > 1, 2 * (pp - 1) + (vp - 1) * pp + 1,
                                     pp), 1)
    passes = np.maximum(self.num_microbatches * vp, 1)
    return np.minimum(1.0, warm / passes)

  @cached_property
  def _paired(self):
    """Bool array over the executions: where a training step's
    ``moe_comm_overlap`` 'compute' pairs the passes of two microbatches
    (:meth:`_paired_exposed_s`); None where none does."""
    from calculon.config.execution import MOE_OVERLAP_COMPUTE
    paired = (np.asarray(self.exe.moe_comm_overlap) == MOE_OVERLAP_COMPUTE) \
      & np.asarray(self.training, dtype=bool)
    return paired if np.any(paired) else None

  def _exposed_s(self, stage, comm):
    """``comm`` seconds of one pass's (``stage`` 'fw' or 'bw') dispatch and
    combine not hidden, plus the compute they slow while hidden: behind
    the same pass (:meth:`_ep_hiding_s`), or where microbatches are paired,
    :meth:`_paired_exposed_s`."""
    own = _hidden_behind(comm, self._ep_hiding_s(stage), self.ep_usage)
    if self._paired is None:
      return own
    return np.where(self._paired, self._paired_exposed_s[stage == 'bw'],
                    own)

  @cached_property
  def block_ep_fw_exposed_s(self):
    """Forward dispatch and combine of a block not hidden, plus the compute
    they slow while hidden (:meth:`_exposed_s`)."""
    return self._exposed_s('fw', self.block.ep_fw_time)

  @cached_property
  def block_ep_bw_exposed_s(self):
    """Backward dispatch and combine (and the forward ones again when
    the block is recomputed) not hidden (:meth:`_exposed_s`)."""
    b = self.block
    return self._exposed_s('bw', b.ep_bw_time + b.ep_re_time)

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
