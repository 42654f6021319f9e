"""Running tasks on worker processes with bounded memory.

:func:`imap` yields results in task order (or as they finish) while keeping
at most ``window`` tasks in flight, so results that are written out as they
arrive never pile up in memory.  With ``workers <= 1`` everything runs in
this process (simplest to debug, no pickling).
"""

from collections import deque
import os
import signal


def default_workers():
  """Physical cores (Calculon's default for -c), at least 1."""
  import psutil  # here, not at the top: command start-up
  return max(1, psutil.cpu_count(logical=False) or os.cpu_count() or 1)


_STATE = {}


def _init(initializer, initargs):
  # Workers leave Ctrl-C to the parent, which terminates them.
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  if initializer is not None:
    initializer(*initargs)


def _context():
  import multiprocessing as mp
  methods = mp.get_all_start_methods()
  return mp.get_context('fork' if 'fork' in methods else 'spawn')


def imap(fn, tasks, workers, *, initializer=None, initargs=(), ordered=True,
         window=None):
  """Applies ``fn`` to each task on ``workers`` processes.

  Args:
    fn: picklable function of one task.
    tasks: iterable of picklable tasks.
    workers: number of processes (<= 1: run here).
    initializer, initargs: run once per worker (and here when workers <= 1)
      to set up shared read-only state.
    ordered: yield in task order (else as results finish).
    window: maximum tasks in flight (default 4 per worker).

  Yields:
    fn(task) for each task.  If the consumer stops (e.g. KeyboardInterrupt),
    the workers are terminated.
  """
  if workers <= 1:
    if initializer is not None:
      initializer(*initargs)
    for task in tasks:
      yield fn(task)
    return
  window = window or 4 * workers
  pool = _context().Pool(workers, initializer=_init,
                         initargs=(initializer, initargs))
  clean = False
  try:
    pending = deque()
    it = iter(tasks)
    exhausted = False
    while True:
      while not exhausted and len(pending) < window:
        try:
          task = next(it)
        except StopIteration:
          exhausted = True
          break
        pending.append(pool.apply_async(fn, (task,)))
      if not pending:
        break
      if ordered:
        yield pending.popleft().get()
      else:
        done = next((r for r in pending if r.ready()), None)
        if done is None:
          pending[0].wait(0.05)
          continue
        pending.remove(done)
        yield done.get()
    clean = True
  finally:
    if clean:
      pool.close()
    else:
      pool.terminate()
    pool.join()
