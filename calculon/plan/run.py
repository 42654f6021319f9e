"""A whole training run of given executions: time, goodput, energy, cost.

:func:`run_inputs` gathers what a run needs beyond the step (the system's
``reliability``, ``storage`` and ``power`` sections or their documented
defaults, the framework's checkpoint policy, the tokens, the prices);
:func:`price_runs` prices executions (JSON records, vectorized in one
engine call) and returns every term of the run as arrays
(:data:`TERMS` lists them with units).

The run, for each execution (docs/plan.md gives each formula its source):

1. steps = tokens / (batch x sequence); computation T_s = steps x step
   time;
2. interruptions: the job's mean time between unplanned interruptions
   M = 1 / rate(N) (:mod:`calculon.plan.reliability`), planned ones at
   rate lambda_p;
3. checkpoints (:mod:`calculon.plan.checkpoint`): a save costs the
   training delta = stall + background slowdown x persist time; a restart
   costs R' = restart + load + persist (the save in flight is lost);
4. the interval tau: whole steps, at least one step and one persist time,
   minimizing Daly's complete model;
5. wall time T_w = T_s x wall_factor(tau, delta, M, R') / (1 - lambda_p
   (restart + load)); goodput = T_s / T_w;
6. energy (:mod:`calculon.plan.energy`) and cost.
"""

from dataclasses import dataclass, field
import math

import numpy as np

from calculon.config.whole_run import (
  DEFAULT_POWER, DEFAULT_RELIABILITY, DEFAULT_SOURCES, DEFAULT_STORAGE)
from calculon.errors import ConfigError
from calculon.plan import checkpoint as C
from calculon.plan import energy as E
from calculon.plan import reliability as R
from calculon.plan.framework import checkpoint_saving

SECONDS_PER_DAY = 86400.0

#: Statistics (calculon.llm.stats names) a run reads from the engine.
RUN_STATS = tuple(dict.fromkeys(
  ('total_time', 'sample_rate', 'weight_space', 'optimizer_space',
   'num_parameters', 'mfu', 'proc_mem_tier1_cap_req') + E.ACTIVITY_STATS))


@dataclass
class RunInputs:
  """Everything a run needs beyond the executions.

  Attributes:
    tokens: tokens to train on.
    reliability, storage, power: :mod:`calculon.config.whole_run` records.
    policy: :class:`~calculon.plan.framework.CheckpointPolicy`.
    framework: the framework named (None: default policy).
    price_gpu_hour, price_node_hour: USD per GPU-hour / per node-hour
      (None: not priced).
    price_kwh: USD per kWh of facility energy added to the cost (0: the
      GPU-hour price includes power, as cloud prices do).
    defaults: the sections taken from the documented defaults.
  """
  tokens: float
  reliability: object = DEFAULT_RELIABILITY
  storage: object = DEFAULT_STORAGE
  power: object = DEFAULT_POWER
  policy: object = None
  framework: str = None
  price_gpu_hour: float = None
  price_node_hour: float = None
  price_kwh: float = 0.0
  defaults: tuple = field(default_factory=tuple)

  @property
  def priced(self):
    """Whether a cost in USD can be given."""
    return self.price_gpu_hour is not None or \
      self.price_node_hour is not None or self.price_kwh > 0

  def describe(self):
    """JSON-ready dict of every input and where it comes from."""
    rel, sto, pw = self.reliability, self.storage, self.power
    return {
      'tokens': self.tokens,
      'framework': self.framework,
      'checkpoint_policy': {
        'mode': self.policy.mode, 'parallel_save': self.policy.parallel_save,
        'parallel_load': self.policy.parallel_load,
        'background_slowdown': self.policy.background_slowdown,
        'source': self.policy.source},
      'reliability': {
        'interruptions_per_gpu_hour': dict(rel.interruptions_per_gpu_hour),
        'planned_per_gpu_hour': rel.planned_per_gpu_hour,
        'job_size_exponent': rel.job_size_exponent,
        'reference_gpus': rel.reference_gpus, 'restart_s': rel.restart_s},
      'storage': {'write_GBps': sto.write_GBps, 'read_GBps': sto.read_GBps,
                  'node_GBps': sto.node_GBps},
      'power': {k: getattr(pw, k) for k in (
        'gpu_busy_w', 'gpu_idle_w', 'memory_activity', 'network_activity',
        'node_overhead_w', 'network_w_per_gpu', 'gpus_per_node', 'pue')},
      'price_gpu_hour_usd': self.price_gpu_hour,
      'price_node_hour_usd': self.price_node_hour,
      'price_kwh_usd': self.price_kwh,
      'sections_from_defaults': list(self.defaults),
      'default_sources': {k: DEFAULT_SOURCES[k] for k in self.defaults},
    }


