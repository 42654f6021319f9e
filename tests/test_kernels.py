"""Measured kernel tables: import from AIConfigurator's layout, the
interpolation, the engine pricing from them, the bundled measured files."""

import json
import os

import numpy as np
import pandas as pd
import pytest

from calculon.config.execution import DATATYPE_NAMES
from calculon.errors import ConfigError
from calculon.hardware import System
from calculon.io import read_json_file
from calculon.kernels import import_kernels
from calculon.kernels.tables import LogGrid, gemm_time_s
from calculon.llm.layers import measured_gemm_time_s
from conftest import repo, run_cli

BF16 = DATATYPE_NAMES.index('bfloat16')
MS = (256, 1024, 2048)
NS = (512, 1024, 2048, 4096)
KS = NS


def _gemm_ms(m, n, k):
  """Synthetic latency (ms): 2 m n k FLOP at 100 TFLOP/s plus 10 us."""
  return 2.0 * m * n * k / 100e12 * 1e3 + 0.01


def _meta(folder, framework, version, table):
  os.makedirs(folder, exist_ok=True)
  with open(os.path.join(folder, 'collection_meta.yaml'), 'w') as f:
    f.write(f'schema_version: 1\nprovenance: collected\nruntime:\n'
            f'  framework: {framework}\n  version: {version}\n'
            f'tables:\n  {table}:\n    status: complete\n')


@pytest.fixture(scope='module')
def aic_dir(tmp_path_factory):
  """A tiny folder of AIConfigurator's layout for GPU 'test_gpu'."""
  root = tmp_path_factory.mktemp('aic')
  data = root / 'aiconfigurator_core' / 'systems' / 'data' / 'test_gpu'
  gemm = data / 'gemm' / 'trtllm' / '1.0.0'
  _meta(gemm, 'trtllm', '1.0.0', 'gemm_perf')
  rows = [dict(framework='TRTLLM', version='1.0.0', device='Test GPU',
               op_name='gemm', kernel_source='torch_flow',
               gemm_dtype='bfloat16', m=m, n=n, k=k, latency=_gemm_ms(m, n, k))
          for m in MS + (257,) for n in NS for k in KS]
  pd.DataFrame(rows).to_parquet(gemm / 'gemm_perf.parquet')
  att = data / 'attention' / 'trtllm' / '1.0.0'
  _meta(att, 'trtllm', '1.0.0', 'context_attention_perf')
  rows = [dict(batch_size=b, isl=s, num_heads=h, num_key_value_heads=h,
               head_dim=d, window_size=0, beam_width=1, attn_dtype='bfloat16',
               kv_cache_dtype='bfloat16', kernel_source='torch_flow',
               latency=2.0 * b * h * s * s * d / 400e12 * 1e3)
          for b in (1, 2) for h in (8, 16) for s in (1024, 4096)
          for d in (64, 128)]
  pd.DataFrame(rows).to_parquet(att / 'context_attention_perf.parquet')
  comm = data / 'comm' / 'nccl' / '2.0'
  _meta(comm, 'nccl', '2.0', 'nccl_perf')
  rows = [dict(op_name=op, nccl_dtype='half', num_gpus=g, message_size=s,
               kernel_source='NCCL', latency=0.01 + 2 * s / 100e9 * 1e3)
          for op in ('all_gather', 'all_reduce') for g in (2, 4, 8)
          for s in (1024, 1 << 20, 1 << 26)]
  pd.DataFrame(rows).to_parquet(comm / 'nccl_perf.parquet')
  return str(root)


def test_log_grid_exact_at_points_and_between():
  grid = LogGrid(([1.0, 4.0],), [1.0, 4.0], (1.0,), (0.0,))
  assert grid(1.0) == pytest.approx(1.0)
  assert grid(4.0) == pytest.approx(4.0)
  # log-log linear between: at 2, 2 exactly; beyond the top, slope 1; below
  # the bottom, held.
  assert grid(2.0) == pytest.approx(2.0)
  assert grid(8.0) == pytest.approx(8.0)
  assert grid(0.5) == pytest.approx(1.0)
  between = grid(np.linspace(1, 4, 50))
  assert np.all(np.diff(between) > 0)


