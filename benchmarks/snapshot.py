#!/usr/bin/env python3
"""Snapshot of what the model answers, to prove that a move changed nothing.

Writes (``--write FILE``) or compares with (``--check FILE``) a JSON
snapshot of

* every published row (the bundled runs files, validation/unseen_runs.csv,
  unseen_tuned_runs.csv and unseen_mlperf_runs.csv,
  uncalibrated and with the calibrated files): its status, predicted and
  slowest times, memory, the candidates priced, and the chosen execution
  *as ``calculon llm`` resolves it* (every field, after the framework
  preset);
* every ``benchmarks/search.py`` case (or those of ``--only``): the counts
  the search logs and its top 5, each resolved the same way with its
  sample rate and batch time.

Usage (from the repository root):

  python benchmarks/snapshot.py --write out/snapshot.json [--only ab]
  python benchmarks/snapshot.py --check out/snapshot.json [--only ab]

tests/data/snapshot.json.gz (published rows and search (a)) is the one the
test suite checks (tests/test_snapshot.py): a change that moves a number
on purpose writes it again with ``--write tests/data/snapshot.json.gz
--only a`` and says so in docs/changelog.md.

``--check`` prints each difference and exits 1 if there is one.  Numbers
must agree to 1e-12 relative (the moves may reorder floating-point sums);
everything else exactly.
"""

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, 'benchmarks'))

REL = 1e-12


def resolved(record, app=None):
  """Every field of an execution record as ``calculon llm`` reads it
  (after its framework preset, when the record names one)."""
  import dataclasses
  from calculon.config import Application, Execution
  exe = Execution.from_dict(dict(record), '<snapshot>')
  if 'framework' in record and app is not None:
    from calculon.frameworks import resolve_execution
    if not isinstance(app, Application):
      app = Application.from_dict(app)
    exe, _ = resolve_execution(app, exe, source='<snapshot>')
  out = dataclasses.asdict(exe)
  out.pop('written', None)
  out.pop('filled', None)
  out.pop('framework', None)
  return out


def published():
  from calculon.validation import published as P
  from calculon.validation import default_base_dir
  from calculon.cli.validation import calibrated_systems
  base = default_base_dir()
  out = {}
  paths = {'bundled': None,
           'unseen': [os.path.join(base, 'validation', 'unseen_runs.csv')],
           'unseen_tuned': [os.path.join(base, 'validation',
                                         'unseen_tuned_runs.csv')],
           'unseen_mlperf': [os.path.join(base, 'validation',
                                          'unseen_mlperf_runs.csv')]}
  for label, runs in paths.items():
    suite = P.Suite(base, runs)
    for calibrated in (False, True):
      systems = calibrated_systems(base, suite) if calibrated else None
      for r in P.run_suite(suite, systems=systems):
        key = f"{label}{'/calibrated' if calibrated else ''}/{r.case.id}"
        out[key] = {
          'status': r.status, 'predicted_s': r.predicted_s,
          'slowest_s': r.slowest_s, 'tried': r.tried,
          'mem_gib': r.predicted_mem_gib, 'over_memory': r.over_memory,
          'reason': r.reason,
          'execution': None if r.execution is None else resolved(
            r.execution, r.case.priced_app),
          'assumptions': r.case.assumptions_text(),
        }
  return out


