"""calculon profile: the runner (faults), the fits, the system file, the CLI.

Fault tests inject a crash, a hang or garbage into a benchmark's worker
through the documented hook (CALCULON_PROFILE_INJECT) with short timeouts
and delays; the numpy (no torch) path is tested through the CLI.
"""

import json
import os
import time
import uuid

import psutil
import pytest

from calculon.config.system import SystemConfig
from calculon.profile import build
from calculon.profile.bench_network import bus_factor
from calculon.profile.fit import (
  curve_lookup, efficiency_curve, isotonic_increasing, network_tier,
  theil_sen)
from calculon.profile.runner import (
  BenchSpec, Runner, best_of, injected, parse_result)
from conftest import load_json, repo, run_cli

TINY_COPY = {'backend': 'numpy', 'device': 'cpu', 'sizes': [65536],
             'min_time_s': 0.005, 'threads': 1}


# -- result protocol ------------------------------------------------------------

def test_parse_result_takes_the_last_result_line():
  out = ('noise\nCALCULON_RESULT {"points": [{"key": "a", "value": 1}]}\n'
         'CALCULON_RESULT {"points": [{"key": "a", "value": 2.5}]}\n')
  assert parse_result(out)['points'][0]['value'] == 2.5


@pytest.mark.parametrize('text, why', [
  ('OP:gemm,TIME:1.0,WS:0', 'no CALCULON_RESULT'),
  ('CALCULON_RESULT {"points": [', 'not valid JSON'),
  ('CALCULON_RESULT {"points": []}', 'no points'),
  ('CALCULON_RESULT {"points": [{"key": "a", "value": "fast"}]}',
   'invalid point'),
  ('CALCULON_RESULT {"points": [{"key": "a", "value": -1}]}', 'invalid point'),
  ('CALCULON_RESULT {"points": [{"key": "a", "value": NaN}]}',
   'invalid point'),
])
def test_parse_result_rejects_garbage(text, why):
  with pytest.raises(ValueError, match=why):
    parse_result(text)


def test_best_of_keeps_the_largest_value_per_key():
  runs = [{'points': [{'key': 'a', 'value': 1.0}, {'key': 'b', 'value': 5.0}]},
          {'points': [{'key': 'a', 'value': 3.0}, {'key': 'b', 'value': 4.0}]}]
  best = best_of(runs)
  assert [p['value'] for p in best['points']] == [3.0, 5.0]
  assert best['runs'] == 2


def test_injection_hook_matches_names_and_prefixes():
  assert injected('matrix.float32', 'matrix=crash') == 'crash'
  assert injected('mem1', 'matrix=crash,mem1=hang') == 'hang'
  assert injected('matrix.float32', 'mem1=hang') is None
  assert injected('matrixx', 'matrix=crash') is None
  with pytest.raises(ValueError, match='explode'):
    injected('mem1', 'mem1=explode')


# -- runner fault tests -----------------------------------------------------------

def _runner(inject, **kw):
  kw.setdefault('retry_delay_s', 0.05)
  kw.setdefault('repeats', 1)
  return Runner(env={'CALCULON_PROFILE_INJECT': inject}, **kw)


def test_crashing_benchmark_is_retried_three_times_then_reported():
  spec = BenchSpec('mem1', 'memcopy', TINY_COPY, timeout_s=30)
  start = time.perf_counter()
  out = _runner('mem1=crash', retry_delay_s=0.2).run(spec)
  assert not out.ok and out.best is None
  assert [a.status for a in out.attempts] == ['exit'] * 3
  assert [a.rc for a in out.attempts] == [3] * 3
  assert 'exit status 3' in out.error and 'injected crash' in out.error
  assert time.perf_counter() - start >= 2 * 0.2   # the delay between tries


