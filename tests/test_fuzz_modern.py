"""Modern applications, executions and systems, fuzzed (issue 45): hypothesis
draws a bundled modern model, a layout-only execution naming a framework
and a bundled system, changes a few of their fields to good, extreme or
wrong values, and reads and prices them as ``calculon llm`` does.

Whatever it draws: the answer is a price, an infeasible result
(:class:`~calculon.llm.Llm.Error`) or one :class:`~calculon.ConfigError`
-- never another exception, never a numpy overflow (warnings are errors),
and each answer within 2 s (a MoE model of 10^12 blocks took over 30 s:
the registry bounds every count, :data:`calculon.config.registry.BOUNDS`).

Derandomized (the same examples in every run); a deeper, random run:

    CALCULON_FUZZ_EXAMPLES=500 CALCULON_FUZZ_RANDOM=1 \\
      python -m pytest -q tests/test_fuzz_modern.py
"""

import copy
import os
import time
import warnings

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from calculon import ConfigError
from calculon.config import Application, Execution, registry
from calculon.hardware import System
from calculon.llm import Llm
from conftest import load_json, repo

MODELS = ('llama3-8B', 'llama3-70B', 'mixtral-8x7B', 'deepseek-v3',
          'qwen3-30B-A3B', 'qwen3-235B-A22B', 'qwen2.5-72B')
SYSTEMS = ('h100_sxm_80g', 'b200', 'gb200_nvl72', 'mi300x')
FRAMEWORKS = ('megatron-core', 'megatron-core-2024', 'torchtitan',
              'deepspeed-zero', 'megatron-lm-2021', 'common', 'calculon')
LAYOUT = {'framework': 'megatron-core', 'num_procs': 64, 'tensor_par': 4,
          'pipeline_par': 2, 'data_par': 8, 'batch_size': 64,
          'microbatch_size': 1, 'datatype': 'bfloat16'}
EXAMPLES = int(os.environ.get('CALCULON_FUZZ_EXAMPLES', '40'))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                derandomize=not os.environ.get('CALCULON_FUZZ_RANDOM'),
                suppress_health_check=[HealthCheck.too_slow,
                                       HealthCheck.data_too_large])
#: Seconds one answer may take.
LIMIT_S = 2.0

_BASE = {}


def _base(kind, name):
  key = (kind, name)
  if key not in _BASE:
    _BASE[key] = load_json(repo(kind, f'{name}.json'))
  return copy.deepcopy(_BASE[key])


def _numbers(field):
  """Values for a numeric field: small, around its bound, huge, wrong."""
  hi = field.spec.hi if field.spec.hi is not None else 2**20
  return st.one_of(
    st.sampled_from([0, 1, 2, 3, 7, 8, 64, int(hi), int(hi) + 1, 10**12,
                     2**62, -1, 2**63]),
    st.sampled_from([1, 2, 4, 8, 16, int(hi)]), st.integers(1, int(hi)),
    st.sampled_from([0.5, 1.5, float('nan'), float('inf'), '8', None,
                     True, [], {}]))


def _value(field):
  """Values for any registry field."""
  spec = field.spec
  if spec.choices is not None:
    return st.one_of(st.sampled_from(spec.choices),
                     st.sampled_from(['', 'x', 1, None]))
  if spec.kind == 'bool':
    return st.sampled_from([True, False, 0, 'true', None])
  if spec.kind in ('int', 'number'):
    return _numbers(field)
  if field.name == 'recompute_modules':
    return st.one_of(st.lists(st.sampled_from(registry.RECOMPUTE_MODULES),
                              min_size=1, max_size=3, unique=True),
                     st.sampled_from([[], 'mlp', ['x']]))
  return st.sampled_from([None, 1, 'x', []])


def _changes(kind):
  """A few (field, value) changes of one kind of file."""
  fields = [f for f in registry.FIELDS[kind].values()
            if '.' not in f.name and '[' not in f.name
            and f.spec.kind not in ('dict', 'list') or
            f.name == 'recompute_modules']
  return st.lists(st.sampled_from(fields).flatmap(
    lambda f: st.tuples(st.just(f.name), _value(f))), max_size=3)


