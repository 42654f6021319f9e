"""Calculon-compatible Python API: ``Llm``, ``Llm.Application``,
``Llm.Execution``, ``Llm.Error``.

Users' scripts written for Calculon keep working::

    from calculon import System
    from calculon.llm import Llm
    app = Llm.Application(app_cfg)
    exe = Llm.Execution.from_json(exe_cfg)
    model = Llm(app, logger)
    model.compile(System(sys_cfg), exe)
    model.run(syst)
    stats = model.get_stats_json(include_layers)

A run is a batch of one through :func:`calculon.llm.engine.evaluate_columns`;
nothing here computes a formula.
"""

import logging
import math

import numpy as np

from calculon.config import Application, Execution, ExecutionColumns
from calculon.config.execution import ALL_FIELDS, FIELDS
from calculon.errors import ConfigError, Infeasible
from calculon.hardware import System
from calculon.llm.engine import evaluate_columns
from calculon.llm.model import MEM1_TOO_SMALL, MEM2_TOO_SMALL, OK
from calculon.llm.stats import (
  CALCULON_STAT_NAMES, STATS, STAT_NAMES, EXTRA_STATS, stat_value,
  time_breakdown)
from calculon.llm.layer_stats import layer_stats_json, layer_summary_json
from calculon.llm.space import (
  factors, tensor_parallelisms, pipeline_parallelisms, data_parallelism,
  pipeline_interleavings, microbatch_sizes, can_redo_ag)


def to_python(value, unit=None):
  """A JSON-ready Python number: None for NaN, int for integral byte and
  FLOP counts, float otherwise."""
  if isinstance(value, np.ndarray):
    value = value[()]
  if isinstance(value, (bool, np.bool_)):
    return bool(value)
  if isinstance(value, (int, np.integer)):
    return int(value)
  value = float(value)
  if math.isnan(value):
    return None
  if unit in ('B', 'FLOP') and value.is_integer() and abs(value) < 2 ** 53:
    return int(value)
  return value


class _Application:
  """Calculon's ``Llm.Application(cfg)``: the model's shape."""

  def __init__(self, cfg, source='<application>'):
    self.cfg = cfg
    self.config = cfg if isinstance(cfg, Application) else \
      Application.from_dict(cfg, source)
    for name in Application.FIELDS:
      setattr(self, name, getattr(self.config, name))

  def num_parameters(self):
    """Trainable parameters (see Application.num_parameters)."""
    return self.config.num_parameters()


class _Execution:
  """Calculon's ``Llm.Execution``: one execution strategy.

  ``Llm.Execution(*values)`` takes the 23 fields in Calculon's order;
  ``Llm.Execution.from_json(cfg)`` a dict.

  Raises:
    ConfigError: an invalid execution.
  """

  @staticmethod
  def fields():
    return FIELDS

  @staticmethod
  def from_json(cfg, source='<execution>'):
    return _Execution(config=Execution.from_dict(cfg, source), source=source)

  def __init__(self, *values, config=None, source='<execution>'):
    if config is None:
      if len(values) != len(FIELDS):
        raise ConfigError(f'Llm.Execution takes {len(FIELDS)} values in the '
                          f'order {FIELDS}, got {len(values)}')
      config = Execution.from_dict(dict(zip(FIELDS, values)))
    self.config = config
    self.source = source
    for name in ALL_FIELDS:
      setattr(self, name, getattr(config, name))
    self.global_batch_size = config.batch_size

  def get_json(self):
    return self.config.to_dict()

  def columns(self):
    """This execution as 0-d :class:`ExecutionColumns`."""
    cols = ExecutionColumns.from_records([self.config.to_dict()])
    for name in ALL_FIELDS:
      setattr(cols, name, np.asarray(getattr(cols, name))[0])
    return cols

  def get_peers_json(self):
    """Processor ids of each processor's TP, PP (next stage) and DP peers.

    Processor id = d * TP * PP + p * TP + t for DP rank d, PP rank p and TP
    rank t.
    """
    tp, pp, dp = self.tensor_par, self.pipeline_par, self.data_par
    peers = {}
    for d in range(dp):
      for p in range(pp):
        for t in range(tp):
          nid = d * tp * pp + p * tp + t
          entry = {}
          if tp > 1:
            entry['tensor'] = [d * tp * pp + p * tp + t2 for t2 in range(tp)]
          if pp > 1:
            entry['pipeline'] = d * tp * pp + ((p + 1) % pp) * tp + t
          if dp > 1:
            entry['data'] = [d2 * tp * pp + p * tp + t for d2 in range(dp)]
          peers[nid] = entry
    return peers


