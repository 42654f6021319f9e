"""Shared ground of the engine: what every concern reads.

Provides:

* :class:`BaseTerms`, whose constructor derives from the execution the
  quantities every concern shares: the parallel degrees (``tp``, ``pp``,
  ``dp``, ``cp``, ``dpcp``, ``ep``, ``etp``, ``edp``, ``interleaving``),
  the sharding level and its shard counts (``sharding``,
  ``optimizer_shards``, ``grad_shards``, ``fsdp``, ``weight_shards``,
  ``grad_shard_per_microbatch``),
  ``training`` and ``full_recompute``, bytes per element
  (``bytes_per_element``, ``io_bytes``, ``grad_bytes``), the
  :class:`~calculon.llm.layers.BlockContext` the layers are priced with
  (``ctx``), the processor share of each network (``pp_usage``,
  ``dp_usage``, ``cp_usage``, ``ep_usage``) and the activation shapes
  (``shape``, ``batch_seq``, ``activation_elems``,
  ``seq_par_activation_elems``);
* :class:`Concern`, the declaration of what a concern adds to the times
  of a block and of the batch (summed by
  :class:`~calculon.llm.terms.evaluation.Evaluation`);
* :func:`quantize_bytes_per_element` and the helpers of every concern's
  arithmetic (:func:`_pos`, :func:`_min`, :func:`_max`,
  :func:`_scalar_if_zero`, :func:`_hidden_behind`).

Reads: nothing of the other concerns (only ``app``, ``system`` and
``exe``).
"""

from collections import namedtuple

import numpy as np

from calculon.config import parallel
from calculon.config.execution import (
  DATATYPE_BYTES, DATATYPE_NAMES, OPTIMIZER_TRAFFIC_FUSED_ADAM, RECIPE_TE,
  RECOMPUTE_FULL, SCALING_BLOCK, SCALING_CURRENT, SHARD_GRADIENTS,
  SHARD_OPTIMIZER, SHARD_PARAMETERS, UNSET, WGRAD_ACCUMULATION_SEPARATE)
from calculon.config.registry import (
  GRADIENT_SHARD_REDUCE_NAMES, TILED_GEMM_SIZE_NAMES)
from calculon.llm.block import Shape
from calculon.llm.layers import (
  BlockContext, FP16_UNSCALE_BYTES, FP32_BYTES, FUSED_ADAM_BYTES)
from calculon.llm.layers import hidden_behind as _hidden_behind

#: ``tiled_gemm_size`` code of tiles priced at their own size.
TILED_GEMM_TILE = TILED_GEMM_SIZE_NAMES.index('tile')
#: ``gradient_shard_reduce`` code of a reduce-scatter every microbatch.
GRADIENT_REDUCE_MICROBATCH = GRADIENT_SHARD_REDUCE_NAMES.index('microbatch')

__all__ = ['BaseTerms', 'Concern', 'quantize_bytes_per_element',
           '_hidden_behind', '_pos', '_min', '_max', '_scalar_if_zero']

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


def _pos(x):
  """Python's max(0, x): x when positive, else 0."""
  return np.where(x > 0, x, 0)


def _min(a, b):
  """Python's min(a, b) (first of equals)."""
  return np.where(b < a, b, a)


def _max(a, b):
  """Python's max(a, b) (first of equals)."""
  return np.where(b > a, b, a)


