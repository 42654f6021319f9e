"""The whole command line, fuzzed (issue 12): hypothesis draws a command
(every one), its arguments, paths (good, missing, unwritable, folders,
devices, odd names) and options, and runs it through a real subprocess.

Whatever it draws: no traceback, exit status 0, 1, 2 or 130 only, and a
status 2 says why on one line (``calculon: error: ...``) or is an argparse
usage error.  Arguments keep every run short: small processor counts (the
search spaces have at most a few thousand executions), one worker, sweeps
only counted (``-n``).

The examples are derandomized (the same in every run, so CI is stable) and
few (3 per command, 36 in all, ~15 s on 2 cores).  A deeper, random run:

    CALCULON_FUZZ_EXAMPLES=100 CALCULON_FUZZ_RANDOM=1 \\
      python -m pytest -q tests/test_cli_fuzz.py
"""

import os
import subprocess
import sys

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from conftest import ROOT, repo

APP = repo('models', 'megatron-1T.json')
SMALL = repo('models', 'megatron-126M.json')
EXE = repo('examples', '3072_t4_p64_d12_mbs4_full.json')
SYS = repo('systems', 'a100_80g.json')
#: Examples per command (12 groups).
EXAMPLES = int(os.environ.get('CALCULON_FUZZ_EXAMPLES', '3'))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                derandomize=not os.environ.get('CALCULON_FUZZ_RANDOM'),
                suppress_health_check=[HealthCheck.too_slow,
                                       HealthCheck.data_too_large])

#: The fixture folder (module scope: hypothesis reuses it across examples).
P = None


@pytest.fixture(scope='module', autouse=True)
def place(tmp_path_factory):
  global P
  d = tmp_path_factory.mktemp('fuzz')
  (d / 'afile').write_text('x')
  (d / 'adir').mkdir()
  (d / 'bad.json').write_text('{"hidden": ')
  pd.DataFrame({'tensor_par': [1, 2, 1], 'pipeline_par': [1, 1, 2],
                'data_par': [2, 1, 1], 'microbatch_size': [1, 2, 1],
                'sample_rate': [1.0, 2.0, 1.5]}).to_csv(d / 'table.csv',
                                                        index=False)
  pd.DataFrame({'step_time_s': [1.0, 1.1, 0.9, 1.0]}).to_csv(
    d / 'steps.csv', index=False)
  (d / 'spec.yaml').write_text(f'applications: [{SMALL}]\nsystems: [{SYS}]\n'
                               'num_procs: [1, 2]\nmax_batch_size: 4\n'
                               'datatypes: float16\n')
  P = str(d)
  yield d
  P = None


def _text():
  """Short strings of printable characters (no NUL: argv cannot hold it)."""
  return st.text(st.characters(min_codepoint=32, max_codepoint=0x2fff,
                               blacklist_categories=('Cs', 'Cc')),
                 max_size=12)


def _in(*choices):
  """One of ``choices`` (callables are called: paths need P), or odd
  text."""
  return st.one_of(st.sampled_from(choices).map(
    lambda c: c() if callable(c) else c), _text())


def _out_file(*exts):
  """An output file: good, in a missing folder, under a file, in /proc, a
  folder, a device, empty, stdout, odd names."""
  ext = st.sampled_from(exts)
  return st.one_of(
    ext.map(lambda e: f'{P}/o{e}'),
    ext.map(lambda e: f'{P}/o{e}'),
    ext.map(lambda e: f'/nonexistent/d/o{e}'),
    ext.map(lambda e: f'{P}/afile/o{e}'),
    ext.map(lambda e: f'/proc/o{e}'),
    st.sampled_from(['adir', 'afile', '', '-', '/dev/null', '.', '/']).map(
      lambda n: f'{P}/{n}' if n in ('adir', 'afile') else n),
    st.tuples(_text(), ext).map(lambda t: f'{P}/{t[0]}{t[1]}'),
    _text())


