"""The embedding, the LM head and the loss (first and last pipeline
stages).

Provides :class:`VocabTerms` and its :data:`~VocabTerms.CONCERN` (the
batch term ``vocab_extra_time_s``, for a model with a vocabulary): their
layers and per-microbatch totals (``embed_layers``, ``head_layers``,
``embed``, ``head``), their time over the batch (``embedding_time_s``,
``lm_head_time_s``, and what they add to the batch time:
``vocab_time_s``, ``vocab_optim_time_s``, ``vocab_dp_time_s``,
``vocab_extra_time_s``), and their memory on the first and the last stage
(``head_activation_bytes``, ``vocab_memory_first``,
``vocab_memory_last``).

Reads: where the schedule puts the two ends (``pipeline_schedule``,
:mod:`~calculon.llm.terms.schedule`; the schedule table,
:mod:`~calculon.llm.terms.schedules`); ``app``, ``system``, ``exe``,
``ctx``, ``pp``, ``training``,
``fsdp``, ``weight_shards``, ``grad_bytes``
(:mod:`~calculon.llm.terms.base`); ``num_microbatches``,
``vocab_in_split``, ``baseblock_fw_time_no_offload_s``,
``baseblock_bw_time_no_offload_s`` (:mod:`~calculon.llm.terms.schedule`);
:meth:`~calculon.llm.terms.data.DataTerms._dp_time_s`;
:meth:`~calculon.llm.terms.fsdp.FsdpTerms._fsdp_times_s`.
"""

from functools import cached_property

import numpy as np

from calculon.llm.block import (
  BlockTotals, build_embedding, build_head, build_mtp)
from calculon.llm.terms import schedules
from calculon.llm.terms.base import Concern

_NO_VOCAB_MEMORY = {k: 0.0 for k in (
  'weights', 'activations', 'weight_gradients', 'optimizer',
  'activation_gradients')}


