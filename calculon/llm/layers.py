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


class BlockContext:
  """Execution quantities shared by all layers of a block.

  Attributes (arrays broadcastable over the executions):
    system: the :class:`~calculon.hardware.System`.
    dtype: datatype code; bytes_per_element: its size in bytes.
    optimizer_shards: processors sharing the optimizer state (DP when
      optimizer sharding is on, else 1).
    tp: tensor-parallel degree; tp_tier: its network tier.
    tp_comm: TP communication code; tp_overlap: TP overlap code.
  """

  def __init__(self, system, dtype, bytes_per_element, optimizer_shards, tp,
               tp_tier, tp_comm, tp_overlap):
    self.system = system
    self.dtype = dtype
    self.bytes_per_element = bytes_per_element
    self.optimizer_shards = optimizer_shards
    self.tp = tp
    self.tp_tier = tp_tier
    self.tp_comm = tp_comm
    self.tp_overlap = tp_overlap
    self.seq_par = tp_comm == TP_COMM_RS_AG
    self.p2p = tp_comm == TP_COMM_P2P_RS_AG
    self.tp_usage = system.networks.usage(tp_tier)


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
    recomm: its TP communication is redone in the backward pass.
    activation_reused: its input activation is counted by another layer.
    activation_stored / output_stored: kept until the backward pass.
    present: the layer exists for this execution (bool array or True).
  """

  matrix = False

  def __init__(self, name, ctx, *, fw_flops=0.0, agrad_flops=0.0,
               wgrad_flops=0.0, inputs=0.0, outputs=0.0, activation=0.0,
               activation_grads=0.0, weights=0.0, weight_grads=0.0, optim=0.0,
               recompute=False, recomm=False, activation_reused=False,
               activation_stored=True, output_stored=True, present=True):
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
    self.recomm = flag(recomm)
    self.activation_reused = flag(activation_reused)
    self.activation_stored = flag(activation_stored)
    self.output_stored = flag(output_stored)
    self.present = flag(present)
    self._cache = {}

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
    return self.weight_grads / self.ctx.optimizer_shards * \
      ADAM_FLOPS_PER_ELEMENT

  def fw_mem_bytes(self):
    """Forward traffic: read inputs and weights, write outputs."""
    return (self.inputs + self.outputs + self.weights) * \
      self.ctx.bytes_per_element

  def agrad_mem_bytes(self):
    """Activation-gradient traffic: weights, stored activations, grads."""
    return (self.weights + (self.activation + self.activation_grads)) * \
      self.ctx.bytes_per_element

  def wgrad_mem_bytes(self):
    """Weight-gradient traffic (none for layers without weights)."""
    if np.ndim(self.weights) == 0 and self.weights == 0:
      return 0.0
    mem = (self.weight_grads + (self.activation + self.activation_grads)) * \
      self.ctx.bytes_per_element
    return where(self.weights == 0, 0.0, mem)

  def mem_bytes(self, stage):
    """Bytes moved to/from memory tier 1 in ``stage``."""
    if stage == 'fw':
      return self.fw_mem_bytes()
    if stage == 'agrad':
      return self.agrad_mem_bytes()
    if stage == 'wgrad':
      return self.wgrad_mem_bytes()
    return self.optimizer_bytes()

  def flops_time_s(self, stage):
    """Compute time of ``stage`` on the matrix (GEMM layers) or vector
    engine; the optimizer always runs on the vector engine."""
    def compute():
      flops = self.flops(stage)
      engine = self.ctx.system.matrix if self.matrix and stage != 'optim' \
        else self.ctx.system.vector
      return engine.time_s(self.ctx.dtype, flops)
    return self._memo(('flops_time', stage), compute)

  def mem_time_s(self, stage):
    """Memory time of ``stage`` at tier-1 bandwidth for its access size."""
    return self._memo(('mem_time', stage), lambda: self.ctx.system.mem1.time_s(
      self.mem_bytes(stage)))

  def processing_time_s(self, stage):
    """Time of ``stage``: compute and memory combined per the system's
    processing mode (roofline or no overlap)."""
    return self._memo(('proc', stage), lambda: self.ctx.system.
                      processing_time_s(self.flops_time_s(stage),
                                        self.mem_time_s(stage)))

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
    return self.weights * self.ctx.bytes_per_element

  def activation_bytes(self):
    return self.activation * self.ctx.bytes_per_element

  def output_bytes(self):
    return self.outputs * self.ctx.bytes_per_element

  def weight_grad_bytes(self, sharded=True):
    """Weight gradients: in the datatype and sharded like the optimizer for
    communication, or in fp32 for accumulation (``sharded=False``)."""
    if sharded:
      return self.weight_grads * self.ctx.bytes_per_element / \
        self.ctx.optimizer_shards
    return self.weight_grads * FP32_BYTES

  def activation_grad_bytes(self):
    return self.activation_grads * self.ctx.bytes_per_element

  def optimizer_bytes(self):
    """Adam moments in fp32 plus an fp32 master copy of the weights when the
    datatype is narrower than 4 bytes, divided over the optimizer shards."""
    moments = self.optim * FP32_BYTES
    master = where(self.ctx.bytes_per_element < FP32_BYTES,
                   self.weights * FP32_BYTES, 0.0)
    return (master + moments) / self.ctx.optimizer_shards


class Linear(Layer):
  """A GEMM y = x W with x: m x n and W: n x k (m = microbatch * sequence)."""

  matrix = True

  def __init__(self, name, ctx, m, n, k, **flags):
    super().__init__(name, ctx, fw_flops=2.0 * m * n * k,
                     agrad_flops=2.0 * m * n * k, wgrad_flops=2.0 * m * n * k,
                     inputs=m * n, outputs=m * k, weights=n * k,
                     weight_grads=n * k, activation=m * n,
                     activation_grads=m * k, optim=2 * n * k, **flags)


class LinearOverlapped(Layer):
  """A TP-sharded GEMM whose communication is tiled and overlapped with
  compute (Wang et al. 2022, "Overlap communication with dependent
  computation via decomposition"; Calculon's ring and pipe schedules).

  ``conjugate=False``: all-gather (or identity) before the GEMM, the output
  width is sharded; ``conjugate=True``: reduce-scatter (or all-reduce) after
  it, the input width is sharded.  The GEMM and its communication are cut in
  ``tp`` tiles.
  """

  matrix = True

  def __init__(self, name, ctx, m, n, k, conjugate, **flags):
    tp = ctx.tp
    seq_par = ctx.seq_par
    self.conjugate = conjugate
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
    super().__init__(name, ctx, fw_flops=2.0 * m * n * k,
                     agrad_flops=2.0 * m * n * k, wgrad_flops=2.0 * m * n * k,
                     inputs=m * n, outputs=m * k, weights=n * k,
                     weight_grads=n * k, activation=act,
                     activation_grads=act_grad, optim=2 * n * k, **flags)

  def _split(self, edge):
    # Reduce-scatter/all-gather instead of all-reduce: always with sequence
    # parallelism, only on pipeline edges with p2p_rs_ag.
    return self.ctx.seq_par | (self.ctx.p2p & edge)

  def comm_bytes(self, stage, edge):
    def compute():
      split = self._split(edge)
      bpe = self.ctx.bytes_per_element
      gather = self.inputs * bpe
      reduce = self.outputs * bpe
      if stage == 'fw':
        out = reduce if self.conjugate else where(split, gather, 0.0)
      elif stage == 'agrad':
        out = where(split, reduce, 0.0) if self.conjugate else gather
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
      red_flops = size / ctx.bytes_per_element * (peers - 1) / peers
      red_time = ctx.system.vector.time_s(ctx.dtype, red_flops)
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
    return self._tiled(stage)[0]

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
      flop_slowed = flop_time / (1 - usage)
      mem_time = self.mem_time_s(stage)
      net_time = self.net_time_s(stage, False)
      plain = system.processing_time_s(flop_time, mem_time)
      if np.ndim(net_time) == 0 and net_time == 0:
        return plain, 0.0
      slowed = system.processing_time_s(flop_slowed, mem_time)
      net_tile = net_time / tiles
      compute_tile = plain / tiles
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
      no_comm = net_time == 0
      return where(no_comm, plain, time), where(no_comm, 0.0, exposed)
    return self._memo(('tiled', stage), compute)

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
  """Dropout; keeps a 1-byte mask per element as its activation."""

  def __init__(self, name, ctx, size, **flags):
    super().__init__(name, ctx, fw_flops=size, agrad_flops=size, inputs=size,
                     outputs=size, activation=size, activation_grads=size,
                     **flags)

  def activation_bytes(self):
    return self.activation

  def activation_grad_bytes(self):
    return self.activation_grads

  def fw_mem_bytes(self):
    return (self.inputs + self.outputs) * self.ctx.bytes_per_element + \
      self.activation

  def agrad_mem_bytes(self):
    return self.fw_mem_bytes()


class GeLU(Layer):
  """GeLU activation; when fused into the preceding GEMM it keeps nothing."""

  def __init__(self, name, ctx, size, fused, **flags):
    kept = where(fused, 0, size)
    super().__init__(name, ctx, fw_flops=8 * size, agrad_flops=13 * size,
                     inputs=size, outputs=size, activation=kept,
                     activation_grads=kept, **flags)

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


class Fork(Layer):
  """Hands one activation to ``users`` consumers; sums their gradients."""

  def __init__(self, name, ctx, size, users, **flags):
    self.users = users
    super().__init__(name, ctx, inputs=size, agrad_flops=users * size,
                     activation=size, activation_grads=0, **flags)

  def fw_mem_bytes(self):
    return 0.0

  def agrad_mem_bytes(self):
    return self.activation * self.ctx.bytes_per_element * (self.users + 1)


class TPComm(Layer):
  """Tensor-parallel communication between GEMMs (Megatron's f and g
  operators; Shoeybi et al. 2019, section 3).

  ``conjugate=False`` (f): identity forward, all-reduce backward; with
  sequence parallelism all-gather forward, reduce-scatter backward.
  ``conjugate=True`` (g): the opposite.  The reduction arithmetic runs on the
  vector engine and is counted in the communication time.
  """

  def __init__(self, name, ctx, size, conjugate, **flags):
    tp = ctx.tp
    self.conjugate = conjugate
    self.size = size
    multi = tp > 1
    red = where(multi, size * (tp - 1) / tp, 0.0)
    io = where(multi, size, 0)
    super().__init__(name, ctx, fw_flops=red if conjugate else 0.0,
                     agrad_flops=0.0 if conjugate else red, inputs=io,
                     outputs=io, activation=io, activation_grads=io, **flags)

  def activation_bytes(self):
    bpe, tp = self.ctx.bytes_per_element, self.ctx.tp
    other = self.activation * bpe if self.conjugate else 0.0
    return where(self.ctx.seq_par, self.activation * bpe / tp, other)

  def fw_mem_bytes(self):
    if self.conjugate:
      return super().fw_mem_bytes()
    return where(self.ctx.seq_par, super().fw_mem_bytes(), 0.0)

  def activation_grad_bytes(self):
    bpe, tp = self.ctx.bytes_per_element, self.ctx.tp
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
      full = self.size * self.ctx.bytes_per_element
      if stage in ('fw', 'agrad'):
        silent = (stage == 'agrad') if self.conjugate else (stage == 'fw')
        out = where(split, full, 0.0) if silent else full
      elif stage == 'wgrad':
        cond = self.recomm if self.conjugate else (self.recomm & split)
        out = where(cond, full, 0.0)
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

  def exposed_net_time_s(self, stage, edge):
    return self.net_time_s(stage, edge)

  def recomm_exposed_time_s(self, edge):
    return self.net_time_s('wgrad', edge)

  def processing_time_s(self, stage):
    # Its time is all communication, accounted in net_time_s.
    return 0.0