def test_import_section_has_provenance(aic_dir):
  section = import_kernels.measured_section('test_gpu', aic_dir)
  gemm = section['gemm']
  assert (gemm['framework'], gemm['version']) == ('trtllm', '1.0.0')
  assert gemm['collection_meta']['runtime']['framework'] == 'trtllm'
  assert gemm['m'] == list(MS)   # 257 is not a kept m value
  assert gemm['latency_ms']['bfloat16'][
    MS.index(1024)][NS.index(2048)][KS.index(4096)] == pytest.approx(
    _gemm_ms(1024, 2048, 4096), rel=1e-4)
  assert section['source']['gpu'] == 'test_gpu'
  assert section['source']['device'] == 'Test GPU'
  assert section['nccl']['bytes'] == [2048, 2 << 20, 2 << 26]
  assert section['attention']['heads'] == [8, 16, 32]


def test_import_kernels_cli_and_engine(aic_dir, tmp_path):
  out = tmp_path / 'measured.json'
  res = run_cli('import-kernels', 'test_gpu', '--from', aic_dir, '--base',
                repo('systems', 'h100_sxm_80g_datasheet.json'), '-o', out)
  assert res.returncode == 0, res.stdout + res.stderr
  cfg = read_json_file(str(out))
  assert cfg['measured']['gemm']['version'] == '1.0.0'
  assert cfg['matrix'] == read_json_file(
    repo('systems', 'h100_sxm_80g_datasheet.json'))['matrix']
  system = System(cfg)
  # A table point: x (1024, 4096) @ W (2048, 4096)^T; the engine's linear
  # layer (m tokens, n = 4096 inputs, k = 2048 outputs) in the forward.
  want = _gemm_ms(1024, 2048, 4096) * 1e-3
  assert gemm_time_s(system, 1024, 2048, 4096, 'bfloat16') == \
    pytest.approx(want, rel=1e-4)
  assert measured_gemm_time_s(system, BF16, (1024, 4096, 2048, 1), 'fw') \
    == pytest.approx(want, rel=1e-4)
  # Its input gradient is the GEMM (1024, 4096, 2048), its weight gradient
  # (2048, 4096, 1024), both table points.
  assert measured_gemm_time_s(system, BF16, (1024, 4096, 2048, 1), 'agrad') \
    == pytest.approx(_gemm_ms(1024, 4096, 2048) * 1e-3, rel=1e-4)
  assert measured_gemm_time_s(system, BF16, (1024, 4096, 2048, 1), 'wgrad') \
    == pytest.approx(_gemm_ms(2048, 4096, 1024) * 1e-3, rel=1e-4)
  # float16 runs on the bfloat16 table; float32 has none: the curve.
  flops = 2.0 * 1024 * 2048 * 4096
  assert gemm_time_s(system, 1024, 2048, 4096, 'float16') == \
    pytest.approx(want, rel=1e-4)
  assert gemm_time_s(system, 1024, 2048, 4096, 'float32') == \
    system.matrix.time_s(DATATYPE_NAMES.index('float32'), flops) \
    if 'float32' in cfg['matrix'] else True
  # NCCL on tier 0 from the table (4 GPUs, 2 MiB: 0.01 ms + 2 MiB at 100
  # GB/s); tier 1 keeps the network model.
  nets = system.networks
  assert nets.time_s('all_reduce', 2 << 20, 4, 0) == pytest.approx(
    (0.01 + 2 * (1 << 20) / 100e9 * 1e3) * 1e-3, rel=1e-4)
  plain = System(read_json_file(repo('systems',
                                     'h100_sxm_80g_datasheet.json')))
  assert nets.time_s('all_reduce', 2 << 20, 4, 1) == \
    plain.networks.time_s('all_reduce', 2 << 20, 4, 1)
  assert plain.measured is None
  assert plain.matrix.time_s(BF16, flops) == gemm_time_s(
    plain, 1024, 2048, 4096, 'bfloat16')


def test_import_kernels_bad_gpu(aic_dir, tmp_path):
  res = run_cli('import-kernels', 'no_gpu', '--from', aic_dir, '--base',
                repo('systems', 'h100_sxm_80g_datasheet.json'), '-o',
                tmp_path / 'x.json')
  assert res.returncode == 2
  assert 'GPU "no_gpu" has no measurements (allowed: test_gpu)' in \
    res.stdout + res.stderr
  assert not (tmp_path / 'x.json').exists()


