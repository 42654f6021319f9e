"""Memory bandwidth benchmarks (worker side).

* :func:`memcopy` -- memory tier 1: a copy into a preallocated buffer,
  counted the STREAM way (McCalpin, STREAM "Copy": 2 x N bytes per copy of
  N bytes, one read and one write).
* :func:`host_device` -- memory tier 2 of a GPU: pinned host memory to the
  device and back (``cudaMemcpyAsync`` through ``Tensor.copy_``), N bytes
  per copy.
"""

import numpy as np

from calculon.profile.timing import (
  environment, make_sync, median_time_s, setup_torch)


def memcopy(backend, device, sizes, min_time_s=0.2, threads=1):
  """Copy bandwidth (bytes/s, 2N per copy of N bytes) for each size in
  bytes."""
  sync = make_sync(backend, device)
  points = []
  if backend == 'numpy':
    for size in sizes:
      src = np.ones(size // 4, dtype=np.float32)
      dst = np.empty_like(src)
      t = median_time_s(lambda: np.copyto(dst, src), sync, min_time_s)
      points.append(_point('copy', size, 2 * size, t))
  else:
    torch = setup_torch(device, threads)
    for size in sizes:
      src = torch.ones(size // 4, device=device)
      dst = torch.empty_like(src)
      t = median_time_s(lambda: dst.copy_(src), sync, min_time_s)
      points.append(_point('copy', size, 2 * size, t))
  return {'points': points, 'info': dict(environment(backend, device, threads),
                                         op='memcopy', bytes_counted='2N')}


def host_device(backend, device, sizes, min_time_s=0.2, threads=1):
  """Pinned host <-> device bandwidth (bytes/s, N per copy of N bytes).

  Raises:
    ValueError: not the torch backend on a CUDA device.
  """
  if backend != 'torch' or device != 'cuda':
    raise ValueError('host-device bandwidth needs torch and --device cuda')
  torch = setup_torch(device, threads)
  sync = make_sync(backend, device)
  points = []
  for size in sizes:
    host = torch.ones(size // 4, pin_memory=True)
    dev = torch.empty(size // 4, device='cuda')
    back = torch.empty(size // 4, pin_memory=True)
    t_in = median_time_s(lambda: dev.copy_(host, non_blocking=True), sync,
                         min_time_s)
    t_out = median_time_s(lambda: back.copy_(dev, non_blocking=True), sync,
                          min_time_s)
    points.append(_point('h2d', size, size, t_in))
    points.append(_point('d2h', size, size, t_out))
  return {'points': points, 'info': dict(environment(backend, device, threads),
                                         op='host_device', bytes_counted='N')}


def _point(op, size, moved, t):
  return {'key': f'{op}.{size}', 'op': op, 'bytes': int(size),
          'bytes_moved': int(moved), 'seconds': t, 'value': moved / t}
