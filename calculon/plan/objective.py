"""The search's objective: the fastest step, the shortest run, the cheapest
or the least energy -- exactly.

The search (:func:`calculon.llm.search.optimal_executions`) ranks
executions by sample rate.  A whole run's time, cost and energy also
depend on the execution through the checkpoint each rank holds (its
save and load times), the power its activity draws and the step time's
granularity, so the fastest step is not always the shortest, cheapest or
least energy run.  :func:`rank` re-ranks exactly, never by heuristic:

1. search the top K by sample rate; price each one's whole run
   (:func:`calculon.plan.run.price_runs`);
2. every execution outside the top K has a sample rate r <= r_K (the K-th
   best); each objective has a lower bound f_lb(r) that holds for any
   execution of rate r and falls as r grows (:func:`objective_bound`):
   the computation samples / r, times the least wall factor (restart
   without a checkpoint load, checkpoints free: exp(R/M), Daly's model),
   and for energy the idle power over that time plus the dynamic energy
   of the model's FLOP at the best GEMM rate (the activity's floor,
   :mod:`calculon.plan.energy`);
3. if the top_n-th best objective found is at most f_lb(r_K), no
   execution outside the top K can beat it: done.  Otherwise K grows
   eightfold and the search runs again (when the whole feasible space is
   in the top K, the result is exhaustive).

With ``exact_batch`` only executions of that global batch are candidates
(the search's batch is the largest multiple of DP not above its maximum;
``calculon plan --batch B`` wants B exactly).
"""

from dataclasses import dataclass, field
import logging
import math

import numpy as np

from calculon.errors import ConfigError
from calculon.plan import energy as E
from calculon.plan import reliability as R
from calculon.plan import run as RUN

OBJECTIVES = ('throughput', 'time-to-train', 'cost', 'energy')
#: Tokens a ranking prices when none are given (any positive number ranks
#: the same: every objective is proportional to the tokens).
RANK_TOKENS = 1e12
#: First K of the re-ranking (throughput: the top_n).
FIRST_K = 16
GROWTH = 8
#: Relative margin of the proof against rounding (the search's
#: PRUNE_MARGIN).
MARGIN = 1e-9


@dataclass
class Ranked:
  """One ranked execution: its JSON record, its whole run (a
  :func:`calculon.plan.run.row` dict) and its objective value."""
  record: dict
  run: dict
  value: float
  rate: float


@dataclass
class RankResult:
  """Outcome of :func:`rank`.

  Attributes:
    best: list of :class:`Ranked`, best first (at most top_n).
    objective: the objective ranked by; unit: its unit.
    searched: K of the last search; proven: the bound proved the result
      (or the top K held every feasible execution); partial: interrupted.
    search: the last :class:`~calculon.llm.search.SearchResult`.
    bound: f_lb(r_K) of the last round (None when exhaustive).
  """
  best: list
  objective: str
  unit: str
  searched: int
  proven: bool
  partial: bool
  search: object = None
  bound: float = None
  rounds: list = field(default_factory=list)


UNITS = {'throughput': 's', 'time-to-train': 's', 'cost': 'USD',
         'energy': 'MWh'}


def check_objective(objective):
  """Raises ConfigError unless ``objective`` is one of :data:`OBJECTIVES`."""
  if objective not in OBJECTIVES:
    raise ConfigError(f'--objective {objective}: not allowed: one of '
                      f"{', '.join(OBJECTIVES)}", field='objective',
                      value=objective, allowed=', '.join(OBJECTIVES))


def objective_values(terms, objective, inputs):
  """The value to minimize of each priced run (array): throughput ->
  computation time (samples / rate), time-to-train -> wall time, cost ->
  USD (GPU-hours when nothing is priced), energy -> facility MWh;
  infeasible runs are +inf."""
  if objective == 'throughput':
    v = terms['compute_s']
  elif objective == 'time-to-train':
    v = terms['wall_s']
  elif objective == 'cost':
    v = terms['cost_usd'] if inputs.priced else terms['gpu_hours']
  else:
    v = terms['energy_mwh']
  v = np.asarray(v, dtype=float)
  return np.where(terms['feasible'] & np.isfinite(v), v, np.inf)


def objective_bound(objective, rate, spec, inputs, flops_per_token):
  """A lower bound of the objective over every execution of sample rate
  <= ``rate`` on ``spec.num_procs`` GPUs (see the module docstring).

  Args:
    rate: sample rate (sequences/s).
    flops_per_token: model FLOP per token (whole-attention convention).
  """
  n = spec.num_procs
  samples = inputs.tokens / spec.app.seq_size
  compute_lb = samples / rate
  if objective == 'throughput':
    return compute_lb
  unplanned, planned = RUN.job_rates_per_s(inputs.reliability, n)
  mtbi = 1.0 / unplanned if unplanned > 0 else math.inf
  wall_lb = compute_lb * R.lower_wall_factor(
    mtbi, inputs.reliability.restart_s, planned)
  if objective == 'time-to-train':
    return wall_lb
  pw = inputs.power
  peak, best_eff, _, _ = RUN.system_rates(spec.system, spec.datatype)
  nodes = float(E.nodes_of(n, pw.gpus_per_node))
  standing_w = n * (pw.gpu_idle_w + pw.network_w_per_gpu) + \
    nodes * pw.node_overhead_w
  energy_lb_j = pw.pue * (standing_w * wall_lb + (
    pw.gpu_busy_w - pw.gpu_idle_w) * flops_per_token * inputs.tokens /
    (peak * best_eff))
  energy_lb = energy_lb_j / E.J_PER_MWH
  if objective == 'energy':
    return energy_lb
  hours = wall_lb / 3600.0
  if not inputs.priced:
    return n * hours
  cost = energy_lb * 1000.0 * inputs.price_kwh
  if inputs.price_gpu_hour is not None:
    cost += n * hours * inputs.price_gpu_hour
  if inputs.price_node_hour is not None:
    cost += nodes * hours * inputs.price_node_hour
  return cost


