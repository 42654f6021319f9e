"""Search results: re-pricing the best executions and writing result files.

The best executions of a search are priced again through the single-run API
(:class:`~calculon.llm.Llm`), so the statistics written are exactly those of
``calculon llm`` for that execution; the sample rate found by the search must
agree with it (checked).
"""

import gzip
import math
import os

from calculon import io
from calculon.errors import ConfigError
from calculon.llm import search as S
from calculon.llm.compat import Llm


def best_to_output(spec, result, layers=False):
  """Calculon's output structure: {'0': {'execution': ..., 'stats': ...}}.

  Raises:
    RuntimeError: a re-priced sample rate disagrees with the search (an
      internal inconsistency, never expected).
  """
  output = {}
  for rank, (rate, gi, flat) in enumerate(result.best):
    record = S.execution_record(spec, result.groups[gi], flat)
    model = Llm(Llm.Application(spec.app))
    model.compile(spec.system, Llm.Execution.from_json(record))
    model.run(spec.system)
    stats = model.get_stats_json(layers)
    if not math.isclose(stats['sample_rate'], rate, rel_tol=1e-12):
      raise RuntimeError(f'search and single run disagree for {record}: '
                         f"{rate} vs {stats['sample_rate']}")
    output[str(rank)] = {'execution': record, 'stats': stats}
  return output


def write_best(output, filename, partial=False):
  """Writes best executions as JSON (Calculon's structure) or CSV (index,
  execution fields, statistics).  Partial results get ``partial: true`` in
  each JSON entry, or a ``partial`` CSV column."""
  if partial:
    for entry in output.values():
      entry['partial'] = True
  if io.is_json_extension(filename):
    io.write_json_file(output, filename)
    return
  import pandas as pd
  rows = []
  for key, entry in output.items():
    row = dict(entry['execution'])
    row.update({k: v for k, v in entry['stats'].items() if k != 'layers'})
    if partial:
      row['partial'] = True
    rows.append(row)
  frame = pd.DataFrame(rows, index=list(output.keys()))
  _atomic_csv(frame, filename, index=True)


def _atomic_csv(frame, filename, index):
  tmp = filename + '.tmp'
  frame.to_csv(tmp, index=index, compression='gzip'
               if filename.endswith('.gz') else None)
  os.replace(tmp, filename)


class TableWriter:
  """Streams row chunks to .csv, .csv.gz or .parquet (pyarrow writers).

  Use as a context manager; :meth:`write` takes a dict of equal-length 1-d
  arrays with the same columns each time.  Rows already written stay
  readable if the run is interrupted.

  Raises:
    ConfigError: unsupported file extension.
  """

  def __init__(self, filename):
    if not (io.is_csv_extension(filename) or filename.endswith('.parquet')):
      raise ConfigError(f'{filename}: output must be *.csv, *.csv.gz or '
                        '*.parquet', source=filename)
    self.filename = filename
    self._sink = None
    self._writer = None
    self._schema = None

  def __enter__(self):
    return self

  def _open(self, schema):
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq
    self._schema = schema
    if self.filename.endswith('.parquet'):
      self._writer = pq.ParquetWriter(self.filename, schema)
      return
    if self.filename.endswith('.gz'):
      # Level 1: several times faster than the default for ~25% more bytes.
      self._sink = gzip.open(self.filename, 'wb', compresslevel=1)
    else:
      self._sink = pa.OSFile(self.filename, 'wb')
    self._writer = pacsv.CSVWriter(self._sink, schema)

  def write(self, columns):
    import pyarrow as pa
    if not columns:
      return
    table = pa.table({name: _arrow(arr) for name, arr in columns.items()})
    if self._writer is None:
      self._open(table.schema)
    self._writer.write_table(table.cast(self._schema))

  def __exit__(self, *exc):
    if self._writer is not None:
      self._writer.close()
    if self._sink is not None:
      self._sink.close()
    if self._writer is None:
      # Nothing feasible: still write a readable (empty) file.
      open(self.filename, 'wb').close() if not self.filename.endswith(
        '.parquet') else _empty_parquet(self.filename)
    return False


def _arrow(values):
  import numpy as np
  import pyarrow as pa
  arr = np.asarray(values)
  if arr.dtype == object:
    return pa.array(arr.tolist(), type=pa.string())
  return pa.array(arr)


def _empty_parquet(filename):
  import pyarrow as pa
  import pyarrow.parquet as pq
  pq.write_table(pa.table({}), filename)
