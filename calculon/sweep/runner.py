"""Running a sweep on dask.distributed: embedded or on an existing cluster.

The client (this process) submits one task per point not yet in the output
(:func:`calculon.sweep.task.run_point`, keyed by the point id), collects
results with ``as_completed`` and writes them in batches of points as atomic
Parquet parts (:class:`calculon.sweep.store.SweepStore`).  Only the client
writes, so a point appears once: a task on a worker that dies is rerun by
the scheduler (dask's own resilience; it gives up on a task that killed 3
workers, ``distributed.scheduler.allowed-failures``), and its result is
written once.  A point done by an earlier run is skipped.  Interrupting the
client (Ctrl-C, SIGTERM) writes what has completed; SIGKILL loses at most
the points received since the last part.
"""

from dataclasses import dataclass, field
import contextlib
import logging
import math
import signal
import sys
import threading
import time

from calculon.errors import ConfigError
from calculon.outputs import WriteError
from calculon.sweep import DEFAULT_BATCH_POINTS, DEFAULT_BATCH_S
from calculon.sweep.store import SweepStore, schema
from calculon.sweep.task import run_point
#: Seconds to wait for a scheduler given by --scheduler.
CONNECT_TIMEOUT_S = 20


@dataclass
class SweepSummary:
  """What a sweep run did.

  Attributes:
    points: points of the spec; skipped: already in the output (not run);
    computed: run and written now; infeasible: of those, with no feasible
    execution (or a datatype the system lacks); failed: raised an error (not
    written; a re-run retries them); foreign: points in the output that are
    not in this spec (kept); rows, parts: written now; executions: evaluated
    by the searches run now; space: executions in their search spaces (more
    than evaluated with mbs_break); elapsed_s: wall time of the run (s);
    interrupted: stopped before the end; where: the cluster used;
    write_error: the :class:`~calculon.outputs.WriteError` that stopped the
    sweep (a part could not be written; its rows, ``rescued_rows``, are
    saved where the error says), or None.
  """
  points: int = 0
  skipped: int = 0
  computed: int = 0
  infeasible: int = 0
  failed: int = 0
  foreign: int = 0
  rows: int = 0
  parts: int = 0
  executions: int = 0
  space: int = 0
  elapsed_s: float = 0.0
  interrupted: bool = False
  where: str = ''
  errors: list = field(default_factory=list)
  write_error: object = None
  rescued_rows: int = 0

  @property
  def executions_per_s(self):
    return self.executions / self.elapsed_s if self.elapsed_s > 0 else 0.0

  @property
  def remaining(self):
    return self.points - self.skipped - self.computed

  def lines(self, output):
    """The final summary, as lines of text."""
    from calculon.units import human_format
    out = [f'Points: {self.points} in the spec, {self.skipped} skipped '
           f'(already done), {self.computed} computed, {self.failed} failed'
           + (f', {self.remaining - self.failed} not run (interrupted)'
              if self.interrupted else '')]
    if self.computed:
      out.append(f'Points with no feasible execution: {self.infeasible}')
    out.append(f'Rows written: {self.rows} in {self.parts} part'
               f'{"" if self.parts == 1 else "s"}')
    if self.computed:
      rate = human_format(self.executions_per_s, precision=2).strip()
      of = f' of {self.space} in the search spaces' \
        if self.space > self.executions else ''
      out.append(f'Executions evaluated: {self.executions}{of} ({rate} '
                 'executions/s)')
    if self.write_error is not None:
      out.append(f'Not written to {output}: {self.rescued_rows} rows (saved '
                 f'in {self.write_error.rescued or "nowhere"})')
    out.append(f'Wall time: {_duration(self.elapsed_s)}' +
               (f' on {self.where}' if self.where else ''))
    out.append(f'Output: {output}')
    return out


def _duration(seconds):
  if not math.isfinite(seconds):
    return '?'
  seconds = int(round(seconds))
  h, rest = divmod(seconds, 3600)
  m, s = divmod(rest, 60)
  return f'{h}:{m:02d}:{s:02d}' if h else f'{m}:{s:02d}'


