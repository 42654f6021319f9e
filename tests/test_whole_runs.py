"""llm-validation --suite whole-runs: complete pretraining runs priced from
the step to GPU-hours, days and energy (calculon.validation.whole_runs)."""

import csv
import filecmp
import json
import os

import pytest

from calculon.validation import whole_runs as W
from conftest import ROOT, SHARED, run_cli

BUNDLED = os.path.join(ROOT, 'validation', 'whole_runs.csv')


@pytest.fixture(scope='module')
def frame():
  """The suite as `calculon llm-validation --suite whole-runs` prices it:
  on the bundled default system files (calibrated on published step rows,
  none of them a whole run)."""
  from calculon.cli.validation import calibrated_systems
  suite = W.Suite(ROOT)
  suite.systems = calibrated_systems(ROOT, suite)
  return W.results_frame(W.run_suite(suite, workers=2))


def test_bundled_file_is_the_shared_one():
  shared = os.path.join(SHARED, 'measurements', 'whole_runs.csv')
  if not os.path.exists(shared):
    pytest.skip('../shared is absent')
  assert filecmp.cmp(shared, BUNDLED, shallow=False)


def test_rows_priced_and_flagged(frame):
  ok = frame[frame['status'] == 'ok'].set_index('id')
  # Rows with a shape, tokens and a published figure are priced...
  for rid in ('llama1-7b', 'llama1-65b', 'llama2-70b', 'llama3.1-405b',
              'opt-175b', 'nemotron-4-15b'):
    assert rid in ok.index, rid
  # ... with the layout the row states, or searched and said so.
  assert ok.loc['llama3.1-405b', 'layout'].startswith('8/16/128 (stated)')
  assert ok.loc['llama1-65b', 'layout'].endswith('(searched)')
  assert 'layout=searched' in ok.loc['llama1-65b', 'assumptions']
  # The GPU count and batch the LLaMA 7B row leaves out are assumed, with
  # the source.
  assert 'gpus=2048' in ok.loc['llama1-7b', 'assumptions']
  assert 'LLaMA (arXiv 2302.13971) Table 2' in \
    ok.loc['llama1-7b', 'assumptions']
  # What cannot be priced says why.
  no = frame[frame['status'] != 'ok'].set_index('id')
  assert 'tokens_trained not stated' in no.loc['bloom-176b', 'reason']
  # Rows whose shape only a bundled model file gives are priced from it
  # (models/llama2-34B.json, models/olmo2-7B.json, models/olmo2-13B.json),
  # and the GPU count the gpu_type text states ('160 nodes x 8') is
  # flagged as assumed.
  for rid in ('llama2-34b', 'olmo2-7b', 'olmo2-13b'):
    assert rid in ok.index, rid
  assert 'num_blocks=48' in ok.loc['llama2-34b', 'assumptions']
  assert 'gpus=1280' in ok.loc['olmo2-13b', 'assumptions']
  assert 'GPU count not stated' in no.loc['olmo-7b', 'reason']
  assert set(W.summary(frame)) >= {'gpu_hours', 'wall_days', 'energy'}


def test_the_whole_run_layer_at_the_published_step_rate(frame):
  """GPU-hours and days from the step rate each source publishes (LLaMA's
  380 tokens/s/GPU, Llama 3's 41 % MFU at 16,384 GPUs, OPT's 147 TFLOP/s,
  Nemotron-4's 30.5 % MFU) divided by the predicted goodput: the
  interruption, checkpoint and restart model alone."""
  s = W.summary(frame)
  assert s['gpu_hours_at_published_rate']['n'] >= 3
  assert s['gpu_hours_at_published_rate']['median_abs_error_pct'] <= 20
  assert s['wall_days_at_published_rate']['median_abs_error_pct'] <= 20
  row = frame.set_index('id').loc['llama3.1-405b']
  assert row['pub_rate'] == 'MFU 41%'
  assert abs(row['err_rate_gpu_hours_pct']) <= 5


def test_gpu_hours_median_error_within_20_percent(frame):
  """Issue 35's target on the default files: the median |error| of the
  predicted GPU-hours against the published ones is at most 20 % (18.3 %
  over 10 rows at this commit; docs/accuracy.md section 4)."""
  s = W.summary(frame)['gpu_hours']
  assert s['n'] == 10
  assert s['median_abs_error_pct'] <= 20


