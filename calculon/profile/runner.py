"""Runs benchmarks, each in its own subprocess, and keeps the best result.

The shape is AITemplate's profiler runner (``aitemplate/backend/
profiler_runner.py``: one subprocess per profiler, up to
``PROFILER_RUN_MAX_ATTEMPTS = 3`` tries ``PROFILER_RUN_RETRY_DELAY_SECONDS``
apart, the output parsed and the best result kept), with its gaps closed:

* every child has its own timeout and is killed with its whole process
  group (``start_new_session`` + ``os.killpg``), so a hung benchmark, or the
  ranks it spawned, cannot outlive it;
* a try fails, and is retried, on a non-zero exit, a timeout *or* output
  that does not parse -- not only when the launch itself raises;
* children print one line ``CALCULON_RESULT {json}`` instead of free text.

Benchmarks run one after another on purpose: two at once would share cores,
memory bandwidth and links, and measure each other.

Result protocol (what a worker prints after the prefix)::

  {"points": [{"key": str, "value": float > 0, ...}, ...], "info": {...}}

``value`` is higher-is-better (FLOP/s, bytes/s); the best of several runs
keeps, for each ``key``, the point with the largest value.
"""

import json
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

RESULT_PREFIX = 'CALCULON_RESULT '
#: AITemplate's PROFILER_RUN_MAX_ATTEMPTS.
DEFAULT_TRIES = 3
#: AITemplate's PROFILER_RUN_RETRY_DELAY_SECONDS.
DEFAULT_RETRY_DELAY_S = 5.0
#: Environment variable of the fault-injection hook (see :func:`injected`).
INJECT_ENV = 'CALCULON_PROFILE_INJECT'
INJECT_MODES = ('crash', 'hang', 'garbage', 'flaky')


@dataclass
class BenchSpec:
  """One benchmark: ``name`` (e.g. 'matrix.float32'), the worker ``kind``
  and its JSON-able ``args``; ``timeout_s`` per try."""
  name: str
  kind: str
  args: dict
  timeout_s: float = 120.0
  threads: int = 1


@dataclass
class Attempt:
  """One try: status 'ok', 'exit' (non-zero rc), 'timeout', 'parse' or
  'launch'; seconds of wall time; the tail of stderr."""
  name: str
  run: int
  attempt: int
  status: str
  rc: object
  wall_s: float
  message: str = ''


@dataclass
class Outcome:
  """All runs of one benchmark: ``ok`` when at least one run succeeded;
  ``best`` the per-key best of the successful runs; ``error`` the last
  failure when none did."""
  spec: BenchSpec
  ok: bool
  best: dict = None
  runs: list = field(default_factory=list)
  attempts: list = field(default_factory=list)
  error: str = ''


def parse_result(stdout):
  """The result dict from a worker's stdout.

  Returns:
    the dict after the last ``CALCULON_RESULT`` line.

  Raises:
    ValueError: no such line, invalid JSON, or points missing, empty, or
      with a value that is not a finite number > 0.
  """
  lines = [ln for ln in stdout.splitlines() if ln.startswith(RESULT_PREFIX)]
  if not lines:
    raise ValueError('no CALCULON_RESULT line in the output')
  try:
    data = json.loads(lines[-1][len(RESULT_PREFIX):])
  except json.JSONDecodeError as err:
    raise ValueError(f'CALCULON_RESULT is not valid JSON: {err.msg}') from None
  points = data.get('points') if isinstance(data, dict) else None
  if not isinstance(points, list) or not points:
    raise ValueError('CALCULON_RESULT has no points')
  for p in points:
    value = p.get('value') if isinstance(p, dict) else None
    if not (isinstance(p, dict) and isinstance(p.get('key'), str) and
            isinstance(value, (int, float)) and math.isfinite(value) and
            value > 0):
      raise ValueError(f'CALCULON_RESULT has an invalid point: {p!r}')
  return data


def best_of(results):
  """Per key, the point with the largest value across ``results``; the
  first result's ``info``; ``runs`` the number of results combined."""
  best = {}
  order = []
  for res in results:
    for p in res['points']:
      if p['key'] not in best:
        order.append(p['key'])
        best[p['key']] = p
      elif p['value'] > best[p['key']]['value']:
        best[p['key']] = p
  return {'points': [best[k] for k in order],
          'info': results[0].get('info', {}), 'runs': len(results)}


