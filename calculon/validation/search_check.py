"""The search against tuned recipes: ``llm-validation --suite published
--search`` (issue 34, item 1).

For every priced row of a :class:`~calculon.validation.published.Suite`
the search (:mod:`calculon.search`) looks for the fastest execution in the
row's framework preset (``case.fixed['framework']``) for the row's
application (``case.priced_app``), system (``suite.system(case)``), GPUs,
exact global batch, sequence and datatype, with the row's precision recipe
(``precision_recipe``, ``quantization_scaling``) and every other setting
the row or its source's rules fix that is not a layout choice
(:func:`fixed_fields`: ``recompute_modules`` -- which modules a selective
recomputation recomputes --, ``expert_imbalance``, the behaviours a
source rule sets ...).  Per row it reports, in tokens per second per GPU:

* ``best_tok_s_gpu``: the search's best (re-priced through the single-run
  API, :func:`calculon.llm.results.best_to_output`), and its execution;
* ``measured_tok_s_gpu``: the measured figure (the suite's conversion of
  the row's metric to a batch time, :data:`~calculon.validation.mapping.
  CONVERSIONS`, as a throughput: B s / (t N));
* ``recipe_tok_s_gpu``: the model's price of the recipe itself (the
  published suite's prediction for the row, its fastest candidate of the
  unknown settings);
* ``ratio_measured = best / measured`` and ``ratio_recipe = best /
  recipe``.

A row whose source is a tuned recipe (:data:`TUNED_SOURCES`) is the
reference: the search claiming much more than was measured there is a
claim to explain or a model error (issue 34).  :func:`summary` gives the
count, median, max and the rows above :data:`FLAG_RATIO` over the tuned
rows and over all rows.

What is searched, and how it differs from ``calculon llm-optimal-execution``
on the same inputs (so that the whole suite runs in a few minutes):

* only the layouts (TP x PP x CP, DP the rest) that reach the row's global
  batch exactly: DP limited to the divisors of the batch
  (``SearchSpec.limits['dp']``), so every group's ``batch_size`` is the
  row's;
* the network tier of TP, CP, DP and PP is the placement the published
  suite gives the recipe (:func:`natural_tier`: the first tier that holds
  the ranks the parallelism spans, TP innermost, then CP, DP, PP), not
  searched; the expert-parallel tier is searched.  Placing a parallelism on
  a slower tier than the one its ranks fit in is never faster in the
  model (the unrestricted search finds the same best on the rows checked,
  tests/test_search_check.py), and fixing the four tiers makes each
  layout's bound 10-30x cheaper on the MoE rows;
* the branch and bound of :mod:`calculon.search.bound` (exact within that
  space), seeded with the recipe's own rate where it fits the memory (only
  executions at least as fast are looked for; none found: searched again
  unseeded), once for rows whose search is the same (:func:`search_key`),
  one search per worker process.

Rows the search cannot run are listed with the reason (status ``not
searched``: a row the suite does not price, a per-layer measurement, no
layout reaching the batch, nothing feasible, or an error), never a
traceback.
"""

from dataclasses import dataclass, field
import math
import re
import time

import numpy as np
import pandas as pd

from calculon.errors import ConfigError, Infeasible

__all__ = ['TUNED_SOURCES', 'FLAG_RATIO', 'LIMIT_RATIO', 'is_tuned',
           'tuned_patterns', 'RowResult', 'run', 'search_row', 'search_case',
           'search_spec', 'search', 'results_frame', 'summary',
           'format_report', 'markdown', 'execution_text', 'differences']

#: Sources whose rows are tuned recipes (regular expressions, matched
#: case-insensitively anywhere in the ``source`` column).  Issue 34 names
#: them: vendor performance tables and MLPerf submissions, whose layouts
#: the vendor tuned for that model, GPU count and batch -- NVIDIA NeMo's
#: "Performance Summary" pages (docs/source/performance/
#: performance_summary.md; docs.nvidia.com/nemo-framework/user-guide/
#: latest/performance/performance-summary.html) and Megatron-Bridge's
#: docs/performance-summary*.md (the perf recipes of
#: scripts/performance/), and MLPerf Training results (mlcommons.org).
#: Papers, blog posts, model-zoo best-practice pages and framework
#: benchmark pages are not in it (their layouts are one team's choice, not
#: a vendor's published optimum); ``--tuned`` replaces the list.
TUNED_SOURCES = (r'performance[ _-]summary', r'\bmlperf\b')
#: Ratio of the search's best to the measured throughput above which a
#: tuned row is listed (issue 34: median <= 1.10).
FLAG_RATIO = 1.10
#: Ratio no tuned row should exceed (issue 34: none above 1.25).
LIMIT_RATIO = 1.25
#: The tiers of these axes are fixed to :func:`natural_tier` (axis ->
#: which parallel degrees' product the tier must hold).
_TIER_AXES = {
  'tensor_par_net': ('tp',),
  'context_par_net': ('tp', 'cp'),
  'data_par_net': ('tp', 'cp', 'dp'),
  'pipeline_par_net': ('tp', 'cp', 'dp', 'pp'),
}
#: Fields of ``case.fixed`` that are the layout (searched), or that the
#: search takes from its spec: never passed as fixed fields.
_LAYOUT_FIELDS = frozenset({
  'num_procs', 'tensor_par', 'pipeline_par', 'data_par', 'context_par',
  'batch_size', 'datatype', 'framework', 'training', 'precision_recipe',
  'quantization_scaling', 'recompute_modules'})


