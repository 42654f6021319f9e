"""Vectorized lookup of size-dependent efficiency curves."""

import numpy as np


class StepCurve:
  """Calculon's efficiency step function, evaluated on arrays.

  The configuration lists (threshold, efficiency) pairs with thresholds
  strictly decreasing and ending at 0; a size x gets the efficiency of the
  first pair whose threshold is <= x.  Equivalently, the pair with the largest
  threshold <= x, which is what :meth:`__call__` computes with a binary
  search.
  """

  def __init__(self, points):
    self.thresholds = np.array([t for t, _ in reversed(points)], dtype=float)
    self.values = np.array([e for _, e in reversed(points)], dtype=float)
    self._single = len(points) == 1

  def __call__(self, size):
    """Efficiency for ``size`` (array or scalar, same units as thresholds)."""
    if self._single:
      return self.values[0] + np.zeros(np.shape(size))
    idx = np.searchsorted(self.thresholds, size, side='right') - 1
    return self.values[np.maximum(idx, 0)]
