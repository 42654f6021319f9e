"""The output of a sweep: a Parquet dataset, one file per batch of points.

Layout of ``OUTPUT.parquet/``::

  part-20250101T120000123456-4242-0000.parquet   # one batch of points
  part-...parquet
  .lock                                          # held while a sweep writes

Each part is written to a hidden temporary name (``.part-...tmp``, ignored by
Parquet readers), flushed to disk, then renamed into place
(``os.replace``, atomic on POSIX; :func:`calculon.outputs.write_bytes`), so
a part is either complete or absent whatever happens to the writer; a part
that cannot be written (disk full, folder removed) is saved elsewhere and
named in the :class:`~calculon.outputs.WriteError` raised.  Every part has the same schema
(:func:`schema`), so ``pandas.read_parquet(OUTPUT)`` reads the whole
dataset.  One process writes at a time (an advisory ``flock`` on ``.lock``,
released by the OS if the process dies).
"""

import datetime
import glob
import os

from calculon import outputs
from calculon.config.execution import FIELD_SPECS, OPTIONAL_SPECS
from calculon.errors import ConfigError

#: Per-point bookkeeping columns after the statistics.
TAIL_COLUMNS = ('executions', 'feasible_executions', 'search_s',
                'calculon_version')
#: Execution fields that are already point parameters.
_SHARED = ('num_procs', 'datatype')


def _stat_names():
  from calculon.llm import STATS
  return tuple(s.name for s in STATS)


#: Statistics columns (every one of :data:`calculon.llm.STATS`, as float64).
STAT_COLUMNS = _stat_names()


def execution_columns():
  """Execution fields stored per row (all but num_procs and datatype, which
  are point parameters; the optional fields hold their "absent" value for
  Calculon's executions)."""
  return [n for n in FIELD_SPECS if n not in _SHARED] + list(OPTIONAL_SPECS)


def execution_default(name):
  """The value an execution field takes when the execution leaves it out."""
  if name in OPTIONAL_SPECS:
    return OPTIONAL_SPECS[name][2]
  return None


def _field_spec(name):
  if name in FIELD_SPECS:
    return FIELD_SPECS[name]
  spec, names, _ = OPTIONAL_SPECS[name]
  return spec, names


def schema(param_columns):
  """The Arrow schema of a sweep's rows.

  Columns: point_id, the point parameters (application, system and the
  variations: float64; num_procs, max_batch_size: int64; datatype), rank
  (0 = best), feasible, reason ('' when feasible), the execution fields,
  every statistic (float64, Calculon's units: s, bytes, FLOP, samples/s),
  then executions (evaluated by the point's search), feasible_executions,
  search_s (wall time of the point's search) and calculon_version.
  """
  import pyarrow as pa
  fields = [pa.field('point_id', pa.string(), nullable=False)]
  for name in param_columns:
    if name in ('application', 'system', 'datatype'):
      typ = pa.string()
    elif name in ('num_procs', 'max_batch_size'):
      typ = pa.int64()
    else:
      typ = pa.float64()
    fields.append(pa.field(name, typ))
  fields += [pa.field('rank', pa.int64()), pa.field('feasible', pa.bool_()),
             pa.field('reason', pa.string())]
  for name in execution_columns():
    spec, names = _field_spec(name)
    typ = pa.string() if names else (
      pa.bool_() if spec.kind == 'bool' else (
        pa.float64() if spec.kind == 'number' else pa.int64()))
    fields.append(pa.field(name, typ))
  fields += [pa.field(name, pa.float64()) for name in STAT_COLUMNS]
  fields += [pa.field('executions', pa.int64()),
             pa.field('feasible_executions', pa.int64()),
             pa.field('search_s', pa.float64()),
             pa.field('calculon_version', pa.string())]
  return pa.schema(fields)


def part_files(folder):
  """Complete part files of a dataset folder, sorted by name."""
  return sorted(glob.glob(os.path.join(glob.escape(folder),
                                       'part-*.parquet')))


