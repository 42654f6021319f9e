"""Units: SI and binary prefixes, and human-readable formatting.

Conventions used across calculon: sizes in bytes, times in seconds, rates
per second; ``GiB`` = 2**30 bytes (binary), ``GB`` = 1e9 bytes (SI).
"""

import math

KiB, MiB, GiB, TiB = 2 ** 10, 2 ** 20, 2 ** 30, 2 ** 40
KB, MB, GB, TB = 1e3, 1e6, 1e9, 1e12

_KINDS = {
  'base10': (1000, ''), 'base2': (1024, ''), 'bytes': (1024, 'iB'),
  'bandwidth': (1000, 'B/s'), 'flops': (1000, 'Ops'),
  'throughput': (1000, 'Op/s'),
}
_PREFIXES = ['', 'k', 'M', 'G', 'T', 'P', 'E']


def human_format(value, kind='base10', precision=3):
  """Formats ``value`` with a prefix, Calculon style: '672.027 GiB'.

  Args:
    value: number (or None, giving 'n/a').
    kind: 'base10', 'base2', 'bytes' (binary, 'iB'), 'bandwidth' (SI, 'B/s'),
      'flops' (SI, 'Ops') or 'throughput' (SI, 'Op/s').
    precision: digits after the decimal point.

  Raises:
    ValueError: unknown ``kind``.
  """
  if kind not in _KINDS:
    raise ValueError(f'kind must be one of {sorted(_KINDS)}, got {kind!r}')
  step, suffix = _KINDS[kind]
  if value is None or (isinstance(value, float) and math.isnan(value)):
    return f'n/a {suffix}'
  value = float(value)
  magnitude = abs(value)
  index = 0
  for _ in _PREFIXES[1:]:
    if magnitude >= step:
      magnitude /= step
      index += 1
    else:
      break
  signed = magnitude if value >= 0 else -magnitude
  return f'{signed:.{precision}f} {_PREFIXES[index]}{suffix}'
