"""Model FLOP: what a model needs per token, independent of how it is run.

Model FLOP exclude recomputation and everything but the model's GEMMs and
attention core, so that MFU compares runs fairly.  Two conventions exist for
the attention core under a causal mask, and published MFU numbers use both:

* ``full`` -- the whole s x s score matrix: PaLM (Chowdhery et al. 2022,
  appendix B: 6N + 12LHQT per token), Megatron-LM before March 2025
  (Narayanan et al. 2021 eq. 3 without recomputation), torchtitan
  (``get_num_flop_per_token``, "do not account for sparsity in causal
  attention").
* ``causal`` -- half of it: Megatron-LM ``num_floating_point_operations``
  since commit 8873b55d6a (2025-03-06; megatron/training/training.py) and
  NeMo ``nemo/utils/flops_formulas.py`` (``causal_self_attn``).

Per token and training step (forward, backward weight- and data-gradient:
3 x 2 FLOP per multiply-accumulate), Megatron-LM's terms:

  6 x [ per block: attention projections (h q + 2 h g d + q h, or MLA's
        LoRA projections) + MLP (gamma h f dense; MoE: gamma h (k f_e +
        f_shared)) ] + 6 h V (logits)
  + attention core: 6 s (a d_qk + a d_v) per block (``full``), half of it
    (``causal``).

Only GEMM weights count: norms, biases and the router's h x E GEMM are left
out, as Megatron-LM does (the router is < 0.1 % of a DeepSeek-V3 token).
Multi-token prediction modules (``mtp_layers``) count as Megatron-LM counts
them: each one block of the last block's kind, its 2h x h projection and
one more pass through the logits.
Inference (forward only) is one third.
"""

from calculon.config.application import Application

CONVENTIONS = ('full', 'causal')


def gemm_weights_per_token(app: Application):
  """GEMM weights a token goes through in one forward pass (elements):
  every block's attention projections and (active) MLP, and the logits
  layer h x V when the application has a vocabulary; with multi-token
  prediction, each module's block, projection and logits pass."""
  h, q, a = app.hidden, app.query_width, app.attn_heads
  if app.is_mla:
    n = 1  # Megatron-LM counts the LoRA norms as one row here
    dn, dr, dv = app.qk_nope_head_dim, app.qk_rope_head_dim, app.v_head_dim
    if app.q_lora_rank is not None:
      attn = app.q_lora_rank * (h + a * (dn + dr) + n)
    else:
      attn = h * a * (dn + dr)
    attn += app.kv_lora_rank * (h + a * (dn + dv) + n) + h * dr + a * dv * h
  else:
    kv = app.kv_heads_for() * app.attn_size
    attn = h * q + 2 * h * kv + q * h
  gamma = 3 if app.gated else 2
  mlp = gamma * h * app.feedforward * app.num_dense_blocks
  if app.is_moe:
    mlp += gamma * h * (app.top_k * app.moe_ffn_hidden + app.shared_ffn) * \
      app.num_moe_blocks
  logits = h * app.vocab_size if app.has_vocab else 0
  total = attn * app.num_blocks + mlp + logits
  mtp = app.mtp_layers
  if mtp:
    # Each multi-token prediction module: one block of the last block's
    # kind, the 2h x h projection and one more pass through the logits
    # (Megatron-LM num_floating_point_operations, megatron/training/
    # training.py at d98e8a64dd: num_moe_layers += last_layer_is_moe x
    # mtp_num_layers, "MTP eh proj" 2 h^2, logits x (mtp_num_layers + 1)).
    block_mlp = gamma * h * (
      (app.top_k * app.moe_ffn_hidden + app.shared_ffn)
      if app.block_is_moe(app.num_blocks - 1) else app.feedforward)
    total += mtp * (attn + block_mlp + 2 * h * h + logits)
  return total


def attention_core_flops_per_token(app: Application, convention='full'):
  """Training FLOP of the attention core per token (all blocks): Q K^T and
  P V, 2 FLOP per multiply-accumulate, times 3 for the backward pass; half
  with ``convention='causal'``."""
  if app.is_mla:
    qk = app.attn_heads * (app.qk_nope_head_dim + app.qk_rope_head_dim)
    pv = app.attn_heads * app.v_head_dim
  else:
    qk = pv = app.query_width
  blocks = app.num_blocks + app.mtp_layers
  full = 6 * app.seq_size * (qk + pv) * blocks
  return full / 2 if convention == 'causal' else full


def model_flops_per_token(app: Application, convention='full'):
  """Model FLOP of one token in one training step (see the module)."""
  if convention not in CONVENTIONS:
    raise ValueError(f'convention must be one of {CONVENTIONS}')
  return 6 * gemm_weights_per_token(app) + \
    attention_core_flops_per_token(app, convention)
