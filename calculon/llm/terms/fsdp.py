"""Fully sharded data parallelism (FSDP, ZeRO-3): every block's weights
gathered before its forward and backward, its gradients reduce-scattered
after its backward, and the buffer copies around them.

Provides :class:`FsdpTerms` and its :data:`~FsdpTerms.CONCERN` (the block
terms ``block_fsdp_fw_exposed_s``, ``block_fsdp_copy_fw_s``,
``block_fsdp_bw_exposed_s``, ``block_fsdp_copy_bw_s``; the batch terms
``fsdp_comm_exposed_time_s``, ``fsdp_copy_time_s``): one unit's gathers
and reduce-scatter (:meth:`~FsdpTerms._fsdp_times_s`, also priced for the
embedding and the LM head), one block's traffic (``block_fsdp_fw_s``,
``block_fsdp_bw_s``) and what of it shows (``block_fsdp_fw_exposed_s``,
``block_fsdp_bw_exposed_s``), its buffer copies (``block_fsdp_copy_s``),
and their totals over the batch (``fsdp_comm_link_time_s``,
``fsdp_comm_exposed_time_s``, ``fsdp_copy_time_s``).

Reads: ``app``, ``system``, ``exe``, ``fsdp``, ``training``, ``dpcp``,
``edp``, ``io_bytes``, ``grad_bytes``, ``dp_usage``
(:mod:`~calculon.llm.terms.base`); ``block``
(:mod:`~calculon.llm.terms.blocks`); ``block_microbatches``
(:mod:`~calculon.llm.terms.schedule`);
:meth:`~calculon.llm.terms.data.DataTerms._dp_peers_per_domain`,
:meth:`~calculon.llm.terms.data.DataTerms._param_gather_bytes`.
"""

from functools import cached_property

import numpy as np

from calculon.llm.terms.base import Concern, _hidden_behind


