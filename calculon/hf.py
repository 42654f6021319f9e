"""Hugging Face ``config.json`` -> calculon application (``calculon import-hf``).

:func:`application_from_hf` reads the decoded ``config.json`` of a
transformers causal LM and returns the application object (the JSON of
``models/*.json``) plus the notes that say what was assumed or left out.
The family is chosen by ``model_type`` (or, without it, by the first of
``architectures``); each family's field names and defaults are those of its
transformers configuration and modeling files (``transformers/models/<family>/
configuration_<family>.py`` and ``modeling_<family>.py``):

===============  ===========================================================
family           mapped as
===============  ===========================================================
llama, mistral   RMSNorm, SwiGLU (gated), RoPE, GQA ``num_key_value_heads``;
                 Llama ``attention_bias`` / ``mlp_bias``
mixtral          as mistral; every block MoE: ``num_local_experts``,
                 ``num_experts_per_tok``, experts of ``intermediate_size``
qwen2            as llama with biases on Q, K and V (``linear_bias: qkv``)
qwen2_moe        as qwen2; MoE blocks (``num_experts``, ``moe_intermediate_
                 size``, one shared expert of ``shared_expert_intermediate_
                 size``, ``decoder_sparse_step``, ``mlp_only_layers``)
qwen3(_moe)      as llama / qwen2_moe without shared experts; QK-Norm
gemma, gemma2    RMSNorm, GeGLU (gated), ``head_dim`` (default 256), tied
gpt_neox         LayerNorm, plain GeLU MLP, biases, RoPE,
                 ``use_parallel_residual`` -> parallel layout
gpt2             LayerNorm, plain MLP (``n_inner`` or 4h), biases, learned
                 positions, tied embeddings
falcon           LayerNorm, plain MLP (``ffn_hidden_size`` or 4h),
                 ``parallel_attn``, multi-query / ``num_kv_heads``, ``bias``
deepseek_v2/v3   RMSNorm, SwiGLU, multi-head latent attention (``q_lora_rank``
                 ... ``v_head_dim``), MoE after ``first_k_dense_replace``
                 dense blocks, ``n_shared_experts``, ``moe_layer_freq``
===============  ===========================================================

Common fields: ``hidden_size``, ``num_attention_heads``,
``num_hidden_layers``, ``vocab_size``, ``intermediate_size``, ``head_dim``
(else hidden / heads), ``tie_word_embeddings`` (else the family's default),
``max_position_embeddings`` -> ``seq_size`` (or ``seq`` given by the
caller); ``rms_norm_eps`` means RMSNorm and ``layer_norm_eps`` /
``layer_norm_epsilon`` LayerNorm; ``dropout`` is true when any dropout
probability of the decoder (``*dropout*``, ``*_pdrop``) is above zero.

What the application cannot express is decided per feature:

* **error** (:class:`~calculon.errors.ConfigError`, one line, exit 2) when
  the result would be wrong by more than a small amount, or the input is not
  understood: an unknown ``model_type``/architecture, a missing or malformed
  field, MoE layer placements that
  ``first_dense_blocks`` / ``moe_layer_freq`` cannot reproduce;
* **note** (written in the output's ``notes``, and returned) when the
  omission changes the parameter count by well under 0.1% and the time
  negligibly, or is a plain assumption: QK-Norm scales, Gemma-2's extra
  post-norms and logit soft-capping, an attention-output bias that
  ``linear_bias`` cannot place, Qwen2-MoE's shared-expert gate, DeepSeek's
  router bias, ALiBi or partial RoPE (priced as RoPE; neither has
  parameters), a sliding window no narrower than the sequence (full
  attention; a narrower one sets ``sliding_window`` and
  ``sliding_window_blocks``), and
  DeepSeek's multi-token-prediction layers (``num_nextn_predict_layers``,
  left out as in ``models/deepseek-v3.json``: the main model, which
  serving prices; the application field ``mtp_layers`` adds them to
  training).
"""

import os

from calculon.config._schema import show as _show
from calculon.errors import ConfigError

