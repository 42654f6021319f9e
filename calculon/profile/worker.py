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


def _shadow(kind, args, ready):
  """Runs benchmark ``kind`` over and over (results discarded)."""
  fn = _kinds()[kind]
  ready.set()
  while True:
    fn(**args)


def _start_shadows(kind, args, count):
  """``count`` processes running the same benchmark while this one
  measures: on a CPU shared by ``--procs`` processes, every processor is
  busy at once (caches and memory bandwidth are shared), as the ranks of a
  data-parallel step are.  Returns once they are running."""
  if count < 1:
    return []
  import multiprocessing as mp
  ctx = mp.get_context('spawn')
  procs = []
  for _ in range(count):
    ready = ctx.Event()
    proc = ctx.Process(target=_shadow, args=(kind, args, ready), daemon=True)
    proc.start()
    procs.append((proc, ready))
  for proc, ready in procs:
    ready.wait(timeout=120)
  return [proc for proc, _ in procs]


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
  copies = int(args.pop('copies', 1))
  shadows = _start_shadows(kind, args, copies - 1)
  try:
    result = kinds[kind](**args)
  finally:
    for proc in shadows:
      proc.kill()
      proc.join()
  if copies > 1:
    result.setdefault('info', {})['concurrent_copies'] = copies
  sys.stdout.write(RESULT_PREFIX + json.dumps(result) + '\n')
  sys.stdout.flush()
  return 0


if __name__ == '__main__':
  sys.exit(main())
