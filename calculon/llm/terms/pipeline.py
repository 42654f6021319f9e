"""Pipeline parallelism: the point-to-point transfers between stages and
their overlap.

Provides :class:`PipelineTerms` and its :data:`~PipelineTerms.CONCERN`
(the batch term ``pp_mirror_time_s``: the gradient all-reduce and the
optimizer step of the second parameter copy of 'dualpipe'): the bytes a chunk sends each way
(``block_fw_pp_bytes``, ``block_bw_pp_bytes``), one transfer's time
(``chunk_fw_pp_time_s``, ``chunk_bw_pp_time_s``), the transfers over the
batch on the link (``pp_comm_link_time_s``) and exposed
(``pp_comm_exposed_time_s``, with Megatron-Core's overlapped interleaved
schedule), and the schedule's chunk steps (``pp_chunk_steps``,
``pp_warmup_chunks``).

Reads: the schedule table (:mod:`~calculon.llm.terms.schedules`),
``pipeline_schedule``, ``blocks_per_proc`` and ``block``; ``system``,
``exe``, ``pp``, ``interleaving``, ``training``,
``io_bytes``, ``activation_elems``, ``seq_par_activation_elems``,
``pp_usage`` (:mod:`~calculon.llm.terms.base`); ``block_input_split``
(:mod:`~calculon.llm.terms.blocks`); ``num_microbatches``,
``chunks_per_proc``, ``chunk_fw_time_s``, ``chunk_bw_time_s``
(:mod:`~calculon.llm.terms.schedule`).
"""

from functools import cached_property

import numpy as np

from calculon.llm.terms import schedules
from calculon.llm.terms.base import Concern, _hidden_behind


class PipelineTerms:
  """Point-to-point transfers between pipeline stages (see the module)."""

  #: What a schedule with a second parameter copy adds to the batch
  #: ('dualpipe', the schedule table).
  CONCERN = Concern(
    'pipeline schedule',
    lambda ev: schedules.any_new(ev.pipeline_schedule) and bool(np.any(
      schedules.param_copies(ev.pipeline_schedule) > 1)),
    batch=('pp_mirror_time_s',))

  @cached_property
  def pp_mirror_time_s(self):
    """What the mirrored stages of 'dualpipe' add to the batch (s): a rank
    holds its stage and the mirrored one (DeepSeek-V3 technical report,
    section 3.2.1: "two copies of the model parameters";
    deepseek-ai/DualPipe examples/example_dualpipe.py, 3da1bbea5: rank r
    holds stages r and PP - 1 - r), so when training the two ranks that
    hold a stage all-reduce its kept gradients (``weight_grad_bytes`` of
    the processor's blocks, over 2 ranks of the pipeline's network tier)
    and each steps the optimizer over its copy too (once more the
    blocks' ``optim_time``).  0 for the other schedules."""
    copies = schedules.param_copies(self.pipeline_schedule)
    extra = copies - 1
    size = self.block.weight_grad_bytes * self.blocks_per_proc
    reduce = self.system.networks.time_s('all_reduce', size, 2,
                                         self.exe.pipeline_par_net)
    step = self.blocks_per_proc * self.block.optim_time
    return np.where(self.training & (extra > 0) & (self.pp > 1),
                    extra * (reduce + step), 0)

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
