"""Timing and backend helpers shared by the benchmarks (worker side).

Measurement rules (docs/profile.md): warm up, group calls so one sample
lasts at least ``SAMPLE_MIN_S`` (timer and launch overhead amortized), take
samples until ``min_time_s`` of measurement, return the median per call
(``torch.utils.benchmark`` and ``triton.testing.do_bench`` take the median
too); the runner then keeps the best median across independent processes.
"""

import os
import platform
import statistics
import time

SAMPLE_MIN_S = 1e-3
MAX_SAMPLES = 50

#: Clocks: 'wall' (time.perf_counter, the default) or 'cpu'
#: (time.process_time: only the time this process ran, so other processes
#: on a shared CPU do not count; meant for one thread per process -- with
#: several, OpenMP threads spinning at a barrier count too).
CLOCKS = {'wall': time.perf_counter, 'cpu': time.process_time}
_clock = {'now': time.perf_counter}


def set_clock(name):
  """Selects the clock of :func:`now` ('wall' or 'cpu').

  Raises:
    ValueError: another name.
  """
  if name not in CLOCKS:
    raise ValueError(f'clock {name!r}: one of {sorted(CLOCKS)}')
  _clock['now'] = CLOCKS[name]


def now():
  """Seconds on the selected clock."""
  return _clock['now']()


def have_torch():
  """True when torch is installed (found, not imported: importing it takes
  seconds)."""
  import importlib.util
  return importlib.util.find_spec('torch') is not None


def setup_torch(device, threads):
  """Imports torch, sets its CPU threads, checks the device.

  Raises:
    RuntimeError: ``device`` is 'cuda' and no CUDA device is visible.
  """
  import torch
  torch.set_num_threads(max(1, int(threads)))
  if device == 'cuda':
    if not torch.cuda.is_available():
      raise RuntimeError('--device cuda: torch sees no CUDA device')
    # calculon's float32 is IEEE fp32: no TF32 tensor-core shortcut.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
  return torch


def make_sync(backend, device):
  """A function that waits for queued device work (no-op on CPU)."""
  if backend == 'torch' and device == 'cuda':
    import torch
    return torch.cuda.synchronize
  return lambda: None


def median_time_s(fn, sync, min_time_s=0.2, warmup=2):
  """Median seconds per call of ``fn`` (see the module docstring)."""
  for _ in range(max(1, warmup)):
    fn()
  sync()
  start = now()
  fn()
  sync()
  single = max(now() - start, 1e-9)
  per_sample = max(1, int(SAMPLE_MIN_S / single))
  samples, total = [], 0.0
  while (total < min_time_s or len(samples) < 3) and \
      len(samples) < MAX_SAMPLES:
    start = now()
    for _ in range(per_sample):
      fn()
    sync()
    elapsed = now() - start
    samples.append(elapsed / per_sample)
    total += elapsed
  return statistics.median(samples)


def environment(backend, device, threads):
  """What the measurement ran on: versions, device, threads."""
  import numpy
  env = {'backend': backend, 'device': device, 'threads': int(threads),
         'python': platform.python_version(), 'numpy': numpy.__version__,
         'machine': platform.machine(), 'pid': os.getpid()}
  if backend == 'torch':
    import torch
    env['torch'] = torch.__version__
    if device == 'cuda' and torch.cuda.is_available():
      env['device_name'] = torch.cuda.get_device_name(0)
  return env
