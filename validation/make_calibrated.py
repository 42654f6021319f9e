"""Writes the calibrated system files of the bundled runs' clusters.

For every cluster of the hardware table (validation/conventions.yaml) with
enough measured runs in validation/published_runs.csv and
validation/published_runs_2024_2026.csv, runs

    calculon calibrate validation/published_runs.csv \\
        validation/published_runs_2024_2026.csv \\
        systems/SYSTEM_measured.json --cluster CLUSTER \\
        -o systems/CLUSTER.json --cv none

and prints what it fitted.  The calibrated files are the defaults
(``systems/CLUSTER.json``); each is fitted from its measured-kernel twin
``systems/SYSTEM_measured.json`` (the datasheet file with the GEMM,
attention and NCCL tables of NVIDIA AIConfigurator's database,
``validation/make_measured.py``), so calibration fits only what the tables
do not measure.  The datasheet-only file ``systems/SYSTEM_datasheet.json``
stays, the uncalibrated suite's base (the power-capped H100 cluster is
fitted from the H100 SXM's; see :mod:`calculon.validation.system_files`).

Run from the repository root: ``python validation/make_calibrated.py``.
"""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNS = ['validation/published_runs.csv',
        'validation/published_runs_2024_2026.csv']
#: cluster -> the GPU whose measured-kernel file (systems/GPU_measured.json)
#: it is calibrated from.
CLUSTERS = {
  'a100_sxm_80g': 'a100_sxm_80g',              # Selene-class DGX A100
  'h100_sxm_80g': 'h100_sxm_80g',              # Eos-class DGX H100
  'h100_96g_power_capped': 'h100_sxm_80g',     # Meta Grand Teton H100
  'h200_141g': 'h200_141g',                    # 8-GPU H200 nodes (torchtitan's)
  'b200': 'b200',
  'b300': 'b300',
  'gb200_nvl72': 'gb200_nvl72',
  'gb300_nvl72': 'gb300_nvl72',
}


def main():
  for cluster, system in CLUSTERS.items():
    out = f'systems/{cluster}.json'
    cmd = [sys.executable, '-m', 'calculon', 'calibrate', *RUNS,
           f'systems/{system}_measured.json', '--cluster', cluster,
           '-o', out,
           '--cv', 'none']
    print('$', ' '.join(['calculon'] + cmd[3:]), flush=True)
    res = subprocess.run(cmd, cwd=ROOT, text=True, capture_output=True)
    print(res.stdout, res.stderr, flush=True)
    if res.returncode:
      return res.returncode
  return 0


if __name__ == '__main__':
  sys.exit(main())
