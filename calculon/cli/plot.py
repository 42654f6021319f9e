"""``calculon plot KIND ...``: figures from result files.

Each kind lives in a module of :mod:`calculon.plots` that provides
``add_plot_parsers(kinds)``, registering its sub-commands on ``kinds``.
"""

from calculon.plots import PLOT_MODULES


def add_parsers(sp):
  p = sp.add_parser('plot', help='plot search or sweep results',
                    description='Figures (PNG, PDF, SVG) from result files.')
  kinds = p.add_subparsers(title='kinds', dest='kind', metavar='KIND')
  kinds.required = True
  for module in PLOT_MODULES():
    module.add_plot_parsers(kinds)
