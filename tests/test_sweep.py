"""Sweeps: the spec (validation, points, ids), runs (embedded, on a dask
cluster that loses a worker, resumed after SIGKILL) and plots.

The sweep used by the run tests has 8 points (megatron-126M and 5B on 8 and
16 A100s, inter-node bandwidth x0.5 and x2, top 2), each a search of
0.2-0.5 s; CALCULON_SWEEP_DELAY_S slows points down where a test must act
mid-sweep.
"""

import glob
import json
import logging
import os
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest

from calculon import ConfigError
from calculon.cli.main import main
from calculon.sweep import load_spec, read_sweep, run_point, schema
from calculon.sweep.spec import apply_variations
from calculon.sweep.store import SweepStore, part_files
from calculon.sweep.task import DELAY_ENV
from conftest import ROOT, load_json, repo

MODELS, SYSTEMS = repo('models'), repo('systems')

SPEC = f"""
# test sweep
applications:
  - file: {MODELS}/megatron-126M.json
    max_batch_size: 16
  - file: {MODELS}/megatron-5B.json
    max_batch_size: 32
systems: [{SYSTEMS}/a100_80g.json]
variations:
  networks[1].bandwidth: {{scale: [0.5, 2]}}
num_procs: [8, 16]
datatypes: float16
search: {{top_n: 2}}
"""
POINTS = 8
#: Columns that differ between runs (wall times).
VOLATILE = ['search_s']


def write(path, text):
  path.write_text(text)
  return str(path)


@pytest.fixture(scope='module')
def spec_file(tmp_path_factory):
  return write(tmp_path_factory.mktemp('spec') / 'sweep.yaml', SPEC)


def cli_env(**extra):
  env = dict(os.environ)
  env['PYTHONPATH'] = ROOT + os.pathsep + env.get('PYTHONPATH', '')
  env.pop(DELAY_ENV, None)
  env.update(extra)
  return env


def cli(*args, timeout=120, **env):
  return subprocess.run([sys.executable, '-m', 'calculon', *map(str, args)],
                        cwd=ROOT, capture_output=True, text=True,
                        timeout=timeout, env=cli_env(**env))


def popen(*args, **env):
  return subprocess.Popen([sys.executable, '-m', 'calculon',
                           *map(str, args)], cwd=ROOT, env=cli_env(**env),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)


def canonical(frame):
  """Rows sorted by point and rank, without wall times."""
  return frame.drop(columns=VOLATILE).sort_values(
    ['point_id', 'rank']).reset_index(drop=True)


def wait_for(condition, timeout_s=60, what='condition'):
  deadline = time.monotonic() + timeout_s
  while time.monotonic() < deadline:
    value = condition()
    if value:
      return value
    time.sleep(0.05)
  raise AssertionError(f'timed out waiting for {what}')


@pytest.fixture(scope='module')
def embedded(spec_file, tmp_path_factory):
  """The reference: the sweep run by the embedded default (2 local worker
  processes)."""
  out = tmp_path_factory.mktemp('embedded') / 'out.parquet'
  res = cli('sweep', spec_file, out, '--workers', '2')
  assert res.returncode == 0, res.stdout + res.stderr
  assert f'{POINTS} computed, 0 failed' in res.stdout, res.stdout
  return out, res.stdout, read_sweep(str(out))


# -- the spec -----------------------------------------------------------------

def test_points_and_ids(spec_file):
  spec = load_spec(spec_file)
  points = spec.points()
  assert len(points) == spec.num_points() == POINTS
  assert spec.param_columns == ['application', 'system',
                                'networks_1_bandwidth_scale', 'num_procs',
                                'max_batch_size', 'datatype']
  assert points[0].params == {
    'application': 'megatron-126M', 'system': 'a100_80g',
    'networks_1_bandwidth_scale': 0.5, 'num_procs': 8, 'max_batch_size': 16,
    'datatype': 'float16'}
  assert points[0].system['networks'][1]['bandwidth'] == 12.5
  ids = [p.id for p in points]
  assert len(set(ids)) == POINTS
  assert ids == [p.id for p in load_spec(spec_file).points()]  # stable
  # Same meaning, other spelling (JSON, 2.0, reordered keys): same ids.
  doc = {'search': {'top_n': 2}, 'datatypes': ['float16'],
         'num_procs': [8, 16],
         'variations': {'networks[1].bandwidth': {'scale': [0.50, 2.0]}},
         'systems': [f'{SYSTEMS}/a100_80g.json'],
         'applications': [
           {'file': f'{MODELS}/megatron-126M.json', 'max_batch_size': 16},
           {'max_batch_size': [32], 'file': f'{MODELS}/megatron-5B.json'}]}
  other = os.path.join(os.path.dirname(spec_file), 'same.json')
  with open(other, 'w') as fd:
    json.dump(doc, fd)
  assert [p.id for p in load_spec(other).points()] == ids
  # A different search option is a different point.
  doc['search']['top_n'] = 3
  with open(other, 'w') as fd:
    json.dump(doc, fd)
  assert not set(p.id for p in load_spec(other).points()) & set(ids)


