"""The command line, through real subprocesses: outputs, formats, exit codes.
"""

import gzip
import json
import os
import subprocess
import sys

import pandas as pd
import pytest

from calculon import System
from calculon.llm import Llm
from conftest import ROOT, load_json, repo, run_cli

APP = repo('models', 'megatron-1T.json')
EXE = repo('examples', '3072_t4_p64_d12_mbs4_full.json')
SYS = repo('systems', 'a100_80g.json')
COMMANDS = ['llm', 'llm-parameter-calculator', 'lpc', 'llm-optimal-execution',
            'loe', 'llm-all-executions', 'lae', 'version']


def single_run_stats(app=APP, exe=EXE, system=SYS):
  model = Llm(Llm.Application(load_json(app)))
  sysm = System(load_json(system))
  model.compile(sysm, Llm.Execution.from_json(load_json(exe)))
  model.run(sysm)
  return model.get_stats_json(False)


def test_version_and_help():
  out = run_cli('--version')
  assert out.returncode == 0 and out.stdout.startswith('calculon ')
  for command in COMMANDS:
    res = run_cli(command, '-h')
    assert res.returncode == 0, (command, res.stderr)
    assert 'usage:' in res.stdout


def test_llm_report_to_stdout():
  res = run_cli('llm', APP, EXE, SYS, '-')
  assert res.returncode == 0, res.stderr
  stats = single_run_stats()
  assert f"{stats['total_time']:.4f} s" in res.stdout
  assert f"{stats['sample_rate']:.3f} samples/s" in res.stdout
  assert 'GiB' in res.stdout


@pytest.mark.parametrize('name', ['stats.json', 'stats.json.gz'])
def test_llm_stats_file_layers_and_peers(tmp_path, name):
  out, peers = tmp_path / name, tmp_path / 'peers.json'
  res = run_cli('llm', APP, EXE, SYS, out, '-l', '-p', peers)
  assert res.returncode == 0, res.stderr
  opener = gzip.open if name.endswith('.gz') else open
  with opener(out, 'rt') as fd:
    got = json.load(fd)
  want = single_run_stats()
  assert {k: got[k] for k in want} == want
  assert len(got['layers']) == 24
  assert got['layers'][0]['name'] == 'AttnBlock_Fork'
  peer_map = load_json(peers)
  assert len(peer_map) == 3072
  assert peer_map['0'] == {'tensor': [0, 1, 2, 3], 'pipeline': 4,
                           'data': [i * 256 for i in range(12)]}


def test_llm_infeasible_exits_1_with_one_line(tmp_path):
  exe = load_json(EXE)
  exe.update(microbatch_size=16, activation_recompute='none')
  path = tmp_path / 'exe.json'
  path.write_text(json.dumps(exe))
  res = run_cli('llm', APP, path, SYS, '-')
  assert res.returncode == 1
  lines = res.stdout.strip().splitlines()
  assert len(lines) == 1
  assert lines[0].startswith('ERROR: Mem tier1 needs ')
  assert lines[0].endswith('but only has 80.000 GiB')


@pytest.mark.parametrize('args,fragment', [
  (['llm', APP, EXE, repo('nope.json'), '-'], 'nope.json: no such file'),
  (['llm', EXE, EXE, SYS, '-'], "missing field 'hidden'"),
  (['llm', APP, EXE, SYS, 'out.txt'], "must be '-', *.json or *.json.gz"),
  (['loe', APP, '64', '64', 'float16', SYS, 'out.txt'], '*.csv.gz'),
  (['loe', APP, '64', '64', 'float8', SYS, 'o.json'], '"float8" is not allowed'),
  (['lae', APP, '64', '64', 'float16', SYS, 'out.json'], '*.parquet'),
  (['llm-parameter-calculator', SYS], "missing field 'hidden'"),
])
def test_bad_input_exits_2_with_a_message(tmp_path, args, fragment):
  res = run_cli(*args, cwd=tmp_path)
  assert res.returncode == 2, res
  assert fragment in res.stderr
  assert 'Traceback' not in res.stderr
  assert len(res.stderr.strip().splitlines()) == 1


def test_usage_errors_exit_2():
  for args in (['loe', APP, 'many', '64', 'float16', SYS, 'o.json'],
               ['loe', APP, '64', '64', 'float16', SYS, 'o.json', '-f', 'x'],
               ['nonsense']):
    res = run_cli(*args)
    assert res.returncode == 2 and 'usage:' in res.stderr


