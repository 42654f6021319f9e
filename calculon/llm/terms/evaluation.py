"""The engine's :class:`Evaluation`, composed of its concerns.

Each concern is a module of :mod:`calculon.llm.terms` whose class holds its
formulas (see each module's docstring for what it provides and what it
reads of the others):

======================================  ==================================
:mod:`~calculon.llm.terms.base`         degrees, bytes, BlockContext,
                                        network usages, shapes, helpers
:mod:`~calculon.llm.terms.blocks`       the compiled block, its totals
                                        and compute over the batch
:mod:`~calculon.llm.terms.schedule`     microbatches, blocks, chunks,
                                        block and chunk times, bubble
:mod:`~calculon.llm.terms.pipeline`     PP transfers and their overlap
:mod:`~calculon.llm.terms.tensor`       TP communication (and redone)
:mod:`~calculon.llm.terms.offload`      offload to memory tier 2
:mod:`~calculon.llm.terms.data`         DP reduction, ZeRO-1/2, overlap
:mod:`~calculon.llm.terms.context`      the context-parallel ring
:mod:`~calculon.llm.terms.fsdp`         FSDP (ZeRO-3) traffic, copies
:mod:`~calculon.llm.terms.vocab`        embedding, LM head and loss
:mod:`~calculon.llm.terms.expert`       expert-parallel traffic
:mod:`~calculon.llm.terms.host`         fixed host overheads, MoE floor
:mod:`~calculon.llm.terms.memory`       memory per processor
:mod:`~calculon.llm.terms.metrics`      batch time, rates, MFU, HFU
:mod:`~calculon.llm.terms.feasibility`  reason codes and messages
======================================  ==================================

A concern whose terms lengthen every block or the batch beyond
Calculon's declares them in its class's ``CONCERN``
(:class:`~calculon.llm.terms.base.Concern`); :class:`Evaluation` sums the
declarations (:attr:`Evaluation.block_fw_extra_s`,
:attr:`Evaluation.block_bw_extra_s`, :attr:`Evaluation.modern_time_s`) in
the order of :data:`PARTS`.  Adding a concern is adding its module and
listing its class once in :data:`PARTS`.

Reads: ``training`` (:mod:`~calculon.llm.terms.base`) and the terms the
concerns declare.
"""

from functools import cached_property

import numpy as np

from calculon.llm.terms.base import BaseTerms
from calculon.llm.terms.blocks import BlockTerms
from calculon.llm.terms.context import ContextTerms
from calculon.llm.terms.data import DataTerms
from calculon.llm.terms.expert import ExpertTerms
from calculon.llm.terms.feasibility import FeasibilityTerms
from calculon.llm.terms.fsdp import FsdpTerms
from calculon.llm.terms.host import HostTerms
from calculon.llm.terms.memory import MemoryTerms
from calculon.llm.terms.metrics import MetricsTerms
from calculon.llm.terms.offload import OffloadTerms
from calculon.llm.terms.pipeline import PipelineTerms
from calculon.llm.terms.schedule import ScheduleTerms
from calculon.llm.terms.tensor import TensorTerms
from calculon.llm.terms.vocab import VocabTerms

#: The concerns :class:`Evaluation` is made of.  Their declared terms
#: (``CONCERN``) are summed in this order.
PARTS = (BaseTerms, BlockTerms, ScheduleTerms, PipelineTerms, TensorTerms,
         OffloadTerms, DataTerms, ContextTerms, FsdpTerms, VocabTerms,
         ExpertTerms, HostTerms, MemoryTerms, MetricsTerms, FeasibilityTerms)


class Evaluation(*PARTS):
  """All statistics of a set of executions of one application on one system.

  Args:
    app: :class:`~calculon.config.Application`.
    system: :class:`~calculon.hardware.System`.
    exe: :class:`~calculon.config.ExecutionColumns`, already validated
      (rules and compatibility with ``app`` and ``system``).

  Every public attribute is an array (or scalar) broadcastable to
  ``exe.shape``; times in seconds, sizes in bytes, rates per second.  Values
  are computed for infeasible executions too; :attr:`reason` tells which are.
  Each attribute's formula lives in the module of its concern (see
  :mod:`calculon.llm.terms.evaluation`).
  """

  #: The declared terms of the concerns
  #: (:class:`~calculon.llm.terms.base.Concern`), in the order of
  #: :data:`PARTS`.
  CONCERNS = tuple(vars(p)['CONCERN'] for p in PARTS if 'CONCERN' in vars(p))

  def concern_terms(self, kind):
    """The terms of kind ``kind`` ('block_fw', 'block_bw' or 'batch') of
    every concern that applies, in order, each an array (or scalar)
    broadcastable to ``exe.shape``; scalar zeros are left out.  Their sum
    is :meth:`_sum_terms`; the search's bound reduces them one by one
    (:func:`calculon.search.bound.rate_bound`).  ``block_bw`` terms are
    as the concerns give them, before the training mask of
    :attr:`block_bw_extra_s`."""
    for concern in self.CONCERNS:
      names = getattr(concern, kind)
      if names and concern.applies(self):
        for name in names:
          term = getattr(self, name)
          # A scalar 0 adds nothing (and would cost a pass over the grid).
          if np.ndim(term) == 0 and term == 0:
            continue
          yield term

  def _sum_terms(self, kind):
    """0.0 plus the terms of kind ``kind`` ('block_fw', 'block_bw' or
    'batch') of every concern that applies, in order."""
    total = 0.0
    for term in self.concern_terms(kind):
      total = total + term
    return total

  @cached_property
  def block_fw_extra_s(self):
    """Exposed time the concerns add to the forward of every (base and
    edge) block, per microbatch (s): the declared ``block_fw`` terms
    (exposed CP ring, FSDP and expert-parallel traffic, FSDP's buffer
    copies); 0.0 where no concern applies.  A term of
    :attr:`~calculon.llm.terms.schedule.ScheduleTerms.baseblock_fw_time_s`
    and the edge block's; :func:`calculon.llm.prune.rate_bound` bounds
    the batch time with it."""
    return self._sum_terms('block_fw')

  @cached_property
  def block_bw_extra_s(self):
    """Exposed time the concerns add to the backward of every block, per
    microbatch (s): the declared ``block_bw`` terms when training, else 0
    (0.0 where no concern applies)."""
    extra = self._sum_terms('block_bw')
    if np.ndim(extra) == 0 and extra == 0.0:
      return 0.0
    if np.ndim(self.training) == 0 and self.training:
      return extra
    return np.where(self.training, extra, 0)

  @cached_property
  def modern_time_s(self):
    """Time beyond Calculon's terms, whole batch (s): the declared
    ``batch`` terms of the concerns that apply: exposed CP ring and FSDP
    traffic (and FSDP's buffer copies), the embedding, LM head and loss,
    exposed expert-parallel traffic, the system's fixed overheads and
    the MoE host floor (0 for Calculon's executions and systems)."""
    return self._sum_terms('batch')