def test_relative_paths_names_and_variations(tmp_path):
  (tmp_path / 'm').mkdir()
  (tmp_path / 'm' / 'small.json').write_text(
    open(repo('models', 'megatron-126M.json')).read())
  spec = load_spec(write(tmp_path / 's.yml', f"""
applications: [m/small.json]
systems:
  - {{file: {SYSTEMS}/a100_80g.json, name: a100}}
variations:
  matrix.*.tflops: {{scale: [1, 2]}}
  networks[0].size: {{value: [4, 16], name: nvlink_size}}
  mem1.GiB: {{value: [40.5]}}
  networks[1].latency: {{value: [5e-6]}}
num_procs: 8
max_batch_size: [8, 16]
datatypes: [float16, float8]
"""))
  assert spec.num_points() == 1 * 1 * 4 * 1 * 2 * 2
  assert spec.param_columns[:5] == ['application', 'system',
                                    'matrix_all_tflops_scale', 'nvlink_size',
                                    'mem1_GiB']
  p = spec.points()[-1]
  assert p.params['application'] == 'small' and p.params['system'] == 'a100'
  assert p.system['matrix']['float16']['tflops'] == 624
  assert p.system['networks'][0]['size'] == 16
  assert isinstance(p.system['networks'][0]['size'], int)
  assert p.system['mem1']['GiB'] == 40.5
  assert p.system['networks'][1]['latency'] == 5e-6  # YAML 1.1 reads a str
  # Scaling an integer field keeps it an integer when whole.
  sys_ = load_json(repo('systems', 'a100_80g.json'))
  var = spec.variations[1]
  assert apply_variations(sys_, [var], (8.0,))['networks'][0]['size'] == 8


BAD_SPECS = [
  # (spec text, fragments of the message)
  ('num_procs: [8]\n', ["missing field 'applications'"]),
  ('{base}num_proc: [8]\n', ["unknown field 'num_proc'", 'did you mean',
                             'num_procs']),
  ('{base}num_procs: [8, 0]\n', ["'num_procs[1]'", '= 0',
                                 'an integer >= 1']),
  ('{base}num_procs: [8, 8]\n', ["'num_procs[1]'", 'each value once']),
  ('{base}num_procs: []\n', ["'num_procs'", 'non-empty list']),
  ('{base}num_procs: 8\ndatatypes: int4\n',
   ["'datatypes'", '"int4"', '"float16"']),
  ('{base}num_procs: 8\nsearch: {{top_n: 0}}\n',
   ["'search.top_n'", '= 0', 'an integer >= 1']),
  ('{base}num_procs: 8\nsearch: {{fused_activation: maybe}}\n',
   ["'search.fused_activation'", '"maybe"', '"both"']),
  ('{base}num_procs: 8\nsearch: {{tp_overlap: 1}}\n',
   ["'search.tp_overlap'", 'true or false']),
  ('{base}num_procs: 8\nsearch: {{top: 1}}\n', ["unknown field 'search.top'"]),
  ('{base}num_procs: 8\nvariations:\n  networks[1].bandwidth: {{scale: [0]}}'
   '\n',
   ["'variations.networks[1].bandwidth.scale[0]'", '= 0', '> 0']),
  ('{base}num_procs: 8\nvariations:\n  networks[1].bandwidth: [2]\n',
   ["'variations.networks[1].bandwidth' = [2]", 'exactly one of "scale"']),
  ('{base}num_procs: 8\nvariations:\n  mem1.GiB: {{scale: [1], value: [2]}}\n',
   ['exactly one of "scale"']),
  ('{base}num_procs: 8\nvariations:\n  networks[2].bandwidth: {{scale: [2]}}'
   '\n',
   ["'variations.networks[2].bandwidth'", 'a100_80g', '2 entries']),
  ('{base}num_procs: 8\nvariations:\n  mem1.TiB: {{scale: [2]}}\n',
   ["'variations.mem1.TiB'", 'no field "TiB"', '"GiB"']),
  ('{base}num_procs: 8\nvariations:\n  matrix.float8.tflops: {{scale: [2]}}\n',
   ["'variations.matrix.float8.tflops'", 'no field "float8"']),
  ('{base}num_procs: 8\nvariations:\n  mem1.MB_efficiency: {{scale: [2]}}\n',
   ['mem1.MB_efficiency', 'is not a number']),
  ('{base}num_procs: 8\nvariations:\n  networks[0].size: {{scale: [0.3]}}\n',
   ['networks[0].size x0.3', "field 'networks[0].size' = 2.4",
    'an integer']),
  ('{base}num_procs: 8\nvariations:\n  "networks[1]..bw": {{scale: [2]}}\n',
   ["'variations' has key \"networks[1]..bw\"", 'a path']),
  ('{base}num_procs: 8\nvariations:\n  mem1.GiB: {{value: [1], name: rank}}\n',
   ["'variations.mem1.GiB.name' = \"rank\"", 'not used by another']),
  ('{base}num_procs: 8\nnum_procs: 16\n', ['"num_procs" is given twice',
                                          'line']),
  ('{base}num_procs: [8\n', ['not valid YAML', 'line']),
  ('applications: [{models}/nope.json]\nsystems: [{systems}/a100_80g.json]\n'
   'num_procs: 8\nmax_batch_size: 8\ndatatypes: float16\n',
   ["'applications[0]'", 'models/nope.json: no such file']),
  ('applications: [{models}/megatron-126M.json, {models}/megatron-126M.json]\n'
   'systems: [{systems}/a100_80g.json]\nnum_procs: 8\nmax_batch_size: 8\n'
   'datatypes: float16\n', ["'applications[1]'", 'each value once']),
  ('applications: [{models}/megatron-126M.json]\n'
   'systems: [{systems}/a100_80g.json]\nnum_procs: 8\ndatatypes: float16\n',
   ["missing field 'max_batch_size'", '"megatron-126M"']),
]


