"""Bundled system files (systems/*.json): they load, the datasheet files'
peaks are the vendors' dense datasheet numbers, their large-GEMM efficiency
is the cited measurement, `calculon llm` prices a modern model on each,
and each GPU's default file is the calibrated one where a calibration
exists (its datasheet-only twin systems/X_datasheet.json), Calculon's own
files untouched."""

import glob
import hashlib
import json
import os

import pytest

from calculon.cli.main import main
from calculon.config.system import SystemConfig
from calculon.validation.system_files import datasheet_path, is_calibrated
from conftest import ROOT, load_json, repo, run_cli

SYSTEMS = sorted(glob.glob(repo('systems', '*.json')))

# Dense (no sparsity) peak TFLOP/s per GPU, as the datasheets give them.
# NVIDIA prints sparse numbers for tensor cores: dense is half.
DATASHEET_TFLOPS = {
  # NVIDIA A100 datasheet: BF16/FP16 Tensor Core 312 (624 with sparsity).
  'a100_40g': {'bfloat16': 312, 'float16': 312},
  'a100_sxm_80g': {'bfloat16': 312, 'float16': 312},
  # NVIDIA H100 datasheet, H100 SXM: BF16/FP16 1,979, FP8 3,958 with
  # sparsity.
  'h100_sxm_80g': {'bfloat16': 1979 / 2, 'float16': 1979 / 2,
                   'float8': 3958 / 2},
  # NVIDIA H200 datasheet, H200 SXM: same as H100 SXM.
  'h200_141g': {'bfloat16': 1979 / 2, 'float16': 1979 / 2,
                'float8': 3958 / 2},
  # NVIDIA DGX/HGX B200, 8 GPUs: FP16/BF16 36 PF and FP8 72 PF with
  # sparsity; FP4 72 PF dense (144 with sparsity).
  'b200': {'bfloat16': 36e3 / 8 / 2, 'float16': 36e3 / 8 / 2,
           'float8': 72e3 / 8 / 2, 'float4': 72e3 / 8},
  # NVIDIA DGX/HGX B300, 8 GPUs: FP16/BF16 36 PF and FP8 72 PF with
  # sparsity; FP4 108 PF dense (144 with sparsity).
  'b300': {'bfloat16': 36e3 / 8 / 2, 'float16': 36e3 / 8 / 2,
           'float8': 72e3 / 8 / 2, 'float4': 108e3 / 8},
  # NVIDIA GB200 NVL72, 72 GPUs: FP16/BF16 360 PF, FP8 720 PF, FP4
  # 1,440 PF, all with sparsity.
  'gb200_nvl72': {'bfloat16': 360e3 / 72 / 2, 'float16': 360e3 / 72 / 2,
                  'float8': 720e3 / 72 / 2, 'float4': 1440e3 / 72 / 2},
  # NVIDIA GB300 NVL72, 72 GPUs: FP16/BF16 360 PF and FP8 720 PF with
  # sparsity; FP4 1,080 PF dense (1,440 with sparsity).
  'gb300_nvl72': {'bfloat16': 360e3 / 72 / 2, 'float16': 360e3 / 72 / 2,
                  'float8': 720e3 / 72 / 2, 'float4': 1080e3 / 72},
  # AMD Instinct MI300X: FP16/BF16 1,307.4, FP8 2,614.9 (dense).
  'mi300x': {'bfloat16': 1307.4, 'float16': 1307.4, 'float8': 2614.9},
  # AMD Instinct MI325X: the MI300X's compute (dense).
  'mi325x': {'bfloat16': 1307.4, 'float16': 1307.4, 'float8': 2614.9},
  # AMD Instinct MI355X: FP16/BF16 2.5 PF, FP8 5 PF, MXFP4 10.1 PF (dense).
  'mi355x': {'bfloat16': 2500, 'float16': 2500, 'float8': 5000,
             'float4': 10100},
}
NEW = sorted(DATASHEET_TFLOPS)

