"""``calculon llm-validation --suite published --search``: the search in
each row's framework preset against the measured throughput and the
recipe's price (calculon/validation/search_check.py, issue 34 item 1)."""

import copy
import json
import math
import os

import pandas as pd
import pytest

from calculon.errors import ConfigError
from calculon.validation import mapping as M
from calculon.validation import published as P
from calculon.validation import search_check as SC
from conftest import ROOT, assert_png, load_json, run_cli, write_csv


def row(source, gpus, tp, batch, value, **cols):
  """A Llama 3 8B row (models/llama3-8B.json's shape) on H100s."""
  r = {k: '' for k in M.FACT_COLUMNS}
  r.update(source=source, model_name='Llama 3 8B', num_layers='32',
           hidden='4096', ffn_hidden='14336', attn_heads='32', kv_heads='8',
           seq_len='8192', vocab='128256', num_gpus=str(gpus),
           gpu_type='H100 SXM 80GB', tp=str(tp), pp='1',
           global_batch_size=str(batch), dtype='bf16',
           measured_metric_name='tokens_per_sec_per_gpu',
           measured_value=str(value))
  r.update(cols)
  return r


TUNED = 'Acme Labs 2027 performance summary'
OTHER = 'Acme Labs 2027 blog'


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
  rows = [row(TUNED, 8, 1, 128, 8000, micro_batch_size='1'),
          row(OTHER, 16, 2, 64, 7000),
          dict(row(OTHER, 16, 2, 64, 7000), tp='', pp=''),
          row(OTHER, 8, 1, 8, 2.5, measured_metric_name='layer_fwd_plus_bwd_ms')]
  return write_csv(tmp_path_factory.mktemp('runs') / 'acme.csv', rows)


@pytest.fixture(scope='module')
def suite(runs):
  return P.Suite(ROOT, [runs])


@pytest.fixture(scope='module')
def recipes(suite):
  return P.run_suite(suite)


@pytest.fixture(scope='module')
def frame(suite, recipes):
  return SC.results_frame(SC.run(suite, recipes, workers=1))


def by_id(frame):
  return frame.set_index('id')


def test_ratios_are_the_search_over_measured_and_over_the_recipe(
    suite, recipes, frame):
  """tokens/s/GPU: the measured value as stated; the recipe's is B s /
  (t N) of the published suite's time; the ratios divide them; best /
  measured = recipe / measured x best / recipe; the search's space holds
  the recipe, so its best is at least the recipe's price."""
  f = by_id(frame)
  assert list(frame['status']) == ['ok', 'ok', 'not searched',
                                   'not searched']
  for case, rec in zip(suite.cases[:2], recipes[:2]):
    r = f.loc[case.id]
    assert math.isclose(r['measured_tok_s_gpu'],
                        float(case.row['measured_value']), rel_tol=1e-12)
    recipe = case.fixed['batch_size'] * 8192 / (
      rec.predicted_s * case.fixed['num_procs'])
    assert math.isclose(r['recipe_tok_s_gpu'], recipe, rel_tol=1e-12)
    assert math.isclose(r['ratio_measured'],
                        r['best_tok_s_gpu'] / r['measured_tok_s_gpu'])
    assert math.isclose(r['ratio_recipe'],
                        r['best_tok_s_gpu'] / r['recipe_tok_s_gpu'])
    assert math.isclose(r['ratio_measured'],
                        r['recipe_vs_measured'] * r['ratio_recipe'])
    assert r['ratio_recipe'] >= 1 - 1e-12
    assert r['best'].startswith('TP') and 'mbs' in r['best']
    assert r['best_mem_gib'] <= 80
  # The best is written as a whole execution at the row's GPUs and batch.
  best = SC.run(suite, recipes)[0].best_execution
  assert (best['num_procs'], best['batch_size']) == (8, 128)
  assert best['tensor_par'] * best['pipeline_par'] * best['data_par'] * \
    best.get('context_par', 1) == 8


def test_rows_not_searched_say_why(frame):
  f = by_id(frame)
  ids = list(frame['id'])
  assert 'TP and PP not stated' in f.loc[ids[2], 'reason']
  assert 'per-layer measurement' in f.loc[ids[3], 'reason']
  assert pd.isna(f.loc[ids[2], 'best_tok_s_gpu'])
  # An error is a reason, not a traceback.
  suite = P.Suite(ROOT, [write_csv_row(row(OTHER, 8, 1, 16, 8000))])
  case = copy.deepcopy(suite.cases[0])
  case.fixed['framework'] = 'no-such-preset'
  out = SC.search_case(suite, case)
  assert out['status'] == 'not searched'
  assert out['reason'].startswith('error: ConfigError') and \
    'no-such-preset' in out['reason']


def write_csv_row(r, _n=[0]):
  import tempfile
  _n[0] += 1
  path = os.path.join(tempfile.mkdtemp(), f'one{_n[0]}.csv')
  return write_csv(path, [r])


