"""The host: the system file's fixed overheads (``overhead``), which the
accelerators wait for.

Provides :class:`HostTerms` and its :data:`~HostTerms.CONCERN` (the batch
terms ``overhead_time_s`` and ``moe_host_time_s``, where the system has
either): the fixed overheads per step and per microbatch
(``overhead_time_s``), the MoE blocks the host launches kernel by kernel
(``moe_host_blocks_per_proc``: none where the run replays a
full-iteration CUDA graph, :data:`LAYER_GRAPHS_HOST_SHARE` of them under
per-layer graphs) and the MoE host floor (``moe_host_time_s``:
the host's launches of those blocks that the blocks' GPU time does not
cover).

Reads: ``app``, ``system``, ``exe`` (``cuda_graphs``)
(:mod:`~calculon.llm.terms.base`);
``moe_blocks_per_proc``, ``fw_time_s``, ``bw_time_s``,
``recompute_time_s`` (:mod:`~calculon.llm.terms.blocks`);
``num_microbatches``, ``bubble_time_s``
(:mod:`~calculon.llm.terms.schedule`).
"""

from functools import cached_property

import numpy as np

from calculon.config.registry import CUDA_GRAPH_NAMES
from calculon.llm.terms.base import Concern


#: Share of a MoE block's host launch time left under per-layer CUDA graphs
#: (``cuda_graphs`` 'layers': Transformer Engine graphs of the attention,
#: router and dispatch preprocessing of each layer), 484 / 623 = 0.777:
#: the step time measured with such graphs over the eager step of the same
#: launch-bound MoE run (Qwen3-30B-A3B, TP2 PP2 EP4 on two H100 nodes,
#: scope attn + moe_router + moe_preprocess: 623 -> 484 ms; GPT-OSS-20B
#: 467-520 -> 391-399 ms). Megatron-Bridge
#: skills/nemo-mbridge-perf-cuda-graphs/card.yaml at 067f987df,
#: measured_results. The ratio bounds the share from above (a run that
#: stops being launch-bound under the graphs gains less than the launches
#: it saves), so the floor it leaves is the highest the measurement allows.
LAYER_GRAPHS_HOST_SHARE = 484.0 / 623.0

#: Share of the eager host launches left, by ``cuda_graphs`` code.
_HOST_SHARE = np.array([{'none': 1.0, 'layers': LAYER_GRAPHS_HOST_SHARE,
                         'full_iteration': 0.0}[name]
                        for name in CUDA_GRAPH_NAMES])


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
  def moe_host_blocks_per_proc(self):
    """MoE blocks of the busiest stage whose kernels the host launches one
    by one each microbatch, in blocks' worth of eager launches: all of them
    (``moe_blocks_per_proc``) eagerly; none where the run replays a
    full-iteration CUDA graph (``cuda_graphs`` 'full_iteration': one
    launch for the whole forward and backward pass, Megatron-Core
    megatron/core/full_cuda_graph.py); :data:`LAYER_GRAPHS_HOST_SHARE` of
    them under per-layer graphs (``cuda_graphs`` 'layers', which replay
    part of each block's kernels as one launch)."""
    return _HOST_SHARE[np.asarray(self.exe.cuda_graphs)] * \
      self.moe_blocks_per_proc

  @cached_property
  def moe_host_time_s(self):
    """Time the stage waits for the host (whole batch): per microbatch, its
    MoE blocks' host time (``overhead.per_moe_block_s`` x
    :attr:`moe_host_blocks_per_proc`) beyond the GPU time of its blocks (forward, backward and
    recomputation), over every microbatch and the pipeline bubble (which
    the longer microbatch lengthens in proportion).  0 without MoE or
    without the overhead, and under a full-iteration CUDA graph; per-layer
    graphs (``cuda_graphs`` 'layers') lower it to
    :data:`LAYER_GRAPHS_HOST_SHARE` of the eager floor."""
    host = self.system.overhead_per_moe_block_s
    if not self.app.is_moe or not np.any(host):
      return 0.0
    gpu = self.fw_time_s + self.bw_time_s + self.recompute_time_s
    with np.errstate(divide='ignore', invalid='ignore'):
      per_mb = gpu / self.num_microbatches
      short = np.maximum(0.0, host * self.moe_host_blocks_per_proc - per_mb)
      bubble = np.where(gpu > 0, self.bubble_time_s / gpu, 0.0)
    return short * self.num_microbatches * (1.0 + bubble)
