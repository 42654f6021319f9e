"""Evaluate executions: one, a DataFrame of them, or a grid.

This is the single entry to the model.  :func:`evaluate_columns` checks the
executions against the application and the system (raising ConfigError for
input mistakes) and returns the lazy :class:`~calculon.llm.model.Evaluation`;
:func:`evaluate` does the same for a pandas DataFrame and returns a DataFrame
with every statistic plus ``feasible`` and ``reason``.
"""

import numpy as np

from calculon.config import Application, ExecutionColumns, check_rules
from calculon.config.execution import DATATYPE_NAMES, TP_COMM_AR
from calculon.errors import ConfigError
from calculon.hardware import System
from calculon.llm.model import Evaluation
from calculon.llm.stats import STATS, STAT_NAMES, EXTRA_STAT_NAMES, stat_arrays


def _first(bad, shape):
  bad = np.broadcast_to(bad, shape)
  if not bad.any():
    return None
  return tuple(int(x) for x in np.argwhere(bad)[0])


def _at(x, shape, i):
  return np.broadcast_to(x, shape)[i]


def check_compatible(app, system, exe, source='<execution>'):
  """Checks that executions fit the application and the system's config.

  Raises:
    ConfigError: a network tier index that does not exist, a datatype the
      system's processors do not have, or a tensor-parallel degree that does
      not divide the hidden size, feedforward size, attention heads, or (for
      rs_ag / p2p_rs_ag) microbatch * sequence.
  """
  shape = exe.shape
  where = (lambda i: '') if shape in ((), (1,)) else (
    lambda i: f' execution {i[0] if len(i) == 1 else i}:')
  n = system.num_networks
  for field in ('tensor_par_net', 'pipeline_par_net', 'data_par_net'):
    i = _first(getattr(exe, field) >= n, shape)
    if i is not None:
      value = int(_at(getattr(exe, field), shape, i))
      raise ConfigError(
        f"{source}:{where(i)} field '{field}' = {value} is not allowed: the "
        f'system has {n} network tier(s), so it must be 0 to {n - 1}',
        source=source, field=field, value=value)
  # Not np.unique: it imports numpy.ma (~15 ms of every command's start-up).
  for code in np.flatnonzero(np.bincount(np.ravel(exe.datatype))):
    name = DATATYPE_NAMES[int(code)]
    try:
      system.check_datatype(name)
    except ConfigError as err:
      i = _first(exe.datatype == code, shape)
      raise ConfigError(f"{source}:{where(i)} field 'datatype' = \"{name}\" is "
                        f'not allowed: {err.allowed}', source=source,
                        field='datatype', value=name) from None
  tp = exe.tensor_par
  for what, size in (('hidden', app.hidden), ('feedforward', app.feedforward),
                     ('attn_heads', app.attn_heads)):
    i = _first(size % tp != 0, shape)
    if i is not None:
      value = int(_at(tp, shape, i))
      raise ConfigError(
        f"{source}:{where(i)} field 'tensor_par' = {value} is not allowed: "
        f"it must divide the application's {what} ({size})",
        source=source, field='tensor_par', value=value)
  batch_seq = exe.microbatch_size * app.seq_size
  bad = (exe.tensor_par_comm_type != TP_COMM_AR) & (batch_seq % tp != 0)
  i = _first(bad, shape)
  if i is not None:
    value = int(_at(tp, shape, i))
    raise ConfigError(
      f"{source}:{where(i)} field 'tensor_par' = {value} is not allowed: with "
      "tensor_par_comm_type 'rs_ag' or 'p2p_rs_ag' it must divide "
      'microbatch_size * seq_size = '
      f'{int(_at(batch_seq, shape, i))}',
      source=source, field='tensor_par', value=value)


def as_application(app):
  """An :class:`Application` from itself, a dict, or a compat object."""
  if isinstance(app, Application):
    return app
  if hasattr(app, 'config') and isinstance(app.config, Application):
    return app.config
  return Application.from_dict(app)


def as_system(system):
  """A :class:`System` from itself or a dict."""
  return system if isinstance(system, System) else System(system)


def evaluate_columns(app, system, exe, *, validate=True, source='<execution>'):
  """Prices executions given as columns (any broadcastable shapes).

  Args:
    app: Application (or dict); system: System (or dict).
    exe: :class:`ExecutionColumns`.
    validate: check the execution rules and compatibility first (a search
      that generates only valid executions may skip it).

  Returns:
    :class:`Evaluation` (lazy; ask for the statistics you need).

  Raises:
    ConfigError: an execution is not valid input (see
      :func:`calculon.config.check_rules` and :func:`check_compatible`).
  """
  app, system = as_application(app), as_system(system)
  if validate:
    check_rules(exe, source)
    check_compatible(app, system, exe, source)
  return Evaluation(app, system, exe)


def evaluate(application, system, executions, *, source='<executions>'):
  """Evaluates a DataFrame of executions in one vectorized pass.

  Args:
    application: Application or its JSON dict.
    system: System or its JSON dict.
    executions: pandas DataFrame with the 23 execution fields as columns
      (Calculon values: strings for categorical fields, bools for flags).

  Returns:
    DataFrame with the execution columns, every statistic of
    :data:`~calculon.llm.stats.STATS` (Calculon's names and units), those of
    :data:`~calculon.llm.stats.EXTRA_STATS` (tokens/s, MFU, HFU, memory per
    tier and kind...), and ``feasible`` (bool) and ``reason`` (str, '' when
    feasible).  Statistics of
    infeasible executions are computed anyway.

  Raises:
    ConfigError: a row is not a valid execution for this application and
      system (the message names the row and the field).
  """
  import pandas as pd
  cols = ExecutionColumns.from_frame(executions, source)
  ev = evaluate_columns(application, system, cols, source=source)
  names = STAT_NAMES + EXTRA_STAT_NAMES
  arrays = stat_arrays(ev, names)
  out = executions.reset_index(drop=True).copy()
  stats = pd.DataFrame({name: arrays[name] for name in names})
  out = pd.concat([out, stats], axis=1)
  feasible = np.broadcast_to(ev.feasible, cols.shape)
  out['feasible'] = feasible
  reasons = [''] * len(out)
  for i in np.flatnonzero(~feasible):
    reasons[i] = ev.reason_message((int(i),))
  out['reason'] = reasons
  return out


__all__ = ['evaluate', 'evaluate_columns', 'check_compatible', 'STATS']
