"""Field-by-field reading of JSON objects with messages a user can act on.

Every configuration class reads its JSON through :class:`Reader`, so every
mistake is reported the same way: where the value came from, the field, the
value, and what is allowed.  Nothing here raises anything but
:class:`~calculon.errors.ConfigError`.
"""

import difflib
import json
import math
import numbers

from calculon.errors import ConfigError


def show(value):
  """A value as the user wrote it in JSON (true, null, "text", 4.5)."""
  try:
    text = json.dumps(value)
  except (TypeError, ValueError):
    text = repr(value)
  return text if len(text) <= 60 else text[:57] + '...'


class Spec:
  """What one field accepts.

  Args:
    kind: 'int' (an integer, not a boolean), 'number' (int or float, finite),
      'bool', 'str', 'list', 'dict'.
    lo, hi: inclusive bounds for numbers unless lo_open/hi_open.
    choices: allowed values for strings.
    nullable: None is allowed.
  """

  def __init__(self, kind, lo=None, hi=None, lo_open=False, hi_open=False,
               choices=None, nullable=False):
    self.kind = kind
    self.lo, self.hi = lo, hi
    self.lo_open, self.hi_open = lo_open, hi_open
    self.choices = tuple(choices) if choices is not None else None
    self.nullable = nullable

  def describe(self):
    """Human text for what the field accepts, e.g. 'an integer >= 1'."""
    if self.choices is not None:
      text = 'one of ' + ', '.join(show(c) for c in self.choices)
    elif self.kind == 'bool':
      text = 'true or false'
    elif self.kind in ('int', 'number'):
      text = 'an integer' if self.kind == 'int' else 'a number'
      bounds = []
      if self.lo is not None:
        bounds.append(('> ' if self.lo_open else '>= ') + _num(self.lo))
      if self.hi is not None:
        bounds.append(('< ' if self.hi_open else '<= ') + _num(self.hi))
      if bounds:
        text += ' ' + ' and '.join(bounds)
    elif self.kind == 'list':
      text = 'a list'
    elif self.kind == 'dict':
      text = 'an object'
    else:
      text = 'a string'
    if self.nullable:
      text += ' (or null)'
    return text

  def accepts(self, value):
    """True when ``value`` satisfies this spec."""
    if value is None:
      return self.nullable
    if self.kind == 'bool':
      return isinstance(value, bool)
    if self.kind == 'str':
      return isinstance(value, str) and (
        self.choices is None or value in self.choices)
    if self.kind == 'list':
      return isinstance(value, list)
    if self.kind == 'dict':
      return isinstance(value, dict)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
      return False
    if self.kind == 'int' and not isinstance(value, numbers.Integral):
      return False
    if not math.isfinite(value):
      return False
    if self.lo is not None and (value <= self.lo if self.lo_open
                                else value < self.lo):
      return False
    if self.hi is not None and (value >= self.hi if self.hi_open
                                else value > self.hi):
      return False
    return True


def _num(x):
  return str(int(x)) if float(x).is_integer() else repr(x)


