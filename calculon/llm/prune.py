"""The branch and bound's names where earlier releases had them (it lives
in :mod:`calculon.search.bound`)."""

from calculon.search.bound import (  # noqa: F401
  FLAT_BATCH, INNER_AXES, L2_CELLS, PRUNE_MARGIN, cell_columns, expand,
  flat_columns, group_bound, max_bound, price_flat, rate_bound,
  reduced_bound, reduced_group, reduced_values, search_group)