def tuned_patterns(patterns=None):
  """Compiled patterns of ``patterns`` (strings; default
  :data:`TUNED_SOURCES`).

  Raises:
    ConfigError: a pattern that is not a regular expression.
  """
  out = []
  for p in (TUNED_SOURCES if patterns is None else patterns):
    if isinstance(p, re.Pattern):
      out.append(p)
      continue
    try:
      out.append(re.compile(p, re.IGNORECASE))
    except re.error as err:
      raise ConfigError(f"--tuned {p!r}: not a regular expression: {err}",
                        field='tuned', value=p) from None
  return out


def is_tuned(source, patterns=None):
  """Whether a row's ``source`` text is a tuned recipe: one of
  ``patterns`` (default :data:`TUNED_SOURCES`) occurs in it."""
  return any(p.search(str(source or '')) for p in tuned_patterns(patterns))


@dataclass
class RowResult:
  """The search on one row.

  Attributes:
    id, source (group), model, gpus, tuned: the row.
    status: 'ok' or 'not searched' (``reason`` says why).
    measured_tok_s_gpu, recipe_tok_s_gpu, best_tok_s_gpu: throughputs
      (tokens/s/GPU): measured, the recipe as the model prices it, the
      search's best.
    ratio_measured, ratio_recipe: best / measured, best / recipe;
      recipe_vs_measured: recipe / measured (the published suite's error
      on the row as a throughput ratio), so that ratio_measured =
      recipe_vs_measured x ratio_recipe.
    recipe, best: short text of the executions (:func:`execution_text`);
    differences: the settings the best changes (``field recipe->best``).
    best_execution: the best's execution, every field as priced (JSON).
    recipe_over_memory: the recipe's every candidate exceeds the memory
      the model estimates (priced anyway, see the published suite).
    best_mem_gib: tier-1 memory per GPU of the best (GiB).
    searched, pruned: executions priced, and those of the searched layouts
      the bounds proved slower (not priced); layouts, layouts_skipped: the
      layouts (TP x PP x CP) that reach the batch, and those whose bound
      proved them slower than the best (not searched).
    elapsed_s: wall time of the row's search (s; rows with the same
      search share one).
    note: how the best was priced when not through the single-run API.
    system_file: the system file searched on and whether datasheet or
      calibrated (:func:`calculon.validation.system_files.label`).
  """
  id: str
  source: str
  model: str
  gpus: int
  tuned: bool
  status: str = 'not searched'
  reason: str = ''
  framework: str = ''
  measured_tok_s_gpu: float = None
  recipe_tok_s_gpu: float = None
  best_tok_s_gpu: float = None
  ratio_measured: float = None
  ratio_recipe: float = None
  recipe_vs_measured: float = None
  recipe: str = ''
  best: str = ''
  differences: str = ''
  best_execution: dict = field(default=None, repr=False)
  recipe_over_memory: bool = False
  best_mem_gib: float = None
  searched: int = 0
  pruned: int = 0
  layouts: int = 0
  layouts_skipped: int = 0
  note: str = ''
  elapsed_s: float = 0.0
  system_file: str = ''


# -- executions as text ------------------------------------------------------------

_RECOMPUTE = {'full': 'full', 'attn_only': 'attn', 'selective': 'sel',
              'none': 'none'}


def _get(exe, key, default=None):
  value = exe.get(key, default)
  return default if value is None else value


def execution_text(exe):
  """Short text of an execution (JSON dict): ``TP/PP/DP/CP`` degrees,
  ``EP``/``ETP`` when above 1 (with the dispatcher and the overlap of
  its communication), ``VP``, ``mbs``, recomputation (with the modules of
  a selective one), the sharding level, ``SP`` (TP with reduce-scatter /
  all-gather), TP's overlap and the offloads.  '' for None."""
  if not exe:
    return ''
  parts = ['TP{}/PP{}/DP{}/CP{}'.format(
    _get(exe, 'tensor_par', 1), _get(exe, 'pipeline_par', 1),
    _get(exe, 'data_par', 1), _get(exe, 'context_par', 1))]
  if _get(exe, 'expert_par', 1) > 1:
    parts.append(f"EP{exe['expert_par']}")
  if _get(exe, 'expert_tensor_par', 1) > 1:
    parts.append(f"ETP{exe['expert_tensor_par']}")
  if _get(exe, 'expert_par', 1) > 1:
    if exe.get('moe_dispatcher'):
      parts.append(str(exe['moe_dispatcher']))
    if _get(exe, 'moe_comm_overlap', 'none') != 'none':
      parts.append(f"ep-overlap {exe['moe_comm_overlap']}")
  if _get(exe, 'pipeline_par', 1) > 1:
    parts.append(f"VP{_get(exe, 'pipeline_interleaving', 1)}")
    if exe.get('pipeline_schedule'):
      parts.append(str(exe['pipeline_schedule']))
  parts.append(f"mbs{_get(exe, 'microbatch_size', '?')}")
  rc = _get(exe, 'activation_recompute', 'none')
  rc = _RECOMPUTE.get(rc, rc)
  if rc == 'sel' and exe.get('recompute_modules'):
    mods = exe['recompute_modules']
    mods = ','.join(mods) if isinstance(mods, (list, tuple)) else mods
    rc += f'({mods})'
  parts.append(f'rc {rc}')
  shard = _get(exe, 'data_par_sharding')
  if shard is None:
    shard = 'optimizer' if exe.get('optimizer_sharding') else 'none'
  if shard != 'none':
    parts.append(f'shard {shard}')
  if _get(exe, 'tensor_par', 1) > 1 and \
      _get(exe, 'tensor_par_comm_type') == 'rs_ag':
    parts.append('SP')
  if _get(exe, 'tensor_par', 1) > 1 and \
      _get(exe, 'tensor_par_overlap', 'none') != 'none':
    parts.append(f"tp-overlap {exe['tensor_par_overlap']}")
  off = ''.join(k for k, f in (('w', 'weight_offload'),
                               ('a', 'activations_offload'),
                               ('o', 'optimizer_offload')) if exe.get(f))
  if off:
    parts.append(f'offload {off}')
  return ' '.join(parts)


