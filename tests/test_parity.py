"""Parity with Calculon's outputs (../shared/reference/golden.json.gz).

Every case: the same success or failure, the same kind of failure (invalid
input -> ConfigError, infeasible -> Llm.Error with the same message), and
every statistic and per-layer statistic within a relative 1e-9.  The batch
API must give the same numbers as the single-run API.
"""

import collections
import json
import math

import numpy as np
import pandas as pd
import pytest

from calculon import ConfigError, System
from calculon.llm import Llm, evaluate
from conftest import repo

RTOL = 1e-9


def parity_ignored():
  """Statistics docs/differences-from-calculon.md excludes from parity."""
  with open(repo('docs', 'differences-from-calculon.md')) as fd:
    for line in fd:
      if line.startswith('parity-ignore:'):
        return set(x.strip() for x in line.split(':', 1)[1].split(','))
  return set()


IGNORED = parity_ignored()


def close(a, b):
  if isinstance(a, bool) or isinstance(b, bool):
    return bool(a) == bool(b)
  if isinstance(a, str) or isinstance(b, str):
    return a == b
  if a is None or b is None:
    return a is None and b is None
  a, b = float(a), float(b)
  if math.isnan(a) or math.isnan(b):
    return math.isnan(a) and math.isnan(b)
  return abs(a - b) <= 1e-12 + RTOL * max(abs(a), abs(b))


def run_single(golden, case):
  app = Llm.Application(golden['applications'][case['application']])
  system = System(golden['systems'][case['system']])
  exe = Llm.Execution.from_json(case['execution'])
  model = Llm(app)
  model.compile(system, exe)
  model.run(system)
  return model.get_stats_json('layers' in case.get('stats', {}))


@pytest.fixture(scope='module')
def single_runs(golden):
  """case id -> (stats, None) or (None, exception), each case run once."""
  out = {}
  for case in golden['cases']:
    try:
      out[case['id']] = (run_single(golden, case), None)
    except (ConfigError, Llm.Error) as ex:
      out[case['id']] = (None, ex)
  return out


def test_every_golden_case_matches(golden, single_runs):
  mismatches = collections.Counter()
  examples = []
  for case in golden['cases']:
    got, err = single_runs[case['id']]
    if not case['ok']:
      want = ConfigError if case['error_kind'] == 'invalid' else Llm.Error
      if not isinstance(err, want):
        mismatches['failure kind'] += 1
        examples.append((case['id'], case['error'], repr(err)))
      elif want is Llm.Error and not (
          str(err) == case['error'] or str(err).startswith(case['error'] + ' (')):
        mismatches['message'] += 1
        examples.append((case['id'], case['error'], str(err)))
      continue
    if err is not None:
      mismatches['raised'] += 1
      examples.append((case['id'], repr(err)))
      continue
    for key, want in case['stats'].items():
      if key in IGNORED:
        continue
      if key == 'layers':
        assert len(got['layers']) == len(want)
        for gl, wl in zip(got['layers'], want):
          for lk, lv in wl.items():
            if not close(gl.get(lk), lv):
              mismatches['layers.' + lk] += 1
        continue
      if not close(got.get(key), want):
        mismatches[key] += 1
        examples.append((case['id'], key, got.get(key), want))
  assert not mismatches, (dict(mismatches), examples[:5])


def test_golden_has_layers_and_all_kinds(golden):
  """The golden set exercises what the test above claims to check."""
  kinds = collections.Counter(
    (c['ok'], c.get('error_kind')) for c in golden['cases'])
  assert kinds[(True, None)] > 1000
  assert kinds[(False, 'model')] > 1000
  assert kinds[(False, 'invalid')] > 100
  assert sum('layers' in c.get('stats', {}) for c in golden['cases']) > 100


