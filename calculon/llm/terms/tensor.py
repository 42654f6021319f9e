"""Tensor parallelism: the TP communication of the blocks over the batch.

The per-block TP traffic (forward, backward and redone, on the link and
exposed, for base and edge blocks) is priced by the layers
(:class:`~calculon.llm.layers.TPComm`, totals in
:class:`~calculon.llm.block.BlockTotals`); this module adds it up over the
chunks and microbatches.

Provides :class:`TensorTerms`: ``tp_comm_link_time_s``,
``tp_comm_exposed_time_s``, ``recomm_link_time_s``,
``recomm_exposed_time_s``.

Reads: ``block`` (:mod:`~calculon.llm.terms.blocks`);
:meth:`~calculon.llm.terms.schedule.ScheduleTerms._per_chunks`.
"""

from functools import cached_property


class TensorTerms:
  """TP communication over the batch (see the module)."""

  @cached_property
  def tp_comm_link_time_s(self):
    """Time TP communication occupies the link (forward + backward)."""
    b = self.block
    return self._per_chunks(b.base_fw_tp_time, b.edge_fw_tp_time) + \
      self._per_chunks(b.base_agrad_tp_time, b.edge_agrad_tp_time)

  @cached_property
  def tp_comm_exposed_time_s(self):
    """TP communication not hidden behind compute."""
    b = self.block
    return self._per_chunks(b.base_fw_tp_exposed, b.edge_fw_tp_exposed) + \
      self._per_chunks(b.base_agrad_tp_exposed, b.edge_agrad_tp_exposed)

  @cached_property
  def recomm_link_time_s(self):
    """Redone TP communication (recomputation, all-gather redo) on the link."""
    b = self.block
    return self._per_chunks(b.base_recomm_time, b.edge_recomm_time)

  @cached_property
  def recomm_exposed_time_s(self):
    """Redone TP communication not hidden behind compute."""
    b = self.block
    return self._per_chunks(b.base_recomm_exposed, b.edge_recomm_exposed)