#: Settings compared between the recipe and the best (``differences``).
COMPARED = ('tensor_par', 'pipeline_par', 'data_par', 'context_par',
            'expert_par', 'expert_tensor_par', 'pipeline_interleaving',
            'microbatch_size', 'activation_recompute', 'data_par_sharding',
            'tensor_par_comm_type', 'tensor_par_overlap', 'data_par_overlap',
            'attention_kernel', 'moe_dispatcher', 'moe_comm_overlap',
            'weight_offload', 'activations_offload', 'optimizer_offload')
_SHORT = {'tensor_par': 'TP', 'pipeline_par': 'PP', 'data_par': 'DP',
          'context_par': 'CP', 'expert_par': 'EP', 'expert_tensor_par': 'ETP',
          'pipeline_interleaving': 'VP', 'microbatch_size': 'mbs',
          'activation_recompute': 'recompute', 'data_par_sharding': 'shard',
          'tensor_par_comm_type': 'tp-comm', 'tensor_par_overlap': 'tp-overlap',
          'data_par_overlap': 'dp-overlap', 'attention_kernel': 'attention',
          'moe_dispatcher': 'dispatcher', 'moe_comm_overlap': 'ep-overlap',
          'weight_offload': 'w-offload', 'activations_offload': 'a-offload',
          'optimizer_offload': 'o-offload'}


def differences(recipe, best):
  """``'TP 8->2; mbs 1->2'``: the settings of :data:`COMPARED` whose value
  differs between the recipe's execution and the best's (JSON dicts; a
  setting one of them lacks is not compared, nor one of a parallelism the
  best does not use: VP without PP, TP's communication without TP, the
  dispatcher without EP)."""
  if not recipe or not best:
    return ''
  out = []
  for key in COMPARED:
    a, b = recipe.get(key), best.get(key)
    if a is None or b is None or a == b:
      continue
    # A setting of a parallelism the best does not use changes nothing.
    unused = _UNUSED_WITHOUT.get(key)
    if unused is not None and _get(best, unused, 1) == 1:
      continue
    out.append(f'{_SHORT[key]} {_show(a)}->{_show(b)}')
  return '; '.join(out)


#: Settings that act only when a degree is above 1: setting -> degree.
_UNUSED_WITHOUT = {
  'pipeline_interleaving': 'pipeline_par',
  'tensor_par_comm_type': 'tensor_par',
  'tensor_par_overlap': 'tensor_par',
  'moe_dispatcher': 'expert_par',
  'moe_comm_overlap': 'expert_par',
}


def _show(v):
  if isinstance(v, bool):
    return 'on' if v else 'off'
  return str(v)


# -- one search ----------------------------------------------------------------------

def fixed_fields(case, axes):
  """{field: JSON value}: the optional execution fields the row or its
  source's rules fix (``case.fixed``) that every candidate of the search
  keeps -- those that are neither a search axis (``axes``, nor any axis
  of the modern space with experts: EP, its tier, the dispatcher...) nor
  a layout field nor given to :class:`~calculon.search.SearchSpec` by
  name."""
  from calculon.config.execution import OPTIONAL_SPECS
  from calculon.search.grid import MOE_AXES
  return {k: v for k, v in case.fixed.items()
          if k in OPTIONAL_SPECS and k not in axes and k not in MOE_AXES
          and k not in _LAYOUT_FIELDS}


def natural_tier(networks, ranks):
  """Index of the first network tier that holds ``ranks`` processors
  (``networks``: the system JSON's ``networks`` list, each with ``size``
  and ``must_be_filled``; a tier that must be filled only when ``ranks``
  divides its size); the last tier when none does.  The published suite
  places a recipe's parallelisms by this rule
  (:meth:`calculon.validation.mapping.Mapper._execution`)."""
  for i, net in enumerate(networks):
    if net['size'] >= ranks and (not net.get('must_be_filled') or
                                 net['size'] % ranks == 0):
      return i
  return len(networks) - 1


def place(group, networks):
  """Fixes the TP, CP, DP and PP tiers of a search group (in place) to
  :func:`natural_tier` of the ranks each spans (TP innermost, then CP, DP,
  PP; a degree of 1: tier 0)."""
  degree = {'tp': group.tp, 'cp': group.cp, 'dp': group.dp, 'pp': group.pp}
  for axis, span in _TIER_AXES.items():
    if axis not in group.values:
      continue
    if degree[span[-1]] > 1:
      group.values[axis] = [natural_tier(
        networks, int(np.prod([degree[k] for k in span])))]
    else:
      group.values[axis] = [0]