def run_inputs(system, tokens, framework=None, checkpoint_mode=None,
               price_gpu_hour=None, price_node_hour=None, price_kwh=0.0,
               background_slowdown=None):
  """:class:`RunInputs` of ``system`` (a :class:`~calculon.hardware.System`):
  its sections, or the documented defaults where it has none.

  Raises:
    ConfigError: tokens or a price not a positive number, an unknown
      framework, a background slowdown outside [0, 1).
  """
  for name, value, strict in (('tokens', tokens, True),
                              ('--price', price_gpu_hour, True),
                              ('--node-price', price_node_hour, True),
                              ('--energy-price', price_kwh, False)):
    if value is None:
      continue
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) \
      and math.isfinite(value) and (value > 0 if strict else value >= 0)
    if not ok:
      raise ConfigError(f'{name} {value!r} is not allowed: a positive number',
                        field=name, value=value)
  defaults = tuple(name for name in ('reliability', 'storage', 'power')
                   if getattr(system, name, None) is None)
  return RunInputs(
    tokens=float(tokens),
    reliability=getattr(system, 'reliability', None) or DEFAULT_RELIABILITY,
    storage=getattr(system, 'storage', None) or DEFAULT_STORAGE,
    power=getattr(system, 'power', None) or DEFAULT_POWER,
    policy=checkpoint_saving(framework, mode=checkpoint_mode,
                             background_slowdown=background_slowdown),
    framework=framework, price_gpu_hour=price_gpu_hour,
    price_node_hour=price_node_hour, price_kwh=float(price_kwh or 0.0),
    defaults=defaults)


def system_rates(system, datatype):
  """(peak matrix FLOP/s, best GEMM efficiency, host link B/s per GPU,
  scale-out B/s per GPU) of ``system`` for ``datatype`` (name)."""
  from calculon.config.execution import DATATYPE_NAMES
  cfg = system.config
  peak = float(system.matrix.peak_flops(DATATYPE_NAMES.index(datatype)))
  best = max(e for _, e in cfg.matrix.efficiency[datatype].points)
  host = cfg.mem2.bandwidth_bytes_per_s
  net = cfg.networks[-1]
  return peak, best, host, net.bandwidth_bytes_per_s * net.efficiency


def job_rates_per_s(reliability, gpus):
  """(unplanned, planned) interruptions per second of a job of ``gpus``."""
  rel = reliability
  unplanned = R.job_rate_per_s(rel.unplanned_per_gpu_hour, gpus,
                               rel.reference_gpus, rel.job_size_exponent)
  planned = R.job_rate_per_s(rel.planned_per_gpu_hour, gpus,
                             rel.reference_gpus, rel.job_size_exponent)
  return unplanned, planned


def evaluate_records(app, system, records, source='<execution>'):
  """Engine statistics of JSON execution records (one vectorized call),
  each resolved against its framework preset as ``calculon llm`` does.

  Returns:
    (dict name -> 1-d array over the records for :data:`RUN_STATS`,
    feasible bool array, list of reason messages ('' when feasible)).

  Raises:
    ConfigError: a record does not fit the application or the system.
  """
  from calculon.frameworks.resolve import records_columns
  from calculon.llm import evaluate_columns
  from calculon.llm.stats import stat_arrays
  cols = records_columns(app, records, source=source)
  ev = evaluate_columns(app, system, cols, source=source)
  stats = stat_arrays(ev, RUN_STATS)
  feasible = np.broadcast_to(np.asarray(ev.feasible), (len(records),))
  reasons = ['' if feasible[i] else ev.reason_message((i,))
             for i in range(len(records))]
  return stats, np.array(feasible), reasons