class Llm:
  """A transformer run with tensor, pipeline and data parallelism.

  Usage: ``Llm(app, log)``, then ``compile(system, execution)``, then
  ``run(system)``, then ``get_stats_json(include_layers)``.
  ``Llm(app, log, framework=NAME)`` prices the execution under that
  framework preset whatever it names (see :mod:`calculon.frameworks`);
  compile resolves the execution against its preset (the resolved one is
  ``model.exe``, what the preset set ``model.framework_settings``).

  Raises (from compile/run):
    ConfigError: invalid input (also for executions incompatible with the
      application or system).
    Llm.Error: the execution cannot run on the system (network tier too
      small or not filled, interleaving or offload constraints at compile;
      memory at run).
  """

  Application = _Application
  Execution = _Execution
  Error = Infeasible

  def __init__(self, app, log=None, framework=None):
    if not isinstance(app, _Application):
      app = _Application(app)
    self.app = app
    self.log = log or logging.getLogger('calculon')
    self.framework = framework
    self.framework_settings = {}
    self.exe = None
    self.sys = None
    self._eval = None
    self._executed = False

  # Search-space helpers, as in Calculon.
  _factors = staticmethod(factors)
  get_all_tensor_parallelisms = staticmethod(tensor_parallelisms)
  get_all_pipeline_parallelisms = staticmethod(pipeline_parallelisms)
  get_data_parallelism = staticmethod(data_parallelism)
  get_valid_pipeline_interleavings = staticmethod(pipeline_interleavings)
  get_valid_microbatch_sizes = staticmethod(microbatch_sizes)
  can_redo_ag = staticmethod(can_redo_ag)

  @staticmethod
  def get_stats_fields():
    """Calculon's statistics (modern runs add :data:`MODERN_STATS`)."""
    return CALCULON_STAT_NAMES

  def compile(self, sys, exe):
    """Checks ``exe`` against the application and system and builds the
    block.

    Raises:
      ConfigError, Llm.Error: see the class docstring.
    """
    if self._eval is not None:
      raise RuntimeError('Llm.compile() was already called')
    if not isinstance(exe, _Execution):
      exe = _Execution.from_json(exe)
    if not isinstance(sys, System):
      sys = System(sys)
    from calculon.frameworks import resolve_execution
    config, self.framework_settings = resolve_execution(
      self.app.config, exe.config, self.framework, exe.source)
    from calculon.config.fill import place_networks
    config = place_networks(config, sys.config.networks)
    exe = _Execution(config=config, source=exe.source)
    self.exe, self.sys = exe, sys
    ev = evaluate_columns(self.app.config, sys, exe.columns(),
                          source=exe.source)
    code = int(ev.compile_reason)
    if code != OK:
      raise Llm.Error(ev.reason_message())
    self._eval = ev

  def run(self, sys=None):
    """Prices the compiled execution.

    Raises:
      Llm.Error: memory tier 1 or 2 is too small.
    """
    if self._eval is None:
      raise RuntimeError('call Llm.compile() before Llm.run()')
    ev = self._eval
    if int(ev.reason) in (MEM1_TOO_SMALL, MEM2_TOO_SMALL):
      raise Llm.Error(ev.reason_message())
    self._executed = True

  @property
  def evaluation(self):
    """The underlying :class:`~calculon.llm.model.Evaluation`."""
    return self._eval

  def _require_run(self):
    if not self._executed:
      raise RuntimeError('call Llm.run() before reading statistics')

  @property
  def _stats(self):
    """Calculon's statistics for a Calculon run (an application and an
    execution without optional fields), else those and the modern ones."""
    calculon = self.app.config.is_calculon and \
      self.exe.config.framework == 'calculon' and \
      set(self.exe.config.written) <= set(FIELDS)
    return STATS[:len(CALCULON_STAT_NAMES)] if calculon else STATS

  def get_stats_values(self):
    """Statistics in :meth:`get_stats_fields` order."""
    self._require_run()
    return tuple(to_python(stat_value(self._eval, s), s.unit)
                 for s in self._stats)

  def get_stats_json(self, include_layers=False):
    """dict of every statistic (and per-layer statistics if asked):
    Calculon's, and for a run with modern features the modern ones; and
    ``time_breakdown``, the batch time term by term (an ordered dict
    name -> seconds summing to ``total_time``,
    :func:`calculon.llm.stats.time_breakdown`).
    ``include_layers='summary'`` gives each layer only the keys that the
    reports' model summary reads (:func:`layer_summary_json`)."""
    out = dict(zip((s.name for s in self._stats), self.get_stats_values()))
    out['time_breakdown'] = time_breakdown(self._eval)
    if len(self._stats) > len(CALCULON_STAT_NAMES):
      out['framework'] = self.exe.config.framework
      out['framework_settings'] = dict(self.framework_settings)
    if getattr(self.sys, 'measured', None) is not None:
      out['measured_kernels'] = self.sys.measured.terms()
    if include_layers:
      per_layer = (layer_summary_json if include_layers == 'summary'
                   else layer_stats_json)
      out['layers'] = [per_layer(layer) for layer in self._eval.layers]
    return out

  def get_extra_stats_json(self):
    """Statistics beyond Calculon's (tokens/s, MFU, HFU, memory per tier
    and kind...), see :data:`calculon.llm.stats.EXTRA_STATS`."""
    self._require_run()
    return {s.name: to_python(stat_value(self._eval, s), s.unit)
            for s in EXTRA_STATS}

  def display_stats(self):
    """Logs the human-readable report."""
    from calculon.report import RunData, text_report
    self._require_run()
    self.log.info(text_report(RunData.from_model(self)))