class VocabTerms:
  """The embedding, the LM head and the loss (see the module)."""

  #: What the embedding, the LM head and the loss add to the batch time,
  #: for a model with a vocabulary.
  CONCERN = Concern('vocabulary', lambda ev: bool(ev.app.has_vocab),
                    batch=('vocab_extra_time_s',))

  @cached_property
  def embed_layers(self):
    """Layers of the input embedding (see :func:`build_embedding`)."""
    return build_embedding(self.app, self.exe, self.ctx)

  @cached_property
  def head_layers(self):
    """Layers of the LM head and loss (see :func:`build_head`), and those
    of the multi-token prediction modules but their blocks (see
    :func:`build_mtp`).  With tied embeddings and PP = 1 the head uses the
    embedding's weights; with PP > 1 the last stage keeps its own copy
    (Megatron-LM's embedding group)."""
    holds = True
    if self.app.tied_embeddings:
      holds = self.pp > 1
    return build_head(self.app, self.exe, self.ctx, holds) + \
      build_mtp(self.app, self.exe, self.ctx, self.pp > 1)

  @cached_property
  def embed(self):
    """Per-microbatch totals of the embedding (:class:`BlockTotals`)."""
    with np.errstate(divide='ignore', invalid='ignore'):
      return BlockTotals(self.embed_layers, self.training, False)

  @cached_property
  def head(self):
    """Per-microbatch totals of the LM head and loss."""
    with np.errstate(divide='ignore', invalid='ignore'):
      return BlockTotals(self.head_layers, self.training, False)

  @cached_property
  def mtp_blocks(self):
    """Transformer blocks of the multi-token prediction modules on the last
    stage (``mtp_layers``): one per module, of the
    decoder's own kind (Megatron-Core builds each module's layer from the
    decoder's layer spec, multi_token_prediction.py get_mtp_layer_spec;
    DeepSeek-V3's is an MoE block), priced as the busiest stage's average
    block (``block``: the MoE block wherever that stage holds only MoE
    blocks)."""
    return self.app.mtp_layers

  # -- time -------------------------------------------------------------------
  def _stage_time_s(self, t):
    """Forward and backward seconds of one microbatch through ``t``."""
    fw = t.fw_time + t.base_fw_tp_exposed
    bw = t.agrad_time + t.wgrad_time + t.base_agrad_tp_exposed
    return fw + np.where(self.training, bw, 0)

  @cached_property
  def embedding_time_s(self):
    """Embedding forward + backward over the batch (first stage)."""
    return self.num_microbatches * self._stage_time_s(self.embed)

  @cached_property
  def lm_head_time_s(self):
    """LM head and loss forward + backward over the batch (last stage)."""
    return self.num_microbatches * self._stage_time_s(self.head)

  @cached_property
  def vocab_time_s(self):
    """What the embedding, LM head and loss add to the batch time.

    Pipeline stages hold blocks / PP blocks each (Megatron-LM's default,
    without --account-for-embedding-in-pipeline-split); the embedding runs
    on the first stage, the head and loss on the last.  With PP = 1 every
    microbatch runs both.  With PP > 1 the 1F1B steady state runs at the
    pace of the slower of the two stages, so each microbatch but one adds
    the larger extra, and the first and the last microbatch cross both
    ends: (nmb - 1) max(E, H) + E + H per batch, E and H the forward +
    backward seconds of one microbatch.

    With ``pipeline_split_counts_vocab`` the two end stages hold one block
    less (Megatron-Core ``--account-for-embedding-in-pipeline-split`` and
    ``--account-for-loss-in-pipeline-split``: L + 2 slots split over the
    stages, one fewer block built on the first and the last;
    megatron/core/transformer/transformer_block.py,
    get_num_layers_to_build): E and H become E - b and H - b, b the forward
    + backward seconds of one block (recomputation and exposed TP traffic
    included; offload overheads left out, so the term never shrinks as
    they grow), and the steady state adds max(E - b, H - b, 0), never
    running faster than the middle stages.

    With a layout (``pipeline_first_stage_blocks``,
    ``pipeline_last_stage_blocks``) the rank with the embedding holds d1
    blocks fewer than the busiest rank and the one with the loss d2
    (:func:`~calculon.llm.terms.schedule.stage_layout`): E and H become
    max(E - d1 b, 0) and max(H - d2 b, 0), a lighter end stage adding
    nothing; on one rank (the V schedules) the two ends add max(E + H -
    d1 b, 0) each microbatch.

    Multi-token prediction (``mtp_layers`` D) runs on the loss's stage
    (Megatron-Core without a layout places every module on the last
    pipeline stage, multi_token_prediction.py mtp_on_this_rank): H holds
    the modules' head passes, projections and embeddings (the head's
    layers) and their D blocks, D b.
    """
    block_s = 0.0
    if np.any(self.vocab_in_split) or self.pipeline_layout is not None or \
        self.mtp_blocks:
      # The end stages run E and H in place of one block each; the loss's
      # stage runs the multi-token prediction blocks too.
      block_s = self.baseblock_fw_time_no_offload_s + np.where(
        self.training, self.baseblock_bw_time_no_offload_s, 0)
    return self.vocab_time_for_s(block_s)

  def vocab_time_for_s(self, block_s):
    """:attr:`vocab_time_s` with ``block_s`` the forward + backward
    seconds of one block of the end stages (used only where the split
    counts the embedding and the loss).  The search's bound
    (:func:`calculon.search.bound.rate_bound`) calls it with a lower
    bound of the block time: with S >= 2 block slots a stage (PP <= L <
    L + 2), the blocks' S x nmb x b plus this term grow with b (the term
    falls by at most (nmb + 1) b), so the sum stays a lower bound."""
    e = self._stage_time_s(self.embed)
    # The multi-token prediction modules' blocks run on the loss's stage.
    mtp_s = self.mtp_blocks * block_s
    h = self._stage_time_s(self.head) + mtp_s
    if np.any(self.vocab_in_split):
      b = np.where(self.vocab_in_split, block_s, 0)
      e, h = e - b, h - b
    # E and H are >= 0 without the split, so the floor acts only with it.
    steady = np.maximum(np.maximum(e, h), 0)
    nmb = self.num_microbatches
    out = np.where(self.pp > 1, (nmb - 1) * steady + e + h, nmb * (e + h))
    ends = self._ends_on_one_rank
    lay = self.pipeline_layout
    if lay is not None:
      e0 = self._stage_time_s(self.embed)
      h0 = self._stage_time_s(self.head) + mtp_s
      d1 = (self.blocks_per_proc - lay.first_blocks) * block_s
      d2 = (self.blocks_per_proc - lay.last_blocks) * block_s
      e1, h1 = np.maximum(e0 - d1, 0), np.maximum(h0 - d2, 0)
      uneven = (nmb - 1) * np.maximum(e1, h1) + e1 + h1
      if ends is not None:
        uneven = np.where(ends, nmb * np.maximum(e0 + h0 - d1, 0), uneven)
      out = np.where(lay.given, uneven, out)
    if ends is None:
      return out
    # One rank runs both ends (the schedule table): the V schedules' first
    # rank every microbatch's embedding and loss; each end rank of
    # 'dualpipe' its direction's half of the embeddings and the other
    # direction's half of the losses.
    both = np.where(self.pipeline_schedule == schedules.DUALPIPE,
                    (nmb + 1) / 2, nmb) * (e + h)
    if lay is not None:
      ends = ends & ~lay.given
    return np.where(ends, both, out)

  @cached_property
  def _ends_on_one_rank(self):
    """Where one rank holds and runs both the embedding and the loss
    (PP > 1; :func:`~calculon.llm.terms.schedules.ends_on_one_rank`);
    None when no execution does."""
    sched = self.pipeline_schedule
    if not schedules.any_new(sched):
      return None
    ends = schedules.ends_on_one_rank(sched) & (self.pp > 1)
    return ends if np.any(ends) else None

  @cached_property
  def vocab_optim_time_s(self):
    """Optimizer step of the embedding and LM head weights (the slower of
    the first and last stage; both with PP = 1)."""
    e = self.embed.optim_time
    h = self.head.optim_time + self.mtp_blocks * self.block.optim_time
    apart = self.pp > 1
    if self._ends_on_one_rank is not None:
      apart = apart & ~self._ends_on_one_rank
    return np.where(self.training, np.where(apart, np.maximum(e, h),
                                            e + h), 0)

  def _vocab_dp_s(self, t):
    """Data-parallel communication of the weights of ``t`` per batch:
    the end-of-batch reduction (:meth:`_dp_time_s`), or with FSDP its
    gathers and reduce-scatter every microbatch (ZeRO-2 reducing every
    microbatch: its reduce-scatters, then the end-of-batch gather).  Not overlapped: the
    embedding's gradients are the last the first stage produces."""
    ag, rs = self._fsdp_times_s(t)
    fsdp = self.num_microbatches * (2 * ag + rs)
    zero2 = np.where(self.grad_shard_per_microbatch,
                     self.num_microbatches * rs, 0)
    return np.where(self.fsdp, fsdp, self._dp_time_s(t) + zero2)

  @cached_property
  def vocab_dp_time_s(self):
    """DP communication of the embedding and LM head weights, plus with
    tied embeddings and PP > 1 the all-reduce of the embedding gradients
    between the first and last stage (Megatron-LM's embedding group, on the
    PP tier)."""
    if not self.app.has_vocab:
      return 0.0
    e, h = self._vocab_dp_s(self.embed), self._vocab_dp_s(self.head)
    tie = 0.0
    if self.app.tied_embeddings:
      size = self.embed.weight_elems * self.grad_bytes
      tie = np.where((self.pp > 1) & self.training, self.system.networks.time_s(
        'all_reduce', size, 2, self.exe.pipeline_par_net), 0)
    apart = self.pp > 1
    if self._ends_on_one_rank is not None:
      apart = apart & ~self._ends_on_one_rank
    return np.where(apart, np.maximum(e, h) + tie, e + h)

  @cached_property
  def vocab_extra_time_s(self):
    """Everything the embedding, LM head and loss add to the batch time."""
    return self.vocab_time_s + self.vocab_optim_time_s + self.vocab_dp_time_s

  # -- memory -----------------------------------------------------------------
  def _vocab_memory(self, t, activations):
    """Tier-1 bytes by kind of the weights in ``t`` (sharded per the
    sharding level) and the given activations."""
    train = self.training
    return {
      'weights': t.weight_bytes / self.weight_shards,
      'activations': activations,
      'weight_gradients': np.where(train, t.weight_grad_bytes, 0),
      'optimizer': np.where(train, t.optimizer_bytes, 0),
      'activation_gradients': np.where(train, t.act_grad_bytes, 0),
    }

  @cached_property
  def head_activation_bytes(self):
    """The LM head's working set and what it keeps for the backward pass
    (the fp32 softmax of the logits): one microbatch in flight."""
    h = self.head
    return h.act_working_bytes + np.where(self.training, h.act_storage_bytes,
                                          0)

  @cached_property
  def vocab_memory_last(self):
    """Tier-1 bytes by kind of the LM head on the last stage (with the
    multi-token prediction modules' layers but their blocks, which the
    stage holds as its own: see
    :attr:`~calculon.llm.terms.memory.MemoryTerms._last_stage`)."""
    if not self.app.has_vocab:
      return _NO_VOCAB_MEMORY
    return self._vocab_memory(self.head, self.head_activation_bytes)

  @cached_property
  def vocab_memory_first(self):
    """Tier-1 bytes by kind of the embedding on the first stage (and of the
    LM head too when PP = 1)."""
    if not self.app.has_vocab:
      return _NO_VOCAB_MEMORY
    e = self._vocab_memory(self.embed, 0.0)
    h = self.vocab_memory_last
    single = self.pp == 1
    if self._ends_on_one_rank is not None:
      single = single | self._ends_on_one_rank
    out = {k: e[k] + np.where(single, h[k], 0) for k in e}
    out['activation_gradients'] = np.where(
      single, np.maximum(e['activation_gradients'],
                         h['activation_gradients']),
      e['activation_gradients'])
    return out