def test_parameter_calculator():
  res = run_cli('llm-parameter-calculator', repo('models', 'gpt3-175B.json'))
  assert res.returncode == 0
  lines = res.stdout.strip().splitlines()
  # Calculon's line first, then the breakdown (Narayanan et al. 2021 eq. 2
  # written out: embedding (51,200 + 2,048) x 12,288; per block attention
  # 4 h^2 + 4 h biases, MLP 8 h^2 + 5 h, two LayerNorms 4 h).
  assert lines[0] == 'gpt3-175B     -> 174.616 G'
  h = 12288
  parts = dict(line.split()[:2] for line in lines[1:])
  assert int(parts['embedding'].replace(',', '')) == (51200 + 2048) * h
  assert int(parts['attention'].replace(',', '')) == 96 * (4 * h * h + 4 * h)
  assert int(parts['mlp'].replace(',', '')) == 96 * (8 * h * h + 5 * h)
  assert int(parts['total'].replace(',', '')) == 174_615_822_336


@pytest.fixture(scope='module')
def readme_search(tmp_path_factory):
  """The README search: Turing-530B on 5,128 A100s, batch 2,520, -m."""
  out = tmp_path_factory.mktemp('loe') / 'best.json'
  res = run_cli('llm-optimal-execution', repo('models', 'turing-530B.json'),
                5128, 2520, 'float16', SYS, out, '-m', '-t', 3)
  return res, out


def test_optimal_execution_json(readme_search):
  res, out = readme_search
  assert res.returncode == 0, res.stderr
  assert 'Total executions: 8112' in res.stdout
  assert 'Good executions: 1080' in res.stdout
  best = load_json(out)
  assert list(best) == ['0', '1', '2']
  assert best['0']['stats']['sample_rate'] == 111.1604995663596
  assert best['0']['execution']['tensor_par'] == 8
  rates = [best[k]['stats']['sample_rate'] for k in best]
  assert rates == sorted(rates, reverse=True)


def test_search_fsdp_buffer_copies_flag(tmp_path):
  """--set fsdp_buffer_copies=true through a real subprocess: FSDP candidates carry
  the field (the others leave it out) and the best FSDP execution runs as a
  single execution, its copies in the report."""
  model = repo('models', 'llama3-70B.json')
  system = repo('systems', 'h100_sxm_80g.json')
  out = tmp_path / 'best.json'
  res = run_cli('llm-optimal-execution', model, 16, 32, 'bfloat16', system,
                out, '-q', '-t', '40', '--set', 'fsdp_buffer_copies=true')
  assert res.returncode == 0, res.stderr
  best = load_json(out)
  fsdp = [b['execution'] for b in best.values()
          if b['execution'].get('data_par_sharding') == 'parameters']
  assert fsdp and all(e['fsdp_buffer_copies'] is True for e in fsdp)
  assert all('fsdp_buffer_copies' not in b['execution']
             for b in best.values()
             if b['execution'].get('data_par_sharding') != 'parameters')
  exe = tmp_path / 'exe.json'
  exe.write_text(json.dumps(fsdp[0]))
  one = run_cli('llm', model, exe, system, '-')
  assert one.returncode == 0, one.stderr
  line = [x for x in one.stdout.splitlines() if 'FSDP buffer copies' in x]
  assert line and float(line[0].split()[3]) > 0


def test_search_recompute_modules_choices():
  """The search's --recompute-modules choices are the execution schema's
  modules (written out in the CLI to keep numpy out of its start-up)."""
  from calculon.cli.search import _RECOMPUTE_MODULES
  from calculon.config.execution import RECOMPUTE_MODULES
  assert _RECOMPUTE_MODULES == RECOMPUTE_MODULES


def test_search_recompute_modules_flag(tmp_path):
  """--recompute-modules through a real subprocess: a module named twice is
  one line naming the field and what is allowed, exit 2, no output; a good
  set gives selective candidates those modules, and the best execution
  runs as a single execution."""
  model = repo('models', 'mixtral-8x7B.json')
  system = repo('systems', 'h100_sxm_80g_datasheet.json')
  out = tmp_path / 'best.json'
  bad = run_cli('llm-optimal-execution', model, 16, 64, 'bfloat16', system,
                out, '-q', '--recompute-modules', 'moe', 'moe')
  assert bad.returncode == 2
  assert "'recompute_modules' = [\"moe\", \"moe\"] is not allowed" in \
    bad.stderr and len(bad.stderr.strip().splitlines()) == 1
  assert not out.exists()
  good = run_cli('llm-optimal-execution', model, 16, 64, 'bfloat16', system,
                 out, '-q', '-t', '40', '--recompute-modules', 'layernorm',
                 'moe_act')
  assert good.returncode == 0, good.stderr
  best = load_json(out)
  selective = [b['execution'] for b in best.values()
               if b['execution']['activation_recompute'] == 'selective']
  assert selective and all(e['recompute_modules'] == ['layernorm', 'moe_act']
                           for e in selective)
  assert all('recompute_modules' not in b['execution'] for b in best.values()
             if b['execution']['activation_recompute'] != 'selective')
  exe = tmp_path / 'exe.json'
  exe.write_text(json.dumps(selective[0]))
  one = run_cli('llm', model, exe, system, tmp_path / 'one.json')
  assert one.returncode == 0, one.stderr