#: model_type -> family.  Old Falcon checkpoints call themselves RefinedWeb.
MODEL_TYPES = {
  'llama': 'llama', 'mistral': 'mistral', 'mixtral': 'mixtral',
  'qwen2': 'qwen2', 'qwen2_moe': 'qwen2_moe', 'qwen3': 'qwen3',
  'qwen3_moe': 'qwen3_moe', 'gemma': 'gemma', 'gemma2': 'gemma2',
  'gpt_neox': 'gpt_neox', 'gpt2': 'gpt2', 'falcon': 'falcon',
  'RefinedWeb': 'falcon', 'RefinedWebModel': 'falcon',
  'deepseek_v2': 'deepseek_v2', 'deepseek_v3': 'deepseek_v3',
}
#: architectures[0] -> family, used when model_type is absent.
ARCHITECTURES = {
  'LlamaForCausalLM': 'llama', 'MistralForCausalLM': 'mistral',
  'MixtralForCausalLM': 'mixtral', 'Qwen2ForCausalLM': 'qwen2',
  'Qwen2MoeForCausalLM': 'qwen2_moe', 'Qwen3ForCausalLM': 'qwen3',
  'Qwen3MoeForCausalLM': 'qwen3_moe', 'GemmaForCausalLM': 'gemma',
  'Gemma2ForCausalLM': 'gemma2', 'GPTNeoXForCausalLM': 'gpt_neox',
  'GPT2LMHeadModel': 'gpt2', 'FalconForCausalLM': 'falcon',
  'RWForCausalLM': 'falcon', 'DeepseekV2ForCausalLM': 'deepseek_v2',
  'DeepseekV3ForCausalLM': 'deepseek_v3',
}

_GATED = ('llama', 'mistral', 'mixtral', 'qwen2', 'qwen2_moe', 'qwen3',
          'qwen3_moe', 'gemma', 'gemma2', 'deepseek_v2', 'deepseek_v3')
_LAYERNORM = ('gpt_neox', 'gpt2', 'falcon')
#: tie_word_embeddings when the config leaves it out (the transformers
#: configuration class's default).
_TIED_DEFAULT = {'gemma': True, 'gemma2': True, 'gpt2': True, 'falcon': True}
#: head_dim when the config leaves it out (else hidden / heads).
_HEAD_DIM_DEFAULT = {'gemma': 256, 'gemma2': 256, 'qwen3': 128,
                     'qwen3_moe': 128}
#: Aliases of the common fields (GPT-2's and Falcon's older names).
_ALIASES = {
  'hidden_size': ('hidden_size', 'n_embd'),
  'num_attention_heads': ('num_attention_heads', 'n_head'),
  'num_hidden_layers': ('num_hidden_layers', 'n_layer'),
  'max_position_embeddings': ('max_position_embeddings', 'n_positions',
                              'n_ctx'),
  'num_kv_heads': ('num_kv_heads', 'n_head_kv'),
}
#: Dropout probabilities that belong to other heads than the LM.
_OTHER_DROPOUT = ('summary_first_dropout', 'classifier_dropout')


class _Config:
  """Typed access to a config.json object; every failure is a ConfigError
  naming the file, the field and the value."""

  def __init__(self, obj, source, family):
    self.obj, self.source, self.family = obj, source, family

  def _fail(self, field, value, allowed):
    raise ConfigError(
      f"{self.source}: field '{field}' = {_show(value)} is not allowed: "
      f'{allowed}', source=self.source, field=field, value=value,
      allowed=allowed)

  def has(self, name):
    return any(self.obj.get(k) is not None for k in _ALIASES.get(name,
                                                                 (name,)))

  def raw(self, name, default=None):
    for key in _ALIASES.get(name, (name,)):
      if self.obj.get(key) is not None:
        return key, self.obj[key]
    return name, default

  def int(self, name, default=None, lo=1):
    """An integer >= lo; ``default`` when absent (None: required)."""
    key, value = self.raw(name)
    if value is None:
      if default is not None:
        return default
      raise ConfigError(
        f"{self.source}: missing field '{name}' (an integer >= {lo}; "
        f'model_type {self.family} needs it)', source=self.source,
        field=name, allowed=f'an integer >= {lo}')
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
      self._fail(key, value, f'an integer >= {lo}')
    return value

  def bool(self, name, default):
    key, value = self.raw(name)
    if value is None:
      return default
    if not isinstance(value, bool):
      self._fail(key, value, 'true or false')
    return value

  def int_list(self, name):
    key, value = self.raw(name, [])
    if not isinstance(value, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0
        for v in value):
      self._fail(key, value, 'a list of layer indices (integers >= 0)')
    return value


