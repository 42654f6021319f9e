"""Collective benchmarks among local processes (worker side).

Reported as nccl-tests does (NVIDIA/nccl-tests, doc/PERFORMANCE.md and
``src/*.cu::*GetBw``): for an operation on a buffer of S bytes taking t
seconds among n ranks, the algorithm bandwidth is algbw = S / t and the bus
bandwidth busbw = algbw x factor, with S and the factor:

=============== ============================================ ============
op              S                                            factor
=============== ============================================ ============
all_reduce      the buffer (count x type)                    2 (n-1) / n
all_gather      the whole output (n x the per-rank input)    (n-1) / n
reduce_scatter  the whole input (n x the per-rank output)    (n-1) / n
all_to_all      the per-rank buffer                          (n-1) / n
p2p (sendrecv)  the buffer each rank sends                   1
=============== ============================================ ============

Bytes are SI (GB = 1e9).  t is the slowest rank's mean over the timed loop
(nccl-tests' ``-a 3``), the loop started after a barrier.

Backends: ``torch.distributed`` (gloo on CPU, NCCL on CUDA), ranks started
with ``torch.multiprocessing`` and a file rendezvous; or, without torch,
:mod:`multiprocessing` processes exchanging numpy buffers over pipes with
ring algorithms (Thakur, Rabenseifner and Gropp 2005, "Optimization of
collective communication operations in MPICH", section 4: ring all-gather,
reduce-scatter, and all-reduce as reduce-scatter + all-gather).
"""

import json
import os
import shutil
import tempfile
import threading
import time
import warnings

import numpy as np

from calculon.profile.timing import environment

OPS = ('all_reduce', 'all_gather', 'reduce_scatter', 'all_to_all', 'p2p')


def bus_factor(op, n):
  """nccl-tests' bus-bandwidth factor of ``op`` among ``n`` ranks."""
  if op == 'all_reduce':
    return 2.0 * (n - 1) / n
  if op in ('all_gather', 'reduce_scatter', 'all_to_all'):
    return (n - 1) / n
  if op == 'p2p':
    return 1.0
  raise ValueError(f'unknown collective {op!r}: one of {OPS}')


