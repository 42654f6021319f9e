#!/usr/bin/env python3
"""Time of Llama 3 8B transformer blocks on this GPU, eager and compiled,
against calculon's per-block prediction: a check of the block arithmetic
behind the torchtitan rows (docs/accuracy.md section 6) without FSDP,
data loading or the loss.

    python benchmarks/gpu_llama_block.py [--blocks 4] [--seq 8192] [--mbs 1]
        [--json FILE]
    python benchmarks/gpu_llama_block.py --predict-only SYSTEM.json

Needs torch with CUDA (``--predict-only`` prints calculon's prediction
only, on any machine).  The blocks are torchtitan's Llama 3 (models/llama3
/model.py): RMSNorm, separate wq/wk/wv/wo, rotary embedding, keys and
values repeated to the 32 query heads, PyTorch's scaled_dot_product_attention
(causal), SwiGLU MLP w2(silu(w1 x) * w3 x); bfloat16 weights and
activations, no dropout, no recomputation.  Forward + backward of
``--blocks`` stacked blocks, CUDA events, 3 warm-ups, the median of 10,
per block; eager, then ``torch.compile`` of the stack.  The prediction is
calculon's for llama3-8B's block on SYSTEM (default
systems/h100_sxm_80g_datasheet.json) with FlashAttention-2's factor from
validation/conventions.yaml (fa2 0.59), the fused activation, TP 1, the
same microbatch and sequence: forward + input gradient + weight gradient
of one block.

Exits 2 with one line when torch or a CUDA device is missing.
"""

import argparse
import logging
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gpu_attention import (  # noqa: E402
  cuda_median_ms, cuda_torch, write_json)

#: Llama 3 8B (Meta, "The Llama 3 Herd of Models", table 3).
HIDDEN, HEADS, KV_HEADS, FFN = 4096, 32, 8, 14336
HEAD = HIDDEN // HEADS
#: FlashAttention-2 on Hopper relative to the files' kernel
#: (validation/conventions.yaml, hardware table: attention_kernels fa2).
FA2_FACTOR = 0.59


def predict_ms(system_path, seq, mbs):
  """calculon's (forward, backward, LM head and loss forward + backward)
  milliseconds of one llama3-8B block and one microbatch's head."""
  from calculon.config import Application
  from calculon.hardware import System
  from calculon.io import read_json_file
  from calculon.llm import Llm
  app = read_json_file(os.path.join(ROOT, 'models', 'llama3-8B.json'))
  app.update(seq_size=seq, num_blocks=1)
  sysj = read_json_file(system_path)
  if sysj.get('fused_attention_efficiency') is not None:
    sysj['fused_attention_efficiency'] *= FA2_FACTOR
  exe = {'num_procs': 1, 'tensor_par': 1, 'pipeline_par': 1, 'data_par': 1,
         'tensor_par_net': 0, 'pipeline_par_net': 0, 'data_par_net': 0,
         'batch_size': mbs, 'microbatch_size': mbs, 'datatype': 'bfloat16',
         'fused_activation': True,
         'activation_recompute': 'none', 'pipeline_interleaving': 1,
         'optimizer_sharding': False, 'tensor_par_comm_type': 'ar',
         'tensor_par_overlap': 'none', 'seq_par_ag_redo': False,
         'data_par_overlap': False, 'weight_offload': False,
         'activations_offload': False, 'optimizer_offload': False,
         'training': True, 'attention_kernel': 'flash',
         'cross_entropy_kernel': 'unfused'}
  system = System(sysj)
  model = Llm(Application.from_dict(app), logging.getLogger('block'))
  model.compile(system, Llm.Execution.from_json(exe))
  model.run(system)
  stats = model.get_stats_json()
  # One block, one microbatch: the batch's forward and backward times.
  head = stats['lm_head_time']
  return 1e3 * stats['fw_time'], 1e3 * stats['bw_time'], 1e3 * head