class FsdpTerms:
  """FSDP (ZeRO-3) communication and copies (see the module)."""

  #: Exposed gathers, reduce-scatters and buffer copies of every block,
  #: where any execution shards its weights, or reduce-scatters its
  #: gradient shards every microbatch (ZeRO-2).
  CONCERN = Concern(
    'fsdp', lambda ev: bool(np.any(ev.fsdp | ev.grad_shard_per_microbatch)),
    block_fw=('block_fsdp_fw_exposed_s', 'block_fsdp_copy_fw_s'),
    block_bw=('block_fsdp_bw_exposed_s', 'block_fsdp_copy_bw_s'),
    batch=('fsdp_comm_exposed_time_s', 'fsdp_copy_time_s'))

  def _fsdp_times_s(self, totals):
    """(all-gather, reduce-scatter) seconds of one FSDP unit (``totals``)
    per microbatch: the weights (16-bit; with ``narrow_param_gather`` the
    linear layers' in the narrow datatype) are gathered before its forward and
    again before its backward, its gradients reduce-scattered after the
    backward (PyTorch FSDP FULL_SHARD; Megatron-FSDP
    ``optim_grads_params``), over the DP x CP ranks on the DP tier.  With
    ZeRO-2 reducing every microbatch (``grad_shard_per_microbatch``:
    DeepSpeed stage 2 reduces each gradient bucket in every backward,
    deepspeed/runtime/engine.py allreduce_gradients) only the
    reduce-scatter."""
    net, tier = self.system.networks, self.exe.data_par_net
    # The weights travel as the sharded optimizer gathers them
    # (DataTerms._param_gather_bytes): 16-bit, or with narrow_param_gather
    # the linear layers' narrow (torchao enable_fsdp_float8_all_gather,
    # Megatron-FSDP fp8_param_gather).
    groups = [(totals.weight_elems, totals.weight_bytes, self.dpcp, False)]
    if self.app.is_moe:
      groups = [(totals.weight_elems - totals.expert_weight_elems,
                 totals.weight_bytes - totals.expert_weight_bytes, self.dpcp,
                 False), (totals.expert_weight_elems,
                          totals.expert_weight_bytes, self.edp, True)]
    ag = rs = 0.0
    with np.errstate(divide='ignore', invalid='ignore'):
      for elems, kept, dp, experts in groups:
        on = dp > 1
        g = self._dp_peers_per_domain(dp, experts)
        ag = ag + np.where(on, net.collective_time_s(
          'all_gather', self._param_gather_bytes(kept, elems), dp, tier,
          g), 0)
        rs = rs + np.where(on, net.collective_time_s(
          'reduce_scatter', elems * self.grad_bytes, dp, tier, g), 0)
    reduce = (self.fsdp | self.grad_shard_per_microbatch) & self.training
    return np.where(self.fsdp, ag, 0), np.where(reduce, rs, 0)

  @cached_property
  def block_fsdp_copy_s(self):
    """(forward, backward) seconds of one block's FSDP buffer copies per
    microbatch (``fsdp_buffer_copies``), memory bound at tier-1 bandwidth
    on the compute stream.  PyTorch FSDP2 (torch/distributed/fsdp/
    _fully_shard/_fsdp_collectives.py): ``foreach_all_gather_copy_out``
    splits each all-gather output into the per-parameter tensors (read and
    write the block's gathered weights, W x io bytes each way) before the
    forward and again before the backward, after waiting on the current
    stream; ``foreach_reduce`` copies the unsharded gradients (computed in
    the 16-bit parameter datatype) into the reduce-scatter input in the
    reduction datatype on the current stream before the reduce-scatter
    stream takes it.  The small shard copy-in of the all-gather runs on its
    own stream and is not priced.  0 without the field or without FSDP."""
    on = self.fsdp & np.asarray(self.exe.fsdp_buffer_copies, dtype=bool)
    if not np.any(on):
      return 0.0, 0.0
    elems = self.block.weight_elems
    gather = 2 * elems * self.io_bytes
    reduce = elems * (self.io_bytes + self.grad_bytes)
    mem = self.system.mem1
    fw = np.where(on, mem.time_s(gather), 0)
    bw = np.where(on & self.training, mem.time_s(gather) +
                  mem.time_s(reduce), 0)
    return fw, bw

  @cached_property
  def block_fsdp_copy_fw_s(self):
    """Forward FSDP buffer copies of one block per microbatch
    (:attr:`block_fsdp_copy_s`)."""
    return self.block_fsdp_copy_s[0]

  @cached_property
  def block_fsdp_copy_bw_s(self):
    """Backward FSDP buffer copies of one block per microbatch
    (:attr:`block_fsdp_copy_s`)."""
    return self.block_fsdp_copy_s[1]

  @cached_property
  def fsdp_copy_time_s(self):
    """FSDP buffer copies on the compute stream, whole batch
    (:attr:`block_fsdp_copy_s`)."""
    fw, bw = self.block_fsdp_copy_s
    return self.block_microbatches * (fw + bw)

  @cached_property
  def block_fsdp_fw_s(self):
    """FSDP traffic of one block's forward (all-gather)."""
    return self._fsdp_times_s(self.block)[0]

  @cached_property
  def block_fsdp_bw_s(self):
    """FSDP traffic of one block's backward (all-gather + reduce-scatter)."""
    ag, rs = self._fsdp_times_s(self.block)
    return np.where(self.training, ag + rs, 0)

  @cached_property
  def block_fsdp_fw_exposed_s(self):
    """Forward FSDP traffic not hidden: the next block's all-gather is
    prefetched during this block's forward (FSDP forward prefetch), so
    only what exceeds the block's forward time shows, plus the compute the
    transfer slows (:func:`_hidden_behind`)."""
    return _hidden_behind(self.block_fsdp_fw_s, self.block.fw_time,
                          self.dp_usage)

  @cached_property
  def block_fsdp_bw_exposed_s(self):
    """Backward FSDP traffic not hidden by the block's backward, which
    includes its recomputed forward when it is recomputed (the all-gather
    is prefetched before it, the reduce-scatter follows it), plus the
    compute it slows (:func:`_hidden_behind`)."""
    b = self.block
    return _hidden_behind(self.block_fsdp_bw_s,
                          b.agrad_time + b.wgrad_time + b.re_time,
                          self.dp_usage)

  @cached_property
  def fsdp_comm_link_time_s(self):
    """FSDP (ZeRO-3) communication on the link, whole batch."""
    return self.block_microbatches * (self.block_fsdp_fw_s +
                                      self.block_fsdp_bw_s)

  @cached_property
  def fsdp_comm_exposed_time_s(self):
    """FSDP communication not hidden behind compute, whole batch."""
    return self.block_microbatches * (self.block_fsdp_fw_exposed_s +
                         self.block_fsdp_bw_exposed_s)