class SweepStore:
  """Writes a sweep's rows as atomic Parquet parts and knows which points
  are done.

  Use as a context manager: entering takes the folder's lock, removes
  leftover temporary files of an interrupted writer and reads the point ids
  already written (:attr:`done`).

  Args:
    folder: the dataset folder (created if missing).
    schema: :func:`schema` of this sweep.
    read_only: only read which points are done (no folder created, no lock,
      no clean-up; :meth:`write` is not allowed).

  Raises:
    ConfigError: ``folder`` is a file, cannot be created, is being written by
      another sweep, or holds parts of a sweep with other columns (another
      spec's variations) or unreadable parts.
  """

  def __init__(self, folder, schema_, read_only=False):
    self.folder = folder
    self.read_only = read_only
    self.schema = schema_
    self.done = set()
    self.rows_before = 0
    self.parts_written = 0
    self.rows_written = 0
    self._lock_fd = None
    self._created = False
    self._seq = 0

  def __enter__(self):
    if os.path.exists(self.folder) and not os.path.isdir(self.folder):
      raise ConfigError(f'{self.folder}: exists and is not a folder (a sweep '
                        'writes a folder of Parquet parts)',
                        source=self.folder)
    if self.read_only:
      if os.path.isdir(self.folder):
        self._read_done()
      return self
    self._created = not os.path.exists(self.folder)
    try:
      os.makedirs(self.folder, exist_ok=True)
    except OSError as err:
      raise ConfigError(f'{self.folder}: cannot create the output folder: '
                        f'{err}', source=self.folder) from None
    self._lock()
    try:
      for tmp in glob.glob(os.path.join(glob.escape(self.folder),
                                        '.part-*.tmp')):
        os.remove(tmp)
      self._read_done()
    except BaseException:
      self._unlock()
      raise
    return self

  def __exit__(self, exc_type, *exc):
    self._unlock()
    if exc_type is not None and self._created and not self.parts_written:
      # Failed before writing anything (e.g. no scheduler): leave no folder.
      try:
        os.remove(os.path.join(self.folder, '.lock'))
        os.rmdir(self.folder)
      except OSError:
        pass
    return False

  def _lock(self):
    path = os.path.join(self.folder, '.lock')
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
      import fcntl
    except ImportError:  # not POSIX: no lock
      self._lock_fd = fd
      return
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
      other = os.read(fd, 64).decode('ascii', 'replace').strip()
      os.close(fd)
      raise ConfigError(f'{self.folder}: another sweep (process {other or "?"}'
                        ') is writing to this folder; wait for it or use '
                        'another output', source=self.folder) from None
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode('ascii'))
    self._lock_fd = fd

  def _unlock(self):
    if self._lock_fd is not None:
      os.close(self._lock_fd)  # releases the flock
      self._lock_fd = None

  def _read_done(self):
    import pyarrow.parquet as pq
    for path in part_files(self.folder):
      try:
        found = pq.read_schema(path)
        ids = pq.read_table(path, columns=['point_id']).column(
          'point_id').to_pylist()
      except Exception as err:  # noqa: BLE001 -- name the file
        raise ConfigError(f'{path}: cannot be read as a sweep part: {err}',
                          source=path) from None
      if not found.equals(self.schema, check_metadata=False):
        want, have = set(self.schema.names), set(found.names)
        diff = ''
        if want - have:
          diff += ' missing: ' + ', '.join(sorted(want - have)) + ';'
        if have - want:
          diff += ' not in this sweep: ' + ', '.join(sorted(have - want)) + ';'
        raise ConfigError(
          f'{path}: this part has other columns or types than this sweep '
          f'writes ({diff.strip(" ;") or "types differ"}): it is from a '
          'sweep with other variations or another calculon version; write '
          'to a new output folder', source=path)
      self.done.update(ids)
      self.rows_before += len(ids)

  def write(self, rows):
    """Writes ``rows`` (list of dicts, the schema's columns) as one part.

    Returns:
      the part's path (None when ``rows`` is empty).

    Raises:
      calculon.outputs.WriteError: the part cannot be written; its content
        is saved elsewhere first when possible (``rescued``: next to the
        folder's part, in the current folder or the temporary folder, as
        ``part-....rescued.parquet``; moving it into the folder keeps it).
    """
    if not rows:
      return None
    if self.read_only:
      raise RuntimeError('SweepStore opened read-only')
    import pyarrow as pa
    import pyarrow.parquet as pq
    table = pa.Table.from_pylist(rows, schema=self.schema)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime(
      '%Y%m%dT%H%M%S%f')
    name = f'part-{stamp}-{os.getpid()}-{self._seq:04d}.parquet'
    self._seq += 1
    final = os.path.join(self.folder, name)
    buffer = pa.BufferOutputStream()
    pq.write_table(table, buffer, compression='zstd')
    outputs.write_bytes(final, buffer.getvalue().to_pybytes(), rescue=True)
    self.parts_written += 1
    self.rows_written += len(rows)
    return final


def read_sweep(folder, columns=None):
  """The rows of a sweep output as a pandas DataFrame (``pandas.read_parquet``
  of the folder).

  Raises:
    ConfigError: ``folder`` is missing or holds no part.
  """
  import pandas as pd
  if not os.path.isdir(folder):
    raise ConfigError(f'{folder}: no such sweep output folder',
                      source=folder)
  if not part_files(folder):
    raise ConfigError(f'{folder}: holds no part-*.parquet file (no point '
                      'done yet?)', source=folder)
  return pd.read_parquet(folder, columns=columns)
