"""KV-cache bytes, weights per GPU, and the memory a framework leaves for
the KV cache.

Provides :func:`kv_bytes_per_token` (one token of one sequence, one GPU),
:func:`kv_bytes_per_sequence` (a sequence of ``ctx`` tokens, sliding
windows held at their width), :func:`weight_bytes_per_gpu` (by part) and
:func:`kv_capacity` (bytes and tokens for the cache under the framework's
memory fraction).

Formulas:

* GQA/MHA: K and V of every K/V head a GPU holds, 2 x L_stage x
  ceil(g / TP) x d x bytes (Kwon et al. 2023, PagedAttention, section 2;
  K/V heads replicated where TP exceeds them, Megatron-Core's
  ``num_query_groups`` rule); with TP dividing g the g K/V heads are split.
* MLA: the compressed latent and the decoupled RoPE key, (d_c + d_r) x
  L_stage x bytes, whole on every TP rank (DeepSeek-AI 2024, DeepSeek-V2
  report arXiv:2405.04434 section 2.1.2, 'only c_KV and k_R need to be
  cached'; vLLM and SGLang keep the latent cache unsplit under TP).
* Sliding-window blocks keep at most ``sliding_window`` tokens (Jiang et
  al. 2023, Mistral 7B, section 2, rolling buffer cache).

Reads: the application and the system's memory tier 1 and memory reserve.
"""


import numpy as np

#: Bytes of the 16-bit embedding table, LM head and norms: quantized
#: checkpoints keep them in 16 bits (NVIDIA ModelOpt excludes ``lm_head``
#: from FP8/FP4 quantization by default; vLLM's FP8 checkpoints likewise).
WIDE_BYTES = 2


def stage_blocks(app, pp):
  """Blocks of the largest pipeline stage: ceil(L / PP)."""
  return -(-app.num_blocks // np.asarray(pp))


def kv_heads_per_gpu(app, tp):
  """K/V heads one GPU holds: ceil(g / TP) (g = kv_heads, or the attention
  heads without them)."""
  g = app.kv_heads_for()
  return -(-g // np.asarray(tp))


def kv_bytes_per_token_layer(app, tp, kv_bytes):
  """Bytes of K and V for one token in one block on one GPU (see the
  module for the formulas)."""
  if app.is_mla:
    return (app.kv_lora_rank + app.qk_rope_head_dim) * kv_bytes + \
      0 * np.asarray(tp)
  return 2 * kv_heads_per_gpu(app, tp) * app.attn_size * kv_bytes


def kv_bytes_per_token(app, tp, pp, kv_bytes):
  """Bytes of K and V for one token of one sequence on one GPU: all the
  blocks of the largest stage, windowed or not (a token of a sequence
  shorter than the window is held in every block)."""
  return kv_bytes_per_token_layer(app, tp, kv_bytes) * stage_blocks(app, pp)


def kv_bytes_per_sequence(app, tp, pp, kv_bytes, ctx):
  """Bytes of K and V of one sequence of ``ctx`` tokens on one GPU: the
  windowed blocks (``sliding_window_blocks`` of them) hold min(ctx, w)
  tokens, the others ctx."""
  per = kv_bytes_per_token_layer(app, tp, kv_bytes)
  blocks = stage_blocks(app, pp)
  if app.sliding_window is None:
    return per * blocks * ctx
  share = app.windowed_share
  windowed = np.round(blocks * share)
  return per * ((blocks - windowed) * ctx +
                windowed * np.minimum(ctx, app.sliding_window))


def weight_bytes_per_gpu(app, tp, pp, ep, etp, weight_bytes):
  """Weight bytes on one GPU of the largest stage, by part (dict of
  arrays): 'linear' (attention, dense MLP, shared experts at ``weight_bytes``
  per parameter, sharded over TP), 'experts' (routed experts over EP x
  ETP), 'router', 'embedding_head' and 'norms' (16-bit; the vocabulary
  sharded over TP, on the first and last stages), 'total'.

  Parameter counts: :meth:`calculon.config.Application.parameter_breakdown`
  (Megatron-LM theoretical_memory_usage.py)."""
  parts = app.parameter_breakdown()
  L = app.num_blocks
  share = stage_blocks(app, pp) / L
  tp, ep, etp = (np.asarray(x) for x in (tp, ep, etp))
  linear = (parts['attention'] + parts['mlp'] +
            parts.get('shared_experts', 0)) * share / tp * weight_bytes
  experts = parts.get('experts', 0) * share / (ep * etp) * weight_bytes
  router = parts.get('router', 0) * share * WIDE_BYTES
  vocab = np.where(np.asarray(pp) > 1,
                   max(parts['embedding'], parts['lm_head']),
                   parts['embedding'] + parts['lm_head']) / tp * WIDE_BYTES
  norms = parts['norms'] * share * WIDE_BYTES
  total = linear + experts + router + vocab + norms
  return {'linear': linear, 'experts': experts, 'router': router,
          'embedding_head': vocab, 'norms': norms, 'total': total}


def runtime_bytes(system, tp, pp):
  """Memory outside the tensors: the CUDA context and NCCL's buffers per
  communicator (the system file's ``memory_reserve``: context_GiB,
  nccl_GiB_per_group; 0 without), one communicator with TP > 1 and one
  with PP > 1."""
  res = system.memory_reserve
  if res is None:
    return 0.0 * np.asarray(tp)
  groups = (np.asarray(tp) > 1).astype(float) + (np.asarray(pp) > 1)
  return res.context_bytes + res.nccl_bytes_per_group * groups


def kv_capacity(rule, fraction, capacity_bytes, weights_bytes, act_bytes,
                runtime):
  """Bytes one GPU leaves for the KV cache (array), by the framework's
  memory rule (:mod:`calculon.serving.frameworks`):

  * 'total' (vLLM ``gpu_memory_utilization``, vllm/v1/worker/gpu_worker.py
    ``determine_available_memory``): fraction x capacity - weights -
    activations - runtime;
  * 'free_after_weights' (TensorRT-LLM ``free_gpu_memory_fraction``):
    fraction x (capacity - weights - activations - runtime);
  * 'static' (SGLang ``mem_fraction_static``, server_args.py): fraction x
    capacity - weights (activations and runtime live in the rest).

  Negative results are 0 (the deployment does not fit)."""
  if rule == 'total':
    kv = fraction * capacity_bytes - weights_bytes - act_bytes - runtime
  elif rule == 'free_after_weights':
    kv = fraction * (capacity_bytes - weights_bytes - act_bytes - runtime)
  elif rule == 'static':
    kv = fraction * capacity_bytes - weights_bytes
  else:
    raise ValueError(f'unknown memory rule {rule!r}')
  return np.maximum(kv, 0.0)


def paged_tokens(kv_bytes, bytes_per_token, block_tokens):
  """Tokens the cache holds in whole pages of ``block_tokens`` (PagedAttention
  blocks, Kwon et al. 2023 section 4.1)."""
  pages = np.floor(kv_bytes / (bytes_per_token * block_tokens))
  return pages * block_tokens


def pages_per_sequence(ctx, block_tokens):
  """Pages one sequence of ``ctx`` tokens occupies: ceil(ctx / block)."""
  return -(-np.asarray(ctx) // block_tokens)


__all__ = ['kv_bytes_per_token', 'kv_bytes_per_sequence',
           'kv_bytes_per_token_layer', 'weight_bytes_per_gpu', 'kv_capacity',
           'paged_tokens', 'pages_per_sequence', 'runtime_bytes',
           'stage_blocks']