def family_of(cfg, source):
  """The family (a key of the mapping table) of a decoded config.json.

  Raises:
    ConfigError: not a JSON object, or a model_type / architecture this
      importer does not know.
  """
  if not isinstance(cfg, dict):
    raise ConfigError(f'{source}: not a Hugging Face config (a JSON object '
                      f'with model_type) but {type(cfg).__name__}',
                      source=source)
  known = ', '.join(sorted(set(MODEL_TYPES) - {'RefinedWeb',
                                               'RefinedWebModel'}))
  model_type = cfg.get('model_type')
  if model_type is not None:
    if model_type not in MODEL_TYPES:
      raise ConfigError(
        f"{source}: field 'model_type' = {_show(model_type)} is not "
        f'allowed: calculon import-hf knows {known}', source=source,
        field='model_type', value=model_type, allowed=known)
    return MODEL_TYPES[model_type]
  archs = cfg.get('architectures')
  if isinstance(archs, list) and archs and archs[0] in ARCHITECTURES:
    return ARCHITECTURES[archs[0]]
  if archs:
    raise ConfigError(
      f"{source}: field 'architectures' = {_show(archs)} is not allowed: "
      f'calculon import-hf knows {", ".join(sorted(ARCHITECTURES))} '
      '(or give model_type)', source=source, field='architectures',
      value=archs)
  raise ConfigError(f"{source}: missing field 'model_type' (one of {known})",
                    source=source, field='model_type', allowed=known)


