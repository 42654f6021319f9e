"""What a framework requires of an execution, beyond what it supports.

Provides :class:`Constraint` (one check a preset names, with its source)
and :data:`KINDS` (the checks, each vectorized over execution columns).
Reads :mod:`calculon.config.execution` (the columns' fields).

A preset lists its constraints as ``{"check": KIND, "value": N, "source":
"..."}``.  The search leaves executions that break one out of the space
(they are not counted); a single execution that breaks one is refused with
a message naming the check and its source.
"""

import numpy as np

from calculon.errors import ConfigError


def _microbatches(c):
  from calculon.config.parallel import num_microbatches
  return num_microbatches(c.batch_size, c.data_par, c.microbatch_size)


def _interleaved_microbatches_multiple_of_pp(c, app, value):
  return (c.pipeline_interleaving > 1) & (_microbatches(c) % c.pipeline_par
                                          != 0)


def _interleaved_min_pp(c, app, value):
  return (c.pipeline_interleaving > 1) & (c.pipeline_par < value)


def _microbatches_at_least_pp(c, app, value):
  return (c.pipeline_par > 1) & (_microbatches(c) < c.pipeline_par)


def _interleaved_min_blocks_per_stage(c, app, value):
  blocks = -(-app.num_blocks // c.pipeline_par)
  return (c.pipeline_interleaving > 1) & (
    blocks // np.maximum(c.pipeline_interleaving, 1) < value)


def _expert_overlap_needs_interleaving(c, app, value):
  from calculon.config.execution import MOE_OVERLAP_COMPUTE
  return (np.asarray(c.moe_comm_overlap) == MOE_OVERLAP_COMPUTE) & (
    c.pipeline_par > 1) & (c.pipeline_interleaving <= 1)


def _expert_overlap_without_full_recompute(c, app, value):
  from calculon.config.execution import MOE_OVERLAP_COMPUTE, RECOMPUTE_FULL
  return (np.asarray(c.moe_comm_overlap) == MOE_OVERLAP_COMPUTE) & (
    c.activation_recompute == RECOMPUTE_FULL)


def _expert_overlap_without_moe_recompute(c, app, value):
  from calculon.config.execution import MOE_OVERLAP_COMPUTE, \
    recomputes_module
  return (np.asarray(c.moe_comm_overlap) == MOE_OVERLAP_COMPUTE) & \
    recomputes_module(c, 'moe')


def _expert_overlap_without_activation_offload(c, app, value):
  from calculon.config.execution import MOE_OVERLAP_COMPUTE
  return (np.asarray(c.moe_comm_overlap) == MOE_OVERLAP_COMPUTE) & \
    np.asarray(c.activations_offload, dtype=bool)


def _expert_overlap_with_fsdp_needs_pp1(c, app, value):
  from calculon.config.execution import MOE_OVERLAP_COMPUTE, SHARD_GRADIENTS
  return (np.asarray(c.moe_comm_overlap) == MOE_OVERLAP_COMPUTE) & (
    np.asarray(c.sharding) >= SHARD_GRADIENTS) & (c.pipeline_par > 1)


def _activation_offload_without_pp_or_recompute(c, app, value):
  from calculon.config.execution import RECOMPUTE_NONE
  return np.asarray(c.activations_offload, dtype=bool) & (
    (c.pipeline_par > 1) | (c.activation_recompute != RECOMPUTE_NONE))


def _activation_offload_needs_full_recompute(c, app, value):
  from calculon.config.execution import RECOMPUTE_FULL
  return np.asarray(c.activations_offload, dtype=bool) & (
    c.activation_recompute != RECOMPUTE_FULL)


def _layer_graphs_without_activation_offload(c, app, value):
  from calculon.config.registry import CUDA_GRAPH_NAMES
  return np.asarray(c.activations_offload, dtype=bool) & (
    np.asarray(c.cuda_graphs) == CUDA_GRAPH_NAMES.index('layers'))


def _weight_offload_needs_parameter_sharding(c, app, value):
  from calculon.config.execution import SHARD_PARAMETERS
  return np.asarray(c.weight_offload, dtype=bool) & (
    c.sharding != SHARD_PARAMETERS)


def _tp_overlap_without_sequence_parallel(c, app, value):
  from calculon.config.execution import TP_COMM_RS_AG, TP_OVERLAP_NONE
  return (np.asarray(c.tensor_par_overlap) != TP_OVERLAP_NONE) & (
    np.asarray(c.tensor_par_comm_type) != TP_COMM_RS_AG)


def _tp_overlap_without_float4(c, app, value):
  from calculon.config.execution import DATATYPE_NAMES, TP_OVERLAP_NONE
  return (np.asarray(c.tensor_par_overlap) != TP_OVERLAP_NONE) & (
    np.asarray(c.datatype) == DATATYPE_NAMES.index('float4'))


def _split_not_buildable(c, app, value):
  """Splits a Megatron-Core without layer layouts cannot build
  (megatron/core/transformer/transformer_block.py get_num_layers_to_build
  before core_r0.11.0, the era that names this check): the layers evenly
  over PP and each rank's over VP; or one uneven first or last stage
  (num_layers_in_first/last_pipeline_stage) whose layers, like every
  middle stage's, VP divides (the embedding and the loss are not counted
  in the split before core_r0.11.0).  The
  engine's uneven split gives the first L mod PP stages one block more: a
  single first stage (L mod PP = 1) or all but the last (L mod PP = PP -
  1), and only with VP = 1 (VP would divide both ceil(L / PP) and
  ceil(L / PP) - 1).  From core_v0.13.0 pipeline_model_parallel_layout
  (transformer/pipeline_parallel_layer_layout.py) builds any split the
  engine prices, so a preset of that era does not name this check."""
  pp = np.asarray(c.pipeline_par)
  vp = np.maximum(np.asarray(c.pipeline_interleaving), 1)
  blocks = app.num_blocks
  even = blocks % (pp * vp) == 0
  rem = blocks % pp
  one_edge = (vp == 1) & ((rem == 1) | (rem == pp - 1))
  return (pp > 1) & ~even & ~one_edge


#: kind -> (bad(columns, application, value) -> bool array, text of what is
#: required (``{value}`` substituted), needs a value, the field a refusal
#: names).
KINDS = {
  'interleaved_microbatches_multiple_of_pp': (
    _interleaved_microbatches_multiple_of_pp,
    'with pipeline_interleaving > 1 the microbatches per replica '
    '(batch_size / data_par / microbatch_size) must be a multiple of '
    'pipeline_par', False,
    'pipeline_interleaving'),
  'interleaved_min_pp': (
    _interleaved_min_pp,
    'pipeline_interleaving > 1 needs pipeline_par >= {value}', True,
    'pipeline_interleaving'),
  'microbatches_at_least_pp': (
    _microbatches_at_least_pp,
    'with pipeline_par > 1 the microbatches per replica must be at least '
    'pipeline_par', False,
    'microbatch_size'),
  'activation_offload_without_pp_or_recompute': (
    _activation_offload_without_pp_or_recompute,
    'activations offload only with pipeline_par = 1 and no recomputation',
    False, 'activations_offload'),
  'activation_offload_needs_full_recompute': (
    _activation_offload_needs_full_recompute,
    'activations offload only of the checkpoints of full recomputation',
    False, 'activations_offload'),
  'layer_graphs_without_activation_offload': (
    _layer_graphs_without_activation_offload,
    'activations offload not with cuda_graphs "layers"', False,
    'activations_offload'),
  'tp_overlap_without_float4': (
    _tp_overlap_without_float4,
    'tensor_par_overlap "ring" or "pipe" not with datatype "float4"', False,
    'tensor_par_overlap'),
  'weight_offload_needs_parameter_sharding': (
    _weight_offload_needs_parameter_sharding,
    'weights offload only with data_par_sharding "parameters"', False,
    'weight_offload'),
  'expert_overlap_needs_interleaving': (
    _expert_overlap_needs_interleaving,
    'moe_comm_overlap "compute" with pipeline_par > 1 needs '
    'pipeline_interleaving > 1', False,
    'moe_comm_overlap'),
  'expert_overlap_without_full_recompute': (
    _expert_overlap_without_full_recompute,
    'moe_comm_overlap "compute" only without full recomputation', False,
    'moe_comm_overlap'),
  'expert_overlap_without_moe_recompute': (
    _expert_overlap_without_moe_recompute,
    'moe_comm_overlap "compute" only without "moe" among the '
    'recompute_modules of selective recomputation', False,
    'moe_comm_overlap'),
  'expert_overlap_without_activation_offload': (
    _expert_overlap_without_activation_offload,
    'activations offload not with moe_comm_overlap "compute" (the '
    'overlapped schedule runs the layers outside the block that offloads '
    'them)', False, 'activations_offload'),
  'expert_overlap_with_fsdp_needs_pp1': (
    _expert_overlap_with_fsdp_needs_pp1,
    'moe_comm_overlap "compute" with data_par_sharding "gradients" or '
    '"parameters" (sharded data parallelism) needs pipeline_par = 1',
    False, 'moe_comm_overlap'),
  'tp_overlap_needs_sequence_parallel': (
    _tp_overlap_without_sequence_parallel,
    'tensor_par_overlap other than "none" needs tensor_par_comm_type '
    '"rs_ag" (sequence parallelism)', False, 'tensor_par_overlap'),
  'pipeline_split_buildable': (
    _split_not_buildable,
    'the pipeline split must be one the framework builds (it has no '
    'layer layout): PP x VP dividing the blocks, or with '
    'pipeline_interleaving 1 one uneven first or last stage (blocks mod '
    'PP = 1 or PP - 1)', False, 'pipeline_par'),
  'interleaved_min_blocks_per_stage': (
    _interleaved_min_blocks_per_stage,
    'with pipeline_interleaving > 1 each virtual stage needs at least '
    '{value} block(s)', True, 'pipeline_interleaving'),
}


class Constraint:
  """One check of :data:`KINDS` with its value and source."""

  __slots__ = ('check', 'value', 'source')

  def __init__(self, check, value, source):
    self.check, self.value, self.source = check, value, source

  @classmethod
  def read(cls, source, where, raw):
    """Reads ``{"check": KIND, "value": N, "source": "..."}``.

    Raises:
      ConfigError: an unknown kind, a missing or bad value.
    """
    from calculon.config._schema import Reader, Spec
    reader = Reader(raw, source, where)
    check = reader.get('check', Spec('str', choices=tuple(KINDS)))
    value = None
    if KINDS[check][2]:
      value = reader.get('value', Spec('int', lo=1))
    text = reader.get('source', Spec('str')) if 'source' in raw else ''
    reader.finish()
    return cls(check, value, text)

  def bad(self, columns, app):
    """Bool array (broadcast over the columns): executions breaking it."""
    return KINDS[self.check][0](columns, app, self.value)

  @property
  def text(self):
    """What it requires, in words."""
    return KINDS[self.check][1].format(value=self.value)


def check(preset, columns, app, source='<execution>'):
  """Raises ConfigError for the first constraint of ``preset`` an execution
  of ``columns`` breaks.

  Raises:
    ConfigError: names the framework, what it requires and its source.
  """
  for con in preset.constraints:
    bad = np.asarray(con.bad(columns, app))
    if bad.any():
      field = KINDS[con.check][3]
      raise ConfigError(
        f"{source}: field '{field}' is not allowed with framework "
        f"'{preset.name}': {con.text}"
        + (f' ({con.source})' if con.source else ''),
        source=source, field=field)


def mask(preset, columns, app):
  """Bool array: executions meeting every constraint of ``preset``."""
  ok = np.True_
  for con in preset.constraints:
    bad = np.asarray(con.bad(columns, app))
    if np.any(bad):     # one no execution breaks keeps the mask small
      ok = ok & ~bad
  return ok