def test_searched_rows_take_the_rules_of_their_source(frame):
  """A row without a layout is searched under the conventions' framework
  and its source's era (LLaMA, arXiv 2302.13971, February 2023: before
  Transformer Engine's tiled TP overlap, April 2023); OPT (arXiv
  2205.01068) is priced with FSDP, its parallelism text's 'FSDP +
  Megatron-LM tensor parallelism', without FlashAttention (arXiv
  2205.14135) or sequence parallelism (arXiv 2205.05198)."""
  rows = frame.set_index('id')
  llama = rows.loc['llama1-65b']
  assert json.loads(llama['execution'])['framework'] == 'common'
  assert json.loads(llama['execution'])['tensor_par_overlap'] == 'none'
  assert 'reported before tiled TP communication overlap' in \
    llama['assumptions']
  opt = json.loads(rows.loc['opt-175b', 'execution'])
  assert opt['data_par_sharding'] == 'parameters'
  assert opt['attention_kernel'] == 'standard'
  assert opt['tensor_par_comm_type'] in ('ar', 'p2p_rs_ag')


def test_parse_layout():
  text = ('4D [TP,CP,PP,DP(FSDP)]: 8,192 GPUs TP8/CP1/PP16/DP64; 16,384 GPUs '
          'TP8/CP1/PP16/DP128; 16,384 GPUs TP8/CP16/PP16/DP4 (131,072 seq)')
  assert W.parse_layout(text, 16384) == (8, 16, 128, 1)
  assert W.parse_layout(text, 8192) == (8, 16, 64, 1)
  assert W.parse_layout('TP4 / PP12 / DP8 (one replica = 48 GPUs), ZeRO-1',
                        384) == (4, 12, 8, None)
  assert W.parse_layout('FSDP + Megatron-LM tensor parallelism (8x TP stated '
                        'for the 11.xx lineage)', 992) == (8, None, None,
                                                            None)
  assert W.parse_layout('model + sequence parallelism; degrees not stated',
                        2048) == (None, None, None, None)


def _one_row(tmp_path, rid):
  with open(BUNDLED, newline='') as fd:
    rows = [r for r in csv.DictReader(fd) if r['id'] == rid]
  path = tmp_path / 'runs.csv'
  with open(path, 'w', newline='') as fd:
    writer = csv.DictWriter(fd, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
  return path


def test_cli_runs_and_outputs(tmp_path):
  runs = _one_row(tmp_path, 'nemotron-4-15b')
  out = tmp_path / 'out'
  res = run_cli('llm-validation', '--suite', 'whole-runs', '--runs', runs,
                '--out', out, '--plot', tmp_path / 'plots')
  assert res.returncode == 0, res.stderr
  assert 'nemotron-4-15b' in res.stdout and 'days' in res.stdout
  summary = json.loads((out / 'whole_runs_summary.json').read_text())
  assert summary['priced'] == 1 and summary['wall_days']['n'] == 1
  assert (out / 'whole_runs_results.csv').exists()
  assert (tmp_path / 'plots' / 'whole_runs_gpu_hours.png').exists()


def test_cli_bad_runs_file(tmp_path):
  bad = tmp_path / 'bad.csv'
  bad.write_text('model,source\nx,y\n')
  for path, fragment in ((bad, 'missing column(s) seq_len'),
                         (tmp_path / 'none.csv', 'no such file')):
    res = run_cli('llm-validation', '--suite', 'whole-runs', '--runs', path)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], lines


def test_cli_default_files_and_datasheet(tmp_path):
  """The suite prices on the bundled default files (the calibrated DGX
  H100 file for Nemotron-4's H100s); --datasheet on the datasheet file,
  whose step is faster (the calibrated file's network and MoE terms are
  fitted to measured runs) -- and the two are mutually exclusive with
  --calibrated, one line and exit 2."""
  runs = _one_row(tmp_path, 'nemotron-4-15b')
  steps = {}
  for flag in ((), ('--datasheet',)):
    out = tmp_path / ('out' + '_'.join(flag))
    res = run_cli('llm-validation', '--suite', 'whole-runs', '--runs', runs,
                  '--out', out, *flag)
    assert res.returncode == 0, res.stderr
    said = 'Datasheet systems' if flag else \
      'Calibrated systems (the defaults): systems/h100_sxm_80g.json'
    assert said in res.stdout
    with open(out / 'whole_runs_results.csv', newline='') as fd:
      steps[flag] = float(next(csv.DictReader(fd))['step_s'])
  assert steps[('--datasheet',)] < steps[()]
  res = run_cli('llm-validation', '--suite', 'whole-runs', '--runs', runs,
                '--calibrated', '--datasheet')
  assert res.returncode == 2
  assert 'not allowed with argument' in res.stderr
