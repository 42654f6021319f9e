"""Evaluate executions: one, a DataFrame of them, or a grid.

This is the single entry to the model.  :func:`evaluate_columns` checks the
executions against the application and the system (raising ConfigError for
input mistakes) and returns the lazy :class:`~calculon.llm.model.Evaluation`;
:func:`evaluate` does the same for a pandas DataFrame and returns a DataFrame
with every statistic plus ``feasible`` and ``reason``.
"""

import numpy as np

from calculon.config import Application, ExecutionColumns, check_rules
from calculon.config import parallel
from calculon.config.execution import (
  ATTENTION_AUTO, ATTENTION_GROUPED, ATTENTION_MULTIHEAD, ATTENTION_MULTIQUERY,
  ATTENTION_NAMES, DATATYPE_NAMES, RECIPE_TE, TP_COMM_AR)
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
  for field in ('tensor_par_net', 'pipeline_par_net', 'data_par_net',
                'context_par_net', 'expert_par_net'):
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
  i = _first((exe.precision_recipe == RECIPE_TE), shape)
  if i is not None:
    try:
      system.check_datatype('float16')
    except ConfigError:
      try:
        system.check_datatype('bfloat16')
      except ConfigError as err:
        raise ConfigError(
          f"{source}:{where(i)} field 'precision_recipe' = "
          '"transformer_engine" is not allowed: it runs everything but the '
          'linear layers in bfloat16 (or float16), and ' + str(err.allowed),
          source=source, field='precision_recipe',
          value='transformer_engine') from None
  _check_attention(app, exe, shape, where, source)
  _check_experts(app, exe, shape, where, source)
  _check_layout(app, exe, shape, where, source)
  tp = exe.tensor_par
  for what, size in (('hidden', app.hidden), ('feedforward', app.feedforward),
                     ('attn_heads', app.attn_heads)):
    i = _first(np.logical_not(parallel.tp_divides(size, tp)), shape)
    if i is not None:
      value = int(_at(tp, shape, i))
      raise ConfigError(
        f"{source}:{where(i)} field 'tensor_par' = {value} is not allowed: "
        f"it must divide the application's {what} ({size})",
        source=source, field='tensor_par', value=value)
  cp = exe.context_par
  i = _first(np.logical_not(
    parallel.cp_splits_sequence(app.seq_size, cp)), shape)
  if i is not None:
    value = int(_at(cp, shape, i))
    raise ConfigError(
      f"{source}:{where(i)} field 'context_par' = {value} is not allowed: "
      f"2 x context_par must divide the application's seq_size "
      f'({app.seq_size}); the causal mask is balanced over 2 x CP chunks '
      '(Megatron-Core context parallelism)',
      source=source, field='context_par', value=value)
  batch_seq = parallel.tokens_per_microbatch(exe.microbatch_size,
                                             app.seq_size, cp)
  bad = ((exe.tensor_par_comm_type != TP_COMM_AR) | app.is_moe) & \
    np.logical_not(parallel.tp_splits_tokens(batch_seq, tp))
  i = _first(bad, shape)
  if i is not None:
    value = int(_at(tp, shape, i))
    raise ConfigError(
      f"{source}:{where(i)} field 'tensor_par' = {value} is not allowed: with "
      "tensor_par_comm_type 'rs_ag' or 'p2p_rs_ag' (or experts, which "
      'route tokens / tensor_par per rank) it must divide '
      'microbatch_size * seq_size' + (' / context_par' if np.any(cp > 1)
                                      else '') +
      f' = {int(_at(batch_seq, shape, i))}',
      source=source, field='tensor_par', value=value)


