"""Framework presets: what each training framework does, supports and
requires, as data (``frameworks/*.json`` beside ``models/`` and
``systems/``).

Provides :func:`names` (the bundled presets), :func:`load` (a preset by name
or path, cached), :func:`default_for` (the preset an execution that names
none gets), :data:`RECOMMENDED`, and the resolution rule
(:func:`resolve_execution`, :func:`resolve_columns`, :func:`allowed_mask`
in :mod:`calculon.frameworks.resolve`).  Reads the preset files and
:mod:`calculon.config.registry`.

The resolution rule, for every execution field: the value written in the
execution > the execution's ``framework`` preset > the field's absent value
(Calculon's meaning).  An execution that names no framework gets
``calculon`` when it and its application are Calculon files (only
Calculon's fields: golden parity), else :data:`RECOMMENDED`.
"""

from calculon.frameworks.catalog import (  # noqa: F401
  CALCULON, RECOMMENDED, default_for, folder, is_calculon_execution, load,
  names)


def resolve_execution(app, exe, framework=None, source='<execution>'):
  """See :func:`calculon.frameworks.resolve.resolve_execution`."""
  from calculon.frameworks.resolve import resolve_execution as run
  return run(app, exe, framework, source)
