"""The pipeline schedule: microbatches, blocks and chunks, block and
chunk times, and the bubble.

Schedule model (Calculon, Isaev et al. SC'23, section 3; Narayanan et al.
SC'21 for 1F1B and the interleaved schedule): each processor holds
``blocks_per_proc`` blocks split into ``pipeline_interleaving`` chunks; a
chunk is ``blocks_per_chunk - 1`` *base* blocks followed by one *edge*
block that also sends the activation to the next pipeline stage.  Times
are for processor 0.

Provides :class:`ScheduleTerms`: ``pipeline_schedule`` (the schedule's
code, :mod:`~calculon.llm.terms.schedules`), ``num_microbatches``,
``vocab_in_split``, ``blocks_per_proc``, ``bubble_reduction_blocks``,
``blocks_per_chunk``, ``chunks_per_proc``, ``baseblocks_per_chunk``,
``edgeblocks_per_chunk``, ``block_microbatches`` (blocks x microbatches),
:meth:`~ScheduleTerms._per_chunks` (a base/edge quantity over every chunk
and microbatch), the base and edge blocks' forward and backward times
(with and without offload), the chunk times, and the bubble
(:meth:`~ScheduleTerms.bubble_s` from given block times, and
``bubble_time_s``).

Reads: ``app``, ``exe``, ``pp``, ``interleaving``, ``training``
(:mod:`~calculon.llm.terms.base`); the schedule table
(:mod:`~calculon.llm.terms.schedules`); ``block``
(:mod:`~calculon.llm.terms.blocks`); ``chunk_fw_pp_time_s``,
``chunk_bw_pp_time_s`` (:mod:`~calculon.llm.terms.pipeline`);
``block_fw_extra_s``, ``block_bw_extra_s`` (the concerns' sum,
:mod:`~calculon.llm.terms.evaluation`); the offload overheads
``baseblock_fw_offload_overhead_s``, ``edgeblock_fw_offload_overhead_s``,
``baseblock_bw_offload_overhead_s``, ``edgeblock_bw_offload_overhead_s``
(:mod:`~calculon.llm.terms.offload`).
"""

from functools import cached_property

from collections import namedtuple

import numpy as np

from calculon.config import parallel
from calculon.llm.terms import schedules


