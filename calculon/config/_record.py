"""``@frozen_record``: a frozen dataclass with shared, not generated,
methods.

``@dataclass(frozen=True)`` writes the source of ``__init__``,
``__repr__``, ``__eq__``, ``__hash__``, ``__setattr__`` and
``__delattr__`` for each class and compiles it with ``exec`` when the
module is imported: 9 ms for the nine configuration classes, about 5 % of
a whole ``calculon llm`` process (docs/performance.md, "Start-up").
:func:`frozen_record` lets :mod:`dataclasses` collect the fields (so
``dataclasses.fields``, ``asdict``, ``replace`` and ``is_dataclass`` work
as before) and gives the class the same behaviour through functions
written once, here:

* ``__init__``: positional or keyword arguments in field order, class
  defaults and ``default_factory``, the same ``TypeError`` for a missing,
  repeated or unknown argument; ``__post_init__`` is called if defined;
* ``__setattr__`` / ``__delattr__`` raise
  :class:`dataclasses.FrozenInstanceError` for the class's own instances
  (for a subclass's instances, only for the fields), as a frozen
  dataclass does;
* ``__eq__``, ``__hash__`` and ``__repr__`` over the fields (those with
  ``compare`` / ``hash`` / ``repr`` set), in order.

Each instance pays a Python loop over its fields in ``__init__`` (about
10 us for the 40 fields of an execution); the configuration classes are
built a few times per run, never per searched execution.
"""

import dataclasses
import reprlib

_MISSING = dataclasses.MISSING


def frozen_record(cls):
  """Class decorator: ``cls`` as a frozen dataclass with shared methods.

  Raises:
    TypeError: ``cls`` defines one of the methods that
      :func:`frozen_record` provides (it would be silently replaced).
    ValueError: a mutable default (from :func:`dataclasses.dataclass`).
  """
  for name in ('__init__', '__repr__', '__eq__', '__hash__', '__setattr__',
               '__delattr__'):
    if name in cls.__dict__ and not (name == '__hash__'
                                     and cls.__dict__[name] is None):
      raise TypeError(f'@frozen_record: {cls.__name__} defines {name}')
  cls = dataclasses.dataclass(init=False, repr=False, eq=False)(cls)
  fields = dataclasses.fields(cls)
  cls._record_init = tuple(
    (f.name, f.default, f.default_factory) for f in fields if f.init)
  cls._record_names = frozenset(f.name for f in fields)
  cls._record_repr = tuple(f.name for f in fields if f.repr)
  cls._record_compare = tuple(f.name for f in fields if f.compare)
  cls._record_hash = tuple(f.name for f in fields
                           if (f.compare if f.hash is None else f.hash))
  cls._record_cls = cls
  cls.__init__ = _init
  cls.__repr__ = _repr
  cls.__eq__ = _eq
  cls.__hash__ = _hash
  cls.__setattr__ = _setattr
  cls.__delattr__ = _delattr
  return cls


def _init(self, *args, **kwargs):
  spec = self._record_init
  name = f'{type(self).__qualname__}.__init__()'
  if len(args) > len(spec):
    required = sum(1 for _, default, factory in spec
                   if default is _MISSING and factory is _MISSING)
    most = len(spec) + 1
    takes = (f'{most} positional argument{"s" if most > 1 else ""}'
             if required == len(spec) else
             f'from {required + 1} to {most} positional arguments')
    raise TypeError(f'{name} takes {takes} but {len(args) + 1} were given')
  for key in kwargs:
    if not any(key == field for field, _, _ in spec):
      raise TypeError(f"{name} got an unexpected keyword argument '{key}'")
  missing = []
  for i, (field, default, factory) in enumerate(spec):
    if i < len(args):
      if field in kwargs:
        raise TypeError(f"{name} got multiple values for argument '{field}'")
      value = args[i]
    elif field in kwargs:
      value = kwargs[field]
    elif default is not _MISSING:
      value = default
    elif factory is not _MISSING:
      value = factory()
    else:
      missing.append(f"'{field}'")
      continue
    object.__setattr__(self, field, value)
  if missing:
    names = (' and '.join(missing) if len(missing) < 3 else
             ', '.join(missing[:-1]) + ', and ' + missing[-1])
    raise TypeError(f'{name} missing {len(missing)} required positional '
                    f'argument{"s" if len(missing) > 1 else ""}: {names}')
  post = getattr(self, '__post_init__', None)
  if post is not None:
    post()


@reprlib.recursive_repr()
def _repr(self):
  body = ', '.join(f'{n}={getattr(self, n)!r}' for n in self._record_repr)
  return f'{type(self).__qualname__}({body})'


def _eq(self, other):
  if other.__class__ is not self.__class__:
    return NotImplemented
  names = self._record_compare
  return (tuple(getattr(self, n) for n in names)
          == tuple(getattr(other, n) for n in names))


def _hash(self):
  return hash(tuple(getattr(self, n) for n in self._record_hash))


def _frozen(self, name):
  """True if ``name`` may not be set or deleted on ``self``: any name on
  the decorated class's own instances, a field on a subclass's."""
  return type(self) is self._record_cls or name in self._record_names


def _setattr(self, name, value):
  if _frozen(self, name):
    raise dataclasses.FrozenInstanceError(f'cannot assign to field {name!r}')
  object.__setattr__(self, name, value)


def _delattr(self, name):
  if _frozen(self, name):
    raise dataclasses.FrozenInstanceError(f'cannot delete field {name!r}')
  object.__delattr__(self, name)
