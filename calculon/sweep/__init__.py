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

from calculon.sweep.runner import SweepSummary, plan, run_sweep
from calculon.sweep.spec import (
  Point, SearchOptions, SweepSpec, Variation, load_spec, parse_spec)
from calculon.sweep.store import read_sweep, schema
from calculon.sweep.task import PointResult, run_point

__all__ = ['SweepSummary', 'plan', 'run_sweep', 'Point', 'SearchOptions',
           'SweepSpec', 'Variation', 'load_spec', 'parse_spec', 'read_sweep',
           'schema', 'PointResult', 'run_point']
