#!/usr/bin/env python3
"""Fused attention against a large GEMM on this GPU: the measurement behind
a system file's ``fused_attention_efficiency`` and the conventions'
per-kernel factors (validation/conventions.yaml, ``attention_kernels``).

    python benchmarks/gpu_attention.py [--seqs 4096,8192,16384] [--heads 32]
        [--dim 128] [--json FILE]

Needs torch with CUDA.  For each sequence length it times PyTorch's
``scaled_dot_product_attention`` with each backend that runs (FlashAttention
-- PyTorch's bundled FlashAttention-2 --, cuDNN, memory-efficient), causal,
bfloat16, batch 1, 32 heads of 128 by default (Llama 3 8B's query heads;
the keys and values repeated to 32 heads as torchtitan's models pass them;
``--heads``, ``--dim`` change them), forward and
forward + backward, with CUDA events (3 warm-ups, the median of 10).  FLOP
as calculon counts them for a causal fused kernel: forward 4 S^2 H D / 2
(half the score matrix), backward 2.5 times that (Dao 2023,
"FlashAttention-2", section 4.1).  The reference is a bfloat16 GEMM of
16384 x 4096 x 14336 (Llama 3 8B's gate/up projection of 16k tokens) and
one of 8192^3, timed the same way: ``rel`` is the attention's TFLOP/s over
the first GEMM's, the ratio a system file's ``fused_attention_efficiency``
stands for (calculon/llm/layers.py, FusedAttention).  Prints a markdown
table; ``--json`` writes the numbers.

Exits 2 with one line when torch or a CUDA device is missing.
"""

import argparse
import json
import os
import statistics
import sys


def cuda_median_ms(fn, torch, warmup=3, iters=10):
  """Median milliseconds of ``fn()`` over ``iters`` runs (CUDA events),
  after ``warmup`` runs; also used by gpu_llama_block.py."""
  for _ in range(warmup):
    fn()
  torch.cuda.synchronize()
  times = []
  for _ in range(iters):
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    times.append(start.elapsed_time(end))
  return statistics.median(times)


def cuda_torch(prog):
  """torch, or None after one line on stderr naming ``prog`` when torch
  is not installed or sees no CUDA device; also used by
  gpu_llama_block.py."""
  try:
    import torch
  except ImportError:
    print(f'{prog}: torch is not installed', file=sys.stderr)
    return None
  if not torch.cuda.is_available():
    print(f'{prog}: no CUDA device', file=sys.stderr)
    return None
  return torch


def gemm_tflops(torch, m, n, k):
  a = torch.randn(m, k, device='cuda', dtype=torch.bfloat16)
  b = torch.randn(k, n, device='cuda', dtype=torch.bfloat16)
  ms = cuda_median_ms(lambda: a @ b, torch)
  return 2.0 * m * n * k / (ms * 1e-3) / 1e12


def attention_row(torch, backend, seq, heads=32, dim=128):
  """(forward TFLOP/s, forward + backward TFLOP/s) or None if the backend
  does not run these inputs."""
  import torch.nn.functional as F
  from torch.nn.attention import sdpa_kernel
  shape = (1, heads, seq, dim)
  q, k, v = (torch.randn(shape, device='cuda', dtype=torch.bfloat16,
                         requires_grad=True) for _ in range(3))
  grad = torch.randn(shape, device='cuda', dtype=torch.bfloat16)
  fw_flop = 4.0 * seq * seq * heads * dim / 2
  try:
    with sdpa_kernel([backend]):
      def fw():
        with torch.no_grad():
          F.scaled_dot_product_attention(q, k, v, is_causal=True)

      def fwbw():
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out.backward(grad)
      fw_ms = cuda_median_ms(fw, torch)
      fwbw_ms = cuda_median_ms(fwbw, torch)
  except RuntimeError:
    return None
  return (fw_flop / (fw_ms * 1e-3) / 1e12,
          3.5 * fw_flop / (fwbw_ms * 1e-3) / 1e12)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  ap.add_argument('--seqs', default='4096,8192,16384')
  ap.add_argument('--heads', type=int, default=32)
  ap.add_argument('--dim', type=int, default=128, help='head width')
  ap.add_argument('--json', help='write the numbers to this file')
  args = ap.parse_args(argv)
  torch = cuda_torch('gpu_attention')
  if torch is None:
    return 2
  from torch.nn.attention import SDPBackend
  try:
    seqs = [int(s) for s in args.seqs.split(',')]
  except ValueError:
    print(f'gpu_attention: --seqs {args.seqs!r}: integers separated by '
          'commas', file=sys.stderr)
    return 2
  if args.heads < 1 or args.dim < 1:
    print('gpu_attention: --heads and --dim must be positive',
          file=sys.stderr)
    return 2
  out = {'device': torch.cuda.get_device_name(0),
         'heads': args.heads, 'dim': args.dim,
         'torch': torch.__version__,
         'cudnn': torch.backends.cudnn.version(),
         'gemm_16384x4096x14336_tflops': gemm_tflops(torch, 16384, 14336,
                                                     4096),
         'gemm_8192_cubed_tflops': gemm_tflops(torch, 8192, 8192, 8192),
         'attention': []}
  ref = out['gemm_16384x4096x14336_tflops']
  print(f"{out['device']}, torch {out['torch']}, cuDNN {out['cudnn']}; "
        f"{args.heads} heads of {args.dim}")
  print(f"bf16 GEMM 16384x4096x14336: {ref:.0f} TFLOP/s; 8192^3: "
        f"{out['gemm_8192_cubed_tflops']:.0f} TFLOP/s\n")
  print('| kernel | sequence | forward TFLOP/s | fw + bw TFLOP/s | rel '
        '(fw + bw / GEMM) |')
  print('|---|---|---|---|---|')
  backends = [('flash (FlashAttention-2)', SDPBackend.FLASH_ATTENTION),
              ('cudnn', SDPBackend.CUDNN_ATTENTION),
              ('memory-efficient', SDPBackend.EFFICIENT_ATTENTION)]
  for name, backend in backends:
    for seq in seqs:
      row = attention_row(torch, backend, seq, args.heads, args.dim)
      if row is None:
        print(f'| {name} | {seq} | (does not run) | | |')
        continue
      fw, fwbw = row
      out['attention'].append({'kernel': name, 'seq': seq,
                               'fw_tflops': fw, 'fwbw_tflops': fwbw,
                               'rel': fwbw / ref})
      print(f'| {name} | {seq} | {fw:.0f} | {fwbw:.0f} | {fwbw / ref:.2f} |')
  return write_json(args.json, out)


def write_json(path, out):
  """Writes ``out`` to ``path`` (atomically; nothing when ``path`` is
  None); the exit status 0.  Also used by gpu_llama_block.py."""
  if path:
    tmp = f'{path}.tmp'
    with open(tmp, 'w') as fd:
      json.dump(out, fd, indent=2)
    os.replace(tmp, path)
  return 0


if __name__ == '__main__':
  sys.exit(main())
