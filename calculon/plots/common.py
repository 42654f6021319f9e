"""Shared plotting helpers: a headless backend and saving figures."""

import io
import os

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402

from calculon import outputs  # noqa: E402


def save(fig, path, rescue=False):
  """Saves ``fig`` to ``path`` (format from the extension: png, pdf, svg,
  eps, ps, jpg), atomically (:func:`calculon.outputs.write_bytes`),
  creating the folder, and closes it.  Returns ``path``.

  Raises:
    calculon.outputs.WriteError: the file cannot be written.
  """
  fmt = os.path.splitext(os.fspath(path))[1].lstrip('.').lower() or 'png'
  try:
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, dpi=120, format=fmt)
  finally:
    plt.close(fig)
  outputs.ensure_dir(os.path.dirname(os.path.abspath(path)))
  outputs.write_bytes(path, buffer.getvalue(), rescue=rescue)
  return path


def figure(width=7.0, height=4.5):
  """A new figure and axes."""
  return plt.subplots(figsize=(width, height))