def test_hung_benchmark_is_killed_with_its_group_and_retried():
  name = f'mem1.hang{uuid.uuid4().hex[:8]}'
  spec = BenchSpec(name, 'memcopy', TINY_COPY, timeout_s=0.6)
  out = _runner(f'{name}=hang').run(spec)
  assert not out.ok
  assert [a.status for a in out.attempts] == ['timeout'] * 3
  assert out.error == 'timed out after 0.6 s'
  assert all(a.wall_s < 5 for a in out.attempts)
  left = [p for p in psutil.process_iter(['cmdline'])
          if name in ' '.join(p.info['cmdline'] or [])]
  assert left == []


def test_garbage_output_is_a_parse_failure_and_retried():
  spec = BenchSpec('mem1', 'memcopy', TINY_COPY, timeout_s=30)
  out = _runner('mem1=garbage').run(spec)
  assert not out.ok
  assert [a.status for a in out.attempts] == ['parse'] * 3
  assert 'not valid JSON' in out.error


def test_flaky_benchmark_succeeds_on_its_second_try_and_keeps_the_best():
  spec = BenchSpec('mem1', 'memcopy', TINY_COPY, timeout_s=30)
  out = _runner('mem1=flaky', repeats=2).run(spec)
  assert out.ok
  assert [a.status for a in out.attempts] == ['exit', 'ok', 'exit', 'ok']
  assert len(out.runs) == 2
  best = out.best['points'][0]['value']
  assert best == max(r['points'][0]['value'] for r in out.runs)


# -- fits ---------------------------------------------------------------------------

def test_isotonic_pools_adjacent_violators():
  # Barlow et al. 1972's textbook case: (1, 3, 2, 4) -> (1, 2.5, 2.5, 4).
  assert isotonic_increasing([1, 3, 2, 4]) == [1, 2.5, 2.5, 4]
  assert isotonic_increasing([3, 2, 1]) == [2, 2, 2]


def test_efficiency_curve_is_in_the_system_file_format():
  flops = [1e7, 1e8, 1e9, 1e10]
  rate = [10e9, 40e9, 90e9, 80e9]    # a dip at the largest size
  curve = efficiency_curve(flops, rate, 100e9, 1e9)
  thresholds = [t for t, _ in curve]
  assert thresholds[-1] == 0 and thresholds == sorted(thresholds,
                                                      reverse=True)
  assert len(set(thresholds)) == len(thresholds)
  assert all(0 < e <= 1 for _, e in curve)
  # non-decreasing in size: the 0.9 / 0.8 dip is pooled to 0.85
  assert curve_lookup(curve, 1e10, 1e9) == pytest.approx(0.85)
  assert curve_lookup(curve, 2e9, 1e9) == pytest.approx(0.85)
  assert curve_lookup(curve, 1e8, 1e9) == pytest.approx(0.4)
  assert curve_lookup(curve, 1, 1e9) == pytest.approx(0.1)
  mem = efficiency_curve([1e5, 1e7], [50e9, 20e9], 50e9, 1e6, monotone=False)
  assert mem == [[10, 0.4], [0, 1.0]]     # caches: smaller copies faster


def test_theil_sen_ignores_an_outlier():
  x = [1, 2, 3, 4, 5, 6]
  y = [3 + 2 * v for v in x]
  y[4] = 100
  a, b = theil_sen(x, y)
  assert (a, b) == pytest.approx((3, 2))


def test_bus_factors_are_nccl_tests():
  # nccl-tests doc/PERFORMANCE.md: allreduce 2(n-1)/n, allgather and
  # reducescatter (n-1)/n, sendrecv 1; for n = 8: 1.75 and 0.875.
  assert bus_factor('all_reduce', 8) == 1.75
  assert bus_factor('all_gather', 8) == 0.875
  assert bus_factor('reduce_scatter', 8) == 0.875
  assert bus_factor('all_to_all', 8) == 0.875
  assert bus_factor('p2p', 8) == 1.0


