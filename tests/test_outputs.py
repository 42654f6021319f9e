"""Outputs (issue 12): checked before any work, written atomically, never
lost.

calculon.outputs in-process (the checks, atomic writes, rescue), every
command's output options through real subprocesses (one line, exit 2,
nothing run), and faults: the output folder removed while a search or a
sweep runs keeps the result.
"""

import concurrent.futures
import errno
import gzip
import json
import logging
import os
import shutil
import subprocess
import sys

import pandas as pd
import pytest

from calculon import ConfigError, outputs
from calculon.outputs import WriteError, check_output_path
from conftest import ROOT, load_json, repo, run_cli

APP = repo('models', 'megatron-1T.json')
EXE = repo('examples', '3072_t4_p64_d12_mbs4_full.json')
SYS = repo('systems', 'a100_80g.json')
SMALL = repo('models', 'megatron-126M.json')


def one_line_error(res, *fragments, nothing_done=True):
  """Exit 2, one line on stderr holding ``fragments``, no traceback, and
  (``nothing_done``) no search summary or report on stdout."""
  assert res.returncode == 2, (res.returncode, res.stdout, res.stderr)
  lines = res.stderr.strip().splitlines()
  assert len(lines) == 1, res.stderr
  assert lines[0].startswith('calculon: error: '), lines
  for fragment in fragments:
    assert fragment in lines[0], lines[0]
  assert 'Traceback' not in res.stderr + res.stdout
  if nothing_done:
    assert 'Total executions' not in res.stdout
    assert 'samples/s' not in res.stdout
  return lines[0]


def no_temp_files(folder):
  """No temporary file of an atomic write is left in ``folder``."""
  left = [n for n in os.listdir(folder) if n.endswith('.tmp')]
  assert not left, left


# -- check_output_path -----------------------------------------------------------

@pytest.fixture
def place(tmp_path):
  (tmp_path / 'afile').write_text('x')
  (tmp_path / 'adir').mkdir()
  return tmp_path


@pytest.mark.parametrize('rel,kwargs,fragments', [
  ('missing/o.json', {}, ['missing/o.json: folder', 'missing does not exist']),
  ('afile/o.json', {}, ['afile/o.json: ', 'afile is not a folder']),
  ('adir', {}, ['adir: is a folder, not a file']),
  ('afile', {'want_dir': True, 'what': 'report folder'},
   ['afile: is a file, not a folder (report folder is a folder)']),
  ('o.txt', {'kinds': outputs.JSON_KINDS, 'what': 'stats output',
             'allow_stdout': True},
   ["o.txt: unsupported extension: stats output must be '-', *.json or "
    '*.json.gz']),
  ('o.json', {'kinds': outputs.CSV_KINDS + outputs.PARQUET_KINDS},
   ['must be *.csv, *.csv.gz or *.parquet']),
  ('x' * 300 + '.json', {}, ['the name is too long (305 bytes, at most 255)']),
  ('missing/deeper/r', {'want_dir': True, 'option': '--report'},
   ['--report ', 'missing/deeper does not exist']),
])
def test_check_rejects_with_one_line(place, rel, kwargs, fragments):
  path = str(place / rel)
  with pytest.raises(ConfigError) as info:
    check_output_path(path, **kwargs)
  msg = str(info.value)
  assert '\n' not in msg
  for fragment in fragments:
    assert fragment in msg, msg
  assert not os.path.exists(place / 'missing')


def test_check_rejects_unwritable_folders_and_devices():
  # /proc takes no new file, even for root (os.access would say yes).
  with pytest.raises(ConfigError, match='folder /proc is not writable'):
    check_output_path('/proc/x', want_dir=True)
  with pytest.raises(ConfigError, match='folder /proc is not writable'):
    check_output_path('/proc/x.json', outputs.JSON_KINDS)
  with pytest.raises(ConfigError, match='is not a regular file'):
    check_output_path('/dev/null')
  with pytest.raises(ConfigError, match='the path is empty'):
    check_output_path('', option='--out')


