"""The torch paths of calculon profile and calculon profile-step (skipped
cleanly when torch is not installed: pip install -e '.[profile]')."""

import csv
import json
import time

import pytest

torch = pytest.importorskip('torch')

from calculon.config.system import SystemConfig  # noqa: E402
from calculon.hardware import System  # noqa: E402
from calculon.llm import Llm  # noqa: E402
from calculon.profile import bench_compute, bench_memory, bench_network  # noqa
from calculon.profile import build  # noqa: E402
from calculon.profile.layer_names import GEMM_LAYERS, LAYERS  # noqa: E402
from calculon.profile.step_report import ATTN_ONLY_RECOMPUTED  # noqa: E402
from conftest import assert_png, load_json, run_cli  # noqa: E402
from test_profile import _app, _exe, TINY_APP  # noqa: E402


def test_torch_gemm_vector_and_copy_count_flop_and_bytes():
  g = bench_compute.gemm('torch', 'cpu', 'float32',
                         [[1, 16, 24, 8], [3, 8, 8, 8]], min_time_s=0.001)
  # 2 b m n k FLOP per GEMM (one multiply and one add per term)
  assert [p['flops'] for p in g['points']] == [2 * 16 * 24 * 8,
                                               2 * 3 * 8 * 8 * 8]
  for p in g['points']:
    assert p['value'] == pytest.approx(p['flops'] / p['seconds'])
  v = bench_compute.vector('torch', 'cpu', 'float32', [1024],
                           min_time_s=0.001)
  flops = {p['op']: p['flops'] for p in v['points']}
  # calculon/llm/layers.py: LayerNorm 9, SoftMax 5, GeLU 8, DropOut 1,
  # ElementWise 1 FLOP per element
  assert flops == {'layernorm': 9 * 1024, 'softmax': 5 * 1024,
                   'gelu': 8 * 1024, 'dropout': 1024, 'add': 1024}
  m = bench_memory.memcopy('torch', 'cpu', [4096], min_time_s=0.001)
  p = m['points'][0]
  assert p['bytes_moved'] == 2 * 4096    # STREAM copy: read + write
  with pytest.raises(ValueError, match='cuda'):
    bench_memory.host_device('torch', 'cpu', [4096])


def test_gemm_memory_of_a_shape_and_16_bit_draws():
  """A GEMM shape's operands and output in bytes (the CUDA path skips a
  shape over half the free memory: 16 heads of 32k x 32k scores in
  bfloat16 need 32 GiB of output alone); 16-bit operands are drawn in
  their datatype, not drawn in float32 and converted (twice the memory:
  the first H100 run ran out of memory so, docs/profile.md)."""
  assert bench_compute._gemm_bytes('bfloat16', 16, 32768, 32768, 128) == \
    (16 * (32768 * 128 * 2) + 16 * 32768 * 32768) * 2
  assert bench_compute._gemm_bytes('float32', 1, 4, 5, 6) == \
    (4 * 6 + 6 * 5 + 4 * 5) * 4
  # float8: e4m3 inputs made from bfloat16 ones, bfloat16 output
  assert bench_compute._gemm_bytes('float8', 2, 4, 5, 6) == \
    2 * (4 * 6 + 6 * 5) * 3 + 2 * 4 * 5 * 2
  gen = torch.Generator(device='cpu').manual_seed(0)
  fn = bench_compute._torch_gemm(torch, 'cpu', 'bfloat16', 2, 16, 8, 8, gen)
  assert fn().dtype == torch.bfloat16
  assert fn().shape == (2, 16, 8)


def test_gloo_collectives_report_nccl_tests_bandwidths():
  res = bench_network.collectives('torch', 'cpu', 2, [4096, 65536],
                                  ops=['all_reduce', 'reduce_scatter', 'p2p'],
                                  min_time_s=0.001)
  assert res['info']['transport'] == 'gloo'
  ops = {(p['op'], p['bytes']): p for p in res['points']}
  assert set(ops) == {(o, s) for o in ('all_reduce', 'reduce_scatter', 'p2p')
                      for s in (4096, 65536)}
  for p in res['points']:
    assert p['algbw'] == pytest.approx(p['bytes'] / p['seconds'])
    # n = 2: all-reduce 2(n-1)/n = 1, reduce-scatter (n-1)/n = 1/2, p2p 1
    assert p['bus_factor'] == {'all_reduce': 1, 'reduce_scatter': 0.5,
                               'p2p': 1}[p['op']]
  assert ops[('reduce_scatter', 4096)]['emulated']   # gloo: via all-reduce


