"""Output files: checked before the work, written atomically, never lost.

Every file or folder a command writes goes through this module:

1. **Before any work**, the command's handler calls
   :func:`check_output_path` on each output.  A path that cannot be written
   (its folder is missing or read-only, it is a folder where a file is
   wanted or the reverse, its extension is not supported, it is a device)
   raises :class:`~calculon.errors.ConfigError` with one line naming the
   path and the problem; the CLI prints it and exits 2, and nothing runs.

2. **Writing** goes to a hidden temporary file in the destination's own
   folder (``.NAME.XXXXXXXX.tmp``), which is flushed, synced to disk and
   then renamed over the destination (``os.replace``, atomic on POSIX).  A
   reader sees the old file or the complete new one, never a half-written
   file; a failure removes the temporary file.

   * :func:`write_bytes` / :func:`write_text` -- content already in memory
     (``.gz`` paths are gzip-compressed by :func:`write_text`).
   * :func:`atomic_open` -- a file object, for streaming writers.
   * :func:`atomic_path` -- a temporary path, for libraries that want a
     file name (pyarrow, gzip); pass them the format explicitly, the
     temporary name ends in ``.tmp``.
   * :func:`ensure_dir` -- creates a folder output (``--report DIR``).

3. **A write that fails after the work** (disk full, folder removed or made
   read-only while the work ran) raises :class:`WriteError` (an OSError)
   with one line.  With ``rescue=True`` the complete content is first saved
   elsewhere -- next to the destination, else in the current folder, else
   in the system's temporary folder, as ``NAME.rescued.EXT`` -- and the
   message says where.  The CLI prints the line and exits 2.

Example (what a command does)::

    from calculon import outputs
    outputs.check_output_path(args.output, outputs.JSON_KINDS,
                              what='search output')      # before the work
    ...                                                   # the work
    outputs.write_text(args.output, text, rescue=True)   # atomic

    with outputs.atomic_open('big.csv', 'w') as fd:      # streaming
      for chunk in chunks:
        fd.write(chunk)

Only light standard-library imports at the top: every command loads this
module at start-up.
"""

import contextlib
import errno
import os
import stat
import sys

from calculon.errors import ConfigError

#: Extensions (``kinds``) of the outputs calculon writes.
JSON_KINDS = ('.json', '.json.gz')
CSV_KINDS = ('.csv', '.csv.gz')
PARQUET_KINDS = ('.parquet',)
TABLE_KINDS = CSV_KINDS + PARQUET_KINDS + JSON_KINDS
#: Image formats written with matplotlib (Agg backend).
IMAGE_KINDS = ('.png', '.pdf', '.svg', '.eps', '.ps', '.jpg', '.jpeg')

_NAME_MAX = 255


class WriteError(OSError):
  """An output could not be written (after the work was done).

  Attributes:
    path: the destination asked for.
    error: the underlying OSError.
    rescued: where the complete content was saved instead (a path, or
      ``'stdout'``), or None when it could not be kept.
  """

  def __init__(self, path, error, rescued=None):
    super().__init__(getattr(error, 'errno', None), str(error))
    self.path, self.error, self.rescued = path, error, rescued

  def __str__(self):
    err = self.error
    reason = err.strerror if isinstance(err, OSError) and err.strerror \
      else str(err)
    where = f'; the result is saved in {self.rescued} instead' \
      if self.rescued else '; nothing was written there'
    return f'{self.path}: cannot be written: {reason}{where}'


# -- checking ------------------------------------------------------------------

def extension_of(path, kinds):
  """The entry of ``kinds`` that ``path`` ends with (longest first), or
  None."""
  for kind in sorted(kinds, key=len, reverse=True):
    if path.endswith(kind) and len(os.path.basename(path)) > len(kind):
      return kind
  return None