def test_check_accepts(place):
  assert check_output_path('-', outputs.JSON_KINDS, allow_stdout=True) == '-'
  for rel, kwargs in (('new.json.gz', {'kinds': outputs.JSON_KINDS}),
                      ('afile', {}), ('adir', {'want_dir': True}),
                      ('new_dir', {'want_dir': True})):
    check_output_path(str(place / rel), **kwargs)
  # Nothing created: no folder, no probe file left.
  assert sorted(os.listdir(place)) == ['adir', 'afile']
  assert os.listdir(place / 'adir') == []


# -- atomic writes -----------------------------------------------------------------

def test_write_text_replaces_atomically(tmp_path):
  path = tmp_path / 'o.json'
  path.write_text('old')
  outputs.write_text(str(path), '{"new": 1}')
  assert load_json(path) == {'new': 1}
  outputs.write_text(str(tmp_path / 'o.json.gz'), '{"gz": 2}')
  with gzip.open(tmp_path / 'o.json.gz', 'rt') as fd:
    assert json.load(fd) == {'gz': 2}
  # A link keeps pointing at the new content.
  os.symlink(path, tmp_path / 'link.json')
  outputs.write_text(str(tmp_path / 'link.json'), '3')
  assert os.path.islink(tmp_path / 'link.json') and path.read_text() == '3'
  no_temp_files(tmp_path)


def test_failed_write_leaves_the_old_file(tmp_path):
  path = tmp_path / 'o.csv'
  path.write_text('old,content\n')
  with pytest.raises(WriteError) as info:
    with outputs.atomic_open(str(path), 'w') as fd:
      fd.write('half a ')
      raise OSError(errno.ENOSPC, 'No space left on device')
  assert str(info.value) == (f'{path}: cannot be written: No space left on '
                             'device; nothing was written there')
  assert path.read_text() == 'old,content\n'
  with pytest.raises(KeyboardInterrupt):
    with outputs.atomic_path(str(path)) as tmp:
      with open(tmp, 'w') as fd:
        fd.write('half')
      raise KeyboardInterrupt
  assert path.read_text() == 'old,content\n'
  no_temp_files(tmp_path)


def test_rescue_when_the_folder_disappears(tmp_path, monkeypatch):
  here = tmp_path / 'cwd'
  here.mkdir()
  monkeypatch.chdir(here)
  gone = tmp_path / 'gone'
  gone.mkdir()
  # Content in memory: saved in the current folder.
  shutil.rmtree(gone)
  with pytest.raises(WriteError) as info:
    outputs.write_text(str(gone / 'best.json.gz'), '{"a": 1}', rescue=True)
  assert info.value.rescued == str(here / 'best.rescued.json.gz')
  assert f'saved in {here}/best.rescued.json.gz instead' in str(info.value)
  with gzip.open(here / 'best.rescued.json.gz', 'rt') as fd:
    assert json.load(fd) == {'a': 1}
  # Streamed content: the folder removed while the writer holds its file.
  gone.mkdir()
  with pytest.raises(WriteError) as info:
    with outputs.atomic_path(str(gone / 'all.csv'), rescue=True) as tmp:
      with open(tmp, 'w') as fd:
        fd.write('a,b\n')
        shutil.rmtree(gone)
        fd.write('1,2\n')
  assert info.value.rescued == str(here / 'all.rescued.csv')
  assert (here / 'all.rescued.csv').read_text() == 'a,b\n1,2\n'
  # A second rescue of the same name does not overwrite the first.
  with pytest.raises(WriteError) as info:
    outputs.write_text(str(gone / 'all.csv'), 'x', rescue=True)
  assert info.value.rescued == str(here / 'all.rescued-2.csv')
  assert (here / 'all.rescued.csv').read_text() == 'a,b\n1,2\n'