@pytest.mark.parametrize('text,fragments', BAD_SPECS)
def test_bad_spec(tmp_path, text, fragments):
  base = (f'applications: [{MODELS}/megatron-126M.json]\n'
          f'systems: [{SYSTEMS}/a100_80g.json]\nmax_batch_size: 8\n'
          'datatypes: float16\n')
  path = write(tmp_path / 'bad.yaml', text.format(
    base=base.replace('datatypes: float16\n', '') if 'datatypes' in text
    else base, models=MODELS, systems=SYSTEMS))
  with pytest.raises(ConfigError) as info:
    load_spec(path)
  msg = str(info.value)
  assert isinstance(info.value, ValueError)
  assert path in msg, msg
  for frag in fragments:
    assert frag in msg, msg


def test_bad_input_exits_2(tmp_path, spec_file):
  bad = write(tmp_path / 'bad.yaml', 'applications: 3\n')
  res = cli('sweep', bad, tmp_path / 'o.parquet')
  assert res.returncode == 2
  assert res.stderr.startswith(f'calculon: error: {bad}: '), res.stderr
  assert not (tmp_path / 'o.parquet').exists()
  afile = tmp_path / 'file.parquet'
  afile.write_text('x')
  res = cli('sweep', spec_file, afile)
  assert res.returncode == 2 and 'is a file, not a folder' in res.stderr
  res = cli('sweep', spec_file, tmp_path / 'o.parquet', '--scheduler',
            'tcp://127.0.0.1:9', '--workers', '2')
  assert res.returncode == 2 and '--workers' in res.stderr


# -- points -------------------------------------------------------------------

def test_infeasible_points_are_rows(tmp_path):
  spec = load_spec(write(tmp_path / 's.yaml', f"""
applications: [{MODELS}/megatron-1T.json]
systems: [{SYSTEMS}/a100_80g.json]
num_procs: 8
max_batch_size: 16
datatypes: [float16, float8]
"""))
  fp16, fp8 = spec.points()
  res = run_point(fp8)
  assert not res.feasible and res.executions == 0
  (row,) = res.rows
  assert row['feasible'] is False and row['rank'] == 0
  assert 'float8' in row['reason'] and 'a100_80g' in row['reason']
  res = run_point(fp16)
  (row,) = res.rows
  assert not res.feasible and res.executions > 0
  assert row['reason'].startswith('no feasible execution (memory tier 1 too '
                                  'small: ')
  # Both rows fit the sweep's schema (nulls for the execution and stats).
  import pyarrow as pa
  table = pa.Table.from_pylist([row], schema=schema(spec.param_columns))
  assert table.column('sample_rate').null_count == 1


# -- runs ---------------------------------------------------------------------

