#!/usr/bin/env python3
"""The chunk GEMMs of an overlapped tensor-parallel layer on this GPU,
beside what the model prices them at: the one-GPU half of the measurement
the open lead "tensor parallelism with overlap" needs (docs/accuracy.md;
NVIDIA's Llama 3 70B layouts on 32 H100 measured TP 8 28 % slower than
TP 4 where the model gives 10 %).

    python benchmarks/gpu_tp_chunk_gemms.py [--system FILE] [--tp 4,8]
        [--tokens 4096] [--dtypes bfloat16,float8] [--model-only]
        [--json FILE]

Transformer Engine's userbuffers overlap runs an overlapped GEMM as one
cuBLAS GEMM per chunk (transformer_engine/common/comm_gemm_overlap/
comm_gemm_overlap.cpp at d0067d0da, ``split_overlap_ag``,
``split_overlap_rs``), the chunks its default configuration gives
(pytorch/module/base.py ``initialize_ub``): TP chunks for the ring-exchange
all-gather GEMMs (qkv and fc1 forward, proj and fc2 input gradient), 4 for
the pipelined reduce-scatter ones (proj and fc2 forward); the bulk overlaps
(qkv and fc1 input gradient) run whole and are left out.  The counts are
the engine's own (calculon/llm/layers.py ``te_gemm_chunks``),
the shapes those of Llama 3 70B (hidden 8192, 64 query and 8 key/value
heads of 128, feed-forward 28672, gated) at ``--tokens`` tokens a
microbatch (the layouts' sequence 4096, microbatch 1): M tokens x K x N
per rank, cut along M.

For each GEMM, TP degree and datatype it prints the whole GEMM's time and
the chunks' total, measured (CUDA events, 3 warm-ups, median of 10;
bfloat16 ``torch.matmul``, float8 ``torch._scaled_mm`` with e4m3 inputs
and per-tensor scales, as Transformer Engine's current scaling calls
cuBLASLt) and priced (the system file's matrix efficiency curve:
``chunks x time(FLOP / chunks)``, as ``tiled_gemm_size`` 'tile' prices
them), and the chunked / whole ratios of both: where the measured ratio
exceeds the priced one, chunks run below the curve.  ``--model-only``
prints the priced side without a device.  ``--json`` is checked before
anything runs and written atomically.

Exits 2 with one line on a bad option, or when torch or a CUDA device is
missing (without ``--model-only``).
"""

import argparse
import json
import os
import sys

# Llama 3 70B (Grattafiori et al. 2024, arXiv 2407.21783, Table 3).
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN = 8192, 64, 8, 128, 28672
DEFAULT_SYSTEM = os.path.join('systems', 'h100_sxm_80g.json')


def parse_ints(text, option):
  """'4,8' -> [4, 8]; ValueError naming ``option`` otherwise."""
  try:
    out = [int(x) for x in text.split(',')]
  except ValueError:
    out = []
  if not out or min(out) < 1:
    raise ValueError(f'{option}: {text} is not a comma-separated list of '
                     'positive integers')
  return out


def chunk_gemms(tp, tokens):
  """[(name, M, K, N, chunks)] of one block's overlapped GEMMs at TP
  ``tp``: per rank, M tokens, chunk counts from the engine's
  ``te_gemm_chunks`` (its ``conjugate`` flag: a GEMM whose output is
  reduce-scattered)."""
  from calculon.llm.layers import te_gemm_chunks
  q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM

  def chunks(conjugate, stage):
    return int(te_gemm_chunks(conjugate, stage, tp))

  return [
    ('qkv fprop (all-gather)', tokens, HIDDEN, (q + 2 * kv) // tp,
     chunks(False, 'fw')),
    ('proj fprop (reduce-scatter)', tokens, q // tp, HIDDEN,
     chunks(True, 'fw')),
    ('fc1 fprop (all-gather)', tokens, HIDDEN, 2 * FFN // tp,
     chunks(False, 'fw')),
    ('fc2 fprop (reduce-scatter)', tokens, FFN // tp, HIDDEN,
     chunks(True, 'fw')),
    ('proj dgrad (all-gather)', tokens, HIDDEN, q // tp,
     chunks(True, 'agrad')),
    ('fc2 dgrad (all-gather)', tokens, HIDDEN, FFN // tp,
     chunks(True, 'agrad')),
  ]


def priced_ms(system, dtype, m, k, n, chunks):
  """(whole, chunked) milliseconds the system file's matrix curve gives,
  the chunks as the engine prices them (``chunked_gemm_time_s``)."""
  from calculon.config.execution import DATATYPE_NAMES
  from calculon.llm.layers import chunked_gemm_time_s
  code = DATATYPE_NAMES.index(dtype)
  flops = 2.0 * m * k * n
  return (1e3 * system.matrix.time_s(code, flops),
          1e3 * chunked_gemm_time_s(system.matrix, code, flops, chunks))


