"""``calculon calibrate``: the fit recovers known parameters, cross-
validation never uses held-out runs, the calibrated file is an ordinary
system file; and the engine fields calibration writes (overhead,
fused_attention_efficiency)."""

import copy
import csv
import json
import math

import numpy as np
import pytest

from calculon.config import Application, ExecutionColumns
from calculon.errors import ConfigError
from calculon.hardware import System
from calculon.llm import evaluate_columns
from calculon.validation import calibrate as C
from calculon.validation import mapping as M
from calculon.validation import published as P
from calculon.validation.system_files import is_calibrated
from conftest import ROOT, load_json, repo, run_cli, write_csv

H100 = load_json(repo('systems', 'h100_sxm_80g_datasheet.json'))
#: Known parameters the synthetic runs are made with.
TRUTH = {'matrix': 0.86, 'net0': 0.8, 'net1': 0.7, 'per_microbatch_s': 0.004}
#: (TP, PP, DP, microbatch, global batch) of the synthetic runs: TP inside
#: a node (tier 0), DP across nodes (tier 1), various microbatch counts.
LAYOUTS = [(1, 1, 8, 1, 64), (2, 1, 4, 2, 64), (4, 1, 2, 1, 32),
           (8, 1, 2, 1, 64), (2, 2, 4, 1, 64), (1, 1, 16, 2, 128),
           (8, 2, 1, 1, 16), (4, 2, 2, 4, 64), (2, 1, 16, 1, 64),
           (1, 2, 8, 1, 64), (8, 1, 4, 1, 32), (2, 4, 2, 1, 32)]
#: Settings every synthetic row states, so that it has one candidate.
FIXED = ('tensor_par_comm_type=ar; tensor_par_overlap=none; '
         'data_par_overlap=false; data_par_sharding=none; '
         'attention_kernel=flash; fused_activation=true')


def synthetic_rows():
  rows = []
  for i, (tp, pp, dp, mbs, gbs) in enumerate(LAYOUTS):
    row = {k: '' for k in M.FACT_COLUMNS}
    row.update(source=f'Synthetic {"ABC"[i % 3]} runs',
               model_name='Toy LM', num_layers='8', hidden='2048',
               ffn_hidden='8192', attn_heads='16', seq_len='2048',
               vocab='32000', num_gpus=str(tp * pp * dp),
               gpu_type='H100-SXM-80GB', tp=str(tp), pp=str(pp), dp=str(dp),
               vp='1', global_batch_size=str(gbs), micro_batch_size=str(mbs),
               recompute='none', seq_parallel='n', dtype='bf16',
               measured_metric_name='iteration_time_s', measured_value='1')
    row['assumptions'] = FIXED
    rows.append(row)
  return rows


@pytest.fixture(scope='module')
def synthetic(tmp_path_factory):
  """A CSV of runs 'measured' by the model itself on the H100 file with
  the parameters TRUTH."""
  path = tmp_path_factory.mktemp('synthetic') / 'runs.csv'
  rows = synthetic_rows()
  write_csv(path, rows)
  suite = P.Suite(ROOT, [str(path)])
  for row, case in zip(rows, suite.cases):
    assert case.expressible and case.candidates() == 1, case.missing
    t, _ = C.exact_prediction(case, H100, TRUTH)
    row['measured_value'] = repr(t)
  return write_csv(path, rows)


def test_scaled_system_is_the_written_file():
  """The array-valued system the fit uses prices exactly what the
  calibrated file (curves rewritten) prices."""
  theta = {'matrix': 0.9, 'matrix_narrow': 0.8, 'vector': 0.7,
           'attention': 0.6, 'net0': 0.9, 'net1': 0.6}
  suite = P.Suite(ROOT)
  for cid in ('nemo-07', 'megatron-bridge-11', 'torchtitan-06'):
    c = next(x for x in suite.cases if x.id == cid)
    cfg = suite.system_json(c)
    exe = M.candidate_columns(c)
    written = evaluate_columns(c.app, System(C.apply(cfg, theta)),
                               exe).total_time_s
    arrays = {k: np.array([1.0, v]) for k, v in theta.items()}
    both = evaluate_columns(c.app, C.ScaledSystem(cfg, arrays,
                                                  ndim=len(exe.shape)),
                            exe).total_time_s
    plain = evaluate_columns(c.app, System(cfg), exe).total_time_s
    np.testing.assert_allclose(both[1], written, rtol=1e-5)
    np.testing.assert_allclose(both[0], plain, rtol=1e-12)