def _system(tmp_path, dp):
  system, _, _ = build.system_from_outcomes({}, 'cpu', dp, ['float32'], 8.0,
                                            0)
  SystemConfig.from_dict(system)
  path = tmp_path / 'sys.json'
  path.write_text(json.dumps(system))
  return path, system


def test_profile_step_dp2_attn_only_per_layer_against_the_api(tmp_path):
  """Two DP ranks over gloo, attn_only recomputation, the report; the
  prediction printed is the public API's, layer by layer."""
  sys_path, system = _system(tmp_path, 2)
  exe_path = _exe(tmp_path, dp=2, activation_recompute='attn_only')
  report = tmp_path / 'report'
  res = run_cli('profile-step', _app(tmp_path), exe_path, sys_path,
                '--steps', '2', '--report', report, '-q')
  assert res.returncode == 0, res.stdout + res.stderr
  out = res.stdout
  for section in ('speed', 'time per phase', 'time per layer', 'memory',
                  'system', 'model summary'):
    assert f'== {section}' in out
  assert 'DP 2 on cpu (1 threads per rank)' in out and 'torch 2.' in out
  line = [ln for ln in out.splitlines() if ln.startswith('DP communication')]
  assert float(line[0].split()[3]) > 0          # measured all-reduce time
  times = [ln for ln in out.splitlines() if 'per-rank step' in ln][0]
  assert times.split('per-rank step times (s):')[1].count(';') == 1
  with open(report / 'layers.csv') as fd:
    rows = {r['layer']: r for r in csv.DictReader(fd)}
  assert list(rows) == list(LAYERS)
  for name in GEMM_LAYERS:
    assert float(rows[name]['meas_fw_s']) > 0
    assert float(rows[name]['meas_bw_s']) > 0
  # Only calculon's attn_only layers were recomputed in the backward (torch
  # stops a recomputation once the tensors it needs are back, so maybe not
  # all of them), and the scores GEMM always is.
  redone = {n for n, r in rows.items() if r['meas_recompute_s']}
  assert 'AttnBlock_Multihead_Key_Query' in redone
  assert redone <= set(ATTN_ONLY_RECOMPUTED)
  model = Llm(Llm.Application(TINY_APP))
  sysm = System(system)
  model.compile(sysm, Llm.Execution.from_json(load_json(exe_path)))
  model.run(sysm)
  stats = model.get_stats_json(include_layers=True)
  for layer in stats['layers']:
    if layer['name'] in rows:
      assert float(rows[layer['name']]['pred_fw_s']) == pytest.approx(
        layer['fw_processing_time'])
  assert f"predicted {stats['total_time']:.4f} s" in out
  assert (report / 'step.md').read_text().count('torch.profiler') >= 2
  assert (report / 'trace.json').exists()
  assert_png(report / 'layers.png')


def test_profile_step_refuses_what_it_cannot_run(tmp_path):
  sys_path, _ = _system(tmp_path, 2)
  res = run_cli('profile-step', _app(tmp_path),
                _exe(tmp_path, dp=1, num_procs=2, tensor_par=2), sys_path)
  assert res.returncode == 2
  assert "field 'tensor_par': value 2 cannot be run by profile-step" in \
    res.stderr
  res = run_cli('profile-step', _app(tmp_path), _exe(tmp_path), sys_path,
                '--device', 'cuda')
  assert res.returncode == 2 and 'no CUDA device' in res.stderr


def test_profile_step_kills_ranks_past_the_step_timeout(tmp_path):
  sys_path, _ = _system(tmp_path, 1)
  start = time.perf_counter()
  res = run_cli('profile-step', _app(tmp_path), _exe(tmp_path), sys_path,
                '--step-timeout', '0.5')
  assert res.returncode == 1, res.stdout + res.stderr
  assert 'ERROR: the training ranks did not finish within 0.5 s' in \
    res.stdout
  assert 'Traceback' not in res.stderr
  assert time.perf_counter() - start < 30

