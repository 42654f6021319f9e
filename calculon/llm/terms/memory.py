"""Memory per processor: each kind of memory, on the first and the last
pipeline stage, in memory tiers 1 and 2.

Provides :class:`MemoryTerms`: the bytes of each kind for the processor's
blocks (``weight_bytes``, ``act_bytes``, ``act_checkpoint_bytes``,
``act_grad_bytes``, ``weight_grad_bytes``, ``optimizer_bytes``) and what
tier 1 still holds of an offloaded kind (the ``*_min`` sizes), the kinds
of the first and the last stage with the embedding's and the LM head's
(``first_stage_memory_by_kind``, ``last_stage_memory_by_kind``), those of
the most loaded stage (``memory_by_kind``), the blocks whose activations
go to tier 2 with ``activation_offload_layers`` 'fit'
(``act_offload_blocks``), the tier totals (``first_stage_mem1_bytes``,
``last_stage_mem1_bytes``, ``mem1_tensor_bytes``, ``mem1_bytes``,
``mem2_bytes``), and what a run holds beyond its tensors: the caching
allocator's fragmentation (in ``mem1_bytes``), the CUDA context, NCCL's
buffers and the TP overlap's registered buffers outside the allocator
(``nccl_groups``, ``tp_overlap_buffer_bytes``, ``mem1_runtime_bytes``)
and the capacity a run may fill (``mem1_usable_bytes``), from the system's
``memory_reserve`` and the behaviour ``tp_overlap_buffers``.

Reads: the schedule table (:mod:`~calculon.llm.terms.schedules`: the
microbatches in flight and the parameter copies of the schedules other
than Calculon's; ``pipeline_schedule``,
:mod:`~calculon.llm.terms.schedule`); ``app``, ``exe``, ``pp``,
``interleaving``, ``training``, ``full_recompute``, ``fsdp``, ``weight_shards``, ``dpcp``, ``edp``
(:mod:`~calculon.llm.terms.base`); ``block``,
``block_act_checkpoint_bytes`` (:mod:`~calculon.llm.terms.blocks`);
``blocks_per_proc``, ``num_microbatches``
(:mod:`~calculon.llm.terms.schedule`); ``vocab_memory_first``,
``vocab_memory_last`` (:mod:`~calculon.llm.terms.vocab`); ``_host_step``
(:mod:`~calculon.llm.terms.offload`); ``tp``, ``cp``, ``ep``, ``ctx``
(``io_bytes``, ``tp_gather_bytes``) (:mod:`~calculon.llm.terms.base`).
"""

from functools import cached_property

import numpy as np

from calculon.config.execution import TP_OVERLAP_NONE
from calculon.config.registry import (
  ACTIVATION_OFFLOAD_LAYERS_NAMES, ACTIVATION_OFFLOAD_SCOPE_NAMES,
  OPTIMIZER_OFFLOAD_GRADIENTS_NAMES, TP_OVERLAP_BUFFER_NAMES)
from calculon.llm.terms import schedules

_ACT_OFFLOAD_FIT = ACTIVATION_OFFLOAD_LAYERS_NAMES.index('fit')
_GRADS_ON_DEVICE = OPTIMIZER_OFFLOAD_GRADIENTS_NAMES.index('device')
#: The vocabulary parts of a stage without the embedding or the head.
_NO_VOCAB = {k: 0.0 for k in (
  'weights', 'activations', 'weight_gradients', 'optimizer',
  'activation_gradients')}
_ACT_SCOPE_TE = ACTIVATION_OFFLOAD_SCOPE_NAMES.index('te_marked')
_TE_USERBUFFERS = TP_OVERLAP_BUFFER_NAMES.index('te_userbuffers')
#: Transformer Engine's userbuffers per overlapped run: one buffer per GEMM
#: name of a transformer layer, by the collective it overlaps
#: (transformer_engine/pytorch/module/base.py initialize_ub at d0067d0da:
#: layers_all_gather_overlap qkv_fprop, qkv_dgrad, proj_dgrad, proj_wgrad,
#: fc1_fprop, fc1_dgrad, fc2_dgrad, fc2_wgrad; layers_reduce_scatter_overlap
#: proj_fprop, fc2_fprop, qkv_wgrad, fc1_wgrad).
TE_UB_ALL_GATHER_BUFFERS = 8
TE_UB_REDUCE_SCATTER_BUFFERS = 4


