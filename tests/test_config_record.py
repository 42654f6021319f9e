"""``@frozen_record`` behaves as ``@dataclass(frozen=True)`` (the
configuration classes use it for start-up time, docs/performance.md)."""

import dataclasses
import pickle

import pytest

from calculon.config import Application, Execution, SystemConfig
from calculon.config._record import frozen_record
from conftest import load_json, repo


def _pair():
  """The same class made by each decorator."""
  def body():
    class Point:
      """A point."""
      x: int
      y: float = 2.5
      tags: tuple = dataclasses.field(default_factory=tuple)
      note: str = dataclasses.field(default='', compare=False, repr=False)

      def norm(self):
        return abs(self.x) + abs(self.y)
    return Point
  return dataclasses.dataclass(frozen=True)(body()), frozen_record(body())


def _outcome(fn):
  try:
    return ('ok', fn())
  except Exception as err:  # the exception's type and message are compared
    return (type(err).__name__, str(err).split('.__init__()')[-1])


CALLS = [
  ((1,), {}), ((1, 3.0), {}), ((), {'x': 4, 'y': 1.0}),
  ((1, 2.0, (3,), 'n'), {}), ((), {}), ((1,), {'x': 2}),
  ((1,), {'z': 3}), ((1, 2, (), '', 5), {}), ((), {'y': 1.0}),
  ((), {'tags': ()}),
]


@pytest.mark.parametrize('args,kwargs', CALLS)
def test_init_repr_eq_hash_match_dataclass(args, kwargs):
  dc, rec = _pair()
  a = _outcome(lambda: dc(*args, **kwargs))
  b = _outcome(lambda: rec(*args, **kwargs))
  assert a[0] == b[0]
  if a[0] != 'ok':
    assert a[1] == b[1]
    return
  a, b = a[1], b[1]
  assert repr(a) == repr(b)
  assert dataclasses.asdict(a) == dataclasses.asdict(b)
  assert hash(a) == hash(b)
  assert a.norm() == b.norm()
  assert b == rec(*args, **kwargs)
  assert b == dataclasses.replace(b, note='other')     # not compared
  assert b != dataclasses.replace(b, x=b.x + 1)
  assert (b == a) is False                            # other class


def test_frozen_like_dataclass():
  _, rec = _pair()
  p = rec(1)
  with pytest.raises(dataclasses.FrozenInstanceError, match="'x'"):
    p.x = 2
  with pytest.raises(dataclasses.FrozenInstanceError):
    p.other = 2
  with pytest.raises(dataclasses.FrozenInstanceError):
    del p.x
  assert p.x == 1

  class Sub(rec):
    pass
  s = Sub(1)
  s.other = 3          # a plain subclass may add attributes, not set fields
  assert s.other == 3
  with pytest.raises(dataclasses.FrozenInstanceError):
    s.x = 5


def test_refuses_a_class_that_defines_its_methods():
  class Own:
    x: int

    def __repr__(self):
      return 'own'
  with pytest.raises(TypeError, match='defines __repr__'):
    frozen_record(Own)


def test_mutable_default_refused_as_dataclass_does():
  class Bad:
    x: list = []
  with pytest.raises(ValueError, match='mutable default'):
    frozen_record(Bad)


def test_configuration_classes_are_frozen_dataclasses():
  exe = Execution.from_dict(
    load_json(repo('examples', '3072_t4_p64_d12_mbs4_full.json')))
  for cls in (Application, Execution, SystemConfig):
    assert dataclasses.is_dataclass(cls)
  assert dataclasses.replace(exe) == exe
  assert hash(dataclasses.replace(exe)) == hash(exe)
  assert pickle.loads(pickle.dumps(exe)) == exe
  assert 'tensor_par=4' in repr(exe)
  with pytest.raises(dataclasses.FrozenInstanceError):
    exe.tensor_par = 8
  with pytest.raises(TypeError, match="unexpected keyword argument 'tp'"):
    dataclasses.replace(exe, tp=2)