def test_calibrate_recovers_known_parameters(synthetic):
  suite = P.Suite(ROOT, [synthetic])
  cases = C.select_runs(suite, 'h100_sxm_80g')
  assert len(cases) == len(LAYOUTS)
  names = list(TRUTH)
  result = C.calibrate_system(suite, H100, cases, names, sigma=50.0,
                              refine=3, cv=())
  for k, v in TRUTH.items():
    assert result.fit.theta[k] == pytest.approx(v, rel=0.02), k
  assert result.predictions['delta_after_pct'].abs().max() < 0.5
  # The calibrated file is an ordinary system file: the engine prices a
  # run on it as the calibration predicts.
  calibrated = result.calibrated
  assert calibrated['overhead']['per_microbatch_s'] == pytest.approx(
    TRUTH['per_microbatch_s'], rel=0.02)
  c = cases[3]
  exe = M.execution_at(c, (0,) * len(M.AXES))
  ev = evaluate_columns(c.app, System(calibrated),
                        M.records_columns(c, [exe]))
  after = result.predictions.set_index('id').loc[c.id, 'after_s']
  assert float(ev.total_time_s[0]) == pytest.approx(after, rel=1e-5)
  assert float(ev.overhead_time_s[0]) == pytest.approx(
    calibrated['overhead']['per_microbatch_s'] *
    float(ev.num_microbatches[0]), rel=1e-12)


def held_out_a(rows, tmp_path, names):
  """Leave-one-source-out predictions of source group A (sources A, B, C
  from the rows' source names), from ``rows`` as they are and with A's
  measurements tripled: (as is, changed) DataFrames indexed by id.
  ``rows`` gains its source_group column."""
  for row in rows:
    row['source_group'] = row['source'].split()[1]      # A, B, C
  changed = copy.deepcopy(rows)
  for row in changed:
    if row['source_group'] == 'A':
      row['measured_value'] = repr(3 * float(row['measured_value']))
  frames = []
  for name, data in (('rows.csv', rows), ('changed.csv', changed)):
    prepared = C.prepare(P.Suite(ROOT, [write_csv(tmp_path / name, data)]))
    frames.append(C.cross_validate(prepared, 'source',
                                   names=names).set_index('id'))
  return tuple(f[f['source'] == 'A'] for f in frames)


def test_held_out_runs_never_inform_their_prediction(synthetic, tmp_path):
  """Leave one source out: the held-out source's predictions are the same
  whatever its measurements say, and equal a calibration on the file
  without its rows."""
  with open(synthetic, newline='') as fd:
    rows = list(csv.DictReader(fd))
  a, b = held_out_a(rows, tmp_path, ['matrix', 'net1'])
  assert len(a) == 4
  np.testing.assert_array_equal(a['after_s'].to_numpy(),
                                b['after_s'].to_numpy())
  assert not np.allclose(a['delta_after_pct'], b['delta_after_pct'])
  # ... and equal a calibration on the other sources alone.
  rest = [r for r in rows if r['source_group'] != 'A']
  prepared = C.prepare(P.Suite(ROOT, [write_csv(tmp_path / 'rest.csv',
                                                 rest)]))
  theta, how = C._fold_theta(prepared.runs, 'h100_sxm_80g',
                             ['matrix', 'net1'], C.PRIOR_SIGMA)
  assert how.startswith('own')
  full = P.Suite(ROOT, [str(tmp_path / 'rows.csv')])
  for c in full.cases:
    if c.group == 'A':
      t, _ = C.exact_prediction(c, H100, theta)
      assert t == a.loc[c.id, 'after_s']