def test_the_search_is_exact_at_the_row_batch(suite, recipes):
  """Placing TP/CP/DP/PP on their natural tiers and seeding with the
  recipe's rate find the unrestricted search's best among the layouts of
  the row's exact batch (16 GPUs: two nodes, two tiers); a seed above the
  best searches again without it."""
  from calculon.search import optimal_executions
  case = suite.cases[1]
  spec = SC.search_spec(suite, case)
  nets = suite.system_json(case)['networks']
  full = optimal_executions(spec, 1, 1)
  assert full.groups[full.best[0].group].batch_size == 64
  plain, layouts, _ = SC.search(spec, nets)
  assert layouts == sum(1 for g in full.groups if g.batch_size == 64)
  seed = SC._recipe_rate(case, recipes[1])
  assert 0 < seed <= plain.best[0].rate
  seeded, _, _ = SC.search(spec, nets, seed)
  high, _, _ = SC.search(spec, nets, 2 * plain.best[0].rate)
  for res in (plain, seeded, high):
    assert math.isclose(res.best[0].rate, full.best[0].rate, rel_tol=1e-12)
  assert seeded.evaluated <= plain.evaluated


def test_natural_tier_is_the_published_placement():
  nets = [{'size': 8, 'must_be_filled': True}, {'size': 4096,
                                                'must_be_filled': False}]
  assert [SC.natural_tier(nets, n) for n in (1, 2, 8, 16, 6)] == \
    [0, 0, 0, 1, 1]
  nvl = [{'size': 72, 'must_be_filled': False}, {'size': 100000}]
  assert SC.natural_tier(nvl, 64) == 0 and SC.natural_tier(nvl, 128) == 1


def test_tuned_rows_are_vendor_performance_tables_and_mlperf(suite):
  sources = set(pd.concat([
    pd.read_csv(os.path.join(ROOT, 'validation', n), dtype=str)['source']
    for n in P.DEFAULT_RUNS]))
  tuned = {s for s in sources if SC.is_tuned(s)}
  assert tuned and all(('NeMo' in s or 'Megatron-Bridge' in s) and
                       'erformance' in s for s in tuned)
  assert not any(k in s for s in tuned for k in (
    'torchtitan', 'Korthikanti', 'Narayanan', 'ModelZoo'))
  assert SC.is_tuned('MLPerf Training v4.0, NVIDIA submission')
  assert SC.is_tuned('docs/performance-summary-archive.md')
  assert not SC.is_tuned('Acme Labs 2027 blog')
  assert SC.is_tuned('Acme blog', ['acme']) and not SC.is_tuned(
    'Acme blog', ['zzz'])
  with pytest.raises(ConfigError, match='not a regular expression'):
    SC.tuned_patterns(['('])
  flags = [SC.is_tuned(c.row['source']) for c in suite.cases]
  assert flags == [True, False, False, False]


def test_summary_counts_medians_and_flags():
  def r(i, tuned, ratio, recipe_ratio=1.0, status='ok'):
    return SC.RowResult(id=i, source='s', model='m', gpus=8, tuned=tuned,
                        status=status, ratio_measured=ratio,
                        ratio_recipe=recipe_ratio, elapsed_s=1.0)
  rows = [r('a', True, 1.05), r('b', True, 1.20, 1.1), r('c', True, 1.30),
          r('d', False, 0.90), r('e', True, None, None, 'not searched')]
  s = SC.summary(SC.results_frame(rows))
  t = s['tuned']
  assert (t['rows'], t['searched'], t['not_searched']) == (4, 3, 1)
  assert t['median_ratio_measured'] == pytest.approx(1.20)
  assert t['max_ratio_measured'] == pytest.approx(1.30)
  assert t['above_flag'] == {'c': pytest.approx(1.30),
                             'b': pytest.approx(1.20)}
  assert list(t['above_flag']) == ['c', 'b']
  assert t['above_limit'] == ['c']
  assert t['median_ratio_recipe'] == pytest.approx(1.0)
  assert s['other']['median_ratio_measured'] == pytest.approx(0.90)
  assert s['all']['searched'] == 4 and s['all']['median_ratio_measured'] \
    == pytest.approx(1.125)
  assert s['passed'] is False
  assert (s['flag_ratio'], s['limit_ratio']) == (1.10, 1.25)
  ok = SC.summary(SC.results_frame([r('a', True, 1.05), r('b', True, 1.2),
                                    r('c', True, 0.9)]))
  assert ok['passed'] is True
  assert SC.summary(SC.results_frame([r('d', False, 2.0)]))['passed'] is None
  json.dumps(s)
  text = SC.format_report(SC.results_frame(rows))
  assert 'NOT met' in text and 'Not searched' in text