def test_network_tier_recovers_latency_bandwidth_and_op_scalars():
  # Synthetic ring timings, t = L + S f / B_op with L = 20 us, n = 4;
  # all-gather reaches only half the all-reduce bus bandwidth.
  n, lat = 4, 20e-6
  bw = {'all_reduce': 100e9, 'reduce_scatter': 100e9, 'all_gather': 50e9,
        'p2p': 100e9}
  pts = []
  for op, b in bw.items():
    for s in [2 ** e for e in range(12, 30, 2)]:
      t = lat + s * bus_factor(op, n) / b
      pts.append({'op': op, 'bytes': s, 'seconds': t,
                  'busbw': s / t * bus_factor(op, n)})
  fit = network_tier(pts, n)
  assert fit['latency_s'] == pytest.approx(lat, rel=1e-6)
  assert fit['bandwidth_Bps'] == pytest.approx(100e9, rel=0.01)
  assert fit['efficiency'] == pytest.approx(1.0, rel=0.01)
  assert fit['ops']['all_reduce'] == [2.0, -1.0]
  assert fit['ops']['all_gather'][0] == pytest.approx(2.0, rel=0.02)
  assert fit['ops']['reduce_scatter'][0] == pytest.approx(1.0, rel=0.02)
  assert fit['ops']['p2p'][1] is None


def test_failed_benchmarks_leave_documented_defaults_and_a_valid_file():
  system, defaults, _ = build.system_from_outcomes(
    {}, 'cpu', 2, ['float32'], 8.0, 0)
  SystemConfig.from_dict(system, '<test>')
  assert defaults == ['matrix.float32', 'vector.float32', 'mem1',
                      'networks[0]']
  d = build.DEFAULTS['cpu']
  assert system['matrix']['float32']['tflops'] == d['matrix_tflops']
  assert system['mem1']['GBps'] == d['mem1_GBps']
  assert system['networks'][0]['size'] == 2
  assert system['processing_mode'] == 'roofline'


# -- the command ---------------------------------------------------------------------

def test_profile_numpy_fallback_with_faults_completes(tmp_path):
  """numpy + multiprocessing path; vector crashes, mem1 prints garbage:
  each retried 3 times, reported, left at the defaults; GEMMs and the
  collectives (numpy over pipes) measured; the file is valid and calculon
  llm accepts it."""
  out = tmp_path / 'cpu.json'
  report = tmp_path / 'report'
  env_inject = 'vector=crash,mem1=garbage'
  old = os.environ.get('CALCULON_PROFILE_INJECT')
  os.environ['CALCULON_PROFILE_INJECT'] = env_inject
  try:
    res = run_cli('profile', '--quick', '--backend', 'numpy', '--procs', '2',
                  '--retry-delay', '0.05', '--clock', 'cpu', '-o', out,
                  '--report', report)
  finally:
    if old is None:
      os.environ.pop('CALCULON_PROFILE_INJECT')
    else:
      os.environ['CALCULON_PROFILE_INJECT'] = old
  assert res.returncode == 0, res.stderr
  text = res.stdout
  assert 'backend numpy (numpy BLAS + multiprocessing instead of torch)' \
    in text and 'CPU-time clock' in text
  assert 'vector.float32   FAILED      0     3  DEFAULT: exit status 3' in text
  assert 'mem1             FAILED      0     3  DEFAULT: CALCULON_RESULT is ' \
    'not valid JSON' in text
  assert 'network          ok          1     1' in text
  # nccl-tests table: among 2 ranks the all-reduce factor is 2(n-1)/n = 1
  assert 'all_reduce' in text and 'all_gather' in text and 'p2p' in text
  assert 'Left at documented defaults' in text
  system = load_json(out)
  SystemConfig.from_dict(system, str(out))
  assert system['vector']['float32']['tflops'] == \
    build.DEFAULTS['cpu']['vector_tflops']
  assert system['matrix']['float32']['tflops'] != \
    build.DEFAULTS['cpu']['matrix_tflops']
  prof = load_json(report / 'profile.json')
  assert set(prof['defaults']) == {'vector.float32', 'mem1'}
  net = [b for b in prof['benchmarks'] if b['name'] == 'network'][0]
  for p in net['best']['points']:
    factor = {'all_reduce': 1.0, 'p2p': 1.0}.get(p['op'], 0.5)
    assert p['busbw'] == pytest.approx(p['bytes'] / p['seconds'] * factor)
  assert system['networks'][0]['size'] == 2
  assert system['mem1']['GBps'] == build.DEFAULTS['cpu']['mem1_GBps']
  assert prof['meta']['backend'] == 'numpy'
  assert prof['meta']['clock'] == 'cpu'
  matrix = [b for b in prof['benchmarks'] if b['name'] == 'matrix.float32']
  # --procs 2 on a CPU: a second copy computed beside the measured one
  assert matrix[0]['best']['info']['concurrent_copies'] == 2
  for name in ('profile.md', 'matrix.float32.csv', 'network.csv',
               'curves.png', 'system.json'):
    assert (report / name).exists(), name
  llm = run_cli('llm', _app(tmp_path), _exe(tmp_path, dp=2), out, '-')
  assert llm.returncode == 0, llm.stdout + llm.stderr
  assert 'batch time' in llm.stdout