def check_output_path(path, kinds=(), *, want_dir=False, what='output',
                      option=None, allow_stdout=False):
  """Checks, before any work, that ``path`` can be written.

  Args:
    path: the output path as the user gave it.
    kinds: allowed extensions (e.g. :data:`JSON_KINDS`); empty: any.
    want_dir: the output is a folder (created if missing; its parent must
      exist) instead of a file.
    what: what the output is, for the message ('stats output', ...).
    option: the command-line option naming it ('--report'), for the
      message.
    allow_stdout: ``'-'`` (standard output) is allowed.

  Returns:
    ``path``.

  Raises:
    ConfigError: one line ``[OPTION ]PATH: PROBLEM``: an empty path, an
      unsupported extension, a folder where a file is wanted or the
      reverse, a device or other non-regular file, a missing parent folder,
      a parent that is not a folder, a folder where no file can be created
      (checked by creating and removing a hidden probe file), a read-only
      existing file, a name too long.
  """
  label = f'{option} {path}' if option else str(path)

  def bad(problem):
    return ConfigError(f'{label}: {problem}', source=path, field=option,
                       value=path, allowed=problem)
  if path is None or str(path) == '':
    raise ConfigError(f'{option or what}: the path is empty', source=option,
                      field=option, value=path)
  path = os.fspath(path)
  if allow_stdout and path == '-':
    return path
  if kinds and extension_of(path, kinds) is None:
    allowed = (["'-'"] if allow_stdout else []) + [f'*{k}' for k in kinds]
    text = allowed[0] if len(allowed) == 1 else \
      ', '.join(allowed[:-1]) + ' or ' + allowed[-1]
    raise bad(f'unsupported extension: {what} must be {text}')
  name = os.path.basename(path.rstrip('/' + os.sep)) or path
  if len(os.fsencode(name)) > _NAME_MAX:
    raise bad(f'the name is too long ({len(os.fsencode(name))} bytes, at '
              f'most {_NAME_MAX})')
  try:
    st = os.stat(path)
  except FileNotFoundError:
    st = None
  except NotADirectoryError:
    st = None  # a parent is a file: reported below
  except OSError as err:
    raise bad(f'cannot be accessed: {err.strerror}') from None
  if want_dir:
    if st is not None:
      if not stat.S_ISDIR(st.st_mode):
        raise bad(f'is a file, not a folder ({what} is a folder)')
      _probe(path, bad, path)
      return path
  elif st is not None:
    if stat.S_ISDIR(st.st_mode):
      raise bad(f'is a folder, not a file ({what} is a file)')
    if not stat.S_ISREG(st.st_mode):
      raise bad('is not a regular file (a device, pipe or socket); '
                f'{what} must be a file')
    if not os.access(path, os.W_OK):
      raise bad('exists and is read-only')
  parent = os.path.dirname(os.path.abspath(path.rstrip('/' + os.sep) or
                                           path))
  try:
    pst = os.stat(parent)
  except FileNotFoundError:
    raise bad(f'folder {_show_parent(path, parent)} does not exist (create '
              'it first)') from None
  except NotADirectoryError:
    raise bad(f'{_show_parent(path, parent)} is not a folder') from None
  except OSError as err:
    raise bad(f'folder {_show_parent(path, parent)} cannot be accessed: '
              f'{err.strerror}') from None
  if not stat.S_ISDIR(pst.st_mode):
    raise bad(f'{_show_parent(path, parent)} is not a folder')
  _probe(parent, bad, _show_parent(path, parent))
  return path


def _show_parent(path, parent):
  """The parent folder as the user would write it."""
  given = os.path.dirname(path.rstrip('/' + os.sep))
  return given if given else parent


def _probe(folder, bad, shown):
  """Creates and removes a hidden file in ``folder`` (shown as ``shown``):
  the one reliable test (permissions, read-only file systems, /proc, a
  process running as root)."""
  try:
    fd, probe = _create_temp(folder, '.calculon-probe')
  except OSError as err:
    raise bad(f'folder {shown} is not writable: {err.strerror}') from None
  os.close(fd)
  try:
    os.remove(probe)
  except OSError:
    pass


# -- writing -------------------------------------------------------------------