def search(only):
  import search as bench
  out = {}
  for key in sorted(bench.CASES):
    if only and key not in only:
      continue
    _, args = bench.CASES[key]
    with tempfile.TemporaryDirectory() as tmp:
      output = os.path.join(tmp, 'best.json')
      log = os.path.join(tmp, 'log.txt')
      cmd = [sys.executable, '-m', 'calculon', '-l', log,
             'llm-optimal-execution', args[0], *args[1:5], output,
             *args[5:], '-q', '-c', '1']
      subprocess.run(cmd, cwd=ROOT, check=True)
      with open(log) as f:
        text = f.read()
      with open(output) as f:
        best = json.load(f)
    counts = {}
    for name in ('Total executions', 'Good executions', 'Bad executions'):
      m = re.search(rf'{name}: (\d+)', text)
      counts[name] = int(m.group(1)) if m else None
    m = re.search(r'Executions in the space: (\d+)', text)
    counts['space'] = int(m.group(1)) if m else None
    tops = []
    for i in sorted(best, key=int):
      entry = best[i]
      import json as _json
      with open(os.path.join(ROOT, args[0])) as f:
        app = _json.load(f)
      tops.append({'execution': resolved(entry['execution'], app),
                   'sample_rate': entry['stats']['sample_rate'],
                   'batch_time': entry['stats'].get('total_time',
                                                    entry['stats'].get(
                                                      'block_fw_time'))})
    out[key] = {'counts': counts, 'best': tops}
    print(f'search ({key}): {counts}', file=sys.stderr)
  return out


def _open(path, mode):
  """A snapshot file, gzip-compressed when its name ends in .gz."""
  if path.endswith('.gz'):
    import gzip
    return gzip.open(path, mode + 't', encoding='utf-8')
  return open(path, mode, encoding='utf-8')


def _absent_new_field(path, name, value):
  """An execution field the snapshot predates, at the value its absence
  means: nothing the snapshot recorded changes."""
  if not path.endswith('/execution'):
    return False
  from calculon.config import registry
  f = registry.FIELDS['execution'].get(name)
  return f is not None and not f.required and value == f.absent


def diff(a, b, path=''):
  """Differences between two snapshots, as text lines."""
  out = []
  if isinstance(a, dict) and isinstance(b, dict):
    for k in sorted(set(a) | set(b)):
      if k not in a and _absent_new_field(path, k, b[k]):
        continue
      if k not in a:
        out.append(f'{path}/{k}: new {b[k]!r}'[:300])
      elif k not in b:
        out.append(f'{path}/{k}: gone (was {a[k]!r})'[:300])
      else:
        out += diff(a[k], b[k], f'{path}/{k}')
  elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
    for i, (x, y) in enumerate(zip(a, b)):
      out += diff(x, y, f'{path}[{i}]')
  elif isinstance(a, float) and isinstance(b, float) and not (
      isinstance(a, bool) or isinstance(b, bool)):
    if not (a == b or (math.isnan(a) and math.isnan(b)) or
            abs(a - b) <= REL * max(abs(a), abs(b))):
      out.append(f'{path}: {a!r} -> {b!r}')
  elif a != b:
    out.append(f'{path}: {a!r} -> {b!r}'[:300])
  return out


def main():
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  group = ap.add_mutually_exclusive_group(required=True)
  group.add_argument('--write', metavar='FILE')
  group.add_argument('--check', metavar='FILE')
  ap.add_argument('--only', default=None,
                  help='search cases to run (letters of benchmarks/search.py;'
                  " default all); 'none' for none")
  ap.add_argument('--no-published', action='store_true')
  args = ap.parse_args()
  only = '' if args.only == 'none' else args.only
  snap = {}
  if not args.no_published:
    snap['published'] = published()
  if only != '':
    snap['search'] = search(only)
  if args.write:
    os.makedirs(os.path.dirname(os.path.abspath(args.write)), exist_ok=True)
    with _open(args.write, 'w') as f:
      json.dump(snap, f, indent=1, sort_keys=True)
    print(f'wrote {args.write}: {len(snap.get("published", {}))} rows, '
          f'{len(snap.get("search", {}))} searches')
    return 0
  with _open(args.check, 'r') as f:
    old = json.load(f)
  old = {k: v for k, v in old.items() if k in snap}
  if 'search' in old:
    old['search'] = {k: v for k, v in old['search'].items()
                     if k in snap['search']}
  lines = diff(old, json.loads(json.dumps(snap)))
  for line in lines:
    print(line)
  print(f'{len(lines)} difference(s)')
  return 1 if lines else 0


if __name__ == '__main__':
  sys.exit(main())