TINY_APP = {'hidden': 64, 'feedforward': 256, 'seq_size': 32,
            'attn_heads': 4, 'attn_size': 16, 'num_blocks': 2}


def _app(tmp_path):
  path = tmp_path / 'tiny_app.json'
  path.write_text(json.dumps(TINY_APP))
  return path


def _exe(tmp_path, dp=1, **kw):
  exe = load_json(repo('examples', '3072_t4_p64_d12_mbs4_full.json'))
  exe.update(num_procs=dp, tensor_par=1, pipeline_par=1, data_par=dp,
             tensor_par_net=0, pipeline_par_net=0, data_par_net=0,
             batch_size=2 * dp, microbatch_size=2, datatype='float32',
             fused_activation=False, activation_recompute='none',
             optimizer_sharding=False, tensor_par_comm_type='ar',
             seq_par_ag_redo=False, data_par_overlap=False)
  exe.update(kw)
  path = tmp_path / f'exe_{uuid.uuid4().hex[:6]}.json'
  path.write_text(json.dumps(exe))
  return path


def test_profile_checks_outputs_before_work(tmp_path):
  res = run_cli('profile', '--quick', '-o', tmp_path / 'no' / 'x.json')
  assert res.returncode == 2
  assert 'does not exist' in res.stderr
  res = run_cli('profile', '--quick', '-o', tmp_path / 'x.txt')
  assert res.returncode == 2 and 'must be *.json' in res.stderr
  (tmp_path / 'file').write_text('')
  res = run_cli('profile', '--quick', '--report', tmp_path / 'file')
  assert res.returncode == 2 and 'is a file, not a folder' in res.stderr


def test_profile_cuda_without_a_gpu_is_bad_input():
  res = run_cli('profile', '--quick', '--device', 'cuda')
  assert res.returncode == 2
  assert ('torch sees no CUDA device' in res.stderr or
          'needs torch' in res.stderr), res.stderr
  res = run_cli('profile', '--device', 'cuda', '--backend', 'numpy')
  assert res.returncode == 2 and 'needs --backend torch' in res.stderr


