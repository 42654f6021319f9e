#!/usr/bin/env python3
"""What the loss holds on this GPU: the measurement behind
``cross_entropy_kernel`` 'eager' (calculon/llm/layers.py, CrossEntropy).

    python benchmarks/gpu_loss_memory.py [--shapes 2x8192x128256,...]
        [--json FILE]

``--json`` is checked before anything runs and written atomically.
Needs torch with CUDA (and NCCL, for a one-rank process group).  For each
logits shape B x S x V (bfloat16, as the LM head writes them) it runs
torchtitan's loss (torchtitan 9dec370 train.py ``loss_fn``:
``cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))``) two
ways:

* ``eager``: on a plain tensor, PyTorch's own cross_entropy (TP 1);
* ``loss_parallel``: on a DTensor sharded on the vocabulary over a
  one-rank mesh, inside ``torch.distributed.tensor.parallel.
  loss_parallel()``, forward and backward, as torchtitan runs it with
  TP > 1 (its output projection is ``ColwiseParallel(output_layouts=
  Shard(-1), use_local_output=False)``).  On one rank DTensor still runs
  its own decomposition (torch/distributed/tensor/parallel/loss.py
  ``_log_softmax``, ``_nll_loss_and_log_softmax_backward``): the buffers
  are a TP rank's, the all-reduces are over one rank.

It prints, in float32 logits buffers (B x S x V x 4 bytes) above the
16-bit logits: the forward's peak, what the forward keeps, the backward's
peak (torch.cuda.max_memory_allocated; the caching allocator's reserved
peak beside it, with PyTorch's expandable segments as torchtitan sets
them), and the forward + backward time (median of 5 after 2 warm-ups).
The defaults are Llama 3 8B's logits at 2 x 8,192 tokens (TP 1), Llama 3
70B's per-rank logits at TP 8 and 16 x 8,192 tokens (16,032 words), and
Llama 3.1 405B's at 4 x 8,192.  Measured on an H200 with PyTorch 2.11
(docs/profile.md, "A GPU run"): backward peaks 3.000 (eager) and 4.001
(loss_parallel) buffers.

Exits 2 with one line when torch or a CUDA device is missing.
"""

import argparse
import json
import os
import statistics
import sys
import time

DEFAULT_SHAPES = '2x8192x128256,16x8192x16032,4x8192x16032'


def parse_shapes(text):
  """'BxSxV,...' -> [(B, S, V), ...]; ValueError on a malformed entry."""
  shapes = []
  for part in text.split(','):
    dims = [int(x) for x in part.strip().lower().split('x')]
    if len(dims) != 3 or min(dims) < 1:
      raise ValueError(part)
    shapes.append(tuple(dims))
  return shapes


def main(argv=None):
  parser = argparse.ArgumentParser(
    prog='gpu_loss_memory.py',
    description='What the eager and the loss-parallel cross-entropy hold.')
  parser.add_argument('--shapes', default=DEFAULT_SHAPES,
                      help='logits shapes BxSxV, comma-separated '
                      f'(default {DEFAULT_SHAPES})')
  parser.add_argument('--json', help='write the numbers to this file')
  args = parser.parse_args(argv)
  try:
    shapes = parse_shapes(args.shapes)
  except ValueError as err:
    print(f'gpu_loss_memory.py: --shapes: {err} is not BxSxV with positive '
          'integers', file=sys.stderr)
    return 2
  here = os.path.dirname(os.path.abspath(__file__))
  sys.path[:0] = [here, os.path.dirname(here)]
  from calculon.errors import ConfigError
  from calculon.outputs import JSON_KINDS, check_output_path, write_text
  if args.json:
    try:
      check_output_path(args.json, JSON_KINDS, option='--json')
    except ConfigError as err:
      print(f'gpu_loss_memory.py: {err}', file=sys.stderr)
      return 2
  os.environ.setdefault('PYTORCH_CUDA_ALLOC_CONF', 'expandable_segments:True')
  from gpu_attention import cuda_torch
  torch = cuda_torch('gpu_loss_memory.py')
  if torch is None:
    return 2
  import torch.distributed as dist
  import torch.nn.functional as F
  from torch.distributed.device_mesh import init_device_mesh
  from torch.distributed.tensor import DTensor, Shard
  from torch.distributed.tensor.parallel import loss_parallel
  os.environ.setdefault('MASTER_ADDR', '127.0.0.1')
  os.environ.setdefault('MASTER_PORT', '29533')
  dist.init_process_group('nccl', rank=0, world_size=1)
  torch.cuda.set_device(0)
  mesh = init_device_mesh('cuda', (1,))

  def forward(logits, labels, mode):
    if mode == 'eager':
      return F.cross_entropy(logits.flatten(0, 1).float(),
                             labels.flatten(0, 1))
    pred = DTensor.from_local(logits, mesh, [Shard(-1)], run_check=False)
    with loss_parallel():
      return F.cross_entropy(pred.flatten(0, 1).float(),
                             labels.flatten(0, 1))

  def backward(loss, mode):
    if mode == 'eager':
      loss.backward()
    else:
      with loss_parallel():
        loss.backward()

  rows = []
  for b, s, v in shapes:
    for mode in ('eager', 'loss_parallel'):
      torch.cuda.empty_cache()
      logits = torch.randn(b, s, v, dtype=torch.bfloat16, device='cuda',
                           requires_grad=True)
      labels = torch.randint(0, v, (b, s), device='cuda')
      unit = b * s * v * 4
      torch.cuda.synchronize()
      base = torch.cuda.memory_allocated()
      base_reserved = torch.cuda.memory_reserved()
      torch.cuda.reset_peak_memory_stats()
      loss = forward(logits, labels, mode)
      torch.cuda.synchronize()
      fwd_peak = torch.cuda.max_memory_allocated() - base
      kept = torch.cuda.memory_allocated() - base
      torch.cuda.reset_peak_memory_stats()
      backward(loss, mode)
      torch.cuda.synchronize()
      bwd_peak = torch.cuda.max_memory_allocated() - base
      reserved = torch.cuda.max_memory_reserved() - base_reserved
      del loss
      logits.grad = None
      times = []
      for _ in range(7):
        torch.cuda.synchronize()
        start = time.perf_counter()
        backward(forward(logits, labels, mode), mode)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        logits.grad = None
      rows.append(dict(
        shape=[b, s, v], mode=mode, buffer_gib=unit / 2**30,
        forward_peak=fwd_peak / unit, kept=kept / unit,
        backward_peak=bwd_peak / unit, reserved_peak=reserved / unit,
        ms=1e3 * statistics.median(times[2:])))
      del logits, labels
  dist.destroy_process_group()
  print(f'{torch.cuda.get_device_name()}, PyTorch {torch.__version__}; '
        'float32 logits buffers above the 16-bit logits')
  print('| logits B x S x V | loss | buffer GiB | forward peak | kept | '
        'backward peak | reserved peak | fw + bw ms |')
  print('|---|---|---|---|---|---|---|---|')
  for r in rows:
    print(f"| {' x '.join(str(x) for x in r['shape'])} | {r['mode']} | "
          f"{r['buffer_gib']:.2f} | {r['forward_peak']:.3f} | "
          f"{r['kept']:.3f} | {r['backward_peak']:.3f} | "
          f"{r['reserved_peak']:.3f} | {r['ms']:.1f} |")
  if args.json:
    write_text(args.json, json.dumps(dict(
      device=torch.cuda.get_device_name(), torch=torch.__version__,
      rows=rows), indent=1) + '\n')
  return 0


if __name__ == '__main__':
  sys.exit(main())
