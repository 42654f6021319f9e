"""One transformer block: its layer list and its per-microbatch totals.

:func:`build_block` compiles the block of a (batch of) execution(s) into a
list of :mod:`~calculon.llm.layers`.  The list is the union of the block's
structural variants (TP overlap on or off, multi-head or multi-query
attention); a layer that exists only in some variants carries a ``present``
mask.  :class:`BlockTotals` then adds the layers up, exactly in Calculon's
order, into per-block, per-microbatch totals.
"""

import numpy as np

from calculon.config.execution import (
  CROSS_ENTROPY_COMPILED, CROSS_ENTROPY_EAGER, CROSS_ENTROPY_UNFUSED,
  RECOMPUTE_ATTN_ONLY, RECOMPUTE_FULL, RECOMPUTE_SELECTIVE, TP_OVERLAP_NONE,
  recomputes_module)
from calculon.llm.layers import (
  and_flags as _and, flag, negate, where, BatchMatMul, CrossEntropy,
  DropOut, ElementWise, EmbeddingLookup, FlashAttention, Fork, GeLU,
  LayerNorm, Linear, LinearOverlapped, RMSNorm, RoPE, SoftMax, SwiGLU, TPComm,
  attention_tile_fraction, ContextParallelMerge, ExpertComm, GroupedLinear,
  WeightedCombine)


def _mask(cond):
  """A Python bool for 0-d conditions (so absent layers can be dropped)."""
  if np.ndim(cond) == 0:
    return bool(cond)
  return cond


def _scalar(x):
  """0-d arrays as numpy scalars (so Python-level tests stay cheap)."""
  return x[()] if isinstance(x, np.ndarray) and x.ndim == 0 else x


def _share(whole, part, fraction):
  """``recompute_share`` of a layer recomputed whole where ``whole`` holds
  and ``fraction`` of it where only ``part`` does (flags or arrays); the
  Python float 1.0 when ``part`` never applies alone."""
  only = _and(part, negate(whole))
  if only is False or (np.ndim(only) == 0 and not only):
    return 1.0
  return np.where(only, fraction, 1.0)


def _feeds(f, *linears):
  """Records on the f operator ``f`` the linear layers it feeds, whose
  backward GEMMs hide its asynchronous backward communication
  (:class:`~calculon.llm.layers.TPComm`); absent ones (None) are
  skipped, and so is an absent ``f``."""
  if f is not None:
    f.async_linears = tuple(x for x in linears if x is not None)


def recomputed_module(exe, name):
  """Whether selective recomputation recomputes Megatron-Core module
  ``name`` (one of :data:`~calculon.config.execution.RECOMPUTE_MODULES`)
  for executions ``exe`` (bool array, a Python bool when 0-d;
  :func:`~calculon.config.execution.recomputes_module`)."""
  return _mask(recomputes_module(exe, name))


