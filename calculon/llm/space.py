"""The space of executions Calculon's search explores, dimension by dimension.

Each function lists the valid values of one dimension given the ones before
it (Calculon's ``Llm.get_*`` helpers); :mod:`calculon.llm.search` combines
them into grids.  The rules on the degrees are
:mod:`calculon.config.parallel`'s.
"""

from calculon.config import parallel as P


def factors(x):
  """Divisors of ``x`` in increasing order."""
  return [c for c in range(1, x + 1) if x % c == 0]


def tensor_parallelisms(num_procs, hidden, attn_heads):
  """TP degrees: divisors of num_procs dividing hidden and attn_heads."""
  return [c for c in factors(num_procs)
          if P.tp_divides(hidden, c) and P.tp_divides(attn_heads, c)]


def pipeline_parallelisms(num_procs, tensor_par, num_blocks):
  """PP degrees: divisors of min(num_procs / TP, blocks) dividing both."""
  max_pp = min(num_procs // tensor_par, num_blocks)
  return [c for c in factors(max_pp)
          if num_procs % (tensor_par * c) == 0 and num_blocks % c == 0]


def only_vocab_split_is_even(num_blocks, stages):
  """Whether ``stages`` (PP, or PP x VP; scalars or arrays) divides the
  blocks plus two (the embedding and the loss counted as a block each) but
  not the blocks alone: Megatron-Core splits evenly or stops
  (transformer_block.py, get_num_layers_to_build), so there it must count
  them.  Never true for 1 or 2 stages."""
  return (num_blocks % stages != 0) & ((num_blocks + 2) % stages == 0)


def data_parallelism(num_procs, tensor_par, pipeline_par):
  """DP degree: the processors left, num_procs / (TP * PP)."""
  return num_procs // P.procs(tensor_par, pipeline_par, 1)


def pipeline_interleavings(num_blocks, pipeline_par):
  """Interleaving factors: divisors of blocks / PP (1 without PP)."""
  if pipeline_par == 1:
    return [1]
  return factors(num_blocks // pipeline_par)


def microbatch_sizes(seq_size, tensor_par, data_par, global_batch_size,
                     pipeline_par=None):
  """Microbatch sizes: divisors of the local batch whose tokens split
  evenly over TP."""
  local = P.local_batch(global_batch_size, data_par)
  return [c for c in factors(local) if P.tp_splits_tokens(
    P.tokens_per_microbatch(c, seq_size), tensor_par)]


def can_redo_ag(tensor_par_comm_type, activation_recompute):
  """The all-gather can be redone only with sequence parallelism and without
  full recomputation."""
  return tensor_par_comm_type == 'rs_ag' and activation_recompute != 'full'


def batch_size_for(data_par, max_batch_size):
  """The largest multiple of DP not above ``max_batch_size`` (None if DP is
  larger)."""
  return P.largest_batch(data_par, max_batch_size)