A100 = load_json(repo('systems', 'a100_sxm_80g_datasheet.json'))


def two_cluster_rows(tmp_path, scale_a100=None):
  """The synthetic H100 runs plus the same layouts on A100s, each
  'measured' by the model on its file with TRUTH (``scale_a100``: other
  parameters for the A100 runs)."""
  rows = synthetic_rows()
  a100 = copy.deepcopy(rows)
  for row in a100:
    row['gpu_type'] = 'A100-SXM-80GB'
  path = write_csv(tmp_path / 'two.csv', rows + a100)
  suite = P.Suite(ROOT, [path])
  for row, case in zip(rows + a100, suite.cases):
    cfg = H100 if row['gpu_type'].startswith('H100') else A100
    truth = TRUTH if cfg is H100 else (scale_a100 or TRUTH)
    assert case.system_name == ('h100_sxm_80g' if cfg is H100
                                else 'a100_sxm_80g')
    t, _ = C.exact_prediction(case, cfg, truth)
    row['measured_value'] = repr(t)
  return rows + a100


def test_population_prior_is_the_other_clusters_fit(tmp_path):
  """Partial pooling: a cluster's prior centres are the pooled fit of the
  other clusters' runs (population_centre), its own runs then fit from
  there; a cluster alone keeps its file's values as the prior."""
  rows = two_cluster_rows(tmp_path, {'matrix': 0.8, 'net0': 0.8,
                                     'net1': 0.7, 'per_microbatch_s': 0.004})
  prepared = C.prepare(P.Suite(ROOT, [write_csv(tmp_path / 'r.csv', rows)]))
  a100 = [r for r in prepared.runs if r.system == 'a100_sxm_80g']
  assert len(a100) == len(LAYOUTS)
  centre = C.population_centre(a100)
  # The automatic choice on the A100 runs, fitted there: the centres.
  prior = C.prior_of(a100[0].cfg)
  names = [k for k in C.auto_parameters(a100, prior)[0] if C.is_scale(k)]
  assert names and sorted(centre) == sorted(names)
  direct = C.fit(a100, C.auto_parameters(a100, prior)[0], prior).theta
  for k in names:
    assert centre[k] == pytest.approx(direct[k], rel=1e-9)
    assert centre[k] != 1.0
  theta, how = C._fold_theta(prepared.runs, 'h100_sxm_80g', ['net1'],
                             C.PRIOR_SIGMA)
  assert how == f'own ({len(LAYOUTS)} runs, pooled prior)'
  # Scales the H100 runs do not fit stay at the A100 centres.
  for k in names:
    if k != 'net1':
      assert theta[k] == pytest.approx(centre[k], rel=1e-12)
  alone, how = C._fold_theta(prepared.runs, 'h100_sxm_80g', ['net1'],
                             C.PRIOR_SIGMA, population=False)
  assert how == f'own ({len(LAYOUTS)} runs)'
  assert all(alone[k] == 1.0 for k in names if k != 'net1')


def test_held_out_source_leaves_the_population_too(tmp_path):
  """Leave one source out with two clusters: the held-out source's runs
  on the *other* cluster leave the population prior as well, so its
  predictions do not move when all of its measurements change."""
  a, b = held_out_a(two_cluster_rows(tmp_path), tmp_path, ['net1'])
  assert len(a) == 8 and set(a['how']) == {'own (8 runs, pooled prior)'}
  np.testing.assert_array_equal(a['after_s'].to_numpy(),
                                b['after_s'].to_numpy())


