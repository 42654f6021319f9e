"""``calculon llm`` (one run) and ``calculon llm-parameter-calculator``.

Start-up matters here (users script thousands of single runs): this module
imports the model only in its handlers, and pandas, pyarrow, matplotlib
and dask only when an option needs them (``--report``).
"""

import os

from calculon import outputs
from calculon.cli.main import EXIT_INFEASIBLE, EXIT_OK


def add_parsers(sp):
  p = sp.add_parser('llm', help='run a single llm calculation',
                    description='Price one execution of an application on a '
                    'system and print or write its statistics.')
  p.add_argument('application', help='application JSON (model shape)')
  p.add_argument('execution', help='execution JSON (parallelism, options)')
  p.add_argument('system', help='system JSON (processor, memory, network)')
  p.add_argument('stats', help="output: '-' prints a report; *.json or "
                 '*.json.gz writes every statistic')
  p.add_argument('-p', '--peers', default=None,
                 help='write the processor peers (TP/PP/DP) JSON here')
  p.add_argument('-l', '--layers', action='store_true',
                 help='include per-layer statistics in the stats file')
  p.add_argument('--report', metavar='DIR', default=None,
                 help='also write the report (report.md), its tables (CSV), '
                 'summary.json and charts (PNG) to DIR')
  p.add_argument('--framework', metavar='NAME', default=None,
                 help='price the execution under this framework preset '
                 "(calculon frameworks lists them), whatever its 'framework' "
                 "field says; the fields it writes still win (default: its "
                 "'framework', else calculon for Calculon files, else "
                 'megatron-core)')
  p.set_defaults(func=run_llm)

  q = sp.add_parser('llm-parameter-calculator', aliases=['lpc'],
                    help='count the parameters of an application',
                    description='Print the number of trainable parameters.')
  q.add_argument('application', help='application JSON')
  q.add_argument('-a', '--alignment', type=int, default=13,
                 help='width of the name column')
  q.set_defaults(func=run_parameter_calculator)


def check_outputs(args):
  """Checks every output of ``calculon llm`` (before any work).

  Raises:
    ConfigError: one line naming the output and the problem.
  """
  outputs.check_output_path(args.stats, outputs.JSON_KINDS,
                            what='stats output', allow_stdout=True)
  if args.peers is not None:
    outputs.check_output_path(args.peers, outputs.JSON_KINDS,
                              what='peers output', option='-p/--peers')
  if args.report is not None:
    outputs.check_output_path(args.report, want_dir=True,
                              what='report folder', option='--report')


def run_llm(args, log):
  check_outputs(args)
  from calculon import io
  if args.framework is not None:
    from calculon import frameworks
    frameworks.load(args.framework, source='--framework')
  model = run_files(args.application, args.execution, args.system, log,
                    args.framework)
  if model is None:
    return EXIT_INFEASIBLE
  exe = model.exe
  if args.stats == '-':
    model.display_stats()
  else:
    io.write_json_file(model.get_stats_json(args.layers), args.stats)
  if args.peers:
    io.write_json_file(exe.get_peers_json(), args.peers)
  if args.report:
    from calculon.report import RunData, write_run_report
    write_run_report(args.report, RunData.from_model(model))
    log.info(f'Report: {args.report}/report.md')
  return EXIT_OK


def run_files(app_path, exe_path, sys_path, log, framework=None):
  """Loads and runs one execution from its three files (``framework``:
  the preset to price it under, see :class:`calculon.llm.Llm`).

  Returns:
    the run :class:`Llm`, or None when infeasible (after printing Calculon's
    ``ERROR: <reason>`` line).

  Raises:
    ConfigError: a file is missing or invalid.
  """
  from calculon import io
  from calculon.hardware import System
  from calculon.llm import Llm
  app = Llm.Application(io.read_json_file(app_path), app_path)
  exe = Llm.Execution.from_json(io.read_json_file(exe_path), exe_path)
  system = System(io.read_json_file(sys_path), sys_path)
  model = Llm(app, log, framework)
  try:
    model.compile(system, exe)
    model.run(system)
  except Llm.Error as err:
    print(f'ERROR: {err}')
    return None
  return model


def run_parameter_calculator(args, log):
  from calculon import io
  from calculon.units import human_format
  app = io.load_application(args.application)
  name, _ = os.path.splitext(os.path.basename(args.application))
  if name.endswith('.json'):
    name = name[:-5]
  log.info(f'{name}{" " * (args.alignment - len(name))} -> '
           f'{human_format(app.num_parameters())}')
  config = getattr(app, 'config', app)
  parts = config.parameter_breakdown()
  total = config.num_parameters()
  for part, n in parts.items():
    if n or part != 'lm_head':
      share = 100 * n / total if total else 0.0
      log.info(f'  {part.replace("_", " "):<16} {n:>20,} {share:6.2f} %')
  log.info(f"  {'total':<16} {total:>20,}")
  if config.is_moe:
    active = config.num_active_parameters()
    log.info(f"  {'active':<16} {active:>20,} (top {config.top_k} of "
             f'{config.num_experts} experts per token)')
  return EXIT_OK
