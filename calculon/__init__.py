"""calculon: analytical performance model for training and serving large
language models on large GPU clusters.

Calculon-compatible entry points: ``from calculon import System`` and
``from calculon.llm import Llm``.
"""

__version__ = '1.0.0'

from calculon.errors import ConfigError, Infeasible
from calculon.hardware import System
from calculon.io import read_json_file, write_json_file, is_json_extension
from calculon.units import human_format

__all__ = ['ConfigError', 'Infeasible', 'System', 'read_json_file',
           'write_json_file', 'is_json_extension', 'human_format',
           '__version__']