def test_undetermined_parameters_are_refused_and_correlations_warned(
    synthetic):
  suite = P.Suite(ROOT, [synthetic])
  cases = C.select_runs(suite, 'h100_sxm_80g')
  # No run uses float8 or fused attention heavily enough... attention is
  # flash here but 2k tokens: check a parameter no run is sensitive to.
  with pytest.raises(ConfigError, match='cannot determine'):
    C.calibrate_system(suite, H100, cases[:2], ['matrix', 'net0', 'net1'],
                       cv=())
  with pytest.raises(ConfigError, match="'matrix_narrow' is not allowed"):
    C.check_parameters(load_json(repo('systems', 'a100_80g.json')),
                       ['matrix_narrow'])
  with pytest.raises(ConfigError, match="parameter 'warp' is not allowed"):
    C.check_parameters(H100, ['warp'])
  # Two parameters that move every run the same way: the per-step and the
  # per-microbatch overheads when every run has one microbatch.
  prepared = C.prepare(suite)
  single = [r for r in prepared.runs if (r.nmb == r.nmb[0]).all()]
  for r in single:
    r.nmb = np.ones_like(r.nmb)
  kept, reasons = C.determined(single, ['per_step_s', 'per_microbatch_s'],
                               C.prior_of(H100))
  assert kept == [] and 'rank deficient' in reasons[-1]


def test_correlation_warning():
  """Runs whose times move almost together with two parameters: the fit
  warns that they are strongly correlated."""
  def run(nmb, t):
    return C.Run(case=M.Case(row={}, id=f'r{nmb}', group=f'g{nmb}'),
                 system='s', cfg=H100, measured_s=t, lin={}, names=[],
                 times=np.array([[1.0]]), nmb=np.array([float(nmb)]))
  runs = [run(n, 1.0 + 0.3 + 0.01 * n) for n in (10, 11, 12, 13)]
  result = C.fit(runs, ['per_step_s', 'per_microbatch_s'],
                 C.prior_of(H100), sigma=5.0)
  assert any('strongly correlated' in w for w in result.warnings)


def test_cli_calibrate(synthetic, tmp_path):
  # The cluster is the file name without _datasheet: h100_sxm_80g's runs.
  datasheet = repo('systems', 'h100_sxm_80g_datasheet.json')
  out = tmp_path / 'cal.json'
  res = run_cli('calibrate', synthetic, datasheet,
                '-o', out, '--params', 'matrix,net0,net1,per_microbatch_s',
                '--prior-sigma', '50', '--cv', 'none')
  assert res.returncode == 0, res.stderr
  for needle in ('matrix', 'std err', 'In sample', 'wrote',
                 '(cluster h100_sxm_80g)'):
    assert needle in res.stdout, needle
  assert 'already a calibrated file' not in res.stdout
  cal = json.loads(out.read_text())
  assert cal['networks'][1]['efficiency'] == pytest.approx(
    H100['networks'][1]['efficiency'] * TRUTH['net1'], rel=0.02)
  assert any('calculon calibrate' in n for n in cal['notes'])
  assert is_calibrated(cal) and not is_calibrated(H100)
  # Calibrating a calibrated file again is allowed, with a note.
  again = run_cli('calibrate', synthetic, out, '--cluster', 'h100_sxm_80g',
                  '-o', tmp_path / 'again.json', '--params', 'matrix',
                  '--cv', 'none')
  assert again.returncode == 0, again.stderr
  assert 'already a calibrated file' in again.stdout
  bad = run_cli('calibrate', synthetic, datasheet,
                '-o', tmp_path / 'x.json', '--params', 'matrix,moe')
  assert bad.returncode == 2
  assert 'moe: no run is sensitive to it' in bad.stderr


# -- engine fields ------------------------------------------------------------------

GPT = {'hidden': 2048, 'feedforward': 8192, 'seq_size': 8192,
       'attn_heads': 16, 'attn_size': 128, 'num_blocks': 4}
EXE = dict(num_procs=8, tensor_par=2, pipeline_par=1, data_par=4,
           tensor_par_net=0, pipeline_par_net=0, data_par_net=0,
           batch_size=32, microbatch_size=2, datatype='bfloat16',
           fused_activation=True, activation_recompute='none',
           pipeline_interleaving=1, optimizer_sharding=False,
           tensor_par_comm_type='ar', tensor_par_overlap='none',
           seq_par_ag_redo=False, data_par_overlap=False,
           weight_offload=False, activations_offload=False,
           optimizer_offload=False, training=True, attention_kernel='flash')