def measured_ms(torch, dtype, m, k, n, chunks):
  """(whole, chunked) measured milliseconds; chunked = chunks x one chunk
  of M / chunks rows."""
  from gpu_attention import cuda_median_ms
  rows = m // chunks

  def timer(mm):
    if dtype == 'bfloat16':
      a = torch.randn(mm, k, device='cuda', dtype=torch.bfloat16)
      b = torch.randn(k, n, device='cuda', dtype=torch.bfloat16)
      return cuda_median_ms(lambda: a @ b, torch)
    a = torch.randn(mm, k, device='cuda').to(torch.float8_e4m3fn)
    # cuBLASLt's FP8 GEMM takes the second operand column-major.
    b = torch.randn(n, k, device='cuda').to(torch.float8_e4m3fn).t()
    one = torch.ones((), device='cuda')
    return cuda_median_ms(lambda: torch._scaled_mm(
      a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16), torch)

  return timer(m), chunks * timer(rows)


def main(argv=None):
  parser = argparse.ArgumentParser(
    prog='gpu_tp_chunk_gemms.py',
    description='Chunk GEMMs of an overlapped TP layer: measured and priced.')
  parser.add_argument('--system', default=DEFAULT_SYSTEM,
                      help=f'system file pricing them (default '
                      f'{DEFAULT_SYSTEM}, the calibrated DGX H100 file)')
  parser.add_argument('--tp', default='4,8', help='TP degrees (default 4,8)')
  parser.add_argument('--tokens', default='4096',
                      help='tokens a microbatch (default 4096)')
  parser.add_argument('--dtypes', default='bfloat16,float8',
                      help='bfloat16 and/or float8 (default both)')
  parser.add_argument('--model-only', action='store_true',
                      help='print the priced side only (no device needed)')
  parser.add_argument('--json', help='write the numbers to this file')
  args = parser.parse_args(argv)
  prog = 'gpu_tp_chunk_gemms.py'
  try:
    tps = parse_ints(args.tp, '--tp')
    (tokens,) = parse_ints(args.tokens, '--tokens')
  except ValueError as err:
    print(f'{prog}: {err}', file=sys.stderr)
    return 2
  dtypes = args.dtypes.split(',')
  for d in dtypes:
    if d not in ('bfloat16', 'float8'):
      print(f'{prog}: --dtypes: {d} is not one of bfloat16, float8',
            file=sys.stderr)
      return 2
  for tp in tps:
    if HEADS % tp or KV_HEADS % tp or FFN % tp or tokens % max(tp, 4):
      print(f'{prog}: --tp {tp}: must divide the 8 key/value heads and '
            f'split --tokens {tokens} in {max(tp, 4)} equal chunks',
            file=sys.stderr)
      return 2
  here = os.path.dirname(os.path.abspath(__file__))
  root = os.path.dirname(here)
  sys.path[:0] = [here, root]
  from calculon.errors import ConfigError
  from calculon.hardware import System
  from calculon.io import read_json_file
  from calculon.outputs import JSON_KINDS, check_output_path, write_text
  try:
    if args.json:
      check_output_path(args.json, JSON_KINDS, option='--json')
  except ConfigError as err:
    print(f'{prog}: {err}', file=sys.stderr)
    return 2
  path = args.system if os.path.exists(args.system) else \
    os.path.join(root, args.system)
  try:
    system = System(read_json_file(path), source=args.system)
  except ConfigError as err:
    print(f'{prog}: --system {args.system}: {str(err).split(": ", 1)[-1]}',
          file=sys.stderr)
    return 2
  torch = None
  if not args.model_only:
    from gpu_attention import cuda_torch
    torch = cuda_torch(prog)
    if torch is None:
      return 2
  rows = []
  for tp in tps:
    for name, m, k, n, chunks in chunk_gemms(tp, tokens):
      for dtype in dtypes:
        p_whole, p_chunked = priced_ms(system, dtype, m, k, n, chunks)
        row = dict(gemm=name, tp=tp, dtype=dtype, m=m, k=k, n=n,
                   chunks=chunks, priced_whole_ms=p_whole,
                   priced_chunked_ms=p_chunked,
                   priced_ratio=p_chunked / p_whole)
        if torch is not None:
          w, c = measured_ms(torch, dtype, m, k, n, chunks)
          row.update(measured_whole_ms=w, measured_chunked_ms=c,
                     measured_ratio=c / w)
        rows.append(row)
  device = torch.cuda.get_device_name() if torch is not None else None
  print(f'{device or "no device (priced only)"}; priced on {args.system}; '
        f'{tokens} tokens a microbatch')
  print('| GEMM | TP | dtype | M x K x N | chunks | priced whole / chunked '
        'ms | ratio | measured whole / chunked ms | ratio |')
  print('|---|---|---|---|---|---|---|---|---|')
  for r in rows:
    measured = ['-', '-']
    if 'measured_ratio' in r:
      measured = [f"{r['measured_whole_ms']:.3f} / "
                  f"{r['measured_chunked_ms']:.3f}",
                  f"{r['measured_ratio']:.3f}"]
    cells = [r['gemm'], r['tp'], r['dtype'], f"{r['m']} x {r['k']} x {r['n']}",
             r['chunks'], f"{r['priced_whole_ms']:.3f} / "
             f"{r['priced_chunked_ms']:.3f}", f"{r['priced_ratio']:.3f}",
             *measured]
    print('| ' + ' | '.join(str(c) for c in cells) + ' |')
  if args.json:
    write_text(args.json, json.dumps(dict(
      device=device, torch=None if torch is None else torch.__version__,
      system=args.system, tokens=tokens, rows=rows), indent=1) + '\n')
  return 0


if __name__ == '__main__':
  sys.exit(main())
