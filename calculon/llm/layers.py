"""Layers of a transformer block, as arithmetic over numpy arrays.

A layer knows, per microbatch, its FLOP and memory traffic in each stage
('fw' forward, 'agrad' activation gradients, 'wgrad' weight gradients,
'optim' optimizer step), the memory it keeps (weights, activations,
gradients, optimizer state) and, for tensor-parallel layers, its
communication.  Every quantity is an array broadcast over the executions
being evaluated (a 0-d array for a single run).

Sizes are element counts unless the name says ``_bytes``; times are seconds.
The formulas are Calculon's (Isaev et al., SC'23, section 3 and its
``layers.py``); activation memory follows Korthikanti et al. 2022, "Reducing
Activation Recomputation in Large Transformer Models", section 4.

A layer may be absent for some executions (e.g. the fused QKV projection
exists only with TP communication overlap): ``present`` is then a boolean
array and the block sums mask it out.
"""

import numpy as np

from calculon.config.execution import (
  TP_COMM_P2P_RS_AG, TP_COMM_RS_AG, TP_OVERLAP_PIPE)

STAGES = ('fw', 'agrad', 'wgrad', 'optim')

#: Adam: FLOP per weight-gradient element in one optimizer step.
ADAM_FLOPS_PER_ELEMENT = 11
#: fp32 master weights and each Adam moment take 4 bytes per element.
FP32_BYTES = 4
#: Bytes per element of the optimizer shard that a framework's fused Adam
#: step moves besides the copy into the 16-bit weights (``optimizer_traffic``
#: 'fused_adam'): the gradient norm reads the fp32 gradient (4); the fused
#: Adam kernel reads the gradient, the master weight and the two moments
#: and writes the last three (7 x 4 = 28).  Sources: NVIDIA apex
#: csrc/multi_tensor_adam.cu (AdamFunctor: g, p, m, v loaded, p, m, v
#: stored) and PyTorch torch/optim/adamw.py (fused=True, _fused_adamw_:
#: the same); Megatron-LM megatron/optimizer/clip_grads.py
#: (clip_grad_norm_fp32: multi_tensor_l2norm over the main gradients) and
#: PyTorch torch/nn/utils/clip_grad.py (clip_grad_norm_: the norm, then
#: the gradients scaled in place, a read and a write more, 8).
FUSED_ADAM_BYTES = 4 + 7 * FP32_BYTES
#: With float16, Megatron-LM's loss scaling unscales the fp32 gradients and
#: checks them for inf/NaN first, a read and a write of each (8):
#: MixedPrecisionOptimizer._unscale_main_grads_and_check_for_nan,
#: torch._amp_foreach_non_finite_check_and_unscale_.
FP16_UNSCALE_BYTES = 2 * FP32_BYTES


def _is_zero(x):
  """True for a scalar 0 (work that is zero for every execution)."""
  return np.ndim(x) == 0 and x == 0


def _plus(a, b):
  """``a + b``, or ``a`` itself when ``b`` is a scalar 0."""
  return a if _is_zero(b) else a + b


def where(cond, a, b):
  """np.where that keeps Python scalars when ``cond`` is a Python bool."""
  if cond is True:
    return a
  if cond is False:
    return b
  return np.where(cond, a, b)


def flag(x):
  """A boolean option: a Python bool when 0-d, else a bool array."""
  if np.ndim(x) == 0:
    return bool(x)
  return np.asarray(x, dtype=bool)


def negate(x):
  """Logical not of a :func:`flag`."""
  return (not x) if isinstance(x, bool) else ~x


def and_flags(a, b):
  """Logical and of two flags, keeping Python bools when possible."""
  if a is True:
    return b
  if b is True:
    return a
  if a is False or b is False:
    return False
  return a & b


def hidden_behind(comm, window, usage):
  """Exposed seconds of ``comm`` seconds of communication overlapped with
  ``window`` seconds of compute, while the processor share ``usage`` of the
  tier carrying it drives the transfer: what exceeds the window shows, and
  the compute it overlaps runs ``usage`` slower (Calculon, Isaev et al.
  SC'23, section 3: the network's processor usage during overlapped data-
  and tensor-parallel communication; DeepSeek-AI 2024, DeepSeek-V3 section
  3.2.2: 20 of an H800's 132 SMs drive the overlapped all-to-all).
  Arrays broadcast."""
  over = comm - window
  return np.where(over > 0, over, 0) + np.where(window < comm, window,
                                                comm) * usage


class BlockContext:
  """Execution quantities shared by all layers of a block.

  Attributes (arrays broadcastable over the executions):
    system: the :class:`~calculon.hardware.System`.
    dtype: datatype code; bytes_per_element: its size in bytes.
    optimizer_shards: processors sharing the optimizer state (DP x CP when
      the optimizer is sharded, else 1).
    grad_shards: processors sharing the gradients of finished blocks.
    grad_bytes: bytes per kept gradient element; grad_buffer_bytes: bytes per
      element of the unsharded accumulation buffer of the block being
      computed (Calculon: fp32).
    tp: tensor-parallel degree; tp_tier: its network tier.
    tp_comm: TP communication code; tp_overlap: TP overlap code.
    Precision (Transformer Engine recipe, else all equal to ``dtype`` /
    ``bytes_per_element``): linear_dtype, other_dtype (compute datatype of
    the linear layers' GEMMs / of everything else), io_bytes (bytes per
    activation element moved or kept), linear_act_bytes (bytes per stored
    input of a linear layer), linear_weight_bytes, other_weight_bytes
    (bytes kept per weight element).
    quantize_bytes: bytes moved per element a narrow linear layer casts
      from 16-bit to its narrow datatype (0: no casts; see
      :meth:`Layer.quantize_bytes`).
    tp_async: the backward communication of plain TP runs behind the
      backward GEMMs of its linear layers (bool or bool array; see
      :class:`TPComm`).
    tp_narrow_all_gather: TP all-gathers that feed a GEMM (f's forward,
      g's backward) carry ``narrow_bytes`` per element instead of
      ``io_bytes`` (the input cast before the gather: torchao's float8 TP
      styles); reduce-scatters and all-reduces keep ``io_bytes``.
    narrow_bytes: bytes per element of the linear layers' GEMM inputs
      (the narrow datatype's; default ``linear_act_bytes``).
    tp_overlap_rs_dgrad: with a tiled TP overlap, the reduce-scatter (or
      all-reduce) of a column-parallel layer's input gradient is tiled
      too (bool or bool array; false: it runs whole after the input-
      gradient GEMM, exposed; see :class:`LinearOverlapped`).
    tp_overlap_efficiency: with a tiled TP overlap, the share of the
      tiling's gain the framework realizes (float or float array, 1:
      Calculon's tiling; 0: as untiled; see :class:`LinearOverlapped`).
    tp_tile_gemms: with a tiled TP overlap, each tile's GEMM priced at the
      matrix efficiency of its own size (bool or bool array; false: at the
      whole GEMM's, Calculon; see :class:`LinearOverlapped`).
    optimizer_pass_bytes: bytes the optimizer step moves per element of
      its shard besides the copy into the 16-bit weights (scalar 0:
      Calculon's traffic, :meth:`Layer.optimizer_bytes`; see
      :meth:`Layer.optimizer_traffic_bytes`).
    wgrad_accumulate_bytes: bytes per weight element of the kernel that
      adds each microbatch's weight gradient into the gradient buffer
      (``wgrad_accumulation`` 'separate'; scalar 0: fused into the GEMM,
      Calculon; see :meth:`Layer.accumulate_bytes`).
    block_scaled_gemm: the linear layers' 8-bit GEMMs are block scaled
      (``quantization_scaling`` 'block' with float8: MXFP8), priced from a
      measured 'fp8' table at the system's
      ``measured.block_scaled_gemm_ratio`` (bool or bool array; see
      :func:`measured_gemm_time_s`).
  """

  def __init__(self, system, dtype, bytes_per_element, optimizer_shards, tp,
               tp_tier, tp_comm, tp_overlap, *, grad_shards=None,
               grad_bytes=None, grad_buffer_bytes=FP32_BYTES,
               linear_dtype=None, other_dtype=None, io_bytes=None,
               linear_act_bytes=None, linear_weight_bytes=None,
               other_weight_bytes=None, expert_optimizer_shards=None,
               expert_grad_shards=None, quantize_bytes=0.0, tp_async=False,
               tp_overlap_rs_dgrad=True, tp_overlap_efficiency=1.0,
               tp_tile_gemms=False, tp_narrow_all_gather=False,
               narrow_bytes=None, optimizer_pass_bytes=0.0,
               wgrad_accumulate_bytes=0.0, block_scaled_gemm=False):
    self.system = system
    self.block_scaled_gemm = flag(block_scaled_gemm)
    self.optimizer_pass_bytes = optimizer_pass_bytes
    self.wgrad_accumulate_bytes = wgrad_accumulate_bytes
    self.dtype = dtype
    self.bytes_per_element = bytes_per_element
    self.optimizer_shards = optimizer_shards
    self.grad_shards = optimizer_shards if grad_shards is None \
      else grad_shards
    self.grad_bytes = bytes_per_element if grad_bytes is None else grad_bytes
    self.grad_buffer_bytes = grad_buffer_bytes
    self.tp = tp
    self.tp_tier = tp_tier
    self.tp_comm = tp_comm
    self.tp_overlap = tp_overlap
    self.seq_par = tp_comm == TP_COMM_RS_AG
    self.p2p = tp_comm == TP_COMM_P2P_RS_AG
    self.tp_usage = system.networks.usage(tp_tier)

    def given(x, default):
      return default if x is None else x
    self.linear_dtype = given(linear_dtype, dtype)
    self.other_dtype = given(other_dtype, dtype)
    self.io_bytes = given(io_bytes, bytes_per_element)
    self.linear_act_bytes = given(linear_act_bytes, self.io_bytes)
    self.linear_weight_bytes = given(linear_weight_bytes, bytes_per_element)
    self.other_weight_bytes = given(other_weight_bytes, bytes_per_element)
    self.expert_optimizer_shards = given(expert_optimizer_shards,
                                         self.optimizer_shards)
    self.expert_grad_shards = given(expert_grad_shards, self.grad_shards)
    self.quantize_bytes = quantize_bytes
    self.tp_async = flag(tp_async)
    self.tp_overlap_rs_dgrad = flag(tp_overlap_rs_dgrad)
    self.tp_overlap_efficiency = tp_overlap_efficiency
    #: Each tile of a TP-overlapped GEMM priced at its own size
    #: (``tiled_gemm_size`` 'tile'; False: at the whole GEMM's, Calculon).
    self.tp_tile_gemms = flag(tp_tile_gemms)
    #: Bytes per element of a TP all-gather feeding a GEMM: the narrow
    #: datatype's where the gather carries the cast input.
    self.tp_gather_bytes = where(flag(tp_narrow_all_gather),
                                 given(narrow_bytes, self.linear_act_bytes),
                                 self.io_bytes)


