"""``calculon llm-optimal-execution`` and ``calculon llm-all-executions``.

The model, the search and the writers are imported by the handlers, after
the output has been checked (:mod:`calculon.outputs`).
"""

import argparse
import sys

from calculon import outputs
from calculon.cli.main import (
  EXIT_INFEASIBLE, EXIT_INTERRUPTED, EXIT_OK, positive_int)

#: calculon.config.execution.RECOMPUTE_MODULES, written out so the help
#: needs no numpy at start-up (tests/test_cli.py checks they agree).
_RECOMPUTE_MODULES = ('core_attn', 'layernorm', 'mla_up_proj', 'mlp', 'moe',
                      'moe_act', 'shared_experts', 'alternate_linears')

#: Outputs of each search command.
OPTIMAL_KINDS = outputs.JSON_KINDS + outputs.CSV_KINDS
ALL_KINDS = outputs.CSV_KINDS + outputs.PARQUET_KINDS


class _Datatypes:
  """argparse choices: calculon.config.execution.DATATYPE_NAMES, imported
  only when argparse checks a value or prints the help (start-up)."""

  @staticmethod
  def _names():
    from calculon.config.execution import DATATYPE_NAMES
    return DATATYPE_NAMES

  def __iter__(self):
    return iter(self._names())

  def __contains__(self, value):
    return value in self._names()


def field_value(arg):
  """argparse type of --set: FIELD=VALUE, the value read as JSON (true,
  4, "text") or else as text; returns (field, value)."""
  import json
  name, sep, text = arg.partition('=')
  if not sep or not name.strip():
    raise argparse.ArgumentTypeError(f'invalid value {arg!r}: use '
                                     'FIELD=VALUE')
  try:
    value = json.loads(text)
  except ValueError:
    value = text
  return name.strip(), value


def degrees(arg):
  """argparse type of --tp/--pp/--dp/--cp/--ep/--mbs: 'N', 'N-M' or
  'N,M,...' (items may be ranges), integers >= 1; returns a sorted tuple
  of (low, high) ranges."""
  ranges = []
  for item in arg.split(','):
    lo, sep, hi = item.strip().partition('-')
    try:
      lo = int(lo)
      hi = int(hi) if sep else lo
    except ValueError:
      raise argparse.ArgumentTypeError(
        f'invalid value {arg!r}: use N, N-M or N,M,... (integers >= 1)') \
        from None
    if lo < 1 or hi < lo:
      raise argparse.ArgumentTypeError(
        f'invalid value {arg!r}: each range N-M needs 1 <= N <= M')
    ranges.append((lo, hi))
  return tuple(sorted(ranges))


def true_false_both(arg):
  """Calculon's -f values: true, false or both."""
  if arg in ('t', 'true', 'T', 'True', '1'):
    return [True]
  if arg in ('f', 'false', 'F', 'False', '0'):
    return [False]
  if arg in ('both', 'all', '*'):
    return [False, True]
  raise argparse.ArgumentTypeError(
    f'invalid value {arg!r}: use true, false or both')