def application_from_hf(cfg, source='config.json', seq=None, name=None):
  """Maps a decoded Hugging Face config.json to a calculon application.

  Args:
    cfg: the decoded config.json (a dict).
    source: the config's file name, used in messages and in the output's
      ``source`` field.
    seq: sequence length (tokens) to use instead of
      ``max_position_embeddings``.
    name: the application's ``name`` (default: ``_name_or_path``, else the
      folder of a ``config.json``, else the file's stem).

  Returns:
    (application dict, notes): the application JSON object (descriptive
    ``name``, ``source`` and ``notes`` first, then the fields of
    :class:`~calculon.config.Application`), and the list of notes (what
    was assumed or left out; also in the object's ``notes``).

  Raises:
    ConfigError: see the module docstring (unknown family, missing or
      malformed field, a feature whose omission would matter).
  """
  family = family_of(cfg, source)
  c = _Config(cfg, source, family)
  notes = []
  h = c.int('hidden_size')
  heads = c.int('num_attention_heads')
  layers = c.int('num_hidden_layers')
  vocab = c.int('vocab_size')
  if seq is None:
    if not c.has('max_position_embeddings'):
      raise ConfigError(
        f"{source}: missing field 'max_position_embeddings' (an integer >= "
        '1): give the sequence length with --seq N', source=source,
        field='max_position_embeddings', allowed='an integer >= 1')
    seq = c.int('max_position_embeddings')
    key, _ = c.raw('max_position_embeddings')
    notes.append(f'seq_size {seq} is the config\'s {key} (the longest '
                 'context the model accepts, not necessarily its training '
                 'sequence length); import with --seq N to choose another.')
  else:
    notes.append(f'seq_size {seq} given on the command line.')

  app = {'hidden': h}
  if family == 'gpt2':
    ffn = c.int('n_inner', default=4 * h)
  elif family == 'falcon':
    ffn = c.int('ffn_hidden_size', default=4 * h)
  else:
    ffn = c.int('intermediate_size')
  if family in ('deepseek_v2', 'deepseek_v3'):
    head_dim = None  # multi-head latent attention: set below
  elif c.has('head_dim'):
    head_dim = c.int('head_dim')
  elif family in _HEAD_DIM_DEFAULT:
    head_dim = _HEAD_DIM_DEFAULT[family]
    notes.append(f'head_dim {head_dim}: the {family} default (the config '
                 'leaves it out).')
  else:
    if h % heads:
      c._fail('num_attention_heads', heads, f'it must divide hidden_size '
              f'({h}) when head_dim is not given')
    head_dim = h // heads
  app.update(feedforward=ffn, seq_size=seq, attn_heads=heads,
             attn_size=head_dim, num_blocks=layers)

  # Attention: K/V heads, or multi-head latent attention.
  if family in ('deepseek_v2', 'deepseek_v3'):
    mla = {'q_lora_rank': None}
    if cfg.get('q_lora_rank') is not None:
      mla['q_lora_rank'] = c.int('q_lora_rank')
    for f in ('kv_lora_rank', 'qk_nope_head_dim', 'qk_rope_head_dim',
              'v_head_dim'):
      mla[f] = c.int(f)
    app['attn_size'] = mla['qk_nope_head_dim'] + mla['qk_rope_head_dim']
  elif family == 'falcon':
    # modeling_falcon.py: the new decoder architecture (Falcon-40B/180B)
    # has num_kv_heads K/V heads; the old one is multi-query or multi-head.
    new_arch = c.bool('new_decoder_architecture',
                      cfg.get('model_type') == 'RefinedWeb')
    if new_arch:
      app['kv_heads'] = c.int('num_kv_heads', default=heads)
    else:
      app['kv_heads'] = 1 if c.bool('multi_query', True) else heads
  elif family in ('gpt_neox', 'gpt2'):
    app['kv_heads'] = heads
  else:
    app['kv_heads'] = c.int('num_key_value_heads', default=heads)

  # MLP, norm, biases, positions, layout.
  app['mlp'] = 'gated' if family in _GATED else 'plain'
  if 'rms_norm_eps' in cfg:
    app['norm'] = 'rmsnorm'
  elif 'layer_norm_eps' in cfg or 'layer_norm_epsilon' in cfg:
    app['norm'] = 'layernorm'
  else:
    app['norm'] = 'layernorm' if family in _LAYERNORM else 'rmsnorm'
  app['linear_bias'] = _linear_bias(c, family, notes)
  app['vocab_size'] = vocab
  app['tied_embeddings'] = c.bool('tie_word_embeddings',
                                  _TIED_DEFAULT.get(family, False))
  if family == 'gpt2':
    app['position_embedding'] = 'learned'
    table = c.int('n_positions', default=seq)
    if table != seq:
      notes.append(f'The learned position table is counted with seq_size = '
                   f'{seq} rows; the checkpoint has n_positions = {table}.')
  else:
    app['position_embedding'] = 'rope'
  if family == 'falcon' and c.bool('alibi', False):
    notes.append('ALiBi positions are priced as RoPE (neither has '
                 'parameters; both are elementwise work).')
  if family == 'gpt_neox':
    pct = cfg.get('rotary_pct', 1.0)
    if isinstance(pct, (int, float)) and pct < 1:
      notes.append(f'Rotary embedding on {pct:g} of each head (rotary_pct) '
                   'is priced as full RoPE.')
  parallel = (family == 'gpt_neox' and c.bool('use_parallel_residual', True)
              ) or (family == 'falcon' and c.bool('parallel_attn', True))
  app['block_layout'] = 'parallel' if parallel else 'sequential'
  if family == 'falcon' and parallel and not new_arch:
    notes.append('This Falcon block has one LayerNorm shared by attention '
                 'and MLP; calculon counts two (2 x hidden more parameters '
                 'per block).')
  app['dropout'] = _dropout(cfg)

  # Mixture of experts.
  if family == 'deepseek_v2' or family == 'deepseek_v3':
    _deepseek(c, app, mla, layers, notes)
  elif family == 'mixtral':
    app.update(num_experts=c.int('num_local_experts'),
               top_k=c.int('num_experts_per_tok'), moe_ffn_hidden=ffn)
  elif family in ('qwen2_moe', 'qwen3_moe'):
    _qwen_moe(c, app, layers, notes)

  _family_notes(c, family, app, layers, notes)
  _sliding_window(c, family, seq, app, layers, notes)

  label = name or cfg.get('_name_or_path') or _default_name(source, family)
  head = {'name': str(label),
          'source': f'Hugging Face config {source} (model_type {family}), '
                    'converted by calculon import-hf',
          'notes': notes}
  head.update(app)
  return head, notes