def price_runs(app, system, records, inputs, stats=None):
  """Every term of the whole run of each execution.

  Args:
    app: :class:`~calculon.config.Application`.
    system: :class:`~calculon.hardware.System`.
    records: list of execution JSON dicts (same application and system;
      any GPU counts and batches).
    inputs: :class:`RunInputs`.
    stats: the engine statistics already computed for ``records``
      (:func:`evaluate_records`), or None.

  Returns:
    dict term -> 1-d array over the records (:data:`TERMS`), plus
    'feasible' (bool) and 'reason' (list of str).

  Raises:
    ConfigError: a record does not fit the application or the system.
  """
  if stats is None:
    stats, feasible, reasons = evaluate_records(app, system, records)
  else:
    stats, feasible, reasons = stats
  n = np.array([r['num_procs'] for r in records], dtype=float)
  batch = np.array([r['batch_size'] for r in records], dtype=float)
  datatypes = {r['datatype'] for r in records}
  if len(datatypes) != 1:
    raise ValueError('price_runs: records of one datatype at a time')
  peak, best_eff, host_bps, net_bps = system_rates(system,
                                                   datatypes.pop())
  rel, pw, pol = inputs.reliability, inputs.power, inputs.policy
  seq = float(app.seq_size)
  out = {'gpus': n, 'batch': batch}
  with np.errstate(divide='ignore', invalid='ignore', over='ignore'):
    step = np.asarray(stats['total_time'], float)
    rate = np.asarray(stats['sample_rate'], float)
    samples = inputs.tokens / seq
    out['steps'] = samples / batch
    out['step_s'] = step
    out['sample_rate'] = rate
    out['tokens_per_s'] = rate * seq
    out['mfu'] = np.asarray(stats['mfu'], float)
    out['model_flops_per_token'] = np.asarray(
      stats['model_flops_per_batch'], float) / (batch * seq)
    compute_s = samples / rate
    out['compute_s'] = compute_s
    # Interruptions.
    unplanned, planned = job_rates_per_s(rel, n)
    unplanned = np.broadcast_to(unplanned, n.shape)
    planned = np.broadcast_to(planned, n.shape)
    mtbi = np.where(unplanned > 0, 1.0 / unplanned, np.inf)
    out['mtbi_s'] = mtbi
    out['interruptions_per_day'] = unplanned * SECONDS_PER_DAY
    out['planned_per_day'] = planned * SECONDS_PER_DAY
    # Checkpoints.
    replicas = np.array([r['data_par'] * r.get('context_par', 1)
                         for r in records], dtype=float)
    ck = C.checkpoint_cost(stats['num_parameters'], stats['weight_space'],
                           stats['optimizer_space'], n, replicas,
                           inputs.storage, pol, pw.gpus_per_node, host_bps,
                           net_bps)
    out['checkpoint_bytes'] = ck.size_bytes
    out['checkpoint_rank_state_bytes'] = ck.rank_state_bytes
    out['checkpoint_write_rank_bytes'] = ck.write_rank_bytes
    out['checkpoint_stall_s'] = ck.stall_s
    out['checkpoint_persist_s'] = ck.persist_s
    out['checkpoint_load_s'] = ck.load_s
    delta = ck.stall_s + pol.background_slowdown * ck.persist_s
    restart = rel.restart_s + ck.load_s
    restart_eff = restart + ck.persist_s
    out['checkpoint_cost_s'] = delta
    out['restart_s'] = restart
    k, tau, factor = R.interval_steps(step, delta, mtbi, restart_eff,
                                      ck.persist_s)
    out['checkpoint_interval_steps'] = k
    out['checkpoint_interval_s'] = tau
    out['young_interval_s'] = R.young_interval_s(delta, mtbi)
    out['daly_interval_s'] = R.daly_first_order_s(delta, mtbi, restart_eff)
    out['optimal_interval_s'] = R.optimal_interval_s(delta, mtbi)
    lost_planned = planned * restart
    wall = np.where(lost_planned < 1, compute_s * factor /
                    (1.0 - lost_planned), np.inf)
    out['wall_s'] = wall
    out['goodput'] = np.where(np.isfinite(wall), compute_s / wall, 0.0)
    out['wall_days'] = wall / SECONDS_PER_DAY
    out['gpu_hours'] = n * wall / 3600.0
    nodes = E.nodes_of(n, pw.gpus_per_node)
    out['nodes'] = nodes
    out['node_hours'] = nodes * wall / 3600.0
    out['tokens_per_day'] = inputs.tokens / out['wall_days']
    # Where the wall time goes (for the energy; expected values).
    n_unplanned = wall / mtbi
    n_planned = planned * wall
    out['interruptions'] = n_unplanned
    out['planned_interruptions'] = n_planned
    stall_total = compute_s / tau * ck.stall_s
    restart_total = (n_unplanned + n_planned) * restart
    out['stall_total_s'] = stall_total
    out['restart_total_s'] = restart_total
    lost = np.maximum(0.0, wall - compute_s - stall_total - restart_total)
    out['lost_work_s'] = lost
    # Energy.
    act = E.activity(stats, n, peak, best_eff, pw)
    out['activity_compute'] = act.compute
    out['activity_memory'] = act.memory
    out['activity_network'] = act.network
    out['activity'] = act.activity
    p_train = E.gpu_power_w(act.activity, pw)
    out['gpu_power_w'] = p_train
    en = E.run_energy(n, p_train, compute_s + lost,
                      stall_total + restart_total, wall, pw)
    out['gpu_energy_mwh'] = en.gpu_j / E.J_PER_MWH
    out['node_energy_mwh'] = en.node_j / E.J_PER_MWH
    out['network_energy_mwh'] = en.network_j / E.J_PER_MWH
    out['it_energy_mwh'] = en.it_j / E.J_PER_MWH
    out['energy_mwh'] = en.facility_j / E.J_PER_MWH
    out['average_power_mw'] = en.facility_j / wall / 1e6
    # Cost.
    out['cost_usd'] = cost_usd(out['gpu_hours'], out['node_hours'],
                               out['energy_mwh'], inputs)
  out['mem_tier1_bytes'] = np.asarray(stats['proc_mem_tier1_cap_req'], float)
  out['feasible'] = np.asarray(feasible, dtype=bool)
  out['reason'] = list(reasons)
  return out