def collectives(backend, device, procs, sizes, ops=OPS, min_time_s=0.1,
                threads=1, timeout_s=300):
  """Times each op at each size (bytes, S as in the table) among ``procs``
  local ranks.

  Raises:
    ValueError: fewer than 2 processes.
    RuntimeError: a rank failed.
  """
  procs = int(procs)
  if procs < 2:
    raise ValueError('collectives need --procs >= 2')
  sizes = [int(s) // (4 * procs) * (4 * procs) for s in sizes]
  tmp = tempfile.mkdtemp(prefix='calculon-coll-')
  try:
    args = (procs, tmp, device, sizes, list(ops), float(min_time_s),
            int(threads), float(timeout_s))
    if backend == 'torch':
      import torch.multiprocessing as tmp_mp
      tmp_mp.start_processes(_torch_rank, args=args, nprocs=procs,
                             start_method='spawn')
    else:
      _numpy_run(*args)
    with open(os.path.join(tmp, 'rank0.json')) as fd:
      rows = json.load(fd)
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  points = []
  for row in rows:
    op, size, t = row['op'], row['bytes'], row['seconds']
    algbw = size / t
    points.append({'key': f'{op}.{size}', 'op': op, 'bytes': size,
                   'seconds': t, 'algbw': algbw,
                   'busbw': algbw * bus_factor(op, procs),
                   'bus_factor': bus_factor(op, procs),
                   'emulated': row.get('emulated', False),
                   'value': algbw * bus_factor(op, procs)})
  info = dict(environment(backend, device, threads), op='collectives',
              procs=procs,
              transport=('nccl' if device == 'cuda' else 'gloo')
              if backend == 'torch' else 'multiprocessing pipes')
  return {'points': points, 'info': info}


def _iterations(t_one, min_time_s):
  return int(min(200, max(2, min_time_s / max(t_one, 1e-7))))


# -- torch.distributed -------------------------------------------------------------

def _torch_rank(rank, procs, tmp, device, sizes, ops, min_time_s, threads,
                timeout_s):
  import datetime
  import torch
  import torch.distributed as dist
  warnings.filterwarnings('ignore', category=FutureWarning)
  torch.set_num_threads(max(1, threads))
  if device == 'cuda':
    torch.cuda.set_device(rank)
  dev = torch.device('cuda', rank) if device == 'cuda' else torch.device('cpu')
  backend = 'nccl' if device == 'cuda' else 'gloo'
  dist.init_process_group(backend, init_method='file://' + os.path.join(
    tmp, 'rendezvous'), rank=rank, world_size=procs,
    timeout=datetime.timedelta(seconds=timeout_s))
  sync = torch.cuda.synchronize if device == 'cuda' else (lambda: None)
  rows = []
  for op in ops:
    for size in sizes:
      fn = collective_call(dist, torch, op, size, procs, rank, dev)
      t = _torch_time(dist, torch, dev, fn, sync, min_time_s)
      rows.append({'op': op, 'bytes': size, 'seconds': t,
                   'emulated': op == 'reduce_scatter' and backend == 'gloo'})
  if rank == 0:
    with open(os.path.join(tmp, 'rank0.json'), 'w') as fd:
      json.dump(rows, fd)
  dist.barrier()
  dist.destroy_process_group()


def collective_call(dist, torch, op, nbytes, ranks, rank, dev,
                    dtype=None):
  """A callable that runs one ``op`` of ``nbytes`` per rank among
  ``ranks`` (torch.distributed, initialized): 'all_reduce', 'all_gather'
  (each rank's share nbytes / ranks), 'reduce_scatter', 'all_to_all' (or
  'alltoall'), else a ring send/receive to the next rank ('p2p').  Its
  buffers, ``dtype`` elements (float32 when None), are made here, once."""
  dtype = dtype or torch.float32
  count = nbytes // torch.tensor([], dtype=dtype).element_size()
  part = count // ranks
  full = lambda n: torch.ones(n, device=dev, dtype=dtype)  # noqa: E731
  empty = lambda n: torch.empty(n, device=dev, dtype=dtype)  # noqa: E731
  if op == 'all_reduce':
    x = full(count)
    return lambda: dist.all_reduce(x)
  if op == 'all_gather':
    gather = getattr(dist, 'all_gather_single', None) or \
      dist.all_gather_into_tensor
    x, out = full(part), empty(count)
    return lambda: gather(out, x)
  if op == 'reduce_scatter':
    scatter = getattr(dist, 'reduce_scatter_single', None) or \
      dist.reduce_scatter_tensor
    x, out = full(count), empty(part)
    return lambda: scatter(out, x)
  x, out = full(count), empty(count)
  if op in ('all_to_all', 'alltoall'):
    return lambda: dist.all_to_all_single(out, x)
  nxt, prv = (rank + 1) % ranks, (rank - 1) % ranks

  def ring():
    for req in dist.batch_isend_irecv([
        dist.P2POp(dist.isend, x, nxt), dist.P2POp(dist.irecv, out, prv)]):
      req.wait()
  return ring


def _torch_time(dist, torch, dev, fn, sync, min_time_s):
  fn()
  fn()
  sync()
  dist.barrier()
  start = time.perf_counter()
  fn()
  sync()
  one = torch.tensor([time.perf_counter() - start], device=dev)
  dist.all_reduce(one, op=dist.ReduceOp.MAX)   # every rank: same count
  iters = _iterations(float(one.item()), min_time_s)
  dist.barrier()
  start = time.perf_counter()
  for _ in range(iters):
    fn()
  sync()
  t = torch.tensor([(time.perf_counter() - start) / iters], device=dev)
  dist.all_reduce(t, op=dist.ReduceOp.MAX)
  return float(t.item())


# -- numpy + multiprocessing -------------------------------------------------------

def _numpy_run(procs, tmp, device, sizes, ops, min_time_s, threads,
               timeout_s):
  import multiprocessing as mp
  ctx = mp.get_context('spawn')
  links = {}
  for a in range(procs):
    for b in range(a + 1, procs):
      links[(a, b)], links[(b, a)] = ctx.Pipe(duplex=True)
  barrier = ctx.Barrier(procs)
  times = ctx.Queue()
  workers = []
  for rank in range(procs):
    mine = {peer: links[(rank, peer)] for peer in range(procs) if peer != rank}
    workers.append(ctx.Process(target=_numpy_rank, args=(
      rank, procs, mine, barrier, times, sizes, ops, min_time_s)))
  for w in workers:
    w.start()
  rows = {}
  try:
    for _ in range(procs * len(ops) * len(sizes)):
      rank, op, size, t = times.get(timeout=timeout_s)
      key = (op, size)
      rows[key] = max(rows.get(key, 0.0), t)
  finally:
    for w in workers:
      w.join(timeout=10)
      if w.is_alive():
        w.kill()
  if any(w.exitcode != 0 for w in workers):
    raise RuntimeError('a rank of the numpy collective benchmark failed')
  out = [{'op': op, 'bytes': size, 'seconds': rows[(op, size)]}
         for op in ops for size in sizes]
  with open(os.path.join(tmp, 'rank0.json'), 'w') as fd:
    json.dump(out, fd)


def _exchange(links, to, send, frm, recv):
  """Sends ``send`` to rank ``to`` while receiving into ``recv`` from rank
  ``frm`` (a thread sends so that large buffers cannot deadlock)."""
  sender = threading.Thread(target=links[to].send_bytes, args=(send,))
  sender.start()
  links[frm].recv_bytes_into(recv)
  sender.join()


def _numpy_op(op, rank, n, links, buf, out, tmp):
  nxt, prv = (rank + 1) % n, (rank - 1) % n
  if op == 'p2p':
    _exchange(links, nxt, buf, prv, out)
    return
  if op == 'all_to_all':
    chunks = np.split(buf, n)
    outs = np.split(out, n)
    outs[rank][:] = chunks[rank]
    for d in range(1, n):
      _exchange(links, (rank + d) % n, chunks[(rank + d) % n],
                (rank - d) % n, outs[(rank - d) % n])
    return
  if op in ('reduce_scatter', 'all_reduce'):
    chunks = np.split(buf, n)
    part = tmp[:len(chunks[0])]
    for step in range(n - 1):   # ring reduce-scatter
      send = chunks[(rank - step) % n]
      recv_idx = (rank - step - 1) % n
      _exchange(links, nxt, send, prv, part)
      chunks[recv_idx] += part
    if op == 'reduce_scatter':
      out[:len(chunks[0])] = chunks[(rank + 1) % n]
      return
    for step in range(n - 1):   # ring all-gather of the reduced chunks
      send = chunks[(rank + 1 - step) % n]
      _exchange(links, nxt, send, prv, chunks[(rank - step) % n])
    return
  if op == 'all_gather':
    chunks = np.split(out, n)
    chunks[rank][:] = buf[:len(chunks[0])]
    for step in range(n - 1):
      _exchange(links, nxt, chunks[(rank - step) % n], prv,
                chunks[(rank - step - 1) % n])
    return
  raise ValueError(f'unknown collective {op!r}')


def _numpy_rank(rank, n, links, barrier, times, sizes, ops, min_time_s):
  for op in ops:
    for size in sizes:
      count = size // 4
      buf = np.ones(count, dtype=np.float32)
      out = np.empty(count, dtype=np.float32)
      tmp = np.empty(count, dtype=np.float32)
      if op == 'all_gather':
        buf = buf[:count // n]
      fn = lambda: _numpy_op(op, rank, n, links, buf, out, tmp)  # noqa
      fn()
      barrier.wait()
      start = time.perf_counter()
      fn()
      one = time.perf_counter() - start
      # Every rank must run the same count: agree on the slowest's estimate.
      times_one = _agree_max(one, rank, n, links)
      iters = _iterations(times_one, min_time_s)
      barrier.wait()
      start = time.perf_counter()
      for _ in range(iters):
        fn()
      times.put((rank, op, size, (time.perf_counter() - start) / iters))


def _agree_max(value, rank, n, links):
  for peer in range(n):
    if peer != rank:
      links[peer].send(value)
  for peer in range(n):
    if peer != rank:
      value = max(value, links[peer].recv())
  return value