def test_rescue_when_syncing_fails(tmp_path, monkeypatch):
  """Disk full at the end (fsync fails): the complete content is kept."""
  real = os.fsync
  path = tmp_path / 'o.json'

  def full(fd):
    if os.path.basename(os.readlink(f'/proc/self/fd/{fd}')).startswith(
        '.o.json.'):
      raise OSError(errno.ENOSPC, 'No space left on device')
    return real(fd)
  monkeypatch.setattr(os, 'fsync', full)
  with pytest.raises(WriteError) as info:
    with outputs.atomic_open(str(path), 'w', rescue=True) as fd:
      fd.write('{"rows": 3}')
  assert not path.exists()
  assert load_json(info.value.rescued) == {'rows': 3}
  no_temp_files(tmp_path)


# -- every command's outputs: one line, exit 2, nothing run ---------------------

def _bad_cases(d):
  """(argv, fragments) of bad outputs, one or more per command option."""
  table = str(d / 'table.csv')
  sweep_spec = str(d / 'spec.yaml')
  sweep_out = str(d / 'sweep.parquet')
  loe = ['llm-optimal-execution', SMALL, '8', '8', 'float16', SYS]
  lae = ['llm-all-executions', SMALL, '8', '8', 'float16', SYS]
  return [
    # The four commands of the issue.
    (['llm-optimal-execution', repo('models', 'gpt3-13B.json'), '8', '8',
      'float16', SYS, '/nonexistent/dir/o.json'],
     ['/nonexistent/dir/o.json: folder /nonexistent/dir does not exist']),
    (['llm', APP, EXE, SYS, '/nonexistent/s.json'],
     ['/nonexistent/s.json: folder /nonexistent does not exist']),
    (['llm-all-executions', repo('models', 'gpt3-13B.json'), '8', '8',
      'float16', SYS, '/nonexistent/o.csv'],
     ['/nonexistent/o.csv: folder /nonexistent does not exist']),
    (['llm', APP, EXE, SYS, '-', '--report', '/proc/x'],
     ['--report /proc/x: folder /proc is not writable']),
    # llm: stats, peers, report.
    (['llm', APP, EXE, SYS, str(d / 'adir')], ['adir: unsupported extension']),
    (['llm', APP, EXE, SYS, str(d / 'adir.json')],
     ['adir.json: is a folder, not a file']),
    (['llm', APP, EXE, SYS, '-', '-p', str(d / 'afile' / 'p.json')],
     ['-p/--peers ', 'afile is not a folder']),
    (['llm', APP, EXE, SYS, '-', '--report', str(d / 'afile')],
     ['--report ', 'afile: is a file, not a folder']),
    (['llm', APP, EXE, SYS, '-', '--report', str(d / 'no' / 'r')],
     ['--report ', 'does not exist']),
    # Searches.
    (loe + [str(d / 'o.parquet')],
     ['must be *.json, *.json.gz, *.csv or *.csv.gz']),
    (loe + ['/dev/null'], ['unsupported extension']),
    (lae + [str(d / 'adir.csv')], ['adir.csv: is a folder, not a file']),
    (lae + ['/proc/o.parquet'], ['folder /proc is not writable']),
    # convert, plots.
    (['convert', table, str(d / 'no' / 'o.parquet')], ['does not exist']),
    (['convert', table, str(d / 'o.xlsx')], ['unsupported extension']),
    (['plot', 'heatmap', table, str(d / 'h.gif')],
     ['h.gif: unsupported extension: figure must be *.png']),
    (['plot', 'vs', table, str(d / 'no' / 'v.png'), '--x', 'data_par'],
     ['does not exist']),
    (['plot', '3d', table, str(d / 'adir.png')], ['is a folder, not a file']),
    (['plot', 'sweep', sweep_out, '--x', 'a', '--y', 'b', '-o',
      '/proc/s.png'], ['-o/--output /proc/s.png: folder /proc is not']),
    # Validation, sweep, the log.
    (['llm-validation', '--out', str(d / 'afile')],
     ['--out ', 'is a file, not a folder']),
    (['llm-validation', '--plot', '/proc/plots'],
     ['--plot /proc/plots: folder /proc is not writable']),
    (['sweep', sweep_spec, str(d / 'afile')], ['is a file, not a folder']),
    (['sweep', sweep_spec, str(d / 'no' / 'o.parquet')], ['does not exist']),
    (['-l', str(d / 'no' / 'log.txt'), 'llm', APP, EXE, SYS, '-'],
     ['--log ', 'does not exist']),
    (['-l', str(d / 'adir'), 'version'], ['--log ', 'Is a directory']),
  ]


