"""``calculon profile``: microbenchmarks of this machine into a system file.
"""

import json
import logging
import os
import platform
import time
from dataclasses import dataclass, field

import psutil

from calculon.errors import ConfigError
from calculon.profile import build
from calculon.profile.runner import Runner
from calculon.profile.timing import have_torch

#: glibc malloc settings given to every benchmark and training process on
#: the CPU: never return large blocks to the kernel, so a tensor larger
#: than malloc's mmap threshold (at most 32 MiB) is not a fresh mapping
#: paying first-touch page faults on every call.  PyTorch's CPU tuning
#: guide recommends a caching allocator (jemalloc, tcmalloc) for the same
#: reason; this gets the effect without a preload.  Both the profile and
#: ``profile-step`` use it, so they measure the same thing.
ALLOCATOR_ENV = {'MALLOC_MMAP_MAX_': '0',
                 'MALLOC_TRIM_THRESHOLD_': str(2 ** 40)}


@dataclass
class ProfileResult:
  """A finished profile: the system dict, the fields left at defaults (with
  why), every outcome by benchmark name, the network fit, metadata."""
  system: dict
  defaults: dict
  outcomes: dict
  network_fit: dict = None
  meta: dict = field(default_factory=dict)


def resolve_backend(backend, device, log=None):
  """'torch' or 'numpy' for ``backend`` 'auto' | 'torch' | 'numpy'.

  Raises:
    ConfigError: torch asked for (or needed by --device cuda) but absent;
      numpy with --device cuda.
  """
  log = log or logging.getLogger('calculon')
  if backend not in ('auto', 'torch', 'numpy'):
    raise ConfigError(f'--backend {backend!r} is not allowed: auto, torch or '
                      'numpy', field='--backend', value=backend)
  if device not in ('cpu', 'cuda'):
    raise ConfigError(f'--device {device!r} is not allowed: cpu or cuda',
                      field='--device', value=device)
  if device == 'cuda' and backend == 'numpy':
    raise ConfigError('--device cuda needs --backend torch (numpy runs on '
                      'the CPU only)', field='--backend', value=backend)
  torch_ok = have_torch()
  if device == 'cuda':
    if not torch_ok:
      raise ConfigError("--device cuda needs torch: pip install -e "
                        "'.[profile]'", field='--device', value=device)
    return 'torch'
  if backend == 'torch' and not torch_ok:
    raise ConfigError("--backend torch: torch is not installed (pip install "
                      "-e '.[profile]')", field='--backend', value=backend)
  if backend == 'auto':
    backend = 'torch' if torch_ok else 'numpy'
    if backend == 'numpy':
      log.info('torch is not installed: the CPU profile uses numpy (BLAS) '
               'and multiprocessing instead')
  return backend


def check_clock(clock, device):
  """Raises ConfigError unless ``clock`` is 'wall', or 'cpu' on the CPU."""
  if clock not in ('wall', 'cpu'):
    raise ConfigError(f'--clock {clock!r} is not allowed: wall or cpu',
                      field='--clock', value=clock)
  if clock == 'cpu' and device != 'cpu':
    raise ConfigError('--clock cpu measures CPU time: only with --device cpu',
                      field='--clock', value=clock)


def check_cuda(procs):
  """The CUDA compute capability of device 0.

  Raises:
    ConfigError: no CUDA device, or fewer than ``procs``.
  """
  import torch
  if not torch.cuda.is_available():
    raise ConfigError('--device cuda: torch sees no CUDA device on this '
                      'machine (use --device cpu)', field='--device',
                      value='cuda')
  count = torch.cuda.device_count()
  if procs > count:
    raise ConfigError(f'--procs {procs}: only {count} CUDA devices are '
                      'visible', field='--procs', value=procs)
  return torch.cuda.get_device_capability(0)


