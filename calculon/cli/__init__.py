"""Command line interface (argparse); see :mod:`calculon.cli.main`."""
