"""Snapshot of what the model answers (benchmarks/snapshot.py): every
published row's resolved execution, prediction and memory, and the README
search's counts and top 5, as tests/data/snapshot.json.gz recorded them.
A move of code changes none of them; a change that moves a number on
purpose writes the snapshot again and records why in docs/changelog.md."""

import gzip
import json
import os
import sys

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, 'benchmarks'))
import snapshot  # noqa: E402

SNAPSHOT = os.path.join(ROOT, 'tests', 'data', 'snapshot.json.gz')


def test_published_rows_and_the_readme_search_are_unchanged():
  with gzip.open(SNAPSHOT, 'rt', encoding='utf-8') as f:
    old = json.load(f)
  new = json.loads(json.dumps({'published': snapshot.published(),
                               'search': snapshot.search('a')}))
  lines = snapshot.diff(old, new)
  assert not lines, '\n'.join(lines[:20])
