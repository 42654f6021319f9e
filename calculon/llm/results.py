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
  """Streams row chunks to .csv, .csv.gz or .parquet.

  Use as a context manager; :meth:`write` takes a dict of equal-length 1-d
  arrays.  Rows already written stay readable if the run is interrupted.

  Raises:
    ConfigError: unsupported file extension.
  """

  def __init__(self, filename):
    if not (io.is_csv_extension(filename) or filename.endswith('.parquet')):
      raise ConfigError(f'{filename}: output must be *.csv, *.csv.gz or '
                        '*.parquet', source=filename)
    self.filename = filename
    self._fd = None
    self._parquet = None
    self._header = True
    self._empty = None

  def __enter__(self):
    if self.filename.endswith('.parquet'):
      return self
    self._fd = gzip.open(self.filename, 'wt', newline='') \
      if self.filename.endswith('.gz') else open(self.filename, 'w',
                                                 newline='')
    return self

  def write(self, columns):
    import pandas as pd
    if not columns:
      return
    frame = pd.DataFrame(columns)
    if self._fd is not None:
      if len(frame) or self._header:
        frame.to_csv(self._fd, index=False, header=self._header)
        self._header = False
      return
    import pyarrow as pa
    import pyarrow.parquet as pq
    if not len(frame):
      self._empty = frame
      return
    table = pa.Table.from_pandas(frame, preserve_index=False)
    if self._parquet is None:
      self._parquet = pq.ParquetWriter(self.filename, table.schema)
    self._parquet.write_table(table.cast(self._parquet.schema))

  def __exit__(self, *exc):
    if self._fd is not None:
      self._fd.close()
    if self._parquet is not None:
      self._parquet.close()
    elif self.filename.endswith('.parquet') and self._empty is not None:
      self._empty.to_parquet(self.filename, index=False)
    return False

