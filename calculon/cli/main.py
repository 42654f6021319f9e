"""``calculon`` command line: Calculon's commands and arguments, and more.

Exit status: 0 success; 1 the execution (or every execution searched) is
infeasible; 2 bad input (a message naming the file, field and value).
"""

import argparse
import logging
import sys

import calculon
from calculon.errors import ConfigError

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


def _commands():
  from calculon.cli import (llm, search, validation, calibrate, tools, sweep,
                            plot, hf)
  return [llm, search, validation, calibrate, tools, sweep, plot, hf]


def build_parser():
  """The argparse parser with every command registered."""
  ap = argparse.ArgumentParser(
    prog='calculon',
    description='Calculon: co-design for large scale parallel applications '
    '(analytical performance model of LLM training and inference).')
  ap.add_argument('-l', '--log', default='-',
                  help='log file, or - for stdout (default)')
  ap.add_argument('-v', '--verbosity', default='INFO',
                  help='logging level: DEBUG, INFO, WARNING, ERROR')
  ap.add_argument('--version', action='version',
                  version=f'calculon {calculon.__version__}')
  sp = ap.add_subparsers(title='commands', dest='command', metavar='COMMAND')
  sp.required = True
  version = sp.add_parser('version', aliases=['v'],
                          help='show the version and exit')
  version.set_defaults(func=lambda args, log: (log.info(calculon.__version__),
                                               EXIT_OK)[1])
  for module in _commands():
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
    handler = logging.FileHandler(args.log, mode='w')
  log.addHandler(handler)
  log.setLevel(level)
  return log


def main(argv=None):
  """Runs the command line; returns the exit status."""
  logging.raiseExceptions = False  # e.g. stdout closed by `| head`
  parser = build_parser()
  args = parser.parse_args(argv)
  try:
    log = _logger(args)
    return int(args.func(args, log) or 0)
  except ConfigError as err:
    print(f'calculon: error: {err}', file=sys.stderr)
    return EXIT_BAD_INPUT
  except KeyboardInterrupt:
    print('calculon: interrupted', file=sys.stderr)
    return EXIT_INTERRUPTED
  except BrokenPipeError:
    return EXIT_OK


def entry():
  sys.exit(main())


if __name__ == '__main__':
  entry()
