"""Offload to memory tier 2 (the host): the traffic, what shares its link,
what the blocks do not hide, the optimizer step on the host, and the
bandwidth each offload needs.

Provides :class:`OffloadTerms` and its :data:`~OffloadTerms.CONCERN` (the
batch term ``host_optimizer_time_s``, where an execution runs its offloaded
optimizer step on the host): the bytes moved while a block runs
(``fw_offload_bytes``, ``bw_offload_bytes``) and their time on the link
(``fw_offload_time_s``, ``bw_offload_time_s``: the bytes at tier 2's rate
plus the network traffic that crosses the same link,
``fw_link_network_s``, ``bw_link_network_s``), the share of the blocks
whose activations are offloaded (``act_offload_fraction``), the part a
base or an edge block does not hide (``baseblock_fw_offload_overhead_s``,
``edgeblock_fw_offload_overhead_s``, ``baseblock_bw_offload_overhead_s``,
``edgeblock_bw_offload_overhead_s``), over the batch
(``fw_offload_exposed_time_s``, ``bw_offload_exposed_time_s``), the host's
optimizer step (``host_optimizer_step_s``, ``host_optimizer_time_s``), and
the tier-2 bandwidth each offload needs (``act_offload_bw_req``,
``weight_offload_bw_req``, ``optim_offload_bw_req``,
``offload_mem_bw_req``).

Without the system's ``host`` section and with the behaviours at their
absent values every term is Calculon's: tier 2 alone on its own link, the
optimizer state streamed through the device, every block's activations
offloaded.

Reads: ``system``, ``exe``, ``training``, ``full_recompute``, ``fsdp``,
``weight_shards``, ``cp``, ``grad_bytes`` (:mod:`~calculon.llm.terms.base`);
``block``, ``block_act_checkpoint_bytes``
(:mod:`~calculon.llm.terms.blocks`); ``blocks_per_proc`` and the base and
edge blocks' times without offload (``baseblock_fw_time_no_offload_s``,
``edgeblock_fw_time_no_offload_s``, ``baseblock_bw_time_no_offload_s``,
``edgeblock_bw_time_no_offload_s``) and
:meth:`~calculon.llm.terms.schedule.ScheduleTerms._per_chunks`
(:mod:`~calculon.llm.terms.schedule`); the network traffic of a block,
``block_fsdp_fw_s``, ``block_fsdp_bw_s`` (:mod:`~calculon.llm.terms.fsdp`),
``_cp_step_s`` (:mod:`~calculon.llm.terms.context`) and the block's
expert-parallel times; ``app``, ``optim_step_time_s``;
``act_offload_blocks`` and ``_act_offload_block_bytes``, the bytes one
offloaded block moves each way (:mod:`~calculon.llm.terms.memory`).
"""

from functools import cached_property

import numpy as np

from calculon.config.registry import (
  ACTIVATION_OFFLOAD_LAYERS_NAMES, OPTIMIZER_OFFLOAD_STEP_NAMES)
from calculon.llm.layers import ADAM_FLOPS_PER_ELEMENT
from calculon.llm.terms.base import Concern, _min, _max, _pos

#: ``optimizer_offload_step`` codes.
OPT_STEP_DEVICE = OPTIMIZER_OFFLOAD_STEP_NAMES.index('device')
OPT_STEP_HOST_FUSED = OPTIMIZER_OFFLOAD_STEP_NAMES.index('host_fused')
OPT_STEP_HOST_UNFUSED = OPTIMIZER_OFFLOAD_STEP_NAMES.index('host_unfused')
#: ``activation_offload_layers`` codes.
ACT_OFFLOAD_ALL = ACTIVATION_OFFLOAD_LAYERS_NAMES.index('all')
ACT_OFFLOAD_FIT = ACTIVATION_OFFLOAD_LAYERS_NAMES.index('fit')