def test_every_output_option_is_checked_before_the_work(tmp_path):
  d = tmp_path
  (d / 'afile').write_text('x')
  for name in ('adir', 'adir.json', 'adir.csv', 'adir.png'):
    (d / name).mkdir()
  pd.DataFrame({'tensor_par': [1, 2], 'pipeline_par': [1, 1],
                'data_par': [2, 1], 'sample_rate': [1.0, 2.0]}).to_csv(
                  d / 'table.csv', index=False)
  (d / 'spec.yaml').write_text(f'applications: [{SMALL}]\nsystems: [{SYS}]\n'
                               'num_procs: 8\nmax_batch_size: 8\n'
                               'datatypes: float16\n')
  cases = _bad_cases(d)
  before = sorted(os.listdir(d))
  with concurrent.futures.ThreadPoolExecutor(4) as pool:
    results = list(pool.map(lambda case: run_cli(*case[0], cwd=d), cases))
  for (argv, fragments), res in zip(cases, results):
    one_line_error(res, *fragments)
  assert sorted(os.listdir(d)) == before  # nothing written, no probe left
  assert not os.path.exists('/nonexistent')


# -- faults: the output folder removed while the work runs ----------------------

def run_patched(patch, argv, cwd):
  """``calculon ARGV`` in a subprocess after ``patch`` (Python code run
  first: it replaces a function to act during the work)."""
  code = patch + '\nfrom calculon.cli.main import main\n' \
    f'sys.exit(main({[str(a) for a in argv]!r}))\n'
  env = dict(os.environ)
  env['PYTHONPATH'] = ROOT + os.pathsep + env.get('PYTHONPATH', '')
  return subprocess.run([sys.executable, '-c', code], cwd=cwd,
                        capture_output=True, text=True, timeout=300, env=env)


def test_search_keeps_its_result_when_the_folder_is_removed(tmp_path):
  out_dir, here = tmp_path / 'out', tmp_path / 'cwd'
  out_dir.mkdir()
  here.mkdir()
  patch = f"""
import shutil, sys
from calculon.llm import search as S
real = S.optimal_executions
def search_then_remove(*args, **kwargs):
  result = real(*args, **kwargs)
  shutil.rmtree({str(out_dir)!r})   # while the search runs
  return result
S.optimal_executions = search_then_remove
"""
  argv = ['loe', SMALL, 2, 8, 'float16', SYS, out_dir / 'best.json', '-t',
          3, '-c', 1]
  res = run_patched(patch, argv, here)
  line = one_line_error(res, nothing_done=False)
  assert line == (f'calculon: error: {out_dir}/best.json: cannot be written: '
                  'No such file or directory; the result is saved in '
                  f'{here}/best.rescued.json instead')
  assert 'Best sample rate' in res.stdout
  best = load_json(here / 'best.rescued.json')
  assert list(best) == ['0', '1', '2']
  rate = float(res.stdout.split('Best sample rate: ')[1].split()[0])
  assert best['0']['stats']['sample_rate'] == rate
  # The same search written normally: the same result.
  out_dir.mkdir()
  ok = run_cli(*argv)
  assert ok.returncode == 0, ok.stderr
  assert load_json(out_dir / 'best.json') == best


