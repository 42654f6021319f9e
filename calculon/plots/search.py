"""Plots of search results."""


def add_plot_parsers(kinds):
  pass