#: Host memory bytes per parameter of the shard, at the host's streaming
#: (triad) rate, of a fused Adam step on the CPU (DeepSpeedCPUAdam,
#: csrc/includes/cpu_adam_impl.h Step_AVX; PyTorch's AdamW with fused=True,
#: aten/src/ATen/native/cpu/FusedAdamKernel.cpp): one pass reading the fp32
#: gradient, master weight and two moments and writing the last three, 28
#: bytes of traffic; measured here at 15.9, 20.4 and 17.7 bytes (1, 4 and
#: 16 threads: the step's time per parameter x the triad rate PyTorch
#: reached on the same host, 64 M parameters, PyTorch 2.11, the 16-core
#: host of an H100 machine).  The 16-thread figure, a whole host's share of
#: cores per GPU (14 on a DGX H100).
HOST_FUSED_ADAM_BYTES = 18.0
#: The same for PyTorch's AdamW one operation at a time, the default on the
#: CPU (torch/optim/adam.py _single_tensor_adam), which Megatron-Core's
#: HybridDeviceOptimizer runs (optimizer/cpu_offloading/hybrid_optimizer.py,
#: ``torch.optim.AdamW`` with its defaults): eight passes (weight decay,
#: the first moment's lerp, the second moment's scale and addcmul, sqrt,
#: the division, eps, addcdiv) move 80 bytes and allocate two temporaries
#: every step; measured the same way at 96, 143 and 120 bytes (6.0, 7.0
#: and 6.8x the fused step), as DeepSpeed reports its CPU Adam 5-7x faster
#: than PyTorch's (deepspeed.ai/tutorials/zero-offload).
HOST_UNFUSED_ADAM_BYTES = 120.0
#: Bytes of the updated weights copied back to the device per parameter
#: (16-bit weights: DeepSpeed's ZeRO-Offload copies the fp32 partition into
#: the 16-bit one; ZenFlow's README: "2x model size of PCIe traffic per
#: step", the gradients down and the weights up).
HOST_STEP_WEIGHT_BYTES = 2.0


