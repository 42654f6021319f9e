"""The names of the bundled system files.

``systems/X.json`` is the default file of a GPU: calibrated to measured
runs (``calculon calibrate``, validation/make_calibrated.py) where a
calibration exists, else the datasheet file.  Where it is calibrated,
``systems/X_datasheet.json`` is its datasheet-only twin and
``systems/X_measured.json`` that twin with the measured kernel tables:
what the calibration started from.  Calculon's own files (a100_40g,
a100_80e, a100_80g, h100_80g_nvl8) have no twin.

The hardware table of validation/conventions.yaml names a base ``X``: the
uncalibrated suite prices its rows on the datasheet file
(:func:`datasheet_path`), ``--calibrated`` on ``systems/CLUSTER.json``
where that file is a calibrated one (:func:`calibrated_path`).
"""

import os

#: The suffix of a datasheet-only twin (``systems/X_datasheet.json``).
DATASHEET = '_datasheet'
#: The suffix of a measured-kernel twin (``systems/X_measured.json``).
MEASURED = '_measured'
#: The suffix of a calibrated file before the calibrated files became the
#: defaults (``systems/X_calibrated.json``; still stripped from names).
CALIBRATED = '_calibrated'
#: How the note ``calculon calibrate`` writes into a calibrated file's
#: ``notes`` begins: the mark of a calibrated file.
CALIBRATED_NOTE = 'Calibrated (calculon calibrate)'


def is_calibrated(cfg):
  """Whether system JSON ``cfg`` was written by ``calculon calibrate``
  (one of its notes is the calibration's)."""
  notes = cfg.get('notes', []) if isinstance(cfg, dict) else []
  notes = [notes] if isinstance(notes, str) else notes
  return any(isinstance(n, str) and n.startswith(CALIBRATED_NOTE)
             for n in notes)


def base_name(path):
  """The GPU name of a system file or name: its file name without
  ``.json`` and without a ``_datasheet`` or ``_calibrated`` suffix
  (``systems/h100_sxm_80g_datasheet.json`` -> ``h100_sxm_80g``)."""
  name = os.path.basename(path)
  name = name[:-len('.json')] if name.endswith('.json') else name
  for suffix in (DATASHEET, CALIBRATED):
    if name.endswith(suffix):
      return name[:-len(suffix)]
  return name


def datasheet_path(base_dir, name):
  """The file the uncalibrated model prices system ``name`` on:
  ``systems/NAME_datasheet.json`` where it exists, else
  ``systems/NAME.json`` (a path ending in ``.json`` is returned as it
  is)."""
  if name.endswith('.json'):
    return name
  twin = os.path.join(base_dir, 'systems', f'{name}{DATASHEET}.json')
  if os.path.exists(twin):
    return twin
  return os.path.join(base_dir, 'systems', f'{name}.json')


def calibrated_path(base_dir, cluster):
  """``systems/CLUSTER.json`` when it exists and is a calibrated file
  (:func:`is_calibrated`), else None."""
  from calculon.io import read_json_file
  path = os.path.join(base_dir, 'systems', f'{cluster}.json')
  if os.path.exists(path) and is_calibrated(read_json_file(path)):
    return path
  return None


def relative(base_dir, path):
  """``path`` as ``systems/NAME.json`` when it lies in ``base_dir``'s
  systems folder (for source labels), else as it is."""
  folder = os.path.join(base_dir, 'systems')
  if os.path.dirname(os.path.abspath(path)) == os.path.abspath(folder):
    return f'systems/{os.path.basename(path)}'
  return path


def kind_of(cfg):
  """'calibrated' for a file ``calculon calibrate`` wrote
  (:func:`is_calibrated`), else 'datasheet'."""
  return 'calibrated' if is_calibrated(cfg) else 'datasheet'


def label(path, cfg):
  """How a table names the system file a row was priced on: its file
  name and kind, e.g. ``h100_sxm_80g_datasheet.json (datasheet)`` or
  ``h100_sxm_80g.json (calibrated)`` (:func:`kind_of` of its JSON
  ``cfg``)."""
  return f'{os.path.basename(path)} ({kind_of(cfg)})'


def priced_on_line(labels):
  """The line under a validation table naming every system file its
  rows were priced on (``labels``: :func:`label` strings, repeats
  allowed), or '' when there are none."""
  names = [x for x in dict.fromkeys(labels) if x]
  if not names:
    return ''
  return 'Priced on (systems/): ' + ', '.join(names)


def measured_view(base_dir, folder):
  """``folder`` made to read as ``base_dir`` with every
  ``systems/X_datasheet.json`` that has a ``systems/X_measured.json``
  twin replaced by that twin (symbolic links; models/ and validation/
  linked whole), and returned: what the published suite and calibration
  read to price runs on the measured-kernel files.  ``folder`` must be
  an empty folder (e.g. a temporary one)."""
  base_dir = os.path.abspath(base_dir)
  for part in ('models', 'validation'):
    os.symlink(os.path.join(base_dir, part), os.path.join(folder, part))
  systems = os.path.join(folder, 'systems')
  os.mkdir(systems)
  src = os.path.join(base_dir, 'systems')
  names = os.listdir(src)
  for name in names:
    twin = name.replace(DATASHEET + '.json', MEASURED + '.json')
    target = twin if name.endswith(DATASHEET + '.json') and twin in names \
      else name
    os.symlink(os.path.join(src, target), os.path.join(systems, name))
  return folder
