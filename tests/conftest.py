"""Shared fixtures: paths, the reference's golden data, a CLI runner."""

import csv
import gzip
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(ROOT, '..', 'shared')
GOLDEN = os.path.join(SHARED, 'reference', 'golden.json.gz')


def repo(*parts):
  """Path inside the repository."""
  return os.path.join(ROOT, *parts)


@pytest.fixture(scope='session')
def golden():
  """The reference's outputs (skips when ../shared is absent)."""
  if not os.path.exists(GOLDEN):
    pytest.skip(f'reference data not found at {GOLDEN}')
  with gzip.open(GOLDEN, 'rt') as fd:
    doc = json.load(fd)
  if 'applications' not in doc:
    with open(os.path.join(SHARED, 'reference', 'configs.json')) as fd:
      cfg = json.load(fd)
    doc['applications'], doc['systems'] = cfg['applications'], cfg['systems']
  return doc


def run_cli(*args, cwd=ROOT, timeout=300):
  """Runs ``python -m calculon ARGS`` in a subprocess."""
  env = dict(os.environ)
  env['PYTHONPATH'] = ROOT + os.pathsep + env.get('PYTHONPATH', '')
  return subprocess.run([sys.executable, '-m', 'calculon', *map(str, args)],
                        cwd=cwd, capture_output=True, text=True,
                        timeout=timeout, env=env)


def load_json(path):
  with open(path) as fd:
    return json.load(fd)


def assert_png(path, min_bytes=10_000):
  """The file is a PNG that opens, is not tiny, and is not blank."""
  import matplotlib.image as mpimg
  import numpy as np
  assert os.path.getsize(path) > min_bytes, path
  with open(path, 'rb') as fd:
    assert fd.read(8) == b'\x89PNG\r\n\x1a\n', path
  image = mpimg.imread(path)
  assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
  colors = np.unique(image.reshape(-1, image.shape[2]).round(2), axis=0)
  assert len(colors) > 20, f'{path}: looks blank ({len(colors)} colors)'


def unknown_source_row(**fields):
  """A published-runs row of a source no convention names (an 'Acme
  Labs' 16-GPU run of a 16-layer, 2,048-wide model at TP 2), every other
  column blank; ``fields`` override or add columns."""
  from calculon.validation import mapping
  row = {k: '' for k in mapping.FACT_COLUMNS}
  row.update(source='Acme Labs 2027 training report', model_name='Acme-7',
             num_layers='16', hidden='2048', attn_heads='16', num_gpus='16',
             tp='2', pp='1', global_batch_size='64')
  row.update(fields)
  return row


def write_csv(path, rows):
  """Writes ``rows`` (dicts with the same keys) as a CSV file; returns the
  path as a string."""
  with open(path, 'w', newline='') as fd:
    writer = csv.DictWriter(fd, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
  return str(path)