def capacities(device, procs):
  """(mem1 GiB, mem2 GiB) of one processor: the device's memory and the
  host's share on CUDA; the host memory shared by ``procs`` processes on
  the CPU (no second tier)."""
  host = psutil.virtual_memory().total / 2 ** 30
  if device == 'cuda':
    import torch
    dev = torch.cuda.get_device_properties(0).total_memory / 2 ** 30
    return round(dev, 3), round(host / procs, 3)
  return round(host / procs, 3), 0


def system_info(device):
  """Processor, memory, devices and library versions (the Anemoi
  profiler's system report, from psutil and torch)."""
  import numpy
  import calculon
  info = {
    'host': platform.node(), 'platform': platform.platform(),
    'processor': _cpu_model(), 'logical_cpus': psutil.cpu_count(),
    'physical_cpus': psutil.cpu_count(logical=False),
    'memory_GiB': round(psutil.virtual_memory().total / 2 ** 30, 2),
    'python': platform.python_version(), 'numpy': numpy.__version__,
    'calculon': calculon.__version__,
  }
  try:   # other processes slow every measurement: keep the load with it
    info['load_average'] = [round(x, 2) for x in os.getloadavg()]
  except (AttributeError, OSError):
    pass
  if have_torch():
    import torch
    info['torch'] = torch.__version__
    info['torch_threads'] = torch.get_num_threads()
    if device == 'cuda' and torch.cuda.is_available():
      info['devices'] = [torch.cuda.get_device_name(i)
                         for i in range(torch.cuda.device_count())]
      info['cuda'] = torch.version.cuda
  return info