class Shape:
  """Per-rank sizes of one block for executions ``exe`` (arrays).

  Attributes:
    tp, cp: TP and CP degrees.
    seq: local sequence (queries) s / CP; kv_seq: keys seen by a query (s).
    batch_seq: tokens of one microbatch on one rank (microbatch x s / CP).
    act, act_sp, act_in: full, sequence-parallel shard, and block-input
      activation (elements).
    kv_heads: K/V heads g; kv_sharded: the K/V heads split over TP (g a
      multiple of TP), else each rank holds one replicated K/V head width
      ceil(g / TP) x d (Megatron-Core's rule for ``num_query_groups``).
  """

  def __init__(self, app, exe, ctx):
    from calculon.config.execution import ATTENTION_MULTIQUERY
    self.tp = tp = ctx.tp
    self.cp = cp = exe.context_par
    self.seq = app.seq_size // cp
    self.kv_seq = app.seq_size
    self.batch_seq = exe.microbatch_size * self.seq
    self.act = self.batch_seq * app.hidden
    self.act_sp = (self.batch_seq // tp) * app.hidden
    self.act_in = _scalar(np.where(ctx.seq_par, self.act_sp, self.act))
    if app.kv_heads is not None:
      g = app.kv_heads
    else:
      g = np.where(exe.attention_type == ATTENTION_MULTIQUERY, 1,
                   app.attn_heads)
    self.kv_heads = _scalar(g)
    self.kv_sharded = _scalar(g % tp == 0)
    d = app.attn_size
    self.kv_total = _scalar(g * d)
    self.kv_local = _scalar(np.where(self.kv_sharded, g * d // tp,
                                     -(-g // tp) * d))


def _adder(ctx, layers):
  """``add(layer_cls, name, *args, present=True, core=False, te_marked=False,
  **kw)``: appends a layer to ``layers`` unless absent for every execution;
  tags it ``core`` (attention core), ``part`` ('shared' or 'experts' by
  name) and ``te_marked``: what it stores is a tensor a Transformer Engine
  module marks for CPU activation offload (``activation_offload_scope``
  'te_marked'; a flag, or a bool array over the executions)."""
  def add(layer_cls, name, *args, present=True, core=False, te_marked=False,
          **kw):
    present = _mask(present)
    if present is False:
      return
    layer = layer_cls(name, ctx, *args, present=present, **kw)
    layer.core = core
    layer.te_marked = flag(te_marked)
    layer.part = 'shared' if name.startswith('Shared_') else (
      'experts' if name.startswith('Moe_Experts') else None)
    layers.append(layer)
    return layer
  return add


def build_block(app, exe, ctx, moe=False):
  """The layers of one block for executions ``exe`` (``moe``: a block whose
  MLP is a Mixture-of-Experts layer, see :func:`_moe_mlp`).

  Args:
    app: the :class:`~calculon.config.Application`.
    exe: :class:`~calculon.config.ExecutionColumns`.
    ctx: the :class:`~calculon.llm.layers.BlockContext`.

  Returns:
    list of layers in execution order; layers absent for every execution are
    left out (so a single run gets exactly its own layer list).  Layers of
    the attention core carry ``core = True`` (context parallelism overlaps
    its ring communication with them).

  Layer sequence (Megatron-LM block; Korthikanti et al. 2022, figure 4):
  attention: fork, layer norm, f, Q/K/V projections, scores, softmax,
  dropout, context, output projection, g, dropout, residual; MLP: fork,
  layer norm, f, MLP1, GeLU, MLP2, g, dropout, residual.  Modern variants
  (the application's optional fields and the execution's new options):
  RMSNorm; grouped-query K/V widths; RoPE on Q and K; FlashAttention
  replacing scores/softmax/dropout/context; a gated MLP (fused gate/up GEMM
  of width 2f, SwiGLU); no dropout; the parallel layout (GPT-J, PaLM
  section 2: attention and MLP read the block input, their outputs are
  summed and, with plain TP, reduced by a single g).
  """
  from calculon.config.execution import KERNEL_FLASH
  shape = Shape(app, exe, ctx)
  tp = ctx.tp
  h = app.hidden
  heads, head_size = app.attn_heads, app.attn_size
  batch_seq, act, act_in = shape.batch_seq, shape.act, shape.act_in
  s_q, s_k = shape.seq, shape.kv_seq
  mbs = exe.microbatch_size

  full = exe.activation_recompute == RECOMPUTE_FULL
  # The attention core is recomputed by full and attn_only; Calculon's
  # attn_only also recomputes from the block input (redoing the f
  # operator, dropping the stored norm output), Megatron-LM's selective
  # mode (Korthikanti et al. 2022, section 5) only the core, unless its
  # modules (Megatron-Core --recompute-modules) leave 'core_attn' out.
  attn_re = (exe.activation_recompute == RECOMPUTE_FULL) | (
    exe.activation_recompute == RECOMPUTE_ATTN_ONLY) | \
    recomputed_module(exe, 'core_attn')
  # Other modules of selective recomputation: the norms (their outputs
  # dropped), MLA's up projections (the attention inputs dropped).
  norm_re = recomputed_module(exe, 'layernorm')
  mla_re = recomputed_module(exe, 'mla_up_proj')
  # PyTorch's per-op selective checkpointing (torchtitan's 'op' policy):
  # every second linear in forward order (K, the output projection, the
  # MLP's up half) and the element-wise layers are recomputed, so the norm
  # outputs are not kept either.
  alt = recomputed_module(exe, 'alternate_linears')
  norm_re = norm_re | alt
  attn_recomm = (attn_re & (exe.activation_recompute != RECOMPUTE_SELECTIVE)
                 ) | exe.seq_par_ag_redo
  mlp_recomm = full | exe.seq_par_ag_redo
  plain = exe.tensor_par_overlap == TP_OVERLAP_NONE
  overlap = ~plain
  kv_sharded = shape.kv_sharded
  qkv_width = heads * head_size
  flash = exe.attention_kernel == KERNEL_FLASH
  standard = ~flash
  parallel = app.block_layout == 'parallel'
  dropout = app.dropout
  norm_cls = RMSNorm if app.norm == 'rmsnorm' else LayerNorm
  norm_name = 'RMSNorm' if app.norm == 'rmsnorm' else 'LayerNorm'

  layers = []
  add = _adder(ctx, layers)

  # -- attention ---------------------------------------------------------------
  # What Transformer Engine marks for CPU activation offload (through v2.9,
  # pytorch/cpu_offload.py mark_activation_offload): the inputs a
  # LayerNormLinear / LayerNormMLP / Linear saves (the norm's input and
  # output, a linear's input: module/layernorm_linear.py,
  # layernorm_mlp.py, linear.py) and the non-context-parallel attention's
  # q, k, v, out (attention/dot_product_attention/backends.py); not
  # Megatron-Core's own fused activation, dropout, MoE routing and
  # permutation, nor GroupedLinear's inputs (module/grouped_linear.py).
  add(Fork, 'AttnBlock_Fork', act_in, 3 if parallel else 2, recompute=full,
      activation_stored=True, te_marked=True)
  add(norm_cls, f'AttnBlock_{norm_name}', act_in, h,
      recompute=full | norm_re, activation_stored=False,
      activation_reused=True)
  if app.is_mla:
    # Multi-head latent attention projections use plain TP (no overlap).
    plain, overlap = np.bool_(True), np.bool_(False)
    kv_sharded = np.bool_(True)
  # Megatron's asynchronous backward hides the redone all-gather of
  # sequence parallelism, not the one of a recomputed forward pass.
  attn_f = add(TPComm, 'AttnBlock_F', act, False, recomm=attn_recomm,
               async_recomm=negate(attn_recomm & ~exe.seq_par_ag_redo),
               present=plain)
  if app.is_mla:
    _mla_projections(app, add, shape, norm_cls, full, attn_recomm, tp,
                     norm_re, mla_re)
  add(Fork, 'AttnBlock_Multihead_Fork', act, 3, recompute=attn_recomm,
      activation_stored=~(attn_recomm | norm_re),
      present=False if app.is_mla else plain, te_marked=True)
  query = add(Linear, 'AttnBlock_Query', batch_seq, h, qkv_width // tp,
              recompute=full, activation_stored=False, activation_reused=True,
              present=False if app.is_mla else plain)
  add(LinearOverlapped, 'AttnBlock_QKV_AG', batch_seq, h,
      qkv_width + 2 * shape.kv_total, False, recompute=full | alt,
      recompute_share=_share(full, alt, shape.kv_total /
                             (qkv_width + 2 * shape.kv_total)),
      recomm=attn_recomm, activation_stored=negate(norm_re),
      present=overlap & kv_sharded, te_marked=True)
  add(LinearOverlapped, 'AttnBlock_Query_AG', batch_seq, h, qkv_width, False,
      recompute=full, recomm=attn_recomm, activation_stored=negate(norm_re),
      present=overlap & ~kv_sharded, te_marked=True)
  add(Fork, 'AttnBlock_KV_Fork', act, 2, recompute=attn_recomm,
      activation_stored=~(attn_recomm | norm_re),
      present=overlap & ~kv_sharded, te_marked=True)
  kv = [add(Linear, name, batch_seq, h, shape.kv_local,
            recompute=full | alt if name == 'AttnBlock_Key' else full,
            activation_stored=False, activation_reused=True,
            quantizes_input=False,
            present=False if app.is_mla else (plain | ~kv_sharded))
        for name in ('AttnBlock_Key', 'AttnBlock_Value')]
  _feeds(attn_f, query, *kv)
  if app.is_mla:
    rope = heads // tp * app.qk_rope_head_dim + app.qk_rope_head_dim
    add(RoPE, 'AttnBlock_RoPE', batch_seq * rope, recompute=full | mla_re)
  elif app.pos_embedding == 'rope':
    add(RoPE, 'AttnBlock_RoPE', batch_seq * (qkv_width // tp +
                                             shape.kv_local),
        recompute=full | alt)
  heads_local = mbs * heads // tp
  # In float64: heads x s^2 elements exceed int64 at the registry's bounds
  # (exact below 2^53).
  scores = np.float64(heads // tp) * s_q * s_k * mbs
  add(BatchMatMul, 'AttnBlock_Multihead_Key_Query', heads_local, s_q,
      head_size, s_k, recompute=attn_re, output_stored=~attn_re,
      present=standard, core=True)
  add(SoftMax, 'AttnBlock_Multihead_SoftMax', scores, recompute=attn_re,
      output_stored=~attn_re, present=standard, core=True)
  add(DropOut, 'AttnBlock_Multihead_DropOut', scores, recompute=attn_re,
      activation_stored=~attn_re, present=standard & dropout, core=True)
  v_size = app.v_head_dim if app.is_mla else qkv_width // heads
  kv_elems = mbs * s_q * heads // tp * (head_size + v_size) if app.is_mla \
    else 2 * mbs * s_q * shape.kv_local
  add(BatchMatMul, 'AttnBlock_Multihead_Attn', heads_local, s_q, s_k,
      v_size, recompute=full, present=standard, core=True)
  add(FlashAttention, 'AttnBlock_FlashAttention', heads_local, s_q, s_k,
      head_size, v_size, kv_elems, attention_tile_fraction(app),
      recompute=attn_re, activation_stored=~(attn_re | mla_re), present=flash,
      core=True, te_marked=shape.cp == 1)
  # Context parallelism: the ring steps' partial outputs merged, and their
  # gradients accumulated, outside the attention kernel.
  add(ContextParallelMerge, 'AttnBlock_CP_Merge', heads_local * s_q * v_size,
      heads_local * s_q * head_size, kv_elems, shape.cp, recompute=attn_re,
      present=(flash & (shape.cp > 1)) if np.any(shape.cp > 1) else False)
  add(Linear, 'AttnBlock_MLP', batch_seq, heads * v_size // tp, h,
      recompute=full | alt, present=plain, te_marked=True)
  add(TPComm, 'AttnBlock_G', act, True, recomm=full, activation_stored=False,
      present=False if parallel else plain)
  add(LinearOverlapped, 'AttnBlock_MLP_RS', batch_seq, qkv_width, h, True,
      recompute=full | alt, recomm=full, present=overlap, te_marked=True)
  if not parallel:
    add(DropOut, 'AttnBlock_DropOut', act_in,
        fused=exe.fused_dropout_add, recompute=full, present=dropout)
    add(ElementWise, 'AttnBlock_Residual', act_in, act_in,
        recompute=full | alt, activation_stored=False,
        activation_reused=True)

  if moe:
    _moe_mlp(app, exe, ctx, add, shape, norm_cls, norm_name, full, parallel,
             dropout, norm_re)
    return layers

  # -- MLP ---------------------------------------------------------------------
  ff = app.feedforward
  up = 2 * ff if app.gated else ff
  if not parallel:
    add(Fork, 'MlpBlock_Fork', act_in, 2, recompute=full,
        activation_stored=True, te_marked=True)
  # Megatron-Core's 'mlp' module: the MLP recomputed from its input.
  mlp_re = recomputed_module(exe, 'mlp')
  mlp_in = full | mlp_re
  add(norm_cls, f'MlpBlock_{norm_name}', act_in, h, recompute=full | norm_re,
      activation_stored=False, activation_reused=True)
  mlp_f = add(TPComm, 'MlpBlock_F', act, False, recomm=mlp_recomm | mlp_re,
              async_recomm=negate(mlp_in), present=plain)
  # The alternate linears' policy recomputes the up half of a gated MLP's
  # fused gate/up GEMM (w3 of w1, w3, w2) and none of a plain MLP's first.
  up_alt = alt if app.gated else False
  up_share = _share(mlp_in, up_alt, 0.5)
  mlp1 = add(Linear, 'MlpBlock_Mlp1', batch_seq, h, up // tp,
             recompute=mlp_in | up_alt, recompute_share=up_share,
             activation_stored=~(mlp_recomm | norm_re), present=plain,
             te_marked=True)
  _feeds(mlp_f, mlp1)
  add(LinearOverlapped, 'MlpBlock_Mlp1_AG', batch_seq, h, up, False,
      recompute=mlp_in | up_alt, recompute_share=up_share,
      recomm=mlp_recomm | mlp_re,
      activation_stored=negate(norm_re), present=overlap, te_marked=True)
  # The alternate linears' policy recomputes every element-wise op: the
  # activation keeps nothing of its own (the saved half of the gate/up
  # output is counted as the second linear's input, which it recomputes).
  if app.gated:
    add(SwiGLU, 'MlpBlock_SwiGLU', ff * batch_seq // tp,
        exe.fused_activation, keeps_input=exe.fused_activation_keeps_input,
        recompute=mlp_in | alt, activation_stored=negate(mlp_re | alt))
  else:
    add(GeLU, 'MlpBlock_GeLU', ff * batch_seq // tp, exe.fused_activation,
        keeps_input=exe.fused_activation_keeps_input,
        recompute=mlp_in | alt, activation_stored=negate(mlp_re | alt))
  add(Linear, 'MlpBlock_Mlp2', batch_seq, ff // tp, h, recompute=mlp_in,
      activation_stored=negate(mlp_re), present=plain, te_marked=True)
  if parallel:
    # Attention and MLP partial outputs are summed before one reduction.
    add(ElementWise, 'ParallelBlock_Sum', act, act, recompute=full,
        activation_stored=False, present=plain)
    add(ElementWise, 'ParallelBlock_Sum', act_in, act_in, recompute=full,
        activation_stored=False, present=overlap)
  add(TPComm, 'MlpBlock_G', act, True, recomm=mlp_in,
      activation_stored=False, present=plain)
  add(LinearOverlapped, 'MlpBlock_Mlp2_RS', batch_seq, ff, h, True,
      recompute=mlp_in, recomm=mlp_in, activation_stored=negate(mlp_re),
      present=overlap, te_marked=True)
  add(DropOut, 'MlpBlock_DropOut', act_in, fused=exe.fused_dropout_add,
      recompute=full, present=dropout)
  add(ElementWise, 'MlpBlock_Residual', act_in, act_in, recompute=full,
      activation_stored=False, activation_reused=True)
  return layers


def _mla_projections(app, add, shape, norm_cls, full, recomm, tp,
                     norm_re=False, mla_re=False):
  """Multi-head latent attention projections (DeepSeek-AI 2024,
  "DeepSeek-V2", section 2.1.2; Megatron-Core ``MLASelfAttention``): the
  down projections (h -> q_lora_rank and h -> kv_lora_rank + rope dim) are
  replicated over TP, their RMSNorms too, the up projections (to heads x
  (nope + rope) for queries, heads x (nope + v) for keys and values) are
  split over TP like Q/K/V.  ``mla_re``: Megatron-Core's 'mla_up_proj'
  recomputation (the up projections recomputed, their outputs dropped);
  ``norm_re``: its 'layernorm' (the block's norm output dropped)."""
  h, bs = app.hidden, shape.batch_seq
  a = app.attn_heads
  dn, dr, dv = app.qk_nope_head_dim, app.qk_rope_head_dim, app.v_head_dim
  add(Fork, 'AttnBlock_MLA_Fork', shape.act, 2, recompute=recomm,
      activation_stored=negate(flag(recomm | norm_re)), te_marked=True)
  if app.q_lora_rank is not None:
    r = app.q_lora_rank
    add(Linear, 'AttnBlock_Q_Down', bs, h, r, recompute=full,
        activation_stored=False, activation_reused=True)
    add(norm_cls, 'AttnBlock_Q_Norm', bs * r, r, recompute=full)
    add(Linear, 'AttnBlock_Q_Up', bs, r, a * (dn + dr) // tp,
        recompute=full | mla_re, te_marked=True)
  else:
    add(Linear, 'AttnBlock_Query', bs, h, a * (dn + dr) // tp,
        recompute=full, activation_stored=False, activation_reused=True)
  r = app.kv_lora_rank
  add(Linear, 'AttnBlock_KV_Down', bs, h, r + dr, recompute=full,
      activation_stored=False, activation_reused=True)
  add(norm_cls, 'AttnBlock_KV_Norm', bs * r, r, recompute=full)
  add(Linear, 'AttnBlock_KV_Up', bs, r, a * (dn + dv) // tp,
      recompute=full | mla_re, te_marked=True)


def _moe_mlp(app, exe, ctx, add, shape, norm_cls, norm_name, full, parallel,
             dropout, norm_re=False):
  """The MLP part of a Mixture-of-Experts block (Megatron-Core
  ``MoELayer``; Fedus et al. 2022 "Switch Transformers" and Lepikhin et al.
  2020 "GShard" for routing, capacity and dispatch).

  Each TP rank routes its share of the tokens (sequence-parallel split,
  b s / TP; with tensor_par 1, all): router GEMM h x E and top-k; dispatch
  among the EP ranks (all-to-all, or all-gather with the allgather
  dispatcher); E / EP local experts run grouped GEMMs on the tokens routed
  to them, split over ETP ranks (their tokens gathered over ETP first); the
  combine mirrors the dispatch; the weighted sum of the k expert outputs.
  Balanced routing gives each expert tokens x k x EP x ETP / E tokens; the
  busiest one ``expert_imbalance`` times that (the step waits for it); with
  ``capacity_factor`` every expert computes exactly its capacity
  ceil(... x factor), padded.  Shared experts are a dense MLP of their
  total width, split over TP as the dense MLP is.  Selective recomputation
  of Megatron-Core's modules: 'moe' recomputes the layer (its all-to-alls
  too) from its input, keeping nothing inside; 'moe_act' the experts'
  activation, dropping its output; 'shared_experts' the shared experts.
  """
  from calculon.config.execution import (
    DISPATCH_ALLGATHER, DISPATCH_DEEPEP)
  tp, h = ctx.tp, app.hidden
  E, k = app.num_experts, app.top_k
  ep, etp = exe.expert_par, exe.expert_tensor_par
  tokens = _scalar(np.where(tp > 1, shape.batch_seq // tp, shape.batch_seq))
  fair = tokens * k * ep * etp / E
  if app.capacity_factor is not None:
    per_expert = np.ceil(fair * app.capacity_factor)
  else:
    per_expert = np.ceil(fair * exe.expert_imbalance)
  per_expert = _scalar(per_expert)
  local = E // ep
  width = app.moe_ffn_hidden // etp
  up = 2 * width if app.gated else width
  allgather = exe.moe_dispatcher == DISPATCH_ALLGATHER
  alltoall = ~allgather
  deepep = flag(exe.moe_dispatcher == DISPATCH_DEEPEP)
  tier = exe.expert_par_net

  act_in, act = shape.act_in, shape.act
  moe_re = recomputed_module(exe, 'moe')
  act_re = recomputed_module(exe, 'moe_act')
  shared_re = moe_re | recomputed_module(exe, 'shared_experts')
  # Inside the MoE layer: recomputed with it, nothing kept.
  inner = full | moe_re
  kept = negate(moe_re)
  if not parallel:
    add(Fork, 'MlpBlock_Fork', act_in, 2, recompute=full,
        activation_stored=True)
  add(norm_cls, f'MlpBlock_{norm_name}', act_in, h, recompute=full | norm_re,
      activation_stored=False, activation_reused=True)
  shared = app.shared_ffn
  add(Fork, 'Moe_Fork', tokens * h, 3 if shared else 2, recompute=full,
      activation_stored=negate(norm_re))
  add(Linear, 'Moe_Router', tokens, h, E, narrow=False, recompute=inner,
      activation_stored=False, activation_reused=True)
  add(SoftMax, 'Moe_RouterTopK', tokens * E, recompute=inner,
      activation_stored=kept)
  add(ElementWise, 'Moe_Permute', tokens * k * h, tokens * h,
      recompute=inner, activation_stored=False)
  dispatched = tokens * k * h
  dedup = (deepep, E, k, app.moe_router_num_groups,
           app.moe_router_group_topk)
  add(ExpertComm, 'Moe_Dispatch', dispatched, ep, tier, 'all_to_all',
      recompute=inner, activation_stored=kept, present=alltoall,
      node_dedup=dedup)
  add(ExpertComm, 'Moe_Dispatch_AG', tokens * h * ep, ep, tier, 'all_gather',
      recompute=inner, activation_stored=kept, present=allgather)
  add(ExpertComm, 'Moe_Dispatch_ETP', local * per_expert * h, etp,
      ctx.tp_tier, 'all_gather', recompute=inner, activation_stored=kept,
      present=etp > 1)
  add(GroupedLinear, 'Moe_Experts_Mlp1', local, per_expert, h, up,
      recompute=inner, activation_stored=kept)
  act_size = local * per_expert * width
  if app.gated:
    add(SwiGLU, 'Moe_Experts_SwiGLU', act_size, exe.fused_activation,
        keeps_input=exe.fused_activation_keeps_input,
        recompute=inner | act_re, activation_stored=kept)
  else:
    add(GeLU, 'Moe_Experts_GeLU', act_size, exe.fused_activation,
        keeps_input=exe.fused_activation_keeps_input,
        recompute=inner | act_re, activation_stored=kept)
  add(GroupedLinear, 'Moe_Experts_Mlp2', local, per_expert, width, h,
      recompute=inner, activation_stored=negate(moe_re | act_re))
  add(ExpertComm, 'Moe_Combine_ETP', local * per_expert * h, etp,
      ctx.tp_tier, 'reduce_scatter', recompute=inner, activation_stored=kept,
      present=etp > 1)
  add(ExpertComm, 'Moe_Combine', dispatched, ep, tier, 'all_to_all',
      recompute=inner, activation_stored=kept, present=alltoall,
      node_dedup=dedup)
  add(ExpertComm, 'Moe_Combine_RS', tokens * h * ep, ep, tier,
      'reduce_scatter', recompute=inner, activation_stored=kept,
      present=allgather)
  add(WeightedCombine, 'Moe_Unpermute', dispatched, tokens * k,
      probs_in_activation=exe.moe_probs_in_activation, recompute=inner,
      activation_stored=kept)
  if shared:
    batch_seq = shape.batch_seq
    s_up = 2 * shared if app.gated else shared
    s_in = full | shared_re
    s_kept = negate(shared_re)
    shared_f = add(TPComm, 'Shared_F', act, False, recomm=s_in,
                   async_recomm=negate(s_in), present=tp > 1)
    shared_1 = add(Linear, 'Shared_Mlp1', batch_seq, h, s_up // tp,
                   recompute=s_in, activation_stored=negate(norm_re),
                   te_marked=True)
    _feeds(shared_f, shared_1)
    cls = SwiGLU if app.gated else GeLU
    add(cls, 'Shared_Act', shared * batch_seq // tp, exe.fused_activation,
        keeps_input=exe.fused_activation_keeps_input, recompute=s_in,
        activation_stored=s_kept)
    add(Linear, 'Shared_Mlp2', batch_seq, shared // tp, h, recompute=s_in,
        activation_stored=s_kept, te_marked=True)
    add(TPComm, 'Shared_G', act, True, recomm=s_in, activation_stored=False,
        present=tp > 1)
    add(ElementWise, 'Moe_SharedSum', act_in, act_in, recompute=inner,
        activation_stored=False)
  add(DropOut, 'MlpBlock_DropOut', act_in, fused=exe.fused_dropout_add,
      recompute=full, present=dropout)
  add(ElementWise, 'MlpBlock_Residual', act_in, act_in, recompute=full,
      activation_stored=False, activation_reused=True)


def build_embedding(app, exe, ctx):
  """Layers of the input embedding on the first pipeline stage (empty
  without a vocabulary): the vocabulary-parallel lookup (V / TP rows per
  rank, plus a learned s x h position table), the reduction of its
  partial outputs over TP (all-reduce, or reduce-scatter with sequence
  parallelism: Megatron-LM ``VocabParallelEmbedding``) and dropout."""
  if not app.has_vocab:
    return []
  shape = Shape(app, exe, ctx)
  tp = ctx.tp
  table = -(-app.vocab_size // tp) * app.hidden
  positions = app.seq_size * app.hidden \
    if app.pos_embedding == 'learned' else 0
  layers = []
  add = _adder(ctx, layers)
  add(EmbeddingLookup, 'Embedding_Lookup', shape.act, table, positions,
      activation_stored=False)
  add(TPComm, 'Embedding_G', shape.act, True, activation_stored=False,
      present=tp > 1)
  add(DropOut, 'Embedding_DropOut', shape.act_in, present=app.dropout)
  return layers


def _hold_weights(layer, held):
  """Keeps ``layer``'s weights, their gradients and optimizer state only
  where ``held`` (a flag or a bool array): elsewhere another layer holds
  the shared table."""
  if held is not True:
    for attr in ('weights', 'weight_grads', 'optim'):
      setattr(layer, attr, where(held, getattr(layer, attr), 0))


def build_head(app, exe, ctx, holds_weights=True):
  """Layers of the LM head and loss on the last pipeline stage (empty
  without a vocabulary): final norm, f (identity, or all-gather with
  sequence parallelism), the logits GEMM (h x V / TP, kept 16-bit under
  Transformer Engine) and the vocabulary-parallel cross-entropy.
  ``holds_weights=False`` (tied embeddings on a single stage) leaves the
  head's weights to the embedding."""
  if not app.has_vocab:
    return []
  shape = Shape(app, exe, ctx)
  tp = ctx.tp
  vocab_local = -(-app.vocab_size // tp)
  norm_cls = RMSNorm if app.norm == 'rmsnorm' else LayerNorm
  layers = []
  add = _adder(ctx, layers)
  add(norm_cls, 'Head_Norm', shape.act_in, app.hidden)
  head_f = add(TPComm, 'Head_F', shape.act, False, present=tp > 1)
  head = Linear('Head_Logits', ctx, shape.batch_seq, app.hidden, vocab_local,
                narrow=False)
  _feeds(head_f, head)
  _hold_weights(head, holds_weights)
  head.core = False
  layers.append(head)
  kernel = np.asarray(exe.cross_entropy_kernel)
  eager = kernel == CROSS_ENTROPY_EAGER
  unfused = (kernel == CROSS_ENTROPY_UNFUSED) | eager
  compiled = kernel == CROSS_ENTROPY_COMPILED
  compiled = compiled if np.any(compiled) else False
  loss_parallel = eager & (tp > 1)
  add(CrossEntropy, 'Head_CrossEntropy', shape.batch_seq * vocab_local,
      unfused=unfused if np.any(unfused) else False, compiled=compiled,
      loss_parallel=loss_parallel if np.any(loss_parallel) else False,
      activation_reused=compiled)
  return layers


def build_mtp(app, exe, ctx, holds_embedding):
  """Layers of the multi-token prediction modules beside the LM head on the
  last pipeline stage (empty without ``app.mtp_layers``, which needs a
  vocabulary),
  all but their transformer blocks (priced as blocks,
  :attr:`~calculon.llm.terms.vocab.VocabTerms.mtp_blocks`).  Per module k
  (DeepSeek-AI 2024, DeepSeek-V3 technical report, arXiv:2412.19437,
  section 2.2, eq. 21-23; Megatron-Core
  megatron/core/transformer/multi_token_prediction.py at d98e8a64dd,
  MultiTokenPredictionLayer): the embedding of the token k positions
  ahead (the shared embedding: its table is held here only where
  ``holds_embedding``, the last stage's copy with PP > 1, GPTModel builds
  ``self.embedding`` where ``mtp_process``), the RMSNorms of that
  embedding and of the previous depth's hidden state (``enorm``,
  ``hnorm``), the projection of their concatenation, 2h -> h
  column-parallel over TP (``eh_proj``, ``gather_output=False``), and the
  module's pass through the shared output head and its loss (the head's
  weights belong to the main head: ``holds_weights=False``)."""
  depth = app.mtp_layers
  if depth == 0:
    return []
  shape = Shape(app, exe, ctx)
  tp = ctx.tp
  table = -(-app.vocab_size // tp) * app.hidden
  norm_cls = RMSNorm if app.norm == 'rmsnorm' else LayerNorm
  layers = []
  add = _adder(ctx, layers)
  for k in range(depth):
    emb = add(EmbeddingLookup, f'MTP{k + 1}_Embedding', shape.act, table, 0,
              activation_stored=False)
    _hold_weights(emb, holds_embedding if k == 0 else False)
    add(TPComm, f'MTP{k + 1}_Embedding_G', shape.act, True,
        activation_stored=False, present=tp > 1)
    add(norm_cls, f'MTP{k + 1}_ENorm', shape.act_in, app.hidden)
    add(norm_cls, f'MTP{k + 1}_HNorm', shape.act_in, app.hidden)
    proj_f = add(TPComm, f'MTP{k + 1}_Proj_F', shape.act, False,
                 present=tp > 1)
    proj = add(Linear, f'MTP{k + 1}_Proj', shape.batch_seq, 2 * app.hidden,
               app.hidden // tp)
    _feeds(proj_f, proj)
    for layer in build_head(app, exe, ctx, holds_weights=False):
      layer.name = f'MTP{k + 1}_{layer.name}'
      layers.append(layer)
  return layers


class _Sum:
  """Running masked sum in layer order (bit-identical to a Python loop)."""

  def __init__(self):
    self.value = 0

  def add(self, x, present=True, cond=True):
    if cond is False:
      return
    mask = _and(present, cond)
    if mask is False:
      return
    if mask is not True:
      x = np.where(mask, x, 0.0)
    self.value = self.value + x


class BlockTotals:
  """Per-microbatch totals of one block, in Calculon's accumulation order.

  Attributes (arrays; FLOP, bytes, seconds; ``base``/``edge``: the block in
  the middle / at the end of a pipeline chunk, whose TP communication may
  differ with p2p_rs_ag):

    fw_flops, fw_flops_time, fw_mem_bytes, fw_mem_time, fw_time;
    re_* (recomputation), agrad_*, wgrad_*, optim_* likewise;
    {base,edge}_{fw,agrad}_tp_{bytes,time,exposed},
    {base,edge}_recomm_{bytes,time,exposed};
    tp_bw_overlap_req (bytes/s);
    weight_bytes, act_working_bytes, act_storage_bytes, weight_grad_bytes,
    weight_grad_unsharded_bytes, act_grad_bytes, optimizer_bytes;
    act_offloadable_bytes (on first use): the part of act_storage_bytes
    that layers flagged ``te_marked`` store, what Transformer Engine's CPU
    offload moves (``activation_offload_scope`` 'te_marked').

  Recomputation (``re_*``) sums the forward cost of the recomputed layers.
  Calculon instead adds the block's running forward totals at each
  recomputed layer (its issue #5), inflating recompute FLOP and bytes 8x
  (median over its test cases); its DP-overlap model consumes those
  inflated values, which are kept, for that model only, as
  ``dp_window_re_flops_time`` and ``dp_window_re_mem_time`` so batch times
  stay Calculon's.  See docs/differences-from-calculon.md.
  """

  _STAGE_KEYS = ('flops', 'flops_time', 'mem_bytes', 'mem_time', 'time')

  def __init__(self, layers, training, recompute_full):
    names = []
    for stage in ('fw', 're', 'agrad', 'wgrad', 'optim'):
      names += [f'{stage}_{k}' for k in self._STAGE_KEYS]
    for phase in ('fw_tp', 'agrad_tp', 'recomm'):
      for where_ in ('base', 'edge'):
        names += [f'{where_}_{phase}_{k}' for k in ('bytes', 'time',
                                                     'exposed')]
    names += ['weight_bytes', 'act_working_bytes', 'act_storage_bytes',
              'weight_grad_bytes', 'weight_grad_unsharded_bytes',
              'act_grad_bytes', 'optimizer_bytes', 'useful_bw_flops',
              'dp_window_re_flops_time', 'dp_window_re_mem_time']
    acc = {n: _Sum() for n in names}
    self._layers, self._training = layers, training
    self._recompute_full = recompute_full
    tp_req = 0.0
    train = flag(training)

    for layer in layers:
      p = layer.present
      fw_flops = layer.flops('fw')
      acc['fw_flops'].add(fw_flops, p)
      acc['fw_flops_time'].add(layer.flops_time_s('fw'), p)
      acc['fw_mem_bytes'].add(layer.mem_bytes('fw'), p)
      acc['fw_mem_time'].add(layer.mem_time_s('fw'), p)
      acc['fw_time'].add(layer.processing_time_s('fw'), p)
      for w, edge in (('base', False), ('edge', True)):
        acc[f'{w}_fw_tp_bytes'].add(layer.comm_bytes('fw', edge), p)
        acc[f'{w}_fw_tp_time'].add(layer.net_time_s('fw', edge), p)
      for w, edge in (('base', False), ('edge', True)):
        acc[f'{w}_fw_tp_exposed'].add(layer.exposed_net_time_s('fw', edge), p)
      tp_req = _max_masked(tp_req, layer, 'fw', p)

      if train is not False:
        rec = layer.recompute
        if rec is not False:
          c = _and(train, rec)
          share = layer.recompute_share
          whole = np.ndim(share) == 0 and share == 1.0
          part = (lambda v: v) if whole else (lambda v: v * share)
          acc['re_flops'].add(part(fw_flops), p, c)
          acc['re_flops_time'].add(part(layer.flops_time_s('fw')), p, c)
          acc['re_mem_bytes'].add(part(layer.mem_bytes('fw')), p, c)
          acc['re_mem_time'].add(part(layer.mem_time_s('fw')), p, c)
          acc['re_time'].add(part(layer.processing_time_s('fw')), p, c)
          # Calculon's DP-overlap window adds the block's running forward
          # totals here instead (its issue #5); kept only for that window.
          acc['dp_window_re_flops_time'].add(acc['fw_flops_time'].value, p, c)
          acc['dp_window_re_mem_time'].add(acc['fw_mem_time'].value, p, c)
        rcm = layer.recomm
        if rcm is not False:
          c = _and(train, rcm)
          for w, edge in (('base', False), ('edge', True)):
            acc[f'{w}_recomm_bytes'].add(layer.comm_bytes('wgrad', edge), p, c)
          for w, edge in (('base', False), ('edge', True)):
            acc[f'{w}_recomm_time'].add(layer.net_time_s('wgrad', edge), p, c)
          for w, edge in (('base', False), ('edge', True)):
            acc[f'{w}_recomm_exposed'].add(layer.recomm_exposed_time_s(edge),
                                           p, c)
        t = train
        acc['agrad_flops'].add(layer.flops('agrad'), p, t)
        acc['agrad_flops_time'].add(layer.flops_time_s('agrad'), p, t)
        acc['agrad_mem_bytes'].add(layer.mem_bytes('agrad'), p, t)
        acc['agrad_mem_time'].add(layer.mem_time_s('agrad'), p, t)
        acc['agrad_time'].add(layer.processing_time_s('agrad'), p, t)
        for w, edge in (('base', False), ('edge', True)):
          acc[f'{w}_agrad_tp_bytes'].add(layer.comm_bytes('agrad', edge), p, t)
        for w, edge in (('base', False), ('edge', True)):
          acc[f'{w}_agrad_tp_time'].add(layer.net_time_s('agrad', edge), p, t)
        for w, edge in (('base', False), ('edge', True)):
          acc[f'{w}_agrad_tp_exposed'].add(
            layer.exposed_net_time_s('agrad', edge), p, t)
        tp_req = _max_masked(tp_req, layer, 'agrad', _and(p, t))
        acc['useful_bw_flops'].add(layer.flops('agrad') + layer.flops('wgrad')
                                   + layer.flops('optim'), p, t)
        for stage in ('wgrad', 'optim'):
          acc[f'{stage}_flops'].add(layer.flops(stage), p, t)
          acc[f'{stage}_flops_time'].add(layer.flops_time_s(stage), p, t)
          acc[f'{stage}_mem_bytes'].add(layer.mem_bytes(stage), p, t)
          acc[f'{stage}_mem_time'].add(layer.mem_time_s(stage), p, t)
          acc[f'{stage}_time'].add(layer.processing_time_s(stage), p, t)

      # Memory kept per block.
      acc['weight_bytes'].add(layer.weight_bytes(), p)
      act = layer.activation_bytes()
      if layer.activation_reused is not True:
        acc['act_working_bytes'].add(act, p, negate(layer.activation_reused))
      _add_stored(acc['act_storage_bytes'], layer, act, p, train)
      if train is not False:
        acc['weight_grad_bytes'].add(layer.weight_grad_bytes(), p, train)
        acc['weight_grad_unsharded_bytes'].add(
          layer.weight_grad_bytes(sharded=False), p, train)
        acc['act_grad_bytes'].add(layer.activation_grad_bytes(), p, train)
        acc['optimizer_bytes'].add(layer.optimizer_bytes(), p, train)

    for name, total in acc.items():
      setattr(self, name, total.value)
    self.tp_bw_overlap_req = tp_req
    # With full recomputation only the checkpoint is stored.
    self.act_storage_bytes = np.where(recompute_full, 0, self.act_storage_bytes)
    if np.ndim(self.act_storage_bytes) == 0:
      self.act_storage_bytes = self.act_storage_bytes[()]


  #: Totals of the modern features, computed on first use (a second pass
  #: over the layers) so that Calculon's executions never pay for them.
  MODERN = ('weight_elems', 'core_fw_time', 'core_bw_time', 'matrix_fw_flops',
            'matrix_bw_flops', 'expert_weight_elems', 'expert_weight_bytes',
            'ep_bytes', 'ep_fw_time', 'ep_bw_time', 'ep_re_time',
            'shared_fw_time', 'shared_bw_time', 'experts_fw_time',
            'experts_bw_time', 'act_offloadable_bytes')

  def __getattr__(self, name):
    if name not in self.MODERN:
      raise AttributeError(name)
    self._modern_totals()
    return self.__dict__[name]

  def _modern_totals(self):
    """The attention core's time (context parallelism overlaps its ring
    with it), GEMM FLOP (model FLOP checks), weight elements, and for
    Mixture-of-Experts the expert-parallel communication, the routed
    experts' weights and the compute the dispatch may hide behind."""
    acc = {n: _Sum() for n in self.MODERN}
    train = flag(self._training)
    for layer in self._layers:
      p = layer.present
      if getattr(layer, 'core', False):
        acc['core_fw_time'].add(layer.processing_time_s('fw'), p)
        if train is not False:
          acc['core_bw_time'].add(layer.processing_time_s('agrad') +
                                  layer.processing_time_s('wgrad'), p, train)
      if layer.matrix:
        acc['matrix_fw_flops'].add(layer.flops('fw'), p)
        if train is not False:
          acc['matrix_bw_flops'].add(layer.flops('agrad') +
                                     layer.flops('wgrad'), p, train)
      if hasattr(layer, 'ep_time_s'):
        ep = layer.ep_time_s()
        acc['ep_bytes'].add(layer.ep_bytes(), p)
        acc['ep_fw_time'].add(ep, p)
        if train is not False:
          acc['ep_bw_time'].add(ep, p, train)
          if layer.recompute is not False:
            acc['ep_re_time'].add(ep, p, _and(train, layer.recompute))
      part = getattr(layer, 'part', None)
      if part is not None:
        acc[f'{part}_fw_time'].add(layer.processing_time_s('fw'), p)
        if train is not False:
          acc[f'{part}_bw_time'].add(layer.processing_time_s('agrad') +
                                     layer.processing_time_s('wgrad'), p,
                                     train)
      if layer.expert:
        acc['expert_weight_elems'].add(layer.weights, p)
        acc['expert_weight_bytes'].add(layer.weight_bytes(), p)
      acc['weight_elems'].add(layer.weights, p)
      te = getattr(layer, 'te_marked', False)
      if te is not False:
        # The part of act_storage_bytes a Transformer Engine module marks
        # for CPU offload, accumulated as act_storage_bytes is.
        _add_stored(acc['act_offloadable_bytes'], layer,
                    layer.activation_bytes(), _and(p, te), train)
    for name, total in acc.items():
      self.__dict__[name] = total.value
    self.act_offloadable_bytes = np.where(self._recompute_full, 0,
                                          self.act_offloadable_bytes)


def _add_stored(total, layer, act, present, train):
  """Adds to ``total`` (a :class:`_Sum`) what ``layer`` stores for the
  backward pass: its activation ``act`` (bytes), less, when training, its
  output and its activation where it does not keep them."""
  total.add(act, present)
  if train is False:
    return
  for kept, size in ((layer.output_stored, layer.output_bytes()),
                     (layer.activation_stored, act)):
    dropped = negate(kept)
    if dropped is not False:
      total.add(-size, present, _and(train, dropped))


def _max_masked(current, layer, stage, present):
  """Running max of the bandwidth needed to hide tiled TP communication
  (Python's max keeps the first of equal values; NaN-safe like it)."""
  for edge in (False, True):
    req = layer.required_bw_bytes_per_s(stage, edge)
    if isinstance(req, float) and req == 0.0:
      continue
    if present is not True:
      req = np.where(present, req, 0.0)
    current = np.where(req > current, req, current)
  return current


def moe_blocks_in_busiest_stage(app, pp):
  """MoE blocks held by the pipeline stage holding the most of them, for
  PP degrees ``pp`` (array): stages hold contiguous runs of
  ceil(blocks / PP) blocks, MoE where the application's pattern says
  (first_dense_blocks, moe_layer_freq)."""
  L, first, k = app.num_blocks, app.first_dense_blocks, app.moe_layer_freq
  pp = np.asarray(pp)
  out = np.zeros(pp.shape, dtype=np.int64)
  for value in np.unique(pp):
    bpp = -(-L // int(value))
    # Stage j holds blocks [j bpp, min((j + 1) bpp, L)); its MoE blocks are
    # the multiples of k in [max(j bpp, first), end): a closed form per
    # stage (at most PP stages), not a loop over the blocks.
    start = np.arange(0, L, bpp, dtype=np.int64)
    end = np.minimum(start + bpp, L)
    lo = np.maximum(start, first)
    counts = np.where(end > lo, -(-end // k) - -(-lo // k), 0)
    out = np.where(pp == value, int(counts.max()), out)
  return out[()] if out.ndim == 0 else out


class BlockMix:
  """Per-block totals of a stage holding ``n_moe`` MoE blocks and the rest
  dense (of ``n_total`` blocks): additive quantities are the average block
  (so n_total x the attribute is the stage's sum), working-set quantities
  the larger of the two kinds of block."""

  MAX = ('act_working_bytes', 'act_grad_bytes', 'weight_grad_unsharded_bytes',
         'tp_bw_overlap_req')

  def __init__(self, dense, moe, n_moe, n_total):
    self._dense, self._moe = dense, moe
    self._n_moe, self._n_total = n_moe, n_total
    self._n_dense = n_total - n_moe

  def __getattr__(self, name):
    if name.startswith('_'):
      raise AttributeError(name)
    d, m = getattr(self._dense, name), getattr(self._moe, name)
    if name in self.MAX:
      value = np.where(self._n_moe > 0, np.where(
        self._n_dense > 0, np.maximum(d, m), m), d)
    else:
      with np.errstate(divide='ignore', invalid='ignore'):
        value = (self._n_moe * m + self._n_dense * d) / self._n_total
    setattr(self, name, value)
    return value
