"""The application (transformer model) configuration."""

from dataclasses import dataclass, asdict

from calculon.config._schema import Reader, Spec

_POSITIVE_INT = Spec('int', lo=1)

# Vocabulary size used by the reference's parameter count for the embedding
# table (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training
# on GPU Clusters Using Megatron-LM", SC'21, eq. 2 uses V = 51200).
EMBEDDING_VOCAB = 51200


@dataclass(frozen=True)
class Application:
  """Shape of a decoder-only transformer.

  Fields (all integers >= 1):
    hidden: model width h (elements).
    feedforward: MLP inner width (elements), usually 4h.
    seq_size: sequence length s (tokens).
    attn_heads: number of attention heads a.
    attn_size: width of one attention head (elements), usually h / a.
    num_blocks: number of transformer blocks (layers) L.
  """
  hidden: int
  feedforward: int
  seq_size: int
  attn_heads: int
  attn_size: int
  num_blocks: int

  FIELDS = ('hidden', 'feedforward', 'seq_size', 'attn_heads', 'attn_size',
            'num_blocks')

  @classmethod
  def from_dict(cls, cfg, source='<application>'):
    """Builds an Application from its JSON object.

    Raises:
      ConfigError: a field is missing, unknown, or not an integer >= 1.
    """
    reader = Reader(cfg, source)
    values = {name: reader.get(name, _POSITIVE_INT) for name in cls.FIELDS}
    reader.finish()
    return cls(**values)

  def to_dict(self):
    """The JSON object of this application."""
    return asdict(self)

  def block_parameters(self):
    """Trainable parameters of one transformer block (elements): MLP and
    attention weights, their biases and two layer norms."""
    h, f = self.hidden, self.feedforward
    attn = self.attn_heads * self.attn_size
    return (2 * h * f + 4 * h * attn      # weights
            + h + f                        # MLP biases
            + 3 * attn + h                 # attention biases
            + 2 * 2 * h)                   # two layer norms

  def num_parameters(self):
    """Number of trainable parameters (elements).

    Formula: Narayanan et al. 2021 (SC'21), equation 2, written out per
    block (:meth:`block_parameters`) plus the embedding table (vocabulary
    51,200) and learned position embeddings.
    """
    return self.block_parameters() * self.num_blocks + \
      (EMBEDDING_VOCAB + self.seq_size) * self.hidden
