"""The application (transformer model) configuration.

Calculon's six fields describe the GPT-3 block of 2021.  Optional fields
describe how LLMs are built today (grouped-query and multi-head latent
attention, gated MLPs, RMSNorm, vocabularies, Mixture-of-Experts, sliding
windows); each one, when absent, means exactly what Calculon means, so
every Calculon file keeps giving Calculon's numbers.  Every field, its
values, its absent meaning and its source are in the field registry
(:data:`calculon.config.registry.APPLICATION`, listed in
docs/reference/applications.md); :class:`Application` checks how they
combine.
"""

from collections import OrderedDict

from calculon.config._record import frozen_record
from calculon.config._schema import Reader, Spec, show
from calculon.errors import ConfigError


# Vocabulary size used by the reference's parameter count for the embedding
# table (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training
# on GPU Clusters Using Megatron-LM", SC'21, eq. 2 uses V = 51200).
EMBEDDING_VOCAB = 51200

from calculon.config import registry as _registry
from calculon.config.registry import (  # noqa: F401 -- re-exported
  BIAS_NAMES, LAYOUT_NAMES, MLP_NAMES, NORM_NAMES, POSITION_NAMES)

#: Optional fields: name -> (spec, default), from the field registry
#: (:data:`calculon.config.registry.APPLICATION`).  Defaults mean Calculon.
OPTIONAL = OrderedDict((f.name, (f.spec, f.absent))
                       for f in _registry.APPLICATION if not f.calculon)

#: Every name an application file may carry (for the did-you-mean).
KNOWN = tuple(_registry.FIELDS['application']) + Reader.META_FIELDS

MOE_FIELDS = ('top_k', 'moe_ffn_hidden', 'shared_experts',
              'shared_expert_ffn_hidden', 'first_dense_blocks',
              'moe_layer_freq', 'capacity_factor', 'moe_router_num_groups',
              'moe_router_group_topk')
MLA_FIELDS = ('kv_lora_rank', 'qk_nope_head_dim', 'qk_rope_head_dim',
              'v_head_dim')


