"""Data parallelism: the end-of-batch gradient reduction and weight
gather (ZeRO-1/2 sharding), and their overlap with the backward pass.

Provides :class:`DataTerms`: whether the gradients are reduced at the end
of the batch (``dp_reduces_at_end``), the bytes and time of one block's
DP communication (``block_dp_bytes``, ``block_dp_time_s``), the DP
communication over the batch on the link (``dp_comm_link_time_s``) and
exposed (``dp_comm_exposed_time_s``: all of it, or with DP overlap
Calculon's overlap model plus the all-gather behind the next forward),
the bandwidths DP overlap needs (``dp_bw_overlap_req_chunk``,
``dp_bw_overlap_req_tail``), and the helpers the embedding, the LM head
and FSDP share (:meth:`~DataTerms._dp_time_s`,
:meth:`~DataTerms._dp_peers_per_domain`).

Reads: ``app``, ``system``, ``exe``, ``pp``, ``tp``, ``dpcp``, ``edp``,
``ep``, ``etp``, ``interleaving``, ``training``, ``fsdp``, ``sharding``,
``io_bytes``, ``grad_bytes``, ``bytes_per_element``, ``dp_usage``
(:mod:`~calculon.llm.terms.base`); ``block``
(:mod:`~calculon.llm.terms.blocks`); ``blocks_per_proc``,
``blocks_per_chunk``, ``baseblocks_per_chunk``, ``edgeblocks_per_chunk``,
``num_microbatches``, ``baseblock_bw_time_s``, ``edgeblock_bw_time_s``,
``chunk_bw_time_s`` (:mod:`~calculon.llm.terms.schedule`);
``chunk_bw_pp_time_s`` (:mod:`~calculon.llm.terms.pipeline`).
"""

from functools import cached_property

import numpy as np

from calculon.config.execution import (
  RECIPE_TE, SHARD_GRADIENTS, SHARD_OPTIMIZER, UNSET)
from calculon.llm.terms.base import (
  _hidden_behind, _min, _ranks_per_domain)


