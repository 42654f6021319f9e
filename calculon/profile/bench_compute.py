"""Matrix (GEMM) and vector (elementwise, reduction) throughput benchmarks.

Run inside a worker subprocess (:mod:`calculon.profile.worker`).  Each
returns ``{"points": [...], "info": {...}}`` with one point per shape or op
and size: ``value`` the achieved FLOP/s, ``flops`` the FLOP of one call.
"""

import math

import numpy as np

from calculon.config.execution import DATATYPE_BYTES
from calculon.profile.timing import (
  environment, make_sync, median_time_s, setup_torch)

#: FLOP per element that calculon's layers count for each vector operation
#: (calculon/llm/layers.py: LayerNorm 9, SoftMax 5, GeLU 8, DropOut 1,
#: ElementWise 1 -- Calculon's own counts, Isaev et al., SC'23).
VECTOR_OPS = {'layernorm': 9, 'softmax': 5, 'gelu': 8, 'dropout': 1,
              'add': 1}
#: Rows of the normalized / softmaxed dimension.
LAYERNORM_WIDTH = 1024
SOFTMAX_WIDTH = 512
DROPOUT_P = 0.1

TORCH_DTYPES = ('float32', 'float16', 'bfloat16', 'float8')


def gemm_flops(b, m, n, k):
  """FLOP of ``b`` GEMMs (m x k) (k x n): 2 b m n k (one multiply and one
  add per term)."""
  return 2.0 * b * m * n * k


def gemm(backend, device, dtype, shapes, min_time_s=0.2, threads=1):
  """GEMM throughput for each shape [b, m, n, k] (b = 1: plain matmul,
  else a batched matmul); each call allocates its output, as the layers of
  a training step do.

  Raises:
    ValueError: a datatype the backend cannot multiply.
  """
  sync = make_sync(backend, device)
  points, skipped = [], []
  if backend == 'numpy':
    if dtype != 'float32':
      raise ValueError(f'numpy backend: no BLAS GEMM for {dtype}')
    rng = np.random.default_rng(0)
    for b, m, n, k in shapes:
      x = rng.standard_normal((b, m, k), dtype=np.float32)
      y = rng.standard_normal((b, k, n), dtype=np.float32)
      t = median_time_s(lambda: np.matmul(x, y), sync, min_time_s)
      points.append(_gemm_point(b, m, n, k, t))
  else:
    torch = setup_torch(device, threads)
    gen = torch.Generator(device=device).manual_seed(0)
    for b, m, n, k in shapes:
      if device == 'cuda' and _gemm_bytes(dtype, b, m, n, k) > \
          MEMORY_SHARE * torch.cuda.mem_get_info()[0]:
        skipped.append(f'{b}x{m}x{n}x{k}')
        continue
      fn = _torch_gemm(torch, device, dtype, b, m, n, k, gen)
      t = median_time_s(fn, sync, min_time_s)
      points.append(_gemm_point(b, m, n, k, t))
      del fn
      if device == 'cuda':
        torch.cuda.empty_cache()
  info = dict(environment(backend, device, threads), dtype=dtype, op='gemm')
  if skipped:
    info['skipped'] = (f'{len(skipped)} shape(s) over {MEMORY_SHARE:.0%} of '
                       f"the device's free memory: {', '.join(skipped)}")
  return {'points': points, 'info': info}


#: Share of the device's free memory a GEMM's operands and output may take:
#: the attention-like shapes of the largest sizes (16 heads of n x n
#: scores) would not fit an 80 GB GPU; a size keeps its other shapes.
MEMORY_SHARE = 0.5


def _gemm_bytes(dtype, b, m, n, k):
  """Bytes of a GEMM's operands and output (float8: e4m3 inputs made from
  bfloat16 ones, bfloat16 output)."""
  inputs = b * (m * k + k * n)
  if dtype == 'float8':
    return inputs * (1 + 2) + b * m * n * 2
  return (inputs + b * m * n) * DATATYPE_BYTES[dtype]


def _torch_gemm(torch, device, dtype, b, m, n, k, gen):
  if dtype == 'float8':
    # Scaled FP8 GEMM (e4m3 inputs, bf16 output); needs an FP8 tensor core.
    # torch._scaled_mm multiplies 2-D matrices only: a batch of b runs b
    # products (each a GEMM of the shape, as the FLOP count says).
    if device != 'cuda' or not hasattr(torch, 'float8_e4m3fn'):
      raise ValueError('float8 GEMM needs a CUDA device with FP8 support')
    x = torch.randn(b, m, k, device=device, generator=gen,
                    dtype=torch.bfloat16).to(torch.float8_e4m3fn)
    y = torch.randn(b, n, k, device=device, generator=gen,
                    dtype=torch.bfloat16).to(torch.float8_e4m3fn)
    one = torch.ones((), device=device)

    def products():
      for i in range(b):
        torch._scaled_mm(x[i], y[i].t(), scale_a=one, scale_b=one,
                         out_dtype=torch.bfloat16)
    return products
  tdt = getattr(torch, dtype)
  # Drawn in the datatype itself: a float32 draw converted afterwards
  # would take twice the memory of a 16-bit operand.
  x = torch.randn(b, m, k, device=device, generator=gen, dtype=tdt)
  y = torch.randn(b, k, n, device=device, generator=gen, dtype=tdt)
  if b == 1:
    x2, y2 = x[0], y[0]
    return lambda: torch.mm(x2, y2)
  return lambda: torch.bmm(x, y)


