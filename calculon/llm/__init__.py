"""The LLM (transformer) performance model.

* :func:`evaluate` -- a DataFrame of executions in, every statistic out.
* :func:`evaluate_columns` -- the engine on numpy columns (any shapes).
* :class:`Llm` -- Calculon-compatible single-run API.
"""

from calculon.llm.engine import evaluate, evaluate_columns, check_compatible
from calculon.llm.compat import Llm
from calculon.llm.stats import STATS, STAT_NAMES

__all__ = ['Llm', 'evaluate', 'evaluate_columns', 'check_compatible', 'STATS',
           'STAT_NAMES']