def _common(p, formats):
  p.add_argument('application', help='application JSON (model shape)')
  p.add_argument('num_procs', type=positive_int, help='number of processors')
  p.add_argument('max_batch_size', type=positive_int,
                 help='maximum global batch; each DP uses its largest '
                 'multiple not above it')
  p.add_argument('datatype', choices=_Datatypes(), metavar='DATATYPE',
                 help='datatype: %(choices)s')
  p.add_argument('system', help='system JSON')
  p.add_argument('output', help=f'output file ({formats})')
  p.add_argument('-c', '--cpus', type=positive_int, default=None,
                 help='worker processes (default: physical cores)')
  p.add_argument('-n', '--noneok', action='store_true',
                 help='exit 0 even when no execution is feasible')
  p.add_argument('-f', '--fused_activation', type=true_false_both,
                 default=[True], help='fused activation: true (default), '
                 'false or both')
  p.add_argument('-d', '--debug', action='store_true',
                 help="count the executions, don't run them")
  p.add_argument('-q', '--quiet', action='store_true',
                 help='no progress bar')
  p.add_argument('--chunk', type=positive_int, default=None,
                 help='executions per vectorized chunk (memory vs. speed)')
  p.add_argument('--no-tp-overlap', action='store_true',
                 help="don't try TP communication overlap")
  p.add_argument('--no-dp-overlap', action='store_true',
                 help="don't try DP communication overlap")
  p.add_argument('--space', choices=('auto', 'calculon', 'modern'),
                 default='auto',
                 help="'calculon': Calculon's space exactly; 'modern': also "
                 'context parallelism, the four sharding levels (ZeRO-1/2/3, '
                 'FSDP), the FlashAttention kernel, selective recomputation, '
                 'PP degrees that do not divide the blocks and, with experts, '
                 "EP, ETP, dispatchers and their overlap; 'auto' (default): "
                 "Calculon's for a Calculon application (no optional field), "
                 'else modern')
  p.add_argument('--precision-recipe', choices=('uniform',
                                                'transformer_engine'),
                 default=None, help='modern space: precision recipe of '
                 "every candidate (default: 'transformer_engine' for float8 "
                 "and float4, else 'uniform')")
  p.add_argument('--quantization-scaling', default=None,
                 choices=('delayed', 'current', 'block'),
                 help='modern space, Transformer Engine recipe: how the '
                 "casts to the narrow datatype find their scales ('delayed': "
                 "from earlier steps' amax; 'current': an amax pass before "
                 "each cast; 'block': MXFP8/NVFP4 block scales; default: the "
                 "framework's)")
  p.add_argument('--recompute-modules', nargs='+', default=None,
                 choices=_RECOMPUTE_MODULES, metavar='MODULE',
                 help='modern space: what selective recomputation '
                 "recomputes, as Megatron-Core's --recompute-modules (among "
                 + ', '.join(_RECOMPUTE_MODULES) + '; alternate_linears: '
                 "PyTorch per-op selective checkpointing as torchtitan's "
                 "'op' policy; default: core_attn)")
  p.add_argument('--set', action='append', default=[], type=field_value,
                 metavar='FIELD=VALUE', dest='fields',
                 help='modern space: every candidate takes this optional '
                 'execution field (docs/reference/executions.md), over the '
                 "framework's value, where it acts; repeatable (e.g. --set "
                 'expert_imbalance=1.2)')
  p.add_argument('--gradient-datatype', default=None,
                 choices=('float32', 'bfloat16', 'float16', 'calculon'),
                 help='modern space: gradients kept and reduced in this '
                 "datatype ('calculon': in the datatype, with an fp32 "
                 "accumulation buffer; default: the framework's)")
  p.add_argument('--no-prune', action='store_true',
                 help='modern space: price every execution (no branch and '
                 'bound; same result, slower)')
  p.add_argument('--framework', metavar='NAME', default=None,
                 help='search the options of this framework preset, priced '
                 'as it runs them (calculon frameworks lists them; default: '
                 'calculon for a Calculon application, else megatron-core)')
  for flag, what in (('--tp', 'tensor-parallel'), ('--pp', 'pipeline-'
                     'parallel'), ('--dp', 'data-parallel'), ('--cp',
                     'context-parallel'), ('--ep', 'expert-parallel'),
                     ('--mbs', 'microbatch')):
    p.add_argument(flag, type=degrees, default=None, metavar='N[-M][,...]',
                   help=f'only these {what} sizes (N, N-M or N,M,...)')
  p.add_argument('--no-offload', action='store_true',
                 help='no weight, activation or optimizer offload')


def add_parsers(sp):
  p = sp.add_parser(
    'llm-optimal-execution', aliases=['loe'],
    help='search every execution for the fastest ones',
    description='Exhaustively search parallelism strategies and options for '
    'an application on NUM_PROCS processors and write the fastest.')
  _common(p, '*.json, *.json.gz, *.csv, *.csv.gz')
  p.add_argument('-m', '--mbs-break', action='store_true',
                 help='within each combination of the other options, stop at '
                 'the first microbatch size with no feasible execution')
  p.add_argument('-t', '--top-n', type=positive_int, default=1,
                 help='number of best executions to write (default 1)')
  p.add_argument('-l', '--layers', action='store_true',
                 help='include per-layer statistics')
  p.add_argument('--objective', default='throughput',
                 choices=('throughput', 'time-to-train', 'cost', 'energy'),
                 help='what the best minimizes (default throughput: the '
                 "fastest step; the others price each execution's whole "
                 "run -- failures, checkpoints, power, the system's "
                 'reliability/storage/power sections or their defaults -- '
                 'and re-rank exactly, docs/plan.md)')
  from calculon.cli.export import add_export_option
  add_export_option(p)
  p.set_defaults(func=run_optimal)

  q = sp.add_parser(
    'llm-all-executions', aliases=['lae'],
    help='write every feasible execution with its statistics',
    description='Evaluate the whole search space and stream every feasible '
    'execution with all its statistics to a table.')
  _common(q, '*.csv, *.csv.gz, *.parquet')
  q.set_defaults(func=run_all, mbs_break=False)