class MemoryTerms:
  """Memory per processor by kind and tier (see the module)."""

  @cached_property
  def weight_bytes(self):
    """Weights of the processor's blocks.  Sharded over DP x CP with FSDP,
    which also keeps the gathered weights of the block being computed and
    of the prefetched next one (PyTorch FSDP FULL_SHARD with forward
    prefetch)."""
    plain = self.block.weight_bytes * self.blocks_per_proc
    if self._param_copies is not None:
      plain = plain * self._param_copies
    if not np.any(self.fsdp):
      return plain
    working = np.minimum(2, self.blocks_per_proc) * self.block.weight_bytes
    sharded = plain / self.weight_shards
    if self.app.is_moe:
      experts = self.block.expert_weight_bytes * self.blocks_per_proc
      sharded = (plain - experts) / self.dpcp + experts / self.edp
    return np.where(self.fsdp, sharded + working, plain)

  @cached_property
  def _weight_host_bytes(self):
    """Weights tier 2 holds when they are offloaded: all of them
    (Calculon), or with FSDP this processor's shards only (FSDP2
    CPUOffloadPolicy and DeepSpeed ZeRO-3 offload_param keep the shards on
    the host and gather into the device's working blocks)."""
    if not np.any(self.fsdp):
      return self.weight_bytes
    plain = self.block.weight_bytes * self.blocks_per_proc
    sharded = plain / self.weight_shards
    if self.app.is_moe:
      experts = self.block.expert_weight_bytes * self.blocks_per_proc
      sharded = (plain - experts) / self.dpcp + experts / self.edp
    return np.where(self.fsdp, sharded, self.weight_bytes)

  @cached_property
  def _schedule_inflight(self):
    """(first, last) stage's microbatches in flight of the schedules other
    than Calculon's (the schedule table,
    :func:`~calculon.llm.terms.schedules.in_flight`); None when every
    execution runs Calculon's."""
    sched = self.pipeline_schedule
    if not schedules.any_new(sched):
      return None
    first, last = schedules.in_flight(
      sched, self.pp, self.num_microbatches, self._calculon_inflight_factor,
      self._calculon_last_stage_inflight_factor)
    single = self.pp == 1
    return (np.where(single, self._calculon_inflight_factor, first),
            np.where(single, self._calculon_last_stage_inflight_factor, last))

  @cached_property
  def _inflight_factor(self):
    """Microbatches (in units of the processor's blocks) whose activations
    the first stage keeps: :attr:`_calculon_inflight_factor` for
    Calculon's schedules, the schedule table's for the others."""
    other = self._schedule_inflight
    return self._calculon_inflight_factor if other is None else other[0]

  @cached_property
  def _last_stage_inflight_factor(self):
    """The same for the last stage
    (:attr:`_calculon_last_stage_inflight_factor`, or the table's)."""
    other = self._schedule_inflight
    return self._calculon_last_stage_inflight_factor if other is None \
      else other[1]

  @cached_property
  def _param_copies(self):
    """Copies of its stages' parameters a processor holds (2 with
    'dualpipe', :func:`~calculon.llm.terms.schedules.param_copies`); None
    when no execution keeps a second (nothing is scaled)."""
    sched = self.pipeline_schedule
    if not schedules.any_new(sched):
      return None
    copies = schedules.param_copies(sched)
    return copies if np.any(copies != 1) else None

  @cached_property
  def _calculon_inflight_factor(self):
    """Microbatches whose activations are kept: min(nmb, PP) for 1F1B, times
    1 + (PP - 1) / (interleaving * PP) for the interleaved schedule
    (Korthikanti et al. 2022, section 4.2.3); with
    ``pipeline_warmup_capped`` never more than nmb."""
    nmb = self.num_microbatches
    mb = np.where(nmb < self.pp, nmb, self.pp)
    inter = mb * (1 + (self.pp - 1) / (self.interleaving * self.pp))
    capped = self.exe.pipeline_warmup_capped
    if np.any(capped):
      # The warm-up runs at most every chunk-microbatch, nmb x VP, which is
      # nmb processor-blocks' worth: Megatron-LM megatron/schedules.py
      # (dd88906264, 2020) "num_warmup_microbatches =
      # min(num_warmup_microbatches, num_microbatches)" over nmb x chunks,
      # still in megatron/core/pipeline_parallel/schedules.py
      # get_pp_rank_microbatches; PyTorch torch/distributed/pipelining/
      # schedules.py ScheduleInterleaved1F1B get_rank_warmup_ops
      # "min(warmup_ops, self._n_microbatches * self.n_local_stages)".
      # With nmb = PP = 8 and two chunks the first rank runs all 16
      # chunk-forwards before its first backward: 8 microbatches of its
      # blocks in flight, not 11.5.
      inter = np.where(capped, np.minimum(inter, nmb), inter)
    return np.where(self.interleaving > 1, inter, mb)

  @cached_property
  def _calculon_last_stage_inflight_factor(self):
    """Microbatches (in units of the processor's blocks) whose activations
    the last pipeline stage keeps: one with 1F1B; with v model chunks its
    warm-up holds (v - 1) PP + 1 chunk-microbatches (Megatron-LM
    ``forward_backward_pipelining_with_interleaving``), i.e.
    ((v - 1) PP + 1) / v processor-blocks' worth."""
    v = self.interleaving
    f = ((v - 1) * self.pp + 1) / v
    return np.where(self.pp > 1, np.minimum(f, self.num_microbatches),
                    self._calculon_inflight_factor)

  def _act_bytes_for(self, inflight, blocks=None):
    b = self.block
    if blocks is None:
      blocks = self.blocks_per_proc
    kept = b.act_working_bytes + b.act_storage_bytes * (
      blocks * inflight - 1)
    return np.where(self.training & ~self.full_recompute, kept,
                    b.act_working_bytes)

  def _checkpoint_bytes_for(self, inflight, blocks=None):
    if blocks is None:
      blocks = self.blocks_per_proc
    ckpt = blocks * self.block_act_checkpoint_bytes
    return np.where(self.training & self.full_recompute, ckpt * inflight, 0)

  @cached_property
  def act_bytes(self):
    """Activations kept: one working block plus the stored activations of all
    blocks in flight (only the working block with full recomputation or in
    inference)."""
    return self._act_bytes_for(self._inflight_factor)

  @cached_property
  def act_checkpoint_bytes(self):
    """Block-input checkpoints of all blocks in flight (full recompute)."""
    return self._checkpoint_bytes_for(self._inflight_factor)

  @cached_property
  def act_grad_bytes(self):
    """Activation gradients of one block."""
    return np.where(self.training, self.block.act_grad_bytes, 0)

  @cached_property
  def weight_grad_bytes(self):
    """One unsharded copy (Calculon: fp32) for the block being computed
    plus the gradients of the other blocks, sharded per the sharding
    level."""
    b = self.block
    grads = np.where(self.blocks_per_proc == 1,
                     b.weight_grad_unsharded_bytes,
                     b.weight_grad_unsharded_bytes + b.weight_grad_bytes * (
                       self.blocks_per_proc - 1))
    if self._param_copies is not None:
      # The mirrored stage's gradients are kept whole too ('dualpipe').
      grads = grads + (self._param_copies - 1) * b.weight_grad_bytes * \
        self.blocks_per_proc
    return np.where(self.training, grads, 0)

  def _weight_grad_bytes_for(self, blocks):
    """:attr:`weight_grad_bytes` of a stage holding ``blocks`` blocks (a
    layout's end stage; none is a 'dualpipe' one: a layout is refused
    with it)."""
    b = self.block
    grads = np.where(blocks <= 1, np.where(
      blocks == 1, b.weight_grad_unsharded_bytes, 0),
      b.weight_grad_unsharded_bytes + b.weight_grad_bytes * (blocks - 1))
    return np.where(self.training, grads, 0)

  @cached_property
  def optimizer_bytes(self):
    """Optimizer state of the processor's blocks (of both copies with
    'dualpipe')."""
    state = self.block.optimizer_bytes * self.blocks_per_proc
    if self._param_copies is not None:
      state = state * self._param_copies
    return np.where(self.training, state, 0)

  # "min" sizes: what tier 1 must still hold when a kind is offloaded
  # (double-buffered blocks).
  @cached_property
  def weight_bytes_min(self):
    return self.block.weight_bytes * 2

  @cached_property
  def act_bytes_min(self):
    b = self.block
    return np.where(self.full_recompute, b.act_working_bytes,
                    b.act_working_bytes + b.act_storage_bytes)

  @cached_property
  def act_checkpoint_bytes_min(self):
    """NaN (JSON null) in inference, as Calculon reports."""
    return np.where(self.training, np.where(
      self.full_recompute, self.block_act_checkpoint_bytes * 2, 0), np.nan)

  @cached_property
  def weight_grad_bytes_min(self):
    b = self.block
    return np.where(self.training, b.weight_grad_unsharded_bytes +
                    b.weight_grad_bytes, 0)

  @cached_property
  def optimizer_bytes_min(self):
    return np.where(self.training, self.block.optimizer_bytes * 2, 0)

  # -- the stages' kinds and the tiers ----------------------------------------
  def _kinds(self, act, ckpt, vocab, kept=0.0, blocks=None):
    """{kind: (tier-1 bytes, tier-2 bytes)} of a pipeline stage whose
    blocks keep ``act`` activations and ``ckpt`` checkpoints, plus the
    embedding / LM head parts ``vocab`` (a dict by kind, tier 1 only);
    ``kept``: the stored activations offloaded blocks keep in tier 1
    (``activation_offload_scope`` 'te_marked', :meth:`_act_unmarked_for`).
    With ``activation_offload_layers`` 'fit' the stage keeps them all here
    (:meth:`_stage_kinds` then moves the blocks it offloads).  ``blocks``:
    the stage's blocks where a layout gives them or the loss's stage holds
    multi-token prediction blocks (the weights, their gradients and the
    optimizer state of that many blocks), None: the busiest stage's."""
    e = self.exe
    weights, grads, optim = self.weight_bytes, self.weight_grad_bytes, \
      self.optimizer_bytes
    host_weights = self._weight_host_bytes
    grad_blocks = self.blocks_per_proc
    if blocks is not None:
      # A layout's ranks where it is given; every rank's count where the
      # loss's rank also holds the multi-token prediction blocks.
      lay = self.pipeline_layout
      given = True if lay is None or self.mtp_blocks else lay.given
      with np.errstate(divide='ignore', invalid='ignore'):
        ratio = blocks / np.maximum(self.blocks_per_proc, 1)
      weights = np.where(given, weights * ratio, weights)
      host_weights = np.where(given, host_weights * ratio, host_weights)
      optim = np.where(given, optim * ratio, optim)
      grads = np.where(given, self._weight_grad_bytes_for(blocks), grads)
      grad_blocks = np.where(given, blocks, grad_blocks)
    wo, oo = e.weight_offload, e.optimizer_offload
    ao = e.activations_offload
    fit = self._act_fit
    if np.any(fit):
      ao = ao & ~fit
    full = self.full_recompute
    act1 = np.where(ao, self.act_bytes_min + kept, act)
    act2 = np.where(ao & ~full, act - kept, 0)
    ckpt1 = np.where(ao, np.where(full, self.act_checkpoint_bytes_min, 0),
                     ckpt)
    ckpt2 = np.where(ao & full, ckpt, 0)
    optim1 = np.where(oo, self.optimizer_bytes_min, optim)
    host = self._host_step
    if np.any(host):
      # The state lives and is updated on the host: the device streams
      # none of it.
      optim1 = np.where(host, 0, optim1)
    grads2 = np.where(oo, self.block.weight_grad_bytes * grad_blocks, 0)
    optim2 = np.where(oo, optim, 0)
    grads_kept = self._grads_kept
    if np.any(grads_kept):
      # The gradient buffer stays in tier 1; the host step's copy of the
      # gradients is the optimizer's, in tier 2.
      optim2 = optim2 + np.where(grads_kept, grads2, 0)
      grads2 = np.where(grads_kept, 0, grads2)
    return {
      'weights': (np.where(wo, self.weight_bytes_min, weights) +
                  vocab['weights'], np.where(wo, host_weights, 0)),
      'activations': (act1 + vocab['activations'], act2),
      'checkpoints': (ckpt1, ckpt2),
      'weight_gradients': (np.where(self._grads_offloaded,
                                    self.weight_grad_bytes_min,
                                    grads) +
                           vocab['weight_gradients'], grads2),
      'optimizer': (optim1 + vocab['optimizer'], optim2),
      'activation_gradients': (np.maximum(self.act_grad_bytes,
                                          vocab['activation_gradients']), 0),
    }

  @cached_property
  def _grads_kept(self):
    """True where the optimizer state is offloaded and the weight
    gradients stay in tier 1 (``optimizer_offload_gradients`` 'device'):
    the gradient buffer whole in tier 1, the host step's copy of the
    gradients (as many bytes as Calculon offloads) in tier 2 with the
    optimizer state (Megatron-Core HybridDeviceOptimizer,
    optimizer/cpu_offloading/hybrid_optimizer.py, d98e8a64dd:
    ``_set_sub_optimizer_grads`` copies each GPU grad into a pinned CPU
    tensor)."""
    keep = self.exe.optimizer_offload_gradients == _GRADS_ON_DEVICE
    if not np.any(keep):
      return False
    return np.asarray(self.exe.optimizer_offload, dtype=bool) & keep

  @cached_property
  def _grads_offloaded(self):
    """True where the weight gradients leave tier 1 with the optimizer
    state (``optimizer_offload`` with ``optimizer_offload_gradients``
    'host', Calculon's; see :attr:`_grads_kept`)."""
    oo = self.exe.optimizer_offload
    if not np.any(self._grads_kept):
      return oo
    return np.asarray(oo, dtype=bool) & ~self._grads_kept

  @cached_property
  def _act_fit(self):
    """Activations offloaded with ``activation_offload_layers`` 'fit'."""
    return np.asarray(self.exe.activations_offload, dtype=bool) & (
      self.exe.activation_offload_layers == _ACT_OFFLOAD_FIT)

  @cached_property
  def _act_block_bytes(self):
    """What one block keeps per microbatch in flight and offloading it
    frees: its stored activations, or its checkpoint with full
    recomputation."""
    return np.where(self.full_recompute, self.block_act_checkpoint_bytes,
                    self.block.act_storage_bytes)

  @cached_property
  def _act_te(self):
    """Offloaded activations limited to the tensors Transformer Engine
    marks (``activation_offload_scope`` 'te_marked'), without full
    recomputation (whose block-input checkpoints offload whole)."""
    return np.asarray(self.exe.activations_offload, dtype=bool) & (
      self.exe.activation_offload_scope == _ACT_SCOPE_TE) & \
      ~np.asarray(self.full_recompute, dtype=bool)

  @cached_property
  def _act_offload_block_bytes(self):
    """What offloading one block moves to tier 2 per microbatch in flight:
    :attr:`_act_block_bytes`, or with ``activation_offload_scope``
    'te_marked' only its stored tensors that Transformer Engine marks
    (``block.act_offloadable_bytes``)."""
    te = self._act_te
    if not np.any(te):
      return self._act_block_bytes
    return np.where(te, self.block.act_offloadable_bytes,
                    self._act_block_bytes)

  def _act_unmarked_for(self, inflight, blocks=None):
    """Stored activations that every block offloaded with
    ``activation_offload_layers`` 'all' keeps in tier 1 under
    ``activation_offload_scope`` 'te_marked' (the unmarked part of each
    stored block, as many as :meth:`_act_bytes_for` stores); 0
    elsewhere."""
    te = self._act_te
    if not np.any(te):
      return 0.0
    b = self.block
    n = (self.blocks_per_proc if blocks is None else blocks) * inflight - 1
    kept = (b.act_storage_bytes - b.act_offloadable_bytes) * n
    return np.where(te & self.training, kept, 0)

  def _stage_kinds(self, inflight, vocab, blocks=None):
    """(kinds, offloaded blocks) of a pipeline stage with ``inflight``
    microbatches in flight and the vocabulary parts ``vocab``.  With
    ``activation_offload_layers`` 'fit' the stage offloads the fewest
    blocks k (0 <= k <= blocks - 1: Megatron-Core requires
    cpu_offloading_num_layers < num_layers, transformer_config.py) whose
    activations (checkpoints with full recomputation) bring its tier-1
    tensors within :attr:`mem1_tensor_budget_bytes`: NVIDIA's recipes
    offload only part of the layers (GB200 Llama 3 70B FP8: 40 of 80 at
    microbatch 2, BF16: 20 at microbatch 1; B200: 5 of 80; Megatron-Bridge
    perf_recipes/llama/gb200/llama3.py, b200/llama3.py), and its
    performance guide tunes "the number of layers to offload" because
    each costs transfers.  ``blocks``: the stage's blocks (a layout's),
    None: the busiest stage's."""
    kinds = self._kinds(self._act_bytes_for(inflight, blocks),
                        self._checkpoint_bytes_for(inflight, blocks), vocab,
                        self._act_unmarked_for(inflight, blocks), blocks)
    fit = self._act_fit
    if not np.any(fit):
      return kinds, 0.0
    kept = self._tiers(kinds)[0]
    save = self._act_offload_block_bytes * inflight
    with np.errstate(divide='ignore', invalid='ignore'):
      need = np.ceil((kept - self.mem1_tensor_budget_bytes) / save)
    k = np.clip(np.where(save > 0, need, 0), 0,
                np.maximum((self.blocks_per_proc if blocks is None
                            else blocks) - 1, 0))
    k = np.where(fit & np.isfinite(k), k, 0)
    moved = k * save
    full = self.full_recompute
    for kind, on in (('activations', ~full), ('checkpoints', full)):
      t1, t2 = kinds[kind]
      m = np.where(on, moved, 0)
      kinds[kind] = (t1 - m, t2 + m)
    return kinds, k

  def _tiers(self, kinds):
    """(tier-1, tier-2) bytes of ``kinds``, summed in Calculon's order and
    grouping (bit-identical totals)."""
    oo = self.exe.optimizer_offload
    w, a, c = kinds['weights'], kinds['activations'], kinds['checkpoints']
    g, o = kinds['weight_gradients'], kinds['optimizer']
    t1 = 0 + w[0]
    t1 = t1 + a[0]
    t1 = t1 + c[0]
    t1 = np.where(oo, t1 + g[0] + o[0], t1 + (g[0] + o[0]))
    t1 = t1 + kinds['activation_gradients'][0]
    t2 = 0 + w[1]
    t2 = t2 + (a[1] + c[1])
    t2 = t2 + g[1]
    t2 = t2 + o[1]
    return t1, t2

  def _layout_blocks(self, which):
    """Blocks of the rank with the embedding ('first') or the loss
    ('last') where a layout gives them, the busiest rank's elsewhere;
    None without a layout."""
    lay = self.pipeline_layout
    if lay is None:
      return None
    blocks = lay.first_blocks if which == 'first' else lay.last_blocks
    return np.where(lay.given, blocks, self.blocks_per_proc)

  @cached_property
  def _first_stage(self):
    return self._stage_kinds(self._inflight_factor, self.vocab_memory_first,
                             self._layout_blocks('first'))

  @cached_property
  def _last_stage(self):
    """The rank with the loss, which also holds the multi-token prediction
    modules' blocks (:attr:`~calculon.llm.terms.vocab.VocabTerms.
    mtp_blocks`) as blocks of its own: their weights, gradients, optimizer
    state and activations as its other blocks keep them."""
    blocks = self._layout_blocks('last')
    if self.mtp_blocks:
      blocks = (self.blocks_per_proc if blocks is None else blocks) + \
        self.mtp_blocks
    return self._stage_kinds(self._last_stage_inflight_factor,
                             self.vocab_memory_last, blocks)

  @cached_property
  def _middle_stage(self):
    """With a layout, the busiest rank (its blocks, no vocabulary, the
    first stage's microbatches in flight), which may hold more than
    either end; None without a layout."""
    lay = self.pipeline_layout
    if lay is None:
      return None
    return self._stage_kinds(self._inflight_factor, _NO_VOCAB, np.where(
      lay.given, lay.middle_blocks, self.blocks_per_proc))

  @cached_property
  def _middle_binds(self):
    """Where the busiest rank of a layout needs more tier-1 memory than
    both ends (False without a layout)."""
    if self._middle_stage is None:
      return False
    mid = self._tiers(self._middle_stage[0])[0]
    return self.pipeline_layout.given & (self.pp > 2) & (
      mid > np.maximum(self.first_stage_mem1_bytes,
                       self.last_stage_mem1_bytes))

  @cached_property
  def first_stage_memory_by_kind(self):
    """Memory kinds of the first pipeline stage (Calculon's processor 0;
    with a vocabulary it also holds the embedding, and the LM head when
    PP = 1)."""
    return self._first_stage[0]

  @cached_property
  def last_stage_memory_by_kind(self):
    """Memory kinds of the last pipeline stage (fewer microbatches in
    flight; the LM head and its logits)."""
    return self._last_stage[0]

  @cached_property
  def act_offload_blocks(self):
    """Blocks of the most loaded stage whose activations go to tier 2 with
    ``activation_offload_layers`` 'fit' (see :meth:`_stage_kinds`); 0
    elsewhere."""
    if not np.any(self._act_fit):
      return 0.0
    if not self.app.has_vocab and self.pipeline_layout is None:
      return self._first_stage[1]
    out = np.where(self._last_binds, self._last_stage[1],
                   self._first_stage[1])
    if np.any(self._middle_binds):
      out = np.where(self._middle_binds, self._middle_stage[1], out)
    return out

  @cached_property
  def first_stage_mem1_bytes(self):
    """Memory tier 1 needed by a first-stage processor."""
    return self._tiers(self.first_stage_memory_by_kind)[0]

  @cached_property
  def last_stage_mem1_bytes(self):
    """Memory tier 1 needed by a last-stage processor (= first with PP 1)."""
    return np.where(self.pp > 1,
                    self._tiers(self.last_stage_memory_by_kind)[0],
                    self.first_stage_mem1_bytes)

  @cached_property
  def _last_binds(self):
    """The last stage needs more tier-1 memory than the first.  Without a
    vocabulary it never does (same blocks, fewer microbatches in flight),
    so it is not computed."""
    if not self.app.has_vocab and self.pipeline_layout is None:
      return False
    return self.last_stage_mem1_bytes > self.first_stage_mem1_bytes

  @cached_property
  def memory_by_kind(self):
    """Where each kind of memory lives on the most loaded pipeline stage:
    {kind: (tier-1 bytes, tier-2 bytes)} for 'weights', 'activations',
    'checkpoints', 'weight_gradients', 'optimizer', 'activation_gradients'.

    An offloaded kind keeps its double-buffered working set in tier 1 (the
    "min" sizes) and all of it in tier 2; activation gradients stay in tier 1.
    (Calculon, memory model; the sums are :attr:`mem1_bytes` and
    :attr:`mem2_bytes`.)
    """
    first = self.first_stage_memory_by_kind
    mb = self._middle_binds
    if not np.any(self._last_binds) and not np.any(mb):
      return first
    last = self.last_stage_memory_by_kind
    lb = self._last_binds
    out = {k: (np.where(lb, last[k][0], first[k][0]),
               np.where(lb, last[k][1], first[k][1])) for k in first}
    if np.any(mb):
      mid = self._middle_stage[0]
      out = {k: (np.where(mb, mid[k][0], out[k][0]),
                 np.where(mb, mid[k][1], out[k][1])) for k in out}
    return out

  @cached_property
  def _mem_reqs(self):
    first = self._tiers(self.first_stage_memory_by_kind)
    if not self.app.has_vocab and self.pipeline_layout is None:
      return first
    t1 = np.where(self._last_binds, self.last_stage_mem1_bytes, first[0])
    if np.any(self._middle_binds):
      mid = self._tiers(self._middle_stage[0])
      return np.where(self._middle_binds, mid[0], t1), \
        np.where(self._middle_binds, mid[1], first[1])
    return t1, first[1]

  @cached_property
  def mem1_tensor_bytes(self):
    """Tensors in memory tier 1 per processor: the most loaded pipeline
    stage (Calculon: processor 0, which keeps the most microbatches in
    flight)."""
    return self._mem_reqs[0]

  @cached_property
  def mem1_bytes(self):
    """Memory tier 1 the framework's caching allocator holds per processor
    at the peak (what PyTorch's ``max_memory_reserved`` reports): the
    tensors (:attr:`mem1_tensor_bytes`) plus the allocator's fragmentation
    (``memory_reserve.fragmentation``).  Without the system's
    ``memory_reserve``: the tensors (Calculon)."""
    r = self.system.memory_reserve
    if r is None or not r.fragmentation:
      return self.mem1_tensor_bytes
    return self.mem1_tensor_bytes * (1.0 + r.fragmentation)

  @cached_property
  def nccl_groups(self):
    """NCCL communicators with traffic per processor: one per parallel
    group larger than 1 (TP, PP, CP, and when training DP x CP; with
    experts EP and, training, the expert data-parallel group).  NCCL's
    memory "is linearly tied to the number of channels" and grows with
    every communicator not split with shared resources (NVIDIA/nccl issues
    #864, #986); Megatron-Core creates one process group per parallelism
    (megatron/core/parallel_state.py)."""
    n = (self.tp > 1) * 1 + (self.pp > 1) + (self.cp > 1) + \
      (self.training & (self.dpcp > 1))
    if self.app.is_moe:
      n = n + (self.ep > 1) + (self.training & (self.edp > 1))
    return n

  @cached_property
  def tp_overlap_buffer_bytes(self):
    """Bytes per processor of the communication buffers a tiled TP
    overlap registers outside the framework's allocator
    (``tp_overlap_buffers`` 'te_userbuffers', with ``tensor_par_overlap``
    'ring' or 'pipe' and TP > 1; else 0).

    Transformer Engine's ``initialize_ub`` (transformer_engine/pytorch/
    module/base.py at d0067d0da) creates one buffer per GEMM name of a
    transformer layer, each of the ``shape`` Megatron passes, ``[seq_length
    x micro_batch_size / context_parallel_size, hidden_size]`` (Megatron-LM
    megatron/training/initialize.py ``_initialize_tp_communicators`` at
    d98e8a64dd): :data:`TE_UB_ALL_GATHER_BUFFERS` all-gather buffers, one
    byte per element where the run gathers the FP8 cast input (``fp8_buf``
    under the FP8 quantization mode: ``tensor_par_narrow_all_gather`` with
    an 8-bit linear datatype), else 16-bit, and
    :data:`TE_UB_REDUCE_SCATTER_BUFFERS` reduce-scatter buffers in the
    16-bit datatype.  The default configuration's ring-exchange overlaps
    are all all-gathers, whose buffers are the shape itself
    (common/comm_gemm_overlap/comm_gemm_overlap.cpp
    ``CommOverlapP2PBase::initialize``: a ring-exchange reduce-scatter
    would hold 2 TP - 1 chunks, which only a per-model configuration
    sets).  Registered with ``cuMemCreate`` or ``cudaMalloc``
    (userbuffers/userbuffers-host.cpp ``register_user_buffer_collective``),
    so outside PyTorch's caching allocator and its fragmentation.  E.g.
    sequence 8192, microbatch 1, hidden 8192, FP8 with narrow gathers: 8192
    x 8192 x (8 x 1 + 4 x 2) bytes = 1 GiB."""
    on = (self.exe.tp_overlap_buffers == _TE_USERBUFFERS) & (self.tp > 1) & \
      (self.exe.tensor_par_overlap != TP_OVERLAP_NONE)
    if not np.any(on):
      return 0.0
    ctx = self.ctx
    wide = ctx.io_bytes
    gather = np.where(ctx.tp_gather_bytes == 1, 1.0, wide)
    rows = self.app.seq_size * self.exe.microbatch_size / self.cp
    per_row = self.app.hidden * (TE_UB_ALL_GATHER_BUFFERS * gather +
                                 TE_UB_REDUCE_SCATTER_BUFFERS * wide)
    return np.where(on, rows * per_row, 0.0)

  @cached_property
  def mem1_runtime_bytes(self):
    """Memory tier 1 a run holds outside the framework's allocator: the
    CUDA context with the kernels it loads and NCCL's buffers per
    communicator (``memory_reserve``; none without it), and the TP
    overlap's registered buffers (:attr:`tp_overlap_buffer_bytes`)."""
    r = self.system.memory_reserve
    reserve = 0.0 if r is None else \
      r.context_bytes + r.nccl_bytes_per_group * self.nccl_groups
    return reserve + self.tp_overlap_buffer_bytes

  @cached_property
  def mem1_usable_bytes(self):
    """What the allocator may fill: memory tier 1's capacity less the
    headroom a run leaves (``memory_reserve.headroom``) and what it holds
    outside the allocator (:attr:`mem1_runtime_bytes`); without
    ``memory_reserve``, the capacity less the TP overlap's buffers (the
    whole capacity for Calculon's executions)."""
    cap = self.system.mem1.capacity_bytes
    r = self.system.memory_reserve
    if r is None:
      return cap - self.mem1_runtime_bytes
    return cap * (1.0 - r.headroom) - self.mem1_runtime_bytes

  @cached_property
  def mem1_tensor_budget_bytes(self):
    """The tensors that fit: :attr:`mem1_usable_bytes` over 1 + the
    allocator's fragmentation."""
    r = self.system.memory_reserve
    if r is None:
      return self.mem1_usable_bytes
    return self.mem1_usable_bytes / (1.0 + r.fragmentation)

  @cached_property
  def mem2_bytes(self):
    """Memory tier 2 (offload target) needed per processor."""
    return self._mem_reqs[1]