def test_embedded_run_and_rerun(embedded, spec_file):
  out, stdout, frame = embedded
  assert 'Running on 2 local worker processes' in stdout
  assert 'Executions evaluated: ' in stdout and 'executions/s' in stdout
  assert len(frame) == POINTS * 2
  assert frame['point_id'].nunique() == POINTS
  assert not frame.duplicated(['point_id', 'rank']).any()
  assert frame['feasible'].all() and (frame['reason'] == '').all()
  assert sorted(frame['rank'].unique()) == [0, 1]
  cols = list(frame.columns)
  assert cols[:8] == ['point_id', 'application', 'system',
                      'networks_1_bandwidth_scale', 'num_procs',
                      'max_batch_size', 'datatype', 'rank']
  for name in ('tensor_par', 'microbatch_size', 'activation_recompute',
               'sample_rate', 'total_time', 'proc_mem_tier1_cap_req',
               'executions', 'calculon_version'):
    assert name in cols
  best = frame[frame['rank'] == 0].set_index(
    ['application', 'num_procs', 'networks_1_bandwidth_scale'])
  # More bandwidth never hurts; the search's best equals a single run.
  for app in ('megatron-126M', 'megatron-5B'):
    for n in (8, 16):
      assert best.loc[(app, n, 2.0), 'sample_rate'] >= \
        best.loc[(app, n, 0.5), 'sample_rate']
  # Re-running: nothing to do, no cluster started.
  res = cli('sweep', spec_file, out)
  assert res.returncode == 0, res.stdout + res.stderr
  assert f'{POINTS} skipped (already done), 0 computed' in res.stdout
  assert 'Running on' not in res.stdout
  assert len(part_files(str(out))) == len(
    glob.glob(os.path.join(str(out), 'part-*.parquet')))
  pd.testing.assert_frame_equal(canonical(read_sweep(str(out))),
                                canonical(frame))


def test_sigkill_then_resume(tmp_path, spec_file, embedded):
  out = tmp_path / 'killed.parquet'
  proc = popen('sweep', spec_file, out, '--workers', '1',
               '--batch-points', '1', **{DELAY_ENV: '0.4'})
  try:
    wait_for(lambda: len(part_files(str(out))) >= 2, what='2 parts')
  finally:
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
  assert proc.returncode == -signal.SIGKILL
  # What was written before the kill is readable and whole.
  before = read_sweep(str(out))
  done = before['point_id'].nunique()
  assert 2 <= done < POINTS
  assert len(before) == 2 * done
  # A writer killed mid-part leaves a hidden temporary file: ignored, removed.
  (out / '.part-leftover.parquet.tmp').write_bytes(b'PAR1 half a file')
  res = cli('sweep', spec_file, out, '--workers', '1')
  assert res.returncode == 0, res.stdout + res.stderr
  assert (f'{done} skipped (already done), {POINTS - done} computed, '
          '0 failed') in res.stdout, res.stdout
  assert not (out / '.part-leftover.parquet.tmp').exists()
  after = read_sweep(str(out))
  assert not after.duplicated(['point_id', 'rank']).any()
  pd.testing.assert_frame_equal(canonical(after), canonical(embedded[2]))


def test_worker_killed_mid_sweep(tmp_path, spec_file, embedded, monkeypatch):
  from distributed import Client, LocalCluster
  # Inherited by the workers (and their restarts): each point takes >= 1 s.
  monkeypatch.setenv(DELAY_ENV, '1.0')
  out = tmp_path / 'cluster.parquet'
  with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                    dashboard_address=None) as cluster, \
      Client(cluster) as client:
    pids = client.run(os.getpid)
    assert len(pids) == 2
    proc = popen('sweep', spec_file, out, '--scheduler',
                 cluster.scheduler_address, '--batch-points', '1')
    try:
      def busy_worker():
        if not part_files(str(out)):
          return None
        for addr, keys in client.processing().items():
          keys = [k for k in keys if str(k).startswith('calculon-sweep-')]
          if addr in pids and keys:
            return addr, keys
        return None
      victim, keys = wait_for(busy_worker, what='a part and a busy worker')
      os.kill(pids[victim], signal.SIGKILL)
      stdout, _ = proc.communicate(timeout=120)
      # The scheduler ran the victim's points again elsewhere.
      story = cluster.scheduler.story(*keys)
      runs = [t for t in story if t[2] == 'processing']
      assert len(runs) > len(keys), story
    finally:
      if proc.poll() is None:
        proc.kill()
        proc.communicate()
  assert proc.returncode == 0, stdout
  assert f'{POINTS} computed, 0 failed' in stdout, stdout
  assert f'on the cluster at {cluster.scheduler_address}' in stdout
  frame = read_sweep(str(out))
  assert len(part_files(str(out))) >= 2
  assert not frame.duplicated(['point_id', 'rank']).any()
  assert frame['point_id'].nunique() == POINTS
  pd.testing.assert_frame_equal(canonical(frame), canonical(embedded[2]))


