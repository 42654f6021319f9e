"""The host: the system file's fixed overheads (``overhead``), which the
accelerators wait for.

Provides :class:`HostTerms` and its :data:`~HostTerms.CONCERN` (the batch
terms ``overhead_time_s`` and ``moe_host_time_s``, where the system has
either): the fixed overheads per step and per microbatch
(``overhead_time_s``) and the MoE host floor (``moe_host_time_s``: the
host's launches of the MoE blocks that the blocks' GPU time does not
cover).

Reads: ``app``, ``system`` (:mod:`~calculon.llm.terms.base`);
``moe_blocks_per_proc``, ``fw_time_s``, ``bw_time_s``,
``recompute_time_s`` (:mod:`~calculon.llm.terms.blocks`);
``num_microbatches``, ``bubble_time_s``
(:mod:`~calculon.llm.terms.schedule`).
"""

from functools import cached_property

import numpy as np

from calculon.llm.terms.base import Concern


class HostTerms:
  """Time the accelerators wait for the host (see the module)."""

  #: The fixed overheads and the MoE host floor, where the system has
  #: either (a system file's ``overhead``; a calibration's system may set
  #: the floor alone).
  CONCERN = Concern(
    'host overheads',
    lambda ev: ev.system.overhead_per_step_s is not None or
    bool(np.any(ev.system.overhead_per_moe_block_s)),
    batch=('overhead_time_s', 'moe_host_time_s'))

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