def test_measured_section_bad_shape():
  cfg = read_json_file(repo('systems', 'h100_sxm_80g_measured.json'))
  cfg['measured']['gemm']['latency_ms']['bfloat16'] = [[1.0]]
  with pytest.raises(ConfigError, match=r"field 'measured.gemm.latency_ms."
                     r"bfloat16' .* not allowed: nested lists of positive "
                     r'latencies \(ms\) of shape 20 x 22 x 22'):
    System(cfg, 'h100.json')


@pytest.mark.parametrize('name,gpu,bf16_ms,fp8_ms', [
  ('h100_sxm_80g', 'h100_sxm', 1.4048, 0.88491),
  ('gb200_nvl72', 'gb200', 0.78123, 0.48732),
])
def test_bundled_measured_files(name, gpu, bf16_ms, fp8_ms):
  """aiconfigurator-core 0.12.0, systems/data/<gpu>/gemm/trtllm/1.3.0rc20/
  gemm_perf.parquet at m = n = k = 8192 (1.40478 and 0.78123 ms bf16)."""
  path = repo('systems', f'{name}_measured.json')
  cfg = read_json_file(path)
  src = cfg['measured']['source']
  assert (src['package'], src['package_version'], src['gpu']) == (
    'aiconfigurator-core', '0.12.0', gpu)
  for table in ('gemm', 'attention', 'nccl'):
    assert cfg['measured'][table]['collection_meta']['provenance'] == \
      'collected'
  assert cfg['measured']['gemm']['version'] == '1.3.0rc20'
  system = System(cfg, path)
  assert gemm_time_s(system, 8192, 8192, 8192, 'bfloat16') * 1e3 == \
    pytest.approx(bf16_ms, rel=1e-4)
  assert gemm_time_s(system, 8192, 8192, 8192, 'float8') * 1e3 == \
    pytest.approx(fp8_ms, rel=1e-4)
  assert os.path.getsize(path) < 1_000_000


@pytest.mark.parametrize('name', ['h100_sxm_80g', 'gb200_nvl72'])
def test_default_files_carry_the_measured_tables(name):
  """The default files are calibrated from the measured-kernel files
  (validation/make_calibrated.py): the tables and their provenance are
  the twin's, the fit adds only the sustained clock and what the tables
  do not measure; a table GEMM takes the table's time over the clock."""
  from calculon.validation.system_files import is_calibrated
  default = read_json_file(repo('systems', f'{name}.json'))
  twin = read_json_file(repo('systems', f'{name}_measured.json'))
  assert is_calibrated(default)
  for key in ('source', 'gemm', 'attention', 'nccl'):
    assert default['measured'][key] == twin['measured'][key]
  clock = default['measured'].get('sustained_clock', 1.0)
  assert 0.8 <= clock <= 1.0
  t_default = gemm_time_s(System(default), 8192, 8192, 8192, 'bfloat16')
  t_twin = gemm_time_s(System(twin), 8192, 8192, 8192, 'bfloat16')
  assert t_default == pytest.approx(t_twin / clock, rel=1e-9)


def test_a_slower_part_slows_the_measured_tables_as_its_curves():
  """The hardware table's H100 variants below the SXM's clock (PCIe x
  0.7645, NVL x 0.844, the power-capped x 0.922) scale
  measured.sustained_clock as they scale the matrix rates; a file
  without tables is left without a measured section."""
  from calculon.validation.mapping import apply_system_set
  change = {'measured.sustained_clock': {'times': 0.922},
            'matrix.bfloat16.tflops': {'times': 0.922}}
  twin = read_json_file(repo('systems', 'h100_sxm_80g_measured.json'))
  slow = apply_system_set(twin, change)
  assert slow['measured']['sustained_clock'] == pytest.approx(0.922)
  assert gemm_time_s(System(slow), 8192, 8192, 8192, 'bfloat16') == \
    pytest.approx(gemm_time_s(System(twin), 8192, 8192, 8192, 'bfloat16')
                  / 0.922, rel=1e-9)
  sheet = read_json_file(repo('systems', 'h100_sxm_80g_datasheet.json'))
  assert 'measured' not in apply_system_set(sheet, change)


def test_report_names_measured_terms():
  res = run_cli('llm', repo('models', 'llama3.1-405B.json'),
                repo('examples', 'llama3.1-405b_16384_tp8_pp16_dp128.json'),
                repo('systems', 'gb200_nvl72_measured.json'), '-')
  text = res.stdout + res.stderr
  assert res.returncode == 0, text
  assert 'Measured kernels: GEMM (bfloat16, fp8, nvfp4; MXFP8 as fp8 x ' \
    '1.051); attention ' \
    'forward (backward x 2.86); NCCL on tier 0' in text
  assert 'from aiconfigurator-core 0.12.0 gb200 (trtllm 1.3.0rc20)' in text


