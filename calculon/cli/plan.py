"""``calculon plan``: a whole training run -- days, GPU-hours, goodput,
energy and cost -- for each GPU count.

Every value is checked before any work (one line, exit status 2): the
tokens, GPU counts, batch and prices must be positive numbers, each GPU
count needs a parallel layout whose data-parallel degree divides the
batch, the outputs must be writable.  The model, the search, pandas and
matplotlib are imported by the handler, when used.
"""

import os
import math
import re

from calculon import outputs
from calculon.cli.main import EXIT_INFEASIBLE, EXIT_OK, positive_int
from calculon.errors import ConfigError

OBJECTIVES = ('throughput', 'time-to-train', 'cost', 'energy')
#: SI suffixes of --tokens.
_SUFFIX = {'': 1.0, 'k': 1e3, 'm': 1e6, 'b': 1e9, 'g': 1e9, 't': 1e12}


def add_parsers(sp):
  p = sp.add_parser(
    'plan', help='plan a whole training run: days, GPU-hours, goodput, '
    'energy and cost for each GPU count',
    description='Plan a whole training run: for each GPU count, the best '
    'execution for the objective (or the one given) and its run: steps, '
    'interruptions, checkpoints, goodput, wall-clock days, GPU-hours, '
    'energy and cost (docs/plan.md).')
  p.add_argument('application', help='application JSON (model shape)')
  p.add_argument('system', help='system JSON (its optional reliability, '
                 'storage and power sections; absent: documented defaults)')
  p.add_argument('--tokens', required=True, metavar='T',
                 help='tokens to train on (a number; K, M, B or T suffixes '
                 'allowed: 15.6T)')
  p.add_argument('--gpus', metavar='N[,N2,...]', default=None,
                 help='GPU counts (required unless --execution)')
  p.add_argument('--batch', metavar='B', default=None,
                 help='global batch in sequences, exactly (required unless '
                 '--execution)')
  p.add_argument('--datatype', default=None, metavar='D',
                 help='datatype (default bfloat16, or the execution\'s)')
  p.add_argument('--framework', default=None, metavar='F',
                 help='framework preset (calculon frameworks lists them): '
                 'its space is searched and its checkpoint saving priced '
                 '(default: calculon for a Calculon application, else '
                 'megatron-core)')
  p.add_argument('--checkpoint-mode', choices=('async', 'blocking'),
                 default=None, help="override the framework's checkpoint "
                 'saving')
  p.add_argument('--background-slowdown', metavar='FRACTION', default=None,
                 help='throughput lost while an asynchronous checkpoint '
                 'persists, [0, 1) (default 0: not measured in a primary '
                 'source)')
  p.add_argument('--execution', metavar='EXE', default=None,
                 help='price this execution instead of searching')
  p.add_argument('--objective', choices=OBJECTIVES, default='throughput',
                 help='what the search minimizes (default throughput: the '
                 'fastest step)')
  p.add_argument('--price', metavar='USD_PER_GPU_HOUR', default=None,
                 help='price per GPU-hour')
  p.add_argument('--node-price', metavar='USD_PER_NODE_HOUR', default=None,
                 help='price per node-hour (whole-node pricing)')
  p.add_argument('--energy-price', metavar='USD_PER_KWH', default=None,
                 help='price per kWh of facility energy, added to the cost '
                 '(default 0: the GPU-hour price includes power)')
  p.add_argument('--set', metavar='SECTION.FIELD=VALUE', action='append',
                 default=[], help='override a field of the system\'s '
                 'reliability, storage or power section (repeatable), e.g. '
                 'reliability.restart_s=300')
  p.add_argument('-o', '--output', metavar='PLAN', default=None,
                 help='write the plan: .json[.gz] (every input and term) or '
                 '.csv[.gz] (one row per GPU count)')
  p.add_argument('--plot', metavar='PNG', default=None,
                 help='write a figure of days and cost against the GPU count')
  p.add_argument('-c', '--cpus', type=positive_int, default=None,
                 help='search processes (default: physical cores)')
  p.add_argument('-q', '--quiet', action='store_true',
                 help='no progress lines')
  from calculon.cli.export import add_export_option
  add_export_option(p)
  p.set_defaults(func=run)


