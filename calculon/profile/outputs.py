"""Output paths of the profile commands, through the shared
:mod:`calculon.outputs` (checked before the work, written atomically)."""

from calculon import outputs


def check_output_file(path, suffixes=None, what='output'):
  """Checks that ``path`` can be written, before any work starts.

  Args:
    path: the file to write.
    suffixes: allowed endings (e.g. ('.json',)), or None for any.
    what: the option's name, for the message.

  Raises:
    ConfigError: wrong ending, the path is a directory, its folder is
      missing or not writable (one line).
  """
  outputs.check_output_path(path, tuple(suffixes or ()), what=what)


def check_output_dir(path, what='--report'):
  """Checks that directory ``path`` exists or can be created, and creates it.

  Raises:
    ConfigError: ``path`` is a file, or cannot be created or written.
  """
  outputs.check_output_path(path, want_dir=True, what=what)
  outputs.ensure_dir(path)


def write_atomic(path, data):
  """Writes ``data`` (str or bytes) to ``path`` atomically."""
  if isinstance(data, str):
    outputs.write_text(path, data)
  else:
    outputs.write_bytes(path, data)


def save_figure_atomic(fig, path, **kwargs):
  """Saves a matplotlib figure atomically (PNG)."""
  import io
  buf = io.BytesIO()
  fig.savefig(buf, format='png', **kwargs)
  write_atomic(path, buf.getvalue())
