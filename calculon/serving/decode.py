"""Decode: one step of ``batch`` sequences, one new token each.

:func:`decode_step_s` is the block's forward at seq = 1 (GEMMs at m =
batch: memory-bound at small batch, :mod:`calculon.serving.forward`) plus
the attention over the KV cache (:func:`kv_attention_s`): every step reads
the K and V of each sequence's ``ctx`` tokens (Kwon et al. 2023,
PagedAttention, section 2.2: decoding is memory-bound on the KV cache),
at memory tier 1's bandwidth and the FLOP the scores and the weighted sum
take, whichever is slower (roofline).

With a pipeline, the batch is cut into PP microbatches that keep every
stage busy (one token of a sequence crosses each stage in turn): a step
of the whole batch takes PP x the stage time at batch / PP.

Speculative decoding (Leviathan et al. 2023, ICML; DeepSeek-V3's MTP,
arXiv:2412.19437 section 2.2): a step verifies ``n`` draft tokens per
sequence (m = batch x (n + 1)) and emits (1 - a^(n+1)) / (1 - a) tokens
on average for a per-token acceptance rate a (Leviathan et al. equation
1); the draft costs one block forward per draft token (MTP's one extra
block).

Reads: :mod:`calculon.serving.forward`, :mod:`calculon.serving.kv_cache`.
"""

import numpy as np

from calculon.serving.forward import forward_s
from calculon.serving.kv_cache import (
  kv_bytes_per_sequence, stage_blocks)


def kv_attention_s(app, system, worker, batch, ctx, kv_bytes, act_code):
  """Seconds of the attention over the KV cache in one decode step of the
  stage's blocks: ``batch`` sequences of ``ctx`` cached tokens each.
  Bytes: :func:`~calculon.serving.kv_cache.kv_bytes_per_sequence`; FLOP
  per block: 4 x batch x ctx x heads/TP x d (GQA: QK^T and PV), MLA
  absorbed 2 x batch x ctx x heads/TP x (2 d_c + d_r) (DeepSeek-V2 report
  section 2.1.2, weight absorption)."""
  tp = np.asarray(worker.tensor_par)
  blocks = stage_blocks(app, worker.pipeline_par)
  nbytes = np.asarray(batch) * kv_bytes_per_sequence(
    app, tp, worker.pipeline_par, kv_bytes, ctx)
  per_block = nbytes / blocks
  heads = app.attn_heads / tp
  if app.is_mla:
    flops = 2.0 * batch * ctx * heads * (2 * app.kv_lora_rank +
                                          app.qk_rope_head_dim)
  else:
    flops = 4.0 * batch * ctx * heads * app.attn_size
  with np.errstate(divide='ignore', invalid='ignore'):
    mem_t = np.nan_to_num(system.mem1.time_s(per_block))
    eff = system.fused_attention_efficiency or 1.0
    flops_t = np.nan_to_num(system.matrix.time_s(act_code, flops)) / eff
  return blocks * np.maximum(mem_t, flops_t)


def accepted_tokens(n, a):
  """Tokens a speculative step emits on average: (1 - a^(n+1)) / (1 - a)
  (Leviathan et al. 2023, equation 1); 1 without drafts."""
  a = np.asarray(a, float)
  return np.where(n > 0, (1 - a ** (n + 1)) / np.maximum(1 - a, 1e-12), 1.0)


def decode_step_s(app, system, worker, batch, ctx, kv_bytes, dtype,
                  spec_tokens=0):
  """Seconds of one decode step of ``batch`` sequences (array, per
  attention-DP rank) with ``ctx`` cached tokens each, and its parts
  (dict: 'forward' (the stage forward), 'kv' (attention over the cache),
  'draft'); with PP, PP x the stage time at batch / PP (see the
  module)."""
  from calculon.config.execution import DATATYPE_NAMES
  pp = np.asarray(worker.pipeline_par)
  micro = np.maximum(np.asarray(batch) / pp, 1)
  m = np.ceil(micro) * (spec_tokens + 1)
  f = forward_s(app, system, worker, np.ceil(m).astype(np.int64), 1, dtype)
  code = DATATYPE_NAMES.index(dtype)
  kv = kv_attention_s(app, system, worker, np.ceil(micro) *
                      (spec_tokens + 1), ctx, kv_bytes, code)
  draft = 0.0
  if spec_tokens:
    one = forward_s(app, system, worker, np.ceil(micro).astype(np.int64), 1,
                    dtype)
    draft = spec_tokens * one.blocks / stage_blocks(app, pp)
  stage = f.stage + kv + draft
  return pp * stage, {'forward': pp * f.stage, 'kv': pp * kv,
                      'draft': pp * draft, 'times': f}
