"""Time, memory and efficiency of one training (or inference) batch.

:class:`Evaluation` prices executions given as
:class:`~calculon.config.ExecutionColumns`: every quantity is a lazily
computed numpy array broadcast over the executions, so a single run (0-d
arrays), a DataFrame of executions (1-d) and a whole search grid (N-d,
each option varying along its own axis) go through the same formulas.  Only
what is asked for is computed: a search asks for ``sample_rate`` and
``feasible`` and never builds the rest.

Schedule model (Calculon, Isaev et al. SC'23, section 3; Narayanan et al.
SC'21 for 1F1B and the interleaved schedule): each processor holds
``blocks_per_proc`` blocks split into ``pipeline_interleaving`` chunks; a chunk
is ``blocks_per_chunk - 1`` *base* blocks followed by one *edge* block that
also sends the activation to the next pipeline stage.  Times are for
processor 0.
"""

from functools import cached_property

import numpy as np

from calculon.config.execution import (
  CHECKPOINT_AS_INPUT, DATATYPE_BYTES, DATATYPE_NAMES,
  OPTIMIZER_TRAFFIC_FUSED_ADAM, RECIPE_TE,
  RECOMPUTE_FULL, RECOMPUTE_NONE, SCALING_BLOCK, SCALING_CURRENT,
  SHARD_GRADIENTS, SHARD_OPTIMIZER, SHARD_PARAMETERS, TP_COMM_AR, UNSET)
from calculon.llm.block import (
  BlockMix, BlockTotals, Shape, build_block, build_embedding, build_head,
  moe_blocks_in_busiest_stage)
from calculon.llm.layers import (
  BlockContext, FP16_UNSCALE_BYTES, FP32_BYTES, FUSED_ADAM_BYTES)
from calculon.llm.layers import hidden_behind as _hidden_behind
from calculon.units import human_format

_BYTES_TABLE = np.array([DATATYPE_BYTES[d] for d in DATATYPE_NAMES],
                        dtype=float)
_BF16 = DATATYPE_NAMES.index('bfloat16')
_FP16 = DATATYPE_NAMES.index('float16')

#: Elements per scale of the block-scaled formats: MXFP8 (OCP Microscaling
#: Formats specification v1.0, section 5: 32-element blocks, one 8-bit
#: E8M0 scale) and NVFP4 (NVIDIA, "Introducing NVFP4", 2025: 16-element
#: blocks, one 8-bit E4M3 scale).
_BLOCK_ELEMENTS = {1: 32, 0.5: 16}


def quantize_bytes_per_element(io_bytes, narrow_bytes, scaling,
                               training=True):
  """Bytes moved per element cast from 16 bits to a narrow datatype
  (:meth:`~calculon.llm.layers.Layer.quantize_bytes`).

  Args (arrays broadcastable over the executions):
    io_bytes: bytes of the 16-bit source (2).
    narrow_bytes: bytes of the narrow datatype (1 for FP8, 0.5 for FP4).
    scaling: ``quantization_scaling`` code.
    training: bool; inference writes only the row-wise copy (no backward
      GEMM needs the transposed one).

  Returns:
    ``io_bytes`` read plus two narrow copies written (row-wise and
    column-wise; one in inference); current scaling reads the source once
    more for its amax
    (Transformer Engine ``Float8CurrentScaling``; torchao float8
    "dynamic" tensorwise scaling computes amax, then casts); block scaling
    also writes one 1-byte scale per block for each copy.
  """
  copies = np.where(training, 2.0, 1.0)
  base = io_bytes + copies * narrow_bytes
  block = copies / np.where(narrow_bytes < 1, _BLOCK_ELEMENTS[0.5],
                            _BLOCK_ELEMENTS[1])
  return base + np.where(scaling == SCALING_CURRENT, io_bytes, 0.0) + \
    np.where(scaling == SCALING_BLOCK, block, 0.0)


def _scalar_if_zero(x):
  """``x``, or the scalar 0.0 when every element is 0 (lets layers skip
  work that is zero for every execution)."""
  return 0.0 if not np.any(x) else x


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


def _pos(x):
  """Python's max(0, x): x when positive, else 0."""
  return np.where(x > 0, x, 0)


def _min(a, b):
  """Python's min(a, b) (first of equals)."""
  return np.where(b < a, b, a)


def _max(a, b):
  """Python's max(a, b) (first of equals)."""
  return np.where(b > a, b, a)


_NO_VOCAB_MEMORY = {k: 0.0 for k in (
  'weights', 'activations', 'weight_gradients', 'optimizer',
  'activation_gradients')}


