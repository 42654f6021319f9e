"""Hardware models: efficiency curves, engines, memories, networks."""

import numpy as np
import pytest

from calculon import System
from calculon.config.execution import DATATYPE_NAMES
from conftest import load_json, repo

F16 = DATATYPE_NAMES.index('float16')


@pytest.fixture(scope='module')
def a100():
  return System(load_json(repo('systems', 'a100_80g.json')))


def test_matrix_efficiency_steps_at_thresholds(a100):
  # a100_80g matrix fp16: 312 TFLOP/s; >=128 GFLOP 0.95, >=16 0.9, >=1 0.6,
  # else 0.1.
  flops = np.array([0, 0.5e9, 1e9, 15.9e9, 16e9, 127e9, 128e9, 1e15])
  eff = np.array([0.1, 0.1, 0.6, 0.6, 0.9, 0.9, 0.95, 0.95])
  got = a100.matrix.throughput_flops_per_s(F16, flops)
  np.testing.assert_array_equal(got, 312e12 * eff)
  assert a100.matrix.time_s(F16, 256e9) == 256e9 / (312e12 * 0.95)
  assert a100.matrix.time_s(F16, 0.0) == 0.0


def test_memory_capacity_binary_bandwidth_si(a100):
  assert a100.mem1.capacity_bytes == 80 * 2 ** 30
  assert a100.mem1.bandwidth_bytes_per_s == 2048e9
  # 10 MB access: efficiency 0.75 -> 1536 GB/s.
  assert a100.mem1.time_s(10e6) == 10e6 / (2048e9 * 0.75)
  assert a100.mem1.time_s(0) == 0
  assert a100.offload_time_s(100e6) == 100e6 / (32e9 * 0.95)


def test_network_collective_time(a100):
  nets = a100.networks
  # Tier 0 (NVLink): all-reduce scalar 2, offset -1: 2 (p-1)/p n bytes.
  n, p = 1e9, 8
  want = 1e-5 + n * 2 * (1 - 1 / p) / (300e9 * 0.65)
  assert nets.time_s('all_reduce', n, p, 0) == pytest.approx(want, rel=1e-15)
  # Tier 1: p2p scalar 1.
  assert nets.time_s('p2p', n, 2, 1) == pytest.approx(
    2e-5 + n / (25e9 * 0.9), rel=1e-15)
  # Vectorized over tiers and sizes.
  t = nets.time_s('reduce_scatter', np.array([0.0, n]), 4, np.array([0, 1]))
  assert t[0] == 1e-5 and t[1] == pytest.approx(2e-5 + n / 22.5e9)


def test_processing_mode(a100):
  assert a100.processing_time_s(1.0, 2.0) == 3.0
  cfg = load_json(repo('systems', 'a100_80g.json'))
  cfg['processing_mode'] = 'roofline'
  assert System(cfg).processing_time_s(1.0, 2.0) == 2.0


def test_mixed_datatypes_in_one_array():
  cfg = load_json(repo('systems', 'h100_80g_nvl8.json'))
  h100 = System(cfg)
  dt = np.array([DATATYPE_NAMES.index('float8'), F16])
  got = h100.matrix.throughput_flops_per_s(dt, np.array([1e12, 1e12]))
  np.testing.assert_array_equal(got, [2000e12 * 0.95, 1000e12 * 0.95])
