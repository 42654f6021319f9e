"""``calculon profile --measure-kernels``: a measured section timed on this
machine with torch, read by the engine as an imported one (skipped cleanly
when torch is not installed: pip install -e '.[profile]')."""

import json

import numpy as np
import pytest

torch = pytest.importorskip('torch')

from calculon.hardware import System  # noqa: E402
from calculon.io import read_json_file  # noqa: E402
from calculon.kernels.tables import gemm_time_s  # noqa: E402
from calculon.profile.measure_kernels import QUICK  # noqa: E402
from conftest import repo, run_cli  # noqa: E402

#: The datasheet file a user's measurement starts from (the default
#: h100_sxm_80g.json carries AIConfigurator's tables already).
BASE = repo('systems', 'h100_sxm_80g_datasheet.json')
TINY_APP = {'hidden': 64, 'feedforward': 256, 'seq_size': 32,
            'attn_heads': 4, 'attn_size': 16, 'num_blocks': 2}


@pytest.fixture(scope='module')
def measured(tmp_path_factory):
  """(path, result) of one quick CPU measurement on one thread."""
  out = tmp_path_factory.mktemp('kernels') / 'measured.json'
  res = run_cli('profile', '--measure-kernels', '--quick', '--device', 'cpu',
                '--threads', '1', '--system', BASE, '-o', out, timeout=120)
  return out, res


def test_quick_cpu_measurement_is_a_system_with_a_measured_section(measured):
  out, res = measured
  assert res.returncode == 0, res.stdout + res.stderr
  cfg = read_json_file(str(out))
  system = System(cfg, str(out))
  base = read_json_file(BASE)
  # every other field kept from --system
  assert {k: v for k, v in cfg.items() if k not in ('measured', 'notes')} \
    == {k: v for k, v in base.items() if k != 'notes'}
  assert 'calculon profile --measure-kernels' in cfg['notes'][-1]
  src = cfg['measured']['source']
  assert src['built_by'] == 'calculon profile --measure-kernels'
  assert (src['package'], src['package_version']) == ('torch',
                                                      torch.__version__)
  assert src['device'] and src['device_kind'] == 'cpu'
  assert src['timing'] == {'clock': 'time.perf_counter around each call',
                           'warmup': 1, 'repeats': 3, 'statistic': 'median'}
  assert src['skipped']['nccl'] == 'NCCL needs --device cuda'
  assert 'nccl' not in cfg['measured'] and system.measured.has_nccl is False
  gemm = cfg['measured']['gemm']
  assert (gemm['m'], gemm['n'], gemm['k']) == (list(QUICK['m']),
                                               list(QUICK['nk']),
                                               list(QUICK['nk']))
  assert gemm['framework'] == 'calculon profile'
  assert gemm['collection_meta']['torch'] == torch.__version__
  # fp8 measured where torch._scaled_mm runs here, else skipped with why
  assert ('fp8' in gemm['latency_ms']) != ('gemm.fp8' in src['skipped'])
  # on a CPU, never: its _scaled_mm is an emulation, not a float8 kernel
  assert 'emulation' in src['skipped']['gemm.fp8']
  lat = np.asarray(gemm['latency_ms']['bfloat16'])
  assert lat.shape == (4, 3, 3) and np.all(lat > 0)
  # 512 x 1024 x 1024 is 2 x 512 x 1024^2 = 1.07 GFLOP, 1 x 64 x 64 is
  # 8,192 FLOP: 131,072 times the work takes longer, launch bound or not
  assert lat[-1, -1, -1] > 10 * lat[0, 0, 0]
  # read unchanged: the engine's time at a grid point is the table's
  assert gemm_time_s(system, 512, 1024, 1024, 'bfloat16') * 1e3 == \
    pytest.approx(lat[-1, -1, -1], rel=1e-9)
  att = cfg['measured']['attention']
  a = np.asarray(att['latency_ms']['bfloat16'])
  assert (att['head_dim'], att['isl'], att['heads']) == (
    list(QUICK['head_dim']), list(QUICK['isl']), list(QUICK['heads']))
  # 16 heads x 512^2 x 128 against 1 head x 16^2 x 64: 2 h s^2 d FLOP
  # 16,384 times larger
  assert a[-1, -1, -1] > 10 * a[0, 0, 0]
  # the base's fused_attention_efficiency is what the table stands for
  assert att['fused_attention_efficiency'] == base['fused_attention_efficiency']


