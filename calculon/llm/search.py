"""The search's public names where earlier releases had them (the search
lives in :mod:`calculon.search`: grid, exhaustive, bound, driver)."""

from calculon.llm.model import Evaluation  # noqa: F401
from calculon.search.bound import reduced_group  # noqa: F401
from calculon.search.driver import (  # noqa: F401
  SearchResult, all_executions, optimal_executions, tasks_of)
from calculon.search.exhaustive import (  # noqa: F401
  Best, ChunkResult, chunk_rows, evaluate_chunk, mbs_break_mask,
  merge_best, top_of)
from calculon.search.grid import (  # noqa: F401
  AXES, BOOL_AXES, DEFAULT_CHUNK, KERNEL_ORDER, LIMITS, MODERN_AXES,
  MODERN_CHUNK, MODERN_RECOMPUTE_ORDER, MOE_AXES, RECOMPUTE_ORDER,
  REDUCED_CHUNK, SHARDING_ORDER, SPACES, TP_COMM_ORDER, TP_OVERLAP_ORDER,
  Chunk, Group, SearchSpec, chunks, columns, count_space, count_valid,
  execution_record, grid_columns, groups, reason_summary, valid_count,
  valid_mask)