def _create_temp(folder, base):
  """(fd, path) of a new empty file ``.BASE.XXXXXXXX.tmp`` in ``folder``
  (mode 0666 less the umask, as a normal output)."""
  base = base.lstrip('.')[:_NAME_MAX - 32]
  for _ in range(100):
    tmp = os.path.join(folder, f'.{base}.{os.urandom(4).hex()}.tmp')
    try:
      return os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL |
                     getattr(os, 'O_CLOEXEC', 0), 0o666), tmp
    except FileExistsError:
      continue
  raise FileExistsError(errno.EEXIST, 'no free temporary name', folder)


def _final(path):
  """The file really written: the target of a symbolic link (so a link
  keeps pointing at the new content)."""
  path = os.fspath(path)
  return os.path.realpath(path) if os.path.islink(path) else path


def _remove(path):
  try:
    os.remove(path)
  except OSError:
    pass


class _Temp:
  """The temporary file of one atomic write (see :func:`atomic_path`)."""

  def __init__(self, path):
    self.path = os.fspath(path)
    self.final = _final(self.path)
    folder = os.path.dirname(self.final) or '.'
    try:
      self.fd, self.tmp = _create_temp(folder, os.path.basename(self.final))
    except OSError as err:
      raise WriteError(self.path, err) from None

  def abort(self):
    os.close(self.fd)
    _remove(self.tmp)

  def commit(self, rescue):
    """Syncs and renames into place.  On failure: WriteError, after saving
    the content elsewhere when ``rescue``."""
    fd = self.fd
    try:
      # A library may have replaced the file behind the name: sync and keep
      # what the name holds now (when the folder still exists).
      try:
        same = os.path.samestat(os.stat(self.tmp), os.fstat(fd))
      except OSError:
        same = True
      if not same:
        os.close(fd)
        fd = self.fd = os.open(self.tmp, os.O_RDONLY)
      os.fsync(fd)
      os.replace(self.tmp, self.final)
    except OSError as err:
      saved = _rescue_fd(self.path, fd) if rescue else None
      self.abort()
      raise WriteError(self.path, err, saved) from None
    os.close(fd)


@contextlib.contextmanager
def _committing(temp, rescue):
  """Renames ``temp`` (a :class:`_Temp`) into place when the block ends
  without an exception; otherwise removes it: an OSError becomes a
  WriteError, anything else propagates unchanged."""
  try:
    yield
  except OSError as err:
    temp.abort()
    raise WriteError(temp.path, err) from err
  except BaseException:
    temp.abort()
    raise
  temp.commit(rescue)


@contextlib.contextmanager
def atomic_path(path, *, rescue=False):
  """A temporary path in ``path``'s folder, renamed to ``path`` when the
  block ends without an exception.

  For libraries that write to a file name (pyarrow writers, gzip.open,
  pandas): write to the yielded path (it exists, empty; its name ends in
  ``.tmp``, so give the library the format).  This module keeps the file
  open meanwhile, so its content survives the folder being removed.

  Args:
    path: the destination (a symbolic link is followed).
    rescue: when the rename fails (folder removed, made read-only...),
      save the complete content elsewhere (see the module's docstring).

  Raises:
    WriteError: the temporary file cannot be created, the block raised an
      OSError (the temporary file is removed), or the final sync or rename
      failed.  Other exceptions of the block (KeyboardInterrupt, bugs)
      remove the temporary file and propagate unchanged.
  """
  temp = _Temp(path)
  with _committing(temp, rescue):
    yield temp.tmp


@contextlib.contextmanager
def atomic_open(path, mode='wb', *, rescue=False, encoding='utf-8'):
  """A file object (``mode`` 'wb' or 'w') writing atomically to ``path``.

  Same rules as :func:`atomic_path`; the content is renamed into place when
  the block ends without an exception (no compression: wrap the file object
  in ``gzip.GzipFile(fileobj=...)`` for ``.gz``).

  Raises:
    WriteError: as :func:`atomic_path`; also when flushing fails (disk
      full).
    ValueError: ``mode`` is not 'wb' or 'w'.
  """
  if mode not in ('wb', 'w'):
    raise ValueError(f"atomic_open: mode {mode!r} must be 'wb' or 'w'")
  temp = _Temp(path)
  try:
    fd = os.dup(temp.fd)
    fobj = open(fd, mode, encoding=None if 'b' in mode else encoding,
                closefd=True)
  except BaseException:
    temp.abort()
    raise
  with _committing(temp, rescue):
    try:
      yield fobj
    finally:
      fobj.close()  # flushes: may raise (disk full)