def test_engine_prices_with_the_measured_file(measured, tmp_path):
  out, res = measured
  assert res.returncode == 0, res.stdout + res.stderr
  exe = read_json_file(repo('examples', '3072_t4_p64_d12_mbs4_full.json'))
  exe.update(num_procs=1, tensor_par=1, pipeline_par=1, data_par=1,
             tensor_par_net=0, pipeline_par_net=0, data_par_net=0,
             batch_size=2, microbatch_size=2, datatype='bfloat16',
             fused_activation=False, activation_recompute='none',
             optimizer_sharding=False, tensor_par_comm_type='ar',
             seq_par_ag_redo=False, data_par_overlap=False)
  (tmp_path / 'exe.json').write_text(json.dumps(exe))
  (tmp_path / 'app.json').write_text(json.dumps(TINY_APP))
  llm = run_cli('llm', tmp_path / 'app.json', tmp_path / 'exe.json', out, '-')
  assert llm.returncode == 0, llm.stdout + llm.stderr
  assert 'Measured kernels: GEMM (bfloat16' in llm.stdout
  assert f'from torch {torch.__version__} (calculon profile' in llm.stdout
  assert 'batch time' in llm.stdout


def test_bad_input_is_one_line_exit_2(tmp_path):
  res = run_cli('profile', '--measure-kernels', '-o', tmp_path / 'x.json')
  assert res.returncode == 2
  assert '--measure-kernels needs --system BASE.json' in res.stderr
  res = run_cli('profile', '--measure-kernels', '--system', BASE, '-o',
                tmp_path / 'no' / 'x.json')
  assert res.returncode == 2
  assert f"folder {tmp_path / 'no'} does not exist" in res.stderr
  res = run_cli('profile', '--measure-kernels', '--system', BASE, '-o', BASE)
  assert res.returncode == 2
  assert '-o is the --system file' in res.stderr
  res = run_cli('profile', '--system', BASE, '-o', tmp_path / 'x.json')
  assert res.returncode == 2
  assert '--system is read only with --measure-kernels' in res.stderr
  assert not (tmp_path / 'x.json').exists()
  assert 'Traceback' not in res.stderr


def test_nccl_table_layout_is_read_by_the_engine():
  """Rows as the ranks return them ([op, nccl-tests bytes, ms]) into the
  importer's layout: gpus x bytes per op; a size missing is held from its
  neighbour along bytes; an op missing at one GPU count is left out (the
  network model prices it).  The engine then times a table point as
  written: 2 GPUs, 4,096 B all-reduce = 0.02 ms."""
  from calculon.profile.measure_kernels import nccl_table
  rows = {2: [['all_reduce', 1024, 0.01], ['all_reduce', 4096, 0.02],
              ['all_gather', 1024, 0.005], ['all_gather', 4096, 0.006]],
          4: [['all_reduce', 1024, 0.015], ['all_reduce', 4096, 0.03],
              ['all_gather', 4096, 0.009]]}
  table = nccl_table(rows, [1024, 4096], {'framework': 'calculon profile'})
  assert (table['gpus'], table['bytes'], table['dtype']) == \
    ([2, 4], [1024, 4096], 'half')
  assert table['latency_ms'] == {
    'all_reduce': [[0.01, 0.02], [0.015, 0.03]],
    # 4 GPUs at 1,024 B not measured: held from 4,096 B
    'all_gather': [[0.005, 0.006], [0.009, 0.009]]}
  cfg = read_json_file(BASE)
  cfg['measured'] = {'nccl': table}
  system = System(cfg, 'nccl-table')
  assert system.measured.has_collective('all_reduce')
  assert not system.measured.has_collective('reduce_scatter')
  assert system.measured.collective_time_s('all_reduce', 4096, 2) * 1e3 == \
    pytest.approx(0.02, rel=1e-9)


def test_options_of_the_other_profile_are_refused(tmp_path):
  res = run_cli('profile', '--measure-kernels', '--procs', '2', '--system',
                BASE, '-o', tmp_path / 'x.json')
  assert res.returncode == 2
  assert '--procs: not an option of --measure-kernels' in res.stderr
  assert not (tmp_path / 'x.json').exists()


def test_blackwell_gpus_get_the_mxfp8_ratio():
  """A Blackwell GPU (compute capability 10: B200, B300, GB200, GB300; 12:
  RTX Blackwell) runs MXFP8, which the profile's per-tensor fp8 table does
  not time: its section carries Transformer Engine's measured 1.051;
  Hopper (9.0) and the CPU do not."""
  from calculon.kernels.tables import MXFP8_GEMM_RATIO
  from calculon.profile.measure_kernels import block_scaled_ratio

  class Cuda:
    def __init__(self, cap):
      self.cap = cap

    def get_device_capability(self, index):
      return self.cap

  class Torch:
    def __init__(self, cap):
      self.cuda = Cuda(cap)

  assert block_scaled_ratio(Torch((10, 0)), 'cuda') == MXFP8_GEMM_RATIO
  assert block_scaled_ratio(Torch((10, 3)), 'cuda') == MXFP8_GEMM_RATIO
  assert block_scaled_ratio(Torch((9, 0)), 'cuda') is None
  assert block_scaled_ratio(Torch((10, 0)), 'cpu') is None