class DataTerms:
  """End-of-batch data-parallel communication (see the module)."""

  @cached_property
  def dp_reduces_at_end(self):
    """Gradients are reduced at the end of the batch: training with more
    than one DP x CP rank, weights not sharded (FSDP reduces per block)."""
    return (self.dpcp > 1) & self.training & ~self.fsdp

  @cached_property
  def _sharded(self):
    """Reduce-scatter + all-gather instead of all-reduce (ZeRO-1/2)."""
    return (self.sharding == SHARD_OPTIMIZER) | \
      (self.sharding == SHARD_GRADIENTS)

  def _grad_reduce_bytes(self, totals, experts=False):
    """Bytes of gradients of ``totals`` (a BlockTotals) reduced over DP:
    Calculon reduces them in the weights' datatype; with an explicit
    ``gradient_datatype`` in that precision (Megatron-LM reduces fp32 main
    gradients unless --grad-reduce-in-bf16); under the Transformer Engine
    recipe, whose kept weight bytes include each linear layer's narrow
    copy, in the 16-bit datatype of the parameters they belong to (the
    narrow copy has no gradient of its own).  ``experts``: only the
    routed experts' (else all but them)."""
    wb, we = totals.weight_bytes, totals.weight_elems
    if self.app.is_moe:
      if experts:
        wb, we = totals.expert_weight_bytes, totals.expert_weight_elems
      else:
        wb = wb - totals.expert_weight_bytes
        we = we - totals.expert_weight_elems
    elif experts:
      return 0.0
    unset = self.exe.gradient_datatype == UNSET
    # Calculon's gradients are the kept weights' bytes, except the narrow
    # copies Transformer Engine keeps besides the 16-bit weights.
    kept = unset & (self.exe.precision_recipe != RECIPE_TE)
    if np.all(kept):
      return wb
    return np.where(kept, wb, we * self.grad_bytes)

  def _dp_peers_per_domain(self, group, experts=False):
    """Ranks of a data-parallel group (``group`` ranks on the DP tier ``t``)
    inside one domain of tier ``t - 1`` (a node), for the system's
    ``rails`` (:meth:`calculon.hardware.network.Networks.collective_time_s`).

    Ranks are laid out as Megatron-Core orders them (``tp-cp-ep-dp-pp``:
    TP innermost, PP outermost; routed experts ``etp-ep-dp-pp``;
    torchtitan's device mesh ``[pp, dp, cp, tp]`` agrees): the
    parallelisms inside the group's ranks (TP; EP x ETP for the experts'
    group) fill a domain first, the group's own ranks (DP x CP) the rest.
    A domain of ``S`` processors thus holds ``min(group, S // inner)`` of
    the group's ranks (at least 1: an inner parallelism wider than the
    domain leaves one), ``inner`` the product of those inner degrees.
    The tiers the execution names are not read (an execution placing PP
    below DP contradicts that order; reading them costs the pruned MoE
    searches 25-40 %, docs/performance.md).  1 on a system without
    ``rails`` (nothing to compute)."""
    inner = self.etp * self.ep if experts else self.tp
    return _ranks_per_domain(self.system.networks, group,
                             self.exe.data_par_net, inner)

  def _dp_group_time_s(self, reduce, gather, dp, experts=False):
    """(total, all-gather) seconds of one group's end-of-batch DP
    communication: reduce-scatter + all-gather when sharded (the gather
    alone where ``grad_shard_per_microbatch``), else an all-reduce (the
    all-gather part 0)."""
    net, tier = self.system.networks, self.exe.data_par_net
    g = self._dp_peers_per_domain(dp, experts)
    with np.errstate(divide='ignore', invalid='ignore'):
      ag = net.collective_time_s('all_gather', gather, dp, tier, g)
      rs = net.collective_time_s('reduce_scatter', reduce, dp, tier, g)
      # ZeRO-2 reducing every microbatch reduce-scattered its gradients
      # block by block (calculon.llm.terms.fsdp): only the gather is left.
      sharded = np.where(self.grad_shard_per_microbatch, 0, rs) + ag
      plain = net.collective_time_s('all_reduce', reduce, dp, tier, g)
    on = dp > 1
    return (np.where(on, np.where(self._sharded, sharded, plain), 0),
            np.where(on & self._sharded, ag, 0))

  def _dp_times_s(self, totals):
    """(total, all-gather) seconds of the end-of-batch DP communication of
    the weights of ``totals``: reduce-scatter of the gradients +
    all-gather of the weights when sharded (ZeRO-1/2; Rajbhandari et al.
    2020, section 7.2), else an all-reduce, over the DP x CP ranks on the
    DP tier (routed experts over their expert data-parallel ranks)."""
    reduce = self._grad_reduce_bytes(totals)
    gather = self._param_gather_bytes(totals.weight_bytes,
                                      totals.weight_elems)
    expert_gather = self._param_gather_bytes(totals.expert_weight_bytes,
                                             totals.expert_weight_elems)
    if not self.app.is_moe:
      t, ag = self._dp_group_time_s(reduce, gather, self.dpcp)
    else:
      t, ag = self._dp_group_time_s(
        reduce, gather - expert_gather, self.dpcp)
      t2, ag2 = self._dp_group_time_s(
        self._grad_reduce_bytes(totals, True), expert_gather,
        self.edp, experts=True)
      t, ag = t + t2, ag + ag2
    active = self.dp_reduces_at_end
    return np.where(active, t, 0), np.where(active, ag, 0)

  def _param_gather_bytes(self, weight_bytes, weight_elems):
    """Bytes of the updated weights the sharded optimizer all-gathers:
    the weights as kept (Calculon's), except under the Transformer Engine
    recipe, whose kept bytes include each linear layer's narrow copy: the
    optimizer gathers the 16-bit parameters and Transformer Engine casts
    its narrow copy from them after the gather (Megatron-Core's
    distributed optimizer gathers its parameter buffer, in the
    parameters' datatype: megatron/core/distributed/
    param_and_grad_buffer.py), or, with ``narrow_param_gather``
    (--fp8-param-gather: the linear layers' parameters kept as FP8
    tensors), the linear layers' weights in the narrow datatype."""
    te = self.exe.precision_recipe == RECIPE_TE
    if not np.any(te):
      return weight_bytes
    io, narrow = self.io_bytes, self.bytes_per_element
    wide = weight_elems * io
    # With narrow_param_gather the linear layers' weights travel narrow
    # (Megatron-Core --fp8-param-gather): their count is the kept narrow
    # copy's bytes over the narrow width.
    with np.errstate(divide='ignore', invalid='ignore'):
      linear = (weight_bytes - wide) / narrow
    gathered = np.where(np.asarray(self.exe.narrow_param_gather, dtype=bool),
                        wide - linear * (io - narrow), wide)
    return np.where(te, gathered, weight_bytes)

  def _dp_time_s(self, totals):
    """End-of-batch DP communication of the weights of ``totals`` (the
    total of :meth:`_dp_times_s`)."""
    return self._dp_times_s(totals)[0]

  @cached_property
  def _dp_gather_forward_s(self):
    """All-gather of one block's updated weights that hides behind the
    next step's forward pass instead of the backward (``param_gather_
    overlap`` with DP overlap and a sharded optimizer; Megatron-Core's
    distributed optimizer with --overlap-param-gather gathers each bucket
    just before its first forward use, docs/source/api-guide/
    dist_optimizer.md); 0 elsewhere (Calculon's model)."""
    # Used only where data_par_overlap holds (dp_comm_exposed_time_s), so
    # the mask leaves it out (arrays keep the block's shape).
    on = self.exe.param_gather_overlap & self._sharded
    if not np.any(on):
      return 0.0
    return np.where(on, self._block_dp_times_s[1], 0)

  @cached_property
  def _dp_gather_exposed_s(self):
    """Exposed part of :attr:`_dp_gather_forward_s` over the stage: the
    first block's all-gather shows; the rest of the first chunk's hides
    behind the forward of its earlier blocks (first microbatch), each
    later chunk's behind the forward of the previous chunk's PP
    microbatches in flight (the interleaved warm-up), slowed by the DP
    tier's processor share (:func:`_hidden_behind`)."""
    g = self._dp_gather_forward_s
    if np.ndim(g) == 0 and g == 0.0:
      return 0.0
    bpc, fw, usage = self.blocks_per_chunk, self.block.fw_time, self.dp_usage
    first = g + _hidden_behind((bpc - 1) * g, (bpc - 1) * fw, usage)
    later = (self.interleaving - 1) * _hidden_behind(
      bpc * g, self.pp * bpc * fw, usage)
    return first + later

  @cached_property
  def block_dp_bytes(self):
    """Gradients of one block reduced across DP (training, DP > 1)."""
    b = self.block
    size = self._grad_reduce_bytes(b)
    if self.app.is_moe:
      size = size + self._grad_reduce_bytes(b, True)
    return np.where(self.dp_reduces_at_end, size, 0)

  @cached_property
  def _block_dp_times_s(self):
    return self._dp_times_s(self.block)

  @cached_property
  def block_dp_time_s(self):
    """DP communication of one block (see :meth:`_dp_times_s`)."""
    return self._block_dp_times_s[0]

  # -- DP overlap and the batch totals ----------------------------------------
  @cached_property
  def _dp_overlap(self):
    """Exposed DP time and required bandwidths with DP overlap.

    DP communication of a chunk overlaps the backward pass of the PP
    microbatches in flight (1F1B keeps PP microbatches per chunk); compute
    is slowed by the processor share driving the network, and DP transfers
    may collide with PP transfers on a shared tier.  The last chunk can only
    overlap its blocks after the first.  (Calculon, section 3.)
    """
    e, b = self.exe, self.block
    pp, bpc, usage = self.pp, self.blocks_per_chunk, self.dp_usage
    sharded = self._sharded
    optim_overlap = b.optim_time - b.optim_mem_time
    # Calculon's recompute terms (running totals, see BlockTotals).
    bw_mem = b.agrad_mem_time + b.wgrad_mem_time + b.dp_window_re_mem_time
    base_window = self.baseblock_bw_time_s - bw_mem
    edge_window = self.edgeblock_bw_time_s - bw_mem
    compute = b.agrad_flops_time + b.wgrad_flops_time + \
      b.dp_window_re_flops_time
    # Without sharding the optimizer step (but its memory traffic) overlaps.
    base_window = np.where(sharded, base_window, base_window + optim_overlap)
    edge_window = np.where(sharded, edge_window, edge_window + optim_overlap)
    compute = np.where(sharded, compute, compute + b.optim_flops_time)
    # DP cannot overlap TP traffic on the same tier.
    same_tp = e.data_par_net == e.tensor_par_net
    base_window = np.where(same_tp, base_window - (
      b.base_recomm_time + b.base_agrad_tp_time), base_window)
    edge_window = np.where(same_tp, edge_window - (
      b.edge_recomm_time + b.edge_agrad_tp_time), edge_window)
    chunk_window = self.baseblocks_per_chunk * base_window + \
      self.edgeblocks_per_chunk * edge_window
    chunk_compute = bpc * compute

    # With param_gather_overlap the all-gather leaves the backward windows
    # (it hides behind the forward pass, :attr:`_dp_gather_exposed_s`).
    dp_time = self.block_dp_time_s - self._dp_gather_forward_s
    num_chunks = self.interleaving - 1
    last_size = bpc - 1
    window = pp * chunk_window
    window_compute = pp * chunk_compute
    chunk_dp_time = bpc * dp_time
    same_pp = e.data_par_net == e.pipeline_par_net
    nmb = self.num_microbatches
    with np.errstate(divide='ignore', invalid='ignore'):
      fits = np.floor_divide(chunk_dp_time, self.chunk_bw_time_s)
    cap = np.where(nmb % pp != 0, nmb % pp, pp)
    collided = np.where(same_pp, _min(fits, cap), 0)
    pp_bw = self.chunk_bw_pp_time_s
    inflection = chunk_dp_time - (window - collided * pp_bw) + \
      window_compute * usage
    chunks_exposed = np.where(inflection > 0, num_chunks * inflection,
                              num_chunks * chunk_dp_time * usage)
    chunk_overlap = window + window_compute * usage
    chunk_overlap = np.where(same_pp, chunk_overlap - pp_bw, chunk_overlap)
    chunk_overlap = chunk_overlap * num_chunks
    net = self.system.networks
    tier = e.data_par_net
    gather_scalar = np.where(self.exe.param_gather_overlap, 0,
                             net.scalar['all_gather'][tier])
    scalar = np.where(sharded, net.scalar['reduce_scatter'][tier] +
                      gather_scalar, net.scalar['all_reduce'][tier])
    size = self.block_dp_bytes
    with np.errstate(divide='ignore', invalid='ignore'):
      req_chunk = np.where(chunk_overlap > 0,
                           bpc * size / chunk_overlap * scalar, 0)
    last_window = chunk_window - pp_bw - (
      self.baseblock_bw_time_s + self.edgeblock_bw_time_s) / 2
    last_window = np.where(sharded, last_window, last_window + optim_overlap)
    last_window = np.where(self.baseblocks_per_chunk > 0, last_window, 0)
    last_inflection = (last_size * dp_time) + (compute * usage - last_window)
    last_exposed = np.where(last_inflection > 0, last_inflection,
                            last_size * dp_time * usage)
    exposed = chunks_exposed + last_exposed
    tail = last_window + last_size * dp_time * usage
    with np.errstate(divide='ignore', invalid='ignore'):
      req_tail = np.where(tail > 0, bpc * size / tail * scalar, 0)
    return dp_time + exposed + self._dp_gather_exposed_s, req_chunk, req_tail

  @cached_property
  def dp_comm_exposed_time_s(self):
    """DP communication not hidden (all of it without DP overlap)."""
    plain = self.blocks_per_proc * self.block_dp_time_s
    if not np.any(self.exe.data_par_overlap):
      return np.where(self.dp_reduces_at_end, plain, 0)
    overlapped = self._dp_overlap[0]
    return np.where(self.dp_reduces_at_end, np.where(
      self.exe.data_par_overlap, overlapped, plain), 0)

  @cached_property
  def dp_comm_link_time_s(self):
    """DP communication on the link."""
    return np.where(self.dp_reduces_at_end,
                    self.blocks_per_proc * self.block_dp_time_s, 0)

  def _dp_req(self, index):
    if not np.any(self.exe.data_par_overlap):
      return np.zeros(())
    return np.where(self.dp_reduces_at_end & self.exe.data_par_overlap,
                    self._dp_overlap[index], 0)

  @cached_property
  def dp_bw_overlap_req_chunk(self):
    """DP bandwidth (bytes/s) needed to hide DP behind overlappable chunks."""
    return self._dp_req(1)

  @cached_property
  def dp_bw_overlap_req_tail(self):
    """DP bandwidth (bytes/s) needed to hide DP in the last chunk."""
    return self._dp_req(2)
