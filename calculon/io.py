"""Reading and writing files: JSON (.json, .json.gz), CSV (.csv, .csv.gz),
Parquet.

Reading never lets an OS or JSON error escape: a missing file or malformed
JSON raises :class:`~calculon.errors.ConfigError` naming the file.
"""

import gzip
import json
import math
import os

import numpy as np

from calculon.errors import ConfigError


def is_json_extension(filename):
  """True for '.json' and '.json.gz' paths."""
  return filename.endswith('.json') or filename.endswith('.json.gz')


def is_csv_extension(filename):
  return filename.endswith('.csv') or filename.endswith('.csv.gz')


def _opener(filename):
  return gzip.open if filename.endswith('.gz') else open


def read_json_file(filename):
  """Decoded JSON of ``filename`` (.json or .json.gz).

  Raises:
    ConfigError: the file is missing, unreadable, or not valid JSON.
  """
  try:
    with _opener(filename)(filename, 'rb') as fd:
      text = fd.read().decode('utf-8')
  except FileNotFoundError:
    raise ConfigError(f'{filename}: no such file', source=filename) from None
  except IsADirectoryError:
    raise ConfigError(f'{filename}: is a directory, not a JSON file',
                      source=filename) from None
  except (OSError, UnicodeDecodeError) as err:
    raise ConfigError(f'{filename}: cannot be read: {err}',
                      source=filename) from None
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


def write_json_file(data, filename):
  """Writes ``data`` as JSON (indented for .json, compact for .json.gz).

  Raises:
    ConfigError: ``filename`` is not a .json/.json.gz path.
    OSError: the file cannot be written.
  """
  if not is_json_extension(filename):
    raise ConfigError(f'{filename}: output must end in .json or .json.gz',
                      source=filename)
  indent = None if filename.endswith('.gz') else 2
  text = json.dumps(_clean(data), indent=indent)
  tmp = filename + '.tmp'
  with _opener(filename)(tmp, 'wb') as fd:
    fd.write(text.encode('utf-8'))
  os.replace(tmp, filename)


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