# Maximum achievable matmul TFLOP/s (BF16, FP8) measured by mamf-finder.py,
# github.com/stas00/ml-engineering compute/accelerator/README.md.
MEASURED_GEMM = {
  'a100_40g': {'bfloat16': 271.2},
  'a100_sxm_80g': {'bfloat16': 271.2},
  'h100_sxm_80g': {'bfloat16': 794.5, 'float8': 1402.6},
  'h200_141g': {'bfloat16': 794.5, 'float8': 1453.4},
  'b200': {'bfloat16': 1745.0, 'float8': 3432.5},
  'b300': {'bfloat16': 1769.0, 'float8': 3353.3},
  'gb200_nvl72': {'bfloat16': 1822.0, 'float8': 3615.6},
  'mi300x': {'bfloat16': 668.4},
  'mi355x': {'bfloat16': 1565.0},
}

# HBM per GPU (datasheets): GB and TB/s.
HBM = {'a100_40g': (40, 1555), 'a100_sxm_80g': (80, 2039),
       'h100_sxm_80g': (80, 3350),
       'h200_141g': (141, 4800), 'b200': (180, 8000), 'b300': (288, 8000),
       'gb200_nvl72': (186, 8000), 'gb300_nvl72': (288, 8000),
       'mi300x': (192, 5300), 'mi325x': (256, 6000), 'mi355x': (288, 8000)}

# Scale-up domain and its per-direction bandwidth per GPU (GB/s): NVLink3
# 600, NVLink4 900, NVLink5 1,800 GB/s bidirectional; Infinity Fabric 7
# links of 128 (MI300X) or 153 (MI355X) GB/s bidirectional.
SCALE_UP = {'a100_40g': (8, 300), 'a100_sxm_80g': (8, 300),
            'h100_sxm_80g': (8, 450),
            'h200_141g': (8, 450), 'b200': (8, 900), 'b300': (8, 900),
            'gb200_nvl72': (72, 900), 'gb300_nvl72': (72, 900),
            'mi300x': (8, 448), 'mi325x': (8, 448), 'mi355x': (8, 535.5)}
# Scale-out per GPU (GB/s): 200 Gb/s HDR, 400 Gb/s ConnectX-7 / Pollara,
# 800 Gb/s ConnectX-8.
SCALE_OUT = {'a100_40g': 25, 'a100_sxm_80g': 25, 'h100_sxm_80g': 50, 'h200_141g': 50,
             'b200': 50, 'b300': 100, 'gb200_nvl72': 50, 'gb300_nvl72': 100,
             'mi300x': 50, 'mi325x': 50, 'mi355x': 50}


def datasheet(name):
  """The JSON of GPU ``name``'s datasheet file (systems/NAME_datasheet.json
  where the default systems/NAME.json is calibrated)."""
  return load_json(datasheet_path(ROOT, name))


def system(name):
  return SystemConfig.from_dict(datasheet(name), name)


def test_every_bundled_system_loads():
  names = [os.path.basename(s)[:-5] for s in SYSTEMS]
  assert set(NEW) <= set(names)
  for path in SYSTEMS:
    SystemConfig.from_dict(load_json(path), path)


@pytest.mark.parametrize('name', NEW)
def test_new_system_describes_itself(name):
  for doc in (load_json(repo('systems', name + '.json')), datasheet(name)):
    assert doc['name'] and doc['source'] and doc['notes']


# The defaults calibrated to measured runs (validation/make_calibrated.py)
# and the datasheet-only files they were fitted from.
CALIBRATED = ('a100_sxm_80g', 'h100_sxm_80g', 'h200_141g', 'b200', 'b300',
              'gb200_nvl72', 'gb300_nvl72')
# Calculon's own files, as Calculon ships them (sha256 of each, the same
# at commit 1cba8f1; a100_40g.json is this project's datasheet file, not
# one of them).
CALCULON = {
  'a100_80e':
    '59314273e550697a8637d64a149f76eaf78b52908d002686b3f59a550b04bf6c',
  'a100_80g':
    '781e1b358be4fd74a88ffef86d55ffb11ddfa76edf10474b0f7610a292864047',
  'h100_80g_nvl8':
    '6b5a22610c722f1d13562bb0f4bea5077ebf3719a87ae71c4b8c36bed81a56d4',
}