def test_calibrate_refuses_measured_parameters():
  from calculon.validation.calibrate import parameter_bounds
  cfg = read_json_file(repo('systems', 'h100_sxm_80g_measured.json'))
  with pytest.raises(ConfigError, match="parameter 'matrix' is not allowed: "
                     'the system prices what it scales from its measured '
                     'gemm table'):
    parameter_bounds(cfg, 'matrix')
  assert parameter_bounds(cfg, 'net1')[1] > 1.0


def test_measured_fp8_gemm_less_its_input_cast():
  """The table's fp8 op quantizes its bfloat16 x (M, K) input (amax read,
  2 B/element, then the cast, 2 B read + 1 B written: AIConfigurator's
  compute_scale and scale_matrix, aic-core operators/gemm.rs at 095f58a5);
  a training GEMM's operands arrive cast, so the engine takes them off.
  H100 8192^3: 0.88491 ms in the table; x is 8192 x 8192, so 2 x 67.1 MB
  and 3 x 67.1 MB at most 3.35 TB/s (the datasheet HBM3 bandwidth): at
  least 0.100 ms less.  bfloat16 has no cast (1.4048 ms unchanged)."""
  system = System(read_json_file(repo('systems',
                                      'h100_sxm_80g_measured.json')))
  fp8 = DATATYPE_NAMES.index('float8')
  elems = 8192.0 * 8192
  want = 0.88491e-3 - system.mem1.time_s(2 * elems) - \
    system.mem1.time_s(3 * elems)
  for stage in ('fw', 'agrad', 'wgrad'):
    got = measured_gemm_time_s(system, fp8, (8192, 8192, 8192, 1), stage)
    assert got == pytest.approx(want, rel=1e-4)
  assert 0.88491e-3 - want >= 5 * elems / 3.35e12
  assert measured_gemm_time_s(system, BF16, (8192, 8192, 8192, 1), 'fw') == \
    pytest.approx(1.4048e-3, rel=1e-4)
  # NVFP4 (GB200): a static input scale, the cast only: 2 + 0.5 + 1/16 B.
  gb = System(read_json_file(repo('systems', 'gb200_nvl72_measured.json')))
  fp4 = DATATYPE_NAMES.index('float4')
  table = gemm_time_s(gb, 8192, 8192, 8192, 'float4')
  assert measured_gemm_time_s(gb, fp4, (8192, 8192, 8192, 1), 'fw') == \
    pytest.approx(table - gb.mem1.time_s(2.5625 * elems), rel=1e-4)
  # Never below the GEMM's compute at the datasheet peak.
  tiny = measured_gemm_time_s(system, fp8, (16, 16, 16, 1), 'fw')
  assert tiny >= 2.0 * 16 ** 3 / system.matrix.peak_flops(fp8)


#: Transformer Engine's GEMM benchmark on a B300 (NVIDIA/TransformerEngine
#: docs/examples/gemm_profiling/gemm_profiling.rst at d0067d0da, "Autocast
#: vs Pre-quantized"): per-layer ms of the 12 GEMMs of a layer of hidden
#: 4,096 and feedforward 16,384 at 15,872 tokens, operands pre-quantized
#: (the kernels alone).
TE_B300_LAYER_MS = {'bfloat16': 13.102, 'fp8_current': 6.812,
                    'mxfp8': 7.161, 'nvfp4': 3.764}


def _te_layer_ms(system, code, block_scaled=False):
  """The 12 GEMMs of TE's benchmark layer from ``system``'s tables (ms):
  query/key/value 4,096 -> 12,288, attention output 4,096 -> 4,096, MLP
  up 4,096 -> 16,384, down 16,384 -> 4,096, each forward, activation
  gradient and weight gradient, 15,872 tokens."""
  layers = ((4096, 12288), (4096, 4096), (4096, 16384), (16384, 4096))
  return 1e3 * sum(float(measured_gemm_time_s(
    system, code, (15872, n_in, n_out, 1), stage,
    block_scaled=block_scaled))
    for n_in, n_out in layers for stage in ('fw', 'agrad', 'wgrad'))


