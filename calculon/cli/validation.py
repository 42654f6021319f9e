"""``calculon llm-validation``: comparisons with measured runs."""


def add_parsers(sp):
  pass
