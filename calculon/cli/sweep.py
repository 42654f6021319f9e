"""``calculon sweep``: co-design sweeps (see calculon.sweep)."""


def add_parsers(sp):
  pass
