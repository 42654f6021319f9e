"""Plots of sweep results."""


def add_plot_parsers(kinds):
  pass