def _positive(option, text, integer=False, zero_ok=False):
  """``text`` as a positive number (or integer), else ConfigError."""
  value = None
  raw = str(text).strip()
  if integer:
    if re.fullmatch(r'[0-9]+', raw):
      value = int(raw)
  else:
    m = re.fullmatch(r'([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([kKmMbBgGtT]?)',
                     raw)
    if m:
      value = float(m.group(1)) * _SUFFIX[m.group(2).lower()]
  ok = value is not None and math.isfinite(value) and (
    value >= 0 if zero_ok else value > 0)
  if not ok:
    what = 'an integer >= 1' if integer else (
      'a number >= 0' if zero_ok else 'a positive number')
    raise ConfigError(f'{option} {text!r} is not allowed: {what}',
                      field=option, value=text, allowed=what)
  return value


def _gpu_counts(text):
  parts = [x.strip() for x in str(text).split(',')]
  if not parts or any(not x for x in parts):
    raise ConfigError(f'--gpus {text!r} is not allowed: integers >= 1 '
                      'separated by commas', field='--gpus', value=text)
  counts = [_positive('--gpus', x, integer=True) for x in parts]
  return list(dict.fromkeys(counts))


_SET_RE = re.compile(r'(reliability|storage|power)\.([A-Za-z_]+'
                     r'(?:\.[A-Za-z_]+)?)=(.+)')


def _apply_sets(cfg, sets):
  """The system JSON with the --set overrides applied (validated later
  with the file, one line per mistake)."""
  import copy
  import json
  cfg = copy.deepcopy(cfg)
  for item in sets:
    m = _SET_RE.fullmatch(item.strip())
    if not m:
      raise ConfigError(f'--set {item!r} is not allowed: SECTION.FIELD=VALUE '
                        'with SECTION reliability, storage or power',
                        field='--set', value=item)
    section, path, raw = m.groups()
    try:
      value = json.loads(raw)
    except ValueError:
      value = raw
    target = cfg.setdefault(section, {})
    if not isinstance(target, dict):
      raise ConfigError(f"--set {item}: the system's {section} is not an "
                        'object', field='--set', value=item)
    keys = path.split('.')
    for key in keys[:-1]:
      target = target.setdefault(key, {})
      if not isinstance(target, dict):
        raise ConfigError(f'--set {item}: {section}.{key} is not an object',
                          field='--set', value=item)
    target[keys[-1]] = value
  return cfg