_SYSTEM_PATHS = (('mem1', 'GiB'), ('mem1', 'GBps'), ('mem2', 'GiB'),
                 ('networks', 0, 'size'), ('networks', 0, 'bandwidth'),
                 ('networks', 1, 'size'), ('networks', 1, 'latency'),
                 ('networks', 0, 'efficiency'))


def _system_changes():
  return st.lists(st.tuples(st.sampled_from(_SYSTEM_PATHS), st.one_of(
    st.sampled_from([0, 1, 8, 10**12, 2**63, -1, 1e300, float('nan'), None, '8']),
    st.floats(0.01, 1e6))), max_size=2)


def _set(doc, path, value):
  for key in path[:-1]:
    doc = doc[key] if isinstance(doc, dict) or key < len(doc) else {}
  if isinstance(doc, dict):
    doc[path[-1]] = value


def _price(app_cfg, exe_cfg, sys_cfg):
  """Reads and prices as ``calculon llm`` does; returns 'priced',
  'infeasible' or 'bad input'."""
  try:
    app = Llm.Application(app_cfg, 'app.json')
    exe = Llm.Execution.from_json(exe_cfg, 'exe.json')
    system = System(sys_cfg, 'sys.json')
    model = Llm(app)
    model.compile(system, exe)
    model.run(system)
    model.get_stats_json()
    return 'priced'
  except Llm.Error:
    return 'infeasible'
  except ConfigError as err:
    text = str(err)
    assert '\n' not in text and text.split(':')[0] in (
      'app.json', 'exe.json', 'sys.json', '--framework'), text
    return 'bad input'


@FUZZ
@given(model=st.sampled_from(MODELS), system=st.sampled_from(SYSTEMS),
       framework=st.sampled_from(FRAMEWORKS),
       app_changes=_changes('application'),
       exe_changes=_changes('execution'), sys_changes=_system_changes())
def test_modern_inputs_never_crash_hang_or_overflow(
    model, system, framework, app_changes, exe_changes, sys_changes):
  app = _base('models', model)
  app.update(app_changes)
  exe = dict(LAYOUT, framework=framework)
  exe.update(exe_changes)
  sys_cfg = _base('systems', system)
  for path, value in sys_changes:
    _set(sys_cfg, path, value)
  start = time.perf_counter()
  with warnings.catch_warnings():
    warnings.simplefilter('error')
    _price(app, exe, sys_cfg)
  elapsed = time.perf_counter() - start
  assert elapsed < LIMIT_S, (model, app_changes, exe_changes, elapsed)


@pytest.mark.parametrize('model', ['mixtral-8x7B', 'deepseek-v3',
                                   'qwen3-30B-A3B', 'llama3-70B'])
def test_huge_models_answer_fast(model):
  """num_blocks 10^12 is bad input (the bound); at the bound, a MoE
  model is as quick to answer "infeasible" as a dense one (it took over
  30 s: a Python loop over the blocks)."""
  app = _base('models', model)
  app['num_blocks'] = 10**12
  with pytest.raises(ConfigError) as info:
    Application.from_dict(app, 'app.json')
  assert str(info.value) == (
    "app.json: field 'num_blocks' = 1000000000000 is not allowed: an "
    'integer >= 1 and <= 1048576')
  app['num_blocks'] = 2**20
  start = time.perf_counter()
  with warnings.catch_warnings():
    warnings.simplefilter('error')
    assert _price(app, dict(LAYOUT), _base('systems', 'h100_sxm_80g')) == \
      'infeasible'
  assert time.perf_counter() - start < LIMIT_S


def test_layout_is_enough_for_every_framework():
  """The layout alone prices (or is infeasible) under every preset: the
  preset fills what it dictates, the rest its first supported value."""
  for framework in FRAMEWORKS:
    exe = Execution.from_dict(dict(LAYOUT, framework=framework), 'exe.json')
    assert exe.written == frozenset(LAYOUT) - {'framework'}
    # Megatron-LM 2021 keeps the s x s attention scores and shards nothing
    # (its preset dictates both): Llama 3 8B at sequence 8,192 needs 99.9
    # GiB per H100 there.
    want = 'infeasible' if framework == 'megatron-lm-2021' else 'priced'
    assert _price(_base('models', 'llama3-8B'), dict(LAYOUT,
                  framework=framework), _base('systems', 'h100_sxm_80g')) \
      == want, framework