def _spec(args):
  from calculon import io
  from calculon.search import SearchSpec
  app = io.load_application(args.application)
  system = io.load_system(args.system)
  system.check_datatype(args.datatype)
  limits = {key: getattr(args, key) for key in ('tp', 'pp', 'dp', 'cp', 'ep',
                                                'mbs')
            if getattr(args, key) is not None}
  return SearchSpec(app, system, args.num_procs, args.max_batch_size,
                    args.datatype, list(args.fused_activation),
                    mbs_break=args.mbs_break,
                    allow_tp_overlap=not args.no_tp_overlap,
                    allow_dp_overlap=not args.no_dp_overlap,
                    space=args.space, framework=args.framework,
                    limits=limits, no_offload=args.no_offload,
                    precision_recipe=args.precision_recipe,
                    quantization_scaling=args.quantization_scaling,
                    recompute_modules=args.recompute_modules,
                    gradient_datatype=args.gradient_datatype,
                    fields=dict(args.fields),
                    prune=not args.no_prune)


class _Progress:
  """tqdm bar on stderr when it is a terminal (and not -q)."""

  def __init__(self, total, quiet):
    self.bar = None
    if not quiet and sys.stderr.isatty():
      from tqdm import tqdm
      self.bar = tqdm(total=total, unit='exe', unit_scale=True,
                      file=sys.stderr, smoothing=0.1, dynamic_ncols=True)

  def __call__(self, n):
    if self.bar is not None:
      self.bar.update(n)

  def close(self):
    if self.bar is not None:
      self.bar.close()


def _summary(log, total, evaluated, feasible, reasons, elapsed_s, mbs_break,
             pruned=0):
  from calculon.llm import search as S
  log.info(f'Total executions: {evaluated}')
  if mbs_break:
    log.info(f'Executions in the space: {total} ({total - evaluated} skipped '
             'by -m)')
  if pruned:
    log.info(f'Executions in the space: {total} ({pruned} proven slower than '
             'the best by the bounds, not priced)')
  log.info(f'Good executions: {feasible}')
  log.info(f'Bad executions: {evaluated - feasible}')
  for name, n in S.reason_summary(reasons).items():
    log.info(f'  {name}: {n}')
  rate = evaluated / elapsed_s if elapsed_s > 0 else 0.0
  log.info(f'Calculation rate: {rate:.2f} calcs/sec ({elapsed_s:.3f} s)')


def _cpus(args):
  if args.cpus is not None:
    return args.cpus
  from calculon.parallel import default_workers
  return default_workers()


def run_optimal(args, log):
  outputs.check_output_path(args.output, OPTIMAL_KINDS, what='output')
  from calculon.cli.export import check_export, export_best
  check_export(args, args.output)
  from calculon.llm import search as S
  spec = _spec(args)
  if args.debug:
    log.info(f'Total executions: {S.count_space(spec)}')
    return EXIT_OK
  total = S.count_space(spec)
  progress = _Progress(total, args.quiet)
  log.info(f'Search space: {spec.space} (framework {spec.framework})')
  if args.objective != 'throughput':
    return _run_objective(args, log, spec, progress)
  result = S.optimal_executions(spec, args.top_n, _cpus(args), args.chunk,
                                progress)
  progress.close()
  _summary(log, result.total, result.evaluated, result.feasible,
           result.reasons, result.elapsed_s, args.mbs_break, result.pruned)
  if result.elapsed_s > 0:
    log.info(f'Search rate: {result.total / result.elapsed_s:.2f} executions '
             'of the space per second')
  if result.partial:
    log.warning('Interrupted: the results are the best found so far (partial)')
  if not result.best:
    log.info('No acceptable configurations found :(')
    return EXIT_INTERRUPTED if result.partial else (
      EXIT_OK if args.noneok else EXIT_INFEASIBLE)
  log.info(f'Best sample rate: {result.best[0][0]}')
  if getattr(result, 'ties', 0) > 1:
    log.info(f'Ties: {result.ties} executions within '
             f'{100 * result.tie_tolerance:g} % of the best rate; #0 is the '
             'simplest of them (fewest virtual stages, then offloads)')
  from calculon.llm.results import best_to_output, write_best
  from calculon.report import binding_text
  output = best_to_output(spec, result, args.layers)
  for key, entry in output.items():
    if 'binds' in entry:
      b, margin = entry['binds'], entry['margin_to_next_pct']
      log.info(f"  #{key}: {entry['stats']['sample_rate']:.6g} samples/s, "
               + (f'{margin:.2f} % faster than the next, '
                  if margin is not None else '') +
               binding_text(b))
  try:
    write_best(output, args.output, partial=result.partial, rescue=True)
  except outputs.WriteError as err:
    if err.rescued is None:  # nowhere to save it: print it
      from calculon.io import json_text
      err.rescued = outputs.print_rescue(json_text(output, '-'))
    raise
  log.info(f'Output: {args.output}')
  export_best(args, output, args.output, spec.app, spec.system, args.system,
              log)
  return EXIT_INTERRUPTED if result.partial else EXIT_OK