def test_defaults_are_the_calibrated_files():
  for name in CALIBRATED + ('h100_96g_power_capped',):
    assert is_calibrated(load_json(repo('systems', name + '.json'))), name
  for name in CALIBRATED:
    path = repo('systems', name + '_datasheet.json')
    assert datasheet_path(ROOT, name) == path
    assert not is_calibrated(load_json(path)), name
  # The power-capped H100s are fitted from the H100 SXM's datasheet file.
  assert not os.path.exists(repo('systems',
                                 'h100_96g_power_capped_datasheet.json'))
  assert not glob.glob(repo('systems', '*_calibrated.json'))
  # Every other file is a datasheet file (or Calculon's): no twin.
  for path in SYSTEMS:
    name = os.path.basename(path)[:-len('.json')]
    if name.endswith('_datasheet') or name in CALIBRATED or \
        name == 'h100_96g_power_capped':
      continue
    assert not is_calibrated(load_json(path)), name
    assert datasheet_path(ROOT, name) == path


@pytest.mark.parametrize('name', sorted(CALCULON))
def test_calculons_own_files_are_untouched(name):
  with open(repo('systems', name + '.json'), 'rb') as fd:
    assert hashlib.sha256(fd.read()).hexdigest() == CALCULON[name]


@pytest.mark.parametrize('name', NEW)
def test_peak_tflops_are_dense_datasheet_numbers(name):
  sys_cfg = system(name)
  peaks = {d: f / 1e12 for d, f in sys_cfg.matrix.peak_flops.items()}
  assert peaks == pytest.approx(DATASHEET_TFLOPS[name], abs=0.06)
  assert set(sys_cfg.vector.peak_flops) == set(peaks)


@pytest.mark.parametrize('name', sorted(MEASURED_GEMM))
def test_large_gemm_efficiency_is_the_measured_one(name):
  sys_cfg = system(name)
  for dtype, tflops in MEASURED_GEMM[name].items():
    peak = sys_cfg.matrix.peak_flops[dtype] / 1e12
    top = sys_cfg.matrix.efficiency[dtype].points[0]
    assert top[0] == 128e9
    assert top[1] == pytest.approx(tflops / peak, abs=0.006), dtype


@pytest.mark.parametrize('name', NEW)
def test_memory_and_networks(name):
  sys_cfg = system(name)
  gb, gbps = HBM[name]
  assert sys_cfg.mem1.capacity_bytes == gb * 2 ** 30
  assert sys_cfg.mem1.bandwidth_bytes_per_s == gbps * 1e9
  up, out = sys_cfg.networks[0], sys_cfg.networks[1]
  assert (up.size, up.bandwidth_bytes_per_s / 1e9) == SCALE_UP[name]
  assert up.must_be_filled and not out.must_be_filled
  assert out.bandwidth_bytes_per_s / 1e9 == SCALE_OUT[name]


# Best fused-attention kernel relative to large-GEMM efficiency: A100
# FlashAttention-2 at the middle of 50-73 % of peak (Dao 2023) / 0.87;
# Hopper FlashAttention-3/cuDNN; Blackwell cuDNN (FlashAttention-4 paper).
FUSED_ATTENTION = {'a100_40g': 0.71, 'a100_sxm_80g': 0.71,
                   'h100_sxm_80g': 0.72, 'h200_141g': 0.72, 'b200': 0.71,
                   'gb200_nvl72': 0.71}


@pytest.mark.parametrize('name', sorted(FUSED_ATTENTION))
def test_fused_attention_efficiency(name):
  doc = datasheet(name)
  assert doc['fused_attention_efficiency'] == FUSED_ATTENTION[name]
  # The A100 value is the cited range's middle over the measured GEMMs.
  if name.startswith('a100'):
    assert (0.50 + 0.73) / 2 / 0.87 == pytest.approx(doc[
      'fused_attention_efficiency'], abs=0.005)


def test_mesh_ops_price_a_group_on_its_own_links():
  # MI300X: a reduce-scatter among p GPUs uses p - 1 links of 64 GB/s per
  # direction: n (p-1)/p bytes take n / (64 p) seconds at the link rate.
  from calculon.hardware.network import Networks
  net = Networks([system('mi300x').networks[0]])
  n, eff = 1e9, 0.7
  for p in (2, 4, 8):
    t = net.time_s('reduce_scatter', n, p, 0) - 1e-05
    assert t == pytest.approx(n / (64e9 * p) / eff, rel=2e-3), p
  assert net.time_s('p2p', n, 2, 0) - 1e-05 == pytest.approx(n / 64e9 / eff)