def plan(spec, output):
  """(points, ids already in ``output``) without writing or locking."""
  points = spec.points()
  store = SweepStore(output, schema(spec.param_columns), read_only=True)
  with store:
    return points, set(store.done)


def space_sizes(points):
  """Executions in each point's search space (0 when the system lacks the
  datatype), cached over equal searches: {point id: count}."""
  from calculon.config import Application
  from calculon.hardware import System
  from calculon.llm import search as S
  from calculon.errors import ConfigError as _CE
  apps, systems, counts, out = {}, {}, {}, {}
  for p in points:
    akey = p.params['application']
    skey = p.variant
    if akey not in apps:
      apps[akey] = Application.from_dict(p.application, p.label)
    if skey not in systems:
      systems[skey] = System(p.system, p.label)
    ckey = (akey, skey, p.num_procs, p.max_batch_size, p.datatype)
    if ckey not in counts:
      system = systems[skey]
      try:
        system.check_datatype(p.datatype)
      except _CE:
        counts[ckey] = 0
      else:
        o = p.search
        counts[ckey] = S.count_space(S.SearchSpec(
          apps[akey], system, p.num_procs, p.max_batch_size, p.datatype,
          list(o.fused_activation), o.mbs_break, o.tp_overlap, o.dp_overlap))
    out[p.id] = counts[ckey]
  return out


class _Progress:
  """Progress of a sweep: points done/total, executions evaluated per
  second, and an ETA from the share of the search spaces done (points
  differ in size).  A tqdm bar on stderr when it is a terminal; otherwise
  :meth:`line` is logged at each part written."""

  def __init__(self, total_space, total_points, enabled):
    self.total_space, self.total_points = total_space, total_points
    self.done_space = self.done_points = self.evaluated = 0
    self.start = time.perf_counter()
    self.bar = None
    if enabled and sys.stderr.isatty():
      from tqdm import tqdm
      self.bar = tqdm(total=total_space, file=sys.stderr, dynamic_ncols=True,
                      desc=self._label(), bar_format='{desc} '
                      '{percentage:3.0f}%|{bar}| {elapsed}<{remaining}'
                      '{postfix}')

  def _label(self):
    return f'points {self.done_points}/{self.total_points}'

  def rate(self):
    """Executions evaluated per second so far."""
    elapsed = time.perf_counter() - self.start
    return self.evaluated / elapsed if elapsed > 0 else 0.0

  def point(self, space, evaluated):
    """One point done: ``space`` executions in its search space,
    ``evaluated`` evaluated (fewer with mbs_break)."""
    from calculon.units import human_format
    self.done_points += 1
    self.done_space += space
    self.evaluated += evaluated
    if self.bar is not None:
      self.bar.set_description(self._label(), refresh=False)
      self.bar.set_postfix_str(
        human_format(self.rate(), precision=2).strip() + ' executions/s',
        refresh=False)
      self.bar.update(space)

  def line(self):
    """'12/24 points, 1.80 M executions/s, ETA 1:23'."""
    from calculon.units import human_format
    elapsed = time.perf_counter() - self.start
    left = self.total_space - self.done_space
    eta = elapsed * left / self.done_space if self.done_space else \
      float('inf')
    return (f'{self.done_points}/{self.total_points} points, '
            f'{human_format(self.rate(), precision=2).strip()} '
            f'executions/s, ETA {_duration(eta)}')

  def close(self):
    if self.bar is not None:
      self.bar.close()


def _worker_version():
  import calculon
  return calculon.__version__