def price(system, **changes):
  cols = ExecutionColumns.from_records([dict(EXE, **changes)])
  return evaluate_columns(Application.from_dict(GPT), System(system), cols)


def test_overhead_adds_per_step_and_per_microbatch():
  plain = price(H100)
  sys2 = dict(H100, overhead={'per_step_s': 0.25, 'per_microbatch_s': 0.01})
  over = price(sys2)
  nmb = 32 // 4 // 2
  assert float(over.overhead_time_s[0]) == pytest.approx(0.25 + 0.01 * nmb)
  assert float(over.total_time_s[0]) == pytest.approx(
    float(plain.total_time_s[0]) + 0.25 + 0.01 * nmb, rel=1e-12)
  assert plain.overhead_time_s == 0.0
  # The report's time breakdown (with its 'fixed overhead' line) still
  # adds up to the batch time.
  from calculon.report import RunData
  from calculon.llm.stats import stat_arrays, STAT_NAMES, EXTRA_STAT_NAMES
  stats = {k: float(v[0]) for k, v in stat_arrays(
    over, STAT_NAMES + EXTRA_STAT_NAMES).items()}
  parts = dict((label, sec) for label, sec, _ in RunData(
    None, None, None, stats, stats).time_breakdown())
  assert parts['fixed overhead'] == pytest.approx(0.25 + 0.01 * nmb)
  assert sum(parts.values()) == pytest.approx(stats['total_time'],
                                              rel=1e-12)
  with pytest.raises(ConfigError, match="overhead.per_step_s"):
    System(dict(H100, overhead={'per_step_s': -1}))


def test_fused_attention_efficiency_slows_fused_attention_only():
  plain = price(dict(H100, fused_attention_efficiency=1.0))
  half = price(dict(H100, fused_attention_efficiency=0.5))
  def flash(ev):
    layer = next(l for l in ev.layers if l.name == 'AttnBlock_FlashAttention')
    return (np.asarray(layer.flops_time_s('fw')).reshape(-1)[0],
            np.asarray(layer.mem_time_s('fw')).reshape(-1)[0])
  (fp, mp), (fh, mh) = flash(plain), flash(half)
  assert fh == pytest.approx(2 * fp, rel=1e-12) and mh == mp
  assert float(half.total_time_s[0]) > float(plain.total_time_s[0])
  std = price(H100, attention_kernel='standard')
  std_half = price(dict(H100, fused_attention_efficiency=0.5),
                   attention_kernel='standard')
  assert float(std.total_time_s[0]) == float(std_half.total_time_s[0])
  with pytest.raises(ConfigError, match='fused_attention_efficiency'):
    System(dict(H100, fused_attention_efficiency=1.5))


def test_all_to_all_across_nodes_splits_by_tier():
  """An all-to-all among 16 ranks on 2 nodes of 8: 8 of the 15 peers are
  off-node (over tier 1), 7 on-node (over NVLink), at the same time."""
  from calculon.llm.block import build_block  # noqa: F401
  app = Application.from_dict(dict(GPT, seq_size=4096, num_experts=16,
                                   top_k=2, moe_ffn_hidden=2048,
                                   kv_heads=16))
  exe = dict(EXE, num_procs=16, tensor_par=1, data_par=16, batch_size=16,
             microbatch_size=1, expert_par=16, expert_par_net=1,
             data_par_net=1)
  ev = evaluate_columns(app, System(H100),
                        ExecutionColumns.from_records([exe]))
  n = 4096 * 2 * 2048 * 2           # tokens x top_k x hidden x bf16
  nets = System(H100).networks
  inter = nets.latency_s[1] + n * 8 / 16 / nets.effective_bw[1]
  intra = nets.latency_s[0] + n * 7 / 16 / nets.effective_bw[0]
  layer = next(l for l in ev.layers if l.name == 'Moe_Dispatch')
  assert np.asarray(layer.ep_time_s()).reshape(-1)[0] == pytest.approx(
    max(inter, intra), rel=1e-9)


