"""``calculon plan``'s work: a whole run for each GPU count.

For every GPU count: the execution best for the objective (the search,
re-ranked exactly by :func:`calculon.plan.objective.rank`, with exactly
the batch asked for) or the given one, and its whole run
(:func:`calculon.plan.run.price_runs`).
"""

from dataclasses import dataclass, field
import time

from calculon.errors import ConfigError
from calculon.plan import objective as O
from calculon.plan import run as RUN


@dataclass
class PlanRow:
  """The run planned for one GPU count.

  Attributes:
    gpus: the GPU count.
    status: 'ok' or 'infeasible' (no execution fits).
    execution: the execution (JSON dict) or None.
    run: the run's terms (:func:`calculon.plan.run.row`) or None.
    objective_value: the objective of the execution (its unit in the
      plan).
    searched: executions the last search ranked by rate (K), 0 when the
      execution was given; proven: the objective's bound proved it.
    elapsed_s: wall time of this count's search and pricing.
    reason: why infeasible.
    binds: what binds the execution (:func:`calculon.report.binding`),
      or None.
  """
  gpus: int
  status: str
  execution: dict = None
  run: dict = None
  objective_value: float = None
  searched: int = 0
  proven: bool = True
  elapsed_s: float = 0.0
  reason: str = ''
  binds: dict = None


@dataclass
class Plan:
  """A plan: the inputs and one :class:`PlanRow` per GPU count."""
  objective: str
  inputs: object
  rows: list = field(default_factory=list)
  given_execution: bool = False

  @property
  def best(self):
    """The feasible row with the least objective value (None if none)."""
    ok = [r for r in self.rows if r.status == 'ok']
    return min(ok, key=lambda r: r.objective_value) if ok else None


def check_counts(app, system, gpus, batch, datatype, framework=None):
  """Raises ConfigError unless every GPU count has a parallel layout
  (of ``framework``'s space) whose data-parallel degree divides ``batch``
  (before any work)."""
  from calculon.llm import search as S
  for n in gpus:
    O.batch_groups(S.SearchSpec(app, system, n, batch, datatype,
                                framework=framework), batch)


def plan(app, system, gpus, batch, datatype, inputs, objective='throughput',
         workers=1, log=None, progress=None, framework=None):
  """Plans a run for each GPU count by searching.

  Args:
    app, system: Application and System.
    gpus: list of GPU counts.
    batch: global batch (sequences), exactly.
    datatype: name.
    inputs: :class:`~calculon.plan.run.RunInputs`.
    objective: one of :data:`calculon.plan.objective.OBJECTIVES`.
    workers: search processes.
    log: logger told of each count (or None).
    progress: callable(str) or None.
    framework: the framework preset whose space is searched (None: the
      default for the application, see :mod:`calculon.frameworks`).

  Returns:
    :class:`Plan`.

  Raises:
    ConfigError: a GPU count whose layouts cannot reach the batch, a
      datatype the system lacks.
  """
  from calculon.llm import search as S
  system.check_datatype(datatype)
  check_counts(app, system, gpus, batch, datatype, framework)
  out = Plan(objective, inputs)
  for n in gpus:
    start = time.perf_counter()
    spec = S.SearchSpec(app, system, n, batch, datatype, framework=framework)
    result = O.rank(spec, objective, 1, workers, inputs=inputs,
                    exact_batch=batch, log=log)
    elapsed = time.perf_counter() - start
    if not result.best:
      row = PlanRow(n, 'infeasible', searched=result.searched,
                    elapsed_s=elapsed,
                    reason='no execution of this batch fits the system')
    else:
      top = result.best[0]
      row = PlanRow(n, 'ok', top.record, top.run, top.value,
                    result.searched, result.proven, elapsed,
                    binds=binds_of(app, system, top.record))
    out.rows.append(row)
    if progress is not None:
      progress(row)
  return out


def plan_execution(app, system, record, inputs, objective='throughput'):
  """The run of one given execution (JSON dict, checked).

  Raises:
    ConfigError: the execution does not fit the application or system.
  """
  start = time.perf_counter()
  terms = RUN.price_runs(app, system, [record], inputs)
  value = float(O.objective_values(terms, objective, inputs)[0])
  run = RUN.row(terms, 0)
  status = 'ok' if run['feasible'] else 'infeasible'
  out = Plan(objective, inputs, given_execution=True)
  out.rows.append(PlanRow(record['num_procs'], status, record, run,
                          value if status == 'ok' else None, 0, True,
                          time.perf_counter() - start, run['reason'],
                          binds_of(app, system, record)
                          if status == 'ok' else None))
  return out


def binds_of(app, system, record):
  """What binds the execution ``record`` (:func:`calculon.report.binding`
  of its statistics, priced once through the single-run API)."""
  from calculon.llm.compat import Llm
  from calculon.report import binding
  model = Llm(Llm.Application(app))
  model.compile(system, Llm.Execution.from_json(record))
  model.run(system)
  return binding(model.get_stats_json(), system.mem1.capacity_bytes)


def execution_record(cfg, source):
  """A JSON execution checked (:class:`~calculon.config.Execution`) and
  returned as a record (its descriptive fields dropped).

  Raises:
    ConfigError: the execution is invalid.
  """
  from calculon.config import Execution
  Execution.from_dict(cfg, source)
  if not cfg.get('training', True):
    raise ConfigError(f"{source}: field 'training' = false is not allowed: "
                      'a training run plans training executions',
                      source=source, field='training', value=False)
  return {k: v for k, v in cfg.items() if k not in ('name', 'source',
                                                     'notes')}
