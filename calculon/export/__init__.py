"""Exporters: an execution written as the launch configuration a training
framework's current release takes.

Provides :data:`TARGETS` (name -> exporter module: ``megatron-bridge``,
``torchtitan``, ``deepspeed``), :func:`read_execution` (an execution file,
or the best of a search or plan result), :func:`export_text` (one resolved
execution as a target's file) and :func:`path_beside` (where
``--export`` writes it).  Reads the application and execution configs
(:mod:`calculon.config`), the framework presets
(:func:`calculon.frameworks.resolve_execution`) and, for the layers an
activation offload 'fit' chose, one evaluation on the system
(:func:`calculon.llm.engine.evaluate_columns`).

Each exporter module has ``NAME``, ``TARGET`` (the framework release it
writes for), ``VERSIONS``, ``SUFFIX``, ``PRESET`` (the calculon preset
describing the framework), ``refusals(inp)`` and ``render(inp)``.  An
execution the framework cannot express is refused with one line naming
the field and why (:class:`~calculon.errors.ConfigError`, exit 2).
"""

import importlib

from calculon.errors import ConfigError
from calculon.export._common import ExportInput

#: Target name -> module under calculon.export.
_MODULES = {'megatron-bridge': 'megatron_bridge', 'torchtitan': 'torchtitan',
            'deepspeed': 'deepspeed'}
TARGET_NAMES = tuple(_MODULES)


def target(name, source='--to'):
  """The exporter module of target ``name``.

  Raises:
    ConfigError: an unknown name (the message lists the targets).
  """
  if name not in _MODULES:
    raise ConfigError(f'{source} {name!r} is not an export target: one of '
                      + ', '.join(TARGET_NAMES), source=source, value=name,
                      allowed=', '.join(TARGET_NAMES))
  return importlib.import_module(f'calculon.export.{_MODULES[name]}')


def _best_of(data, path):
  """(execution record, where) of the best entry of a search output
  ({"0": {"execution", "framework": {"resolved"}...}}) or a plan
  ({"plans": [{"best", "execution"}...]}), or (data, path) for an
  execution file."""
  if isinstance(data, dict) and isinstance(data.get('plans'), list):
    best = [p for p in data['plans'] if isinstance(p, dict) and p.get('best')
            and p.get('execution')]
    if not best:
      raise ConfigError(f'{path}: a plan with no best execution (every GPU '
                        'count infeasible)', source=path, field='plans')
    return best[0]['execution'], f"{path} (plan, best: {best[0]['gpus']} "\
      'GPUs)'
  if isinstance(data, dict) and data and all(
      isinstance(v, dict) and 'execution' in v for v in data.values()):
    # a search result: its best is entry "0" (then the lowest rank)
    keys = sorted(data, key=lambda k: (not str(k).isdigit(),
                                       int(k) if str(k).isdigit() else 0, k))
    entry = data[keys[0]]
    record = entry['execution']
    fw = entry.get('framework')
    if isinstance(fw, dict) and isinstance(fw.get('resolved'), dict):
      record = fw['resolved']
    return record, f'{path} (search result #{keys[0]})'
  return data, path


def read_execution(app, path, framework=None):
  """The execution of ``path`` resolved against ``app`` as ``calculon llm``
  resolves it: an execution JSON, or the best of a search result
  (``llm-optimal-execution``'s output) or of a plan (``plan -o``).

  Returns:
    (resolved :class:`~calculon.config.Execution`, where: a label for
    messages).

  Raises:
    ConfigError: a missing or invalid file or execution, or one its
      framework refuses.
  """
  from calculon import io
  from calculon.config import Execution
  from calculon.frameworks import resolve_execution
  record, where = _best_of(io.read_json_file(path), path)
  if not isinstance(record, dict):
    raise ConfigError(f'{where}: not an execution, a search result or a '
                      'plan: expected a JSON object of execution fields, '
                      '{"0": {"execution": ...}} or {"plans": [...]}',
                      source=path)
  exe = Execution.from_dict(dict(record), where)
  resolved, _ = resolve_execution(app, exe, framework, where)
  return resolved, where


def offloaded_layers(app, exe, system):
  """Blocks of the busiest stage whose activations the engine offloads
  (``act_offload_blocks``) for ``exe`` on ``system``: what
  ``activation_offload_layers`` 'fit' chose; None without activation
  offload or with 'all'.

  Raises:
    ConfigError: a system that does not fit the execution (its reason).
  """
  if not exe.activations_offload or exe.activation_offload_layers != 'fit':
    return None
  import numpy as np
  from calculon.config import ExecutionColumns
  from calculon.llm.engine import evaluate_columns
  cols = ExecutionColumns.from_records([exe.to_dict()])
  ev = evaluate_columns(app, system, cols)
  return int(np.asarray(ev.act_offload_blocks).reshape(-1)[0])


def export_text(name, app, exe, *, source='<execution>', system=None,
                system_name=None):
  """One resolved execution as target ``name``'s file.

  Args:
    name: a target of :data:`TARGET_NAMES`.
    app: the :class:`~calculon.config.Application`.
    exe: the resolved :class:`~calculon.config.Execution`
      (:func:`read_execution`).
    source: where it came from, for messages.
    system: the :class:`~calculon.hardware.System` it was priced on, or
      None (then an activation offload 'fit' is refused: its layer count
      depends on the system).
    system_name: the system file, named in the export's header.

  Returns:
    the file's text.

  Raises:
    ConfigError: an unknown target, or one line naming the execution
      field the framework cannot express and why.
  """
  module = target(name)
  layers = offloaded_layers(app, exe, system) if system is not None else None
  inp = ExportInput(exe=exe, app=app, source=source,
                    offloaded_layers=layers, system_name=system_name)
  return module.render(inp)


def path_beside(result_path, name):
  """Where ``--export NAME`` writes beside a result: its name without the
  extension (``.json``, ``.json.gz``, ``.csv``...) plus the target's
  suffix (``best.json`` -> ``best.megatron-bridge.yaml``)."""
  module = target(name, '--export')
  base = result_path
  for ext in ('.json.gz', '.csv.gz', '.json', '.csv'):
    if base.endswith(ext):
      base = base[:-len(ext)]
      break
  return base + module.SUFFIX


def check_beside(result_path, name, option='--export'):
  """Checks, before any work, that the export beside ``result_path`` can
  be written.

  Raises:
    ConfigError: an unknown target or an unwritable path.
  """
  from calculon import outputs
  path = path_beside(result_path, name)
  outputs.check_output_path(path, what='export', option=option)
  return path


def write_beside(result_path, name, app, exe, *, source, system=None,
                 system_name=None):
  """Writes the export of ``exe`` beside ``result_path`` (atomically).

  Returns:
    the path written.

  Raises:
    ConfigError: the framework cannot express the execution.
  """
  from calculon import outputs
  path = path_beside(result_path, name)
  text = export_text(name, app, exe, source=source, system=system,
                     system_name=system_name)
  outputs.write_text(path, text, rescue=True)
  return path


__all__ = ['TARGET_NAMES', 'ExportInput', 'target', 'read_execution',
           'offloaded_layers', 'export_text', 'path_beside', 'check_beside',
           'write_beside']