def _divisors(n):
  return [d for d in range(1, n + 1) if n % d == 0]


def _override(suite, case, systems):
  """The system JSON replacing the row's bundled file (``systems``:
  cluster -> JSON, the published suite's ``--calibrated`` files), or
  None."""
  if not systems:
    return None
  return systems.get(case.cluster or case.system_name)


def row_system(suite, case, systems=None):
  """(:class:`~calculon.hardware.System`, system JSON) the row is
  searched on: its bundled file, or its cluster's file in ``systems``
  (cluster -> JSON), with the row's field changes applied."""
  override = _override(suite, case, systems)
  key = None if override is None else 'search-override'
  return (suite.system(case, override, key=key),
          suite.system_json(case, override))


def search_spec(suite, case, systems=None):
  """The :class:`~calculon.search.SearchSpec` of a row: its priced
  application, system, GPUs, global batch (DP limited to the divisors of
  the batch that divide the GPUs, so each layout reaches it exactly),
  datatype, framework preset, precision recipe, quantization scaling,
  recompute modules and the other fields of :func:`fixed_fields`.

  Raises:
    ConfigError: the row's settings are not a valid search (a field the
      preset or the registry refuses).
  """
  from calculon.config import Application
  from calculon.search import SearchSpec
  f = case.fixed
  app = Application.from_dict(case.priced_app, f'run {case.id}')
  system, _ = row_system(suite, case, systems)
  n, batch = int(f['num_procs']), int(f['batch_size'])
  kw = dict(framework=f.get('framework'),
            precision_recipe=f.get('precision_recipe'),
            quantization_scaling=f.get('quantization_scaling'),
            recompute_modules=f.get('recompute_modules'),
            limits={'dp': tuple((d, d) for d in _divisors(batch)
                                if n % d == 0)})
  spec = SearchSpec(app, system, n, batch, f['datatype'], **kw)
  extra = fixed_fields(case, set(spec.axes))
  if extra:
    spec = SearchSpec(app, system, n, batch, f['datatype'], fields=extra,
                      **kw)
  return spec


def search(spec, networks, seed_rate=0.0):
  """The best execution of ``spec`` among its layouts of the exact batch,
  their TP/CP/DP/PP tiers placed (:func:`place`), by the branch and bound
  of :mod:`calculon.search.bound`: layouts in order of their level-1 bound,
  a layout skipped when its bound is below the best so far.

  ``seed_rate`` (samples/s): a rate known to be reached (the recipe's):
  only executions at least that fast (less the tie tolerance) are looked
  for, which prunes more.  Near ties of the best go to the simplest, as
  in :func:`calculon.search.optimal_executions`
  (:func:`calculon.search.exhaustive.apply_ties`).
  The result is the same whenever the best reaches it; when nothing does,
  the search runs again without it.

  Returns:
    (:class:`~calculon.search.SearchResult` (top 1; ``groups`` every group
    of the spec, indexed by ``Group.index``; ``pruned``: executions of the
    searched layouts proven slower), layouts reaching the batch, layouts
    skipped whole by their bound).
  """
  from calculon.search import SearchResult, optimal_executions
  from calculon.search import bound as B
  from calculon.search.exhaustive import (
    apply_ties, merge_best, merge_near, merge_simplest, tie_tolerance)
  from calculon.search.grid import groups
  start = time.perf_counter()
  every = groups(spec)
  gs = [g for g in every if g.batch_size == spec.max_batch_size]
  if not spec.modern:
    # Calculon's space has no bound: its exhaustive search (the DP limit
    # keeps the exact batch).
    return optimal_executions(spec, 1, 1), len(gs), 0
  for g in gs:
    place(g, networks)
  bounds = np.asarray([B.group_bound(spec, g) for g in gs], dtype=float)
  order = np.argsort(-bounds, kind='stable')
  tol = tie_tolerance(spec)
  for seed in ((seed_rate, 0.0) if seed_rate > 0 else (0.0,)):
    best, total, evaluated, feasible, pruned, reasons = [], 0, 0, 0, 0, {}
    skipped = 0
    simplest, near = {}, None
    for i in order:
      # Near ties of the best are priced too (the simplest wins them).
      threshold = max(seed, best[0].rate if best else 0.0) * (1.0 - tol)
      if threshold > 0 and bounds[i] * (1 + B.PRUNE_MARGIN) < threshold:
        skipped += 1
        continue
      res = B.search_group(spec, gs[i], 1, lambda t=threshold: t)
      best = merge_best(best, res.best, 1)
      simplest = merge_simplest(simplest, res.simplest)
      near = merge_near(near, res.near, tol)
      total += res.total
      evaluated += res.evaluated
      feasible += res.feasible
      pruned += res.pruned
      for code, count in res.reasons.items():
        reasons[code] = reasons.get(code, 0) + count
    if best:
      break
  best, ties = apply_ties(spec, every, best, simplest, near, 1)
  result = SearchResult(best, total, evaluated, feasible, reasons,
                        time.perf_counter() - start, False, every, pruned,
                        ties, tol)
  return result, len(gs), skipped