def _out_dir(good=True):
  """An output folder: new or existing (``good``), a file, under a file,
  missing parent, /proc, a device, empty, odd names."""
  bad = [st.sampled_from(['afile', 'afile/x', 'no/x']).map(
           lambda n: f'{P}/{n}'),
         st.sampled_from(['/proc/x', '/nonexistent/x', '', '/dev/null']),
         _text().map(lambda t: f'/nonexistent/{t}')]
  if good:
    bad.append(st.sampled_from(['new', 'adir']).map(lambda n: f'{P}/{n}'))
  return st.one_of(*bad)


def _options(table):
  """A few options of ``table`` ({option: value strategy or None})."""
  items = st.lists(st.sampled_from(sorted(table)), max_size=3, unique=True)

  def expand(names):
    return st.tuples(*[st.just([n]) if table[n] is None else
                       table[n].map(lambda v, n=n: [n, v]) for n in names])
  return items.flatmap(expand).map(lambda groups: [a for g in groups
                                                   for a in g])


def _small_int(*good):
  return st.one_of(st.sampled_from(list(good) + ['0', '-1', 'x']), _text())


def _search(command, outputs_, extra):
  opts = {'-c': st.sampled_from(['1', '2', '0']), '-n': None,
          '-f': st.sampled_from(['true', 'false', 'both', 'maybe']),
          '-d': None, '-q': None,
          '--chunk': st.sampled_from(['4096', '0', 'lots']),
          '--no-tp-overlap': None, '--no-dp-overlap': None}
  opts.update(extra)
  return st.tuples(
    st.just([command]),
    st.tuples(_in(SMALL, APP, lambda: f'{P}/bad.json', '/nonexistent.json'),
              st.sampled_from(['1', '2', '3', '0', 'x']),
              st.sampled_from(['1', '2', '4', '8', '0']),
              st.sampled_from(['float16', 'bfloat16', 'float8', 'int4']),
              _in(SYS, lambda: f'{P}/afile', EXE),
              _out_file(*outputs_)).map(list),
    _options(opts))


def _llm():
  return st.tuples(
    st.just(['llm']),
    st.tuples(_in(APP, SMALL, EXE), _in(EXE, APP, lambda: f'{P}/bad.json'),
              _in(SYS, '/nonexistent.json'),
              _out_file('.json', '.json.gz', '.txt')).map(list),
    _options({'-p': _out_file('.json', '.csv'), '-l': None,
              '--report': _out_dir()}))


def _plots():
  table = _in(lambda: f'{P}/table.csv', lambda: f'{P}/afile', SYS)
  image = _out_file('.png', '.svg', '.gif')
  metric = {'-m': st.sampled_from(['sample_rate', 'nope']), '-t': _text()}
  return {
    'plot heatmap|3d': st.tuples(
      st.sampled_from([['plot', 'heatmap'], ['plot', '3d']]),
      st.tuples(table, image).map(list), _options(metric)),
    'plot vs': st.tuples(
      st.just(['plot', 'vs']), st.tuples(table, image).map(list),
      st.sampled_from([['--x', 'data_par'], ['--x', 'nope'], []]).flatmap(
        lambda x: _options(dict(metric, **{'--hue': st.sampled_from(
          ['pipeline_par', 'x'])})).map(lambda o: x + o))),
    'plot sweep': st.tuples(
      st.just(['plot', 'sweep']),
      st.tuples(_in(lambda: f'{P}/adir', lambda: f'{P}/none'), st.just('--x'),
                _in('num_procs'), st.just('--y'), _in('sample_rate')).map(list),
      _options({'-o': _out_file('.png', '.bmp'),
                '--kind': st.sampled_from(['line', 'pie'])})),
  }


