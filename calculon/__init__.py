"""calculon: analytical performance model for training large language
models on large GPU clusters (a training step, or with ``training: false``
a forward pass; serving -- decode, KV cache, request batching -- is not
modelled).

Calculon-compatible entry points: ``from calculon import System`` and
``from calculon.llm import Llm``.

The names below are imported on first use (PEP 562), so that ``import
calculon`` -- done by every command at start-up -- loads neither numpy nor
the model until a command needs them.
"""

__version__ = '1.0.0'

import importlib

from calculon.errors import ConfigError, Infeasible

#: Public names and the modules they come from (imported on first use).
_LAZY = {
  'System': 'calculon.hardware',
  'read_json_file': 'calculon.io',
  'write_json_file': 'calculon.io',
  'is_json_extension': 'calculon.io',
  'human_format': 'calculon.units',
}

__all__ = ['ConfigError', 'Infeasible', 'System', 'read_json_file',
           'write_json_file', 'is_json_extension', 'human_format',
           '__version__']


def __getattr__(name):
  module = _LAZY.get(name)
  if module is None:
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
  value = getattr(importlib.import_module(module), name)
  globals()[name] = value
  return value


def __dir__():
  return sorted(set(globals()) | set(_LAZY))
