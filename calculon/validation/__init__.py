"""Validation of the model against measured training runs.

Two suites, both run by ``calculon llm-validation``:

* :mod:`calculon.validation.seqsel` -- the reference's comparison with
  Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
  Transformer Models" (arXiv 2205.05198): Figure 1 (memory), Figure 7
  (activation memory per recomputation mode) and Table 5 (iteration time),
  with a pass/fail threshold per table.
* :mod:`calculon.validation.published` -- every published run of
  ``validation/published_runs.csv`` the model can express: predicted vs
  measured batch time, a summary, and the rows it cannot express.

Both read their inputs from a *base directory* holding ``models/``,
``systems/`` and ``validation/`` (by default the checkout this package lives
in, see :func:`default_base_dir`).
"""

import os

from calculon.errors import ConfigError

#: Bytes in a GiB (binary), the unit of Calculon's memory validation.
GIB_BYTES = 1024 ** 3


def default_base_dir():
  """The repository root holding ``models/``, ``systems/`` and
  ``validation/`` next to this package, or the current directory when the
  package is installed elsewhere."""
  root = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
  if os.path.isdir(os.path.join(root, 'validation')):
    return root
  return os.getcwd()


def check_base_dir(base_dir):
  """Raises ConfigError unless ``base_dir`` holds models/, systems/ and
  validation/."""
  for sub in ('models', 'systems', 'validation'):
    if not os.path.isdir(os.path.join(base_dir, sub)):
      raise ConfigError(
        f"--base-dir {base_dir!r} is not allowed: it has no '{sub}/' folder "
        '(the validation reads models/, systems/ and validation/ there)',
        source='--base-dir', field='base_dir', value=base_dir,
        allowed='a calculon checkout')
  return base_dir


def abs_delta_summary(deltas_pct):
  """(mean, max) of the absolute values of ``deltas_pct`` (percent)."""
  vals = [abs(float(d)) for d in deltas_pct]
  if not vals:
    return 0.0, 0.0
  return sum(vals) / len(vals), max(vals)


__all__ = ['default_base_dir', 'check_base_dir', 'abs_delta_summary',
           'GIB_BYTES']