class Layer:
  """A generic layer; subclasses change sizes and a few memory rules.

  Keyword args (element counts unless noted, arrays or scalars):
    fw_flops, agrad_flops, wgrad_flops: FLOP per microbatch.
    inputs, outputs: elements read / written in the forward pass.
    activation: elements kept for the backward pass.
    activation_grads: elements of the gradient w.r.t. the output.
    weights, weight_grads, optim: parameters, their gradients and the
      optimizer moments (elements).
    recompute: recomputed in the backward pass (bool array).
    recompute_share: the share of the layer's forward work that the
      recomputation redoes where ``recompute`` holds (1, or an array;
      e.g. 0.5 for the up half of a fused gate/up GEMM).
    recomm: its TP communication is redone in the backward pass.
    activation_reused: its input activation is counted by another layer.
    activation_stored / output_stored: kept until the backward pass.
    present: the layer exists for this execution (bool array or True).
    quantized_inputs, quantized_grads: elements a narrow linear layer casts
      to its narrow datatype in the forward pass (its input) and in the
      backward pass (the gradient of its output); see
      :meth:`quantize_bytes`.
  """

  matrix = False
  #: The layer's GEMM as (m tokens, n inputs, k outputs, count) for pricing
  #: from a measured GEMM table (:func:`measured_gemm_time_s`), or None.
  gemm = None
  #: Linear layers run in the narrow datatype under Transformer Engine.
  linear = False
  #: Routed-expert weights: reduced and sharded over the expert
  #: data-parallel ranks instead of DP x CP.
  expert = False

  def __init__(self, name, ctx, *, fw_flops=0.0, agrad_flops=0.0,
               wgrad_flops=0.0, inputs=0.0, outputs=0.0, activation=0.0,
               activation_grads=0.0, weights=0.0, weight_grads=0.0, optim=0.0,
               recompute=False, recomm=False, activation_reused=False,
               activation_stored=True, output_stored=True, present=True,
               quantized_inputs=0.0, quantized_grads=0.0,
               recompute_share=1.0):
    self.name = name
    self.ctx = ctx
    self.fw_flops = fw_flops
    self.agrad_flops = agrad_flops
    self.wgrad_flops = wgrad_flops
    self.inputs = inputs
    self.outputs = outputs
    self.activation = activation
    self.activation_grads = activation_grads
    self.weights = weights
    self.weight_grads = weight_grads
    self.optim = optim
    self.recompute = flag(recompute)
    self.recompute_share = recompute_share
    self.recomm = flag(recomm)
    self.activation_reused = flag(activation_reused)
    self.activation_stored = flag(activation_stored)
    self.output_stored = flag(output_stored)
    self.present = flag(present)
    self._cache = {}
    narrow = self.linear and getattr(self, 'narrow', True)
    #: Compute datatype code, bytes per activation element moved, bytes per
    #: stored activation element, bytes per kept weight element.
    self.dtype = ctx.linear_dtype if narrow else ctx.other_dtype
    self.bpe = ctx.io_bytes
    self.act_bpe = ctx.linear_act_bytes if narrow else ctx.io_bytes
    self.weight_bpe = ctx.linear_weight_bytes if narrow else \
      ctx.other_weight_bytes
    self.quantized_inputs = quantized_inputs if narrow else 0.0
    self.quantized_grads = quantized_grads if narrow else 0.0

  def _memo(self, key, fn):
    if key not in self._cache:
      self._cache[key] = fn()
    return self._cache[key]

  # -- FLOP and memory traffic per stage --------------------------------------
  def flops(self, stage):
    """FLOP of ``stage``; the optimizer runs Adam on this processor's shard."""
    if stage == 'fw':
      return self.fw_flops
    if stage == 'agrad':
      return self.agrad_flops
    if stage == 'wgrad':
      return self.wgrad_flops
    return self.weight_grads / self._optimizer_shards() * \
      ADAM_FLOPS_PER_ELEMENT

  def _optimizer_shards(self):
    return self.ctx.expert_optimizer_shards if self.expert \
      else self.ctx.optimizer_shards

  def _grad_shards(self):
    return self.ctx.expert_grad_shards if self.expert \
      else self.ctx.grad_shards

  def fw_mem_bytes(self):
    """Forward traffic: read inputs and weights, write outputs."""
    return (self.inputs + self.outputs + self.weights) * self.bpe

  def agrad_mem_bytes(self):
    """Activation-gradient traffic: weights, stored activations, grads."""
    return (self.weights + (self.activation + self.activation_grads)) * \
      self.bpe

  def wgrad_mem_bytes(self):
    """Weight-gradient traffic (none for layers without weights)."""
    if np.ndim(self.weights) == 0 and self.weights == 0:
      return 0.0
    mem = (self.weight_grads + (self.activation + self.activation_grads)) * \
      self.bpe
    return where(self.weights == 0, 0.0, mem)

  def kernel_mem_bytes(self, stage):
    """Bytes the layer's own kernel moves to/from memory tier 1 in
    ``stage``."""
    if stage == 'fw':
      return self.fw_mem_bytes()
    if stage == 'agrad':
      return self.agrad_mem_bytes()
    if stage == 'wgrad':
      return self.wgrad_mem_bytes()
    return self.optimizer_traffic_bytes()

  def quantize_bytes(self, stage):
    """Bytes moved by the casts of a narrow (FP8/FP4) linear layer under
    the Transformer Engine recipe, separate memory-bound kernels before its
    GEMMs: the forward pass casts the layer's 16-bit input, the backward
    pass the gradient of its output.  Each cast reads the 16-bit tensor and
    writes it twice in the narrow datatype, row-wise for one GEMM and
    column-wise (transposed) for the other, because FP8 tensor cores take
    only the TN layout, so the weight-gradient GEMM needs the input and the
    output gradient transposed (NVIDIA Transformer Engine documentation,
    "Using FP8 with Transformer Engine" and its ``Float8Tensor`` row-wise /
    column-wise usages; Micikevicius et al. 2022, "FP8 Formats for Deep
    Learning", section 4).  ``ctx.quantize_bytes`` per element: 2 + 2 x 1
    = 4 for FP8 with delayed scaling (2 + 1 in inference: no transposed
    copy), plus 2 for current scaling's amax
    read and the block scales for MXFP8/NVFP4 (see
    :func:`calculon.llm.model.quantize_bytes_per_element`).  Not priced:
    casts fused into a preceding norm, and the weight casts (once per step
    with Transformer Engine's first-microbatch weight cache, under 1 % of a
    step).  Zero for every other layer and recipe (Calculon)."""
    per_elem = self.ctx.quantize_bytes
    if stage == 'fw':
      elems = self.quantized_inputs
    elif stage == 'agrad':
      elems = self.quantized_grads
    else:
      return 0.0
    if _is_zero(elems) or _is_zero(per_elem):
      return 0.0
    return elems * per_elem

  def accumulate_bytes(self, stage):
    """Bytes moved in ``stage`` 'wgrad' by the kernel that moves the
    weight gradients the GEMM wrote into the gradient buffer, with
    ``wgrad_accumulation`` 'separate' (``ctx.wgrad_accumulate_bytes`` per
    weight element).  Megatron-Core without gradient_accumulation_fusion:
    the weight-gradient GEMM returns the gradient and a hook adds it,
    ``param.main_grad.add_(param.grad)`` (the 16-bit gradient read, the
    buffer read and written: megatron/core/distributed/
    distributed_data_parallel.py ``_make_backward_post_hook``), or under
    Megatron-FSDP with sharded gradients copies it,
    ``param.main_grad.copy_(param.grad)`` (the kept gradient only written:
    core_v0.12.0 megatron/core/distributed/custom_fsdp/
    fully_sharded_data_parallel.py ``_grad_acc``); with the fusion,
    tensor_parallel/layers.py
    ``LinearWithGradAccumulationAndAsyncCommunication`` accumulates in the
    GEMM (``wgrad_gemm_accum_fp32``).  Zero otherwise (Calculon)."""
    per = self.ctx.wgrad_accumulate_bytes
    if stage != 'wgrad' or _is_zero(per) or _is_zero(self.weight_grads):
      return 0.0
    return self.weight_grads * per

  def side_bytes(self, stage):
    """Bytes of the separate memory-bound kernels of ``stage``: the casts
    (:meth:`quantize_bytes`) and the gradient accumulation
    (:meth:`accumulate_bytes`)."""
    return _plus(self.quantize_bytes(stage), self.accumulate_bytes(stage))

  def mem_bytes(self, stage):
    """Bytes moved to/from memory tier 1 in ``stage``: the layer's kernel
    and its separate kernels (:meth:`side_bytes`)."""
    return _plus(self.kernel_mem_bytes(stage), self.side_bytes(stage))

  def measured(self, stage):
    """True (a bool) when ``stage`` of this layer is priced from a measured
    table of the system (its time then includes its kernel's memory
    traffic: :meth:`kernel_mem_time_s` is 0)."""
    return self.gemm is not None and stage != 'optim' and \
      self.ctx.system.measured is not None and \
      measured_gemm_covers(self.ctx.system.measured, self.dtype)

  def flops_time_s(self, stage):
    """Compute time of ``stage`` on the matrix (GEMM layers) or vector
    engine; the optimizer always runs on the vector engine.  A GEMM layer
    on a system with a measured GEMM table for its datatype takes the
    table's time for its GEMM's shape in that stage
    (:func:`measured_gemm_time_s`)."""
    def compute():
      if self.measured(stage):
        return measured_gemm_time_s(self.ctx.system, self.dtype, self.gemm,
                                    stage,
                                    block_scaled=self.ctx.block_scaled_gemm)
      flops = self.flops(stage)
      engine = self.ctx.system.matrix if self.matrix and stage != 'optim' \
        else self.ctx.system.vector
      dtype = self.dtype if stage != 'optim' else self.ctx.other_dtype
      return engine.time_s(dtype, flops)
    return self._memo(('flops_time', stage), compute)

  def kernel_mem_time_s(self, stage):
    """Memory time of the layer's kernel in ``stage`` at tier-1 bandwidth
    for its access size."""
    if self.measured(stage):
      return 0.0
    return self._memo(('kernel_mem_time', stage), lambda: self.ctx.system.
                      mem1.time_s(self.kernel_mem_bytes(stage)))

  def side_time_s(self, stage):
    """Time of the separate kernels of ``stage`` (:meth:`side_bytes`:
    casts, gradient accumulation), memory bound at tier-1 bandwidth for
    their size; added to the layer's time."""
    def compute():
      side = self.side_bytes(stage)
      return 0.0 if _is_zero(side) else self.ctx.system.mem1.time_s(side)
    return self._memo(('side_time', stage), compute)

  def mem_time_s(self, stage):
    """Memory time of ``stage``: the kernel's and its separate
    kernels'."""
    return _plus(self.kernel_mem_time_s(stage), self.side_time_s(stage))

  def processing_time_s(self, stage):
    """Time of ``stage``: the kernel's compute and memory combined per the
    system's processing mode (roofline or no overlap), plus its separate
    kernels (casts, gradient accumulation)."""
    return self._memo(('proc', stage), lambda: _plus(
      self.ctx.system.processing_time_s(self.flops_time_s(stage),
                                        self.kernel_mem_time_s(stage)),
      self.side_time_s(stage)))

  # -- Communication (only tensor-parallel layers communicate) ----------------
  def comm_bytes(self, stage, edge):
    """Bytes of TP communication in ``stage`` (``edge``: the block at the
    pipeline-stage boundary)."""
    return 0.0

  def comm_tile_bytes(self, stage, edge):
    """Bytes of one communication tile."""
    return self.comm_bytes(stage, edge)

  def net_time_s(self, stage, edge):
    """Time the TP communication of ``stage`` occupies the link."""
    return 0.0

  def exposed_net_time_s(self, stage, edge):
    """Part of the TP communication of ``stage`` not hidden by compute."""
    return 0.0

  def recomm_exposed_time_s(self, edge):
    """Exposed time of the redone communication, as the block accounts it."""
    return 0.0

  def required_bw_bytes_per_s(self, stage, edge):
    """Network bandwidth needed to hide tiled TP communication."""
    return 0.0

  # -- Memory kept -------------------------------------------------------------
  def weight_bytes(self):
    return self.weights * self.weight_bpe

  def activation_bytes(self):
    return self.activation * self.act_bpe

  def output_bytes(self):
    return self.outputs * self.bpe

  def weight_grad_bytes(self, sharded=True):
    """Weight gradients kept between blocks (``grad_bytes`` per element,
    divided over the gradient shards; Calculon: the datatype, sharded like
    the optimizer), or the unsharded accumulation buffer of the block being
    computed (``sharded=False``; Calculon: fp32)."""
    if sharded:
      return self.weight_grads * self.ctx.grad_bytes / self._grad_shards()
    return self.weight_grads * self.ctx.grad_buffer_bytes

  def activation_grad_bytes(self):
    return self.activation_grads * self.bpe

  def optimizer_bytes(self):
    """Adam moments in fp32 plus an fp32 master copy of the weights when the
    weights are kept narrower than 4 bytes, divided over the optimizer
    shards (Rajbhandari et al. 2020, section 3.1: K = 12 bytes)."""
    moments = self.optim * FP32_BYTES
    master = where(self.weight_bpe < FP32_BYTES,
                   self.weights * FP32_BYTES, 0.0)
    return (master + moments) / self._optimizer_shards()

  def optimizer_traffic_bytes(self):
    """Bytes the optimizer step moves to/from memory tier 1 on this
    processor's shard.

    ``ctx.optimizer_pass_bytes`` 0 (scalar): Calculon's, the optimizer
    state read once (:meth:`optimizer_bytes`).  Otherwise, per element of
    the shard (``weight_grads`` / optimizer shards), those bytes (the
    passes of :data:`FUSED_ADAM_BYTES`, and :data:`FP16_UNSCALE_BYTES`
    with float16) plus, when the kept weights are narrower than fp32, the
    copy of the fp32 master weights into the 16-bit weights: 4 read + 2
    written (Megatron-LM megatron/optimizer/optimizer.py,
    ``_copy_main_params_to_model_params``; Transformer Engine's FP8 copy
    made from it later is not priced, as :meth:`quantize_bytes` says).
    38 bytes per element with bfloat16 weights, 46 with float16, against
    Calculon's 12.  Not priced: zeroing the gradient buffer and the
    distributed optimizer's copy of its gradient shard into fp32."""
    per = self.ctx.optimizer_pass_bytes
    if _is_zero(per):
      return self.optimizer_bytes()
    copy = where(self.weight_bpe < FP32_BYTES,
                 FP32_BYTES + np.minimum(self.weight_bpe, 2.0), 0.0)
    full = self.weight_grads * (per + copy) / self._optimizer_shards()
    return where(per > 0, full, self.optimizer_bytes())