def priced_execution(spec, group, flat):
  """(execution, sample rate (1/s), tier-1 memory per GPU (B)) of the
  execution at flat index ``flat`` of ``group``'s grid, as the search
  prices it: every execution field as a JSON value (the preset resolved),
  and the engine's rate and memory for it."""
  from calculon.config.execution import FIELD_SPECS, OPTIONAL_SPECS
  from calculon.frameworks.resolve import value_of
  from calculon.llm.model import Evaluation
  from calculon.search.grid import Chunk, columns
  idx = np.unravel_index(flat, group.shape)
  cols = columns(spec, Chunk(group, tuple(int(i) for i in idx)))
  shape = np.broadcast_shapes(*(np.shape(getattr(cols, f))
                                for f in vars(cols)))

  def at(x):
    return np.broadcast_to(x, shape).reshape(-1)[0]
  exe = {name: value_of(name, at(getattr(cols, name)))
         for name in list(FIELD_SPECS) + list(OPTIONAL_SPECS)
         if name != 'optimizer_sharding'}
  with np.errstate(all='ignore'):
    ev = Evaluation(spec.app, spec.system, cols)
    rate = float(at(ev.sample_rate))
    mem = float(at(ev.mem1_bytes))
  return exe, rate, mem


def _recipe_rate(case, recipe):
  """The recipe's sample rate as the model prices it (samples/s), when it
  fits the memory (else 0: the search may not reach it)."""
  if recipe is None or recipe.status != 'ok' or recipe.over_memory or \
      not recipe.predicted_s:
    return 0.0
  return case.fixed['batch_size'] / recipe.predicted_s


def _errors():
  return (ValueError, ArithmeticError, KeyError, IndexError, RuntimeError,
          Infeasible, MemoryError)


def search_case(suite, case, seed_rate=0.0, systems=None):
  """The search of one row, as a dict (picklable): ``status`` ('ok' or
  'not searched'), ``reason``, ``execution`` (every field as priced),
  ``rate`` (samples/s), ``mem_bytes`` (tier 1 per GPU), ``note``,
  ``searched``, ``pruned``, ``layouts``, ``layouts_skipped``,
  ``elapsed_s``.  Never raises for a row: a failure is the ``reason``.
  ``seed_rate``: see :func:`search`."""
  from calculon.llm.model import REASON_NAMES
  from calculon.llm.results import best_to_output
  out = {'status': 'not searched', 'reason': '', 'execution': None,
         'rate': None, 'mem_bytes': None, 'note': '', 'searched': 0,
         'pruned': 0, 'layouts': 0, 'layouts_skipped': 0, 'elapsed_s': 0.0}
  start = time.perf_counter()
  try:
    if not case.expressible:
      out['reason'] = 'not priced: ' + '; '.join(case.missing)
      return out
    if case.metric == 'layer_fwd_plus_bwd_ms':
      out['reason'] = ('per-layer measurement (one block, one microbatch): '
                       'no whole step to search')
      return out
    spec = search_spec(suite, case, systems)
    result, out['layouts'], out['layouts_skipped'] = search(
      spec, row_system(suite, case, systems)[1]['networks'], seed_rate)
    out['searched'], out['pruned'] = result.evaluated, result.pruned
    if not out['layouts']:
      out['reason'] = (f"no layout of the preset '{spec.framework}' "
                       f'reaches the global batch {spec.max_batch_size} on '
                       f'{spec.num_procs} GPUs')
      return out
    if not result.best:
      why = ', '.join(f'{REASON_NAMES.get(c, c)}: {k}' for c, k in sorted(
        result.reasons.items(), key=lambda kv: -kv[1]))
      out['reason'] = 'no feasible execution (' + (why or 'none priced') + ')'
      return out
    try:
      entry = best_to_output(spec, result)['0']
      out['execution'] = entry.get('framework', {}).get(
        'resolved', entry['execution'])
      out['rate'] = entry['stats']['sample_rate']
      out['mem_bytes'] = entry['stats'].get('proc_mem_tier1_cap_req')
    except ConfigError as err:
      # The execution cannot be written back as a record the single-run
      # API reads (calculon.search.grid.execution_record leaves out a field
      # the preset resolves alike but a rule checks first: a quantization
      # scaling without its precision recipe): the search's own pricing.
      best = result.best[0]
      out['execution'], out['rate'], out['mem_bytes'] = priced_execution(
        spec, result.groups[best.group], best.flat)
      out['note'] = ('priced by the search, not re-priced through the '
                     'single-run API (its execution record is refused: '
                     f"{str(err).split(': ', 1)[-1]})")
    out['status'] = 'ok'
  except _errors() as err:
    out['status'] = 'not searched'
    out['reason'] = f'error: {type(err).__name__}: {err}'.split('\n')[0]
  finally:
    out['elapsed_s'] = time.perf_counter() - start
  return out


def _tokens_per_s_per_gpu(case, batch_time_s):
  f = case.fixed
  return f['batch_size'] * case.app['seq_size'] / (
    batch_time_s * f['num_procs'])