def _connect(scheduler, workers, log):
  """(client, cluster or None, description)."""
  from distributed import Client, LocalCluster
  from calculon.parallel import default_workers
  if scheduler:
    try:
      client = Client(scheduler, timeout=CONNECT_TIMEOUT_S)
    except (OSError, TimeoutError, ValueError, TypeError) as err:
      raise ConfigError(f'--scheduler {scheduler}: cannot connect to a dask '
                        f'scheduler there: {err}', source='--scheduler',
                        value=scheduler,
                        allowed='the address of a running dask scheduler, '
                        'e.g. tcp://host:8786') from None
    try:
      _check_workers(client, scheduler, log)
    except BaseException:
      client.close()
      raise
    return client, None, f'the cluster at {scheduler}'
  n = workers or default_workers()
  # One worker: a thread of this process (no start-up, nothing to spawn).
  cluster = LocalCluster(n_workers=n, threads_per_worker=1,
                         processes=n > 1, dashboard_address=None,
                         silence_logs=logging.ERROR)
  try:
    client = Client(cluster)
  except BaseException:
    cluster.close()
    raise
  what = f'{n} local worker process{"es" if n > 1 else ""}' if n > 1 \
    else '1 local worker (in this process)'
  return client, cluster, what


def _check_workers(client, scheduler, log):
  import calculon
  try:
    versions = client.run(_worker_version)
  except Exception as err:  # noqa: BLE001 -- a worker cannot run calculon
    raise ConfigError(
      f'--scheduler {scheduler}: a worker cannot import calculon ({err}); '
      'install calculon in the Python environment of every worker',
      source='--scheduler', value=scheduler) from None
  if not versions:
    log.warning(f'No worker is connected to {scheduler} yet: the points '
                'start when workers join')
  for addr, version in sorted(versions.items()):
    if version != calculon.__version__:
      log.warning(f'Worker {addr} runs calculon {version}, this client '
                  f'{calculon.__version__}: results may differ')


@contextlib.contextmanager
def _stop_on_signals(stop, log):
  """While running: SIGINT (Ctrl-C) and SIGTERM set ``stop`` (the loop then
  writes what completed and cancels the rest); a second SIGINT raises
  KeyboardInterrupt at once.  Only in the main thread (where Python
  delivers signals)."""
  if threading.current_thread() is not threading.main_thread():
    yield
    return

  def handler(signum, frame):
    if stop.is_set() and signum == signal.SIGINT:
      raise KeyboardInterrupt
    stop.set()
    log.warning(f'{signal.Signals(signum).name}: stopping; writing the '
                'points completed (Ctrl-C again to quit at once)')
  old = {sig: signal.signal(sig, handler)
         for sig in (signal.SIGINT, signal.SIGTERM)}
  try:
    yield
  finally:
    for sig, h in old.items():
      signal.signal(sig, h)


class _Collector:
  """Receives finished futures, buffers rows and writes parts."""

  def __init__(self, store, summary, bar, batch_points, batch_s, log):
    self.store, self.summary, self.bar, self.log = store, summary, bar, log
    self.batch_points, self.batch_s = batch_points, batch_s
    self.rows, self.points, self.oldest = [], 0, None

  def take(self, fut, point, size):
    """Records one finished future (its rows, or its failure)."""
    s = self.summary
    evaluated = 0
    if fut.status == 'finished':
      res = fut.result()
      evaluated = res.executions
      self.rows.extend(res.rows)
      self.points += 1
      self.oldest = self.oldest or time.monotonic()
      s.computed += 1
      s.executions += res.executions
      s.space += size
      s.infeasible += not res.feasible
    else:
      err = fut.exception() if fut.status == 'error' else fut.status
      s.failed += 1
      s.errors.append((point, err))
      self.log.error(f'Point {point.id} ({point.label}) failed: '
                     f'{type(err).__name__}: {err}')
    fut.release()
    self.bar.point(size, evaluated)

  def due(self):
    return self.points >= self.batch_points or (
      self.oldest is not None and
      time.monotonic() - self.oldest >= self.batch_s)

  def flush(self):
    """Writes the buffered rows as one part."""
    if not self.rows:
      return
    # Taken first: rows interrupted while being written are lost (and
    # recomputed by the next run), never written twice.
    rows, self.rows, self.points, self.oldest = self.rows, [], 0, None
    try:
      path = self.store.write(rows)
    except WriteError as err:
      self.summary.write_error = err
      self.summary.rescued_rows += len(rows)
      raise
    self.summary.parts += 1
    self.summary.rows += len(rows)
    if self.bar.bar is None:
      self.log.info(f'Wrote {path}: {self.bar.line()}')