class OffloadTerms:
  """Offload to memory tier 2 (see the module)."""

  #: The optimizer step on the host, where an execution offloads its
  #: optimizer state and its framework runs the step there.
  CONCERN = Concern(
    'host optimizer step',
    lambda ev: bool(np.any(np.asarray(ev.exe.optimizer_offload, dtype=bool)
                           & (ev.exe.optimizer_offload_step !=
                              OPT_STEP_DEVICE))),
    batch=('host_optimizer_time_s',))

  @cached_property
  def _host_step(self):
    """True where the offloaded optimizer's step runs on the host."""
    return np.asarray(self.exe.optimizer_offload, dtype=bool) & (
      self.exe.optimizer_offload_step != OPT_STEP_DEVICE)

  @cached_property
  def act_offload_fraction(self):
    """Share of the processor's blocks whose activations cross to tier 2
    (1 with ``activation_offload_layers`` 'all', Calculon's; with 'fit' the
    fewest blocks that make the execution fit,
    :attr:`~calculon.llm.terms.memory.MemoryTerms.act_offload_blocks`,
    over the blocks: Transformer Engine offloads layers 0..k-1 and needs
    layer i's copy done only by layer L - k + i's forward, so the k copies
    spread over the whole pass, pytorch/cpu_offload.py
    _default_offload_sync_init)."""
    fit = self.exe.activation_offload_layers == ACT_OFFLOAD_FIT
    if not np.any(fit):
      return 1.0
    with np.errstate(divide='ignore', invalid='ignore'):
      frac = self.act_offload_blocks / self.blocks_per_proc
    return np.where(fit, frac, 1.0)

  @cached_property
  def _weight_offload_bytes(self):
    """A block's weights on the host: the whole block (Calculon), or with
    FSDP only this processor's shard, which is all the host holds (FSDP2
    CPUOffloadPolicy copies the sharded parameters to the device before
    each all-gather; DeepSpeed ZeRO-3 offload_param likewise)."""
    w = self.block.weight_bytes
    if not np.any(self.fsdp):
      return w
    return np.where(self.fsdp, w / self.weight_shards, w)

  @cached_property
  def fw_offload_bytes(self):
    """Bytes moved to/from tier 2 while a block runs forward: the larger of
    its weights and its activations (prefetch/offload in parallel)."""
    e = self.exe
    act = self._act_offload_block_bytes
    frac = self.act_offload_fraction
    if np.ndim(frac) or frac != 1.0:
      act = act * frac
    return np.maximum(np.where(e.weight_offload, self._weight_offload_bytes,
                               0), np.where(e.activations_offload, act, 0))

  @cached_property
  def bw_offload_bytes(self):
    """Bytes moved while a block runs backward: weights, activations and
    optimizer state as offloaded (the state only when the step runs on the
    device: a host step keeps it on the host, see
    :attr:`host_optimizer_step_s`)."""
    e, b = self.exe, self.block
    act = self._act_offload_block_bytes
    frac = self.act_offload_fraction
    if np.ndim(frac) or frac != 1.0:
      act = act * frac
    size = 0 + np.where(e.weight_offload, self._weight_offload_bytes, 0)
    size = size + np.where(e.activations_offload, act, 0)
    size = size + np.where(e.optimizer_offload & ~self._host_step,
                           b.optimizer_bytes, 0)
    return np.where(self.training, size, 0)

  # -- the link: tier 2's rate, and the network traffic sharing it ------------
  def _link_network_s(self, stage):
    """Seconds of a block's network traffic on the tier that shares the
    link to tier 2 (``host.link_network_tier``), in link time: the tier's
    busy time x its rate / the link's.  On HGX/DGX H100 each GPU's PCIe
    Gen5 x16 link to the host also carries its GPUDirect RDMA traffic to
    the NIC behind the same PCIe switch (NVIDIA/nccl issue #1264); on
    GB200 NCCL sends it through NVLink-C2C to the Grace-attached NICs
    (NCCL src/graph/paths.cc), the link offload uses.  Counted: FSDP's
    gathers and reduce-scatters and the context-parallel ring of the
    block, where their tier is that one; ring collectives send and receive
    alike (so do the expert-parallel dispatch and combine, also
    counted), so both directions of the link carry it at once, each at
    ``host.bidirectional_efficiency`` of its one-way rate (while the
    opposite direction moves the network's N bytes the offload's direction
    does too: N / (f x rate) seconds, the rest of its bytes at the one-way
    rate).  0 without the field."""
    tier = self.system.host_link_network_tier
    if tier is None:
      return 0.0
    e, nets = self.exe, self.system.networks
    busy = 0.0
    if np.any(self.fsdp | self.grad_shard_per_microbatch):
      t = self.block_fsdp_fw_s if stage == 'fw' else self.block_fsdp_bw_s
      busy = busy + np.where(e.data_par_net == tier, t, 0)
    if np.any(self.cp > 1):
      fw, bw = self._cp_step_s
      t = fw if stage == 'fw' else bw
      busy = busy + np.where(e.context_par_net == tier,
                             (self.cp - 1) * t, 0)
    if self.app.is_moe:
      b = self.block
      t = b.ep_fw_time if stage == 'fw' else b.ep_bw_time + b.ep_re_time
      busy = busy + np.where(e.expert_par_net == tier, t, 0)
    host = self.system.host
    link = self.system.mem2.bandwidth_bytes_per_s * \
      self.system.mem2.efficiency(np.inf) * host.bidirectional_efficiency
    return busy * nets.rate(tier) / link

  @cached_property
  def fw_link_network_s(self):
    """Network traffic sharing the link during a block's forward, in link
    seconds (:meth:`_link_network_s`)."""
    return self._link_network_s('fw')

  @cached_property
  def bw_link_network_s(self):
    """Network traffic sharing the link during a block's backward."""
    return np.where(self.training, self._link_network_s('bw'), 0)

  @cached_property
  def fw_offload_time_s(self):
    """Link time of a block's forward offload traffic: the bytes at tier
    2's rate (capped by the host memory's,
    :meth:`~calculon.hardware.System.offload_time_s`) plus the network
    traffic that crosses the same link, where there is offload traffic."""
    t = self.system.offload_time_s(self.fw_offload_bytes)
    if self.system.host_link_network_tier is None:
      return t
    return t + np.where(self.fw_offload_bytes > 0, self.fw_link_network_s,
                        0)

  @cached_property
  def bw_offload_time_s(self):
    t = self.system.offload_time_s(self.bw_offload_bytes)
    if self.system.host_link_network_tier is not None:
      t = t + np.where(self.bw_offload_bytes > 0, self.bw_link_network_s, 0)
    return np.where(self.training, t, 0)

  # -- what the blocks do not hide --------------------------------------------
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
  def baseblock_bw_offload_overhead_s(self):
    return _pos(self.bw_offload_time_s + self.block.agrad_mem_time +
                self.block.wgrad_mem_time - self.baseblock_bw_time_no_offload_s)

  @cached_property
  def edgeblock_bw_offload_overhead_s(self):
    return _pos(self.bw_offload_time_s + self.block.agrad_mem_time +
                self.block.wgrad_mem_time - self.edgeblock_bw_time_no_offload_s)

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

  # -- the optimizer step on the host -----------------------------------------
  @cached_property
  def host_optimizer_step_s(self):
    """Seconds of the optimizer step when it runs on the host
    (``optimizer_offload_step`` 'host_fused' or 'host_unfused'), once per
    batch: the processor's gradient shard down the link, the host's Adam
    over it, the updated 16-bit weights back up, one after the other
    (NVIDIA measured the step itself, not the transfers, dominant:
    Qwen3-30B-A3B on 16 H100, optimizer offload 996 -> 4,189 ms per
    iteration, 3,877 with the transfers overlapped; Megatron-Bridge
    docs/training/cpu-offloading.md).  The shard holds
    ``block.optim_flops`` / 11 parameters per block
    (:data:`~calculon.llm.layers.ADAM_FLOPS_PER_ELEMENT`); the host's Adam
    moves :data:`HOST_FUSED_ADAM_BYTES` or :data:`HOST_UNFUSED_ADAM_BYTES`
    per parameter at the processor's share of the host memory bandwidth
    (:attr:`~calculon.hardware.System.host_memory_bytes_per_s`), the
    transfers move the gradient (``grad_bytes``) and
    :data:`HOST_STEP_WEIGHT_BYTES` per parameter at tier 2's rate.  0
    where the step stays on the device."""
    host = self._host_step
    if not np.any(host):
      return 0.0
    e, s = self.exe, self.system
    params = self.blocks_per_proc * self.block.optim_flops / \
      ADAM_FLOPS_PER_ELEMENT
    per = np.where(e.optimizer_offload_step == OPT_STEP_HOST_UNFUSED,
                   HOST_UNFUSED_ADAM_BYTES, HOST_FUSED_ADAM_BYTES)
    adam = params * per / s.host_memory_bytes_per_s
    down = s.mem2.time_s(params * self.grad_bytes)
    up = s.mem2.time_s(params * HOST_STEP_WEIGHT_BYTES)
    return np.where(host & self.training, down + adam + up, 0)

  @cached_property
  def host_optimizer_time_s(self):
    """What the host's optimizer step adds to the batch: its time beyond
    the device step it replaces (``optim_step_time_s``, which the batch
    time still counts), never less than 0 (a host slower than the device
    in every case the files describe)."""
    if not np.any(self._host_step):
      return 0.0
    return _pos(self.host_optimizer_step_s - self.optim_step_time_s) * \
      self._host_step

  # -- offload bandwidth requirements -----------------------------------------
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
      return self._act_offload_block_bytes / self._fw_offload_window_s

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