def _run_objective(args, log, spec, progress):
  """llm-optimal-execution --objective time-to-train|cost|energy: the
  exact re-ranking of :func:`calculon.plan.objective.rank`."""
  from calculon.llm.results import write_best
  from calculon.plan import objective as O
  ranked = O.rank(spec, args.objective, args.top_n, _cpus(args),
                  chunk_size=args.chunk, on_progress=progress, log=log)
  progress.close()
  result = ranked.search
  _summary(log, result.total, result.evaluated, result.feasible,
           result.reasons, result.elapsed_s, args.mbs_break, result.pruned)
  if not ranked.best:
    log.info('No acceptable configurations found :(')
    return EXIT_INTERRUPTED if ranked.partial else (
      EXIT_OK if args.noneok else EXIT_INFEASIBLE)
  log.info(f'Objective {args.objective}: best {ranked.best[0].value:.6g} '
           f'{ranked.unit} (the best of the top {ranked.searched} by sample '
           f"rate; {'proven' if ranked.proven else 'not proven'})")
  output = O.to_output(spec, ranked, args.layers)
  write_best(output, args.output, partial=ranked.partial, rescue=True)
  log.info(f'Output: {args.output}')
  from calculon.cli.export import export_best
  export_best(args, output, args.output, spec.app, spec.system, args.system,
              log)
  return EXIT_INTERRUPTED if ranked.partial else EXIT_OK


def run_all(args, log):
  outputs.check_output_path(args.output, ALL_KINDS, what='output')
  from calculon.llm import search as S
  from calculon.llm.results import TableWriter
  writer = TableWriter(args.output, rescue=True)
  spec = _spec(args)
  if args.debug:
    log.info(f'Total executions: {S.count_space(spec)}')
    return EXIT_OK
  import time
  total = S.count_space(spec)
  progress = _Progress(total, args.quiet)
  start = time.perf_counter()
  seen = feasible = 0
  reasons = {}
  partial = False
  failure = None
  try:
    with writer:
      try:
        chunk = args.chunk or (S.MODERN_CHUNK if spec.modern
                               else S.DEFAULT_CHUNK) // 4
        for rows, n, why in S.all_executions(spec, _cpus(args), chunk):
          writer.write(rows)
          seen += n
          feasible += len(rows['sample_rate'])
          for code, k in why.items():
            reasons[code] = reasons.get(code, 0) + k
          progress(n)
      except KeyboardInterrupt:
        # The rows written so far are a valid table: keep it (partial).
        partial = True
  except outputs.WriteError as err:
    failure = err
  finally:
    progress.close()
  _summary(log, total, seen, feasible, reasons,
           time.perf_counter() - start, False)
  if failure is not None:
    if seen < total:
      log.warning(f'Stopped after {seen} of {total} executions: the table '
                  'could not be written')
    raise failure
  if partial:
    log.warning(f'Interrupted: {args.output} holds the executions found so '
                'far (partial)')
    return EXIT_INTERRUPTED
  log.info(f'Output: {args.output}')
  if feasible == 0 and not args.noneok:
    log.info('No acceptable configurations found :(')
    return EXIT_INFEASIBLE
  return EXIT_OK