def test_gpu_loss_benchmark_refuses_without_a_device_or_with_bad_shapes():
  """benchmarks/gpu_loss_memory.py (the measurement behind
  cross_entropy_kernel 'eager') exits 2 with one line naming the problem:
  a malformed --shapes, and here, where no CUDA device is present, the
  missing device (or torch)."""
  import subprocess
  import sys
  script = repo('benchmarks', 'gpu_loss_memory.py')
  bad = subprocess.run([sys.executable, script, '--shapes', '2x3'],
                       capture_output=True, text=True, timeout=120)
  assert bad.returncode == 2
  assert bad.stderr.strip() == ('gpu_loss_memory.py: --shapes: 2x3 is not '
                                'BxSxV with positive integers')
  # The --json output is checked before anything runs.
  out = subprocess.run([sys.executable, script, '--json', 'numbers.txt'],
                       capture_output=True, text=True, timeout=120)
  assert out.returncode == 2
  assert out.stderr.strip() == ('gpu_loss_memory.py: --json numbers.txt: '
                                'unsupported extension: output must be '
                                '*.json or *.json.gz')
  _refuses_without_a_device(script, 'gpu_loss_memory.py')


def test_tp_chunk_gemm_benchmark_prices_te_chunks_and_refuses_bad_input():
  """benchmarks/gpu_tp_chunk_gemms.py (the one-GPU half of the TP-overlap
  lead) takes its chunk counts from the engine, which follow Transformer
  Engine's default userbuffers split (pytorch/module/base.py initialize_ub
  at d0067d0da): TP chunks for the ring-exchange all-gather GEMMs, 4 for
  the pipelined reduce-scatter ones; it prices them without a device
  (--model-only) and refuses a bad option, or a missing device, in one
  line."""
  import importlib.util
  import subprocess
  import sys
  script = repo('benchmarks', 'gpu_tp_chunk_gemms.py')
  spec = importlib.util.spec_from_file_location('gpu_tp_chunk_gemms', script)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  counts = {name.split(' (')[0]: (m, k, n, c)
            for name, m, k, n, c in mod.chunk_gemms(8, 4096)}
  assert counts == {
    # Llama 3 70B per TP-8 rank: q 8192 + k, v 1024 each; gated 28672.
    'qkv fprop': (4096, 8192, 1280, 8), 'proj fprop': (4096, 1024, 8192, 4),
    'fc1 fprop': (4096, 8192, 7168, 8), 'fc2 fprop': (4096, 3584, 8192, 4),
    'proj dgrad': (4096, 8192, 1024, 8), 'fc2 dgrad': (4096, 8192, 3584, 8)}
  priced = subprocess.run(
    [sys.executable, script, '--model-only', '--tp', '4', '--dtypes',
     'float8'], capture_output=True, text=True, timeout=120)
  assert priced.returncode == 0, priced.stderr
  lines = [x for x in priced.stdout.splitlines() if x.startswith('| qkv')]
  assert lines and '| 4096 x 8192 x 2560 | 4 |' in lines[0]
  for args, message in (
      (['--tp', '3'], '--tp 3: must divide the 8 key/value heads and split '
       '--tokens 4096 in 4 equal chunks'),
      (['--dtypes', 'fp16'], '--dtypes: fp16 is not one of bfloat16, float8'),
      (['--system', 'nope.json'], '--system nope.json: no such file'),
      (['--json', 'numbers.txt'], '--json numbers.txt: unsupported '
       'extension: output must be *.json or *.json.gz')):
    bad = subprocess.run([sys.executable, script, '--model-only', *args],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2
    assert bad.stderr.strip() == f'gpu_tp_chunk_gemms.py: {message}'
  _refuses_without_a_device(script, 'gpu_tp_chunk_gemms.py')


def _refuses_without_a_device(script, prog):
  """Where no CUDA device is present, ``script`` exits 2 with one line
  naming the missing device (or torch); skips the test on a GPU."""
  import subprocess
  import sys
  try:
    import torch
    has_cuda = torch.cuda.is_available()
  except ImportError:
    has_cuda = False
  if has_cuda:
    pytest.skip('a CUDA device is present')
  none = subprocess.run([sys.executable, script], capture_output=True,
                        text=True, timeout=300)
  assert none.returncode == 2
  assert none.stderr.strip() in (f'{prog}: no CUDA device',
                                 f'{prog}: torch is not installed'), \
    none.stderr