class Reader:
  """Reads the fields of one JSON object, remembering which were used.

  Args:
    obj: the decoded JSON object.
    source: file name or label, first word of every message.
    path: dotted path of this object inside the file ('' for the top).
    known: every field name this object may carry (the field registry's),
      beyond those read: an unknown field is matched against them for a
      did-you-mean.

  Raises:
    ConfigError: when ``obj`` is not an object.
  """

  def __init__(self, obj, source, path='', known=()):
    self.source = source
    self.path = path
    self.known_names = tuple(known)
    if not isinstance(obj, dict):
      raise ConfigError(
        f'{source}: {self._where()} must be a JSON object, got {show(obj)}',
        source=source, field=path or None, value=obj,
        allowed='a JSON object')
    self.obj = obj
    self._used = set()

  def _where(self, name=None):
    if name is None:
      return self.path or 'the top level'
    return f'{self.path}.{name}' if self.path else name

  def field_path(self, name):
    """Dotted path of a field of this object."""
    return self._where(name)

  def get(self, name, spec):
    """Returns the value of field ``name`` after checking it against ``spec``.

    Raises:
      ConfigError: the field is missing or its value is not accepted.
    """
    self._used.add(name)
    if name not in self.obj:
      raise ConfigError(
        f"{self.source}: missing field '{self._where(name)}' "
        f'({spec.describe()})',
        source=self.source, field=self._where(name), allowed=spec.describe())
    value = self.obj[name]
    if not spec.accepts(value):
      self.fail(name, value, spec.describe())
    return value

  def fail(self, name, value, allowed):
    """Raises the standard message for a bad value of field ``name``."""
    raise ConfigError(
      f"{self.source}: field '{self._where(name)}' = {show(value)} is not "
      f'allowed: {allowed}',
      source=self.source, field=self._where(name), value=value,
      allowed=allowed)

  #: Descriptive fields any file may carry (ignored by the model).
  META_FIELDS = ('name', 'source', 'notes')

  def meta(self):
    """Reads the descriptive fields (:data:`META_FIELDS`: a string or a list
    of strings each) and returns them as a dict.

    Raises:
      ConfigError: a descriptive field is neither.
    """
    out = {}
    for name in self.META_FIELDS:
      if name not in self.obj:
        continue
      self._used.add(name)
      value = self.obj[name]
      if not (isinstance(value, str) or (
          isinstance(value, list) and all(isinstance(v, str) for v in value))):
        self.fail(name, value, 'a string or a list of strings')
      out[name] = value
    return out

  def require(self, specs):
    """Checks that every field of ``specs`` ({name: Spec}) is present,
    naming all the missing ones in one message.

    Raises:
      ConfigError: some are missing (``missing field 'X' (what it
        accepts)``, then ``; also missing: 'Y' (...), 'Z' (...)``).
    """
    missing = [n for n in specs if n not in self.obj]
    if not missing:
      return
    first = missing[0]
    text = f"missing field '{self._where(first)}' ({specs[first].describe()})"
    if len(missing) > 1:
      text += '; also missing: ' + ', '.join(
        f"'{self._where(n)}' ({specs[n].describe()})" for n in missing[1:])
    raise ConfigError(f'{self.source}: {text}', source=self.source,
                      field=self._where(missing[0]),
                      allowed=specs[missing[0]].describe())

  def check_names(self, specs):
    """Checks the object's field names before reading its values: a typo
    of a required field (an unknown name close to a missing one) is named
    as the typo; then every missing field of ``specs`` ({name: Spec}), in
    one message; then an unknown field, with a did-you-mean over the
    reader's ``known`` names.

    Raises:
      ConfigError: see :meth:`unknown` and :meth:`require`.
    """
    missing = [n for n in specs if n not in self.obj]
    # More than half the required fields missing: the wrong kind of file,
    # answered with what is missing rather than a did-you-mean.
    if missing and 2 * len(missing) > len(specs):
      self.require(specs)
    if missing:
      names = set(self._used) | set(self.known_names)
      for name in self.obj:
        close = difflib.get_close_matches(str(name), missing, n=1,
                                          cutoff=0.6)
        if name not in names and close:
          raise ConfigError(
            f"{self.source}: unknown field '{self._where(name)}' "
            f"(did you mean '{self._where(close[0])}'?)",
            source=self.source, field=self._where(name),
            value=self.obj[name], allowed=close[0])
      self.require(specs)
    self.unknown()

  def unknown(self, known=None):
    """Rejects a field outside ``known`` (default: the reader's ``known``)
    and the fields read so far, suggesting the closest known name
    (:func:`difflib.get_close_matches`).

    Raises:
      ConfigError: ``unknown field 'X' (did you mean 'Y'?)``, or with the
        allowed fields when none is close.
    """
    names = set(self._used) | set(
      self.known_names if known is None else known)
    unknown = [k for k in self.obj if k not in names]
    if not unknown:
      return
    name = unknown[0]
    close = difflib.get_close_matches(str(name), sorted(names), n=1,
                                      cutoff=0.6)
    if close:
      hint = f"did you mean '{self._where(close[0])}'?"
      allowed = close[0]
    else:
      allowed = ', '.join(sorted(names))
      hint = f'allowed fields: {allowed}'
    raise ConfigError(
      f"{self.source}: unknown field '{self._where(name)}' ({hint})",
      source=self.source, field=self._where(name), value=self.obj[name],
      allowed=allowed)

  def finish(self):
    """Rejects fields that were never read (typos, unsupported options),
    with a did-you-mean over the known and the read fields.

    Raises:
      ConfigError: an unknown field is present.
    """
    self.unknown()