def test_best_execution_equals_single_run(readme_search, tmp_path):
  _, out = readme_search
  best = load_json(out)['0']
  exe = tmp_path / 'best_exe.json'
  exe.write_text(json.dumps(best['execution']))
  assert single_run_stats(repo('models', 'turing-530B.json'), exe) == \
    best['stats']


@pytest.mark.parametrize('name', ['b.json.gz', 'b.csv', 'b.csv.gz'])
def test_optimal_execution_formats(tmp_path, name):
  out = tmp_path / name
  res = run_cli('loe', repo('models', 'megatron-5B.json'), 16, 32, 'float16',
                SYS, out, '-t', 4, '-c', 1, '-q')
  assert res.returncode == 0, res.stderr
  if name.endswith('.json.gz'):
    with gzip.open(out, 'rt') as fd:
      data = json.load(fd)
    assert len(data) == 4 and 'execution' in data['3']
    rate = data['0']['stats']['sample_rate']
  else:
    frame = pd.read_csv(out, index_col=0)
    assert list(frame.index) == [0, 1, 2, 3]
    assert frame.columns[0] == 'num_procs'
    assert 'sample_rate' in frame.columns and 'tensor_par' in frame.columns
    rate = frame['sample_rate'].iloc[0]
    assert frame['sample_rate'].is_monotonic_decreasing
  assert rate > 0


def test_debug_counts_only(tmp_path):
  res = run_cli('loe', repo('models', 'gpt3-175B.json'), 1024, 1536,
                'float16', SYS, tmp_path / 'x.json', '-d')
  assert res.returncode == 0
  assert 'Total executions: 11698528' in res.stdout
  assert not (tmp_path / 'x.json').exists()


def test_no_feasible_execution(tmp_path):
  args = ['loe', repo('models', 'megatron-1T.json'), 8, 8, 'float16', SYS,
          tmp_path / 'x.json', '-c', 1]
  res = run_cli(*args)
  assert res.returncode == 1
  assert 'No acceptable configurations found' in res.stdout
  assert run_cli(*args, '-n').returncode == 0


@pytest.mark.parametrize('name', ['all.csv', 'all.csv.gz', 'all.parquet'])
def test_all_executions_formats(tmp_path, name):
  out = tmp_path / name
  res = run_cli('llm-all-executions', repo('models', 'megatron-5B.json'), 4,
                8, 'float16', SYS, out, '-c', 2)
  assert res.returncode == 0, res.stderr
  good = int(next(line for line in res.stdout.splitlines()
                  if line.startswith('Good executions:')).split(':')[1])
  frame = pd.read_parquet(out) if name.endswith('.parquet') else \
    pd.read_csv(out)
  assert len(frame) == good > 0
  assert list(frame.columns[:3]) == ['num_procs', 'tensor_par', 'pipeline_par']
  assert frame.columns[-1] == 'sample_rate'
  assert set(frame['activation_recompute']) <= {'full', 'attn_only', 'none'}
  # Each row is the single-run result of its execution.
  row = frame.iloc[len(frame) // 2]
  exe = {k: (v.item() if hasattr(v, 'item') else v)
         for k, v in row.iloc[:23].items()}
  exe_path = tmp_path / 'exe.json'
  exe_path.write_text(json.dumps(exe))
  stats = single_run_stats(repo('models', 'megatron-5B.json'), exe_path)
  assert stats['sample_rate'] == pytest.approx(row['sample_rate'], rel=1e-12)


def test_bin_script_runs_from_a_checkout(tmp_path):
  env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
  res = subprocess.run([sys.executable, os.path.join(ROOT, 'bin', 'calculon'),
                        'llm', APP, EXE, SYS, '-'], capture_output=True,
                       text=True, env=env, cwd=tmp_path)
  assert res.returncode == 0, res.stderr
  assert 'samples/s' in res.stdout


def test_ctrl_c_writes_the_best_so_far_marked_partial(tmp_path):
  import signal
  import time
  out = tmp_path / 'best.json'
  env = dict(os.environ, PYTHONPATH=ROOT)
  # The child gets Ctrl-C's default disposition, as from a shell: an
  # ignored SIGINT in the test process (inherited across exec) would make
  # Python install no KeyboardInterrupt handler in the child.
  proc = subprocess.Popen(
    [sys.executable, '-m', 'calculon', 'loe', repo('models', 'gpt3-175B.json'),
     '1024', '1536', 'float16', SYS, str(out), '-t', '3', '-c', '1', '-q'],
    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
  time.sleep(2.0)
  proc.send_signal(signal.SIGINT)
  stdout, stderr = proc.communicate(timeout=120)
  assert proc.returncode == 130, stderr
  assert 'partial' in stdout
  best = load_json(out)
  assert list(best) == ['0', '1', '2']
  assert all(entry['partial'] is True for entry in best.values())
  total = int(stdout.split('Total executions: ')[1].split()[0])
  assert 0 < total < 11698528