def injected(name, spec=None):
  """The fault mode injected for benchmark ``name``, or None.

  Hook for fault tests: ``CALCULON_PROFILE_INJECT='matrix=crash,mem1=hang'``
  makes the worker of every benchmark whose name is, or starts with,
  ``matrix`` exit with status 3 before measuring ('crash'), sleep forever
  ('hang'), print a malformed result ('garbage'), or crash on its first try
  only ('flaky').

  Raises:
    ValueError: a mode not in :data:`INJECT_MODES`.
  """
  spec = os.environ.get(INJECT_ENV, '') if spec is None else spec
  for item in filter(None, (s.strip() for s in spec.split(','))):
    target, _, mode = item.partition('=')
    if mode not in INJECT_MODES:
      raise ValueError(f'{INJECT_ENV}: mode {mode!r} of {target!r} is not one '
                       f'of {", ".join(INJECT_MODES)}')
    if name == target or name.startswith(target + '.'):
      return mode
  return None


def _kill_group(proc):
  try:
    os.killpg(proc.pid, signal.SIGKILL)
  except (ProcessLookupError, PermissionError):
    pass


class Runner:
  """Runs :class:`BenchSpec` s as ``python -m calculon.profile.worker``.

  Args:
    tries: tries per run (a run is retried until one try succeeds).
    retry_delay_s: seconds between tries.
    repeats: independent successful runs wanted; the best is kept.
    env: extra environment for the children (threads, allocator...).
    on_attempt: called with each :class:`Attempt` (progress, logs).
    command: argv prefix of the worker (tests may replace it).
  """

  def __init__(self, tries=DEFAULT_TRIES, retry_delay_s=DEFAULT_RETRY_DELAY_S,
               repeats=3, env=None, on_attempt=None, command=None):
    self.tries = max(1, int(tries))
    self.retry_delay_s = float(retry_delay_s)
    self.repeats = max(1, int(repeats))
    self.env = dict(env or {})
    self.on_attempt = on_attempt
    self.command = command or [sys.executable, '-m', 'calculon.profile.worker']

  def _env(self, spec, attempt):
    env = dict(os.environ)
    env.update(self.env)
    threads = str(max(1, int(spec.threads)))
    for var in ('OMP_NUM_THREADS', 'MKL_NUM_THREADS', 'OPENBLAS_NUM_THREADS'):
      env[var] = threads
    env['CALCULON_PROFILE_ATTEMPT'] = str(attempt)
    env['PYTHONUNBUFFERED'] = '1'
    here = os.path.dirname(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__))))
    env['PYTHONPATH'] = here + os.pathsep + env.get('PYTHONPATH', '')
    return env

  def try_once(self, spec, run, attempt):
    """One try of ``spec``: returns (result dict or None, :class:`Attempt`)."""
    argv = self.command + [spec.name, spec.kind, json.dumps(spec.args)]
    start = time.perf_counter()
    try:
      proc = subprocess.Popen(argv, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              start_new_session=True,
                              env=self._env(spec, attempt))
    except OSError as err:
      return None, Attempt(spec.name, run, attempt, 'launch', None,
                           time.perf_counter() - start, str(err))
    try:
      out, err = proc.communicate(timeout=spec.timeout_s)
    except subprocess.TimeoutExpired:
      _kill_group(proc)
      proc.communicate()
      return None, Attempt(spec.name, run, attempt, 'timeout', None,
                           time.perf_counter() - start,
                           f'timed out after {spec.timeout_s:g} s')
    finally:
      _kill_group(proc)  # ranks or helpers it left behind
    wall = time.perf_counter() - start
    tail = ' | '.join(err.strip().splitlines()[-3:])
    if proc.returncode != 0:
      return None, Attempt(spec.name, run, attempt, 'exit', proc.returncode,
                           wall, f'exit status {proc.returncode}: {tail}')
    try:
      result = parse_result(out)
    except ValueError as exc:
      return None, Attempt(spec.name, run, attempt, 'parse', 0, wall,
                           str(exc))
    return result, Attempt(spec.name, run, attempt, 'ok', 0, wall)

  def run(self, spec):
    """``repeats`` runs of ``spec``, each with up to ``tries`` tries.

    Returns:
      an :class:`Outcome`. A run whose every try failed ends the benchmark
      (the machine will not do better on the next run): the runs already
      made are kept, and the outcome is failed only when none succeeded.
    """
    outcome = Outcome(spec, ok=False)
    for run in range(1, self.repeats + 1):
      result = None
      for attempt in range(1, self.tries + 1):
        result, att = self.try_once(spec, run, attempt)
        outcome.attempts.append(att)
        if self.on_attempt:
          self.on_attempt(att)
        if result is not None:
          break
        outcome.error = att.message
        if attempt < self.tries:
          time.sleep(self.retry_delay_s)
      if result is None:
        break
      outcome.runs.append(result)
    if outcome.runs:
      outcome.ok = True
      outcome.best = best_of(outcome.runs)
    return outcome
