"""Result-file tools: plots and conversions."""


def add_parsers(sp):
  pass
