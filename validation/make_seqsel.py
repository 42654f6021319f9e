"""Writes validation/seqsel/{fig1,fig7,tab5}/MODEL_MODE.json, the execution
files of the Korthikanti et al. 2022 comparison, from the paper's Table 3
(calculon.validation.seqsel.TABLE3 and MODES).

Run from the repository root: ``python validation/make_seqsel.py``.
"""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from calculon.validation import seqsel  # noqa: E402

if __name__ == '__main__':
  for path in seqsel.write_executions(ROOT):
    print(os.path.relpath(path, ROOT))