def _ranks_per_domain(networks, group, tier, inner):
  """Ranks of a ``group`` of processors communicating on network ``tier``
  that share one domain of the tier below (a node), for the system's
  ``rails`` (:meth:`calculon.hardware.network.Networks.collective_time_s`):
  ranks are laid out as Megatron-Core orders them (``tp-cp-ep-dp-pp``, TP
  innermost; torchtitan's ``[pp, dp, cp, tp]`` mesh agrees), so the
  ``inner`` parallelisms inside the group's ranks fill a domain first and
  the group's own ranks the rest: ``min(group, max(S // inner, 1))`` of
  them in a domain of ``S`` processors.  1 on a system without ``rails``
  (nothing to compute)."""
  if not networks.has_rails:
    return 1
  size = networks.size[np.maximum(np.asarray(tier) - 1, 0)]
  return np.minimum(group, np.maximum(size // inner, 1))



#: What one concern adds to the times of a block and of the batch (its
#: ``CONCERN`` class attribute; :class:`~calculon.llm.terms.evaluation.
#: Evaluation` sums the declarations of its concerns in their order).
#:
#: * ``name``: the concern, for messages.
#: * ``applies``: function of an Evaluation, a Python bool: False when
#:   every term the concern declares is 0 for every execution (its terms
#:   are then neither computed nor added).
#: * ``block_fw``, ``block_bw``: names of the Evaluation's attributes
#:   (seconds, per block and microbatch) added to the forward and the
#:   backward time of every (base and edge) block
#:   (:attr:`~calculon.llm.terms.evaluation.Evaluation.block_fw_extra_s`,
#:   :attr:`~calculon.llm.terms.evaluation.Evaluation.block_bw_extra_s`);
#:   the backward ones count only when training.
#: * ``batch``: names of attributes (seconds, whole batch) added to the
#:   batch time
#:   (:attr:`~calculon.llm.terms.evaluation.Evaluation.modern_time_s`).
#:   They must include the block terms over every block and microbatch
#:   (``block_microbatches`` x (forward + backward)) and be >= 0:
#:   :func:`calculon.llm.prune.rate_bound` bounds the batch time from
#:   below by the block terms, and ``tests/test_bound.py`` checks it.
Concern = namedtuple('Concern', 'name applies block_fw block_bw batch',
                     defaults=((), (), ()))


class BaseTerms:
  """The quantities every concern shares (see the module).

  Args:
    app: :class:`~calculon.config.Application`.
    system: :class:`~calculon.hardware.System`.
    exe: :class:`~calculon.config.ExecutionColumns`, already validated
      (rules and compatibility with ``app`` and ``system``).
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
    # ZeRO-2 that reduce-scatters each block's gradients in every
    # microbatch (``gradient_shard_reduce`` 'microbatch'), as FSDP does.
    self.grad_shard_per_microbatch = (sharding == SHARD_GRADIENTS) & (
      e.gradient_shard_reduce == GRADIENT_REDUCE_MICROBATCH) & \
      (self.dpcp > 1)
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
    grad_buffer_bytes = np.where(grad_set, self.grad_bytes, FP32_BYTES)
    self.ctx = BlockContext(
      system, e.datatype, bpe, self.optimizer_shards, self.tp,
      e.tensor_par_net, e.tensor_par_comm_type, e.tensor_par_overlap,
      grad_shards=self.grad_shards, grad_bytes=self.grad_bytes,
      grad_buffer_bytes=grad_buffer_bytes,
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
      tp_overlap_efficiency=e.tensor_par_overlap_efficiency,
      tp_tile_gemms=e.tiled_gemm_size == TILED_GEMM_TILE,
      tp_narrow_all_gather=e.tensor_par_narrow_all_gather,
      # MXFP8: 8-bit GEMMs with block scales (kernels.tables.
      # MXFP8_GEMM_RATIO).
      block_scaled_gemm=_scalar_if_zero(
        (bpe == 1) & (e.quantization_scaling == SCALING_BLOCK)),
      # A framework's Adam step (optimizer_traffic 'fused_adam'); float16
      # unscales the gradients first (loss scaling).
      optimizer_pass_bytes=_scalar_if_zero(np.where(
        e.optimizer_traffic == OPTIMIZER_TRAFFIC_FUSED_ADAM,
        FUSED_ADAM_BYTES + np.where(e.datatype == _FP16,
                                    FP16_UNSCALE_BYTES, 0.0), 0.0)),
      # wgrad_accumulation 'separate': per weight element the GEMM's
      # 16-bit gradient read, and the accumulation buffer read and written
      # (DDP's main_grad.add_), or, where FSDP shards the parameters, the
      # kept gradient written (Megatron-FSDP's main_grad.copy_).
      wgrad_accumulate_bytes=_scalar_if_zero(np.where(
        e.wgrad_accumulation == WGRAD_ACCUMULATION_SEPARATE,
        self.io_bytes + np.where(sharding == SHARD_PARAMETERS,
                                 self.grad_bytes, 2.0 * grad_buffer_bytes),
        0.0)))
    self.pp_usage = nets.usage(e.pipeline_par_net)
    self.dp_usage = nets.usage(e.data_par_net)
    self.cp_usage = nets.usage(e.context_par_net)
    self.ep_usage = nets.usage(e.expert_par_net)
    self.shape = Shape(app, e, self.ctx)
    self.batch_seq = parallel.tokens_per_microbatch(
      e.microbatch_size, app.seq_size, self.cp)
    self.activation_elems = self.batch_seq * app.hidden
    self.seq_par_activation_elems = (self.batch_seq // self.tp) * app.hidden
