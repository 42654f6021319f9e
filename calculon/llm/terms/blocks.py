"""The compiled block and its per-microbatch totals.

Provides :class:`BlockTerms`: the block's layers (``layers``;
``dense_layers``, the dense block of a Mixture-of-Experts model), their
per-microbatch totals (``block``, a
:class:`~calculon.llm.block.BlockTotals` or, with dense and MoE blocks,
the :class:`~calculon.llm.block.BlockMix` of the busiest stage), the MoE
blocks of that stage (``moe_blocks_per_proc``), the block-input
checkpoint (``block_act_checkpoint_bytes``), the block's compute over the
batch (``fw_time_s``, ``bw_time_s``, ``recompute_time_s``,
``optim_step_time_s``), and :meth:`BlockTerms.reusing_totals`, which
builds an Evaluation that reuses another's totals (:class:`TotalsAt`).

Reads: ``app``, ``exe``, ``ctx``, ``training``, ``full_recompute``,
``pp``, ``io_bytes``, ``activation_elems``, ``seq_par_activation_elems``
(:mod:`~calculon.llm.terms.base`); ``blocks_per_proc``,
``block_microbatches`` (:mod:`~calculon.llm.terms.schedule`); ``embed``
and ``head`` (:mod:`~calculon.llm.terms.vocab`, for
:meth:`~BlockTerms.reusing_totals` only).
"""

from functools import cached_property

import numpy as np

from calculon.config.execution import CHECKPOINT_AS_INPUT, TP_COMM_AR
from calculon.llm.block import (
  BlockMix, BlockTotals, build_block, moe_blocks_in_busiest_stage)


class TotalsAt:
  """The per-block totals of a grid (a BlockTotals or BlockMix over the
  group's reduced grid) read at the cells of a new grid: ``index`` holds,
  per axis of the source grid, an integer array broadcastable to the new
  grid's shape giving each new cell's index along that axis.  The block
  depends on none of the inner axes, so the Evaluations of level-2 grids
  and of the inner combinations reuse the level-1 block instead of
  rebuilding it."""

  def __init__(self, totals, index):
    self._totals, self._index = totals, index

  def __getattr__(self, name):
    if name.startswith('_'):
      raise AttributeError(name)
    value = getattr(self._totals, name)
    if np.ndim(value):
      value = np.asarray(value)
      sel = tuple(ix if n > 1 else 0
                  for ix, n in zip(self._index, value.shape))
      value = value[sel]
    setattr(self, name, value)
    return value


class BlockTerms:
  """The block and its compute (see the module)."""

  #: The per-microbatch totals :meth:`reusing_totals` shares.
  TOTALS = ('block', 'embed', 'head')

  @classmethod
  def reusing_totals(cls, source, exe, index):
    """An Evaluation of executions ``exe`` (of ``source``'s application and
    system) whose block, embedding and LM head totals (:attr:`TOTALS`) are
    those of Evaluation ``source`` read at the grid indices ``index``
    (:class:`TotalsAt`) instead of being built again.

    Args:
      source: an Evaluation over a grid.
      exe: :class:`~calculon.config.ExecutionColumns` of the new grid.
      index: per axis of ``source``'s grid, an integer array broadcastable
        to ``exe``'s shape: each new execution's index along that axis.
        The new executions must agree with the source cells they read on
        every field the totals depend on (the caller's promise: in the
        search, every axis but the inner ones of
        :data:`calculon.llm.prune.INNER_AXES`, which change no block,
        embedding or head total).

    Returns:
      The new Evaluation (lazy, as one built from ``exe``).

    Raises:
      IndexError: an index outside ``source``'s grid (when a total is
        first read).
    """
    ev = cls(source.app, source.system, exe)
    cache = vars(ev)
    for name in cls.TOTALS:
      cache[name] = TotalsAt(getattr(source, name), index)
    return ev

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

  # -- the block's compute over the batch -------------------------------------
  @cached_property
  def fw_time_s(self):
    """Forward compute of all blocks and microbatches on one processor."""
    return self.block_microbatches * self.block.fw_time

  @cached_property
  def bw_time_s(self):
    """Backward compute (activation + weight gradients)."""
    return self.block_microbatches * self.block.agrad_time + \
      self.block_microbatches * self.block.wgrad_time

  @cached_property
  def optim_step_time_s(self):
    """Optimizer step over the processor's blocks (once per batch)."""
    return self.blocks_per_proc * self.block.optim_time

  @cached_property
  def recompute_time_s(self):
    """Forward recomputation during the backward pass."""
    return self.block_microbatches * self.block.re_time
