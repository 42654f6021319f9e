"""Every llm-validation table names the system files it priced on
(issue 45): the datasheet and the calibrated runs can be told apart."""

import csv

from conftest import repo, run_cli


def test_published_tables_name_datasheet_or_calibrated_files(tmp_path):
  # Three rows of Narayanan et al. 2021 (A100 SXM 80 GB).
  with open(repo('validation', 'published_runs.csv'), newline='') as f:
    rows = list(csv.reader(f))
  runs = tmp_path / 'runs.csv'
  with open(runs, 'w', newline='') as f:
    csv.writer(f).writerows(rows[:4])
  out = {}
  for mode in ('datasheet', 'calibrated'):
    args = ['llm-validation', '--suite', 'published', '--runs', runs,
            '--out', tmp_path / mode]
    res = run_cli(*(args + (['--calibrated'] if mode == 'calibrated'
                            else [])))
    assert res.returncode == 0, res.stderr
    out[mode] = res.stdout + res.stderr
  ds, cal = 'a100_sxm_80g_datasheet.json (datasheet)', \
    'a100_sxm_80g.json (calibrated)'
  assert f'Priced on (systems/): {ds}' in out['datasheet']
  assert cal not in out['datasheet']
  assert f'Priced on (systems/): {cal}' in out['calibrated']
  assert ds not in out['calibrated']
  table = (tmp_path / 'calibrated' / 'published_runs_results.csv').read_text()
  assert table.count(cal) == 3


def test_seqsel_tables_name_their_files():
  res = run_cli('llm-validation')
  assert res.returncode == 0, res.stderr
  text = res.stdout + res.stderr
  assert text.count('-- priced on systems/a100_80e.json (datasheet)') == 3
  assert 'Table 5: iteration time (s) -- priced on systems/a100_80g.json ' \
    '(datasheet)' in text