def _cpu_model():
  try:
    with open('/proc/cpuinfo') as fd:
      for line in fd:
        if line.startswith('model name'):
          return line.split(':', 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine()


def run_profile(device='cpu', procs=1, quick=False, backend='auto',
                dtypes=None, timeout_s=None, retry_delay_s=None, repeats=None,
                tries=3, quiet=False, log=None, smoke=False, threads=None,
                clock='wall'):
  """Runs every benchmark of the plan and builds the system.

  Args:
    device: 'cpu' or 'cuda'.  procs: processes (GPUs) of the node; each
      profiled processor is one of them.  quick: the short plan (a minute
      on a small CPU).  backend: 'auto', 'torch' or 'numpy'.  dtypes: list
      of datatype names, or None for :func:`build.default_dtypes`.
      smoke: tiny sizes (implies quick): checks the setup, measures
      overheads only.  threads: CPU threads per process (default cores /
      procs).  clock: 'wall' or 'cpu' (process CPU time, CPU only: see
      :data:`calculon.profile.timing.CLOCKS`).
    timeout_s, retry_delay_s, repeats, tries: runner settings (defaults:
      300 s / 60 s quick, 5 s / 1 s quick, 3 / 1 quick, 3 tries).

  Returns:
    :class:`ProfileResult`.

  Raises:
    ConfigError: an argument is invalid, or CUDA is asked for and absent.
  """
  log = log or logging.getLogger('calculon')
  quick = quick or smoke
  backend = resolve_backend(backend, device, log)
  check_clock(clock, device)
  if procs < 1:
    raise ConfigError(f'--procs {procs} must be >= 1', field='--procs',
                      value=procs)
  capability = check_cuda(procs) if device == 'cuda' else None
  if dtypes is None:
    dtypes = build.default_dtypes(device, backend, quick, capability)
  from calculon.config.execution import DATATYPE_NAMES
  for dt in dtypes:
    if dt not in DATATYPE_NAMES:
      raise ConfigError(f'--dtypes: {dt!r} is not allowed: one of '
                        + ', '.join(DATATYPE_NAMES), field='--dtypes',
                        value=dt)
  timeout_s = timeout_s or (60.0 if quick else 300.0)
  retry_delay_s = (1.0 if quick else 5.0) if retry_delay_s is None \
    else retry_delay_s
  repeats = repeats or (1 if quick else 3)
  specs = build.plan(device, backend, procs, quick, dtypes, timeout_s,
                     smoke, threads, clock)
  env = dict(ALLOCATOR_ENV) if device == 'cpu' else {}
  start = time.perf_counter()
  outcomes = _run_all(specs, Runner(tries=tries, retry_delay_s=retry_delay_s,
                                    repeats=repeats, env=env), quiet, log)
  mem1_gib, mem2_gib = capacities(device, procs)
  system, defaults, fit = build.system_from_outcomes(
    outcomes, device, procs, dtypes, mem1_gib, mem2_gib)
  from calculon.config.system import SystemConfig
  SystemConfig.from_dict(system, '<profile>')   # our own validator
  why = {}
  for name in defaults:
    key = name if name != 'networks[0]' else 'network'
    out = outcomes.get(key)
    why[name] = out.error if out is not None else 'not run'
  meta = {'device': device, 'procs': procs, 'backend': backend,
          'quick': quick, 'smoke': smoke, 'dtypes': dtypes, 'clock': clock,
          'threads_per_proc': build.threads_per_proc(procs, threads),
          'runner': {'tries': tries, 'retry_delay_s': retry_delay_s,
                     'repeats': repeats, 'timeout_s': timeout_s},
          'allocator_env': env, 'processing_mode_reason':
          'curves are measured on whole operations (memory traffic '
          'included): roofline, not no_overlap',
          'peak_source': 'best measured throughput (MAMF-style); '
          'efficiency = achieved / best',
          'wall_s': round(time.perf_counter() - start, 2),
          'system_info': system_info(device)}
  return ProfileResult(system, why, outcomes, fit, meta)


def _on_sigterm(signum, frame):
  raise KeyboardInterrupt


def _run_all(specs, runner, quiet, log):
  """Runs the specs; SIGTERM becomes KeyboardInterrupt meanwhile, so the
  running benchmark's process group is killed on the way out (the runner
  kills it in a ``finally``), not orphaned."""
  import signal
  import threading
  previous = None
  if threading.current_thread() is threading.main_thread():
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
  try:
    return _run_specs(specs, runner, quiet, log)
  finally:
    if previous is not None:
      signal.signal(signal.SIGTERM, previous)


def _run_specs(specs, runner, quiet, log):
  from tqdm import tqdm
  bar = tqdm(total=len(specs) * runner.repeats, desc='profile', unit='run',
             disable=True if quiet else None, leave=False)

  def on_attempt(att):
    if att.status == 'ok':
      bar.update(1)
    else:
      log.debug(f'{att.name} run {att.run} try {att.attempt}: {att.status} '
                f'({att.message})')
    bar.set_postfix_str(att.name)

  runner.on_attempt = on_attempt
  outcomes = {}
  try:
    for spec in specs:
      bar.set_postfix_str(spec.name)
      out = runner.run(spec)
      outcomes[spec.name] = out
      if not out.ok:
        log.warning(f'{spec.name}: failed after {len(out.attempts)} tries '
                    f'({out.error}); its fields are left at the documented '
                    'defaults')
      bar.update(runner.repeats - len(out.runs))
  finally:
    bar.close()
  return outcomes


def outcome_json(out):
  """An outcome as JSON-able dict (for profile.json)."""
  return {'name': out.spec.name, 'kind': out.spec.kind, 'ok': out.ok,
          'error': out.error, 'args': out.spec.args,
          'attempts': [vars(a) for a in out.attempts],
          'runs': len(out.runs), 'best': out.best}


def profile_json(result):
  """Everything measured, as one JSON-able dict."""
  return {'system': result.system, 'defaults': result.defaults,
          'meta': result.meta, 'network_fit': result.network_fit,
          'benchmarks': [outcome_json(o) for o in result.outcomes.values()]}


def system_text(system):
  """The system file's text (indented JSON, like the bundled systems)."""
  return json.dumps(system, indent=2) + '\n'
