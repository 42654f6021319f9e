"""Typed, validated configurations: application, execution, system.

Every loader raises :class:`~calculon.errors.ConfigError` (a ValueError) with
a message naming the file, the field, the value and what is allowed.
"""

from calculon.config.application import Application
from calculon.config.execution import (
  Execution, ExecutionColumns, RULES, check_rules, rule_violations,
  DATATYPE_BYTES, DATATYPE_NAMES, ATTENTION_NAMES, RECOMPUTE_NAMES,
  TP_COMM_NAMES, TP_OVERLAP_NAMES, FIELDS as EXECUTION_FIELDS)
from calculon.config.system import SystemConfig

__all__ = [
  'Application', 'Execution', 'ExecutionColumns', 'SystemConfig', 'RULES',
  'check_rules', 'rule_violations', 'DATATYPE_BYTES', 'DATATYPE_NAMES',
  'ATTENTION_NAMES', 'RECOMPUTE_NAMES', 'TP_COMM_NAMES', 'TP_OVERLAP_NAMES',
  'EXECUTION_FIELDS',
]
