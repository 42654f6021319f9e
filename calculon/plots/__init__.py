"""Figures of results (matplotlib, Agg backend; reads result files only).

Modules: :mod:`calculon.plots.search` (search and all-executions outputs),
:mod:`calculon.plots.sweep` (sweep outputs), :mod:`calculon.plots.common`
(shared helpers).
"""


def PLOT_MODULES():  # noqa: N802 -- a registry, imported lazily
  from calculon.plots import search, sweep
  return [search, sweep]