def batch_groups(spec, exact_batch):
  """The search's (TP, PP, CP) groups whose batch is ``exact_batch``.

  Raises:
    ConfigError: none (no data-parallel degree of the GPU count divides
      the batch for a parallel layout the model allows).
  """
  from calculon.llm import search as S
  groups = S.groups(spec)
  keep = [g for g in groups if g.batch_size == exact_batch]
  if not keep:
    dps = sorted({g.dp for g in groups})
    shown = ', '.join(str(d) for d in dps[:12]) + (', ...' if len(dps) > 12
                                                    else '')
    raise ConfigError(
      f'--batch {exact_batch} is not allowed for {spec.num_procs} GPUs: no '
      'data-parallel degree of a parallel layout the model allows divides '
      f'it (data-parallel degrees: {shown})', field='batch',
      value=exact_batch)
  return keep


def rank(spec, objective='throughput', top_n=1, workers=1, *, inputs=None,
         exact_batch=None, chunk_size=None, on_progress=None, log=None):
  """The ``top_n`` executions of ``spec`` best for ``objective``, exactly.

  Args:
    spec: :class:`~calculon.llm.search.SearchSpec`.
    objective: one of :data:`OBJECTIVES`.
    top_n: how many to return.
    workers: search processes.
    inputs: :class:`~calculon.plan.run.RunInputs` (default: the system's
      sections or the documented defaults, :data:`RANK_TOKENS` tokens).
    exact_batch: only executions of this global batch (None: the
      search's batch rule).
    chunk_size, on_progress: passed to the search.
    log: a logger for the rounds (None: calculon's).

  Returns:
    :class:`RankResult` (``best`` empty when nothing is feasible).

  Raises:
    ConfigError: an unknown objective, or an ``exact_batch`` no layout
      reaches (:func:`batch_groups`).
  """
  from calculon.llm import search as S
  check_objective(objective)
  log = log or logging.getLogger('calculon')
  if inputs is None:
    inputs = RUN.run_inputs(spec.system, RANK_TOKENS)
  if exact_batch is not None:
    batch_groups(spec, exact_batch)
  k = top_n if objective == 'throughput' else max(top_n, FIRST_K)
  rounds = []
  while True:
    result = S.optimal_executions(spec, k, workers, chunk_size, on_progress)
    best = result.best
    chosen = [(rate, S.execution_record(spec, result.groups[gi], flat))
              for rate, gi, flat in best
              if exact_batch is None or
              result.groups[gi].batch_size == exact_batch]
    ranked = []
    flops_per_token = None
    if chosen:
      records = [rec for _, rec in chosen]
      terms = RUN.price_runs(spec.app, spec.system, records, inputs)
      values = objective_values(terms, objective, inputs)
      order = sorted(range(len(records)), key=lambda i: values[i])
      ranked = [Ranked(records[i], RUN.row(terms, i), float(values[i]),
                       chosen[i][0]) for i in order[:top_n]
                if np.isfinite(values[i])]
      flops_per_token = _flops_per_token(spec, records[0])
    exhaustive = len(best) < k or result.partial
    bound = None
    if not exhaustive:
      rate_k = best[-1][0]
      if flops_per_token is None:
        flops_per_token = _flops_per_token(
          spec, S.execution_record(spec, result.groups[best[-1][1]],
                                   best[-1][2]))
      bound = objective_bound(objective, rate_k, spec, inputs,
                              flops_per_token)
    rounds.append((k, bound, ranked[-1].value if len(ranked) == top_n
                   else None))
    # The search's own margin (PRUNE_MARGIN) against rounding: the rates
    # re-priced here may differ from the search's in the last bit.
    proven = exhaustive or (len(ranked) == top_n and
                            ranked[-1].value <= bound * (1 + MARGIN))
    if proven or result.partial:
      return RankResult(ranked, objective, UNITS[objective], k,
                        proven and not result.partial, result.partial,
                        result, bound, rounds)
    log.info(f'  objective {objective}: the best of the top {k} by sample '
             f'rate is not proven; searching the top {k * GROWTH}')
    k *= GROWTH


def _flops_per_token(spec, record):
  """Model FLOP per token of ``spec``'s application (whole attention
  matrix), from the engine."""
  from calculon.frameworks.resolve import records_columns
  from calculon.llm import evaluate_columns
  from calculon.llm.stats import stat_value
  ev = evaluate_columns(spec.app, spec.system,
                        records_columns(spec.app, [record]), validate=False)
  flops = float(np.ravel(stat_value(ev, 'model_flops_per_batch'))[0])
  return flops / (record['batch_size'] * spec.app.seq_size)


def to_output(spec, result, layers=False):
  """Calculon's search output ({'0': {'execution', 'stats'}, ...}) of a
  :class:`RankResult`, each entry with its whole run ('whole_run') and
  objective ('objective': name, value, unit); statistics re-priced through
  the single-run API as :func:`calculon.llm.results.best_to_output` does."""
  from calculon.llm.compat import Llm
  output = {}
  for i, item in enumerate(result.best):
    model = Llm(Llm.Application(spec.app))
    model.compile(spec.system, Llm.Execution.from_json(item.record))
    model.run(spec.system)
    output[str(i)] = {
      'execution': item.record, 'stats': model.get_stats_json(layers),
      'objective': {'name': result.objective, 'value': item.value,
                    'unit': result.unit},
      'whole_run': item.run}
  return output