def run(args, log):
  """Checks every input and output, plans, prints, writes.

  Returns:
    0, or 1 when no GPU count has a feasible execution.

  Raises:
    ConfigError: bad input (before any work).
    calculon.outputs.WriteError: an output that cannot be written after
      the work (its content saved elsewhere, the message says where).
  """
  from calculon.plan.report import PLAN_KINDS
  if args.output is not None:
    outputs.check_output_path(args.output, PLAN_KINDS, what='plan',
                              option='-o')
  if args.plot is not None:
    outputs.check_output_path(args.plot, outputs.IMAGE_KINDS, what='figure',
                              option='--plot')
  from calculon.cli.export import check_export, export_best
  check_export(args, args.output)
  tokens = _positive('--tokens', args.tokens)
  gpus = _gpu_counts(args.gpus) if args.gpus is not None else None
  batch = _positive('--batch', args.batch, integer=True) \
    if args.batch is not None else None
  prices = {name: _positive(option, value, zero_ok=zero_ok)
            if value is not None else None
            for name, option, value, zero_ok in (
              ('price_gpu_hour', '--price', args.price, False),
              ('price_node_hour', '--node-price', args.node_price, False),
              ('price_kwh', '--energy-price', args.energy_price, True))}
  if args.price is not None and args.node_price is not None:
    raise ConfigError('--price and --node-price: give one of them (a GPU-hour '
                      'or a node-hour price)', field='--price')
  if args.execution is None and (gpus is None or batch is None):
    missing = ' and '.join(o for o, v in (('--gpus', gpus),
                                          ('--batch', batch)) if v is None)
    raise ConfigError(f'{missing}: required without --execution',
                      field=missing)
  from calculon import io
  from calculon.hardware import System
  from calculon.plan import plan as P
  from calculon.plan import report as REP
  from calculon.plan import run as RUN
  app = io.load_application(args.application)
  sys_cfg = io.read_json_file(args.system)
  if args.set:
    sys_cfg = _apply_sets(sys_cfg, args.set)
  system = System(sys_cfg, args.system)
  record = None
  if args.execution is not None:
    cfg = io.read_json_file(args.execution)
    record = P.execution_record(cfg, args.execution)
    for option, value, field in (('--gpus', gpus, 'num_procs'),
                                 ('--batch', batch, 'batch_size')):
      given = [value] if option == '--batch' else value
      if value is not None and given != [record[field]]:
        raise ConfigError(
          f'{option} {args.gpus if option == "--gpus" else args.batch} is '
          f"not allowed with --execution: the execution's {field} is "
          f'{record[field]}', field=option, value=value)
    if args.datatype is not None and args.datatype != record['datatype']:
      raise ConfigError(f'--datatype {args.datatype} is not allowed with '
                        "--execution: the execution's datatype is "
                        f"{record['datatype']}", field='--datatype',
                        value=args.datatype)
  datatype = args.datatype or (record['datatype'] if record else 'bfloat16')
  system.check_datatype(datatype)
  slowdown = None
  if args.background_slowdown is not None:
    slowdown = _positive('--background-slowdown', args.background_slowdown,
                         zero_ok=True)
    if slowdown >= 1:
      raise ConfigError(f'--background-slowdown {args.background_slowdown!r}'
                        ' is not allowed: a number >= 0 and < 1',
                        field='--background-slowdown',
                        value=args.background_slowdown)
  inputs = RUN.run_inputs(system, tokens, args.framework,
                          args.checkpoint_mode, background_slowdown=slowdown,
                          **prices)
  say = (lambda text: None) if args.quiet else log.info
  if record is not None:
    say(f'Pricing the run of {args.execution}')
    if args.framework is not None:
      record = dict(record, framework=args.framework)
    the_plan = P.plan_execution(app, system, record, inputs, args.objective)
  else:
    P.check_counts(app, system, gpus, batch, datatype, args.framework)
    from calculon.parallel import default_workers
    workers = args.cpus or default_workers()
    say(f"Planning {len(gpus)} GPU count(s), batch {batch}, objective "
        f"{args.objective}")

    def progress(row):
      what = 'infeasible' if row.status != 'ok' else (
        f"{row.run['wall_days']:.1f} days, goodput "
        f"{100 * row.run['goodput']:.1f}%")
      say(f'  {row.gpus} GPUs: {what} (best of the top {row.searched} by '
          f'sample rate, {row.elapsed_s:.1f} s)')
    the_plan = P.plan(app, system, gpus, batch, datatype, inputs,
                      args.objective, workers, log=log, progress=progress,
                      framework=args.framework)
  log.info(REP.format_inputs(the_plan))
  log.info('')
  log.info(REP.format_table(the_plan))
  for row in the_plan.rows:
    if row.status != 'ok' and row.reason:
      log.info(f'  {row.gpus} GPUs: {row.reason}')
  if args.output is not None:
    REP.write(the_plan, args.output, args.application, args.system)
    log.info(f'Output: {args.output}')
    if the_plan.best is not None:
      export_best(args, REP.to_json(the_plan, args.application, args.system),
                  args.output, app, system, args.system, log)
  if args.plot is not None:
    REP.plot(the_plan, args.plot,
             io.read_json_file(args.application).get('name') or
             os.path.basename(args.application), os.path.basename(args.system))
    log.info(f'Figure: {args.plot}')
  return EXIT_OK if the_plan.best is not None else EXIT_INFEASIBLE
