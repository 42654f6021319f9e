"""Writes the measured-kernel system files of the bundled GPUs.

For every GPU of :data:`GPUS` runs

    calculon import-kernels AIC_GPU --base systems/SYSTEM_datasheet.json \\
        -o systems/SYSTEM_measured.json [--from DIR]

which keeps the datasheet file's fields and adds the ``measured`` section
(GEMM, context attention and NCCL tables of NVIDIA AIConfigurator's
database, aiconfigurator-core 0.12.0; see calculon/kernels/).

Run from the repository root, with the database installed (``pip install
"calculon[kernels]"``) or unpacked: ``python validation/make_measured.py
[--from DIR]`` (DIR: a folder holding aiconfigurator_core/systems/data,
e.g. the unzipped wheel).
"""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: bundled system -> AIConfigurator GPU folder.
GPUS = {
  'a100_sxm_80g': 'a100_sxm',
  'h100_sxm_80g': 'h100_sxm',
  'h200_141g': 'h200_sxm',
  'b200': 'b200_sxm',
  'b300': 'b300_sxm',
  'gb200_nvl72': 'gb200',
  'gb300_nvl72': 'gb300',
}


def main(argv):
  extra = argv[1:]
  for system, gpu in GPUS.items():
    cmd = [sys.executable, '-m', 'calculon', 'import-kernels', gpu,
           '--base', f'systems/{system}_datasheet.json',
           '-o', f'systems/{system}_measured.json', *extra]
    print('$', ' '.join(['calculon'] + cmd[3:]), flush=True)
    res = subprocess.run(cmd, cwd=ROOT, text=True, capture_output=True)
    print(res.stdout, res.stderr, flush=True)
    if res.returncode:
      return res.returncode
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv))