def row_result(case, recipe, outcome, tuned=False):
  """The :class:`RowResult` of a row from the published suite's result
  for it (``recipe``, or None) and its search (``outcome``, a
  :func:`search_case` dict)."""
  from calculon.validation.mapping import number, text
  row = case.row
  out = RowResult(id=case.id, source=case.group,
                  model=text(row.get('model_name')),
                  gpus=number(row.get('num_gpus')), tuned=bool(tuned),
                  framework=case.fixed.get('framework') or '')
  for key in ('status', 'reason', 'note', 'searched', 'pruned', 'layouts',
              'layouts_skipped', 'elapsed_s'):
    setattr(out, key, outcome[key])
  if case.expressible and case.measured_s and case.app is not None and \
      case.metric != 'layer_fwd_plus_bwd_ms':
    out.measured_tok_s_gpu = _tokens_per_s_per_gpu(case, case.measured_s)
  if recipe is not None and recipe.status == 'ok' and \
      case.metric != 'layer_fwd_plus_bwd_ms':
    out.recipe_tok_s_gpu = _tokens_per_s_per_gpu(case, recipe.predicted_s)
    out.recipe = execution_text(recipe.execution)
    out.recipe_over_memory = bool(recipe.over_memory)
  if out.recipe_tok_s_gpu and out.measured_tok_s_gpu:
    out.recipe_vs_measured = out.recipe_tok_s_gpu / out.measured_tok_s_gpu
  if outcome['status'] != 'ok':
    return out
  exe = outcome['execution']
  out.best_execution = exe
  out.best = execution_text(exe)
  out.best_tok_s_gpu = outcome['rate'] * case.app['seq_size'] / \
    case.fixed['num_procs']
  if outcome['mem_bytes'] is not None:
    out.best_mem_gib = float(outcome['mem_bytes']) / 2**30
  if out.measured_tok_s_gpu:
    out.ratio_measured = out.best_tok_s_gpu / out.measured_tok_s_gpu
  if out.recipe_tok_s_gpu:
    out.ratio_recipe = out.best_tok_s_gpu / out.recipe_tok_s_gpu
    out.differences = differences(recipe.execution, exe)
  return out


def search_row(suite, case, recipe, tuned=False, systems=None):
  """The search on one row (see the module): a :class:`RowResult`.

  Args:
    suite: :class:`~calculon.validation.published.Suite`.
    case: one of ``suite.cases``.
    recipe: the published suite's :class:`~calculon.validation.published.
      Result` for the row (its price of the recipe), or None.
    tuned: whether the row is a tuned recipe (reported).

  Never raises for a row: what fails is the ``reason`` of a 'not searched'
  result.
  """
  out = row_result(case, recipe, search_case(
    suite, case, _recipe_rate(case, recipe), systems), tuned)
  out.system_file = _system_label(suite, case, systems)
  return out


def _system_label(suite, case, systems):
  """How the tables name the file ``case`` is searched on ('' for a row
  with no system)."""
  if not case.system_name:
    return ''
  return suite.system_label(case, _override(suite, case, systems))


# -- the suite ---------------------------------------------------------------------

def search_key(suite, case, systems=None):
  """What a row's search depends on (JSON text): rows with the same key
  have the same search (the application, the system, GPUs, batch,
  datatype, preset and fixed fields; not the recipe's layout)."""
  import json
  if not case.expressible or case.app is None:
    return f'row {case.id}'
  f = case.fixed
  keep = ('num_procs', 'batch_size', 'datatype', 'framework',
          'precision_recipe', 'quantization_scaling', 'recompute_modules')
  return json.dumps([case.priced_app, row_system(suite, case, systems)[1],
                     case.metric,
                     {k: f.get(k) for k in keep}, fixed_fields(case, ())],
                    sort_keys=True, default=str)


_WORKER = {}


def _setup(suite, seeds, systems=None):
  _WORKER.update(suite=suite, seeds=seeds, systems=systems)


def _task(i):
  suite = _WORKER['suite']
  return i, search_case(suite, suite.cases[i], _WORKER['seeds'][i],
                        _WORKER.get('systems'))


def _cost(case):
  """A rough order of the rows' search cost (largest first, so that the
  workers finish together): experts, GPUs."""
  app = case.app or {}
  return (app.get('num_experts') is not None,
          (case.fixed or {}).get('num_procs', 0))


def run(suite, recipes=None, workers=1, tuned=None, progress=None,
        systems=None):
  """The search on every row of ``suite``.

  Rows whose search is the same (:func:`search_key`) are searched once,
  from the fastest of their recipes that fits the memory (a seed, see
  :func:`search`); one search per worker process at a time.

  Args:
    suite: :class:`~calculon.validation.published.Suite`.
    recipes: the published suite's results for the rows (list of
      :class:`~calculon.validation.published.Result` in ``suite.cases``
      order; default: priced here with :func:`~calculon.validation.
      published.run_suite`).
    workers: processes.
    tuned: patterns of the tuned sources (default :data:`TUNED_SOURCES`).
    progress: callable(str) told of each search, or None.
    systems: cluster -> system JSON replacing the rows' bundled files (the
      published suite's ``--calibrated`` files), or None; the recipes
      should be priced on the same.

  Returns:
    list of :class:`RowResult` in ``suite.cases`` order.

  Raises:
    ConfigError: a bad ``tuned`` pattern, or ``recipes`` not one per row.
  """
  from calculon.parallel import imap
  from calculon.validation import published
  progress = progress or (lambda text_: None)
  patterns = tuned_patterns(tuned)
  if recipes is None:
    recipes = published.run_suite(suite, systems=systems)
  recipes = list(recipes)
  if len(recipes) != len(suite.cases):
    raise ConfigError(f'{len(recipes)} published results for '
                      f'{len(suite.cases)} rows', field='recipes')
  flags = [is_tuned(c.row.get('source'), patterns) for c in suite.cases]
  keys = [search_key(suite, c, systems) for c in suite.cases]
  first, seeds = {}, [0.0] * len(suite.cases)
  for i, (key, case) in enumerate(zip(keys, suite.cases)):
    j = first.setdefault(key, i)
    seeds[j] = max(seeds[j], _recipe_rate(case, recipes[i]))
  todo = sorted(set(first.values()), key=lambda i: _cost(suite.cases[i]),
                reverse=True)
  outcomes = {}
  for i, res in imap(_task, todo, max(1, int(workers)), initializer=_setup,
                     initargs=(suite, seeds, systems), ordered=False):
    outcomes[i] = res
    same = [suite.cases[k].id for k, key in enumerate(keys)
            if key == keys[i]]
    progress(f"  {', '.join(same)}: {res['status']}"
             + (f" ({res['elapsed_s']:.1f} s, {res['layouts']} layouts, "
                f"{res['searched']} executions priced)"
                if res['status'] == 'ok' else f" ({res['reason']})"))
  out = [row_result(case, recipes[i], outcomes[first[keys[i]]], flags[i])
         for i, case in enumerate(suite.cases)]
  for row, case in zip(out, suite.cases):
    row.system_file = _system_label(suite, case, systems)
  return out