def run_sweep(spec, output, scheduler=None, workers=None,
              batch_points=DEFAULT_BATCH_POINTS, batch_s=DEFAULT_BATCH_S,
              progress=True, log=None, stop=None):
  """Runs every point of ``spec`` not yet in ``output``.

  Args:
    spec: :class:`~calculon.sweep.spec.SweepSpec`.
    output: dataset folder (created; see :mod:`calculon.sweep.store`).
    scheduler: address of a dask scheduler (``tcp://host:8786``); None runs
      an embedded ``LocalCluster``.
    workers: embedded worker processes (default: physical cores; 1 runs the
      points in a thread of this process).
    batch_points, batch_s: a part is written when this many points are
      waiting or the oldest waited this many seconds.
    progress: show a progress bar on a terminal (stderr).
    log: logging.Logger (default 'calculon').
    stop: optional threading.Event; setting it stops the sweep like
      Ctrl-C.

  Returns:
    :class:`SweepSummary` (``interrupted`` after Ctrl-C, SIGTERM or
    ``stop``: what has completed is written, the rest cancelled; and after
    a part could not be written, with ``write_error`` set).

  Raises:
    ConfigError: bad output folder, a sweep already writing there, an
      unreachable scheduler or workers without calculon.
  """
  from distributed import as_completed
  log = log or logging.getLogger('calculon')
  stop = stop or threading.Event()
  start = time.perf_counter()
  summary = SweepSummary()
  points = spec.points()
  summary.points = len(points)
  ids = {p.id for p in points}
  with SweepStore(output, schema(spec.param_columns)) as store:
    todo = [p for p in points if p.id not in store.done]
    summary.skipped = len(points) - len(todo)
    summary.foreign = len(store.done - ids)
    if summary.foreign:
      log.warning(f'{output} holds {summary.foreign} points that are not in '
                  'this spec (an earlier spec, or changed files); they are '
                  'kept')
    log.info(f'Sweep {spec.source}: {len(points)} points '
             f'({spec.shape_text()}); {summary.skipped} already done, '
             f'{len(todo)} to run')
    if not todo:
      summary.elapsed_s = time.perf_counter() - start
      return summary
    sizes = space_sizes(todo)
    client, cluster, summary.where = _connect(scheduler, workers, log)
    log.info(f'Running on {summary.where}')
    bar = _Progress(sum(sizes.values()), len(todo), progress)
    out = _Collector(store, summary, bar, batch_points, batch_s, log)
    pending = {}
    try:
      # Largest searches first: the sweep's tail is then short ones.
      for p in sorted(todo, key=lambda p: -sizes[p.id]):
        fut = client.submit(run_point, p, key=f'calculon-sweep-{p.id}',
                            pure=True, priority=sizes[p.id])
        pending[fut.key] = (fut, p)
      done = as_completed([f for f, _ in pending.values()])
      with _stop_on_signals(stop, log):
        while not done.is_empty() and not stop.is_set():
          batch = done.next_batch(block=False)
          for fut in batch:
            if fut.status in ('lost', 'pending'):
              # Finished on a worker that died before the result was
              # collected: the scheduler computes it again (the future
              # is still wanted); wait for that instead of a failure.
              done.add(fut)
              continue
            _, p = pending.pop(fut.key)
            out.take(fut, p, sizes[p.id])
          if out.due():
            out.flush()
          if not batch:
            time.sleep(0.05)
      if stop.is_set():
        raise KeyboardInterrupt
      out.flush()
    except KeyboardInterrupt:
      summary.interrupted = True
      try:
        out.flush()
      except WriteError:
        pass  # recorded in summary.write_error
      client.cancel([f for f, _ in pending.values()])
    except WriteError:
      # Recorded in summary.write_error (the part is saved elsewhere); stop:
      # a re-run resumes from the parts written.
      summary.interrupted = True
      client.cancel([f for f, _ in pending.values()])
    finally:
      bar.close()
      client.close()
      if cluster is not None:
        cluster.close()
      summary.elapsed_s = time.perf_counter() - start
  return summary
