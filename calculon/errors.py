"""Exceptions raised to users.

Two kinds of failure exist and they are kept apart everywhere:

* :class:`ConfigError` -- the user's input is wrong (a missing field, a value
  out of range, an option combination the model does not define).  The CLI
  prints its one-line message and exits with status 2.
* An *infeasible* execution (not enough memory, a network tier too small...) is
  a result, not an error: the batch API reports it in the ``feasible`` and
  ``reason`` columns and the Calculon-compatible API raises ``Llm.Error``
  (:class:`Infeasible`).  The CLI exits with status 1.
"""


class ConfigError(ValueError):
  """A user's configuration mistake.

  The message always names where the value came from (``source``: a file name
  or a label such as ``<execution>``), the field, the offending value and what
  is allowed.

  Attributes:
    source: file name or label of the configuration.
    field: dotted path of the field (``networks[1].bandwidth``), or None.
    value: the offending value (or None).
    allowed: human text describing what is allowed.
  """

  def __init__(self, message, *, source=None, field=None, value=None,
               allowed=None):
    super().__init__(message)
    self.source = source
    self.field = field
    self.value = value
    self.allowed = allowed


class Infeasible(Exception):
  """An execution that cannot run on the system (memory, network size...).

  This is the class behind ``calculon.llm.Llm.Error``.
  """
