"""Co-design sweeps: many optimal-execution searches, on dask.distributed.

A sweep spec (YAML or JSON; docs/sweep.md) lists applications, systems,
variations of the systems (scale factors or values of any numeric field:
TFLOP/s, memory capacity and bandwidth, each network tier's bandwidth, size,
latency...), processor counts, maximum batch sizes, datatypes and search
options.  Each point of their cartesian product is one search; each yields
one row per best execution (its parameters, the execution, its statistics).

    from calculon.sweep import load_spec, run_sweep, read_sweep
    spec = load_spec('examples/sweep-gpt3-1t.yaml')
    summary = run_sweep(spec, 'out.parquet')              # embedded cluster
    summary = run_sweep(spec, 'out.parquet', scheduler='tcp://host:8786')
    frame = read_sweep('out.parquet')                     # pandas DataFrame

Modules: :mod:`~calculon.sweep.spec` (reading and validating specs, points),
:mod:`~calculon.sweep.task` (one point's search, run on workers),
:mod:`~calculon.sweep.store` (the Parquet dataset), and
:mod:`~calculon.sweep.runner` (dask orchestration, progress, resume).
"""

import importlib

#: Default batch of ``calculon sweep``: a part is written every this many
#: points or seconds (here, not in the runner, so that the command line
#: reads them without importing dask, pyarrow or the model).
DEFAULT_BATCH_POINTS = 16
DEFAULT_BATCH_S = 30.0

#: Public names and their modules, imported on first use (start-up).
_EXPORTS = {
  'SweepSummary': 'runner', 'plan': 'runner', 'run_sweep': 'runner',
  'Point': 'spec', 'SearchOptions': 'spec', 'SweepSpec': 'spec',
  'Variation': 'spec', 'load_spec': 'spec', 'parse_spec': 'spec',
  'read_sweep': 'store', 'schema': 'store',
  'PointResult': 'task', 'run_point': 'task',
}

__all__ = list(_EXPORTS)


def __getattr__(name):
  module = _EXPORTS.get(name)
  if module is None:
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
  value = getattr(importlib.import_module(f'{__name__}.{module}'), name)
  globals()[name] = value
  return value


def __dir__():
  return sorted(set(globals()) | set(_EXPORTS))