def test_batch_api_equals_single_run_and_reference(golden, single_runs):
  """evaluate() on DataFrames of all valid golden cases, grouped by
  application and system, equals the reference and the single-run API."""
  groups = collections.defaultdict(list)
  for case in golden['cases']:
    if case['ok'] or case['error_kind'] == 'model':
      groups[(case['application'], case['system'])].append(case)
  checked = 0
  for (app_name, sys_name), cases in groups.items():
    frame = pd.DataFrame([c['execution'] for c in cases])
    out = evaluate(golden['applications'][app_name],
                   golden['systems'][sys_name], frame)
    assert len(out) == len(cases)
    for row, case in zip(out.itertuples(index=False), cases):
      row = row._asdict()
      assert row['feasible'] == case['ok'], case['id']
      if not case['ok']:
        assert row['reason'].startswith(case['error']), case['id']
        continue
      single = single_runs[case['id']][0]
      for key, want in case['stats'].items():
        if key == 'layers' or key in IGNORED:
          continue
        got = row[key]
        if want is None:
          assert np.isnan(got), (case['id'], key)
          continue
        assert close(got, want), (case['id'], key, got, want)
        s = single[key]
        assert got == s or close(got, s) and abs(got - s) <= 1e-15 * abs(s), (
          case['id'], key, got, s)
      checked += 1
  assert checked > 1000


def test_ignored_statistics_are_exactly_the_recompute_ones():
  assert IGNORED == {'block_re_flops', 'block_re_flops_time',
                     'block_re_mem_accessed', 'block_re_mem_time'}


def test_recompute_statistics_are_the_recomputed_layers(golden, single_runs):
  """The corrected recompute statistics: the forward cost of the recomputed
  layers -- all of them with full recomputation, none without -- and never
  above Calculon's running-total values."""
  pairs = (('block_re_flops', 'block_fw_flops'),
           ('block_re_flops_time', 'block_fw_flops_time'),
           ('block_re_mem_accessed', 'block_fw_mem_accessed'),
           ('block_re_mem_time', 'block_fw_mem_time'))
  seen = collections.Counter()
  for case in golden['cases']:
    if not case['ok']:
      continue
    exe = case['execution']
    got = single_runs[case['id']][0]
    mode = exe['activation_recompute'] if exe['training'] else 'inference'
    for re_key, fw_key in pairs:
      assert got[re_key] <= case['stats'][re_key] * (1 + RTOL), case['id']
      if mode == 'full' and (exe['tensor_par'] == 1 or
                             exe['tensor_par_overlap'] != 'none'):
        # No separate TP communication layer: every layer is recomputed.
        assert close(got[re_key], got[fw_key]), (case['id'], re_key)
      elif mode == 'full':
        # All but the TP collectives, which are re-communicated instead.
        assert 0.5 * got[fw_key] < got[re_key] <= got[fw_key], case["id"]
      elif mode in ('none', 'inference'):
        assert got[re_key] == 0 or (
          re_key.endswith(('mem_accessed', 'mem_time')) and
          exe['seq_par_ag_redo']), (case['id'], re_key)
      else:
        assert 0 < got[re_key] < got[fw_key], (case['id'], re_key)
    seen[mode] += 1
  assert min(seen.values()) > 50, seen


def _write_case_files(golden, case, folder):
  paths = []
  for name, data in (('app.json', golden['applications'][case['application']]),
                     ('exe.json', case['execution']),
                     ('sys.json', golden['systems'][case['system']])):
    path = folder / name
    path.write_text(json.dumps(data))
    paths.append(str(path))
  return paths


def test_cli_exits_2_for_every_invalid_case_and_1_when_infeasible(
    golden, tmp_path, capsys):
  """Through the command line (in-process entry point): every invalid
  golden case exits 2 with one 'calculon: error:' line, infeasible ones
  exit 1 with Calculon's message."""
  from calculon.cli.main import main
  invalid = [c for c in golden['cases'] if c.get('error_kind') == 'invalid']
  infeasible = [c for c in golden['cases']
                if c.get('error_kind') == 'model'][:100]
  for case in invalid + infeasible:
    app, exe, sys_ = _write_case_files(golden, case, tmp_path)
    code = main(['llm', app, exe, sys_, '-'])
    out, err = capsys.readouterr()
    if case['error_kind'] == 'invalid':
      assert code == 2, case['id']
      assert err.startswith('calculon: error: ') and err.count('\n') == 1
    else:
      assert code == 1, case['id']
      assert out.startswith('ERROR: ' + case['error'])


def test_cli_subprocess_for_some_invalid_cases(golden, tmp_path):
  from conftest import run_cli
  seen = set()
  for case in golden['cases']:
    if case.get('error_kind') != 'invalid' or case['error'] in seen:
      continue
    seen.add(case['error'])
    res = run_cli('llm', *_write_case_files(golden, case, tmp_path), '-')
    assert res.returncode == 2, (case['id'], res.stderr)
    assert 'Traceback' not in res.stderr
  assert len(seen) >= 5