def test_output_guards(tmp_path, spec_file):
  spec = load_spec(spec_file)
  folder = str(tmp_path / 'o.parquet')
  rows = run_point(spec.points()[0]).rows
  with SweepStore(folder, schema(spec.param_columns)) as store:
    store.write(rows)
    with pytest.raises(ConfigError, match='another sweep .* is writing'):
      with SweepStore(folder, schema(spec.param_columns)):
        pass
  with SweepStore(folder, schema(spec.param_columns)) as store:
    assert store.done == {spec.points()[0].id}
  # Another spec's columns (other variations) are refused.
  other = schema(['application', 'system', 'mem1_GiB', 'num_procs',
                  'max_batch_size', 'datatype'])
  with pytest.raises(ConfigError, match='other columns .*missing: mem1_GiB'):
    with SweepStore(folder, other):
      pass


# -- plots --------------------------------------------------------------------

def _check_png(path):
  from matplotlib import image
  assert os.path.getsize(path) > 10_000
  pixels = image.imread(path)
  assert len({tuple(p) for p in pixels.reshape(-1, pixels.shape[-1])}) > 20


@pytest.mark.parametrize('kind', ['line', 'heatmap'])
def test_plot(embedded, tmp_path, capsys, kind):
  out = str(embedded[0])
  png = str(tmp_path / f'{kind}.png')
  rc = main(['plot', 'sweep', out, '--x', 'networks_1_bandwidth_scale',
             '--y', 'sample_rate', '--hue', 'application', '--col',
             'num_procs', '--kind', kind, '--logx', '-o', png])
  assert rc == 0
  _check_png(png)
  assert f'Plot: {png}' in capsys.readouterr().out


def test_plot_combines_and_rejects(embedded, tmp_path, capsys):
  out = str(embedded[0])
  png = str(tmp_path / 'p.png')
  assert main(['plot', 'sweep', out, '--x', 'num_procs', '--y',
               'total_efficiency', '--hue', 'application', '-o', png,
               '--where', 'datatype=float16']) == 0
  assert 'Combined by max over: networks_1_bandwidth_scale (2 values)' in \
    capsys.readouterr().out
  _check_png(png)
  assert main(['plot', 'sweep', out, '--x', 'bandwidth', '--y',
               'sample_rate', '-o', png]) == 2
  err = capsys.readouterr().err
  assert "--x 'bandwidth' is not a column" in err
  assert 'networks_1_bandwidth_scale' in err
  assert main(['plot', 'sweep', out, '--x', 'num_procs', '--y',
               'application', '-o', png]) == 2
  assert "--y 'application' is not numeric" in capsys.readouterr().err
  assert main(['plot', 'sweep', out, '--x', 'num_procs', '--y',
               'sample_rate', '--where', 'num_procs=4', '-o', png]) == 2
  assert 'no row has rank 0 and num_procs=4' in capsys.readouterr().err


def test_failed_point_is_retried_by_next_run(tmp_path, monkeypatch, caplog):
  from calculon.sweep import run_sweep, runner
  spec = load_spec(write(tmp_path / 's.yaml', f"""
applications: [{MODELS}/megatron-126M.json]
systems: [{SYSTEMS}/a100_80g.json]
variations:
  networks[1].bandwidth: {{scale: [0.5, 1, 2]}}
num_procs: 8
max_batch_size: 8
datatypes: float16
"""))
  bad = spec.points()[1]

  def flaky(point):
    if point.id == bad.id:
      raise RuntimeError('worker lost its disk')
    return run_point(point)
  monkeypatch.setattr(runner, 'run_point', flaky)
  out = str(tmp_path / 'o.parquet')
  log = logging.getLogger('test_sweep')
  summary = run_sweep(spec, out, workers=1, progress=False, log=log)
  assert (summary.computed, summary.failed) == (2, 1)
  assert 'worker lost its disk' in caplog.text and bad.id in caplog.text
  assert bad.id not in set(read_sweep(out)['point_id'])
  monkeypatch.undo()
  summary = run_sweep(spec, out, workers=1, progress=False, log=log)
  assert (summary.skipped, summary.computed, summary.failed) == (2, 1, 0)
  assert read_sweep(out)['point_id'].nunique() == 3
