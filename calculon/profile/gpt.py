"""A Megatron-style GPT block in PyTorch whose modules are calculon's layers.

Each module carries the name of the layer of calculon/llm/block.py it runs
(``AttnBlock_Query``, ``MlpBlock_Mlp1``...), so a measurement per module is a
measurement per calculon layer.  The block follows Megatron-LM's
``ParallelTransformerLayer`` (Shoeybi et al. 2019; Korthikanti et al. 2022,
figure 4): layer norm, Q/K/V projections, scores Q K^T / sqrt(d), softmax,
dropout, context, output projection, dropout, residual; layer norm, MLP
(h -> ff, GeLU, ff -> h), dropout, residual.  Weights are random (nothing to
download); there is no embedding or output head, as calculon models the
transformer blocks only.

Calculon's ``Fork`` layers (one activation handed to several users) have no
module: their backward cost is the gradient accumulation the autograd
engine does between modules.
"""

import math

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from calculon.profile.layer_names import (  # noqa: F401 (re-exported)
  ATTN_LAYERS, GEMM_LAYERS, LAYERS, MLP_LAYERS)


def _heads(x, heads, head_size):
  """(b, s, heads x d) -> contiguous (b, heads, s, d): a small copy that
  lets the batched GEMM run on contiguous operands."""
  b, s, _ = x.shape
  return x.view(b, s, heads, head_size).transpose(1, 2).contiguous()


class Scores(nn.Module):
  """Attention scores (Q / sqrt(head size)) K^T, per head (calculon's
  ``AttnBlock_Multihead_Key_Query`` batched GEMM).  The scale is applied
  to Q, not to the s x s scores (Megatron folds it into ``baddbmm``'s
  alpha), so no extra pass over the scores."""

  def __init__(self, heads, kv_heads, head_size):
    super().__init__()
    self.heads, self.kv_heads, self.head_size = heads, kv_heads, head_size

  def forward(self, q, k):
    q = _heads(q * (1.0 / math.sqrt(self.head_size)), self.heads,
               self.head_size)
    k = _heads(k, self.kv_heads, self.head_size)
    return torch.matmul(q, k.transpose(2, 3))


class Context(nn.Module):
  """Attention-weighted values, heads merged back (calculon's
  ``AttnBlock_Multihead_Attn`` batched GEMM)."""

  def __init__(self, heads, kv_heads, head_size):
    super().__init__()
    self.heads, self.kv_heads, self.head_size = heads, kv_heads, head_size

  def forward(self, probs, v):
    b, _, s, _ = probs.shape
    ctx = torch.matmul(probs, _heads(v, self.kv_heads, self.head_size))
    return ctx.transpose(1, 2).reshape(b, s, self.heads * self.head_size)


class Softmax(nn.Module):
  def forward(self, x):
    return torch.softmax(x, dim=-1)


class Residual(nn.Module):
  def forward(self, x, y):
    return x + y


class AttnCore(nn.Module):
  """Scores, softmax and dropout: what ``attn_only`` recomputation redoes
  (calculon: the layers with ``recompute=attn_re``)."""

  def __init__(self, heads, kv_heads, head_size, dropout, recompute):
    super().__init__()
    self.scores = Scores(heads, kv_heads, head_size)
    self.softmax = Softmax()
    self.dropout = nn.Dropout(dropout)
    self.recompute = recompute

  def _run(self, q, k):
    return self.dropout(self.softmax(self.scores(q, k)))

  def forward(self, q, k):
    if self.recompute and torch.is_grad_enabled():
      return checkpoint(self._run, q, k, use_reentrant=False)
    return self._run(q, k)


class Block(nn.Module):
  """One transformer block (see the module docstring).

  Args:
    hidden, feedforward, heads, head_size: the application's shape.
    multiquery: one shared key/value head (calculon's ``multiquery``).
    dropout: probability of the three dropout layers.
    recompute: 'none', 'attn_only' or 'full'.
  """

  def __init__(self, hidden, feedforward, heads, head_size, multiquery=False,
               dropout=0.0, recompute='none'):
    super().__init__()
    width = heads * head_size
    kv_heads = 1 if multiquery else heads
    self.recompute = recompute
    self.attn_norm = nn.LayerNorm(hidden)
    self.query = nn.Linear(hidden, width)
    self.key = nn.Linear(hidden, kv_heads * head_size)
    self.value = nn.Linear(hidden, kv_heads * head_size)
    self.core = AttnCore(heads, kv_heads, head_size, dropout,
                         recompute == 'attn_only')
    self.context = Context(heads, kv_heads, head_size)
    self.proj = nn.Linear(width, hidden)
    self.attn_dropout = nn.Dropout(dropout)
    self.attn_residual = Residual()
    self.mlp_norm = nn.LayerNorm(hidden)
    self.mlp1 = nn.Linear(hidden, feedforward)
    self.gelu = nn.GELU()
    self.mlp2 = nn.Linear(feedforward, hidden)
    self.mlp_dropout = nn.Dropout(dropout)
    self.mlp_residual = Residual()

  def layer_modules(self):
    """(calculon layer name, module) pairs."""
    return [('AttnBlock_LayerNorm', self.attn_norm),
            ('AttnBlock_Query', self.query), ('AttnBlock_Key', self.key),
            ('AttnBlock_Value', self.value),
            ('AttnBlock_Multihead_Key_Query', self.core.scores),
            ('AttnBlock_Multihead_SoftMax', self.core.softmax),
            ('AttnBlock_Multihead_DropOut', self.core.dropout),
            ('AttnBlock_Multihead_Attn', self.context),
            ('AttnBlock_MLP', self.proj),
            ('AttnBlock_DropOut', self.attn_dropout),
            ('AttnBlock_Residual', self.attn_residual),
            ('MlpBlock_LayerNorm', self.mlp_norm),
            ('MlpBlock_Mlp1', self.mlp1), ('MlpBlock_GeLU', self.gelu),
            ('MlpBlock_Mlp2', self.mlp2),
            ('MlpBlock_DropOut', self.mlp_dropout),
            ('MlpBlock_Residual', self.mlp_residual)]

  def _run(self, x):
    y = self.attn_norm(x)
    probs = self.core(self.query(y), self.key(y))
    attn = self.attn_dropout(self.proj(self.context(probs, self.value(y))))
    x = self.attn_residual(x, attn)
    y = self.mlp_norm(x)
    mlp = self.mlp_dropout(self.mlp2(self.gelu(self.mlp1(y))))
    return self.mlp_residual(x, mlp)

  def forward(self, x):
    if self.recompute == 'full' and torch.is_grad_enabled():
      return checkpoint(self._run, x, use_reentrant=False)
    return self._run(x)


class BlockStack(nn.Module):
  """``num_blocks`` blocks in sequence."""

  def __init__(self, num_blocks, **kw):
    super().__init__()
    self.blocks = nn.ModuleList(Block(**kw) for _ in range(num_blocks))

  def forward(self, x):
    for block in self.blocks:
      x = block(x)
    return x
