"""Unstated settings of a measured run priced at the framework's defaults
(``validation/conventions.yaml`` ``unstated.mode: default``) instead of the
fastest feasible candidate, in the published suite and in calibration."""

import pytest

from calculon.errors import ConfigError
from calculon.validation import calibrate as C
from calculon.validation import conventions as CV
from calculon.validation import mapping as M
from calculon.validation import published as P
from conftest import ROOT, unknown_source_row, write_csv


@pytest.fixture(scope='module')
def both():
  """(fastest, default) suites of the bundled runs."""
  return P.Suite(ROOT, unstated='fastest'), P.Suite(ROOT, unstated='default')


def case(suite, case_id):
  return next(c for c in suite.cases if c.id == case_id)


def said(c, key):
  """(value, why) of ``key`` among ``c``'s assumptions (the last entry)."""
  return [(v, w) for k, v, w in c.assumptions if k == key][-1]


def test_bundled_conventions_keep_the_fastest():
  conv = CV.load(CV.default_path(ROOT))
  assert conv.unstated_mode == 'fastest'
  s = P.Suite(ROOT)
  assert s.mapper.unstated == 'fastest'
  assert case(s, 'narayanan-06').defaults == {}


def test_default_prices_the_framework_default(both):
  # Narayanan et al. 2021, Table 1 row 6 (GPT 76.1B, TP 8, PP 4): neither
  # the microbatch nor the interleaving is stated.  The conventions'
  # defaults: microbatch 1 (the Megatron-Bridge recipes), VP 1 (Megatron-LM
  # --num-layers-per-virtual-pipeline-stage default None).
  fast, slow = (case(s, 'narayanan-06') for s in both)
  assert len(slow.axes['microbatch_size']) > 1        # still a grid
  assert slow.defaults == {'microbatch_size': 1, 'pipeline_interleaving': 1}
  for key in ('microbatch_size', 'pipeline_interleaving'):
    value, why = said(slow, key)
    assert value == 1 and why.startswith('unstated: the megatron-lm-2021 '
                                         'default')
    assert isinstance(said(fast, key)[0], list)      # searched
  r_fast = P.price(fast, both[0].system(fast))
  r_def = P.price(slow, both[1].system(slow))
  assert r_def.execution['microbatch_size'] == 1
  assert r_def.execution['pipeline_interleaving'] == 1
  # The fastest is elsewhere (a larger microbatch, interleaved), so the
  # option changes the prediction, never to a faster one.
  assert (r_fast.execution['microbatch_size'],
          r_fast.execution['pipeline_interleaving']) != (1, 1)
  assert r_def.predicted_s > r_fast.predicted_s
  assert r_def.slowest_s == pytest.approx(r_fast.slowest_s)


def test_preset_value_wins_over_the_table(tmp_path):
  # attention_kernel: frameworks/megatron-lm-2021.json says 'standard',
  # megatron-core.json 'flash' (its rule's value); the table's default is
  # flash.  An unknown source's row, priced under each preset.
  row = unknown_source_row(seq_len='2048', gpu_type='A100 80GB',
                           micro_batch_size='1',
                           measured_metric_name='iteration_time_s',
                           measured_value='1')
  path = write_csv(tmp_path / 'acme.csv', [row])
  for framework, kernel in (('megatron-lm-2021', 'standard'),
                            ('megatron-core', 'flash')):
    s = P.Suite(ROOT, [path], framework=framework, unstated='default')
    c = s.cases[0]
    assert c.defaults['attention_kernel'] == kernel
    value, why = said(c, 'attention_kernel')
    assert value == kernel and f'frameworks/{framework}.json' in why
    res = P.price(c, s.system(c))
    assert res.status == 'ok'
    assert res.execution['attention_kernel'] == kernel


def test_infeasible_default_falls_back_to_the_search(both):
  # NeMo 24.07 Nemotron-340B on 128 H100 (TP 8, PP 8, DP 2): without
  # recomputation (the default) no candidate fits 80 GB; the fastest
  # feasible one is priced and the row says so.
  c = case(both[1], 'nemo-10')
  assert c.defaults['activation_recompute'] == 'none'
  res = P.price(c, both[1].system(c))
  assert res.status == 'ok' and not res.over_memory
  assert res.execution['activation_recompute'] != 'none'
  assert 'defaults of the unstated settings are infeasible' in res.reason
  fast = P.price(case(both[0], 'nemo-10'), both[0].system(c))
  assert res.predicted_s == pytest.approx(fast.predicted_s)


def test_calibration_chooses_as_the_suite(both):
  # One convention: calibrate's exact prediction picks the candidate the
  # published suite prices, in either mode.
  for s in both:
    for cid in ('narayanan-06', 'nemo-02'):
      c = case(s, cid)
      cfg = s.system_json(c)
      t, index = C.exact_prediction(c, cfg, C.prior_of(cfg))
      res = P.price(c, s.system(c))
      assert M.execution_at(c, index) == res.execution
      assert t == pytest.approx(res.predicted_s, rel=1e-6)


def test_bad_mode_is_refused(tmp_path):
  path = tmp_path / 'conv.yaml'
  path.write_text('unstated:\n  mode: slowest\n')
  with pytest.raises(ConfigError, match=r"unstated\.mode.*slowest.*fastest, "
                     'default'):
    CV.load(str(path))
  path.write_text('unstated:\n  defaults:\n    - setting: tensor_par\n'
                  '      value: 2\n')
  with pytest.raises(ConfigError, match=r'unstated\.defaults\[0\]\.setting'):
    CV.load(str(path))
  with pytest.raises(ConfigError, match="'unstated' = 'sometimes'"):
    P.Suite(ROOT, unstated='sometimes')
