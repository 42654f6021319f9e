"""``calculon`` command line: Calculon's commands and arguments, and more.

Exit status: 0 success; 1 the execution (or every execution searched) is
infeasible; 2 bad input (a message naming the file, field and value), an
output path that cannot be written (checked before any work), or an output
that could not be written after the work (the message says where the result
was saved instead); 130 interrupted.

Start-up: this module and the command modules import only argparse and
light modules at the top; each handler imports what it needs (numpy and
the model, pandas, pyarrow, matplotlib, dask) when it runs.
"""

import argparse
import gc
import logging
import os
import sys

import calculon
from calculon.errors import ConfigError
from calculon.outputs import WriteError

EXIT_OK, EXIT_INFEASIBLE, EXIT_BAD_INPUT = 0, 1, 2
EXIT_INTERRUPTED = 130


def positive_int(arg):
  """argparse type: an integer >= 1."""
  try:
    value = int(arg)
  except ValueError:
    raise argparse.ArgumentTypeError(f'{arg!r} is not an integer') from None
  if value < 1:
    raise argparse.ArgumentTypeError(f'{value} must be >= 1')
  return value


def _columns():
  """Terminal width as shutil.get_terminal_size() computes it, without
  importing shutil (which imports bz2 and lzma: ~10 ms of start-up)."""
  try:
    columns = int(os.environ.get('COLUMNS', '0'))
  except ValueError:
    columns = 0
  if columns <= 0:
    try:
      columns = os.get_terminal_size(sys.__stdout__.fileno()).columns
    except (AttributeError, ValueError, OSError):
      columns = 0
  return columns or 80


class _Formatter(argparse.HelpFormatter):
  """argparse's formatter, given the width (argparse would import shutil
  for it, for every argument added)."""

  def __init__(self, prog, indent_increment=2, max_help_position=24,
               width=None):
    super().__init__(prog, indent_increment, max_help_position,
                     width if width is not None else _columns() - 2)


class _Parser(argparse.ArgumentParser):
  """ArgumentParser with :class:`_Formatter` (sub-commands included)."""

  def __init__(self, *args, **kwargs):
    kwargs.setdefault('formatter_class', _Formatter)
    super().__init__(*args, **kwargs)


#: Modules of calculon.cli that register commands (``add_parsers(sp)``).
COMMAND_MODULES = ('llm', 'search', 'validation', 'calibrate', 'tools',
                   'sweep', 'plot', 'hf', 'profile', 'plan', 'frameworks',
                   'serve', 'kernels', 'export')
#: Which of them registers each command name (aliases included), so that a
#: run builds only its own command's parser (start-up).  A command missing
#: here still works: the whole parser is built.
COMMAND_OF = {
  'llm': 'llm', 'llm-parameter-calculator': 'llm', 'lpc': 'llm',
  'llm-optimal-execution': 'search', 'loe': 'search',
  'llm-all-executions': 'search', 'lae': 'search',
  'llm-validation': 'validation', 'lv': 'validation',
  'convert': 'tools', 'compare-measured': 'tools',
  'sweep': 'sweep', 'plot': 'plot', 'import-hf': 'hf',
  'profile': 'profile', 'profile-step': 'profile', 'calibrate': 'calibrate',
  'plan': 'plan', 'frameworks': 'frameworks',
  'serve': 'serve', 'serve-search': 'serve',
  'import-kernels': 'kernels', 'export': 'export',
}
#: Global options that take a value (skipped to find the command).
_VALUE_OPTIONS = ('-l', '--log', '-v', '--verbosity')


def _commands(only=None):
  import importlib
  return [importlib.import_module(f'calculon.cli.{name}')
          for name in (COMMAND_MODULES if only is None else [only])]


def command_in(argv):
  """The command named in ``argv`` (after the global options), or None
  (none, ``-h``, ``--version``, an abbreviated option...)."""
  i = 0
  while i < len(argv):
    arg = argv[i]
    if arg in _VALUE_OPTIONS:
      i += 2
    elif arg.startswith(('--log=', '--verbosity=')) or (
        arg[:2] in ('-l', '-v') and len(arg) > 2 and arg[1] != '-'):
      i += 1
    elif arg.startswith('-'):
      return None
    else:
      return arg
  return None


