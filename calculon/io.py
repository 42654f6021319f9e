"""Reading and writing files: JSON (.json, .json.gz), CSV (.csv, .csv.gz),
Parquet.

Reading never lets an OS or JSON error escape: a missing file or malformed
JSON raises :class:`~calculon.errors.ConfigError` naming the file.
"""

import json
import math
import os

import numpy as np

from calculon import outputs
from calculon.errors import ConfigError


def is_json_extension(filename):
  """True for '.json' and '.json.gz' paths."""
  return filename.endswith('.json') or filename.endswith('.json.gz')


def is_csv_extension(filename):
  return filename.endswith('.csv') or filename.endswith('.csv.gz')


def _opener(filename):
  if filename.endswith('.gz'):
    import gzip  # here, not at the top: command start-up
    return gzip.open
  return open


def read_text_file(filename, what='file'):
  """The text of ``filename`` (.gz decompressed).

  Raises:
    ConfigError: the file is missing, a directory, or unreadable.
  """
  try:
    with _opener(filename)(filename, 'rb') as fd:
      return fd.read().decode('utf-8')
  except FileNotFoundError:
    raise ConfigError(f'{filename}: no such file', source=filename) from None
  except IsADirectoryError:
    raise ConfigError(f'{filename}: is a directory, not a {what}',
                      source=filename) from None
  except (OSError, UnicodeDecodeError) as err:
    raise ConfigError(f'{filename}: cannot be read: {err}',
                      source=filename) from None


def read_json_file(filename):
  """Decoded JSON of ``filename`` (.json or .json.gz).

  Raises:
    ConfigError: the file is missing, unreadable, or not valid JSON.
  """
  text = read_text_file(filename, 'JSON file')
  try:
    return json.loads(text)
  except json.JSONDecodeError as err:
    raise ConfigError(f'{filename}: not valid JSON: {err.msg} at line '
                      f'{err.lineno} column {err.colno}',
                      source=filename) from None


def _clean(obj):
  """Numpy values to Python; NaN to None (JSON null)."""
  if isinstance(obj, dict):
    return {str(k): _clean(v) for k, v in obj.items()}
  if isinstance(obj, (list, tuple)):
    return [_clean(v) for v in obj]
  if isinstance(obj, np.ndarray):
    return _clean(obj.tolist())
  if isinstance(obj, (np.bool_,)):
    return bool(obj)
  if isinstance(obj, np.integer):
    return int(obj)
  if isinstance(obj, (float, np.floating)):
    value = float(obj)
    return None if math.isnan(value) else value
  return obj


def json_text(data, filename):
  """``data`` as JSON text: indented for .json, compact for .json.gz
  (numpy values become Python values, NaN becomes null)."""
  indent = None if filename.endswith('.gz') else 2
  return json.dumps(_clean(data), indent=indent)


def write_json_file(data, filename, rescue=False):
  """Writes ``data`` as JSON (indented for .json, compact gzip for
  .json.gz), atomically (:mod:`calculon.outputs`).

  Args:
    rescue: when the write fails, save the content elsewhere (see
      :func:`calculon.outputs.write_bytes`).

  Raises:
    ConfigError: ``filename`` is not a .json/.json.gz path.
    calculon.outputs.WriteError (an OSError): the file cannot be written.
  """
  if not is_json_extension(filename):
    raise ConfigError(f'{filename}: output must end in .json or .json.gz',
                      source=filename)
  outputs.write_text(filename, json_text(data, filename), rescue=rescue)


def load_application(filename):
  """Application config from a JSON file (ConfigError on any problem)."""
  from calculon.config import Application
  return Application.from_dict(read_json_file(filename), filename)


def load_execution(filename):
  """Execution config from a JSON file (ConfigError on any problem)."""
  from calculon.config import Execution
  return Execution.from_dict(read_json_file(filename), filename)


def load_system(filename):
  """System from a JSON file (ConfigError on any problem)."""
  from calculon.hardware import System
  return System(read_json_file(filename), filename)


# -- result tables ---------------------------------------------------------------

