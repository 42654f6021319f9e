"""Output paths: checked before work starts, written atomically.

LOCAL HELPER (issue 11): a shared output-check / atomic-write helper is being
built for the whole CLI (issue 12).  When both are merged, replace
:func:`check_output_file`, :func:`check_output_dir` and :func:`write_atomic`
by that helper; nothing else in ``calculon.profile`` writes files directly.
"""

import os
import tempfile

from calculon.errors import ConfigError


def check_output_file(path, suffixes=None, what='output'):
  """Checks that ``path`` can be written, before any work starts.

  Args:
    path: the file to write.
    suffixes: allowed endings (e.g. ('.json',)), or None for any.
    what: the option's name, for the message.

  Raises:
    ConfigError: wrong ending, the path is a directory, its folder is
      missing or not writable.
  """
  if suffixes and not any(path.endswith(s) for s in suffixes):
    raise ConfigError(f'{path}: {what} must end in ' + ' or '.join(suffixes),
                      source=path, field=what, value=path,
                      allowed=' or '.join(suffixes))
  if os.path.isdir(path):
    raise ConfigError(f'{path}: {what} is a directory, not a file',
                      source=path, field=what, value=path)
  folder = os.path.dirname(os.path.abspath(path))
  if not os.path.isdir(folder):
    raise ConfigError(f'{path}: {what} folder {folder} does not exist',
                      source=path, field=what, value=path)
  if not os.access(folder, os.W_OK):
    raise ConfigError(f'{path}: {what} folder {folder} is not writable',
                      source=path, field=what, value=path)


def check_output_dir(path, what='--report'):
  """Checks that directory ``path`` exists or can be created, and creates it.

  Raises:
    ConfigError: ``path`` is a file, or cannot be created or written.
  """
  if os.path.exists(path) and not os.path.isdir(path):
    raise ConfigError(f'{path}: {what} is a file, not a directory',
                      source=path, field=what, value=path)
  try:
    os.makedirs(path, exist_ok=True)
  except OSError as err:
    raise ConfigError(f'{path}: {what} cannot be created: {err.strerror}',
                      source=path, field=what, value=path) from None
  if not os.access(path, os.W_OK):
    raise ConfigError(f'{path}: {what} is not writable', source=path,
                      field=what, value=path)


def write_atomic(path, data):
  """Writes ``data`` (str or bytes) to ``path`` atomically: a temporary file
  in the same folder, then ``os.replace``."""
  folder = os.path.dirname(os.path.abspath(path))
  fd, tmp = tempfile.mkstemp(dir=folder, prefix='.' + os.path.basename(path),
                             suffix='.tmp')
  try:
    with os.fdopen(fd, 'wb') as out:
      out.write(data.encode('utf-8') if isinstance(data, str) else data)
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.unlink(tmp)
    raise


def save_figure_atomic(fig, path, **kwargs):
  """Saves a matplotlib figure atomically (PNG)."""
  import io
  buf = io.BytesIO()
  fig.savefig(buf, format='png', **kwargs)
  write_atomic(path, buf.getvalue())