def ensure_dir(path):
  """Creates the folder ``path`` (and missing parents) if needed; returns
  it.

  Raises:
    WriteError: it cannot be created (or is a file).
  """
  try:
    os.makedirs(path, exist_ok=True)
  except OSError as err:
    raise WriteError(path, err) from None
  return path


def write_bytes(path, data, *, rescue=False):
  """Writes ``data`` (bytes) to ``path`` atomically.

  Args:
    path: the destination.
    data: bytes.
    rescue: on any failure, save ``data`` elsewhere first (see the module's
      docstring) and name that place in the WriteError.

  Returns:
    ``path``.

  Raises:
    WriteError: the write failed (``rescued`` says where the content went).
  """
  try:
    with atomic_open(path, 'wb') as fd:
      fd.write(data)
  except WriteError as err:
    if rescue and err.rescued is None:
      err.rescued = _rescue_bytes(err.path, data)
    raise
  return path


def write_text(path, text, *, rescue=False, compresslevel=9):
  """Writes ``text`` (UTF-8) to ``path`` atomically, gzip-compressed when
  ``path`` ends in ``.gz``.  Same rules as :func:`write_bytes`."""
  data = text.encode('utf-8')
  if os.fspath(path).endswith('.gz'):
    import gzip
    data = gzip.compress(data, compresslevel=compresslevel)
  return write_bytes(path, data, rescue=rescue)


# -- rescue ----------------------------------------------------------------------

def _split_ext(name):
  for compound in ('.json.gz', '.csv.gz', '.tar.gz'):
    if name.endswith(compound) and len(name) > len(compound):
      return name[:-len(compound)], compound
  stem, ext = os.path.splitext(name)
  return (stem, ext) if stem else (name, '')


def rescue_candidates(path):
  """Where the content of a failed write of ``path`` is saved, in order:
  ``path``'s folder, the current folder, the system's temporary folder
  (each as ``NAME.rescued.EXT``, ``NAME.rescued-2.EXT``...)."""
  stem, ext = _split_ext(os.path.basename(os.fspath(path)) or 'output')
  folders = [os.path.dirname(os.path.abspath(path))]
  try:
    folders.append(os.getcwd())
  except OSError:
    pass
  import tempfile
  try:
    folders.append(tempfile.gettempdir())
  except OSError:  # no usable temporary folder
    pass
  seen = []
  for folder in folders:
    if folder in seen:
      continue
    seen.append(folder)
    for i in range(1, 100):
      name = f'{stem}.rescued{ext}' if i == 1 else f'{stem}.rescued-{i}{ext}'
      candidate = os.path.join(folder, name)
      if not os.path.lexists(candidate):
        yield candidate
        break


def _rescue_bytes(path, data):
  for candidate in rescue_candidates(path):
    try:
      with atomic_open(candidate, 'wb') as fd:
        fd.write(data)
    except OSError:
      continue
    return candidate
  return None


def _rescue_fd(path, fd):
  for candidate in rescue_candidates(path):
    try:
      with atomic_open(candidate, 'wb') as out:
        os.lseek(fd, 0, os.SEEK_SET)
        while True:
          chunk = os.read(fd, 1 << 20)
          if not chunk:
            break
          out.write(chunk)
    except OSError:
      continue
    return candidate
  return None


def print_rescue(text, stream=None):
  """Last resort: ``text`` to standard output; returns ``'stdout'`` (for
  :attr:`WriteError.rescued`)."""
  stream = stream or sys.stdout
  stream.write(text if text.endswith('\n') else text + '\n')
  stream.flush()
  return 'stdout (printed above)'