def read_table(filename):
  """A result file as a pandas DataFrame, one row per execution.

  Accepts .csv, .csv.gz, .parquet, and .json/.json.gz in Calculon's search
  output structure ({"0": {"execution": {...}, "stats": {...}}, ...}; the
  key becomes the ``rank`` column, per-layer statistics are dropped) or a
  JSON list of flat records.

  Raises:
    ConfigError: missing file, unknown extension or unreadable content.
  """
  import pandas as pd
  if not os.path.exists(filename):
    raise ConfigError(f'{filename}: no such file', source=filename)
  try:
    if is_csv_extension(filename):
      frame = pd.read_csv(filename)
      if len(frame.columns) and frame.columns[0].startswith('Unnamed'):
        frame = frame.rename(columns={frame.columns[0]: 'rank'})
      return frame
    if filename.endswith('.parquet'):
      return pd.read_parquet(filename)
  except (ValueError, OSError) as err:
    raise ConfigError(f'{filename}: cannot be read as a table: {err}',
                      source=filename) from None
  if not is_json_extension(filename):
    raise ConfigError(f'{filename}: unknown table format (use .csv, .csv.gz, '
                      '.parquet, .json or .json.gz)', source=filename)
  data = read_json_file(filename)
  if isinstance(data, list):
    return pd.DataFrame(data)
  if isinstance(data, dict) and all(isinstance(v, dict) for v in data.values()):
    rows = []
    for key, entry in data.items():
      row = {'rank': int(key) if str(key).isdigit() else key}
      for part in ('execution', 'stats'):
        row.update({k: v for k, v in entry.get(part, {}).items()
                    if k not in ('layers', 'time_breakdown')})
      # The batch time's terms as columns, as a best's CSV writes them.
      row.update({f'time_breakdown.{k}': v for k, v in
                  entry.get('stats', {}).get('time_breakdown', {}).items()})
      row.update({k: v for k, v in entry.items()
                  if k not in ('execution', 'stats')})
      rows.append(row)
    return pd.DataFrame(rows)
  raise ConfigError(f'{filename}: not a result file: expected '
                    '{"0": {"execution": ..., "stats": ...}} or a list of '
                    'records', source=filename)


def read_runs_csv(path, required, columns, what):
  """A CSV file of measured runs as a DataFrame of strings (blanks ''),
  every column of ``columns`` present (those it lacks are blank).

  Args:
    path: the file.
    required: the columns it must have.
    columns: the columns such a file has (named in the message).
    what: what such a file is, for the message ('a runs file').

  Raises:
    ConfigError: a missing or unreadable file, a required column missing
      (one line naming the file, the columns and what is allowed).
  """
  import pandas as pd
  if not os.path.exists(path):
    raise ConfigError(f'{path}: no such file', source=path)
  try:
    frame = pd.read_csv(path, dtype=str, keep_default_na=False)
  except (pd.errors.ParserError, UnicodeDecodeError, ValueError) as err:
    raise ConfigError(f'{path}: not a readable CSV file: {err}',
                      source=path) from None
  missing = [c for c in required if c not in frame.columns]
  if missing:
    raise ConfigError(
      f"{path}: missing column(s) {', '.join(missing)} ({what} has the "
      f"columns {', '.join(columns)}; of them {', '.join(required)} are "
      'required)', source=path, field=missing[0],
      allowed=', '.join(columns))
  for col in columns:
    if col not in frame.columns:
      frame[col] = ''
  return frame


def write_table(frame, filename, rescue=False):
  """Writes a result DataFrame as .csv(.gz), .parquet or .json(.gz),
  atomically (:mod:`calculon.outputs`).

  JSON uses Calculon's search output structure when the 23 execution fields
  are columns (the other columns go to "stats"), else a list of records.

  Raises:
    ConfigError: unknown extension.
    calculon.outputs.WriteError (an OSError): the file cannot be written.
  """
  from calculon.config.execution import FIELDS
  if is_csv_extension(filename):
    outputs.write_text(filename, frame.to_csv(index=False), rescue=rescue)
  elif filename.endswith('.parquet'):
    from io import BytesIO
    buffer = BytesIO()
    frame.to_parquet(buffer, index=False)
    outputs.write_bytes(filename, buffer.getvalue(), rescue=rescue)
  elif is_json_extension(filename):
    records = frame.to_dict(orient='records')
    if all(f in frame.columns for f in FIELDS):
      out = {}
      for i, row in enumerate(records):
        key = str(row.pop('rank', i))
        out[key] = {'execution': {f: row.pop(f) for f in FIELDS},
                    'stats': row}
      write_json_file(out, filename, rescue)
    else:
      write_json_file(records, filename, rescue)
  else:
    raise ConfigError(f'{filename}: unknown table format (use .csv, .csv.gz, '
                      '.parquet, .json or .json.gz)', source=filename)
