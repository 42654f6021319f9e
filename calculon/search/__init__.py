"""The search: every execution of a framework's space for N processors,
and the best.

* :mod:`calculon.search.grid` -- what is searched: the spec, the layouts
  (groups) and their option axes, the execution columns of a grid, which
  combinations are enumerated, an execution written back as JSON;
* :mod:`calculon.search.exhaustive` -- pricing every execution of a chunk
  and keeping the best (ties toward the simpler execution);
* :mod:`calculon.search.bound` -- branch and bound: bounds of the sample
  rate from the engine's public terms, and the pruned search of a group;
* :mod:`calculon.search.driver` -- running it on worker processes.

Each imports only those listed before it (no cycle).
"""

from calculon.search.driver import (  # noqa: F401
  SearchResult, all_executions, optimal_executions)
from calculon.search.grid import (  # noqa: F401
  SearchSpec, count_space, execution_record, groups, reason_summary)
