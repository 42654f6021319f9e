"""The work of one point: an optimal-execution search, as rows.

:func:`run_point` is what runs on a worker.  It is a pure function of the
point (the application and varied system travel inside it, so workers need
calculon but no file of the spec), so running it twice -- after a worker
died -- gives the same rows.
"""

from dataclasses import dataclass
import os
import time

#: Testing aid: seconds each point sleeps before its search (slows a sweep
#: down so tests can interrupt it); unset or empty in normal use.
DELAY_ENV = 'CALCULON_SWEEP_DELAY_S'


@dataclass
class PointResult:
  """Rows of one point and what its search did.

  Attributes:
    point_id: the point's id.
    rows: list of dicts, one per kept execution (best first), or one row
      with feasible=False when nothing is feasible.
    executions: executions evaluated by the search (fewer than the space
      with mbs_break).
    feasible: whether any execution is feasible.
    search_s: wall time of the search, seconds.
  """
  point_id: str
  rows: list
  executions: int
  feasible: bool
  search_s: float


def run_point(point):
  """Searches one point; never raises for an infeasible point.

  Returns:
    :class:`PointResult`.  A point whose system lacks the datatype, or with
    no feasible execution, gives one row with ``feasible=False`` and the
    reason (for the latter, the count of executions per infeasibility
    reason).

  Raises:
    Exception: only on an internal error (the point is then reported as
      failed by the sweep and retried by the next run).
  """
  import calculon
  from calculon.config import Application
  from calculon.errors import ConfigError
  from calculon.hardware import System
  from calculon.llm import search as S
  from calculon.llm.results import best_to_output
  from calculon.sweep.store import (
    STAT_COLUMNS, execution_columns, execution_default)

  delay = os.environ.get(DELAY_ENV, '')
  if delay:
    time.sleep(float(delay))
  start = time.perf_counter()
  base = {'point_id': point.id, **point.params}
  tail = {'calculon_version': calculon.__version__}
  app = Application.from_dict(point.application, point.label)
  system = System(point.system, point.label)
  try:
    system.check_datatype(point.datatype)
  except ConfigError as err:
    reason = f'system {point.params["system"]}: {err}'
    row = dict(base, rank=0, feasible=False, reason=reason, executions=0,
               feasible_executions=0, search_s=time.perf_counter() - start,
               **tail)
    return PointResult(point.id, [row], 0, False, row['search_s'])
  opts = point.search
  spec = S.SearchSpec(app, system, point.num_procs, point.max_batch_size,
                      point.datatype, list(opts.fused_activation),
                      mbs_break=opts.mbs_break,
                      allow_tp_overlap=opts.tp_overlap,
                      allow_dp_overlap=opts.dp_overlap,
                      framework=opts.framework)
  result = S.optimal_executions(spec, opts.top_n, workers=1)
  counts = dict(executions=result.evaluated,
                feasible_executions=result.feasible)
  if not result.best:
    why = ', '.join(f'{name}: {n}' for name, n in
                    S.reason_summary(result.reasons).items())
    reason = 'no feasible execution' + (f' ({why})' if why else
                                        ' (empty search space)')
    elapsed = time.perf_counter() - start
    row = dict(base, rank=0, feasible=False, reason=reason, **counts,
               search_s=elapsed, **tail)
    return PointResult(point.id, [row], result.evaluated, False, elapsed)
  output = best_to_output(spec, result)
  elapsed = time.perf_counter() - start
  rows = []
  exe_cols = execution_columns()
  for rank in range(len(output)):
    entry = output[str(rank)]
    row = dict(base, rank=rank, feasible=True, reason='')
    exe = entry['execution']
    row.update({name: exe.get(name, execution_default(name))
                for name in exe_cols})
    stats = entry['stats']
    row.update({name: float(stats.get(name, 0.0)) for name in STAT_COLUMNS})
    row.update(counts, search_s=elapsed, **tail)
    rows.append(row)
  return PointResult(point.id, rows, result.evaluated, True, elapsed)