def test_mxfp8_gemms_at_the_fp8_table_times_the_measured_ratio():
  """MXFP8 GEMMs are the per-tensor fp8 table's x 7.161 / 6.812 = 1.051
  (TE's B300 kernels, pre-quantized); every Blackwell file carries the
  ratio (measured and calibrated), Hopper's and Ampere's do not (their
  block-scaled FP8 is another kernel)."""
  from calculon.kernels.tables import MXFP8_GEMM_RATIO
  assert MXFP8_GEMM_RATIO == pytest.approx(
    TE_B300_LAYER_MS['mxfp8'] / TE_B300_LAYER_MS['fp8_current'], abs=1e-4)
  for name in ('b200', 'b300', 'gb200_nvl72', 'gb300_nvl72'):
    for suffix in ('_measured', ''):
      cfg = read_json_file(repo('systems', f'{name}{suffix}.json'))
      assert cfg['measured']['block_scaled_gemm_ratio'] == MXFP8_GEMM_RATIO
  for name in ('a100_sxm_80g', 'h100_sxm_80g', 'h200_141g'):
    for suffix in ('_measured', ''):
      cfg = read_json_file(repo('systems', f'{name}{suffix}.json'))
      assert 'block_scaled_gemm_ratio' not in cfg['measured']
  system = System(read_json_file(repo('systems', 'b300_measured.json')))
  fp8 = DATATYPE_NAMES.index('float8')
  gemm = (15872, 4096, 12288, 1)
  per_tensor = measured_gemm_time_s(system, fp8, gemm, 'agrad')
  both = measured_gemm_time_s(system, fp8, gemm, 'agrad',
                              block_scaled=np.array([False, True]))
  assert both == pytest.approx([per_tensor, per_tensor * MXFP8_GEMM_RATIO],
                               rel=1e-9)
  # Only the 8-bit table: NVFP4 and bfloat16 are their own tables.
  for code in (BF16, DATATYPE_NAMES.index('float4')):
    assert measured_gemm_time_s(system, code, gemm, 'fw', block_scaled=True) \
      == measured_gemm_time_s(system, code, gemm, 'fw')


def test_b300_tables_against_transformer_engines_kernels():
  """The B300 tables (TensorRT-LLM 1.3.0rc20's inference Linear, less its
  input cast) against Transformer Engine's own kernels at the same 12
  shapes: FP8 6.66 ms against 6.81 (-2 %), MXFP8 7.00 against 7.16
  (-2 %), NVFP4 4.00 against 3.76 (+6 %), bfloat16 11.83 against 13.10
  (-10 %: the tables' bfloat16 GEMM is faster than TE's cuBLAS one at
  these shapes; docs/accuracy.md, "Measured kernel files")."""
  system = System(read_json_file(repo('systems', 'b300_measured.json')))
  fp8 = DATATYPE_NAMES.index('float8')
  got = {'bfloat16': _te_layer_ms(system, BF16),
         'fp8_current': _te_layer_ms(system, fp8),
         'mxfp8': _te_layer_ms(system, fp8, block_scaled=True),
         'nvfp4': _te_layer_ms(system, DATATYPE_NAMES.index('float4'))}
  rel = {k: got[k] / TE_B300_LAYER_MS[k] - 1 for k in got}
  assert rel['fp8_current'] == pytest.approx(-0.022, abs=0.01)
  assert rel['mxfp8'] == pytest.approx(-0.022, abs=0.01)
  assert rel['nvfp4'] == pytest.approx(0.064, abs=0.01)
  assert rel['bfloat16'] == pytest.approx(-0.097, abs=0.01)


def test_bad_block_scaled_ratio_is_one_line(tmp_path):
  """A ratio outside [0.5, 2] is bad input: one line naming the file, the
  field, the value and what is allowed; exit 2."""
  cfg = read_json_file(repo('systems', 'b300_measured.json'))
  cfg['measured']['block_scaled_gemm_ratio'] = 5
  path = tmp_path / 'bad.json'
  path.write_text(json.dumps(cfg))
  res = run_cli('llm', repo('models', 'llama3.1-405B.json'),
                repo('examples', 'llama3.1-405b_16384_tp8_pp16_dp128.json'),
                path, '-')
  assert res.returncode == 2
  line = res.stderr.strip()
  assert '\n' not in line and 'Traceback' not in line
  assert str(path) in line and 'measured.block_scaled_gemm_ratio' in line
  assert '5' in line and '>= 0.5 and <= 2' in line