def build_parser(argv=None):
  """The argparse parser: every command registered, or, when ``argv`` names
  a command of :data:`COMMAND_OF`, only the module registering it."""
  command = command_in(argv) if argv is not None else None
  only = COMMAND_OF.get(command) if command else None
  ap = _Parser(
    prog='calculon',
    description='Calculon: co-design for large scale parallel applications '
    '(analytical performance model of LLM training steps; with training:'
    ' false, of a forward pass).')
  ap.add_argument('-l', '--log', default='-',
                  help='log file, or - for stdout (default)')
  ap.add_argument('-v', '--verbosity', default='INFO',
                  help='logging level: DEBUG, INFO, WARNING, ERROR')
  ap.add_argument('--version', action='version',
                  version=f'calculon {calculon.__version__}')
  sp = ap.add_subparsers(title='commands', dest='command', metavar='COMMAND',
                         parser_class=_Parser)
  sp.required = True
  version = sp.add_parser('version', aliases=['v'],
                          help='show the version and exit')
  version.set_defaults(func=lambda args, log: (log.info(calculon.__version__),
                                               EXIT_OK)[1])
  if command not in ('version', 'v'):
    for module in _commands(only):
      module.add_parsers(sp)
  return ap


def _logger(args):
  level = str(args.verbosity).upper()
  if not isinstance(logging.getLevelName(level), int):
    raise ConfigError(f"--verbosity {args.verbosity!r} is not allowed: one "
                      'of DEBUG, INFO, WARNING, ERROR, CRITICAL')
  log = logging.getLogger('calculon')
  log.handlers.clear()
  log.propagate = False
  if args.log == '-':
    handler = logging.StreamHandler(stream=sys.stdout)
  else:
    # A log is written as the command runs (not replaced atomically): an
    # existing file or device (/dev/stderr) is fine.
    try:
      handler = logging.FileHandler(args.log, mode='w')
    except (OSError, ValueError) as err:
      from calculon import outputs
      if not os.path.exists(args.log):
        outputs.check_output_path(args.log, what='log file', option='--log')
      raise ConfigError(f'--log {args.log}: cannot be written: '
                        f'{getattr(err, "strerror", None) or err}',
                        source='--log', value=args.log) from None
  log.addHandler(handler)
  log.setLevel(level)
  return log


def _quiet_blas():
  """Starts OpenBLAS with one thread, unless the user chose a number.

  calculon calls no BLAS routine (its arithmetic is element-wise), but
  OpenBLAS starts one thread per core when numpy is imported: about 60 ms
  of every command's start-up on 2 cores, more on large machines
  (docs/performance.md).  Only when numpy is not imported yet (the
  variable is read when the library loads); not set for other BLAS
  libraries (MKL starts its threads lazily) nor for OpenMP.
  """
  if 'numpy' not in sys.modules:
    os.environ.setdefault('OPENBLAS_NUM_THREADS', '1')


def main(argv=None):
  """Runs the command line; returns the exit status."""
  logging.raiseExceptions = False  # e.g. stdout closed by `| head`
  if argv is None:
    argv = sys.argv[1:]
  _quiet_blas()
  parser = build_parser(argv)
  args = parser.parse_args(argv)
  try:
    log = _logger(args)
    return int(args.func(args, log) or 0)
  except (ConfigError, WriteError) as err:
    print(f'calculon: error: {err}', file=sys.stderr)
    return EXIT_BAD_INPUT
  except KeyboardInterrupt:
    print('calculon: interrupted', file=sys.stderr)
    return EXIT_INTERRUPTED
  except BrokenPipeError:
    return EXIT_OK


#: Single-run commands whose process ends without the interpreter's
#: teardown (see :func:`finish`).
FAST_EXIT = ('llm', 'llm-parameter-calculator', 'lpc', 'version', 'v')


def finish(status, argv):
  """Ends the process with ``status``.  After a single-run command
  (:data:`FAST_EXIT`) it flushes what a normal exit would (the logging
  handlers, stdout, stderr) and leaves with ``os._exit``, skipping the
  interpreter's teardown -- freeing every module and array, about 20 ms of
  a 0.2 s ``calculon llm`` (docs/performance.md) -- which users who script
  thousands of single runs pay each time.  Other commands (searches with
  worker processes, sweeps with a dask cluster) exit normally, so their
  atexit handlers run."""
  if command_in(argv) in FAST_EXIT:
    try:
      logging.shutdown()
      sys.stdout.flush()
      sys.stderr.flush()
    except (OSError, ValueError):   # a closed pipe: nothing more to say
      pass
    os._exit(status)
  sys.exit(status)


def entry(argv=None):
  """The ``calculon`` program (console script, ``python -m calculon``,
  bin/calculon): :func:`main`, then :func:`finish`.

  A single-run command (:data:`FAST_EXIT`) runs with the cyclic garbage
  collector off: its process lives a fraction of a second and makes
  little cyclic garbage, while the collector's passes over the objects
  that importing numpy and the model creates cost about 7 ms of a 0.15 s
  ``calculon llm`` (docs/performance.md).  Reference counting still frees
  everything else."""
  argv = sys.argv[1:] if argv is None else argv
  if command_in(argv) in FAST_EXIT:
    gc.disable()
  finish(main(argv), argv)


if __name__ == '__main__':
  entry()
