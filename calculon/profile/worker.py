"""The subprocess side of a benchmark.

``python -m calculon.profile.worker NAME KIND ARGS_JSON`` runs benchmark
``KIND`` with ``ARGS_JSON`` and prints one line ``CALCULON_RESULT {json}``
(see :mod:`calculon.profile.runner`).  ``NAME`` is the benchmark's name in
the plan, used only by the fault-injection hook
(:func:`calculon.profile.runner.injected`).
"""

import json
import os
import sys
import time

from calculon.profile.runner import RESULT_PREFIX, injected


def _kinds():
  from calculon.profile import bench_compute, bench_memory, bench_network
  return {
    'gemm': bench_compute.gemm,
    'vector': bench_compute.vector,
    'memcopy': bench_memory.memcopy,
    'host_device': bench_memory.host_device,
    'collectives': bench_network.collectives,
  }


def _inject(mode):
  if mode == 'crash' or (mode == 'flaky' and
                         os.environ.get('CALCULON_PROFILE_ATTEMPT') == '1'):
    print('injected crash', file=sys.stderr)
    sys.exit(3)
  if mode == 'hang':
    while True:
      time.sleep(3600)
  if mode == 'garbage':
    print('OP:gemm,TIME:not-a-number')
    print(RESULT_PREFIX + '{"points": [{"key": "x", "value": "fast"')
    sys.exit(0)


def main(argv=None):
  argv = sys.argv[1:] if argv is None else argv
  if len(argv) != 3:
    print('usage: python -m calculon.profile.worker NAME KIND ARGS_JSON',
          file=sys.stderr)
    return 2
  name, kind, args = argv
  mode = injected(name)
  if mode:
    _inject(mode)
  kinds = _kinds()
  if kind not in kinds:
    print(f'unknown benchmark kind {kind!r}: one of {sorted(kinds)}',
          file=sys.stderr)
    return 2
  args = json.loads(args)
  from calculon.profile.timing import set_clock
  set_clock(args.pop('clock', 'wall'))
  result = kinds[kind](**args)
  sys.stdout.write(RESULT_PREFIX + json.dumps(result) + '\n')
  sys.stdout.flush()
  return 0


if __name__ == '__main__':
  sys.exit(main())