def _gemm_point(b, m, n, k, t):
  flops = gemm_flops(b, m, n, k)
  return {'key': f'{b}x{m}x{n}x{k}', 'shape': [b, m, n, k], 'flops': flops,
          'seconds': t, 'value': flops / t}


def vector(backend, device, dtype, elements, ops=None, min_time_s=0.2,
           threads=1):
  """Throughput of calculon's vector operations, in calculon's FLOP
  (:data:`VECTOR_OPS`), for each op and element count.

  Each call allocates its output, as the layers of a training step do.
  """
  ops = list(ops or VECTOR_OPS)
  sync = make_sync(backend, device)
  points = []
  if backend == 'numpy':
    if dtype != 'float32':
      raise ValueError(f'numpy backend: vector ops only in float32, not '
                       f'{dtype}')
    for n in elements:
      for op in ops:
        fn = _numpy_vector(op, n)
        t = median_time_s(fn, sync, min_time_s)
        points.append(_vector_point(op, n, t))
  else:
    torch = setup_torch(device, threads)
    tdt = torch.bfloat16 if dtype == 'float8' else getattr(torch, dtype)
    for n in elements:
      for op in ops:
        fn = _torch_vector(torch, device, tdt, op, n)
        t = median_time_s(fn, sync, min_time_s)
        points.append(_vector_point(op, n, t))
  info = dict(environment(backend, device, threads), dtype=dtype, op='vector')
  if dtype == 'float8':
    info['note'] = 'float8 vector ops run in bfloat16 (no FP8 elementwise)'
  return {'points': points, 'info': info}


def _rows(n, width):
  width = min(width, n)
  return max(1, n // width), width


def _torch_vector(torch, device, tdt, op, n):
  import torch.nn.functional as F
  if op == 'layernorm':
    rows, width = _rows(n, LAYERNORM_WIDTH)
    x = torch.randn(rows, width, device=device).to(tdt)
    w = torch.ones(width, device=device, dtype=tdt)
    bias = torch.zeros(width, device=device, dtype=tdt)
    return lambda: F.layer_norm(x, (width,), w, bias)
  if op == 'softmax':
    rows, width = _rows(n, SOFTMAX_WIDTH)
    x = torch.randn(rows, width, device=device).to(tdt)
    return lambda: torch.softmax(x, dim=-1)
  x = torch.randn(n, device=device).to(tdt)
  if op == 'gelu':
    return lambda: F.gelu(x)
  if op == 'dropout':
    return lambda: F.dropout(x, DROPOUT_P, training=True)
  if op == 'add':
    y = torch.randn(n, device=device).to(tdt)
    return lambda: torch.add(x, y)
  raise ValueError(f'unknown vector op {op!r}: one of {sorted(VECTOR_OPS)}')


def _numpy_vector(op, n):
  rng = np.random.default_rng(0)
  if op == 'layernorm':
    rows, width = _rows(n, LAYERNORM_WIDTH)
    x = rng.standard_normal((rows, width), dtype=np.float32)

    def layernorm():
      mean = x.mean(axis=-1, keepdims=True)
      var = x.var(axis=-1, keepdims=True)
      return (x - mean) / np.sqrt(var + 1e-5)
    return layernorm
  if op == 'softmax':
    rows, width = _rows(n, SOFTMAX_WIDTH)
    x = rng.standard_normal((rows, width), dtype=np.float32)

    def softmax():
      e = np.exp(x - x.max(axis=-1, keepdims=True))
      return e / e.sum(axis=-1, keepdims=True)
    return softmax
  x = rng.standard_normal(n, dtype=np.float32)
  if op == 'gelu':
    c = np.float32(math.sqrt(2 / math.pi))
    return lambda: 0.5 * x * (1 + np.tanh(c * (x + np.float32(0.044715) *
                                               x * x * x)))
  if op == 'dropout':
    scale = np.float32(1 / (1 - DROPOUT_P))
    return lambda: x * (rng.random(n, dtype=np.float32) >= DROPOUT_P) * scale
  if op == 'add':
    y = rng.standard_normal(n, dtype=np.float32)
    return lambda: x + y
  raise ValueError(f'unknown vector op {op!r}: one of {sorted(VECTOR_OPS)}')


def _vector_point(op, n, t):
  flops = float(VECTOR_OPS[op] * n)
  return {'key': f'{op}.{n}', 'op': op, 'elements': int(n), 'flops': flops,
          'seconds': t, 'value': flops / t}
