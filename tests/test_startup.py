"""Start-up (issue 12): single runs import only what they use.

Users script thousands of ``calculon llm`` runs; the time is measured by
benchmarks/startup.py (docs/performance.md), not here.  These tests check
the cause: which packages a command loads.
"""

import os
import subprocess
import sys

from conftest import ROOT, repo

APP = repo('models', 'megatron-1T.json')
EXE = repo('examples', '3072_t4_p64_d12_mbs4_full.json')
SYS = repo('systems', 'a100_80g.json')
#: Packages a single run does not need (numpy.ma: np.unique's lazy import).
HEAVY = ('pandas', 'pyarrow', 'matplotlib', 'dask', 'distributed', 'psutil',
         'multiprocessing', 'yaml', 'tqdm', 'scipy', 'torch', 'numpy.ma')


def loaded(argv, heavy=HEAVY):
  """(exit status, modules of ``heavy`` loaded) of main(argv) in a fresh
  interpreter."""
  code = ('import sys, io, contextlib\n'
          'from calculon.cli.main import main\n'
          'with contextlib.redirect_stdout(io.StringIO()):\n'
          f'  status = main({argv!r})\n'
          f'print(status, [m for m in {heavy!r} if m in sys.modules])\n')
  env = dict(os.environ)
  env['PYTHONPATH'] = ROOT + os.pathsep + env.get('PYTHONPATH', '')
  res = subprocess.run([sys.executable, '-c', code], capture_output=True,
                       text=True, env=env, cwd=ROOT, timeout=120)
  assert res.returncode == 0, res.stderr
  status, heavy = res.stdout.strip().split(' ', 1)
  return int(status), eval(heavy)  # noqa: S307 -- our own printed list


def test_single_run_and_parameter_count_load_no_heavy_package():
  assert loaded(['llm', APP, EXE, SYS, '-']) == (0, [])
  assert loaded(['llm-parameter-calculator', APP]) == (0, [])
  assert loaded(['version']) == (0, [])


def test_whole_parser_loads_no_model():
  """--version (like -h) builds every command's parser: no command module
  may import numpy or the model at its top."""
  code = ('import sys\n'
          'from calculon.cli.main import build_parser\n'
          'build_parser()\n'
          "print([m for m in sys.modules if m == 'numpy' or "
          "m.startswith('calculon.llm')])\n")
  env = dict(os.environ)
  env['PYTHONPATH'] = ROOT + os.pathsep + env.get('PYTHONPATH', '')
  res = subprocess.run([sys.executable, '-c', code], capture_output=True,
                       text=True, env=env, cwd=ROOT, timeout=120)
  assert res.returncode == 0, res.stderr
  assert res.stdout.strip() == '[]'


def test_bad_output_fails_before_loading_the_model(tmp_path):
  assert loaded(['llm', APP, EXE, SYS, str(tmp_path / 'no' / 's.json')],
                HEAVY + ('numpy', 'calculon.llm')) == (2, [])


def test_every_command_is_in_the_lazy_registry():
  """cli.main.COMMAND_OF names the module of every command, so that a run
  builds (and imports) only its own command's parser."""
  import argparse
  from calculon.cli import main as cli
  parser = cli.build_parser()
  sub = next(a for a in parser._actions
             if isinstance(a, argparse._SubParsersAction))
  names = set(sub.choices) - {'version', 'v'}
  assert names == set(cli.COMMAND_OF)
  for name, module in cli.COMMAND_OF.items():
    only = cli.build_parser([name])
    sub = next(a for a in only._actions
               if isinstance(a, argparse._SubParsersAction))
    assert name in sub.choices, (name, module)
  assert cli.command_in(['-l', 'x.log', '-v', 'INFO', 'loe', '-h']) == 'loe'
  assert cli.command_in(['--log=x', '-vDEBUG', 'sweep']) == 'sweep'
  assert cli.command_in(['-h', 'llm']) is None


def test_single_run_fast_exit_loses_nothing(tmp_path):
  """``calculon llm`` ends with os._exit (cli.main.finish): the report on
  stdout, the log file and the stats file are complete all the same."""
  env = dict(os.environ)
  env['PYTHONPATH'] = ROOT + os.pathsep + env.get('PYTHONPATH', '')
  def run(*argv):
    return subprocess.run([sys.executable, '-m', 'calculon', *argv],
                          capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=120)
  normal = subprocess.run(
    [sys.executable, '-c', 'import sys; from calculon.cli.main import main; '
     'sys.exit(main(sys.argv[1:]))', 'llm', APP, EXE, SYS, '-'],
    capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
  fast = run('llm', APP, EXE, SYS, '-')
  assert fast.returncode == normal.returncode == 0
  assert fast.stdout == normal.stdout and fast.stdout.count('\n') > 20
  log = tmp_path / 'run.log'
  res = run('-l', str(log), 'llm', APP, EXE, SYS, '-')
  assert res.returncode == 0 and res.stdout == ''
  assert log.read_text() == normal.stdout
  stats = tmp_path / 'stats.json'
  res = run('llm', APP, EXE, SYS, str(stats))
  assert res.returncode == 0
  import json
  assert json.loads(stats.read_text())['total_time'] > 0
  bad = run('llm', APP, EXE, SYS, str(tmp_path / 'no' / 's.json'))
  assert bad.returncode == 2 and 'does not exist' in bad.stderr
