"""Shared plotting helpers: a headless backend and saving figures."""

import os

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402


def save(fig, path):
  """Saves ``fig`` to ``path`` (format from the extension), creating the
  directory, and closes it.  Returns ``path``."""
  folder = os.path.dirname(os.path.abspath(path))
  os.makedirs(folder, exist_ok=True)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return path


def figure(width=7.0, height=4.5):
  """A new figure and axes."""
  return plt.subplots(figsize=(width, height))