#: Columns of :func:`results_frame`.
COLUMNS = ('id', 'source', 'model', 'gpus', 'tuned', 'status', 'framework',
           'measured_tok_s_gpu', 'recipe_tok_s_gpu', 'best_tok_s_gpu',
           'ratio_measured', 'ratio_recipe', 'recipe_vs_measured', 'recipe',
           'best', 'differences', 'best_mem_gib', 'recipe_over_memory',
           'layouts', 'layouts_skipped', 'searched', 'pruned', 'elapsed_s',
           'reason', 'note', 'system_file')


def results_frame(rows):
  """One row per run (columns :data:`COLUMNS`): id, source, model, gpus,
  tuned, status, framework, measured / recipe / best throughput
  (tokens/s/GPU), best / measured, best / recipe and recipe / measured,
  the recipe's and the best's execution text, the differences, the best's
  memory (GiB), recipe_over_memory, layouts, layouts_skipped, searched,
  pruned, elapsed_s (the search's wall time; rows sharing a search show
  it each), reason, note, system_file (the file searched on, datasheet or
  calibrated)."""
  return pd.DataFrame([{c: getattr(r, c) for c in COLUMNS} for r in rows],
                      columns=list(COLUMNS))


def _num(series):
  return pd.to_numeric(series, errors='coerce')


def _stats(part):
  ok = part[part['status'] == 'ok']
  r = _num(ok['ratio_measured'])
  rr = _num(ok['ratio_recipe']).dropna()
  above = ok[r > FLAG_RATIO].assign(_r=r[r > FLAG_RATIO]).sort_values(
    '_r', ascending=False)
  rd = r.dropna()
  return {
    'rows': int(len(part)),
    'searched': int(len(ok)),
    'not_searched': int(len(part) - len(ok)),
    'median_ratio_measured': float(rd.median()) if len(rd) else None,
    'max_ratio_measured': float(rd.max()) if len(rd) else None,
    'min_ratio_measured': float(rd.min()) if len(rd) else None,
    'above_flag': {str(i): float(v) for i, v in zip(above['id'],
                                                     above['_r'])},
    'above_limit': [str(i) for i in ok['id'][r > LIMIT_RATIO]],
    'median_ratio_recipe': float(rr.median()) if len(rr) else None,
    'max_ratio_recipe': float(rr.max()) if len(rr) else None,
    'min_ratio_recipe': float(rr.min()) if len(rr) else None,
  }


def summary(frame):
  """Summary of :func:`results_frame`: for the tuned rows (``tuned``),
  the other rows (``other``) and all rows (``all``): rows, searched, not
  searched, median / max / min of best / measured and of best / recipe,
  ``above_flag`` ({id: ratio} of the rows above :data:`FLAG_RATIO`, largest
  first) and ``above_limit`` (ids above :data:`LIMIT_RATIO`); plus the
  thresholds and ``passed`` (issue 34's check: the tuned rows' median <=
  FLAG_RATIO and none above LIMIT_RATIO; None without a searched tuned
  row)."""
  tuned = frame['tuned'].astype(bool)
  out = {'flag_ratio': FLAG_RATIO, 'limit_ratio': LIMIT_RATIO,
         'tuned': _stats(frame[tuned]), 'other': _stats(frame[~tuned]),
         'all': _stats(frame)}
  t = out['tuned']
  out['passed'] = None if not t['searched'] else bool(
    t['median_ratio_measured'] <= FLAG_RATIO and not t['above_limit'])
  return out


def _fmt(v, digits=3):
  if v is None or (isinstance(v, float) and math.isnan(v)):
    return ''
  return f'{v:.{digits}f}'


def _tok(v):
  if v is None or (isinstance(v, float) and math.isnan(v)):
    return ''
  return f'{v:.0f}' if v >= 100 else f'{v:.1f}'