def _check_layout(app, exe, shape, where, source):
  """Uneven stages (``pipeline_first_stage_blocks``,
  ``pipeline_last_stage_blocks``) against the application
  (:func:`~calculon.llm.terms.schedule.layout_violation`)."""
  from calculon.llm.terms import schedules
  from calculon.llm.terms.schedule import layout_violation
  first = np.asarray(exe.pipeline_first_stage_blocks)
  last = np.asarray(exe.pipeline_last_stage_blocks)
  fg = first != schedules.UNSET
  if not (np.any(fg) or np.any(last != schedules.UNSET)):
    return
  pp, vp = exe.pipeline_par, exe.pipeline_interleaving
  sched = schedules.effective(np.asarray(exe.pipeline_schedule), vp)
  code = layout_violation(app.num_blocks, pp, vp, first, last, sched)
  i = _first(code != 0, shape)
  if i is None:
    return
  name = 'pipeline_first_stage_blocks' if bool(_at(fg, shape, i)) else \
    'pipeline_last_stage_blocks'
  value = int(_at(first if name.startswith('pipeline_first') else last,
                  shape, i))
  c = int(_at(code, shape, i))
  if c == 1:
    why = 'uneven stages need pipeline_par > 1'
  elif c == 2:
    why = ('not with pipeline_schedule "dualpipe" (a rank holds its stage '
           'and the mirrored one)')
  elif c == 3:
    given = int(bool(_at(fg, shape, i))) + int(
      bool(_at(last != schedules.UNSET, shape, i)))
    left = app.num_blocks - int(_at(np.where(fg, first, 0), shape, i)) - \
      int(_at(np.where(last != schedules.UNSET, last, 0), shape, i))
    why = (f'the other {int(_at(pp, shape, i)) - given} pipeline ranks must '
           f"split the {left} blocks left of the application's "
           f'{app.num_blocks} evenly')
  else:
    why = ("every rank's blocks must be a multiple of pipeline_interleaving "
           f'= {int(_at(vp, shape, i))} (at least one block a chunk)')
  raise ConfigError(
    f"{source}:{where(i)} field '{name}' = {value} is not allowed: {why}",
    source=source, field=name, value=value)


def _check_experts(app, exe, shape, where, source):
  """Expert parallelism against the application (Megatron-Core: EP divides
  the experts; ETP divides each expert's MLP width).

  Raises:
    ConfigError: a contradiction.
  """
  def fail(field, i, allowed):
    value = int(_at(getattr(exe, field), shape, i))
    raise ConfigError(f"{source}:{where(i)} field '{field}' = {value} is not "
                      f'allowed: {allowed}', source=source, field=field,
                      value=value)
  if not app.is_moe:
    for field in ('expert_par', 'expert_tensor_par'):
      i = _first(getattr(exe, field) > 1, shape)
      if i is not None:
        fail(field, i, 'the application has no experts (num_experts); use 1')
    return
  i = _first(app.num_experts % exe.expert_par != 0, shape)
  if i is not None:
    fail('expert_par', i, f"it must divide the application's num_experts "
         f'({app.num_experts})')
  i = _first(app.moe_ffn_hidden % exe.expert_tensor_par != 0, shape)
  if i is not None:
    fail('expert_tensor_par', i, "it must divide the application's "
         f'moe_ffn_hidden ({app.moe_ffn_hidden})')


def _check_attention(app, exe, shape, where, source):
  """attention_type against the application's kv_heads, and the K/V heads
  against TP (Megatron-Core: num_query_groups must be a multiple or a
  divisor of the tensor-parallel size).

  Raises:
    ConfigError: a contradiction.
  """
  att = exe.attention_type
  heads, kv = app.attn_heads, app.kv_heads
  if kv is None:
    i = _first(att == ATTENTION_GROUPED, shape)
    if i is not None:
      raise ConfigError(
        f"{source}:{where(i)} field 'attention_type' = \"grouped\" is not "
        "allowed: grouped-query attention needs the application's kv_heads "
        '(use "multihead" or "multiquery", or set kv_heads)',
        source=source, field='attention_type', value='grouped')
    return
  implied = ATTENTION_MULTIHEAD if kv == heads else (
    ATTENTION_MULTIQUERY if kv == 1 else ATTENTION_GROUPED)
  i = _first((att != ATTENTION_AUTO) & (att != implied), shape)
  if i is not None:
    name = ATTENTION_NAMES[int(_at(att, shape, i))]
    raise ConfigError(
      f"{source}:{where(i)} field 'attention_type' = \"{name}\" is not "
      f"allowed: the application has kv_heads = {kv} of {heads} heads, i.e. "
      f'"{ATTENTION_NAMES[implied]}" (or leave attention_type out)',
      source=source, field='attention_type', value=name)
  tp = exe.tensor_par
  i = _first(np.logical_not(parallel.kv_heads_fit_tp(kv, tp)), shape)
  if i is not None:
    value = int(_at(tp, shape, i))
    raise ConfigError(
      f"{source}:{where(i)} field 'tensor_par' = {value} is not allowed: it "
      f"must be a multiple or a divisor of the application's kv_heads ({kv})",
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