class ScheduleTerms:
  """The schedule's counts, block and chunk times, and the bubble (see
  the module)."""

  #: Edge blocks per chunk: the last block of each chunk.
  edgeblocks_per_chunk = 1

  @cached_property
  def pipeline_schedule(self):
    """``pipeline_schedule`` codes with a schedule left out read as
    Calculon's ('1f1b', or 'interleaved-1f1b' with VP > 1;
    :func:`~calculon.llm.terms.schedules.effective`)."""
    return schedules.effective(np.asarray(self.exe.pipeline_schedule),
                               self.interleaving)

  @cached_property
  def num_microbatches(self):
    """Microbatches of one data-parallel replica per batch: (batch / DP) /
    microbatch size."""
    e = self.exe
    return parallel.num_microbatches(e.batch_size, e.data_par,
                                     e.microbatch_size)

  @cached_property
  def vocab_in_split(self):
    """True where the pipeline split counts the embedding and the LM head
    as a block each (``pipeline_split_counts_vocab``, PP > 1, no layout;
    see ``blocks_per_proc`` and ``vocab_time_s``)."""
    split = self.exe.pipeline_split_counts_vocab & (self.pp > 1)
    if self.pipeline_layout is None:
      return split
    return split & ~self.pipeline_layout.given

  @cached_property
  def pipeline_layout(self):
    """The uneven stages of ``pipeline_first_stage_blocks`` and
    ``pipeline_last_stage_blocks`` (:func:`stage_layout`), or None when no
    execution sets either (Calculon's even split)."""
    e = self.exe
    first = np.asarray(e.pipeline_first_stage_blocks)
    last = np.asarray(e.pipeline_last_stage_blocks)
    if not (np.any(first != schedules.UNSET) or
            np.any(last != schedules.UNSET)):
      return None
    return stage_layout(self.app.num_blocks, self.pp, self.interleaving,
                        first, last, self.pipeline_schedule)

  @cached_property
  def _pipeline_split(self):
    """(blocks per processor, bubble reduction in blocks).

    Blocks per processor, rounded up; the last PP - (L mod PP) stages hold
    one block less, which shortens the bubble (see bubble_time_s).  When
    the split counts the embedding and the LM head as a block each
    (pipeline_split_counts_vocab), L + 2 slots are split and the two end
    stages give one slot each to them (see vocab_time_s)."""
    nb = self.app.num_blocks + np.where(self.vocab_in_split, 2, 0)
    rem = nb % self.pp
    bpp, red = (nb // self.pp + (rem != 0),
                np.where(rem != 0, self.pp - rem, 0))
    lay = self.pipeline_layout
    if lay is None:
      return bpp, red
    # A layout's busiest rank, and the blocks the others hold less.
    return (np.where(lay.given, lay.blocks_per_proc, bpp),
            np.where(lay.given, lay.reduction_blocks, red))

  @cached_property
  def blocks_per_proc(self):
    """Blocks of the busiest pipeline stage (blocks / PP rounded up)."""
    return self._pipeline_split[0]

  @cached_property
  def bubble_reduction_blocks(self):
    """Blocks the later stages hold less than the first (PP - (L mod PP)
    where PP does not divide the L blocks; see :attr:`bubble_time_s`)."""
    return self._pipeline_split[1]

  @cached_property
  def blocks_per_chunk(self):
    """Blocks of one chunk: blocks per processor / interleaving."""
    return self.blocks_per_proc // self.interleaving

  @cached_property
  def chunks_per_proc(self):
    """Chunks of a processor: blocks per processor / blocks per chunk."""
    with np.errstate(divide='ignore', invalid='ignore'):
      return self.blocks_per_proc // np.maximum(self.blocks_per_chunk, 1)

  @cached_property
  def baseblocks_per_chunk(self):
    """Base blocks of one chunk: all but its edge block."""
    return self.blocks_per_chunk - 1

  @cached_property
  def block_microbatches(self):
    """Blocks x microbatches of the busiest stage: how many times a
    per-block, per-microbatch quantity occurs in the batch."""
    return self.blocks_per_proc * self.num_microbatches

  def _per_chunks(self, base, edge):
    """Sum over all chunks and microbatches of a base/edge block quantity."""
    return self.num_microbatches * self.chunks_per_proc * (
      (self.baseblocks_per_chunk * base) + (self.edgeblocks_per_chunk * edge))

  # -- base and edge blocks: compute, exposed communication, offload ----------
  @cached_property
  def baseblock_fw_time_no_offload_s(self):
    """Forward of a base block without offload: compute, exposed TP
    traffic and the concerns' exposed extra (``block_fw_extra_s``)."""
    return self.block.fw_time + self.block.base_fw_tp_exposed + \
      self.block_fw_extra_s

  @cached_property
  def edgeblock_fw_time_no_offload_s(self):
    """Forward of an edge block without offload: a base block's (with the
    edge block's TP traffic) plus the transfer to the next stage."""
    return self.block.fw_time + self.block.edge_fw_tp_exposed + \
      self.chunk_fw_pp_time_s + self.block_fw_extra_s

  @cached_property
  def baseblock_fw_time_s(self):
    """Forward of a base block: without offload plus the offload it does
    not hide."""
    return self.baseblock_fw_time_no_offload_s + \
      self.baseblock_fw_offload_overhead_s

  @cached_property
  def edgeblock_fw_time_s(self):
    """Forward of an edge block: without offload plus the offload it does
    not hide."""
    return self.edgeblock_fw_time_no_offload_s + \
      self.edgeblock_fw_offload_overhead_s

  @cached_property
  def baseblock_bw_time_no_offload_s(self):
    """Backward of a base block without offload: recomputation and its
    exposed redone TP traffic, activation and weight gradients, exposed
    TP traffic and the concerns' exposed extra (``block_bw_extra_s``)."""
    b = self.block
    return b.re_time + b.base_recomm_exposed + b.agrad_time + b.wgrad_time + \
      b.base_agrad_tp_exposed + self.block_bw_extra_s

  @cached_property
  def edgeblock_bw_time_no_offload_s(self):
    """Backward of an edge block without offload: a base block's (with
    the edge block's TP traffic) plus the transfer to the previous
    stage."""
    b = self.block
    return b.re_time + b.edge_recomm_exposed + b.agrad_time + b.wgrad_time + \
      b.edge_agrad_tp_exposed + self.chunk_bw_pp_time_s + \
      self.block_bw_extra_s

  @cached_property
  def baseblock_bw_time_s(self):
    """Backward of a base block: without offload plus the offload it does
    not hide."""
    return self.baseblock_bw_time_no_offload_s + \
      self.baseblock_bw_offload_overhead_s

  @cached_property
  def edgeblock_bw_time_s(self):
    """Backward of an edge block: without offload plus the offload it does
    not hide."""
    return self.edgeblock_bw_time_no_offload_s + \
      self.edgeblock_bw_offload_overhead_s

  # -- chunks and the pipeline bubble -----------------------------------------
  @cached_property
  def chunk_fw_time_s(self):
    """Forward time of one chunk (:meth:`chunk_time_s`)."""
    return self.chunk_time_s(self.baseblock_fw_time_s,
                             self.edgeblock_fw_time_s)

  @cached_property
  def chunk_bw_time_s(self):
    """Backward time of one chunk (:meth:`chunk_time_s`)."""
    return self.chunk_time_s(self.baseblock_bw_time_s,
                             self.edgeblock_bw_time_s)

  def chunk_time_s(self, base, edge):
    """Time of one chunk whose base blocks take ``base`` and whose edge
    block takes ``edge`` seconds (arrays broadcastable over the
    executions): base blocks per chunk x ``base`` + ``edge``."""
    return (self.baseblocks_per_chunk * base) + \
      (self.edgeblocks_per_chunk * edge)

  def bubble_s(self, base_fw, edge_fw, base_bw, edge_bw, wgrad=None):
    """Pipeline bubble (seconds) of the (interleaved) 1F1B schedule whose
    base and edge blocks take the given forward and backward seconds (per
    block and microbatch; arrays broadcastable over the executions).
    :attr:`bubble_time_s` is this of the blocks' times; a lower bound of
    the batch time (:func:`calculon.llm.prune.rate_bound`) calls it with
    lower bounds of them (the bubble grows with each: its coefficients,
    (PP - 1 + extra) (blocks per chunk - 1) - reduction / 2 and
    PP - 1 + extra - reduction / 2, are >= 0 since the reduction is at
    most PP - 1 blocks).  With a layout (:attr:`pipeline_layout`), the
    other ranks' stage times over VP: (PP - 1) edge blocks and (L - busiest
    - (PP - 1) VP) / VP base blocks, each >= 0 (every stage holds a
    block).

    (PP - 1) chunk times (forward + backward), as in Narayanan et al. SC'21
    eq. 1 per chunk.  With interleaving and a microbatch count that is not a
    multiple of PP, each of the (interleaving - 1) overlappable chunks waits
    for the missing microbatches: (interleaving - 1) * (PP - nmb mod PP)
    extra chunk times.  When PP does not divide the block count, later stages
    hold one block less and the bubble shrinks by that many blocks' time
    (half base, half edge when chunks have base blocks).

    Schedules other than Calculon's (``pipeline_schedule``, the schedule
    table :mod:`~calculon.llm.terms.schedules`): the table's bubble of one
    chunk's forward F (``chunk_time_s`` of the forward times), full
    backward B (of the backward times) and weight gradient W
    (``blocks_per_chunk`` x ``wgrad``, per block and microbatch; the
    block's ``wgrad_time`` when training by default).  It grows with F and
    B at fixed W, so the bound may pass lower bounds of them (and may put
    the backward into the forward: every table formula weighs B at least
    as much as F).
    """
    chunk_time = self.chunk_time_s(base_fw, edge_fw) + \
      self.chunk_time_s(base_bw, edge_bw)
    red = self.bubble_reduction_blocks
    reduction = np.where(
      self.baseblocks_per_chunk > 0,
      red * (base_fw + edge_fw + base_bw + edge_bw) / 2,
      red * (edge_fw + edge_bw))
    nmb, pp = self.num_microbatches, self.pp
    missing = nmb % pp
    extra = np.where(missing != 0, (self.interleaving - 1) * (pp - missing), 0)
    bubble = (pp - 1) * chunk_time + (extra * chunk_time - reduction)
    lay = self.pipeline_layout
    if lay is not None:
      # Uneven stages: the other ranks' stage times over VP (each chunk of
      # a rank one edge block, the rest base blocks), as the even split's
      # (PP - 1) chunk times less the blocks they lack; its coefficients
      # are >= 0 as every stage holds a block.
      others = (self.app.num_blocks - self.blocks_per_proc) / \
        self.interleaving - (pp - 1)
      uneven = (pp - 1) * (edge_fw + edge_bw) + others * (base_fw + base_bw) \
        + extra * chunk_time
      bubble = np.where(lay.given, uneven, bubble)
    sched = self.pipeline_schedule
    if not schedules.any_new(sched):
      return bubble
    if wgrad is None:
      wgrad = np.where(self.training, self.block.wgrad_time, 0)
    new = schedules.bubble_s(
      sched, pp, nmb, self.interleaving, self.chunk_time_s(base_fw, edge_fw),
      self.chunk_time_s(base_bw, edge_bw), self.blocks_per_chunk * wgrad)
    return np.where(schedules.legacy(sched), bubble, new)

  @cached_property
  def bubble_time_s(self):
    """Pipeline bubble of the (interleaved) 1F1B schedule: :meth:`bubble_s`
    of the base and edge blocks' forward and backward times."""
    return self.bubble_s(self.baseblock_fw_time_s, self.edgeblock_fw_time_s,
                         self.baseblock_bw_time_s, self.edgeblock_bw_time_s)