def _others():
  return {
    'llm-parameter-calculator': st.tuples(
      st.sampled_from([['llm-parameter-calculator'], ['lpc']]),
      _in(SMALL, SYS, lambda: f'{P}/adir').map(lambda a: [a]),
      _options({'-a': _small_int('5', '20')})),
    'convert': st.tuples(
      st.just(['convert']),
      st.tuples(_in(lambda: f'{P}/table.csv', lambda: f'{P}/bad.json',
                    lambda: f'{P}/adir'),
                _out_file('.json', '.csv.gz', '.parquet', '.xlsx')).map(list),
      st.just([])),
    'compare-measured': st.tuples(
      st.just(['compare-measured']),
      st.tuples(_in(lambda: f'{P}/steps.csv', lambda: f'{P}/table.csv',
                    lambda: f'{P}/bad.json'), _in(APP), _in(EXE),
                _in(SYS)).map(list),
      _options({'--skip': _small_int('1', '2', '99')})),
    'llm-validation': st.tuples(
      st.sampled_from([['llm-validation'], ['lv']]), st.just([]),
      # (--plot: bad folders only; the charts take seconds and
      # test_validation draws them.)
      _options({'--out': _out_dir(), '--plot': _out_dir(False),
                '-s': st.sampled_from(['seqsel', 'nope']),
                '-b': _in(lambda: P, ROOT), '-v': None})),
    'sweep': st.tuples(
      st.just(['sweep']),
      st.tuples(_in(lambda: f'{P}/spec.yaml', lambda: f'{P}/afile',
                    lambda: f'{P}/table.csv'), _out_dir()).map(list),
      _options({'-w': _small_int('1', '2'), '--batch-points': _small_int('1'),
                '--batch-seconds': _small_int('0.5'),
                '--scheduler': _text(), '-q': None})
      .map(lambda o: o + ['-n'])),
    'version and garbage': st.tuples(
      st.sampled_from([['version'], ['v'], ['--version'], []]),
      st.lists(_text(), max_size=3), st.just([])),
  }


def _commands():
  """{name: strategy of a whole argv}: global options, the command, its
  arguments and options."""
  commands = {
    'llm': _llm(),
    'llm-optimal-execution': _search(
      'llm-optimal-execution', ('.json', '.json.gz', '.csv'),
      {'-m': None, '-t': st.sampled_from(['1', '3', '0']), '-l': None}),
    'llm-all-executions': _search(
      'llm-all-executions', ('.csv', '.csv.gz', '.parquet'), {}),
  }
  commands.update(_plots())
  commands.update(_others())
  glob = _options({'-v': st.sampled_from(['INFO', 'debug', 'LOUD']),
                   '-l': _out_file('.log')})
  return {name: st.tuples(glob, command).map(
    lambda t: t[0] + t[1][0] + t[1][1] + t[1][2])
    for name, command in commands.items()}


COMMANDS = _commands()


def run(argv):
  env = dict(os.environ)
  env['PYTHONPATH'] = ROOT + os.pathsep + env.get('PYTHONPATH', '')
  env.pop('CALCULON_SWEEP_DELAY_S', None)
  return subprocess.run([sys.executable, '-m', 'calculon', *argv], cwd=P,
                        capture_output=True, text=True, timeout=300, env=env,
                        stdin=subprocess.DEVNULL)


def check(argv, res):
  """The contract of every command line."""
  what = f'calculon {argv!r} -> {res.returncode}\n{res.stdout}\n{res.stderr}'
  assert res.returncode in (0, 1, 2, 130), what
  assert 'Traceback' not in res.stderr + res.stdout, what
  assert 'Logging error' not in res.stderr, what
  if res.returncode == 2:
    lines = res.stderr.strip().splitlines()
    assert lines, what
    if lines[0].startswith('usage:'):  # argparse
      assert lines[-1].startswith('calculon') and ': error: ' in lines[-1], \
        what
    else:
      assert len(lines) == 1 and lines[0].startswith('calculon: error: '), \
        what


@pytest.mark.parametrize('command', sorted(COMMANDS))
def test_any_command_line_fails_cleanly(command):
  @FUZZ
  @given(COMMANDS[command])
  def fuzz(argv):
    check(argv, run(argv))
  fuzz()