def test_network_tiers_have_a_narrower_prior():
  """Network tiers' file values are measured bus bandwidths: by default a
  fit may move them by about a quarter (prior width 0.25 in log), the
  other scales by a factor e (1.0); a width the caller gives holds for
  every scale; overheads keep their own widths."""
  assert C._prior_width('net0', C.PRIOR_SIGMA) == 0.25
  assert C._prior_width('net1', C.PRIOR_SIGMA) == 0.25
  assert C._prior_width('matrix', C.PRIOR_SIGMA) == C.PRIOR_SIGMA == 1.0
  assert C._prior_width('moe', C.PRIOR_SIGMA) == 1.0
  assert C._prior_width('net0', 5.0) == 5.0
  assert C._prior_width('per_step_s', C.PRIOR_SIGMA) == 1.0


def test_a_parameter_must_pay_for_itself():
  """The automatic choice's stopping rule is the Bayesian information
  criterion n ln(RSS / n) + k ln(n) (Schwarz 1978): one more parameter
  must cut the residual sum of squares below exp(-ln(n) / n) of itself,
  16.5 % less for 15 runs, 9.85 % for 34."""
  for n, cut in ((15, 0.1652), (34, 0.0985)):
    assert C.pays_for_itself((cut + 0.002) * 2.0, 2.0, n)
    assert not C.pays_for_itself((cut - 0.002) * 2.0, 2.0, n)
    # The criterion itself: lower with the parameter exactly when it pays.
    for gain in (cut - 0.01, cut + 0.01):
      before = n * math.log(1.0 / n) + 1 * math.log(n)
      after = n * math.log((1.0 - gain) / n) + 2 * math.log(n)
      assert (after < before) == C.pays_for_itself(gain, 1.0, n)
  assert not C.pays_for_itself(0.5, 0.0, 15)
  assert not C.pays_for_itself(0.5, 1.0, 1)


def test_nothing_paying_for_itself_keeps_the_population_centres(
    tmp_path, monkeypatch):
  """When no parameter pays for itself on a cluster's runs, its calibrated
  file carries the other clusters' centres (as cross-validation's folds
  take them: 'pooled prior, own runs fit nothing'), with a note saying
  so; without other clusters there is nothing to write (one-line error)."""
  from calculon.errors import ConfigError
  rows = two_cluster_rows(tmp_path, {'matrix': 0.8, 'net0': 0.8,
                                     'net1': 0.7, 'per_microbatch_s': 0.004})
  suite = P.Suite(ROOT, [write_csv(tmp_path / 'r.csv', rows)])
  prepared = C.prepare(suite)
  others = [r for r in prepared.runs if r.system == 'a100_sxm_80g']
  centre = C.population_centre(others)
  cases = C.select_runs(suite, 'h100_sxm_80g')
  real = C.auto_parameters
  monkeypatch.setattr(
    C, 'auto_parameters', lambda runs, prior, *a, **k: (
      ([], ['none pays']) if runs[0].system != 'a100_sxm_80g'
      else real(runs, prior, *a, **k)))
  result = C.calibrate_system(suite, H100, cases, cv=(), population=others)
  assert result.fit.names == []
  assert centre
  for k, v in centre.items():
    assert result.fit.theta[k] == pytest.approx(v, rel=1e-12), k
  assert result.centre == centre
  assert any('no parameter pays for itself' in n
             for n in result.calibrated['notes'])
  # The written file is the datasheet file with those centres applied.
  assert all(v != 1.0 for v in centre.values())
  assert result.calibrated != H100
  with pytest.raises(ConfigError, match='determine no parameter: none pays'):
    C.calibrate_system(suite, H100, cases, cv=())