class Evaluation:
  """All statistics of a set of executions of one application on one system.

  Args:
    app: :class:`~calculon.config.Application`.
    system: :class:`~calculon.hardware.System`.
    exe: :class:`~calculon.config.ExecutionColumns`, already validated
      (rules and compatibility with ``app`` and ``system``).

  Every public attribute is an array (or scalar) broadcastable to
  ``exe.shape``; times in seconds, sizes in bytes, rates per second.  Values
  are computed for infeasible executions too; :attr:`reason` tells which are.
  """

  def __init__(self, app, system, exe):
    self.app = app
    self.system = system
    self.exe = exe
    nets = system.networks
    e = exe
    self.tp, self.pp, self.dp = e.tensor_par, e.pipeline_par, e.data_par
    self.interleaving = e.pipeline_interleaving
    self.training = e.training
    self.full_recompute = e.activation_recompute == RECOMPUTE_FULL
    self.bytes_per_element = _BYTES_TABLE[e.datatype]
    self.num_microbatches = (e.batch_size // e.data_par) // e.microbatch_size
    # Blocks per processor, rounded up; the last PP - (L mod PP) stages hold
    # one block less, which shortens the bubble (see bubble_time_s).  When
    # the split counts the embedding and the LM head as a block each
    # (pipeline_split_counts_vocab), L + 2 slots are split and the two end
    # stages give one slot each to them (see vocab_time_s).
    self.vocab_in_split = e.pipeline_split_counts_vocab & (self.pp > 1)
    nb = app.num_blocks + np.where(self.vocab_in_split, 2, 0)
    rem = nb % self.pp
    self.blocks_per_proc = nb // self.pp + (rem != 0)
    self.bubble_reduction_blocks = np.where(rem != 0, self.pp - rem, 0)
    self.blocks_per_chunk = self.blocks_per_proc // self.interleaving
    with np.errstate(divide='ignore', invalid='ignore'):
      self.chunks_per_proc = self.blocks_per_proc // np.maximum(
        self.blocks_per_chunk, 1)
    self.baseblocks_per_chunk = self.blocks_per_chunk - 1
    self.edgeblocks_per_chunk = 1
    # Data parallelism: gradients are reduced and state sharded over the
    # DP x CP ranks holding the same weights (Megatron-Core).
    self.cp = e.context_par
    self.dpcp = self.dp * self.cp
    sharding = e.sharding
    self.sharding = sharding
    self.optimizer_shards = np.where(sharding >= SHARD_OPTIMIZER, self.dpcp, 1)
    self.grad_shards = np.where(sharding >= SHARD_GRADIENTS, self.dpcp, 1)
    self.fsdp = sharding == SHARD_PARAMETERS
    self.weight_shards = np.where(self.fsdp, self.dpcp, 1)
    # Routed experts are replicated over the expert data-parallel ranks:
    # TP x DP x CP / (EP x ETP) (Megatron-Core MoE parallel folding).
    self.ep, self.etp = e.expert_par, e.expert_tensor_par
    self.edp = self.tp * self.dpcp // (self.ep * self.etp)
    # Precision: Transformer Engine runs the linear layers' GEMMs in the
    # narrow datatype and everything else in bfloat16, keeping 16-bit
    # weights plus a narrow copy and the narrow input of each linear layer
    # (NVIDIA Transformer Engine, "Using FP8 with Transformer Engine";
    # Micikevicius et al. 2022, "FP8 Formats for Deep Learning").
    te = e.precision_recipe == RECIPE_TE
    bpe = self.bytes_per_element
    self.io_bytes = np.where(te, 2.0, bpe)
    sixteen = _BF16 if system.vector.supports(_BF16) and \
      system.matrix.supports(_BF16) else _FP16
    other_dtype = np.where(te, sixteen, e.datatype)
    grad_set = e.gradient_datatype != UNSET
    self.grad_bytes = np.where(grad_set, _BYTES_TABLE[
      np.maximum(e.gradient_datatype, 0)], self.io_bytes)
    self.ctx = BlockContext(
      system, e.datatype, bpe, self.optimizer_shards, self.tp,
      e.tensor_par_net, e.tensor_par_comm_type, e.tensor_par_overlap,
      grad_shards=self.grad_shards, grad_bytes=self.grad_bytes,
      grad_buffer_bytes=np.where(grad_set, self.grad_bytes, FP32_BYTES),
      other_dtype=other_dtype, io_bytes=self.io_bytes,
      # torchao keeps the 16-bit input of a narrow linear layer
      # (wide_saved_inputs); Transformer Engine the narrow one.
      linear_act_bytes=np.where(
        np.asarray(e.wide_saved_inputs, dtype=bool), self.io_bytes, bpe),
      narrow_bytes=bpe,
      linear_weight_bytes=np.where(te, 2.0 + bpe, bpe),
      other_weight_bytes=np.where(te, 2.0, bpe),
      expert_optimizer_shards=np.where(sharding >= SHARD_OPTIMIZER, self.edp,
                                       1),
      expert_grad_shards=np.where(sharding >= SHARD_GRADIENTS, self.edp, 1),
      quantize_bytes=_scalar_if_zero(np.where(
        te & (bpe < self.io_bytes),
        quantize_bytes_per_element(self.io_bytes, bpe,
                                   e.quantization_scaling, e.training),
        0.0)),
      tp_async=e.tensor_par_async_backward,
      tp_overlap_rs_dgrad=e.tensor_par_overlap_rs_dgrad,
      tp_narrow_all_gather=e.tensor_par_narrow_all_gather,
      # A framework's Adam step (optimizer_traffic 'fused_adam'); float16
      # unscales the gradients first (loss scaling).
      optimizer_pass_bytes=_scalar_if_zero(np.where(
        e.optimizer_traffic == OPTIMIZER_TRAFFIC_FUSED_ADAM,
        FUSED_ADAM_BYTES + np.where(e.datatype == _FP16,
                                    FP16_UNSCALE_BYTES, 0.0), 0.0)))
    self.pp_usage = nets.usage(e.pipeline_par_net)
    self.dp_usage = nets.usage(e.data_par_net)
    self.cp_usage = nets.usage(e.context_par_net)
    self.ep_usage = nets.usage(e.expert_par_net)
    self.shape = Shape(app, e, self.ctx)
    self.batch_seq = e.microbatch_size * (app.seq_size // self.cp)
    self.activation_elems = self.batch_seq * app.hidden
    self.seq_par_activation_elems = (self.batch_seq // self.tp) * app.hidden

  # -- the block ---------------------------------------------------------------
  @cached_property
  def layers(self):
    """The compiled block: list of layers (see :func:`build_block`); for a
    Mixture-of-Experts model, an MoE block."""
    return build_block(self.app, self.exe, self.ctx, moe=self.app.is_moe)

  @cached_property
  def dense_layers(self):
    """The layers of a dense block of a Mixture-of-Experts model."""
    return build_block(self.app, self.exe, self.ctx)

  @cached_property
  def moe_blocks_per_proc(self):
    """MoE blocks of the busiest pipeline stage (0 for dense models)."""
    if not self.app.is_moe:
      return 0
    return np.minimum(moe_blocks_in_busiest_stage(self.app, self.pp),
                      self.blocks_per_proc)

  @cached_property
  def block(self):
    """Per-microbatch totals of one block (:class:`BlockTotals`); with
    experts, the average block of the busiest stage (:class:`BlockMix`)."""
    with np.errstate(divide='ignore', invalid='ignore'):
      totals = BlockTotals(self.layers, self.training, self.full_recompute)
      if not self.app.is_moe or self.app.num_dense_blocks == 0:
        return totals
      dense = BlockTotals(self.dense_layers, self.training,
                          self.full_recompute)
      return BlockMix(dense, totals, self.moe_blocks_per_proc,
                      self.blocks_per_proc)

  @cached_property
  def block_input_split(self):
    """True where a block's input and output travel sequence-sharded over
    the TP ranks (tensor_par_comm_type rs_ag or p2p_rs_ag)."""
    return self.exe.tensor_par_comm_type != TP_COMM_AR

  @cached_property
  def block_act_checkpoint_bytes(self):
    """Activation checkpoint of one block: its input, kept with full
    recomputation when training (Chen et al. 2016); with
    ``checkpoint_layout`` 'as_input' and sequence parallelism, the
    sequence-sharded input each TP rank holds (Megatron-LM checkpoints the
    block's input tensor, [s/t, b, h] with --sequence-parallel)."""
    sharded = (self.exe.checkpoint_layout == CHECKPOINT_AS_INPUT) & \
      self.block_input_split
    elems = np.where(sharded, self.seq_par_activation_elems,
                     self.activation_elems)
    return np.where(self.training & self.full_recompute,
                    elems * self.io_bytes, 0)

  # -- totals over the batch ----------------------------------------------------
  @cached_property
  def _mult(self):
    return self.blocks_per_proc * self.num_microbatches

  @cached_property
  def fw_time_s(self):
    """Forward compute of all blocks and microbatches on one processor."""
    return self._mult * self.block.fw_time

  @cached_property
  def bw_time_s(self):
    """Backward compute (activation + weight gradients)."""
    return self._mult * self.block.agrad_time + self._mult * \
      self.block.wgrad_time

  @cached_property
  def optim_step_time_s(self):
    """Optimizer step over the processor's blocks (once per batch)."""
    return self.blocks_per_proc * self.block.optim_time

  @cached_property
  def recompute_time_s(self):
    """Forward recomputation during the backward pass."""
    return self._mult * self.block.re_time

  def _per_chunks(self, base, edge):
    """Sum over all chunks and microbatches of a base/edge block quantity."""
    return self.num_microbatches * self.chunks_per_proc * (
      (self.baseblocks_per_chunk * base) + (self.edgeblocks_per_chunk * edge))

  # -- tensor parallelism -------------------------------------------------------
  @cached_property
  def tp_comm_link_time_s(self):
    """Time TP communication occupies the link (forward + backward)."""
    b = self.block
    return self._per_chunks(b.base_fw_tp_time, b.edge_fw_tp_time) + \
      self._per_chunks(b.base_agrad_tp_time, b.edge_agrad_tp_time)

  @cached_property
  def tp_comm_exposed_time_s(self):
    """TP communication not hidden behind compute."""
    b = self.block
    return self._per_chunks(b.base_fw_tp_exposed, b.edge_fw_tp_exposed) + \
      self._per_chunks(b.base_agrad_tp_exposed, b.edge_agrad_tp_exposed)

  @cached_property
  def recomm_link_time_s(self):
    """Redone TP communication (recomputation, all-gather redo) on the link."""
    b = self.block
    return self._per_chunks(b.base_recomm_time, b.edge_recomm_time)

  @cached_property
  def recomm_exposed_time_s(self):
    """Redone TP communication not hidden behind compute."""
    b = self.block
    return self._per_chunks(b.base_recomm_exposed, b.edge_recomm_exposed)

  # -- pipeline parallelism -----------------------------------------------------
  @cached_property
  def block_fw_pp_bytes(self):
    """Activation sent to the next stage after each chunk (sequence-sharded
    with rs_ag/p2p_rs_ag)."""
    size = np.where(self.block_input_split, self.seq_par_activation_elems,
                    self.activation_elems) * self.io_bytes
    return np.where(self.pp > 1, size, 0)

  @cached_property
  def block_bw_pp_bytes(self):
    """Gradient sent to the previous stage (training only)."""
    return np.where(self.training, self.block_fw_pp_bytes, 0)

  @cached_property
  def chunk_fw_pp_time_s(self):
    """One forward point-to-point transfer between pipeline stages."""
    return self.system.networks.time_s('p2p', self.block_fw_pp_bytes, 2,
                                       self.exe.pipeline_par_net)

  @cached_property
  def chunk_bw_pp_time_s(self):
    """One backward point-to-point transfer between pipeline stages."""
    return self.system.networks.time_s('p2p', self.block_bw_pp_bytes, 2,
                                       self.exe.pipeline_par_net)

  @cached_property
  def pp_comm_link_time_s(self):
    """PP transfers: one per chunk per microbatch, each way."""
    multi = self.pp > 1
    fw = self.num_microbatches * np.where(multi, self.chunks_per_proc, 0) * \
      self.chunk_fw_pp_time_s
    bw = self.num_microbatches * np.where(
      multi & self.training, self.chunks_per_proc, 0) * self.chunk_bw_pp_time_s
    return fw + bw

  @cached_property
  def pp_chunk_steps(self):
    """Forward (and backward) chunk steps of a stage: microbatches x
    chunks per processor."""
    return self.num_microbatches * self.chunks_per_proc

  @cached_property
  def pp_warmup_chunks(self):
    """Forward chunk steps of the first stage's warm-up in the
    interleaved 1F1B schedule, and backward ones of its flush: 2 (PP - 1) +
    (VP - 1) PP, at most every chunk step (Megatron-Core
    ``get_pp_rank_microbatches`` in pipeline_parallel/schedules.py, with
    its default microbatch group of PP per virtual stage; every step when
    not training: the forward-only schedule is all warm-up)."""
    total = self.pp_chunk_steps
    warm = 2 * (self.pp - 1) + (self.interleaving - 1) * self.pp
    return np.where(self.training, np.minimum(warm, total), total)

  @cached_property
  def pp_comm_exposed_time_s(self):
    """PP transfers not hidden behind compute.

    Calculon's model (``pipeline_par_overlap`` false, or no interleaving):
    none is hidden.  With ``pipeline_par_overlap`` and VP > 1, as
    Megatron-Core's interleaved schedule with overlap_p2p_comm runs them
    (pipeline_parallel/schedules.py
    forward_backward_pipelining_with_interleaving): the transfers of the
    warm-up and the flush (:attr:`pp_warmup_chunks` each way) block; each
    1F1B step of the steady state sends and receives one chunk's
    activation and one chunk's gradient asynchronously behind the
    forward and backward compute of a chunk, the excess showing and the
    compute slowed by the tier's processor share while they run
    (:func:`~calculon.llm.layers.hidden_behind`).
    """
    link = self.pp_comm_link_time_s
    on = self.exe.pipeline_par_overlap & (self.pp > 1) & \
      (self.interleaving > 1)
    if not np.any(on):
      return link
    step_comm = self.chunk_fw_pp_time_s + np.where(
      self.training, self.chunk_bw_pp_time_s, 0)
    warm = self.pp_warmup_chunks
    steady = self.pp_chunk_steps - warm
    window = self.chunk_fw_time_s + self.chunk_bw_time_s
    overlapped = warm * step_comm + _hidden_behind(
      steady * step_comm, steady * window, self.pp_usage)
    return np.where(on, overlapped, link)

  # -- offload to memory tier 2 ---------------------------------------------------
  @cached_property
  def _act_offload_bytes(self):
    return np.where(self.full_recompute, self.block_act_checkpoint_bytes,
                    self.block.act_storage_bytes)

  @cached_property
  def fw_offload_bytes(self):
    """Bytes moved to/from tier 2 while a block runs forward: the larger of
    its weights and its activations (prefetch/offload in parallel)."""
    e = self.exe
    return np.maximum(np.where(e.weight_offload, self.block.weight_bytes, 0),
                      np.where(e.activations_offload, self._act_offload_bytes,
                               0))

  @cached_property
  def bw_offload_bytes(self):
    """Bytes moved while a block runs backward: weights, activations and
    optimizer state as offloaded."""
    e, b = self.exe, self.block
    size = 0 + np.where(e.weight_offload, b.weight_bytes, 0)
    size = size + np.where(e.activations_offload, self._act_offload_bytes, 0)
    size = size + np.where(e.optimizer_offload, b.optimizer_bytes, 0)
    return np.where(self.training, size, 0)

  @cached_property
  def fw_offload_time_s(self):
    return self.system.offload_time_s(self.fw_offload_bytes)

  @cached_property
  def bw_offload_time_s(self):
    return np.where(self.training,
                    self.system.offload_time_s(self.bw_offload_bytes), 0)

  # -- block times with exposed communication and offload ----------------------
  @cached_property
  def _block_fw_extra_s(self):
    """Exposed CP ring, FSDP and expert-parallel traffic of a block's
    forward, and FSDP's buffer copies (0 without)."""
    extra = 0.0
    if np.any(self.cp > 1):
      extra = extra + self.block_cp_fw_exposed_s
    if np.any(self.fsdp):
      extra = extra + self.block_fsdp_fw_exposed_s + \
        self._block_fsdp_copy_s[0]
    if self.app.is_moe:
      extra = extra + self.block_ep_fw_exposed_s
    return extra

  @cached_property
  def _block_bw_extra_s(self):
    """Exposed CP ring, FSDP and expert-parallel traffic of a block's
    backward, and FSDP's buffer copies."""
    extra = 0.0
    if np.any(self.cp > 1):
      extra = extra + self.block_cp_bw_exposed_s
    if np.any(self.fsdp):
      extra = extra + self.block_fsdp_bw_exposed_s + \
        self._block_fsdp_copy_s[1]
    if self.app.is_moe:
      extra = extra + self.block_ep_bw_exposed_s
    if np.ndim(extra) == 0 and extra == 0.0:
      return 0.0
    return np.where(self.training, extra, 0)

  # -- expert parallelism ---------------------------------------------------------
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
    return self._mult * (b.ep_fw_time + b.ep_bw_time + b.ep_re_time)

  @cached_property
  def ep_comm_exposed_time_s(self):
    """Expert-parallel communication not hidden, whole batch."""
    if not self.app.is_moe:
      return 0.0
    return self._mult * (self.block_ep_fw_exposed_s +
                         np.where(self.training, self.block_ep_bw_exposed_s,
                                  0))

  @cached_property
  def baseblock_fw_time_no_offload_s(self):
    return self.block.fw_time + self.block.base_fw_tp_exposed + \
      self._block_fw_extra_s

  @cached_property
  def edgeblock_fw_time_no_offload_s(self):
    return self.block.fw_time + self.block.edge_fw_tp_exposed + \
      self.chunk_fw_pp_time_s + self._block_fw_extra_s

  @cached_property
  def baseblock_fw_offload_overhead_s(self):
    """Offload time not hidden by a base block's forward (memory traffic of
    the block itself cannot hide it)."""
    return _pos(self.fw_offload_time_s + self.block.fw_mem_time -
                self.baseblock_fw_time_no_offload_s)

  @cached_property
  def edgeblock_fw_offload_overhead_s(self):
    return _pos(self.fw_offload_time_s + self.block.fw_mem_time -
                self.edgeblock_fw_time_no_offload_s)

  @cached_property
  def baseblock_fw_time_s(self):
    return self.baseblock_fw_time_no_offload_s + \
      self.baseblock_fw_offload_overhead_s

  @cached_property
  def edgeblock_fw_time_s(self):
    return self.edgeblock_fw_time_no_offload_s + \
      self.edgeblock_fw_offload_overhead_s

  @cached_property
  def baseblock_bw_time_no_offload_s(self):
    b = self.block
    return b.re_time + b.base_recomm_exposed + b.agrad_time + b.wgrad_time + \
      b.base_agrad_tp_exposed + self._block_bw_extra_s

  @cached_property
  def edgeblock_bw_time_no_offload_s(self):
    b = self.block
    return b.re_time + b.edge_recomm_exposed + b.agrad_time + b.wgrad_time + \
      b.edge_agrad_tp_exposed + self.chunk_bw_pp_time_s + \
      self._block_bw_extra_s

  @cached_property
  def baseblock_bw_offload_overhead_s(self):
    return _pos(self.bw_offload_time_s + self.block.agrad_mem_time +
                self.block.wgrad_mem_time - self.baseblock_bw_time_no_offload_s)

  @cached_property
  def edgeblock_bw_offload_overhead_s(self):
    return _pos(self.bw_offload_time_s + self.block.agrad_mem_time +
                self.block.wgrad_mem_time - self.edgeblock_bw_time_no_offload_s)

  @cached_property
  def baseblock_bw_time_s(self):
    return self.baseblock_bw_time_no_offload_s + \
      self.baseblock_bw_offload_overhead_s

  @cached_property
  def edgeblock_bw_time_s(self):
    return self.edgeblock_bw_time_no_offload_s + \
      self.edgeblock_bw_offload_overhead_s

  @cached_property
  def fw_offload_exposed_time_s(self):
    """Forward offload time not hidden, over the batch."""
    return self._per_chunks(self.baseblock_fw_offload_overhead_s,
                            self.edgeblock_fw_offload_overhead_s)

  @cached_property
  def bw_offload_exposed_time_s(self):
    """Backward offload time not hidden, over the batch."""
    return np.where(self.training, self._per_chunks(
      self.baseblock_bw_offload_overhead_s,
      self.edgeblock_bw_offload_overhead_s), 0)

  # -- chunks and the pipeline bubble -------------------------------------------
  @cached_property
  def chunk_fw_time_s(self):
    return (self.baseblocks_per_chunk * self.baseblock_fw_time_s) + \
      (self.edgeblocks_per_chunk * self.edgeblock_fw_time_s)

  @cached_property
  def chunk_bw_time_s(self):
    return (self.baseblocks_per_chunk * self.baseblock_bw_time_s) + \
      (self.edgeblocks_per_chunk * self.edgeblock_bw_time_s)

  @cached_property
  def bubble_time_s(self):
    """Pipeline bubble of the (interleaved) 1F1B schedule.

    (PP - 1) chunk times (forward + backward), as in Narayanan et al. SC'21
    eq. 1 per chunk.  With interleaving and a microbatch count that is not a
    multiple of PP, each of the (interleaving - 1) overlappable chunks waits
    for the missing microbatches: (interleaving - 1) * (PP - nmb mod PP)
    extra chunk times.  When PP does not divide the block count, later stages
    hold one block less and the bubble shrinks by that many blocks' time
    (half base, half edge when chunks have base blocks).
    """
    chunk_time = self.chunk_fw_time_s + self.chunk_bw_time_s
    red = self.bubble_reduction_blocks
    reduction = np.where(
      self.baseblocks_per_chunk > 0,
      red * (self.baseblock_fw_time_s + self.edgeblock_fw_time_s +
             self.baseblock_bw_time_s + self.edgeblock_bw_time_s) / 2,
      red * (self.edgeblock_fw_time_s + self.edgeblock_bw_time_s))
    nmb, pp = self.num_microbatches, self.pp
    missing = nmb % pp
    extra = np.where(missing != 0, (self.interleaving - 1) * (pp - missing), 0)
    return (pp - 1) * chunk_time + (extra * chunk_time - reduction)

  # -- data parallelism -----------------------------------------------------------
  @cached_property
  def _dp_active(self):
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
    e, nets = self.exe, self.system.networks
    if not nets.has_rails:
      return 1
    size = nets.size[np.maximum(e.data_par_net - 1, 0)]
    inner = self.etp * self.ep if experts else self.tp
    return np.minimum(group, np.maximum(size // inner, 1))

  def _dp_group_time_s(self, reduce, gather, dp, experts=False):
    """(total, all-gather) seconds of one group's end-of-batch DP
    communication: reduce-scatter + all-gather when sharded, else an
    all-reduce (the all-gather part 0)."""
    net, tier = self.system.networks, self.exe.data_par_net
    g = self._dp_peers_per_domain(dp, experts)
    with np.errstate(divide='ignore', invalid='ignore'):
      ag = net.collective_time_s('all_gather', gather, dp, tier, g)
      sharded = net.collective_time_s('reduce_scatter', reduce, dp, tier, g) \
        + ag
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
    active = self._dp_active
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
    return np.where(self._dp_active, size, 0)

  @cached_property
  def _block_dp_times_s(self):
    return self._dp_times_s(self.block)

  @cached_property
  def block_dp_time_s(self):
    """DP communication of one block (see :meth:`_dp_times_s`)."""
    return self._block_dp_times_s[0]

  # -- FSDP / ZeRO-3 ------------------------------------------------------------
  def _fsdp_times_s(self, totals):
    """(all-gather, reduce-scatter) seconds of one FSDP unit (``totals``)
    per microbatch: the 16-bit weights are gathered before its forward and
    again before its backward, its gradients reduce-scattered after the
    backward (PyTorch FSDP FULL_SHARD; Megatron-FSDP
    ``optim_grads_params``), over the DP x CP ranks on the DP tier."""
    net, tier = self.system.networks, self.exe.data_par_net
    groups = [(totals.weight_elems, self.dpcp, False)]
    if self.app.is_moe:
      groups = [(totals.weight_elems - totals.expert_weight_elems, self.dpcp,
                 False), (totals.expert_weight_elems, self.edp, True)]
    ag = rs = 0.0
    with np.errstate(divide='ignore', invalid='ignore'):
      for elems, dp, experts in groups:
        on = dp > 1
        g = self._dp_peers_per_domain(dp, experts)
        ag = ag + np.where(on, net.collective_time_s(
          'all_gather', elems * self.io_bytes, dp, tier, g), 0)
        rs = rs + np.where(on, net.collective_time_s(
          'reduce_scatter', elems * self.grad_bytes, dp, tier, g), 0)
    return np.where(self.fsdp, ag, 0), np.where(self.fsdp & self.training,
                                                rs, 0)

  @cached_property
  def _block_fsdp_copy_s(self):
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
  def fsdp_copy_time_s(self):
    """FSDP buffer copies on the compute stream, whole batch
    (:attr:`_block_fsdp_copy_s`)."""
    fw, bw = self._block_fsdp_copy_s
    return self._mult * (fw + bw)

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
    return self._mult * (self.block_fsdp_fw_s + self.block_fsdp_bw_s)

  @cached_property
  def fsdp_comm_exposed_time_s(self):
    """FSDP communication not hidden behind compute, whole batch."""
    return self._mult * (self.block_fsdp_fw_exposed_s +
                         self.block_fsdp_bw_exposed_s)

  # -- context parallelism ---------------------------------------------------------
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
    return self._mult * (self.cp - 1) * (fw + bw)

  @cached_property
  def cp_comm_exposed_time_s(self):
    """Context-parallel ring communication not hidden, whole batch."""
    return self._mult * (self.block_cp_fw_exposed_s +
                         self.block_cp_bw_exposed_s)

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
      return np.where(self._dp_active, plain, 0)
    overlapped = self._dp_overlap[0]
    return np.where(self._dp_active, np.where(
      self.exe.data_par_overlap, overlapped, plain), 0)

  @cached_property
  def dp_comm_link_time_s(self):
    """DP communication on the link."""
    return np.where(self._dp_active,
                    self.blocks_per_proc * self.block_dp_time_s, 0)

  def _dp_req(self, index):
    if not np.any(self.exe.data_par_overlap):
      return np.zeros(())
    return np.where(self._dp_active & self.exe.data_par_overlap,
                    self._dp_overlap[index], 0)

  @cached_property
  def dp_bw_overlap_req_chunk(self):
    """DP bandwidth (bytes/s) needed to hide DP behind overlappable chunks."""
    return self._dp_req(1)

  @cached_property
  def dp_bw_overlap_req_tail(self):
    """DP bandwidth (bytes/s) needed to hide DP in the last chunk."""
    return self._dp_req(2)

  # -- memory per processor -------------------------------------------------------
  @cached_property
  def weight_bytes(self):
    """Weights of the processor's blocks.  Sharded over DP x CP with FSDP,
    which also keeps the gathered weights of the block being computed and
    of the prefetched next one (PyTorch FSDP FULL_SHARD with forward
    prefetch)."""
    plain = self.block.weight_bytes * self.blocks_per_proc
    if not np.any(self.fsdp):
      return plain
    working = np.minimum(2, self.blocks_per_proc) * self.block.weight_bytes
    sharded = plain / self.weight_shards
    if self.app.is_moe:
      experts = self.block.expert_weight_bytes * self.blocks_per_proc
      sharded = (plain - experts) / self.dpcp + experts / self.edp
    return np.where(self.fsdp, sharded + working, plain)

  @cached_property
  def _inflight_factor(self):
    """Microbatches whose activations are kept: min(nmb, PP) for 1F1B, times
    1 + (PP - 1) / (interleaving * PP) for the interleaved schedule
    (Korthikanti et al. 2022, section 4.2.3)."""
    mb = np.where(self.num_microbatches < self.pp, self.num_microbatches,
                  self.pp)
    return np.where(self.interleaving > 1, mb * (
      1 + (self.pp - 1) / (self.interleaving * self.pp)), mb)

  @cached_property
  def _last_stage_inflight_factor(self):
    """Microbatches (in units of the processor's blocks) whose activations
    the last pipeline stage keeps: one with 1F1B; with v model chunks its
    warm-up holds (v - 1) PP + 1 chunk-microbatches (Megatron-LM
    ``forward_backward_pipelining_with_interleaving``), i.e.
    ((v - 1) PP + 1) / v processor-blocks' worth."""
    v = self.interleaving
    f = ((v - 1) * self.pp + 1) / v
    return np.where(self.pp > 1, np.minimum(f, self.num_microbatches),
                    self._inflight_factor)

  def _act_bytes_for(self, inflight):
    b = self.block
    kept = b.act_working_bytes + b.act_storage_bytes * (
      self.blocks_per_proc * inflight - 1)
    return np.where(self.training & ~self.full_recompute, kept,
                    b.act_working_bytes)

  def _checkpoint_bytes_for(self, inflight):
    ckpt = self.blocks_per_proc * self.block_act_checkpoint_bytes
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
    return np.where(self.training, grads, 0)

  @cached_property
  def optimizer_bytes(self):
    return np.where(self.training,
                    self.block.optimizer_bytes * self.blocks_per_proc, 0)

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

  def _kinds(self, act, ckpt, vocab):
    """{kind: (tier-1 bytes, tier-2 bytes)} of a pipeline stage whose
    blocks keep ``act`` activations and ``ckpt`` checkpoints, plus the
    embedding / LM head parts ``vocab`` (a dict by kind, tier 1 only)."""
    e = self.exe
    wo, ao, oo = e.weight_offload, e.activations_offload, e.optimizer_offload
    full = self.full_recompute
    return {
      'weights': (np.where(wo, self.weight_bytes_min, self.weight_bytes) +
                  vocab['weights'], np.where(wo, self.weight_bytes, 0)),
      'activations': (np.where(ao, self.act_bytes_min, act) +
                      vocab['activations'], np.where(ao & ~full, act, 0)),
      'checkpoints': (np.where(ao, np.where(full, self.act_checkpoint_bytes_min,
                                            0), ckpt),
                      np.where(ao & full, ckpt, 0)),
      'weight_gradients': (np.where(oo, self.weight_grad_bytes_min,
                                    self.weight_grad_bytes) +
                           vocab['weight_gradients'],
                           np.where(oo, self.block.weight_grad_bytes *
                                    self.blocks_per_proc, 0)),
      'optimizer': (np.where(oo, self.optimizer_bytes_min,
                             self.optimizer_bytes) + vocab['optimizer'],
                    np.where(oo, self.optimizer_bytes, 0)),
      'activation_gradients': (np.maximum(self.act_grad_bytes,
                                          vocab['activation_gradients']), 0),
    }

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

  @cached_property
  def first_stage_memory_by_kind(self):
    """Memory kinds of the first pipeline stage (Calculon's processor 0;
    with a vocabulary it also holds the embedding, and the LM head when
    PP = 1)."""
    return self._kinds(self.act_bytes, self.act_checkpoint_bytes,
                       self.vocab_memory_first)

  @cached_property
  def last_stage_memory_by_kind(self):
    """Memory kinds of the last pipeline stage (fewer microbatches in
    flight; the LM head and its logits)."""
    f = self._last_stage_inflight_factor
    return self._kinds(self._act_bytes_for(f), self._checkpoint_bytes_for(f),
                       self.vocab_memory_last)

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
    if not self.app.has_vocab:
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
    if not np.any(self._last_binds):
      return first
    last = self.last_stage_memory_by_kind
    lb = self._last_binds
    return {k: (np.where(lb, last[k][0], first[k][0]),
                np.where(lb, last[k][1], first[k][1])) for k in first}

  @cached_property
  def _mem_reqs(self):
    first = self._tiers(self.first_stage_memory_by_kind)
    if not self.app.has_vocab:
      return first
    t1 = np.where(self._last_binds, self.last_stage_mem1_bytes, first[0])
    return t1, first[1]

  @cached_property
  def mem1_bytes(self):
    """Memory tier 1 (HBM) needed per processor: the most loaded pipeline
    stage (Calculon: processor 0, which keeps the most microbatches in
    flight)."""
    return self._mem_reqs[0]

  @cached_property
  def mem2_bytes(self):
    """Memory tier 2 (offload target) needed per processor."""
    return self._mem_reqs[1]

  # -- offload bandwidth requirements ------------------------------------------
  @cached_property
  def _fw_offload_window_s(self):
    fw_mem = self.block.fw_mem_time
    return _min(self.baseblock_fw_time_no_offload_s - fw_mem,
                self.edgeblock_fw_time_no_offload_s - fw_mem)

  @cached_property
  def _bw_offload_window_s(self):
    mem = self.block.agrad_mem_time + self.block.wgrad_mem_time
    return _min(self.baseblock_bw_time_no_offload_s - mem,
                self.edgeblock_bw_time_no_offload_s - mem)

  @cached_property
  def act_offload_bw_req(self):
    """Tier-2 bandwidth (bytes/s) to offload a block's activations during
    the next block's forward pass."""
    with np.errstate(divide='ignore', invalid='ignore'):
      return self._act_offload_bytes / self._fw_offload_window_s

  @cached_property
  def weight_offload_bw_req(self):
    """Tier-2 bandwidth (bytes/s) to stream a block's weights."""
    with np.errstate(divide='ignore', invalid='ignore'):
      return self.block.weight_bytes / self._fw_offload_window_s

  @cached_property
  def optim_offload_bw_req(self):
    """Tier-2 bandwidth (bytes/s) to stream gradients and optimizer state."""
    b = self.block
    with np.errstate(divide='ignore', invalid='ignore'):
      return np.where(self.training, (b.weight_grad_bytes + b.optimizer_bytes)
                      / self._bw_offload_window_s, 0)

  @cached_property
  def offload_mem_bw_req(self):
    """Tier-2 bandwidth (bytes/s) needed by all offloading."""
    with np.errstate(divide='ignore', invalid='ignore'):
      fw = self.fw_offload_bytes / self._fw_offload_window_s
      bw = self.bw_offload_bytes / self._bw_offload_window_s
    return np.where(self.training, _max(fw, bw), fw)

  # -- embedding, LM head and loss (first and last pipeline stages) ------------
  @cached_property
  def embed_layers(self):
    """Layers of the input embedding (see :func:`build_embedding`)."""
    return build_embedding(self.app, self.exe, self.ctx)

  @cached_property
  def head_layers(self):
    """Layers of the LM head and loss (see :func:`build_head`).  With tied
    embeddings and PP = 1 the head uses the embedding's weights; with PP > 1
    the last stage keeps its own copy (Megatron-LM's embedding group)."""
    holds = True
    if self.app.tied_embeddings:
      holds = self.pp > 1
    return build_head(self.app, self.exe, self.ctx, holds)

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
    """
    e = self._stage_time_s(self.embed)
    h = self._stage_time_s(self.head)
    if np.any(self.vocab_in_split):
      # The end stages run E and H in place of one block each.
      block_s = self.baseblock_fw_time_no_offload_s + np.where(
        self.training, self.baseblock_bw_time_no_offload_s, 0)
      b = np.where(self.vocab_in_split, block_s, 0)
      e, h = e - b, h - b
    # E and H are >= 0 without the split, so the floor acts only with it.
    steady = np.maximum(np.maximum(e, h), 0)
    nmb = self.num_microbatches
    return np.where(self.pp > 1, (nmb - 1) * steady + e + h,
                    nmb * (e + h))

  @cached_property
  def vocab_optim_time_s(self):
    """Optimizer step of the embedding and LM head weights (the slower of
    the first and last stage; both with PP = 1)."""
    e, h = self.embed.optim_time, self.head.optim_time
    return np.where(self.training, np.where(self.pp > 1, np.maximum(e, h),
                                            e + h), 0)

  def _vocab_dp_s(self, t):
    """Data-parallel communication of the weights of ``t`` per batch:
    the end-of-batch reduction (:meth:`_dp_time_s`), or with FSDP its
    gathers and reduce-scatter every microbatch.  Not overlapped: the
    embedding's gradients are the last the first stage produces."""
    ag, rs = self._fsdp_times_s(t)
    fsdp = self.num_microbatches * (2 * ag + rs)
    return np.where(self.fsdp, fsdp, self._dp_time_s(t))

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
    return np.where(self.pp > 1, np.maximum(e, h) + tie, e + h)

  @cached_property
  def vocab_extra_time_s(self):
    """Everything the embedding, LM head and loss add to the batch time."""
    return self.vocab_time_s + self.vocab_optim_time_s + self.vocab_dp_time_s

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
  def _head_activation_bytes(self):
    """The LM head's working set and what it keeps for the backward pass
    (the fp32 softmax of the logits): one microbatch in flight."""
    h = self.head
    return h.act_working_bytes + np.where(self.training, h.act_storage_bytes,
                                          0)

  @cached_property
  def vocab_memory_last(self):
    """Tier-1 bytes by kind of the LM head on the last stage."""
    if not self.app.has_vocab:
      return _NO_VOCAB_MEMORY
    return self._vocab_memory(self.head, self._head_activation_bytes)

  @cached_property
  def vocab_memory_first(self):
    """Tier-1 bytes by kind of the embedding on the first stage (and of the
    LM head too when PP = 1)."""
    if not self.app.has_vocab:
      return _NO_VOCAB_MEMORY
    e = self._vocab_memory(self.embed, 0.0)
    h = self.vocab_memory_last
    single = self.pp == 1
    out = {k: e[k] + np.where(single, h[k], 0) for k in e}
    out['activation_gradients'] = np.where(
      single, np.maximum(e['activation_gradients'],
                         h['activation_gradients']),
      e['activation_gradients'])
    return out

  # -- totals ---------------------------------------------------------------------
  @cached_property
  def total_time_s(self):
    """Time of one batch: compute, exposed offload, recomputation, exposed
    redone TP communication, bubble, exposed TP/PP/DP communication."""
    total = (self.fw_time_s + self.bw_time_s + self.optim_step_time_s +
             self.fw_offload_exposed_time_s + self.bw_offload_exposed_time_s +
             self.recompute_time_s + self.recomm_exposed_time_s +
             self.bubble_time_s + self.tp_comm_exposed_time_s +
             self.pp_comm_exposed_time_s + self.dp_comm_exposed_time_s)
    return total + self.modern_time_s

  @cached_property
  def modern_time_s(self):
    """Time beyond Calculon's terms: exposed CP ring and FSDP traffic (and
    FSDP's buffer copies), the
    embedding, LM head and loss, exposed expert-parallel traffic and the
    system's fixed overheads (0 for Calculon's executions and systems)."""
    extra = 0.0
    if np.any(self.cp > 1):
      extra = extra + self.cp_comm_exposed_time_s
    if np.any(self.fsdp):
      extra = extra + self.fsdp_comm_exposed_time_s + self.fsdp_copy_time_s
    if self.app.has_vocab:
      extra = extra + self.vocab_extra_time_s
    if self.app.is_moe:
      extra = extra + self.ep_comm_exposed_time_s
    if self.system.overhead_per_step_s is not None:
      extra = extra + self.overhead_time_s
    return extra + self.moe_host_time_s

  @cached_property
  def moe_host_time_s(self):
    """Time the stage waits for the host (whole batch): per microbatch, its
    MoE blocks' host time (``overhead.per_moe_block_s`` x MoE blocks of the
    busiest stage) beyond the GPU time of its blocks (forward, backward and
    recomputation), over every microbatch and the pipeline bubble (which
    the longer microbatch lengthens in proportion).  0 without MoE or
    without the overhead."""
    host = self.system.overhead_per_moe_block_s
    if not self.app.is_moe or not np.any(host):
      return 0.0
    gpu = self.fw_time_s + self.bw_time_s + self.recompute_time_s
    with np.errstate(divide='ignore', invalid='ignore'):
      per_mb = gpu / self.num_microbatches
      short = np.maximum(0.0, host * self.moe_blocks_per_proc - per_mb)
      bubble = np.where(gpu > 0, self.bubble_time_s / gpu, 0.0)
    return short * self.num_microbatches * (1.0 + bubble)

  @cached_property
  def overhead_time_s(self):
    """Fixed overheads of the system file (``overhead``: host work the
    accelerators wait for), whole batch: ``per_step_s`` plus
    ``per_microbatch_s`` x the microbatches of a replica.  0 when the file
    has none (Calculon)."""
    step = self.system.overhead_per_step_s
    if step is None:
      return 0.0
    return step + self.num_microbatches * self.system.overhead_per_microbatch_s

  @cached_property
  def sample_rate(self):
    """Samples per second: global batch / batch time."""
    with np.errstate(divide='ignore', invalid='ignore'):
      return self.exe.batch_size / self.total_time_s

  @cached_property
  def useful_flops(self):
    """FLOP of one block and microbatch (forward; plus backward and optimizer
    when training), including TP reduction arithmetic."""
    b = self.block
    return b.fw_flops + np.where(self.training, b.useful_bw_flops, 0)

  @cached_property
  def _perfect_time_s(self):
    peak = self.system.matrix.peak_flops(self.exe.datatype)
    return self.blocks_per_proc * self.num_microbatches * self.useful_flops / \
      peak

  @cached_property
  def _compute_time_s(self):
    return self.fw_time_s + self.bw_time_s + self.optim_step_time_s

  @cached_property
  def compute_efficiency(self):
    """Useful FLOP at matrix peak / time spent computing."""
    with np.errstate(divide='ignore', invalid='ignore'):
      return self._perfect_time_s / self._compute_time_s

  @cached_property
  def system_efficiency(self):
    """Time spent computing / batch time."""
    with np.errstate(divide='ignore', invalid='ignore'):
      return self._compute_time_s / self.total_time_s

  @cached_property
  def total_efficiency(self):
    """Useful FLOP at matrix peak / batch time (MFU-like, counting the
    model's block FLOP including recomputation-free backward)."""
    with np.errstate(divide='ignore', invalid='ignore'):
      return self._perfect_time_s / self.total_time_s

  # -- speed in the field's units ------------------------------------------------
  @cached_property
  def tokens_per_s(self):
    """Tokens per second: sample rate x sequence length."""
    return self.sample_rate * self.app.seq_size

  def _model_flops(self, convention):
    from calculon.llm.flops import model_flops_per_token
    per_token = model_flops_per_token(self.app, convention)
    flops = float(per_token) * self.exe.batch_size * self.app.seq_size
    return np.where(self.training, flops, flops / 3)

  @cached_property
  def model_flops_per_batch(self):
    """Model FLOP of one batch with the whole attention score matrix
    (PaLM's 6N + 12LHQT, torchtitan; :mod:`calculon.llm.flops`), one third
    of it for inference (forward only).  Recomputation is not model FLOP."""
    return self._model_flops('full')

  @cached_property
  def model_flops_per_batch_causal(self):
    """Model FLOP of one batch with half the attention score matrix
    (Megatron-LM since 2025, NeMo)."""
    return self._model_flops('causal')

  @cached_property
  def _peak_flops(self):
    return self.system.matrix.peak_flops(self.exe.datatype)

  @cached_property
  def model_tflops_per_proc(self):
    """Model TFLOP/s achieved per processor (model FLOP / batch time /
    processors / 1e12)."""
    with np.errstate(divide='ignore', invalid='ignore'):
      return self.model_flops_per_batch / self.exe.num_procs / \
        self.total_time_s / 1e12

  @cached_property
  def mfu(self):
    """Model FLOP utilization: model FLOP/s per processor / matrix peak
    (whole-attention convention, :attr:`model_flops_per_batch`)."""
    return self.model_tflops_per_proc * 1e12 / self._peak_flops

  @cached_property
  def mfu_causal(self):
    """MFU with the causal convention (:attr:`model_flops_per_batch_causal`,
    Megatron-LM since 2025 and NeMo)."""
    with np.errstate(divide='ignore', invalid='ignore'):
      return self.model_flops_per_batch_causal / self.exe.num_procs / \
        self.total_time_s / self._peak_flops

  @cached_property
  def num_parameters(self):
    """Trainable parameters of the model (elements)."""
    return float(self.app.num_parameters())

  @cached_property
  def num_active_parameters(self):
    """Parameters a token uses (MoE: top_k routed experts)."""
    return float(self.app.num_active_parameters())

  @cached_property
  def hardware_flops_per_proc(self):
    """FLOP one processor executes per batch: every block's forward,
    recomputation, backward, TP reduction arithmetic, and the optimizer."""
    b = self.block
    work = b.fw_flops + b.re_flops + b.agrad_flops + b.wgrad_flops
    out = self._mult * work + self.blocks_per_proc * b.optim_flops
    if self.app.has_vocab:
      # The embedding and the head run on different stages (PP > 1): the
      # busier of the two processors.
      e, h = self.embed, self.head
      ef = self.num_microbatches * (e.fw_flops + e.agrad_flops +
                                    e.wgrad_flops) + e.optim_flops
      hf = self.num_microbatches * (h.fw_flops + h.agrad_flops +
                                    h.wgrad_flops) + h.optim_flops
      out = out + np.where(self.pp > 1, np.maximum(ef, hf), ef + hf)
    return out

  @cached_property
  def hfu(self):
    """Hardware FLOP utilization: executed FLOP/s / matrix peak."""
    with np.errstate(divide='ignore', invalid='ignore'):
      return self.hardware_flops_per_proc / self.total_time_s / \
        self._peak_flops

  # -- feasibility ------------------------------------------------------------------
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
    """Reason code of infeasibility (see REASON_NAMES); OK (0) if feasible."""
    reason = self.compile_reason
    reason = np.where(reason != OK, reason, np.where(
      self.mem1_bytes > self.system.mem1.capacity_bytes, MEM1_TOO_SMALL,
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
      return (f"Mem tier1 needs {human_format(at(self.mem1_bytes), 'bytes')} "
              f"but only has "
              f"{human_format(self.system.mem1.capacity_bytes, 'bytes')}")
    return (f"Mem tier2 needs {human_format(at(self.mem2_bytes), 'bytes')} "
            f"but only has "
            f"{human_format(self.system.mem2.capacity_bytes, 'bytes')}")