def _default_name(source, family):
  """The model folder's name for .../NAME/config.json, else the file's stem."""
  path = os.path.abspath(source)
  base = os.path.basename(path)
  if base == 'config.json':
    return os.path.basename(os.path.dirname(path)) or family
  return base.split('.')[0] or family


def _linear_bias(c, family, notes):
  """linear_bias for the family ('all', 'qkv' or 'none')."""
  if family in ('gpt2', 'gpt_neox'):
    return 'all' if c.bool('attention_bias', True) else 'none'
  if family == 'falcon':
    return 'all' if c.bool('bias', False) else 'none'
  if family in ('qwen2', 'qwen2_moe'):
    return 'qkv'
  attn = c.bool('attention_bias', False)
  mlp = c.bool('mlp_bias', False)
  if mlp:
    if not attn:
      notes.append('mlp_bias without attention_bias: priced as biases on '
                   'every linear layer (linear_bias all).')
    return 'all'
  if attn:
    notes.append('attention_bias puts a bias on the output projection too; '
                 'calculon counts the Q, K, V biases only (hidden parameters '
                 'per block left out).')
    return 'qkv'
  return 'none'


def _dropout(cfg):
  """True when a decoder dropout probability is above zero."""
  for key, value in cfg.items():
    if key in _OTHER_DROPOUT or isinstance(value, bool):
      continue
    if ('dropout' in key or key.endswith('_pdrop')) and isinstance(
        value, (int, float)) and value > 0:
      return True
  return False


def _qwen_moe(c, app, layers, notes):
  """Qwen2-MoE / Qwen3-MoE: block i is MoE when i is not in mlp_only_layers
  and (i + 1) % decoder_sparse_step == 0 (modeling_qwen2_moe.py)."""
  experts = c.int('num_experts')
  step = c.int('decoder_sparse_step', default=1)
  dense = c.int_list('mlp_only_layers')
  moe = [i for i in range(layers) if i not in dense and (i + 1) % step == 0]
  if not moe:
    c._fail('num_experts', experts, 'no layer is MoE (check '
            'decoder_sparse_step and mlp_only_layers)')
  first = moe[0] if step == 1 else 0
  if step == 1:
    if moe != list(range(first, layers)):
      c._fail('mlp_only_layers', dense, 'calculon expresses dense layers '
              'only as the first blocks (first_dense_blocks)')
  elif dense or len(moe) != len(range(0, layers, step)):
    c._fail('decoder_sparse_step', step, f'with {layers} layers and '
            f'mlp_only_layers {dense} calculon cannot place the MoE layers')
  app.update(num_experts=experts, top_k=c.int('num_experts_per_tok'),
             moe_ffn_hidden=c.int('moe_intermediate_size'))
  if first:
    app['first_dense_blocks'] = first
  if step > 1:
    app['moe_layer_freq'] = step
    notes.append(f'Every {step}-th block is MoE: calculon places them at '
                 f'blocks 0, {step}, ... (the checkpoint at {step - 1}, '
                 f'{2 * step - 1}, ...); same count.')
  shared = c.int('shared_expert_intermediate_size', default=0, lo=0)
  if shared:
    app.update(shared_experts=1, shared_expert_ffn_hidden=shared)
    notes.append('The shared expert\'s sigmoid gate (hidden x 1 per MoE '
                 'block) is not counted.')


