"""Search results: re-pricing the best executions and writing result files.

The best executions of a search are priced again through the single-run API
(:class:`~calculon.llm.Llm`), so the statistics written are exactly those of
``calculon llm`` for that execution; the sample rate found by the search must
agree with it (checked).
"""

import gzip
import math

from calculon import io, outputs
from calculon.errors import ConfigError
from calculon.llm.compat import Llm
from calculon.report import binding
from calculon.search.grid import execution_record


def best_to_output(spec, result, layers=False):
  """Calculon's output structure: {'0': {'execution': ..., 'stats': ...}}.

  Each execution is priced again through the single-run API from the
  record written (what ``calculon llm`` gives for it).  Under a preset
  other than Calculon's, each entry also holds ``framework``: its name and
  ``set``, what the preset set ({field: value}), and ``resolved``: every
  field as priced; ``binds``, what binds it (:func:`calculon.report.
  binding`: memory, compute, or its largest overhead); and ``margin_to_next_pct``,
  how much faster it is than the next (None for the last); the first
  entry also holds ``ties``: ``executions``, how many of the space lie
  within ``tolerance_pct`` of its rate (itself included), the best among
  them being the simplest (fewest virtual stages, then offloads:
  :func:`calculon.search.exhaustive.apply_ties`).

  Raises:
    RuntimeError: a re-priced sample rate disagrees with the search (an
      internal inconsistency, never expected).
  """
  output = {}
  for rank, best in enumerate(result.best):
    record = execution_record(spec, result.groups[best.group], best.flat)
    model = Llm(Llm.Application(spec.app))
    model.compile(spec.system, Llm.Execution.from_json(record))
    model.run(spec.system)
    stats = model.get_stats_json(layers)
    if not math.isclose(stats['sample_rate'], best.rate, rel_tol=1e-12):
      raise RuntimeError(f'search and single run disagree for {record}: '
                         f"{best.rate} vs {stats['sample_rate']}")
    entry = {'execution': record, 'stats': stats}
    if spec.modern:
      entry['framework'] = {'name': spec.framework,
                            'set': dict(model.framework_settings),
                            'resolved': model.exe.config.to_dict()}
      entry['binds'] = binding(stats, spec.system.mem1.capacity_bytes)
      nxt = result.best[rank + 1] if rank + 1 < len(result.best) else None
      entry['margin_to_next_pct'] = None if nxt is None else \
        100.0 * (best.rate / nxt.rate - 1.0)
      if rank == 0 and getattr(result, 'tie_tolerance', 0.0):
        entry['ties'] = {'executions': int(result.ties),
                         'tolerance_pct': 100.0 * result.tie_tolerance,
                         'rule': 'within the tolerance of the best rate '
                                 'the fewest virtual pipeline stages, then '
                                 'the fewest offloads'}
    output[str(rank)] = entry
  return output


def write_best(output, filename, partial=False, rescue=False):
  """Writes best executions as JSON (Calculon's structure) or CSV (index,
  execution fields, statistics, the batch time's terms as
  ``time_breakdown.NAME`` columns), atomically (:mod:`calculon.outputs`).
  Partial results get ``partial: true`` in each JSON entry, or a
  ``partial`` CSV column.

  Raises:
    calculon.outputs.WriteError: the file cannot be written (with
      ``rescue``, the content is saved elsewhere first; see
      :func:`calculon.outputs.write_bytes`).
  """
  if partial:
    for entry in output.values():
      entry['partial'] = True
  if io.is_json_extension(filename):
    io.write_json_file(output, filename, rescue)
    return
  import pandas as pd
  rows = []
  for key, entry in output.items():
    row = dict(entry.get('framework', {}).get('resolved',
                                              entry['execution']))
    row.update({k: v for k, v in entry['stats'].items()
                if k not in ('layers', 'framework_settings',
                             'time_breakdown')})
    row.update({f'time_breakdown.{k}': v for k, v in
                entry['stats'].get('time_breakdown', {}).items()})
    if partial:
      row['partial'] = True
    rows.append(row)
  frame = pd.DataFrame(rows, index=list(output.keys()))
  outputs.write_text(filename, frame.to_csv(index=True), rescue=rescue)


class TableWriter:
  """Streams row chunks to .csv, .csv.gz or .parquet (pyarrow writers),
  atomically: the rows go to a temporary file in the destination's folder,
  renamed into place when the ``with`` block ends without an exception
  (:func:`calculon.outputs.atomic_path`); an exception removes it.

  Use as a context manager; :meth:`write` takes a dict of equal-length 1-d
  arrays with the same columns each time.  To keep the rows written so far
  after Ctrl-C, catch KeyboardInterrupt inside the ``with`` block.

  Args:
    filename: the destination.
    rescue: when the final rename fails (folder removed or made read-only
      during the run), save the complete table elsewhere (see
      :mod:`calculon.outputs`).

  Raises:
    ConfigError: unsupported file extension.
    calculon.outputs.WriteError: the table cannot be written (on entering,
      on a failed write, or at the end).
  """

  def __init__(self, filename, rescue=False):
    if not (io.is_csv_extension(filename) or filename.endswith('.parquet')):
      raise ConfigError(f'{filename}: output must be *.csv, *.csv.gz or '
                        '*.parquet', source=filename)
    self.filename = filename
    self.rescue = rescue
    self._sink = None
    self._writer = None
    self._schema = None
    self._atomic = None
    self._tmp = None

  def __enter__(self):
    self._atomic = outputs.atomic_path(self.filename, rescue=self.rescue)
    self._tmp = self._atomic.__enter__()
    return self

  def _open(self, schema):
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq
    self._schema = schema
    if self.filename.endswith('.parquet'):
      self._writer = pq.ParquetWriter(self._tmp, schema)
      return
    if self.filename.endswith('.gz'):
      # Level 1: several times faster than the default for ~25% more bytes.
      self._sink = gzip.open(self._tmp, 'wb', compresslevel=1)
    else:
      self._sink = pa.OSFile(self._tmp, 'wb')
    self._writer = pacsv.CSVWriter(self._sink, schema)

  def write(self, columns):
    import pyarrow as pa
    if not columns:
      return
    table = pa.table({name: _arrow(arr) for name, arr in columns.items()})
    if self._writer is None:
      self._open(table.schema)
    self._writer.write_table(table.cast(self._schema))

  def _close(self):
    if self._writer is not None:
      self._writer.close()
    if self._sink is not None:
      self._sink.close()
    if self._writer is None and self.filename.endswith('.parquet'):
      # Nothing feasible: still a readable (empty) table; CSV stays empty.
      _empty_parquet(self._tmp)

  def __exit__(self, exc_type, exc, tb):
    if exc is not None:
      try:
        self._close()
      except Exception:  # noqa: BLE001 -- the block's error is reported
        pass
      # An OSError becomes WriteError; anything else propagates unchanged.
      return self._atomic.__exit__(exc_type, exc, tb)
    try:
      self._close()
    except BaseException as err:  # noqa: BLE001 -- e.g. disk full on flush
      if not self._atomic.__exit__(type(err), err, err.__traceback__):
        raise
      return False
    self._atomic.__exit__(None, None, None)  # rename into place
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
