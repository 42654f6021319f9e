"""``calculon export APP EXECUTION --to NAME [-o FILE]``: an execution (an
execution file, or the best of a search or plan result) written as the
launch configuration of a framework's current release
(:mod:`calculon.export`)."""

from calculon import outputs
from calculon.cli.main import EXIT_OK

#: calculon.export.TARGET_NAMES, written out so the help needs no import
#: (tests/test_export.py checks they agree).
_TARGETS = ('megatron-bridge', 'torchtitan', 'deepspeed')


def add_parsers(sp):
  p = sp.add_parser(
    'export', help="write an execution as a framework's launch config",
    description='Write an execution as the launch configuration a '
    "framework's current release takes: megatron-bridge (Megatron-Bridge "
    '0.6.2 ConfigContainer overrides, YAML), torchtitan (torchtitan 0.3.0, '
    'a Python apply(config) over a recipe), deepspeed (DeepSpeed 0.19.8 '
    'ds_config JSON).  An execution the framework cannot express is '
    'refused with one line naming the field and why (exit 2).')
  p.add_argument('application', help='application JSON (model shape)')
  p.add_argument('execution', help='execution JSON, or a search result '
                 '(llm-optimal-execution) or plan (plan -o) JSON: its best')
  p.add_argument('--to', required=True, metavar='NAME', dest='to',
                 help='target: ' + ', '.join(_TARGETS))
  p.add_argument('-o', '--output', metavar='FILE', default=None,
                 help='write here (default: print to standard output)')
  p.add_argument('--system', metavar='SYS', default=None,
                 help='system JSON the execution was priced on (needed for '
                 "an activation offload 'fit': how many layers it offloads)")
  p.add_argument('--framework', metavar='NAME', default=None,
                 help='resolve the execution under this framework preset, '
                 "whatever its 'framework' field says (as calculon llm "
                 '--framework)')
  p.set_defaults(func=run)


def run(args, log):
  from calculon import export
  export.target(args.to)
  if args.output is not None:
    outputs.check_output_path(args.output, what='export', option='-o')
  from calculon import io
  app = io.load_application(args.application)
  if args.framework is not None:
    from calculon import frameworks
    frameworks.load(args.framework, source='--framework')
  exe, where = export.read_execution(app, args.execution, args.framework)
  system = io.load_system(args.system) if args.system else None
  text = export.export_text(args.to, app, exe, source=where, system=system,
                            system_name=args.system)
  if args.output is None:
    import sys
    sys.stdout.write(text)
    sys.stdout.flush()
  else:
    outputs.write_text(args.output, text, rescue=True)
    log.info(f'Export ({args.to}): {args.output}')
  return EXIT_OK


def add_export_option(p):
  """``--export NAME`` on a command that writes a result (llm-optimal-
  execution, plan)."""
  p.add_argument('--export', metavar='NAME', default=None,
                 choices=_TARGETS,
                 help='also write the best execution as this framework\'s '
                 'launch config beside the result (best.json -> '
                 'best.megatron-bridge.yaml; calculon export): '
                 + ', '.join(_TARGETS))


def check_export(args, result_path, option='-o'):
  """Checks, before any work, where ``--export`` will write (None when it
  is not given).

  Raises:
    ConfigError: --export without a result file, or an unwritable path.
  """
  if getattr(args, 'export', None) is None:
    return None
  if result_path is None:
    from calculon.errors import ConfigError
    raise ConfigError(f'--export {args.export}: needs {option} (it writes '
                      'beside the result)', field='--export')
  from calculon import export
  return export.check_beside(result_path, args.export)


def export_best(args, data, result_path, app, system, system_name, log):
  """Writes the export of the best execution of ``data`` (a search output
  or a plan's JSON) beside ``result_path`` when ``--export`` is given.

  Raises:
    ConfigError: the framework cannot express the execution (the result
      itself is already written).
  """
  if getattr(args, 'export', None) is None:
    return
  from calculon import export
  from calculon.config import Execution
  from calculon.frameworks import resolve_execution
  record, where = export._best_of(data, result_path)
  exe = Execution.from_dict(dict(record), where)
  resolved, _ = resolve_execution(app, exe, None, where)
  path = export.write_beside(result_path, args.export, app, resolved,
                             source=where, system=system,
                             system_name=system_name)
  log.info(f'Export ({args.export}): {path}')