EXE = {
  'num_procs': 16, 'tensor_par': 8, 'pipeline_par': 1, 'data_par': 2,
  'tensor_par_net': 0, 'pipeline_par_net': 0, 'data_par_net': 1,
  'batch_size': 16, 'microbatch_size': 1, 'datatype': 'bfloat16',
  'fused_activation': True, 'activation_recompute': 'full',
  'pipeline_interleaving': 1, 'tensor_par_comm_type': 'rs_ag',
  'tensor_par_overlap': 'none', 'seq_par_ag_redo': False,
  'data_par_overlap': True, 'weight_offload': False,
  'activations_offload': False, 'optimizer_offload': False, 'training': True,
  'data_par_sharding': 'optimizer', 'attention_kernel': 'flash'}


def _exe(tmp_path, **changes):
  path = tmp_path / ('exe_' + '_'.join(map(str, changes.values())) + '.json')
  path.write_text(json.dumps(dict(EXE, **changes)))
  return str(path)


def test_llm_prices_llama3_8b_on_every_new_system(tmp_path, capsys):
  app = repo('models', 'llama3-8B.json')
  times = {}
  for name in NEW:
    for dtype in DATASHEET_TFLOPS[name]:
      if dtype == 'float16':
        continue
      recipe = 'uniform' if dtype == 'bfloat16' else 'transformer_engine'
      exe = _exe(tmp_path, datatype=dtype, precision_recipe=recipe)
      # The default file prices it; the ordering below is the datasheet
      # rates' (a measured table's narrow GEMM need not be faster at every
      # shape: its fp8 op quantizes its input, and at TP 8 Llama 3 8B's
      # GEMMs are narrow; on GB300 float8 is within 1.1 % of bfloat16).
      for kind in ('', '_datasheet'):
        path = repo('systems', name + kind + '.json')
        if kind and not os.path.exists(path):
          continue
        out = tmp_path / f'{name}{kind}_{dtype}.json'
        assert main(['llm', app, exe, path, str(out)]) == 0, (name, dtype)
        stats = load_json(out)
        times[name, dtype] = stats['total_time']
        assert stats['sample_rate'] > 0
  capsys.readouterr()
  # Narrower datatypes are faster; B200 is faster than H100 than A100
  # (datasheet rates).
  for name in NEW:
    dtypes = [d for d in ('bfloat16', 'float8', 'float4')
              if (name, d) in times]
    assert [times[name, d] for d in dtypes] == sorted(
      (times[name, d] for d in dtypes), reverse=True), name
  assert times['b200', 'bfloat16'] < times['h100_sxm_80g', 'bfloat16'] < \
    times['a100_40g', 'bfloat16']


def test_llm_cli_accepts_gb200_nvl72(tmp_path):
  out = run_cli('llm', repo('models', 'llama3-8B.json'), _exe(tmp_path),
                repo('systems', 'gb200_nvl72.json'), '-')
  assert out.returncode == 0, out.stderr
  assert 'MFU' in out.stdout and 'sequence 8192' in out.stdout


def test_collective_latency_follows_nccls_cost_model():
  """NCCL's tuning model (src/graph/tuning.cc, Simple protocol): base 8.4
  us, 3.4 us per ring step over NVLink, 14 + 3 x 1 us per step between
  nodes.  An all-gather of 64 ranks, 8 per node: 56 steps inside the
  nodes, 7 between them; an all-reduce of 1,024 ranks, 8 per node, takes
  the tree (2 x (7 intra-node + log2(128) = 7 inter-node steps)), far
  below the ring's 2 x 1,023 steps.  Calculon's own files keep one
  latency per operation."""
  from calculon.hardware import System
  nets = System(load_json(repo('systems', 'h100_sxm_80g_datasheet.json')))\
    .networks
  us = 1e-6
  assert nets.latency_s_of('all_gather', 64, 1, 8) == pytest.approx(
    (8.4 + 56 * 3.4 + 7 * 17) * us)
  assert nets.latency_s_of('reduce_scatter', 8, 0) == pytest.approx(
    (8.4 + 7 * 3.4) * us)
  assert nets.latency_s_of('all_reduce', 1024, 1, 8) == pytest.approx(
    (8.4 + 2 * (7 * 3.4 + 7 * 17)) * us)
  assert nets.latency_s_of('p2p', 2, 1) == pytest.approx((8.4 + 17) * us)
  calc = System(load_json(repo('systems', 'a100_80g.json'))).networks
  assert calc.latency_s_of('all_gather', 64, 1, 8) == \
    calc.tiers[1].latency_s
