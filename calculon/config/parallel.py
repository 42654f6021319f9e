"""The parallel degrees of an execution and what derives from them, in one
place: the engine, the search grids, the published runs' mapping, the
framework constraints and the execution rules all call these functions
(as torchtitan's ``ParallelDims``, torchtitan/distributed/parallel_dims.py,
is the one place its trainer asks).

Provides the derived quantities -- :func:`procs` (TP x PP x DP x CP),
:func:`local_batch`, :func:`num_microbatches`, :func:`tokens_per_microbatch`,
:func:`largest_batch`, :func:`split_blocks` -- and the rules, each a
boolean of whether it holds: :func:`procs_match`, :func:`batch_splits`,
:func:`microbatch_divides`, :func:`tp_divides`, :func:`kv_heads_fit_tp`,
:func:`cp_splits_sequence`, :func:`tp_splits_tokens`,
:func:`interleaving_needs_pp`, :func:`experts_fold`.  Every function takes
scalars or numpy arrays (broadcast) and returns the same; none reads more
than its arguments.

The project's meaning of the degrees (Calculon's, kept): ``data_par`` (DP)
counts the replicas of the weights apart from context parallelism, so the
processors are TP x PP x DP x CP and the gradients are reduced over the
DP x CP ranks (Megatron-Core's data-parallel group with context
parallelism, megatron/core/parallel_state.py); ``batch_size`` is split
over DP alone (the CP ranks of a replica share its samples, each holding
seq / CP of every sequence); experts are folded onto the TP x DP x CP
ranks of a pipeline stage (Megatron-Core MoE parallel folding).

Reads nothing of the project.
"""

import numpy as np


# -- derived quantities --------------------------------------------------------

def procs(tp, pp, dp, cp=1):
  """Processors of an execution: TP x PP x DP x CP."""
  return tp * pp * dp * cp


def local_batch(batch_size, dp):
  """Samples per data-parallel replica per batch: batch / DP (integer)."""
  return batch_size // dp


def num_microbatches(batch_size, dp, microbatch_size):
  """Microbatches of one replica per batch: (batch / DP) / microbatch."""
  return local_batch(batch_size, dp) // microbatch_size


def tokens_per_microbatch(microbatch_size, seq_size, cp=1):
  """Tokens a rank holds of one microbatch: microbatch x seq / CP."""
  return microbatch_size * (seq_size // cp)


def largest_batch(dp, max_batch_size):
  """The largest multiple of DP not above ``max_batch_size`` (scalars;
  None where DP is larger): the batch a search runs at that DP."""
  if dp > max_batch_size:
    return None
  return max_batch_size // dp * dp


def split_blocks(num_blocks, pp):
  """(blocks of the busiest stage, blocks the lightest stages hold less in
  all): ``num_blocks`` over PP stages, the first ``num_blocks mod PP``
  holding one more (Megatron-Core's uneven first stages, torchtitan's
  pipeline split): ceil(L / PP), and PP - (L mod PP) where PP does not
  divide L, else 0."""
  rem = num_blocks % pp
  return (num_blocks // pp + (rem != 0),
          np.where(rem != 0, pp - rem, 0))


# -- rules (True where they hold) ---------------------------------------------

def procs_match(num_procs, tp, pp, dp, cp=1):
  """The processors are TP x PP x DP x CP."""
  return num_procs == procs(tp, pp, dp, cp)


def batch_splits(batch_size, dp):
  """DP divides the batch."""
  return batch_size % dp == 0


def microbatch_divides(batch_size, dp, microbatch_size):
  """The microbatch divides the local batch (batch / DP)."""
  return local_batch(batch_size, dp) % microbatch_size == 0


def tp_divides(size, tp):
  """TP divides an application size (hidden, feedforward, heads:
  Megatron-Core ColumnParallelLinear / RowParallelLinear split them
  evenly)."""
  return size % tp == 0


def kv_heads_fit_tp(kv_heads, tp):
  """The K/V heads are a multiple or a divisor of TP (Megatron-Core:
  num_query_groups % tensor_model_parallel_size == 0, or each group
  replicated over TP / groups ranks)."""
  return (kv_heads % tp == 0) | (tp % kv_heads == 0)


def cp_splits_sequence(seq_size, cp):
  """2 x CP divides the sequence where CP > 1: the causal mask is balanced
  over 2 x CP chunks (Megatron-Core context parallelism,
  Transformer Engine attention's load-balanced ring)."""
  return (cp == 1) | (seq_size % (2 * cp) == 0)


def tp_splits_tokens(tokens, tp):
  """TP divides a microbatch's tokens (sequence parallelism shards them
  over the TP ranks; experts route tokens / TP per rank)."""
  return tokens % tp == 0


def interleaving_needs_pp(pp, vp):
  """Virtual stages only with pipeline parallelism (VP = 1 when PP = 1)."""
  return (pp != 1) | (vp == 1)


def experts_fold(tp, dp, cp, ep, etp):
  """EP x ETP divides TP x DP x CP: the experts are folded onto the ranks
  of a pipeline stage (Megatron-Core MoE parallel folding)."""
  return (tp * dp * cp) % (ep * etp) == 0