def format_report(frame, tuned=None):
  """Readable text: the table of searched rows (tuned marked ``*``), the
  summary for tuned, other and all rows, issue 34's check, the tuned rows
  above :data:`FLAG_RATIO` with what the best changes, and the rows not
  searched with the reason.  ``tuned``: the patterns used (for the
  heading; default :data:`TUNED_SOURCES`)."""
  pats = [getattr(p, 'pattern', p) for p in (tuned or TUNED_SOURCES)]
  lines = ["Search in each row's framework preset at the row's GPUs, exact "
           'global batch, sequence and datatype (throughput in tokens/s/GPU;'
           ' best/meas = best / measured, best/recipe = best / the model\'s '
           "price of the row's recipe; * tuned recipe: source matches "
           f"{' or '.join(repr(p) for p in pats)}):"]
  ok = frame[frame['status'] == 'ok']
  if len(ok):
    show = pd.DataFrame({
      'id': ok['id'] + np.where(ok['tuned'].astype(bool), '*', ''),
      'model': ok['model'].str.slice(0, 26), 'GPUs': ok['gpus'],
      'measured': ok['measured_tok_s_gpu'].map(_tok),
      'recipe': ok['recipe_tok_s_gpu'].map(_tok),
      'best': ok['best_tok_s_gpu'].map(_tok),
      'best/meas': ok['ratio_measured'].map(_fmt),
      'best/recipe': ok['ratio_recipe'].map(_fmt),
      'best execution': ok['best']})
    from calculon.validation.system_files import priced_on_line
    lines += ['', show.to_string(index=False),
              priced_on_line(ok['system_file'])]
  s = summary(frame)
  lines.append('')
  for key, name in (('tuned', 'Tuned rows'), ('other', 'Other rows'),
                    ('all', 'All rows')):
    t = s[key]
    if not t['rows']:
      lines.append(f'{name}: none')
      continue
    text_ = f"{name}: {t['searched']} of {t['rows']} searched"
    if t['searched']:
      text_ += (f"; best / measured median {_fmt(t['median_ratio_measured'])}"
                f", max {_fmt(t['max_ratio_measured'])}; "
                f"{len(t['above_flag'])} above {FLAG_RATIO:.2f}, "
                f"{len(t['above_limit'])} above {LIMIT_RATIO:.2f}; "
                f"best / recipe median {_fmt(t['median_ratio_recipe'])}, "
                f"min {_fmt(t['min_ratio_recipe'])}")
    lines.append(text_)
  if s['passed'] is not None:
    lines.append(f"Issue 34's check on the tuned rows (median <= "
                 f"{FLAG_RATIO:.2f}, none above {LIMIT_RATIO:.2f}): "
                 + ('met' if s['passed'] else 'NOT met'))
  r = _num(ok['ratio_measured'])
  flagged = ok[ok['tuned'].astype(bool) & (r > FLAG_RATIO)]
  if len(flagged):
    lines += ['', f'Tuned rows above {FLAG_RATIO:.2f} (best / measured = '
              'recipe / measured x best / recipe; the recipe -> the '
              "search's best):"]
    for _, row in flagged.assign(_r=r).sort_values(
        '_r', ascending=False).iterrows():
      lines.append(
        f"  {row['id']} {row['model']}: x{row['ratio_measured']:.3f} = "
        f"{_fmt(row['recipe_vs_measured'])} x {_fmt(row['ratio_recipe'])}; "
        f"{row['recipe']} -> {row['best']}"
        + (f" ({row['differences']})" if row['differences'] else ''))
  noted = ok[ok['note'].fillna('').astype(str) != '']
  if len(noted):
    lines += ['', 'Notes:']
    for note, part in noted.groupby('note', sort=False):
      lines.append(f"  {', '.join(part['id'])}: {note}")
  no = frame[frame['status'] != 'ok']
  if len(no):
    lines += ['', 'Not searched (reason):']
    for _, row in no.iterrows():
      lines.append(f"  {row['id']} {row['model']}: {row['reason']}")
  return '\n'.join(lines)


def markdown(frame):
  """The searched rows as a Markdown table (docs/search-vs-recipes.md):
  tuned recipes first, each with its GPUs, system, measured, recipe and
  best throughput (tokens/s/GPU), best / measured, best / recipe, and the
  recipe's and the best's executions; then the summary lines of
  :func:`summary`."""
  ok = frame[frame['status'] == 'ok'].copy()
  ok['_t'] = ~ok['tuned'].astype(bool)
  ok = ok.sort_values(['_t', 'source', 'id'], kind='stable')
  lines = ['| run | model | GPUs | measured | recipe | best | best / '
           'measured | best / recipe | recipe | best |',
           '|---|---|---|---|---|---|---|---|---|---|']
  for _, r in ok.iterrows():
    lines.append('| {}{} | {} | {} | {} | {} | {} | {} | {} | {} | {} |'
                 .format(r['id'], ' *' if r['tuned'] else '', r['model'],
                         r['gpus'], _tok(r['measured_tok_s_gpu']),
                         _tok(r['recipe_tok_s_gpu']),
                         _tok(r['best_tok_s_gpu']),
                         _fmt(r['ratio_measured']), _fmt(r['ratio_recipe']),
                         r['recipe'], r['best']))
  s = summary(frame)
  lines.append('')
  for key, name in (('tuned', 'Tuned recipes (*)'), ('other', 'Other rows'),
                    ('all', 'All rows')):
    t = s[key]
    if not t['searched']:
      continue
    lines.append(
      f"- {name}: {t['searched']} of {t['rows']} searched; best / measured "
      f"median {_fmt(t['median_ratio_measured'])}, max "
      f"{_fmt(t['max_ratio_measured'])}, {len(t['above_flag'])} above "
      f"{FLAG_RATIO:.2f}, {len(t['above_limit'])} above {LIMIT_RATIO:.2f}; "
      f"best / recipe median {_fmt(t['median_ratio_recipe'])}.")
  return '\n'.join(lines) + '\n'