def test_moe_host_floor_in_the_surrogate():
  """The MoE host floor (``per_moe_block_s``) is priced exactly by the
  engine and approximately by the surrogate the fit runs on: for the
  model zoo's Qwen3-235B run at TP 4 EP 8 on DGX H100 (29.0 s measured,
  17 s without a floor) a floor of 8 ms a block and microbatch lifts the
  prediction to 26-31 s, the surrogate within 3 % of the engine, and
  the floor's secant over its prior width (10 ms) makes the run
  sensitive to it while a dense run is not."""
  suite = P.Suite(ROOT)
  case = next(c for c in suite.cases if c.id == 'megatron-moe-modelzoo-04')
  cfg = suite.system_json(case)
  run = C.linearize(case, cfg, C.prior_of(cfg), case.measured_s,
                    'h100_sxm_80g')
  theta = dict(C.prior_of(cfg), per_moe_block_s=0.008)
  exact, _ = C.exact_prediction(case, cfg, theta)
  plain, _ = C.exact_prediction(case, cfg, C.prior_of(cfg))
  assert plain < 20 and 26 < exact < 31
  assert C.surrogate_time(run, theta) == pytest.approx(exact, rel=0.03)
  dense = next(c for c in suite.cases if c.id == 'nemo-07')
  dcfg = suite.system_json(dense)
  drun = C.linearize(dense, dcfg, C.prior_of(dcfg), dense.measured_s,
                     'h100_sxm_80g')
  jac = C._data_jacobian([run, drun], ['per_moe_block_s'], C.prior_of(cfg))
  assert jac[0, 0] > 0.1 and jac[1, 0] == 0.0


def test_matrix_scale_stops_at_the_measured_matmul_maximum():
  """Every bundled datasheet file's top matrix step is the measured
  maximum achievable matmul rate (their notes), which no training GEMM
  beats: the matrix scale is bounded at 1 even where the efficiency clamp
  alone would allow 1 / 0.8 = 1.25 (the DGX H100 file's bfloat16 top
  step).  Other scales keep the clamp's bound; the narrow scale keeps the
  product of both within the narrow curve's clamp."""
  top = max(max(e for _, e in d['gflops_efficiency'])
            for d in H100['matrix'].values())
  assert top == 0.8
  assert C.parameter_bounds(H100, 'matrix') == (C.MIN_SCALE, 1.0)
  assert C.parameter_bounds(H100, 'net0')[1] == pytest.approx(
    1 / H100['networks'][0]['efficiency'])
  low = copy.deepcopy(H100)
  for d in low['matrix'].values():
    d['gflops_efficiency'] = [[g, e / 2] for g, e in d['gflops_efficiency']]
  assert C.parameter_bounds(low, 'matrix')[1] == C.MATRIX_SCALE_MAX == 1.0


H100_MEASURED = load_json(repo('systems', 'h100_sxm_80g_measured.json'))


def test_measured_file_refuses_measured_terms_and_bounds_the_new_ones():
  """On a measured file the parameters its tables replace are refused; the
  sustained clock is bounded to [0.8, 1] of the burst, the overlap scale
  keeps the largest processor_usage (0.15 on the bundled files) within
  [0.05, 0.30]: [1/3, 2]."""
  for name in ('matrix', 'matrix_narrow', 'attention', 'net0'):
    with pytest.raises(ConfigError, match='measured'):
      C.parameter_bounds(H100_MEASURED, name)
  assert C.parameter_bounds(H100_MEASURED, 'clock') == (0.8, 1.0)
  lo, hi = C.parameter_bounds(H100_MEASURED, 'overlap')
  assert lo == pytest.approx(0.05 / 0.15) and hi == pytest.approx(2.0)
  with pytest.raises(ConfigError, match='no measured GEMM'):
    C.parameter_bounds(H100, 'clock')
  written = C.apply(H100_MEASURED, {'clock': 0.9, 'overlap': 1.2})
  assert written['measured']['sustained_clock'] == 0.9
  assert [n['processor_usage'] for n in written['networks']] == \
    pytest.approx([0.18, 0.18])
  # the clock is relative to the file's: a file at 0.9 allows [0.889, 1.111]
  lo, hi = C.parameter_bounds(written, 'clock')
  assert (lo, hi) == pytest.approx((0.8 / 0.9, 1 / 0.9))