def cost_usd(gpu_hours, node_hours, energy_mwh, inputs):
  """GPU-hours x price + node-hours x node price + kWh x energy price
  (an array of NaN when nothing is priced)."""
  gpu_hours = np.asarray(gpu_hours, dtype=float)
  if not inputs.priced:
    return np.full(gpu_hours.shape, np.nan)
  cost = np.zeros(gpu_hours.shape)
  if inputs.price_gpu_hour is not None:
    cost = cost + gpu_hours * inputs.price_gpu_hour
  if inputs.price_node_hour is not None:
    cost = cost + np.asarray(node_hours, float) * inputs.price_node_hour
  return cost + np.asarray(energy_mwh, float) * 1000.0 * inputs.price_kwh


#: Every term of a run: name -> (unit, description).
TERMS = {
  'gpus': ('1', 'GPUs of the job'),
  'batch': ('1', 'global batch, sequences'),
  'steps': ('1', 'optimizer steps: tokens / (batch x sequence)'),
  'step_s': ('s', 'time of one step (the engine)'),
  'sample_rate': ('1/s', 'sequences per second'),
  'tokens_per_s': ('1/s', 'tokens per second of computation'),
  'mfu': ('1', 'model FLOP utilization of the step'),
  'model_flops_per_token': ('FLOP', 'model FLOP per token (6N + 12LHQT: '
                            'whole attention matrix)'),
  'compute_s': ('s', 'computation: steps x step time'),
  'mtbi_s': ('s', "the job's mean time between unplanned interruptions"),
  'interruptions_per_day': ('1/day', 'unplanned interruptions per day'),
  'planned_per_day': ('1/day', 'planned interruptions per day'),
  'checkpoint_bytes': ('B', 'the checkpoint: parameters x 14 bytes'),
  'checkpoint_rank_state_bytes': ('B', 'weights + optimizer state one rank '
                                  'holds'),
  'checkpoint_write_rank_bytes': ('B', 'bytes the busiest rank writes'),
  'checkpoint_stall_s': ('s', 'training stalled per save'),
  'checkpoint_persist_s': ('s', 'background write of an async save'),
  'checkpoint_load_s': ('s', 'loading the checkpoint at a restart'),
  'checkpoint_cost_s': ('s', 'cost of a save to training (stall + '
                        'background slowdown x persist)'),
  'restart_s': ('s', 'one restart: restart time + checkpoint load'),
  'checkpoint_interval_steps': ('1', 'steps between checkpoints'),
  'checkpoint_interval_s': ('s', 'computation between checkpoints'),
  'young_interval_s': ('s', "Young's sqrt(2 delta M), for reference"),
  'daly_interval_s': ('s', "Daly's sqrt(2 delta (M + R)), for reference"),
  'optimal_interval_s': ('s', "exact optimum of Daly's model (continuous)"),
  'wall_s': ('s', 'wall-clock time of the run'),
  'goodput': ('1', 'effective training time ratio: computation / wall'),
  'wall_days': ('day', 'wall-clock days'),
  'gpu_hours': ('GPU-h', 'GPUs x wall hours'),
  'nodes': ('1', 'whole nodes'),
  'node_hours': ('node-h', 'nodes x wall hours'),
  'tokens_per_day': ('1/day', 'tokens per wall-clock day'),
  'interruptions': ('1', 'expected unplanned interruptions of the run'),
  'planned_interruptions': ('1', 'expected planned interruptions'),
  'stall_total_s': ('s', 'wall time stalled on checkpoint saves'),
  'restart_total_s': ('s', 'wall time restarting'),
  'lost_work_s': ('s', 'wall time redoing lost work (and slowed by '
                  'background saves)'),
  'activity_compute': ('1', 'share of the step the matrix engine is busy'),
  'activity_memory': ('1', 'share of the step in memory-bound kernels'),
  'activity_network': ('1', 'share of the step the links are busy'),
  'activity': ('1', 'GPU activity driving its power'),
  'gpu_power_w': ('W', 'a GPU while training'),
  'gpu_energy_mwh': ('MWh', 'energy of the GPUs'),
  'node_energy_mwh': ('MWh', "energy of the nodes' other parts"),
  'network_energy_mwh': ('MWh', 'energy of the scale-out fabric'),
  'it_energy_mwh': ('MWh', 'IT energy: GPUs + nodes + fabric'),
  'energy_mwh': ('MWh', 'facility energy: IT x PUE'),
  'average_power_mw': ('MW', 'average facility power'),
  'cost_usd': ('USD', 'GPU-hours x price + node-hours x node price + kWh x '
               'energy price'),
  'mem_tier1_bytes': ('B', 'memory tier 1 one GPU needs'),
}


def row(terms, i):
  """The terms of execution ``i`` as a JSON-ready dict (floats; None for
  NaN)."""
  out = {}
  for name in TERMS:
    value = float(np.asarray(terms[name])[i])
    out[name] = None if math.isnan(value) else (
      value if math.isfinite(value) else None)
  out['feasible'] = bool(terms['feasible'][i])
  out['reason'] = terms['reason'][i]
  return out
