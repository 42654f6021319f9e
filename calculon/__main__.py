"""``python -m calculon``."""
from calculon.cli.main import entry

entry()
