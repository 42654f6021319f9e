"""The bundled framework presets: where they are, which one an execution
gets.

Provides :func:`folder`, :func:`names`, :func:`load` (a preset by name or
path, cached), :func:`default_for`, :data:`RECOMMENDED` and
:data:`CALCULON`.  Reads the preset files (:mod:`calculon.frameworks.
preset` reads one).
"""

import json
import os

from calculon.errors import ConfigError

#: The preset a modern execution that names none gets.
RECOMMENDED = 'megatron-core'
#: Calculon's own semantics (every behaviour absent; Calculon's space).
CALCULON = 'calculon'

_CACHE = {}


def folder():
  """The bundled presets' folder: ``frameworks/`` of the checkout this
  package lives in, else of the current directory."""
  root = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
  path = os.path.join(root, 'frameworks')
  if os.path.isdir(path):
    return path
  return os.path.join(os.getcwd(), 'frameworks')


def names():
  """Names of the bundled presets, sorted."""
  path = folder()
  if not os.path.isdir(path):
    return []
  return sorted(f[:-5] for f in os.listdir(path) if f.endswith('.json'))


def load(name, source=None):
  """The :class:`~calculon.frameworks.preset.Preset` ``name`` (a bundled
  preset's name, or the path of a preset JSON file).

  Raises:
    ConfigError: an unknown name (the message lists the allowed ones) or a
      malformed file.
  """
  if name in _CACHE:
    return _CACHE[name]
  from calculon.frameworks.preset import Preset
  if name.endswith('.json') or os.sep in name:
    path = name
  else:
    path = os.path.join(folder(), f'{name}.json')
  if not os.path.isfile(path):
    allowed = ', '.join(names()) or 'none found'
    where = f'{source}: ' if source else ''
    raise ConfigError(
      f"{where}framework '{name}' is not allowed: one of {allowed} (or a "
      'preset JSON file)', source=source, field='framework', value=name,
      allowed=allowed)
  try:
    with open(path, encoding='utf-8') as f:
      raw = json.load(f)
  except (OSError, ValueError) as err:
    raise ConfigError(f'{path}: not a readable JSON file: {err}',
                      source=path) from None
  preset = Preset(raw, path)
  stem = os.path.splitext(os.path.basename(path))[0]
  if preset.name != stem:
    raise ConfigError(f"{path}: field 'name' = \"{preset.name}\" is not "
                      f'allowed: the file\'s stem "{stem}"', source=path,
                      field='name', value=preset.name)
  _CACHE[name] = preset
  return preset


def is_calculon_execution(exe):
  """True when an :class:`~calculon.config.Execution` gave only
  Calculon's fields."""
  from calculon.config.execution import FIELD_SPECS
  written = exe.written if exe.written else frozenset(exe.to_dict())
  return all(name in FIELD_SPECS for name in written)


def default_for(app, exe):
  """The preset an execution naming no framework gets: ``calculon`` for a
  Calculon application and execution, else :data:`RECOMMENDED`."""
  return CALCULON if app.is_calculon and is_calculon_execution(exe) \
    else RECOMMENDED