class Linear(Layer):
  """A GEMM y = x W with x: m x n and W: n x k (m = microbatch * sequence).

  ``narrow=False`` keeps it in 16-bit under Transformer Engine (the LM head,
  as Megatron-LM and DeepSeek-V3 do, arXiv:2412.19437 section 3.3).
  ``quantizes_input=False``: its input is cast once by a layer sharing it
  (keys and values share the query projection's input: one fused QKV GEMM
  in Megatron-Core, ``linear_qkv``).
  """

  matrix = True
  linear = True

  def __init__(self, name, ctx, m, n, k, narrow=True, quantizes_input=True,
               **flags):
    self.narrow = narrow
    self.gemm = (m, n, k, 1)
    super().__init__(name, ctx, fw_flops=2.0 * m * n * k,
                     agrad_flops=2.0 * m * n * k, wgrad_flops=2.0 * m * n * k,
                     inputs=m * n, outputs=m * k, weights=n * k,
                     weight_grads=n * k, activation=m * n,
                     activation_grads=m * k, optim=2 * n * k,
                     quantized_inputs=m * n if quantizes_input else 0.0,
                     quantized_grads=m * k, **flags)


#: Chunks of Transformer Engine's pipelined reduce-scatter overlap
#: (``num_splits`` of its default userbuffers configuration for proj_fprop
#: and fc2_fprop, transformer_engine/pytorch/module/base.py at d0067d0da).
TE_PIPELINE_SPLITS = 4


def te_gemm_chunks(conjugate, stage, tp):
  """GEMMs an overlapped TP GEMM's ``stage`` runs as, in Transformer
  Engine's default userbuffers configuration (transformer_engine/pytorch/
  module/base.py ``initialize_ub``, d0067d0da): a ring-exchange all-gather,
  the forward of an all-gathered GEMM (qkv_fprop, fc1_fprop) and the input
  gradient of a reduce-scattered one (proj_dgrad, fc2_dgrad), one GEMM per
  TP chunk (``num_splits`` tp_size); the pipelined reduce-scatter of the
  forward of a reduce-scattered GEMM (proj_fprop, fc2_fprop),
  :data:`TE_PIPELINE_SPLITS`; the bulk overlap of an all-gathered GEMM's
  input gradient (qkv_dgrad, fc1_dgrad), the GEMM whole.  ``conjugate``:
  the GEMM's output is reduce-scattered; ``tp``: the TP degree (array or
  scalar)."""
  if stage == 'fw':
    return TE_PIPELINE_SPLITS if conjugate else tp
  if stage == 'agrad':
    return tp if conjugate else 1
  return 1


def chunked_gemm_time_s(matrix, dtype, flops, chunks):
  """Seconds of a GEMM of ``flops`` FLOP run as ``chunks`` GEMMs of equal
  FLOP, each at the efficiency of its own size on ``matrix`` (a
  :class:`~calculon.hardware.processor.Processor`; Transformer Engine
  comm_gemm_overlap.cpp, ``split_overlap_ag`` and ``split_overlap_rs``: one
  cuBLAS GEMM per chunk)."""
  return chunks * matrix.time_s(dtype, flops / chunks)


def measured_gemm_covers(kernels, dtype):
  """True when measured tables ``kernels`` (:class:`~calculon.kernels.
  tables.MeasuredKernels`) have a GEMM table for every datatype code of
  ``dtype`` (scalar or array)."""
  from calculon.config.execution import DATATYPE_NAMES
  codes = np.unique(dtype) if np.ndim(dtype) else [dtype]
  return all(kernels.gemm_dtype_key(DATATYPE_NAMES[int(c)]) is not None
             for c in codes)


def measured_gemm_time_s(system, dtype, gemm, stage, chunks=1,
                         block_scaled=False):
  """Seconds of a linear layer's GEMM in ``stage`` from the system's
  measured GEMM table (:meth:`~calculon.kernels.tables.MeasuredKernels.
  gemm_time_s`, whose GEMM is ``x (M, K) @ W (N, K)^T``).

  ``gemm`` = (m tokens, n inputs, k outputs, count): the forward is the
  GEMM (M, N, K) = (m, k, n); the activation gradient dX = dY W, (m, n,
  k); the weight gradient dW = dY^T X, (k, n, m) (Megatron-LM
  core/tensor_parallel/layers.py ``LinearWithGradAccumulationAndAsync
  Communication.backward``: ``grad_output.matmul(weight)`` and
  ``grad_output.t().matmul(total_input)``).  ``count`` GEMMs of that
  shape (the experts of a grouped GEMM); ``chunks``: the GEMM cut along
  its token rows into that many GEMMs (Transformer Engine's overlapped
  chunks, :func:`te_gemm_chunks`).  ``dtype``: datatype code(s), each with
  a table (:func:`measured_gemm_covers`).  A narrow (fp8, NVFP4) table
  op also casts its bfloat16 x (M, K) input, which a training GEMM gets
  already cast (its casts are :meth:`Layer.quantize_bytes`): those bytes
  (:data:`~calculon.kernels.tables.GEMM_INPUT_QUANTIZE_BYTES`) are taken
  off at the tier-1 memory rate, never below 2 M N K FLOP at the matrix
  engine's peak (AIConfigurator's own composition for a quantized input,
  aic-core/rust/aiconfigurator-core/src/operators/gemm.rs ``GemmOp::
  query``, at 095f58a5).  ``block_scaled`` (bool or bool array): an
  8-bit GEMM is block scaled (MXFP8), the per-tensor 'fp8' table's time x
  the system's ``measured.block_scaled_gemm_ratio``
  (:data:`~calculon.kernels.tables.MXFP8_GEMM_RATIO`, Transformer
  Engine's measured MXFP8 over FP8 kernel time).  Arrays broadcast."""
  from calculon.config.execution import DATATYPE_NAMES
  m, n, k, count = gemm
  kernels = system.measured
  if stage == 'fw':
    shape = (m / chunks, k, n)
  elif stage == 'agrad':
    shape = (m / chunks, n, k)
  else:
    shape = (k, n, m / chunks)

  def one(code):
    key = kernels.gemm_dtype_key(DATATYPE_NAMES[int(code)])
    t = kernels.gemm_time_s(key, *shape)
    # The table op quantizes its x (M, K) operand; a training GEMM's
    # operands arrive quantized (the framework's casts are priced apart,
    # Layer.quantize_bytes), so that time is taken off, floored at the
    # GEMM's compute at peak (AIConfigurator's fp8_static with
    # low_precision_input: table - compute_scale - scale_matrix, floored at
    # the roofline; kernels.tables.GEMM_INPUT_QUANTIZE_BYTES).
    quant = kernels.input_quantize_bytes(key, shape[0], shape[2])
    if quant:
      cast = sum(system.mem1.time_s(b) for b in quant)
      floor = 2.0 * shape[0] * shape[1] * shape[2] / \
        system.matrix.peak_flops(int(code))
      t = np.where(t > 0, np.maximum(t - cast, floor), t)
    if key == 'fp8' and kernels.block_scaled_ratio != 1.0:
      t = t * np.where(block_scaled, kernels.block_scaled_ratio, 1.0)
    return chunks * count * t
  if np.ndim(dtype) == 0:
    return one(dtype)
  codes = np.unique(dtype)
  if len(codes) == 1:
    return one(codes[0])
  out = 0.0
  for code in codes:
    out = np.where(dtype == code, one(code), out)
  return out