def test_streamed_table_is_kept_when_the_folder_is_removed(tmp_path):
  out_dir, here = tmp_path / 'out', tmp_path / 'cwd'
  out_dir.mkdir()
  here.mkdir()
  patch = f"""
import shutil, sys
from calculon.llm import search as S
real = S.all_executions
def remove_after_first_chunk(*args, **kwargs):
  for i, chunk in enumerate(real(*args, **kwargs)):
    yield chunk
    if i == 0:
      shutil.rmtree({str(out_dir)!r})
S.all_executions = remove_after_first_chunk
"""
  res = run_patched(patch, ['lae', SMALL, 2, 4, 'float16', SYS,
                            out_dir / 'all.parquet', '-c', 1, '--chunk',
                            1024], here)
  one_line_error(res, f'{out_dir}/all.parquet: cannot be written',
                 f'saved in {here}/all.rescued.parquet instead',
                 nothing_done=False)
  good = int(res.stdout.split('Good executions: ')[1].split()[0])
  frame = pd.read_parquet(here / 'all.rescued.parquet')
  assert len(frame) == good > 0
  assert frame['sample_rate'].gt(0).all()


def test_search_prints_its_result_when_nothing_can_be_written(
    tmp_path, monkeypatch, capsys):
  """Last resort (no folder takes the file): the result on stdout."""
  from calculon.cli.main import main
  from calculon.llm import search as S
  real = S.optimal_executions
  out_dir = tmp_path / 'out'
  out_dir.mkdir()

  def search_then_remove(*args, **kwargs):
    result = real(*args, **kwargs)
    shutil.rmtree(out_dir)
    return result
  monkeypatch.setattr(S, 'optimal_executions', search_then_remove)
  monkeypatch.setattr(outputs, 'rescue_candidates', lambda path: iter(()))
  status = main(['loe', SMALL, '1', '8', 'float16', SYS,
                 str(out_dir / 'best.csv'), '-c', '1', '-q'])
  out, err = capsys.readouterr()
  assert status == 2
  assert err.strip().endswith('the result is saved in stdout (printed above) '
                              'instead')
  best = json.loads(out[out.index('{\n'):])
  assert best['0']['stats']['sample_rate'] == float(
    out.split('Best sample rate: ')[1].split()[0])


def test_sweep_keeps_a_part_it_cannot_write(tmp_path, monkeypatch):
  from calculon.sweep import load_spec, read_sweep, run_point, run_sweep
  from calculon.sweep import runner
  here = tmp_path / 'cwd'
  here.mkdir()
  monkeypatch.chdir(here)
  spec_path = tmp_path / 's.yaml'
  spec_path.write_text(f"""
applications: [{SMALL}]
systems: [{SYS}]
variations:
  networks[1].bandwidth: {{scale: [0.5, 1, 2]}}
num_procs: 2
max_batch_size: 8
datatypes: float16
""")
  spec = load_spec(str(spec_path))
  out = tmp_path / 'o.parquet'
  marker = str(tmp_path / 'removed')

  def remove_at_first(point):
    # (Runs on the worker thread, on a copy of this function: state in
    # files.)
    result = run_point(point)
    if not os.path.exists(marker):
      open(marker, 'w').close()
      shutil.rmtree(out)  # before the first part is written
    return result
  monkeypatch.setattr(runner, 'run_point', remove_at_first)
  summary = run_sweep(spec, str(out), workers=1, batch_points=1,
                      progress=False, log=logging.getLogger('test_outputs'))
  err = summary.write_error
  assert isinstance(err, WriteError) and summary.interrupted
  assert str(err).startswith(f'{out}/part-')
  rescued = err.rescued
  assert os.path.dirname(rescued) == str(here)
  assert os.path.basename(rescued).startswith('part-')
  assert rescued.endswith('.rescued.parquet')
  part = pd.read_parquet(rescued)
  assert len(part) == summary.rescued_rows >= 1
  assert set(part['point_id']) <= {p.id for p in spec.points()}
  assert part['sample_rate'].gt(0).all()
  assert any('Not written' in line for line in summary.lines(str(out)))
  # Moved into the (re-created) output folder, its points count as done.
  os.makedirs(out)
  shutil.move(rescued, out / os.path.basename(rescued))
  assert set(read_sweep(str(out))['point_id']) == set(part['point_id'])
