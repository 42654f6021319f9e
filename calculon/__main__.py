"""``python -m calculon``."""
import sys

from calculon.cli.main import main

sys.exit(main())
