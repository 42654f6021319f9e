"""Large-scale runs (issue 46): what the model prices between Llama 3 405B
on 8,192 and 16,384 H100s, and a pod tier oversubscribed 1:7 as a system
file describes it (docs/accuracy.md, "What the model leaves out at
scale")."""

import copy

import numpy as np
import pytest

from calculon.hardware import System
from calculon.io import read_json_file
from calculon.validation import published as P
from calculon.validation.system_files import datasheet_path

from conftest import ROOT


def _three_tier(rails):
  """The H100 datasheet file with Llama 3's RoCE fabric (Grattafiori et
  al. 2024, arXiv 2407.21783, section 3.3.1: 3,072 GPUs per pod at full
  bisection, the aggregation layer between pods oversubscribed 1:7): tier
  1 the pod (size 3,072, the NIC's 50 GB/s), tier 2 the cluster at 50 / 7
  GB/s per GPU, ``rails`` NICs per node."""
  cfg = read_json_file(datasheet_path(ROOT, 'h100_sxm_80g'))
  nets = cfg['networks']
  pod = copy.deepcopy(nets[1])
  pod['size'] = 3072
  top = copy.deepcopy(nets[1])
  top['bandwidth'] = nets[1]['bandwidth'] / 7
  top['rails'] = rails
  cfg['networks'] = [nets[0], pod, top]
  return System(cfg)


@pytest.mark.parametrize('op', ['all_gather', 'reduce_scatter'])
def test_a_railed_ring_across_pods_is_not_bound_by_the_1_to_7_taper(op):
  """A data-parallel ring of 64 ranks (Table 4: DP 64 at TP 8) crossing
  pods: with 8 NICs per node the crossing traffic is carried by 8 ranks of
  the domain at once (the rails rule, calculon.hardware.network.Networks.
  collective_time_s; 24 of the group's ranks in a pod, 3,072 / 128): 8 x 50 / 7 = 57.1 GB/s >= the 50 GB/s of the tier
  below, so the tier below's rate binds and the bytes take as long as
  inside a pod.  Hand check of the same claim on the fabric: a pod
  boundary is crossed by one hop of each of the 128 (TP, PP) positions'
  rings, 128 x 50 GB/s = 6.4 TB/s, under the pod's 3,072 x 50 / 7 = 21.9
  TB/s uplink.  Without rails every rank's whole share crosses at 50 / 7
  GB/s: 7 x the bytes' time."""
  n = 1e9
  railed, flat = _three_tier(8).networks, _three_tier(1).networks
  def bytes_s(nets, tier, per_domain):
    lat = nets.latency_s_of(op, 64, tier, per_domain)
    return float(nets.collective_time_s(op, n, 64, tier, per_domain) - lat)
  in_pod = n * 63 / 64 / (50e9 * railed.tiers[1].efficiency)
  # One rank a node inside a pod (TP 8 fills the node); 24 a pod across
  # pods (3,072 / 128 GPUs between two ranks of the group).
  assert bytes_s(railed, 1, 1) == pytest.approx(in_pod, rel=1e-12)
  assert bytes_s(railed, 2, 24) == pytest.approx(in_pod, rel=1e-12)
  assert bytes_s(flat, 2, 24) == pytest.approx(7 * in_pod, rel=1e-12)


@pytest.fixture(scope='module')
def llama3_rows():
  """grattafiori-01 and -02 (Table 4: DP 64 and DP 128 at the same 16M
  tokens a batch) priced on the datasheet file, fastest candidate and with
  TP's communication left whole."""
  suite = P.Suite(ROOT, [f'{ROOT}/validation/unseen_runs.csv'])
  rows = {}
  for case in suite.cases:
    if case.id not in ('grattafiori-01', 'grattafiori-02'):
      continue
    system = suite.system(case)
    plain = copy.copy(case)
    plain.axes = dict(case.axes, tensor_par_overlap=['none'])
    rows[case.id] = (case.measured_s, P.price(case, system).predicted_s,
                     P.price(plain, system).predicted_s)
  return rows


def test_llama3_table4_dp_64_to_128_is_priced(llama3_rows):
  """Table 4: 430 -> 400 TFLOP/s a GPU from DP 64 to DP 128 at the same
  global batch (32 -> 16 sequences per replica): 400 / 430 = 0.930.  The
  model's terms that grow with DP here (the pipeline bubble at half the
  microbatches, the DP collectives over twice the ranks) give the
  same-FLOP ratio t(8,192) / (2 t(16,384)) within 2.5 points of it."""
  m1, p1, _ = llama3_rows['grattafiori-01']
  m2, p2, _ = llama3_rows['grattafiori-02']
  assert m1 / (2 * m2) == pytest.approx(400 / 430, rel=1e-3)
  assert abs(p1 / (2 * p2) - 400 / 430) < 0.025


def test_llama3_gap_is_per_microbatch_not_per_step(llama3_rows):
  """Fit t = m a + B through the two rows (m = 32 and 16 microbatches a
  replica, the same per-microbatch work): the measured a = (12.504 -
  6.721) / 16 = 0.361 s.  The fastest candidate's a (TP 8 with the
  tiled overlap at the ``common`` preset's Transformer Engine share,
  tensor_par_overlap_efficiency 0.352) falls short by more than 10 %
  (0.315 s), and that shortfall is more than three quarters of the gap
  at 8,192 GPUs (what grows with DP, B, is not where it is); with TP's
  communication left whole (tensor_par_overlap 'none', which the paper
  does not state either way) a is within 5 % of the measured."""
  m1, p1, q1 = llama3_rows['grattafiori-01']
  m2, p2, q2 = llama3_rows['grattafiori-02']
  a_meas = (m1 - m2) / 16
  assert a_meas == pytest.approx((12.504 - 6.721) / 16, rel=2e-3)
  a_fast, a_plain = (p1 - p2) / 16, (q1 - q2) / 16
  assert a_fast < 0.90 * a_meas
  assert 32 * (a_meas - a_fast) > 0.75 * (m1 - p1)
  assert abs(a_plain / a_meas - 1) < 0.05
  assert np.isfinite([p1, p2, q1, q2]).all()
