"""Time, memory and efficiency of one training (or inference) batch.

:class:`Evaluation` prices executions given as
:class:`~calculon.config.ExecutionColumns`: every quantity is a lazily
computed numpy array broadcast over the executions, so a single run (0-d
arrays), a DataFrame of executions (1-d) and a whole search grid (N-d,
each option varying along its own axis) go through the same formulas.  Only
what is asked for is computed: a search asks for ``sample_rate`` and
``feasible`` and never builds the rest.

Schedule model (Calculon, Isaev et al. SC'23, section 3; Narayanan et al.
SC'21 for 1F1B and the interleaved schedule): each processor holds
``blocks_per_proc`` blocks split into ``pipeline_interleaving`` chunks; a chunk
is ``blocks_per_chunk - 1`` *base* blocks followed by one *edge* block that
also sends the activation to the next pipeline stage.  Times are for
processor 0.

The formulas live in :mod:`calculon.llm.terms`, one module per concern
(:mod:`calculon.llm.terms.evaluation` lists them); this module re-exports
the names other code imports.
"""

from calculon.llm.terms.base import (
  Concern, quantize_bytes_per_element, _hidden_behind, _max, _min, _pos,
  _scalar_if_zero)
from calculon.llm.terms.blocks import TotalsAt
from calculon.llm.terms.evaluation import Evaluation, PARTS
from calculon.llm.terms.feasibility import (
  OK, NETWORK_TOO_SMALL, NETWORK_NOT_FILLED, INTERLEAVING_TOO_LARGE,
  INTERLEAVING_NOT_FACTOR, OFFLOAD_TOO_FEW_BLOCKS, MEM1_TOO_SMALL,
  MEM2_TOO_SMALL, NON_FINITE, ENGINE_ERROR, REASON_NAMES)

__all__ = [
  'Evaluation', 'PARTS', 'Concern', 'TotalsAt', 'quantize_bytes_per_element',
  'OK', 'NETWORK_TOO_SMALL', 'NETWORK_NOT_FILLED', 'INTERLEAVING_TOO_LARGE',
  'INTERLEAVING_NOT_FACTOR', 'OFFLOAD_TOO_FEW_BLOCKS', 'MEM1_TOO_SMALL',
  'MEM2_TOO_SMALL', 'NON_FINITE', 'ENGINE_ERROR', 'REASON_NAMES',
  '_hidden_behind', '_max', '_min', '_pos', '_scalar_if_zero']