def test_execution_text_and_differences():
  recipe = {'tensor_par': 4, 'pipeline_par': 8, 'data_par': 4,
            'context_par': 1, 'pipeline_interleaving': 6,
            'microbatch_size': 1, 'activation_recompute': 'selective',
            'recompute_modules': 'core_attn', 'data_par_sharding': 'optimizer',
            'tensor_par_comm_type': 'rs_ag'}
  best = dict(recipe, tensor_par=1, pipeline_par=1, data_par=128,
              pipeline_interleaving=1, microbatch_size=4,
              activation_recompute='none', data_par_sharding='parameters',
              tensor_par_comm_type='ar', activations_offload=True)
  assert SC.execution_text(recipe) == \
    'TP4/PP8/DP4/CP1 VP6 mbs1 rc sel(core_attn) shard optimizer SP'
  assert SC.execution_text(best) == \
    'TP1/PP1/DP128/CP1 mbs4 rc none shard parameters offload a'
  assert SC.differences(recipe, best) == (
    'TP 4->1; PP 8->1; DP 4->128; mbs 1->4; recompute selective->none; '
    'shard optimizer->parameters')
  assert SC.execution_text(None) == '' and SC.differences(None, best) == ''
  moe = dict(best, tensor_par=2, data_par=64, expert_par=8,
             moe_dispatcher='alltoall', moe_comm_overlap='compute',
             tensor_par_comm_type='rs_ag', tensor_par_overlap='ring',
             activations_offload=False)
  assert SC.execution_text(moe) == (
    'TP2/PP1/DP64/CP1 EP8 alltoall ep-overlap compute mbs4 rc none shard '
    'parameters SP tp-overlap ring')


def test_cli_search_writes_the_table_summary_and_plot(runs, tmp_path):
  out, plots = tmp_path / 'out', tmp_path / 'plots'
  res = run_cli('llm-validation', '--suite', 'published', '--search',
                '--runs', runs, '--out', out, '--plot', plots, '-c', '1')
  assert res.returncode == 0, res.stderr
  assert 'Traceback' not in res.stdout + res.stderr
  assert 'Tuned rows: 1 of 1 searched' in res.stdout
  assert 'Not searched (reason)' in res.stdout
  frame = pd.read_csv(out / 'search_check.csv')
  assert list(frame.columns) == list(SC.COLUMNS)
  assert list(frame['status']) == ['ok', 'ok', 'not searched',
                                   'not searched']
  s = load_json(out / 'search_check_summary.json')
  assert s['tuned']['searched'] == 1 and s['other']['rows'] == 3
  assert s['tuned']['median_ratio_measured'] == pytest.approx(
    frame['ratio_measured'][0])
  assert (out / 'published_runs_results.csv').exists()
  assert_png(plots / 'search_check.png')


def test_cli_search_bad_input_is_one_line_exit_2(runs):
  for args in (('--suite', 'seqsel', '--search'),
               ('--suite', 'published', '--search', '--runs', runs,
                '--tuned', '(')):
    res = run_cli('llm-validation', *args)
    assert res.returncode == 2, (args, res.stdout, res.stderr)
    lines = [x for x in res.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and 'Traceback' not in res.stderr, res.stderr


def test_search_runs_on_the_systems_the_recipes_were_priced_on(suite):
  """``--calibrated``: the search prices on the same replacement system
  file as the recipe (a cluster's calibrated file), not the bundled one:
  the row's H100 with its matrix engine at half its peak searches to a
  slower best."""
  case = suite.cases[0]
  cluster = case.cluster or case.system_name
  slow = copy.deepcopy(suite.system_json(case))
  for curve in slow['matrix'].values():
    curve['tflops'] = curve['tflops'] / 2
  plain = SC.search_case(suite, case)
  halved = SC.search_case(suite, case, systems={cluster: slow})
  assert plain['status'] == halved['status'] == 'ok'
  assert halved['rate'] < 0.75 * plain['rate']
  assert SC.search_key(suite, case) != SC.search_key(
    suite, case, {cluster: slow})


def test_markdown_table_lists_tuned_rows_first(frame):
  text = SC.markdown(frame)
  lines = text.splitlines()
  assert lines[0].startswith('| run | model | GPUs | measured |')
  assert lines[2].split('|')[1].strip().endswith('*')   # the tuned row
  assert sum(1 for x in lines if x.startswith('| ')) == 1 + int(
    (frame['status'] == 'ok').sum())
  assert any(x.startswith('- Tuned recipes (*): 1 of 1 searched')
             for x in lines)


def test_cli_runs_without_a_runs_suite_is_refused(runs):
  # seqsel is the default suite; it reads no measured-runs file, so a --runs
  # given without --suite would be ignored and the user shown the wrong
  # comparison.
  res = run_cli('llm-validation', '--runs', runs)
  assert res.returncode == 2, (res.stdout, res.stderr)
  lines = [x for x in res.stderr.splitlines() if x.strip()]
  assert len(lines) == 1 and 'Traceback' not in res.stderr, res.stderr
  assert '--runs' in lines[0] and '--suite published' in lines[0]