def test_sustained_clock_divides_table_times():
  """measured.sustained_clock 0.9 makes a table GEMM 1/0.9 longer: H100's
  bf16 8192^3 1.405 ms (docs/accuracy.md) -> 1.561 ms."""
  slow = copy.deepcopy(H100_MEASURED)
  slow['measured']['sustained_clock'] = 0.9
  t = System(H100_MEASURED).measured.gemm_time_s('bfloat16', 8192, 8192,
                                                  8192)
  t9 = System(slow).measured.gemm_time_s('bfloat16', 8192, 8192, 8192)
  assert float(t) == pytest.approx(1.405e-3, rel=2e-3)
  assert float(t9) == pytest.approx(float(t) / 0.9, rel=1e-12)
  a = System(H100_MEASURED).measured.attention_flops_per_s(128, 4096, 32)
  a9 = System(slow).measured.attention_flops_per_s(128, 4096, 32)
  assert float(a9) == pytest.approx(0.9 * float(a), rel=1e-12)


def test_scaled_system_clock_and_overlap_are_the_written_file():
  """The array-valued system prices clock and overlap exactly as the file
  :func:`calibrate.apply` writes (a Megatron-Bridge H100 row with
  overlapped communication)."""
  theta = {'clock': 0.85, 'overlap': 1.5}
  suite = P.Suite(ROOT)
  c = next(x for x in suite.cases if x.id == 'nemo-07')
  cfg = copy.deepcopy(H100_MEASURED)
  exe = M.candidate_columns(c)
  written = evaluate_columns(c.app, System(C.apply(cfg, theta)),
                             exe).total_time_s
  plain = evaluate_columns(c.app, System(cfg), exe).total_time_s
  arrays = {k: np.array([1.0, v]) for k, v in theta.items()}
  both = evaluate_columns(c.app, C.ScaledSystem(cfg, arrays,
                                                ndim=len(exe.shape)),
                          exe).total_time_s
  np.testing.assert_allclose(both[1], written, rtol=1e-5)
  np.testing.assert_allclose(both[0], plain, rtol=1e-12)
  ok = np.isfinite(plain)
  assert np.all(written[ok] > plain[ok])


def test_overlap_usage_slows_the_overlapped_compute_by_hand():
  """A transfer of 2 s hidden behind 10 s of compute at processor_usage
  0.15 costs 0.3 s (hidden_behind: 0 exposed + 2 x 0.15); at 1.5 x that
  usage, 0.45 s; 12 s of transfer behind 10 s: 2 + 10 x 0.15 = 3.5 s."""
  from calculon.llm.layers import hidden_behind
  assert float(hidden_behind(2.0, 10.0, 0.15)) == pytest.approx(0.3)
  assert float(hidden_behind(2.0, 10.0, 0.15 * 1.5)) == pytest.approx(0.45)
  assert float(hidden_behind(12.0, 10.0, 0.15)) == pytest.approx(3.5)
  nets = C._ScaledNetworks(System(H100_MEASURED).networks, [1.0, 1.0])
  nets.usage_scale = 1.5
  assert float(nets.usage(0)) == pytest.approx(0.225)


def test_overlap_is_tried_only_on_measured_files():
  """The automatic choice leaves ``overlap`` out on datasheet files (the
  matrix scale carries it there; defaults unchanged)."""
  run = C.Run(case=None, system='s', cfg=H100, measured_s=1.0, lin={},
              names=[], times=np.ones((1, 1)), nmb=np.ones(1), layer=False)
  assert 'overlap' in C.available([run], ['overlap'])
  names = C.auto_candidates([run])
  assert 'overlap' not in names and 'clock' not in names
  assert 'matrix' in names
  measured = C.Run(case=None, system='s', cfg=H100_MEASURED, measured_s=1.0,
                   lin={}, names=[], times=np.ones((1, 1)), nmb=np.ones(1))
  names = C.auto_candidates([measured])
  assert 'overlap' in names and 'clock' in names and 'matrix' not in names