def measure_ms(torch, blocks, seq, mbs, compiled):
  """(forward, forward + backward) ms per block, measured."""
  import torch.nn as nn
  import torch.nn.functional as F

  class Block(nn.Module):
    def __init__(self):
      super().__init__()
      self.n1, self.n2 = nn.RMSNorm(HIDDEN), nn.RMSNorm(HIDDEN)
      self.wq = nn.Linear(HIDDEN, HIDDEN, bias=False)
      self.wk = nn.Linear(HIDDEN, KV_HEADS * HEAD, bias=False)
      self.wv = nn.Linear(HIDDEN, KV_HEADS * HEAD, bias=False)
      self.wo = nn.Linear(HIDDEN, HIDDEN, bias=False)
      self.w1 = nn.Linear(HIDDEN, FFN, bias=False)
      self.w3 = nn.Linear(HIDDEN, FFN, bias=False)
      self.w2 = nn.Linear(FFN, HIDDEN, bias=False)

    def forward(self, x, cos, sin):
      b, s, _ = x.shape
      h = self.n1(x)
      q = self.wq(h).view(b, s, HEADS, HEAD)
      k = self.wk(h).view(b, s, KV_HEADS, HEAD)
      v = self.wv(h).view(b, s, KV_HEADS, HEAD)

      def rope(t):
        t1, t2 = t[..., : HEAD // 2], t[..., HEAD // 2:]
        return torch.cat((t1 * cos - t2 * sin, t2 * cos + t1 * sin), -1)
      q, k = rope(q), rope(k)
      rep = HEADS // KV_HEADS
      k = k.repeat_interleave(rep, dim=2)
      v = v.repeat_interleave(rep, dim=2)
      o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                         v.transpose(1, 2), is_causal=True)
      x = x + self.wo(o.transpose(1, 2).reshape(b, s, HIDDEN))
      h = self.n2(x)
      return x + self.w2(F.silu(self.w1(h)) * self.w3(h))

  class Stack(nn.Module):
    def __init__(self):
      super().__init__()
      self.blocks = nn.ModuleList(Block() for _ in range(blocks))

    def forward(self, x, cos, sin):
      for blk in self.blocks:
        x = blk(x, cos, sin)
      return x

  dev, dt = 'cuda', torch.bfloat16
  model = Stack().to(dev, dt)
  if compiled:
    model = torch.compile(model)
  x = torch.randn(mbs, seq, HIDDEN, device=dev, dtype=dt, requires_grad=True)
  pos = torch.arange(seq, device=dev, dtype=torch.float32)
  freq = 1.0 / (500000.0 ** (torch.arange(0, HEAD // 2, device=dev,
                                          dtype=torch.float32) / (HEAD // 2)))
  ang = torch.outer(pos, freq)[None, :, None, :]
  cos, sin = ang.cos().to(dt), ang.sin().to(dt)
  grad = torch.randn(mbs, seq, HIDDEN, device=dev, dtype=dt)

  def fw():
    with torch.no_grad():
      model(x, cos, sin)

  def fwbw():
    model(x, cos, sin).backward(grad)
    for p in model.parameters():
      p.grad = None
    x.grad = None
  from torch.nn.attention import SDPBackend, sdpa_kernel
  with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
    return (cuda_median_ms(fw, torch) / blocks,
            cuda_median_ms(fwbw, torch) / blocks)


def measure_head_ms(torch, seq, mbs, vocab=128256):
  """Forward + backward ms of torchtitan's LM head and loss: the output
  projection in bfloat16, the logits cast to float32, PyTorch's
  cross_entropy (torchtitan components/loss.py)."""
  import torch.nn.functional as F
  dev, dt = 'cuda', torch.bfloat16
  w = torch.randn(vocab, HIDDEN, device=dev, dtype=dt, requires_grad=True)
  h = torch.randn(mbs * seq, HIDDEN, device=dev, dtype=dt,
                  requires_grad=True)
  labels = torch.randint(0, vocab, (mbs * seq,), device=dev)

  def step():
    loss = F.cross_entropy((h @ w.t()).float(), labels)
    loss.backward()
    w.grad = None
    h.grad = None
  return cuda_median_ms(step, torch)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  ap.add_argument('--blocks', type=int, default=4)
  ap.add_argument('--seq', type=int, default=8192)
  ap.add_argument('--mbs', type=int, default=1)
  ap.add_argument('--system', default=os.path.join(
    ROOT, 'systems', 'h100_sxm_80g_datasheet.json'))
  ap.add_argument('--predict-only', action='store_true')
  ap.add_argument('--json', help='write the numbers to this file')
  args = ap.parse_args(argv)
  if args.blocks < 1 or args.seq < 128 or args.mbs < 1:
    print('gpu_llama_block: --blocks and --mbs >= 1, --seq >= 128',
          file=sys.stderr)
    return 2
  pfw, pbw, phead = predict_ms(args.system, args.seq, args.mbs)
  out = {'seq': args.seq, 'mbs': args.mbs, 'blocks': args.blocks,
         'predicted_fw_ms': pfw, 'predicted_fwbw_ms': pfw + pbw,
         'predicted_head_ms': phead}
  print(f'calculon, {os.path.basename(args.system)} (FlashAttention-2): '
        f'forward {pfw:.2f} ms, forward + backward {pfw + pbw:.2f} ms per '
        f'block; LM head and loss (unfused, float32 logits) {phead:.2f} ms')
  if args.predict_only:
    return 0
  torch = cuda_torch('gpu_llama_block')
  if torch is None:
    return 2
  for name, compiled in (('eager', False), ('torch.compile', True)):
    mfw, mfwbw = measure_ms(torch, args.blocks, args.seq, args.mbs, compiled)
    out[name] = {'fw_ms': mfw, 'fwbw_ms': mfwbw}
    print(f'{name}: forward {mfw:.2f} ms, forward + backward {mfwbw:.2f} ms '
          f'per block; error 100 (1 - predicted / measured): forward '
          f'{100 * (1 - pfw / mfw):+.1f} %, forward + backward '
          f'{100 * (1 - (pfw + pbw) / mfwbw):+.1f} %')
  mhead = measure_head_ms(torch, args.seq, args.mbs)
  out['head_ms'] = mhead
  print(f'LM head and loss: forward + backward {mhead:.2f} ms; error '
        f'{100 * (1 - phead / mhead):+.1f} %')
  return write_json(args.json, out)


if __name__ == '__main__':
  sys.exit(main())