class LinearOverlapped(Layer):
  """A TP-sharded GEMM whose communication is tiled and overlapped with
  compute (Wang et al. 2022, "Overlap communication with dependent
  computation via decomposition"; Calculon's ring and pipe schedules).

  ``conjugate=False``: all-gather (or identity) before the GEMM, the output
  width is sharded; ``conjugate=True``: reduce-scatter (or all-reduce) after
  it, the input width is sharded.  The GEMM and its communication are cut in
  ``tp`` tiles.

  Where ``ctx.tp_overlap_rs_dgrad`` is false, the backward reduce-scatter
  (all-reduce) of a ``conjugate=False`` layer's input gradient is not
  tiled: it runs whole after the input-gradient GEMM and is all exposed.
  PyTorch's micro-pipeline TP (torch/_inductor/fx_passes/
  micro_pipeline_tp.py, ``fuse_matmul_reduce_scatter``) decomposes a
  reduce-scatter only when a single matmul produces its input
  (``_find_producer_matmul``); where a model keeps the query, key and
  value projections, or the gate and up projections, as separate linear
  layers (torchtitan's Llama: ``wq``, ``wk``, ``wv``; ``w1``, ``w3``),
  autograd sums their input gradients before the reduce-scatter, which
  therefore stays a plain collective.  Transformer Engine's fused QKV and
  fc1 GEMMs overlap it (``ub_overlap_rs_dgrad``).
  """

  matrix = True
  linear = True

  def __init__(self, name, ctx, m, n, k, conjugate, **flags):
    tp = ctx.tp
    seq_par = ctx.seq_par
    self.conjugate = conjugate
    # The elements its plain TP communication carries (plain_comm).
    self._plain_comm_args = (m * k if conjugate else m * n,
                             flags.get('recomm', False))
    if not conjugate:
      k = k // tp
      act = where(seq_par, m * n // tp, m * n)
      act_grad = where(seq_par, m * k, 0)
    else:
      n = n // tp
      act = where(seq_par, m * n, 0)
      # Gradient of the (sharded) output plus the communication buffer.
      tile = m * k // tp
      act_grad = where(seq_par, tile, m * k) + where(seq_par, tile, m * k)
    # Casts (Layer.quantize_bytes) act on this rank's shard before the
    # narrow all-gather: the input of an all-gathered GEMM and the output
    # gradient of a reduce-scattered one are 1/tp of the GEMM's with
    # sequence parallelism.
    q_in = where(seq_par, m * n // tp, m * n) if not conjugate else m * n
    q_grad = where(seq_par, m * k // tp, m * k) if conjugate else m * k
    self.gemm = (m, n, k, 1)
    super().__init__(name, ctx, fw_flops=2.0 * m * n * k,
                     agrad_flops=2.0 * m * n * k, wgrad_flops=2.0 * m * n * k,
                     inputs=m * n, outputs=m * k, weights=n * k,
                     weight_grads=n * k, activation=act,
                     activation_grads=act_grad, optim=2 * n * k,
                     quantized_inputs=q_in, quantized_grads=q_grad, **flags)

  def _split(self, edge):
    # Reduce-scatter/all-gather instead of all-reduce: always with sequence
    # parallelism, only on pipeline edges with p2p_rs_ag.
    return self.ctx.seq_par | (self.ctx.p2p & edge)

  @property
  def plain_comm(self):
    """The same GEMM's plain TP communication (Megatron's f or g, a
    :class:`TPComm` outside the block), the untiled end of
    ``ctx.tp_overlap_efficiency``; built on first use."""
    def build():
      size, recomm = self._plain_comm_args
      return TPComm(self.name + '_plain', self.ctx, size, self.conjugate,
                    recomm=recomm)
    return self._memo('plain_comm', build)

  def comm_bytes(self, stage, edge):
    def compute():
      split = self._split(edge)
      bpe, gbpe = self.bpe, self.ctx.tp_gather_bytes
      if stage == 'fw':
        out = self.outputs * bpe if self.conjugate else \
          where(split, self.inputs * gbpe, 0.0)
      elif stage == 'agrad':
        out = where(split, self.outputs * gbpe, 0.0) if self.conjugate \
          else self.inputs * bpe
      elif stage == 'wgrad':
        out = where(self.recomm, self.comm_bytes('fw', edge), 0.0)
      else:
        out = 0.0
      return where(self.ctx.tp == 1, 0.0, out)
    return self._memo(('comm', stage, edge), compute)

  def comm_tile_bytes(self, stage, edge):
    return self.comm_bytes(stage, edge) / self.ctx.tp

  def net_time_s(self, stage, edge):
    def compute():
      ctx = self.ctx
      if stage == 'optim':
        return 0.0
      split = self._split(edge)
      net = ctx.system.networks
      size = self.comm_bytes(stage, edge)
      peers, tier = ctx.tp, ctx.tp_tier
      # Reduction arithmetic of the collective runs on the vector engine.
      red_flops = size / self.bpe * (peers - 1) / peers
      red_time = ctx.system.vector.time_s(ctx.other_dtype, red_flops)
      if self.conjugate:   # forward: reduce-scatter | all-reduce
        if stage == 'agrad':   # backward: all-gather | nothing
          out = where(split, net.time_s('all_gather', size, peers, tier), 0.0)
        else:
          comm = where(split, net.time_s('reduce_scatter', size, peers, tier),
                       net.time_s('all_reduce', size, peers, tier))
          out = comm + red_time if stage == 'fw' else \
            where(self.recomm, comm, 0.0)
      else:                # forward: all-gather | nothing
        if stage == 'agrad':   # backward: reduce-scatter | all-reduce
          out = where(split, net.time_s('reduce_scatter', size, peers, tier),
                      net.time_s('all_reduce', size, peers, tier)) + red_time
        else:
          comm = where(split, net.time_s('all_gather', size, peers, tier), 0.0)
          if stage == 'fw':
            out = comm
          else:
            out = where(self.recomm & split, comm, 0.0)
      return where(ctx.tp == 1, 0.0, out)
    return self._memo(('net', stage, edge), compute)

  def processing_time_s(self, stage):
    return _plus(self._tiled(stage)[0], self.side_time_s(stage))

  def exposed_time_for_stage_s(self, stage):
    """Exposed communication of ``stage`` (base block) after tiling."""
    return self._tiled(stage)[1]

  def _tiled(self, stage):
    def compute():
      ctx = self.ctx
      tiles = ctx.tp
      usage = ctx.tp_usage
      system = ctx.system
      flop_time = self.flops_time_s(stage)
      mem_time = self.kernel_mem_time_s(stage)
      net_time = self.net_time_s(stage, False)
      plain = system.processing_time_s(flop_time, mem_time)
      if np.ndim(net_time) == 0 and net_time == 0:
        return plain, 0.0
      # Transformer Engine runs the overlapped GEMM as chunk GEMMs
      # (tp_tile_gemms): their compute at the efficiency of their own size.
      tiled = plain
      if np.any(ctx.tp_tile_gemms):
        flop_time = where(ctx.tp_tile_gemms, self._tile_flops_time_s(stage),
                          flop_time)
        tiled = system.processing_time_s(flop_time, mem_time)
      flop_slowed = flop_time / (1 - usage)
      untiled = negate(ctx.tp_overlap_rs_dgrad) \
        if stage == 'agrad' and not self.conjugate else False
      slowed = system.processing_time_s(flop_slowed, mem_time)
      net_tile = net_time / tiles
      compute_tile = tiled / tiles
      inflection = net_tile - flop_slowed / tiles
      comm_bound = inflection > 0
      time = where(
        comm_bound, compute_tile + (tiles - 1) * (slowed / tiles),
        compute_tile + (tiles - 1) * compute_tile +
        (tiles - 1) * net_tile * usage)
      exposed = where(comm_bound, (tiles - 1) * inflection, 0.0)
      pipe = ctx.tp_overlap == TP_OVERLAP_PIPE
      time = where(pipe, time + net_tile, time)
      exposed = where(pipe, exposed + net_tile, exposed)
      # A framework's overlap may realize only part of what the tiling
      # gains (ctx.tp_overlap_efficiency): time and exposure lie that far
      # from the plain TP layers' (the GEMM and its TPComm) toward the
      # tiled ones.
      eff = ctx.tp_overlap_efficiency
      if not (np.ndim(eff) == 0 and eff == 1.0):
        plain_time = plain + self.plain_comm.processing_time_s(stage)
        plain_exposed = self.plain_comm.net_time_s(stage, False)
        time = plain_time + eff * (time - plain_time)
        exposed = plain_exposed + eff * (exposed - plain_exposed)
      no_comm = net_time == 0
      time = where(untiled, plain, time)
      exposed = where(untiled, net_time, exposed)
      return where(no_comm, plain, time), where(no_comm, 0.0, exposed)
    return self._memo(('tiled', stage), compute)

  def gemm_chunks(self, stage):
    """GEMMs the overlapped ``stage`` runs as (:func:`te_gemm_chunks`)."""
    return te_gemm_chunks(self.conjugate, stage, self.ctx.tp)

  def _tile_flops_time_s(self, stage):
    """Matrix time of ``stage``'s GEMM run as :meth:`gemm_chunks` GEMMs
    (:func:`chunked_gemm_time_s`)."""
    if self.measured(stage):
      return self._memo(('tile_flops_time', stage),
                        lambda: measured_gemm_time_s(
                          self.ctx.system, self.dtype, self.gemm, stage,
                          self.gemm_chunks(stage),
                          block_scaled=self.ctx.block_scaled_gemm))
    return self._memo(('tile_flops_time', stage), lambda: chunked_gemm_time_s(
      self.ctx.system.matrix, self.dtype, self.flops(stage),
      self.gemm_chunks(stage)))

  def exposed_net_time_s(self, stage, edge):
    return self.exposed_time_for_stage_s(stage)

  def recomm_exposed_time_s(self, edge):
    # Calculon reads the exposed time left by the last processed stage,
    # which in its block loop is the forward pass.
    return self.exposed_time_for_stage_s('fw')

  def required_bw_bytes_per_s(self, stage, edge):
    flop_slowed = self.flops_time_s(stage) / (1 - self.ctx.tp_usage)
    return self.comm_tile_bytes(stage, edge) / (flop_slowed / self.ctx.tp)


class BatchMatMul(Layer):
  """``batch`` independent GEMMs (m x n) (n x k): attention scores and
  context."""

  matrix = True

  def __init__(self, name, ctx, batch, m, n, k, **flags):
    super().__init__(name, ctx, fw_flops=batch * 2.0 * m * n * k,
                     agrad_flops=batch * 2.0 * 2 * m * n * k,
                     inputs=batch * (m * n + n * k), outputs=batch * m * k,
                     activation=batch * (m * n + n * k),
                     activation_grads=batch * m * k, **flags)


class LayerNorm(Layer):
  """Layer normalization over ``hidden`` with scale and bias (FLOP counts:
  9 forward, 14 + 7 backward per element, as in Calculon)."""

  def __init__(self, name, ctx, size, hidden, **flags):
    super().__init__(name, ctx, fw_flops=9 * size, agrad_flops=14 * size,
                     wgrad_flops=7 * size, inputs=size, outputs=size,
                     activation=size, activation_grads=size,
                     weights=2 * hidden, weight_grads=2 * hidden,
                     optim=2 * 2 * hidden, **flags)


class DropOut(Layer):
  """Dropout; keeps a 1-byte mask per element as its activation.

  ``fused`` (bool or array): the dropout runs inside the kernel of the
  residual addition that follows it (Megatron-LM's
  ``bias_dropout_add_fused_train``, one TorchScript-fused kernel for
  residual + dropout(x + bias), on unless --no-bias-dropout-fusion), so
  its forward pass moves only its mask (the residual addition's kernel
  reads x and writes the sum, as it does unfused); its backward pass is
  unchanged (the gradient times the mask, one kernel either way)."""

  def __init__(self, name, ctx, size, fused=False, **flags):
    self.fused = flag(fused)
    super().__init__(name, ctx, fw_flops=where(self.fused, 0, size),
                     agrad_flops=size, inputs=size, outputs=size,
                     activation=size, activation_grads=size, **flags)

  def activation_bytes(self):
    return self.activation

  def activation_grad_bytes(self):
    return self.activation_grads

  def _unfused_mem_bytes(self):
    return (self.inputs + self.outputs) * self.bpe + self.activation

  def fw_mem_bytes(self):
    return where(self.fused, self.activation, self._unfused_mem_bytes())

  def agrad_mem_bytes(self):
    return self._unfused_mem_bytes()


class GeLU(Layer):
  """GeLU activation; when fused into the preceding GEMM it keeps nothing
  (Calculon), or its input where the fused kernel saves it
  (``keeps_input``: Megatron-Core megatron/core/fusions/fused_bias_gelu.py
  GeLUFunction, ``ctx.save_for_backward(input, bias)``)."""

  def __init__(self, name, ctx, size, fused, keeps_input=False, **flags):
    kept = where(fused & ~np.asarray(keeps_input, dtype=bool), 0, size)
    super().__init__(name, ctx, fw_flops=8 * size, agrad_flops=13 * size,
                     inputs=size, outputs=size, activation=kept,
                     activation_grads=where(fused, 0, size), **flags)

  def agrad_mem_bytes(self):
    return self.fw_mem_bytes()


class SoftMax(Layer):
  """Softmax over attention scores (5 forward, 8 backward FLOP/element)."""

  def __init__(self, name, ctx, size, **flags):
    super().__init__(name, ctx, fw_flops=5 * size, agrad_flops=8 * size,
                     inputs=size, outputs=size, activation=size,
                     activation_grads=size, **flags)

  def agrad_mem_bytes(self):
    return self.fw_mem_bytes()


class ElementWise(Layer):
  """An element-wise binary operation (the residual addition)."""

  def __init__(self, name, ctx, size_a, size_b, **flags):
    size = np.maximum(size_a, size_b)
    super().__init__(name, ctx, fw_flops=size, agrad_flops=size_a + size_b,
                     inputs=size_a + size_b, outputs=size,
                     activation=size_a + size_b, activation_grads=size,
                     **flags)


class WeightedCombine(ElementWise):
  """The combine of a Mixture-of-Experts layer: each token's k expert
  outputs scaled by their router probabilities and summed (Megatron-Core
  ``moe_utils.unpermute``: the multiplication by the probabilities, then a
  scatter-add).  Time as an element-wise operation on the ``dispatched``
  (tokens x k x h) outputs; for the backward pass it keeps the expert
  outputs (the probabilities' gradient) and the fp32 probabilities (the
  outputs' gradient), ``probs`` = tokens x k; the scatter-add keeps only
  indices.  ``probs_in_activation`` (bool or array): the probabilities
  were applied in the experts' activation instead (Megatron-Core since
  commit 2659630721, April 2025, ``activation_func_with_probs``: the
  second GEMM is linear, so scaling its input scales its output), and the
  combine keeps nothing; the activation keeps the fp32 probabilities
  (counted here), its input being kept already."""

  def __init__(self, name, ctx, dispatched, probs, probs_in_activation=False,
               **flags):
    self.probs = probs
    self.probs_in_activation = flag(probs_in_activation)
    super().__init__(name, ctx, dispatched, dispatched, **flags)

  def activation_bytes(self):
    outputs = where(self.probs_in_activation, 0.0,
                    (self.activation / 2) * self.act_bpe)
    return outputs + self.probs * FP32_BYTES


class Fork(Layer):
  """Hands one activation to ``users`` consumers; sums their gradients."""

  def __init__(self, name, ctx, size, users, **flags):
    self.users = users
    super().__init__(name, ctx, inputs=size, agrad_flops=users * size,
                     activation=size, activation_grads=0, **flags)

  def fw_mem_bytes(self):
    return 0.0

  def agrad_mem_bytes(self):
    return self.activation * self.bpe * (self.users + 1)


class TPComm(Layer):
  """Tensor-parallel communication between GEMMs (Megatron's f and g
  operators; Shoeybi et al. 2019, section 3).

  ``conjugate=False`` (f): identity forward, all-reduce backward; with
  sequence parallelism all-gather forward, reduce-scatter backward.
  ``conjugate=True`` (g): the opposite.  The reduction arithmetic runs on the
  vector engine and is counted in the communication time.

  Asynchronous backward (f only, where ``ctx.tp_async`` holds): the
  all-reduce (reduce-scatter) of the input gradient runs behind the
  weight-gradient GEMMs of ``async_linears`` (the column-parallel linear
  layers f feeds), and with sequence parallelism the all-gather of their
  saved input redone for the backward pass (``async_recomm``) runs behind
  their input-gradient GEMMs; what exceeds the GEMMs shows, and the GEMMs
  slow by the tier's processor share (:func:`hidden_behind`).  Source:
  Megatron-LM ``LinearWithGradAccumulationAndAsyncCommunication.backward``
  (megatron/core/tensor_parallel/layers.py; ``async_grad_allreduce``, on
  unless --no-async-tensor-model-parallel-allreduce; with
  ``sequence_parallel`` the all-gather is issued before the input-gradient
  GEMM and the reduce-scatter before the weight-gradient GEMM), and
  Transformer Engine's ``Linear`` backward, which does the same.
  """

  def __init__(self, name, ctx, size, conjugate, async_recomm=False,
               **flags):
    tp = ctx.tp
    self.conjugate = conjugate
    self.size = size
    #: Linear layers whose backward GEMMs hide the asynchronous backward
    #: communication (set by the block builder after they are added).
    self.async_linears = ()
    self.async_recomm = flag(async_recomm)
    multi = tp > 1
    red = where(multi, size * (tp - 1) / tp, 0.0)
    io = where(multi, size, 0)
    super().__init__(name, ctx, fw_flops=red if conjugate else 0.0,
                     agrad_flops=0.0 if conjugate else red, inputs=io,
                     outputs=io, activation=io, activation_grads=io, **flags)

  def activation_bytes(self):
    bpe, tp = self.bpe, self.ctx.tp
    other = self.activation * bpe if self.conjugate else 0.0
    return where(self.ctx.seq_par, self.activation * bpe / tp, other)

  def fw_mem_bytes(self):
    if self.conjugate:
      return super().fw_mem_bytes()
    return where(self.ctx.seq_par, super().fw_mem_bytes(), 0.0)

  def activation_grad_bytes(self):
    bpe, tp = self.bpe, self.ctx.tp
    other = 0.0 if self.conjugate else self.activation_grads * bpe
    return where(self.ctx.seq_par, self.activation * bpe / tp, other)

  def agrad_mem_bytes(self):
    if not self.conjugate:
      return super().agrad_mem_bytes()
    return where(self.ctx.seq_par, super().agrad_mem_bytes(), 0.0)

  def _split(self, edge):
    return self.ctx.seq_par | (self.ctx.p2p & edge)

  def comm_bytes(self, stage, edge):
    def compute():
      split = self._split(edge)
      full = self.size * self.bpe
      # The all-gather (sequence parallelism's) of f's forward and g's
      # backward feeds GEMMs: in the narrow datatype where it carries
      # their cast input (ctx.tp_gather_bytes).
      gathered = self.size * self.ctx.tp_gather_bytes
      if stage in ('fw', 'agrad'):
        silent = (stage == 'agrad') if self.conjugate else (stage == 'fw')
        out = where(split, gathered, 0.0) if silent else full
      elif stage == 'wgrad':
        out = where(self.recomm, full, 0.0) if self.conjugate else \
          where(self.recomm & split, gathered, 0.0)
      else:
        out = 0.0
      return where(self.ctx.tp > 1, out, 0.0)
    return self._memo(('comm', stage, edge), compute)

  def net_time_s(self, stage, edge):
    def compute():
      if stage == 'optim':
        return 0.0
      ctx = self.ctx
      net = ctx.system.networks
      split = self._split(edge)
      size = self.comm_bytes(stage, edge)
      peers, tier = ctx.tp, ctx.tp_tier
      own = Layer.processing_time_s(self, stage)
      if self.conjugate:
        fw = where(split, net.time_s('reduce_scatter', size, peers, tier),
                   net.time_s('all_reduce', size, peers, tier))
        bw = where(split, net.time_s('all_gather', size, peers, tier), 0.0)
      else:
        fw = where(split, net.time_s('all_gather', size, peers, tier), 0.0)
        bw = where(split, net.time_s('reduce_scatter', size, peers, tier),
                   net.time_s('all_reduce', size, peers, tier))
      if stage == 'fw':
        out = fw + own
      elif stage == 'agrad':
        out = bw + own
      else:
        out = where(self.recomm, fw + own, 0.0)
      return where(ctx.tp > 1, out, 0.0)
    return self._memo(('net', stage, edge), compute)

  def _async_hidden(self, stage, edge, window_stage, cond):
    """Exposed part of ``stage``'s communication where ``cond`` holds:
    hidden behind the ``window_stage`` GEMMs of :attr:`async_linears`."""
    comm = self.net_time_s(stage, edge)
    on = and_flags(self.ctx.tp_async, cond)
    if self.conjugate or not self.async_linears or on is False:
      return comm
    def compute():
      window = 0.0
      for layer in self.async_linears:
        window = window + where(layer.present,
                                layer.processing_time_s(window_stage), 0.0)
      return where(on, hidden_behind(comm, window, self.ctx.tp_usage), comm)
    return self._memo(('async', stage, edge), compute)

  def exposed_net_time_s(self, stage, edge):
    if stage != 'agrad':
      return self.net_time_s(stage, edge)
    return self._async_hidden('agrad', edge, 'wgrad', True)

  def recomm_exposed_time_s(self, edge):
    return self._async_hidden('wgrad', edge, 'agrad',
                              and_flags(self.async_recomm,
                                         self._split(edge)))

  def processing_time_s(self, stage):
    # Its time is all communication, accounted in net_time_s.
    return 0.0


# -- layers of modern transformers ---------------------------------------------

class RMSNorm(Layer):
  """RMS normalization over ``hidden`` with a scale and no bias (Zhang and
  Sennrich 2019, "Root Mean Square Layer Normalization", eq. 4).

  FLOP per element: Calculon's LayerNorm count (9 forward, 14 + 7
  backward) without the centering (mean and subtraction: 2 forward, 4
  backward) and the bias (1 forward, 3 weight-gradient): 6, 10 and 4.
  Weights: the scale only (``hidden``).
  """

  def __init__(self, name, ctx, size, hidden, **flags):
    super().__init__(name, ctx, fw_flops=6 * size, agrad_flops=10 * size,
                     wgrad_flops=4 * size, inputs=size, outputs=size,
                     activation=size, activation_grads=size,
                     weights=hidden, weight_grads=hidden, optim=2 * hidden,
                     **flags)


class SwiGLU(Layer):
  """Gated activation of a gated MLP, ``act(gate) * up`` (Shazeer 2020,
  "GLU Variants Improve Transformer", eq. 6): reads the 2 x ``size`` output
  of the fused gate/up GEMM, writes ``size``.  It keeps its input (both
  halves) for the backward pass unless fused into the GEMM (then, as
  Calculon's fused GeLU, it keeps nothing), or fused where the fused
  kernel still saves its input (``keeps_input``: Megatron-Core
  megatron/core/fusions/fused_bias_swiglu.py BiasSwiGLUFunction,
  ``ctx.save_for_backward(input_for_backward, bias)``).  FLOP per output
  element: 6 forward (SiLU: negate, exp, add, divide, multiply; the gating
  product), 13 backward (as Calculon's GeLU).
  """

  def __init__(self, name, ctx, size, fused, keeps_input=False, **flags):
    kept = where(fused & ~np.asarray(keeps_input, dtype=bool), 0, 2 * size)
    super().__init__(name, ctx, fw_flops=6 * size, agrad_flops=13 * size,
                     inputs=2 * size, outputs=size, activation=kept,
                     activation_grads=where(fused, 0, size), **flags)

  def agrad_mem_bytes(self):
    return self.fw_mem_bytes()


class RoPE(Layer):
  """Rotary position embedding applied to the queries and keys (Su et al.
  2021, "RoFormer", eq. 34: x cos + rotate(x) sin): 3 FLOP per element
  forward and backward; it keeps nothing (cos and sin are recomputed)."""

  def __init__(self, name, ctx, size, **flags):
    super().__init__(name, ctx, fw_flops=3 * size, agrad_flops=3 * size,
                     inputs=size, outputs=size, activation=0,
                     activation_grads=size, **flags)

  def agrad_mem_bytes(self):
    return self.fw_mem_bytes()


#: FlashAttention-2 tile width along the sequence (Dao 2023,
#: "FlashAttention-2", section 3.3: block sizes {64, 128}).
FLASH_TILE = 128
#: Head width at which fused-attention efficiencies are quoted (the
#: FlashAttention papers' and the system files' figures are for 128).
REFERENCE_HEAD_DIM = 128
#: Per-score work a fused attention kernel does besides its two GEMMs
#: (softmax: max, exponential, sum, rescale), in head-width units: the
#: matmul work per score is proportional to the head width d, the softmax
#: work is not, so the kernel's FLOP rate goes as d / (d + 39).  39 is
#: what FlashAttention-3's published H100 benchmarks give for head width 64
#: against 128 (Shah et al. 2024, arXiv 2407.08608, figures 5 and 6,
#: sequence 16k, BF16, forward and backward weighted by their FLOP 1 : 2.5:
#: FlashAttention-3 0.82 and cuDNN 0.80 of the head-width-128 rate, i.e.
#: 0.81 = (128 + x) / (2 (64 + x)), x = 39).  The same figure then gives
#: head width 256 1.13x the 128 rate; the paper's forward is 1.14x (740
#: against 648 TFLOP/s).  Section 3 of the paper names the cause: an H100
#: has 989 TFLOP/s of matmul but 3.9 TFLOP/s of exponential.
SOFTMAX_HEAD_DIM_EQUIV = 39.0


def head_dim_factor(head_size, v_size):
  """Fused-attention speed at these head widths relative to width 128
  (:data:`SOFTMAX_HEAD_DIM_EQUIV`): ``r(d) / r(128)`` with ``r(d) = d / (d +
  39)`` and ``d`` the mean of the query/key and value widths (their two
  GEMMs; 160 for DeepSeek's MLA, 192 and 128).  1 at 128; about 0.81 at 64;
  about 1.13 at 256."""
  d = (head_size + v_size) / 2.0
  x = SOFTMAX_HEAD_DIM_EQUIV
  return (d / (d + x)) / (REFERENCE_HEAD_DIM / (REFERENCE_HEAD_DIM + x))


#: Per-query-tile work of a fused attention kernel besides its key tiles
#: (loading the query tile, the epilogue that normalizes and writes the
#: output and log-sum-exp; the backward's per-tile prologues), in key tiles'
#: worth: a query tile that visits T key tiles runs at T / (T + 9.7) of the
#: kernel's long-sequence rate.  Fitted to PyTorch 2.11's FlashAttention-2
#: and cuDNN 9.19 kernels on an H100 SXM, causal, bfloat16, 32 heads of
#: 128, forward + backward at 2k-32k tokens, each relative to its rate at
#: 16k (benchmarks/gpu_attention.py; docs/profile.md, "A GPU run"): both
#: kernels within 9 %; FlashAttention-2's own paper shows the same rise
#: with the sequence (Dao 2023, figure 4).
FLASH_TILE_OVERHEAD = 9.7
#: Sequence at which the system files' fused-attention efficiencies are
#: quoted (FlashAttention-3's figures 5 and 6 at 16k; FlashAttention-4's
#: peak): the sequence factor is 1 there.
REFERENCE_SEQ = 16384


def sequence_factor(q_len, tile_fraction):
  """Fused-attention speed for query length ``q_len`` (per rank, one
  kernel's) relative to its speed at :data:`REFERENCE_SEQ` tokens of causal
  attention: each query tile visits T = ``tile_fraction`` x ceil(q_len /
  128) key tiles on average (``tile_fraction``: :func:`causal_tile_fraction`
  or the windowed one; with context parallelism each ring step's kernel
  sees the local keys), and runs at T / (T + :data:`FLASH_TILE_OVERHEAD`)
  of its long-sequence rate, and no faster than at 16k (the kernels
  measured at 32k ran at their 16k rate).  1 from 16k causal; about 0.89
  at 8k, 0.72 at 4k, 0.54 at 2k; windows of 128 tokens about 0.19.
  Arrays broadcast."""
  t = tile_fraction * np.ceil(np.asarray(q_len, dtype=float) / FLASH_TILE)
  rate = t / (t + FLASH_TILE_OVERHEAD)
  ref_t = _REFERENCE_TILES
  # Beyond 16k the measured kernels run no faster (32k: 0.98 and 1.01 of
  # their 16k rates), where the form would keep rising (1.07 at 32k).
  return np.minimum(rate * (ref_t + FLASH_TILE_OVERHEAD) / ref_t, 1.0)


def causal_tile_fraction(seq_size):
  """Fraction of the s x s score tiles a causal FlashAttention kernel
  computes: the kernel skips fully masked tiles (Dao 2023, section 3.1.1),
  leaving n (n + 1) / 2 of n^2 tiles for n = ceil(s / tile)."""
  n = -(-seq_size // FLASH_TILE)
  return (n + 1) / (2 * n)


#: Key tiles a query tile visits in causal attention over REFERENCE_SEQ
#: tokens (where :func:`sequence_factor` is 1).
_REFERENCE_TILES = causal_tile_fraction(REFERENCE_SEQ) * \
  -(-REFERENCE_SEQ // FLASH_TILE)


def window_tile_fraction(seq_size, window):
  """Fraction of the s x s score tiles a causal sliding-window kernel
  computes: query tile i (rows iT .. iT + T - 1) needs the keys from
  iT - w + 1 to its diagonal, i.e. tiles max(0, floor((iT - w + 1) / T))
  through i; the kernel skips the rest (FlashAttention-2's local
  attention, window_size; Beltagy et al. 2020, "Longformer", section 3).
  Equals :func:`causal_tile_fraction` for w >= s."""
  n = -(-seq_size // FLASH_TILE)
  i = np.arange(n)
  first = np.maximum(0, (i * FLASH_TILE - window + 1) // FLASH_TILE)
  return float(np.sum(i - first + 1)) / (n * n)


def attention_tile_fraction(app):
  """Mean fraction of the score tiles a fused causal kernel computes over
  the application's blocks: :func:`window_tile_fraction` in its
  ``windowed_share`` of blocks, :func:`causal_tile_fraction` in the
  others (the engine prices one block shape; the sum over blocks is exact,
  a pipeline stage holds the average)."""
  causal = causal_tile_fraction(app.seq_size)
  share = app.windowed_share
  if not share:
    return causal
  return share * window_tile_fraction(app.seq_size, app.sliding_window) + \
    (1 - share) * causal


class FlashAttention(Layer):
  """Fused attention core, FlashAttention-2 (Dao 2023): scores and softmax
  stay on chip, never stored.

  Args:
    heads: batch x local query heads.
    q_len, kv_len: query and key/value lengths (with context parallelism
      the local queries see every key).
    head_size, v_size: query/key and value head widths.
    kv_elems: elements of the local K and V read and kept.
    causal: the fraction of the score tiles computed
      (:func:`causal_tile_fraction`).

  FLOP: forward 2 GEMMs (Q K^T and P V); backward 5 (recomputed Q K^T,
  dV, dP, dQ, dK; Dao 2023, algorithm 2), i.e. 2.5 x forward.  Memory kept
  for the backward pass: Q, K, V and the fp32 log-sum-exp per query and
  head (the output O is the next projection's stored input); traffic:
  Q, K, V read, O written (forward), plus dO, O read and dQ, dK, dV written
  (backward).
  """

  matrix = True

  def __init__(self, name, ctx, heads, q_len, kv_len, head_size, v_size,
               kv_elems, causal, **flags):
    # In float64: the score count heads x s^2 exceeds int64 at the
    # registry's bounds (exact below 2^53).
    scores = np.float64(heads) * q_len * kv_len
    qk = scores * head_size * causal
    pv = scores * v_size * causal
    fw = 2.0 * qk + 2.0 * pv
    q_elems = heads * q_len * head_size
    o_elems = heads * q_len * v_size
    self.lse_elems = heads * q_len
    #: (head width, query length, batch x heads): the measured attention
    #: table's coordinates (:meth:`flops_time_s`).
    self.attention_shape = (head_size, q_len, heads)
    self.head_dim_factor = head_dim_factor(head_size, v_size)
    self.sequence_factor = sequence_factor(q_len, causal)
    super().__init__(name, ctx, fw_flops=fw, agrad_flops=2.0 * fw + 2.0 * qk,
                     inputs=q_elems + kv_elems, outputs=o_elems,
                     activation=q_elems + kv_elems, activation_grads=o_elems,
                     **flags)

  def activation_bytes(self):
    return self.activation * self.act_bpe + self.lse_elems * FP32_BYTES

  def agrad_mem_bytes(self):
    return (self.inputs + 2 * self.outputs + self.activation_grads +
            self.inputs) * self.bpe

  def flops_time_s(self, stage):
    """Compute time at the matrix engine's efficiency for the FLOP count,
    divided by the system's ``fused_attention_efficiency`` when it has one:
    fused attention does not reach GEMM efficiency (FlashAttention-2 runs
    at about 35 % of an H100's peak where large GEMMs reach 70-80 %; Shah
    et al. 2024, "FlashAttention-3", section 1 and figure 5; FA3: 75 %),
    and, with it or without, by :func:`head_dim_factor` and
    :func:`sequence_factor` (the efficiency is quoted at head width 128 and
    16k tokens; a file without one runs the kernel at the GEMMs' rate
    there, the two factors being the kernel's own: a calibration's
    attention scale at 1 prices the same as the file).  On a system with a
    measured attention table: :meth:`_measured_time_s` instead."""
    if self.measured(stage):
      return self._memo(('measured_attention', stage),
                        lambda: self._measured_time_s(stage))
    time = super().flops_time_s(stage)
    if stage == 'optim':
      return time
    eff = self.ctx.system.fused_attention_efficiency
    factors = self.head_dim_factor * self.sequence_factor
    return time / (factors if eff is None else eff * factors)


  def measured(self, stage):
    """True when the system has a measured attention table and ``stage``
    is the forward or the backward of a 16-bit kernel (the table's)."""
    from calculon.config.execution import DATATYPE_NAMES
    kernels = self.ctx.system.measured
    if kernels is None or not kernels.has_attention or \
        stage not in ('fw', 'agrad'):
      return False
    codes = np.unique(self.dtype) if np.ndim(self.dtype) else [self.dtype]
    return all(DATATYPE_NAMES[int(c)] in ('bfloat16', 'float16')
               for c in codes)

  def _measured_time_s(self, stage):
    """The forward at the measured causal attention kernel's FLOP/s for
    this head width, query length and head count (:meth:`~calculon.
    kernels.tables.MeasuredKernels.attention_flops_per_s`; the layer's own
    FLOP, so causal masking, a sliding window and context parallelism's
    longer key range scale it), slowed by the system's
    ``fused_attention_efficiency`` over the one the table stands for
    (``measured.attention.fused_attention_efficiency``, the best kernel's:
    a rule naming a slower kernel lowers the former); the backward that
    forward time x
    :data:`~calculon.kernels.tables.ATTENTION_BACKWARD_RATIO` x (the
    backward's FLOP / 2.5 x the forward's: 1 for equal head widths)."""
    from calculon.kernels.tables import ATTENTION_BACKWARD_RATIO
    system = self.ctx.system
    rate = system.measured.attention_flops_per_s(*self.attention_shape)
    # A kernel slower than the one measured (the system's
    # fused_attention_efficiency lowered from the one the table stands
    # for: FlashAttention-2 on Hopper) runs that much slower.
    ref = system.measured.attention_reference_efficiency
    eff = system.fused_attention_efficiency
    if eff is not None and ref is not None:
      rate = rate * (np.asarray(eff) / ref)
    fw = self.fw_flops / rate
    if stage == 'fw':
      return fw
    with np.errstate(divide='ignore', invalid='ignore'):
      share = np.where(self.fw_flops > 0,
                       self.agrad_flops / (2.5 * self.fw_flops), 1.0)
    return fw * ATTENTION_BACKWARD_RATIO * share


class ContextParallelMerge(Layer):
  """Merge of the partial results of context parallelism's ring steps
  (Liu et al. 2023, "Ring Attention", section 3; Megatron-Core CP with
  Transformer Engine ``AttnFuncWithCPAndKVP2P``, PyTorch's
  ``_templated_ring_attention``).  Each of the ``steps`` (= CP) attention
  kernels of a layer writes its partial output and log-sum-exp to memory;
  the output is rescaled and summed outside the kernel, an element-wise
  pass over memory per step (Transformer Engine
  ``flash_attn_fwd_out_correction_init`` for the first step: read the
  partial output, write the running one; ``flash_attn_fwd_out_correction``
  for each later step: ``out.add_(out_per_step * exp(lse_step - lse))``,
  read both, write the running one; PyTorch ``_SDPAMerger.step`` likewise,
  in float32).  The backward pass accumulates the per-step gradients the
  same way: dQ of the local queries, and dK, dV of the key/value chunk the
  step handled (Transformer Engine ``dq.add_``, ``dkv.add_``; PyTorch
  ``grad_query += grad_query_``).

  Args:
    o_elems, q_elems, kv_elems: elements of the local output, queries and
      key/value chunk (K and V together).
    steps: ring steps per layer (the CP degree, array).

  Traffic (datatype width, the frameworks' default; PyTorch's float32
  accumulation moves more): forward ``o_elems x (3 steps - 1)``, backward
  ``(q_elems + kv_elems) x (3 steps - 1)`` elements; 2 FLOP per merged
  element forward (scale, add), 1 backward (add).  It keeps nothing.
  Absent without CP (``steps`` 1).
  """

  def __init__(self, name, ctx, o_elems, q_elems, kv_elems, steps, **flags):
    self.passes = 3 * steps - 1
    self.grad_elems = q_elems + kv_elems
    super().__init__(name, ctx, fw_flops=2 * o_elems * (steps - 1),
                     agrad_flops=self.grad_elems * (steps - 1),
                     inputs=o_elems, outputs=o_elems, activation=0,
                     activation_grads=0, **flags)

  def fw_mem_bytes(self):
    return self.outputs * self.passes * self.bpe

  def agrad_mem_bytes(self):
    return self.grad_elems * self.passes * self.bpe


class EmbeddingLookup(Layer):
  """Vocabulary-parallel input embedding (Megatron-LM
  ``VocabParallelEmbedding``): each TP rank holds ``vocab / TP`` rows and
  gathers the rows of its tokens (``size`` = tokens x h outputs, zeros for
  tokens it does not own); a learned position table (``positions`` x h,
  replicated) is added.  No FLOP but the addition; the weight gradient is a
  scatter-add of the output gradient into the table.
  """

  def __init__(self, name, ctx, size, table, positions, **flags):
    super().__init__(name, ctx, fw_flops=where(positions > 0, size, 0),
                     wgrad_flops=size * where(positions > 0, 2, 1),
                     inputs=size, outputs=size, activation=0,
                     activation_grads=size, weights=table + positions,
                     weight_grads=table + positions,
                     optim=2 * (table + positions), **flags)

  def fw_mem_bytes(self):
    return (self.inputs + self.outputs) * self.bpe

  def agrad_mem_bytes(self):
    return 0.0

  def wgrad_mem_bytes(self):
    return 2 * self.activation_grads * self.bpe


class CrossEntropy(Layer):
  """Vocabulary-parallel softmax cross-entropy over ``size`` = tokens x
  vocab / TP logits (Megatron-LM ``vocab_parallel_cross_entropy``): the
  softmax is kept in fp32 for the backward pass.  FLOP per logit: 5
  forward (max, subtract, exp, sum, divide), 2 backward (softmax minus the
  one-hot target, scaled).  The three TP all-reduces of tokens-sized fp32
  vectors (max, sum, target logit) are negligible and not priced.

  Memory traffic per logit (b = the logits' bytes, 2 for 16-bit):
  ``unfused`` False (fused kernels: Transformer Engine's cross-entropy,
  Megatron-Core --cross-entropy-loss-fusion): 2b forward (read the logits,
  write the result), 4 + b backward (read the fp32 softmax, write the
  gradient).  ``unfused`` True (Megatron-LM megatron/core/tensor_parallel/
  cross_entropy.py without the fusion): forward, the cast to fp32 (b + 4),
  max (4), subtract in place (8), exp in place (8), sum (4), divide in
  place (8): 36 + b; backward, the saved softmax scaled in place (8) and
  cast back to the logits' datatype (4 + b): 12 + b.  PyTorch's
  ``cross_entropy`` on fp32 logits (torchtitan) moves about as much (48
  bytes at b = 2, against 52).  Float32 logits skip the casts.

  ``compiled`` True (torchtitan since bbb1b616e, 2025-04-02,
  torchtitan/components/loss.py build_cross_entropy_loss: with
  training.compile, ``torch.compile(cross_entropy_loss)`` of
  ``cross_entropy(pred.flatten(0, 1).float(), labels)``; at 9dec370 the
  compile was commented out in train.py): Inductor fuses the cast, the
  softmax and its backward.  Its forward graph saves for the backward pass
  the 16-bit logits themselves (the layer's input, no copy) and per-row max
  and logsumexp, and allocates no logits-sized buffer; the backward writes
  one 16-bit gradient (checked with PyTorch 2.13's Inductor on CPU: the
  saved tensors by ``torch.autograd.graph.saved_tensors_hooks``, the
  buffers in the generated code; eager saves two float32 logits-sized
  tensors).  So the layer keeps b bytes per logit, which are the LM head's
  output and no working copy (``activation_reused``, set by
  :func:`~calculon.llm.block.build_head`), and the gradient it writes is
  the LM head's output gradient, counted by that layer (none of its own).
  Traffic: forward the logits read by the two row reductions (2b),
  backward read once and the gradient written (2b).

  ``loss_parallel`` True (``cross_entropy_kernel`` 'eager' with TP > 1:
  torchtitan's loss inside ``torch.distributed.tensor.parallel.
  loss_parallel()``, its default with TP: torchtitan 9dec370 train.py,
  ``training.disable_loss_parallel`` False):
  DTensor runs the loss as its own decomposition
  (torch/distributed/tensor/parallel/loss.py).  Forward ``_log_softmax``:
  the cast (b + 4), max (4), ``x - max`` (8), ``exp`` (8), sum (4),
  ``shifted - logsumexp`` (8), as ``unfused`` counts, but out of place.
  Backward ``_nll_loss_and_log_softmax_backward``: ``zeros_like(x)`` (4),
  ``(grad_input + exp(x)) * grad_output`` (exp 8, add 12, multiply 8) and
  the cast back (4 + b): 32 + b where ``unfused`` moves 8 + b.  While the
  product is written it holds the saved log-softmax, the zero-filled
  ``grad_input``, the sum and the product: four float32 logits buffers
  where PyTorch's own backward holds three (the saved output, the
  nll_loss gradient and log_softmax's).  Measured on an H200 with PyTorch
  2.11 (``benchmarks/gpu_loss_memory.py``, 16 x 8,192 x 16,032 logits,
  Llama 3 70B's per-rank vocabulary at TP 8): backward peaks 3.000 and
  4.001 float32 logits buffers above the 16-bit logits, eager and
  loss-parallel; 25.2 and 47.4 ms.  So the layer's gradient working set
  gains one float32 logits buffer.
  """

  def __init__(self, name, ctx, size, unfused=False, compiled=False,
               loss_parallel=False, **flags):
    super().__init__(name, ctx, fw_flops=5.0 * size,
                     agrad_flops=2.0 * size, inputs=size, outputs=size,
                     activation=size, activation_grads=size, **flags)
    self.unfused = unfused
    self.compiled = compiled
    self.loss_parallel = loss_parallel

  def activation_bytes(self):
    fp32 = self.activation * FP32_BYTES
    if _is_zero(self.compiled):
      return fp32
    return where(self.compiled, self.activation * self.bpe, fp32)

  def activation_grad_bytes(self):
    own = super().activation_grad_bytes()
    if not _is_zero(self.loss_parallel):
      own = own + where(self.loss_parallel, self.activation * FP32_BYTES, 0.0)
    if _is_zero(self.compiled):
      return own
    return where(self.compiled, 0.0, own)

  def _cast_bytes(self):
    """Bytes per logit of one cast between the logits' datatype and fp32
    (none when they are fp32)."""
    return where(self.bpe >= FP32_BYTES, 0.0, self.bpe + FP32_BYTES)

  def fw_mem_bytes(self):
    fused = super().fw_mem_bytes()
    if not _is_zero(self.compiled):
      fused = where(self.compiled, self.inputs * 2.0 * self.bpe, fused)
    if _is_zero(self.unfused):
      return fused
    return where(self.unfused, self.inputs * (
      self._cast_bytes() + 32.0), fused)

  def agrad_mem_bytes(self):
    fused = self.inputs * FP32_BYTES + self.outputs * self.bpe
    if not _is_zero(self.compiled):
      fused = where(self.compiled, self.inputs * 2.0 * self.bpe, fused)
    if _is_zero(self.unfused):
      return fused
    backward = 8.0
    if not _is_zero(self.loss_parallel):
      backward = where(self.loss_parallel, 32.0, backward)
    return where(self.unfused, self.inputs * (
      self._cast_bytes() + backward), fused)


# -- Mixture-of-Experts -------------------------------------------------------------

class GroupedLinear(Layer):
  """``experts`` GEMMs of the same shape (m x n) (n x k), one per local
  expert (a grouped GEMM): m tokens routed to each expert.  Each GEMM runs
  at the efficiency of its own size.  ``expert=True``: routed-expert
  weights (sharded and reduced over the expert data-parallel ranks)."""

  matrix = True
  linear = True

  def __init__(self, name, ctx, experts, m, n, k, expert=True, **flags):
    self.experts = experts
    self.expert = expert
    # Priced from a measured table as one GEMM over all local experts'
    # tokens (a grouped GEMM is one kernel: DeepGEMM's and Transformer
    # Engine's grouped GEMMs, cuBLAS grouped GEMM), the grouped-GEMM
    # efficiency applied on top.
    self.gemm = (experts * m, n, k, 1)
    self.gemm_wgrad = (m, n, experts * k, 1)
    gemm = 2.0 * m * n * k
    super().__init__(name, ctx, fw_flops=experts * gemm,
                     agrad_flops=experts * gemm, wgrad_flops=experts * gemm,
                     inputs=experts * m * n, outputs=experts * m * k,
                     weights=experts * n * k, weight_grads=experts * n * k,
                     activation=experts * m * n,
                     activation_grads=experts * m * k,
                     optim=2 * experts * n * k,
                     quantized_inputs=experts * m * n,
                     quantized_grads=experts * m * k, **flags)

  def flops_time_s(self, stage):
    if stage == 'optim':
      return super().flops_time_s(stage)

    def compute():
      each = self.flops(stage) / self.experts
      with np.errstate(divide='ignore', invalid='ignore'):
        if self.measured(stage):
          t = measured_gemm_time_s(
            self.ctx.system, self.dtype,
            self.gemm_wgrad if stage == 'wgrad' else self.gemm, stage,
            block_scaled=self.ctx.block_scaled_gemm)
        else:
          t = self.ctx.system.matrix.time_s(self.dtype, each) * self.experts
      t = where(self.experts == 0, 0.0, np.nan_to_num(t))
      # A grouped GEMM of many small per-expert problems does not reach the
      # efficiency of a dense GEMM of the same size (DeepSeek-AI DeepGEMM
      # README: grouped FP8 GEMMs for MoE run below the dense ones); the
      # system's grouped_gemm_efficiency says by how much (absent: 1).
      eff = self.ctx.system.grouped_gemm_efficiency
      return t if eff is None else t / eff
    return self._memo(('flops_time', stage), compute)


class ExpertComm(Layer):
  """Token dispatch or combine among the expert-parallel ranks (Megatron-Core
  ``MoEAlltoAllTokenDispatcher``: permute, all-to-all, ...; Lepikhin et al.
  2020, GShard, section 2.2).

  Args:
    size: elements this rank sends (tokens x top_k x hidden).
    peers: EP ranks; tier: their network tier.
    op: 'all_to_all', or with the all-gather dispatcher 'all_gather'
      (dispatch: every rank gathers all tokens, ``size`` the gathered
      buffer) / 'reduce_scatter' (combine).
    node_dedup: for the all-to-all, None or (on, E, k[, G, Gk]): where
      ``on`` (the ``deepep`` dispatcher), the traffic across nodes is sent
      once per token and destination node (:meth:`ep_time_s`); E experts,
      top-k, and with group-limited routing G groups of which a token uses
      at most Gk (None: no limit).

  The backward pass runs the mirror operation on the gradients (same
  bytes).  Its time is reported as expert-parallel communication, not TP.
  """

  def __init__(self, name, ctx, size, peers, tier, op, node_dedup=None,
               **flags):
    self.size, self.peers, self.tier, self.op = size, peers, tier, op
    self.node_dedup = node_dedup
    super().__init__(name, ctx, inputs=size, outputs=size, activation=0,
                     activation_grads=0, **flags)

  def ep_bytes(self):
    return where(self.peers > 1, self.size * self.bpe, 0.0)

  def ep_time_s(self):
    """Seconds of the operation on the link (forward; the backward mirror
    takes the same).

    An all-to-all whose group spans the nodes of tier ``tier`` (> 0) sends
    to each peer directly (NCCL implements all-to-all as point-to-point
    send/receive pairs, nccl-tests ``alltoall_perf``): the share bound for
    peers on the same node (the q - 1 of p peers a node of tier ``tier -
    1`` holds, the group's ranks being consecutive) stays on that node's
    faster tier while the rest crosses the network, both at once; the time
    is the slower of the two (DeepSeek-AI 2024, DeepSeek-V3 section 3.2.2,
    dispatches over InfiniBand and NVLink concurrently).  With
    ``node_dedup`` on (DeepEP, HybridEP), a token goes to each rank that
    holds one of its experts once, not once per expert
    (:meth:`rank_dedup_bytes`), and across nodes once per node, see
    :meth:`_node_dedup_times_s`."""
    def compute():
      net = self.ctx.system.networks
      n, p, tier = self.ep_bytes(), self.peers, self.tier
      t = net.time_s(self.op, n, p, tier)
      dedup = self.op == 'all_to_all' and self.node_dedup is not None and \
        self.node_dedup[0] is not False
      if dedup:
        on, experts, k = self.node_dedup[:3]
        groups = tuple(self.node_dedup[3:5]) or (None, None)
        with np.errstate(divide='ignore', invalid='ignore'):
          # time_s applies the all-to-all's (p - 1) / p: undo it for bytes
          # already counted per rank.
          n_rank = self.rank_dedup_bytes(n, p, experts, k, *groups) * p / \
            np.maximum(p - 1, 1)
        t = np.where(on, net.time_s(self.op, n_rank, p, tier), t)
      if self.op == 'all_to_all' and np.any(np.asarray(tier) > 0):
        below = np.maximum(np.asarray(tier) - 1, 0)
        q = np.minimum(p, net.size[below])
        with np.errstate(divide='ignore', invalid='ignore'):
          inter = net.time_s(self.op, n * (p - q) / np.maximum(p - 1, 1), p,
                             tier)
          intra = net.time_s(self.op, n * q / p, np.maximum(q, 1), below)
          if dedup:
            dedup_inter, dedup_intra = self._node_dedup_times_s(
              net, n, p, q, tier, below, experts, k, *groups, n_rank)
            inter = np.where(on, dedup_inter, inter)
            intra = np.where(on, dedup_intra, intra)
        split = (np.asarray(tier) > 0) & (q > 1) & (q < p)
        t = np.where(split, np.maximum(inter, intra), t)
      return where(self.peers > 1, t, 0.0)
    return self._memo(('ep', ), compute)

  @staticmethod
  def remote_nodes_per_token(nodes, experts, k, groups=None, group_topk=None):
    """Expected number of nodes other than its own that a token's k
    experts lie on (the nodes DeepEP sends it to), with balanced routing.

    Args (arrays broadcast): nodes N holding the E ``experts`` evenly and
    in order; top-``k`` distinct experts per token; ``groups`` G and
    ``group_topk`` Gk: group-limited routing (G groups of E / G consecutive
    experts, a token's experts drawn from Gk of them; None: any k of E).

    Without groups a given other node holds none of the token's experts
    with probability C(E - E/N, k) / C(E, k), so R = (N - 1)(1 - C(E - E/N,
    k) / C(E, k)).  With groups, the token picks Gk of the G groups
    uniformly, then k of their Gk E / G experts (DeepSeek-AI 2024,
    DeepSeek-V3 section 2.1.2, "node-limited routing": with one group per
    node, at most Gk = 4 nodes): when a node holds whole groups (G a
    multiple of N), the number m of its groups chosen is hypergeometric
    (G, G / N, Gk) and it is missed with probability C((Gk - m) E / G, k)
    / C(Gk E / G, k); when a group spans N / G nodes (N a multiple of G),
    a node is reached only if its group is chosen (Gk / G) and then one of
    the k experts is among its E / N.  Other layouts use the formula
    without groups.  Every node is alike, so R = (N - 1) / N x the
    expected number of nodes reached.
    """
    from scipy.special import comb
    nodes = np.asarray(nodes, dtype=float)

    def missed(pool, away):
      # Probability that k distinct picks from ``pool`` avoid ``away``.
      out = 1.0
      for i in range(k):
        out = out * np.clip((pool - away - i) / (pool - i), 0, 1)
      return out

    per_node = experts / nodes
    plain = 1 - missed(experts, per_node)
    if groups is None or groups <= 1:
      return (nodes - 1) * plain
    chosen = group_topk * experts / groups
    per_group = experts / groups
    groups_per_node = groups / nodes
    whole = (np.mod(groups, nodes) == 0)
    split = (np.mod(nodes, groups) == 0) & ~whole
    hit_whole = 0.0
    for m in range(1, group_topk + 1):
      pmf = comb(groups_per_node, m) * comb(groups - groups_per_node,
                                            group_topk - m) / \
        comb(groups, group_topk)
      hit_whole = hit_whole + np.nan_to_num(pmf) * (
        1 - missed(chosen, m * per_group))
    hit_split = group_topk / groups * (1 - missed(chosen, per_node))
    hit = np.where(whole, hit_whole, np.where(split, hit_split, plain))
    return (nodes - 1) * hit

  @classmethod
  def rank_dedup_bytes(cls, n, p, experts, k, groups=None, group_topk=None):
    """Bytes a rank sends to the other ranks of a DeepEP or HybridEP
    dispatch (and, mirrored, receives back in its combine): ``n`` (tokens x
    k x h x bytes, one copy per selected expert, as Megatron-Core's
    all-to-all dispatcher sends them) x R / k, with R the expected number
    of other ranks a token's k experts lie on
    (:meth:`remote_nodes_per_token` over the p ranks).

    DeepEP sends each token to a rank once whatever the number of its
    experts there (deepseek-ai/DeepEP deep_ep/buffer.py at 04b06f7a:
    ``Buffer.get_dispatch_layout`` returns ``is_token_in_rank``, "[num_tokens,
    num_ranks] ... whether a token be sent to a rank", and ``dispatch``
    takes ``x`` as [num_tokens, hidden]); the combine returns one row per
    received token after the rank has summed its experts' outputs.
    Megatron-Core's flex dispatcher hands DeepEP the tokens and its layout
    (megatron/core/transformer/moe/fused_a2a.py ``FusedDispatch`` at
    d98e8a64dd, ``buffer.get_dispatch_layout``), in 16 bits ("HybridEP
    dispatcher does not support fp8 dispatch now", same file).
    HybridEP does the same: "dispatch_in_forward -> local_permute ->
    expert_mlp -> local_unpermute -> combine_in_forward" (DeepEP
    deep_ep/hybrid_ep_buffer.py at 017a5202, ``HybridEpBuffer.dispatch``),
    the copies per local expert made after the transfer.  Balanced
    routing.

    Args (arrays broadcast): n bytes with one copy per expert; p ranks;
    E ``experts``; top-``k``; group-limited routing as
    :meth:`remote_nodes_per_token`.
    """
    ranks = cls.remote_nodes_per_token(np.maximum(p, 1), experts, k, groups,
                                       group_topk)
    return n * ranks / k

  @staticmethod
  def _node_dedup_times_s(net, n, p, q, tier, below, experts, k,
                          groups, group_topk, n_rank):
    """(across-node, inside-node) seconds of a DeepEP-style all-to-all
    (DeepSeek-AI 2024, DeepSeek-V3 section 3.2.2; deepseek-ai/DeepEP
    "normal kernels"): a token bound for experts on another node crosses
    the network once to that node's GPU of the same local index (one
    NIC per GPU), which forwards it over NVLink to the GPUs of its
    experts.  With the p EP ranks on N = p / q nodes and the E experts
    spread evenly, a node other than the token's own hosts none of its k
    (distinct) experts with probability C(E - E/N, k) / C(E, k), so a
    token crosses to R = (N - 1) (1 - C(E - E/N, k) / C(E, k)) nodes on
    average: ``n * R / k`` bytes per rank over the network instead of
    Calculon-style ``n (p - q) / p`` (n = tokens x k x h x bytes, the
    k copies).  Every token then crosses NVLink once to each other rank
    holding one of its experts (directly or forwarded from the GPU that
    received it; counting the forwarding GPU's own experts too, an upper
    bound): ``n_rank`` bytes on the tier below (:meth:`rank_dedup_bytes`,
    as ``ep_time_s`` passes it, with the all-to-all's (p - 1) / p
    undone).
    Balanced routing; the tokens keep their 16-bit datatype, as
    Megatron-Core's DeepEP path sends them (``FusedDispatch``,
    megatron/core/transformer/moe/fused_a2a.py); with group-limited
    routing (``groups``, ``group_topk``; DeepSeek-V3's node-limited
    routing) R is :meth:`remote_nodes_per_token`'s; DeepSeek's FP8
    dispatch is not modeled."""
    nodes = p / np.maximum(q, 1)
    remote = ExpertComm.remote_nodes_per_token(nodes, experts, k, groups,
                                               group_topk)
    # time_s applies the all-to-all's (p - 1) / p: undo it for the
    # across-node bytes, which are already per rank.
    inter = net.time_s('all_to_all', n * remote / k * p / np.maximum(p - 1, 1),
                       p, tier)
    intra = net.time_s('all_to_all', n_rank, p, below)
    return inter, intra

  def fw_mem_bytes(self):
    return 0.0

  def agrad_mem_bytes(self):
    return 0.0

  def processing_time_s(self, stage):
    return 0.0