def router_groups_fit(num_experts, top_k, groups, group_topk):
  """Whether group-limited routing (``groups`` groups of consecutive
  experts, a token's ``top_k`` experts from ``group_topk`` of them) fits
  ``num_experts`` experts: the groups divide them and the chosen groups
  hold top_k experts.  Returns None when it fits, else (the field at
  fault, what it must satisfy)."""
  if num_experts % groups != 0:
    return ('moe_router_num_groups',
            f'it must divide num_experts ({num_experts})')
  if group_topk > groups:
    return ('moe_router_group_topk',
            f'it must be <= moe_router_num_groups ({groups})')
  if top_k > group_topk * (num_experts // groups):
    return ('moe_router_group_topk', f'its {group_topk} group(s) of '
            f'{num_experts // groups} experts must hold top_k ({top_k}) '
            'experts')
  return None


@frozen_record
class Application:
  """Shape of a decoder-only transformer.

  Required fields (integers >= 1):
    hidden: model width h (elements).
    feedforward: MLP inner width f (elements), usually 4h (plain) or about
      8h/3 (gated; the width of each of the gate and up GEMMs).
    seq_size: sequence length s (tokens).
    attn_heads: number of query heads a.
    attn_size: width of one head d (elements), usually h / a.
    num_blocks: number of transformer blocks (layers) L.

  Optional fields: see the module docstring (:data:`OPTIONAL`).

  Raises (from :meth:`from_dict`):
    ConfigError: a field is missing, unknown, of the wrong type, or the
      fields contradict each other (kv_heads must divide attn_heads;
      tied_embeddings and position_embedding need vocab_size).
  """
  hidden: int
  feedforward: int
  seq_size: int
  attn_heads: int
  attn_size: int
  num_blocks: int
  kv_heads: object = None
  mlp: str = 'plain'
  norm: str = 'layernorm'
  linear_bias: str = 'all'
  vocab_size: object = None
  tied_embeddings: bool = False
  position_embedding: object = None
  block_layout: str = 'sequential'
  dropout: bool = True
  num_experts: object = None
  top_k: object = None
  moe_ffn_hidden: object = None
  shared_experts: int = 0
  shared_expert_ffn_hidden: object = None
  first_dense_blocks: int = 0
  moe_layer_freq: int = 1
  capacity_factor: object = None
  moe_router_num_groups: object = None
  moe_router_group_topk: object = None
  q_lora_rank: object = None
  kv_lora_rank: object = None
  qk_nope_head_dim: object = None
  qk_rope_head_dim: object = None
  v_head_dim: object = None
  sliding_window: object = None
  sliding_window_blocks: object = None
  mtp_layers: int = 0

  FIELDS = ('hidden', 'feedforward', 'seq_size', 'attn_heads', 'attn_size',
            'num_blocks')

  @classmethod
  def from_dict(cls, cfg, source='<application>'):
    """Builds an Application from its JSON object.

    Raises:
      ConfigError: see the class docstring.
    """
    reader = Reader(cfg, source, known=KNOWN)
    specs = {name: _registry.field('application', name).spec
             for name in cls.FIELDS}
    reader.check_names(specs)
    values = {name: reader.get(name, specs[name]) for name in cls.FIELDS}
    for name, (spec, default) in OPTIONAL.items():
      if name in cfg:
        values[name] = reader.get(name, spec)
    reader.meta()
    reader.finish()
    app = cls(**values)
    app._check(source)
    return app

  def _check(self, source):
    def fail(name, allowed):
      value = getattr(self, name)
      raise ConfigError(
        f"{source}: field '{name}' = {show(value)} is not allowed: {allowed}",
        source=source, field=name, value=value, allowed=allowed)
    if self.kv_heads is not None and self.attn_heads % self.kv_heads != 0:
      fail('kv_heads', f'it must divide attn_heads ({self.attn_heads})')
    if self.vocab_size is None:
      if self.tied_embeddings:
        fail('tied_embeddings', 'true needs vocab_size (there is no '
             'embedding without a vocabulary)')
      if self.position_embedding is not None:
        fail('position_embedding', 'it needs vocab_size (position '
             'embeddings belong to the embedding stage)')
      if self.mtp_layers:
        fail('mtp_layers', 'it needs vocab_size (a multi-token prediction '
             'module predicts through the LM head)')
    if self.num_experts is None:
      for name in MOE_FIELDS:
        if getattr(self, name) != OPTIONAL[name][1]:
          fail(name, 'it needs num_experts (a Mixture-of-Experts field)')
    else:
      for name in ('top_k', 'moe_ffn_hidden'):
        if getattr(self, name) is None:
          raise ConfigError(
            f"{source}: missing field '{name}' (an integer >= 1): a "
            'Mixture-of-Experts application (num_experts is set) needs it',
            source=source, field=name, allowed='an integer >= 1')
      if self.top_k > self.num_experts:
        fail('top_k', f'it must be <= num_experts ({self.num_experts})')
      if self.first_dense_blocks >= self.num_blocks:
        fail('first_dense_blocks', f'it must be < num_blocks '
             f'({self.num_blocks}) so that some block is MoE')
      if self.shared_experts == 0 and self.shared_expert_ffn_hidden:
        fail('shared_expert_ffn_hidden', 'it needs shared_experts >= 1')
      groups, group_topk = self.moe_router_num_groups, \
        self.moe_router_group_topk
      if (groups is None) != (group_topk is None):
        fail('moe_router_group_topk' if groups is not None else
             'moe_router_num_groups', 'group-limited routing needs both '
             'moe_router_num_groups and moe_router_group_topk')
      misfit = groups is not None and router_groups_fit(
        self.num_experts, self.top_k, groups, group_topk)
      if misfit:
        fail(*misfit)
    if self.sliding_window is None and self.sliding_window_blocks is not None:
      fail('sliding_window_blocks', 'it needs sliding_window (the blocks '
           'that attend over a window)')
    if self.sliding_window_blocks is not None and \
        self.sliding_window_blocks > self.num_blocks:
      fail('sliding_window_blocks', f'it must be <= num_blocks '
           f'({self.num_blocks})')
    mla = [getattr(self, n) is not None for n in MLA_FIELDS]
    if any(mla) or self.q_lora_rank is not None:
      for name, there in zip(MLA_FIELDS, mla):
        if not there:
          raise ConfigError(
            f"{source}: missing field '{name}' (an integer >= 1): "
            'multi-head latent attention needs kv_lora_rank, '
            'qk_nope_head_dim, qk_rope_head_dim and v_head_dim',
            source=source, field=name, allowed='an integer >= 1')
      if self.kv_heads is not None:
        fail('kv_heads', 'it does not apply to multi-head latent attention '
             '(leave it out)')
      want = self.qk_nope_head_dim + self.qk_rope_head_dim
      if self.attn_size != want:
        fail('attn_size', f'with multi-head latent attention it must be '
             f'qk_nope_head_dim + qk_rope_head_dim = {want}')

  def to_dict(self):
    """The JSON object of this application (optional fields only when they
    differ from their default)."""
    out = {name: getattr(self, name) for name in self.FIELDS}
    for name, (_, default) in OPTIONAL.items():
      value = getattr(self, name)
      if value != default:
        out[name] = value
    return out

  # -- derived shape -------------------------------------------------------------
  @property
  def is_calculon(self):
    """True when no optional field is set (Calculon's application)."""
    return all(getattr(self, n) == d for n, (_, d) in OPTIONAL.items())

  @property
  def gated(self):
    return self.mlp == 'gated'

  @property
  def has_vocab(self):
    return self.vocab_size is not None

  @property
  def pos_embedding(self):
    """'learned', 'rope' or None (no embedding stage)."""
    if not self.has_vocab:
      return None
    return self.position_embedding or 'learned'

  @property
  def is_moe(self):
    return self.num_experts is not None

  @property
  def windowed_share(self):
    """Share of the blocks attending over ``sliding_window`` (0 without
    a window)."""
    if self.sliding_window is None:
      return 0.0
    blocks = self.num_blocks if self.sliding_window_blocks is None else \
      self.sliding_window_blocks
    return blocks / self.num_blocks

  @property
  def is_mla(self):
    return self.kv_lora_rank is not None

  @property
  def shared_ffn(self):
    """Total width of the shared experts (0 without)."""
    if not self.is_moe or not self.shared_experts:
      return 0
    return self.shared_experts * (self.shared_expert_ffn_hidden or
                                  self.moe_ffn_hidden)

  @property
  def num_moe_blocks(self):
    """Blocks whose MLP is MoE: after ``first_dense_blocks``, every
    ``moe_layer_freq``-th block (Megatron-LM ``--moe-layer-freq k``: block i
    is MoE when i % k == 0, counted from the first block)."""
    if not self.is_moe:
      return 0
    # Multiples of k in [first, L): ceil(L / k) - ceil(first / k), a
    # closed form (a loop over the blocks is unbounded in L).
    k = self.moe_layer_freq
    first = min(self.first_dense_blocks, self.num_blocks)
    return -(-self.num_blocks // k) - -(-first // k)

  def block_is_moe(self, i):
    """Whether block ``i`` (from 0) has a MoE MLP: after
    ``first_dense_blocks``, when i % ``moe_layer_freq`` == 0 (the rule
    :attr:`num_moe_blocks` counts)."""
    return self.is_moe and i >= self.first_dense_blocks and \
      i % self.moe_layer_freq == 0

  @property
  def num_dense_blocks(self):
    return self.num_blocks - self.num_moe_blocks

  @property
  def query_width(self):
    """q = a * d: width of the query (and attention output) projection."""
    return self.attn_heads * self.attn_size

  def kv_heads_for(self, multiquery=False):
    """K/V heads: ``kv_heads`` when given, else 1 for multi-query and
    ``attn_heads`` for multi-head (Calculon's ``attention_type``)."""
    if self.kv_heads is not None:
      return self.kv_heads
    return 1 if multiquery else self.attn_heads

  # -- parameters ------------------------------------------------------------------
  def _norm_params(self):
    return (1 if self.norm == 'rmsnorm' else 2) * self.hidden

  def _attention_parameters(self, kv_heads=None):
    """Attention weights (and biases) of one block."""
    h, d = self.hidden, self.attn_size
    q = self.query_width
    if self.is_mla:
      # Megatron-LM theoretical_memory_usage.py (MLA branch); the LoRA
      # norms are RMSNorm scales.
      a, dn, dr, dv = (self.attn_heads, self.qk_nope_head_dim,
                       self.qk_rope_head_dim, self.v_head_dim)
      n = 1 if self.norm == 'rmsnorm' else 2
      if self.q_lora_rank is not None:
        attn = self.q_lora_rank * (h + a * (dn + dr) + n)
      else:
        attn = h * a * (dn + dr)
      attn += self.kv_lora_rank * (h + a * (dn + dv) + n) + h * dr
      attn += a * dv * h
      return attn
    g = self.kv_heads_for() if kv_heads is None else kv_heads
    kv = g * d
    attn = 2 * h * q + 2 * h * kv
    if self.linear_bias in ('all', 'qkv'):
      attn += q + 2 * kv
    if self.linear_bias == 'all':
      attn += h
    return attn

  def _mlp_parameters(self, width):
    """Weights (and biases) of one MLP (or expert) of inner ``width``."""
    h = self.hidden
    mlp = (3 if self.gated else 2) * h * width
    if self.linear_bias == 'all':
      mlp += (2 if self.gated else 1) * width + h
    return mlp

  def moe_parameter_breakdown(self, active=False):
    """Parameters of one MoE block's MLP part (elements): 'router' (h x E),
    'experts' (E routed experts, or the k a token uses when ``active``),
    'shared_experts'.  Formulas: Megatron-LM theoretical_memory_usage.py
    (routed, shared and router parameters)."""
    experts = self.top_k if active else self.num_experts
    return OrderedDict([
      ('router', self.hidden * self.num_experts),
      ('experts', experts * self._mlp_parameters(self.moe_ffn_hidden)),
      ('shared_experts', self.shared_experts * self._mlp_parameters(
        self.shared_expert_ffn_hidden or self.moe_ffn_hidden)
       if self.shared_experts else 0)])

  def block_parameter_breakdown(self, kv_heads=None):
    """Parameters of one block by part (elements), an ordered dict with
    keys 'attention', 'mlp', 'norms'.

    Formulas (Megatron-LM ``compute_weight_and_optimizer_memory``,
    megatron/training/theoretical_memory_usage.py; biases as Calculon
    counts them): attention Q and O are h x q, K and V are h x g d (g K/V
    heads); a plain MLP has 2 h f weights, a gated one 3 h f; a LayerNorm
    has a scale and a bias (2h), an RMSNorm a scale (h); two norms per
    block.
    """
    return OrderedDict([('attention', self._attention_parameters(kv_heads)),
                        ('mlp', self._mlp_parameters(self.feedforward)),
                        ('norms', 2 * self._norm_params())])

  def block_parameters(self):
    """Trainable parameters of one transformer block (elements): attention
    and MLP weights, their biases and two norms."""
    return sum(self.block_parameter_breakdown().values())

  def parameter_breakdown(self, active=False):
    """Every trainable parameter by part (elements), an ordered dict:
    'embedding' (token table, plus the learned position table), 'attention',
    'mlp' (dense blocks' MLPs), 'router', 'experts', 'shared_experts' (MoE
    blocks; only with experts), 'norms' (the blocks' and the final norm),
    'lm_head' (0 when tied to the embedding).  ``active``: the parameters a
    token uses (top_k routed experts instead of all).

    Without a vocabulary (Calculon's application) the embedding is
    Calculon's: V = 51,200 plus learned positions (Narayanan et al. 2021,
    eq. 2), and there is no final norm or head.
    """
    L, h = self.num_blocks, self.hidden
    block = self.block_parameter_breakdown()
    out = OrderedDict()
    if self.has_vocab:
      pos = self.seq_size * h if self.pos_embedding == 'learned' else 0
      out['embedding'] = self.vocab_size * h + pos
    else:
      out['embedding'] = (EMBEDDING_VOCAB + self.seq_size) * h
    out['attention'] = block['attention'] * L
    out['mlp'] = block['mlp'] * self.num_dense_blocks
    if self.is_moe:
      for part, n in self.moe_parameter_breakdown(active).items():
        out[part] = n * self.num_moe_blocks
    out['norms'] = block['norms'] * L + (self._norm_params()
                                         if self.has_vocab else 0)
    out['lm_head'] = self.vocab_size * h if (
      self.has_vocab and not self.tied_embeddings) else 0
    return out

  def num_active_parameters(self):
    """Parameters a token uses (MoE: top_k of the routed experts); equal
    to :meth:`num_parameters` for dense models."""
    return sum(self.parameter_breakdown(active=True).values())

  def num_parameters(self):
    """Number of trainable parameters (elements).

    Formula: Narayanan et al. 2021 (SC'21), equation 2, written out per
    block (:meth:`block_parameters`) plus the embedding table and learned
    position embeddings; with a vocabulary, also the final norm and the
    untied LM head (see :meth:`parameter_breakdown`).
    """
    return sum(self.parameter_breakdown().values())


def optional_field_names():
  """Names of the optional application fields."""
  return tuple(OPTIONAL)