#: The ranks' blocks of a pipeline layout (:func:`stage_layout`): where a
#: layout is given (bool), the busiest rank's blocks, the blocks the other
#: ranks hold less in all (PP x busiest - L), the blocks of the rank with
#: the embedding (``first_blocks``), of the rank with the loss
#: (``last_blocks``) and of a middle rank (``middle_blocks``).
StageLayout = namedtuple('StageLayout', 'given blocks_per_proc '
                         'reduction_blocks first_blocks last_blocks '
                         'middle_blocks')


def _layout_counts(num_blocks, pp, first, last):
  """(first given, last given, middle ranks, blocks left to them)."""
  fg, lg = first != schedules.UNSET, last != schedules.UNSET
  rest = pp - fg - lg
  left = num_blocks - np.where(fg, first, 0) - np.where(lg, last, 0)
  return fg, lg, rest, left


def stage_layout(num_blocks, pp, vp, first, last, schedule):
  """The ranks' blocks of uneven pipeline stages.

  The first pipeline rank holds ``first`` blocks (with the embedding),
  the last ``last``, and the other ranks split the rest of the
  ``num_blocks`` evenly (``first`` / ``last`` UNSET: that rank takes the
  even share too); each rank's blocks are split evenly over its VP
  chunks.  This is Megatron-Core's TransformerConfig
  num_layers_in_first_pipeline_stage and num_layers_in_last_pipeline_stage
  (Megatron-LM --decoder-first-pipeline-num-layers,
  --decoder-last-pipeline-num-layers; megatron/core/transformer/
  transformer_block.py get_num_layers_to_build: a rank's layers // VP a
  virtual chunk, the middle layers over the middle ranks).  The loss runs
  on the last rank, or with the V schedules ('zbv', 'dualpipe-v': rank r
  holds stages r and 2 PP - 1 - r) on the first.

  Args (int arrays, broadcast): the application's blocks, PP, VP, the
  first and last ranks' blocks (UNSET: not given), the schedule codes
  (:func:`~calculon.llm.terms.schedules.effective`).

  Returns:
    :class:`StageLayout` (arrays); counts of the floor share where the
    ranks do not split evenly (such an execution is refused before:
    :func:`layout_violation`).
  """
  fg, lg, rest, left = _layout_counts(num_blocks, pp, first, last)
  given = (fg | lg) & (pp > 1)
  mid = np.maximum(left, 0) // np.maximum(rest, 1)
  r0 = np.where(fg, first, mid)
  rl = np.where(lg, last, mid)
  inner = np.where(pp > 2, mid, 0)
  bpp = np.maximum(np.maximum(r0, rl), inner)
  vee = schedules.v_shape(schedule)
  return StageLayout(given, bpp, pp * bpp - num_blocks, r0,
                     np.where(vee, r0, rl), np.where(pp > 2, mid, bpp))


def layout_violation(num_blocks, pp, vp, first, last, schedule):
  """Why a layout cannot run (int array; 0: it can, or none is given): 1
  with PP = 1; 2 with 'dualpipe' (its ranks hold two stages each, a layout
  of which is not modeled); 3 where the other ranks cannot split the
  blocks left evenly; 4 where a rank's blocks are not a multiple of VP
  (at least one block a chunk: Megatron-Core splits a rank's layers
  evenly over its virtual chunks).  Args as :func:`stage_layout`'s."""
  fg, lg, rest, left = _layout_counts(num_blocks, pp, first, last)
  given = fg | lg
  uneven = np.where(rest > 0, (left < 0) | (left % np.maximum(rest, 1) != 0),
                    left != 0)
  mid = np.maximum(left, 0) // np.maximum(rest, 1)
  chunks = (fg & (first % vp != 0)) | (lg & (last % vp != 0)) | (
    (rest > 0) & ((mid < vp) | (mid % vp != 0)))
  return np.select([given & (pp == 1),
                    given & (schedule == schedules.DUALPIPE),
                    given & uneven, given & chunks], [1, 2, 3, 4], 0)
