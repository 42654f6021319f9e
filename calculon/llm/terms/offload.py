"""Offload to memory tier 2: the traffic, what the blocks do not hide,
and the bandwidth it needs.

Provides :class:`OffloadTerms`: the bytes moved while a block runs
(``fw_offload_bytes``, ``bw_offload_bytes``) and their time
(``fw_offload_time_s``, ``bw_offload_time_s``), the part a base or an
edge block does not hide (``baseblock_fw_offload_overhead_s``,
``edgeblock_fw_offload_overhead_s``, ``baseblock_bw_offload_overhead_s``,
``edgeblock_bw_offload_overhead_s``), over the batch
(``fw_offload_exposed_time_s``, ``bw_offload_exposed_time_s``), and the
tier-2 bandwidth each offload needs (``act_offload_bw_req``,
``weight_offload_bw_req``, ``optim_offload_bw_req``,
``offload_mem_bw_req``).

Reads: ``system``, ``exe``, ``training``, ``full_recompute``
(:mod:`~calculon.llm.terms.base`); ``block``,
``block_act_checkpoint_bytes`` (:mod:`~calculon.llm.terms.blocks`); the
base and edge blocks' times without offload
(``baseblock_fw_time_no_offload_s``, ``edgeblock_fw_time_no_offload_s``,
``baseblock_bw_time_no_offload_s``, ``edgeblock_bw_time_no_offload_s``)
and :meth:`~calculon.llm.terms.schedule.ScheduleTerms._per_chunks`
(:mod:`~calculon.llm.terms.schedule`).
"""

from functools import cached_property

import numpy as np

from calculon.llm.terms.base import _min, _max, _pos


class OffloadTerms:
  """Offload to memory tier 2 (see the module)."""

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