def _deepseek(c, app, mla, layers, notes):
  """DeepSeek-V2/V3: block i is MoE when i >= first_k_dense_replace and
  i % moe_layer_freq == 0 (modeling_deepseek.py)."""
  first = c.int('first_k_dense_replace', default=0, lo=0)
  freq = c.int('moe_layer_freq', default=1)
  experts = c.int('n_routed_experts')
  if first >= layers:
    c._fail('first_k_dense_replace', first, f'it must be < '
            f'num_hidden_layers ({layers})')
  app.update(num_experts=experts, top_k=c.int('num_experts_per_tok'),
             moe_ffn_hidden=c.int('moe_intermediate_size'))
  shared = c.int('n_shared_experts', default=0, lo=0)
  if shared:
    app['shared_experts'] = shared
  if first:
    app['first_dense_blocks'] = first
  if freq > 1:
    app['moe_layer_freq'] = freq
  # Group-limited routing (DeepSeek-V3's node-limited routing: n_group
  # groups, a token's experts from topk_group of them; modeling_deepseek.py
  # group_limited_greedy / noaux_tc); one group means no limit.
  groups = c.int('n_group', default=1)
  if groups > 1:
    app.update(moe_router_num_groups=groups,
               moe_router_group_topk=c.int('topk_group', default=groups))
  app.update({k: v for k, v in mla.items() if v is not None})
  if c.obj.get('topk_method') == 'noaux_tc':
    notes.append('The router\'s per-expert score-correction bias '
                 '(n_routed_experts per MoE block) is not counted.')
  mtp = c.int('num_nextn_predict_layers', default=0, lo=0)
  if mtp:
    notes.append(f'The {mtp} multi-token-prediction layer(s) '
                 '(num_nextn_predict_layers) are left out: this is the main '
                 f'model (add "mtp_layers": {mtp} to price training with '
                 'them).')


def _family_notes(c, family, app, layers, notes):
  d = app['attn_size']
  if family in ('qwen3', 'qwen3_moe'):
    notes.append(f'QK-Norm (an RMSNorm of {d} on each of q and k per block, '
                 f'{2 * d * layers:,} parameters in all) is not modeled.')
  if family == 'gemma2':
    notes.append('Gemma-2\'s post-attention and post-feedforward RMSNorms '
                 f'({2 * app["hidden"] * layers:,} parameters in all) and '
                 'its logit soft-capping are not modeled.')


def _sliding_window(c, family, seq, app, layers, notes):
  """``sliding_window`` and the blocks using it: those ``layer_types``
  marks ``sliding_attention`` (transformers' per-layer list), Gemma 2's
  every other block (even layers, modeling_gemma2.py), Qwen2's blocks from
  ``max_window_layers`` on when ``use_sliding_window``, else every block
  (Mistral).  A window no narrower than the sequence is full attention
  (a note)."""
  window = c.obj.get('sliding_window')
  if window is None:
    return
  if family in ('qwen2', 'qwen2_moe', 'qwen3', 'qwen3_moe') and not \
      c.bool('use_sliding_window', False):
    return
  if isinstance(window, bool) or not isinstance(window, int) or window < 1:
    c._fail('sliding_window', window, 'an integer >= 1 or null')
  if window >= seq:
    notes.append(f'sliding_window {window} >= seq_size {seq}: full '
                 'attention is exact.')
    return
  types = c.obj.get('layer_types')
  if isinstance(types, list) and len(types) == layers:
    blocks = sum(1 for t in types if t == 'sliding_attention')
    how = 'layer_types'
  elif family == 'gemma2':
    blocks, how = (layers + 1) // 2, 'every other block (Gemma 2)'
  elif family in ('qwen2', 'qwen2_moe', 'qwen3', 'qwen3_moe'):
    first = c.int('max_window_layers', layers, lo=0)
    blocks = max(layers - first, 0)
    how = f'blocks from max_window_layers {first} on'
  else:
    blocks, how = layers, 'every block'
  if blocks == 0:
    return
  app['sliding_window'] = window
  if blocks != layers:
    app['sliding_window_blocks'] = blocks
  notes.append(f'sliding_window {window} in {blocks} of {layers} blocks '
               f'({how}).')