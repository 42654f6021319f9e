"""The execution (parallelization strategy and options) configuration.

An execution is kept in two forms:

* :class:`Execution`, one execution read from JSON (the Calculon format, 23
  fields), and
* :class:`ExecutionColumns`, a struct of numpy arrays with one entry per
  execution (or any broadcastable shapes, which the search uses to evaluate a
  whole grid of strategies at once).  Categorical options are stored as small
  integer codes (see the ``*_NAMES`` tuples).

The rules that make an execution well-defined (``TP * PP * DP ==
num_procs``, the batch divides evenly...) are written once, vectorized, in
:data:`RULES`; a single JSON execution is checked as a batch of one.
"""

from dataclasses import asdict

import numpy as np

from calculon.config._record import frozen_record
from calculon.config._schema import Reader, Spec, show
from calculon.errors import ConfigError

#: Bytes per element of each supported datatype.  ``float4`` is the
#: Blackwell block-scaled 4-bit format (NVFP4 / MXFP4: 4-bit elements; the
#: per-block scales are not counted); MXFP8 is priced as ``float8``.
DATATYPE_BYTES = {'float8': 1, 'float16': 2, 'float32': 4, 'bfloat16': 2,
                  'float4': 0.5}
DATATYPE_NAMES = tuple(DATATYPE_BYTES)
#: Datatypes narrower than 16 bits (Transformer Engine runs only the linear
#: layers' GEMMs in them, see ``precision_recipe``).
NARROW_DATATYPES = ('float8', 'float4')
ATTENTION_NAMES = ('multihead', 'multiquery', 'grouped')
RECOMPUTE_NAMES = ('none', 'attn_only', 'full', 'selective')
TP_COMM_NAMES = ('ar', 'p2p_rs_ag', 'rs_ag')
TP_OVERLAP_NAMES = ('none', 'ring', 'pipe')
SHARDING_NAMES = ('none', 'optimizer', 'gradients', 'parameters')
ATTENTION_KERNEL_NAMES = ('standard', 'flash')
PRECISION_RECIPE_NAMES = ('uniform', 'transformer_engine')
#: How the narrow linear layers' scaling factors are found (see
#: ``quantization_scaling``).
SCALING_NAMES = ('delayed', 'current', 'block')
#: The loss's kernels (see ``cross_entropy_kernel``).
CROSS_ENTROPY_NAMES = ('fused', 'unfused')
#: Megatron-Core's selective-recomputation modules (--recompute-modules;
#: megatron/core/transformer/transformer_config.py ``recompute_modules``):
#: the attention core, the two norms, MLA's up projections and RoPE, the
#: dense MLP, the MoE layer, the experts' activation, the shared experts;
#: then PyTorch's per-op selective checkpointing as torchtitan sets it
#: ('alternate_linears': every second linear layer of a block and every
#: element-wise op recomputed; torchtitan models/llama3/infra/
#: parallelize.py, _apply_ac_to_transformer_block, selective_ac_option
#: 'op': the outputs of mm, SDPA, reduce_scatter and max are saved, except
#: every second mm).  New names go last: a set's code is its bit mask - 1.
RECOMPUTE_MODULES = ('core_attn', 'layernorm', 'mla_up_proj', 'mlp', 'moe',
                     'moe_act', 'shared_experts', 'alternate_linears')


def _module_sets():
  out = []
  for mask in range(1, 1 << len(RECOMPUTE_MODULES)):
    out.append(','.join(m for i, m in enumerate(RECOMPUTE_MODULES)
                        if mask >> i & 1))
  return tuple(out)


#: Every non-empty set of modules as its canonical label (names in
#: :data:`RECOMPUTE_MODULES` order, comma-joined); code c is the bit mask
#: c + 1 (bit i: module i).
RECOMPUTE_MODULE_SETS = _module_sets()
_CORE_ATTN_ONLY = RECOMPUTE_MODULE_SETS.index('core_attn')


def recompute_modules_label(value, source='<execution>',
                            field='recompute_modules'):
  """The canonical label of a list (or comma-separated string) of
  recompute modules.

  Raises:
    ConfigError: empty, a name not in :data:`RECOMPUTE_MODULES`, or a name
      twice.
  """
  allowed = ('a non-empty list of distinct names among ' +
             ', '.join(RECOMPUTE_MODULES))
  names = value.split(',') if isinstance(value, str) else value
  ok = isinstance(names, (list, tuple)) and names and all(
    isinstance(n, str) and n.strip() in RECOMPUTE_MODULES for n in names)
  names = [n.strip() for n in names] if ok else names
  if not ok or len(set(names)) != len(names):
    raise ConfigError(
      f"{source}: field '{field}' = {show(value)} is not "
      f'allowed: {allowed}', source=source, field=field, value=value,
      allowed=allowed)
  return ','.join(m for m in RECOMPUTE_MODULES if m in names)


def json_value(name, value):
  """An optional field's value as JSON writes it: ``recompute_modules``'
  canonical label as its list of names, every other value as is."""
  return value.split(',') if name == 'recompute_modules' else value
DISPATCHER_NAMES = ('alltoall', 'allgather', 'deepep')
MOE_OVERLAP_NAMES = ('none', 'shared_experts', 'compute')
#: Where full recomputation's block-input checkpoints live: ``whole`` (every
#: TP rank stores the whole input: Calculon) or ``as_input`` (as the rank
#: holds the input: sequence-sharded, 1/TP, with sequence parallelism).
CHECKPOINT_LAYOUT_NAMES = ('whole', 'as_input')
#: The optimizer step's memory traffic: ``state_once`` (Calculon: the
#: master weights and Adam moments moved once) or ``fused_adam`` (every
#: pass a framework's mixed-precision Adam step makes; see
#: :meth:`calculon.llm.layers.Layer.optimizer_traffic_bytes`).
OPTIMIZER_TRAFFIC_NAMES = ('state_once', 'fused_adam')

# Codes used by the engine.
RECOMPUTE_NONE, RECOMPUTE_ATTN_ONLY, RECOMPUTE_FULL, RECOMPUTE_SELECTIVE = \
  0, 1, 2, 3
TP_COMM_AR, TP_COMM_P2P_RS_AG, TP_COMM_RS_AG = 0, 1, 2
TP_OVERLAP_NONE, TP_OVERLAP_RING, TP_OVERLAP_PIPE = 0, 1, 2
ATTENTION_AUTO, ATTENTION_MULTIHEAD, ATTENTION_MULTIQUERY, \
  ATTENTION_GROUPED = -1, 0, 1, 2
SHARD_NONE, SHARD_OPTIMIZER, SHARD_GRADIENTS, SHARD_PARAMETERS = 0, 1, 2, 3
KERNEL_STANDARD, KERNEL_FLASH = 0, 1
RECIPE_UNIFORM, RECIPE_TE = 0, 1
SCALING_DELAYED, SCALING_CURRENT, SCALING_BLOCK = 0, 1, 2
CROSS_ENTROPY_FUSED, CROSS_ENTROPY_UNFUSED = 0, 1
DISPATCH_ALLTOALL, DISPATCH_ALLGATHER, DISPATCH_DEEPEP = 0, 1, 2
MOE_OVERLAP_NONE, MOE_OVERLAP_SHARED, MOE_OVERLAP_COMPUTE = 0, 1, 2
CHECKPOINT_WHOLE, CHECKPOINT_AS_INPUT = 0, 1
OPTIMIZER_TRAFFIC_STATE, OPTIMIZER_TRAFFIC_FUSED_ADAM = 0, 1
#: Code of an optional categorical field left out (``attention_type``:
#: as the application's kv_heads say; ``gradient_datatype``: Calculon's).
UNSET = -1

_INT1 = Spec('int', lo=1)
_INT0 = Spec('int', lo=0)
_BOOL = Spec('bool')

#: JSON field -> (spec, categorical names or None), in the reference's order.
FIELD_SPECS = {
  'num_procs': (_INT1, None),
  'tensor_par': (_INT1, None),
  'pipeline_par': (_INT1, None),
  'data_par': (_INT1, None),
  'tensor_par_net': (_INT0, None),
  'pipeline_par_net': (_INT0, None),
  'data_par_net': (_INT0, None),
  'batch_size': (_INT1, None),
  'microbatch_size': (_INT1, None),
  'datatype': (Spec('str', choices=DATATYPE_NAMES), DATATYPE_NAMES),
  'fused_activation': (_BOOL, None),
  'attention_type': (Spec('str', choices=ATTENTION_NAMES), ATTENTION_NAMES),
  'activation_recompute': (Spec('str', choices=RECOMPUTE_NAMES),
                           RECOMPUTE_NAMES),
  'pipeline_interleaving': (_INT1, None),
  'optimizer_sharding': (_BOOL, None),
  'tensor_par_comm_type': (Spec('str', choices=TP_COMM_NAMES), TP_COMM_NAMES),
  'tensor_par_overlap': (Spec('str', choices=TP_OVERLAP_NAMES),
                         TP_OVERLAP_NAMES),
  'seq_par_ag_redo': (_BOOL, None),
  'data_par_overlap': (_BOOL, None),
  'weight_offload': (_BOOL, None),
  'activations_offload': (_BOOL, None),
  'optimizer_offload': (_BOOL, None),
  'training': (_BOOL, None),
}
FIELDS = tuple(FIELD_SPECS)

#: Fields beyond Calculon's: JSON field -> (spec, categorical names or None,
#: the value meaning "absent").  Absent, each means exactly what Calculon
#: means.  ``data_par_sharding`` absent follows ``optimizer_sharding``
#: (see :func:`sharding_code`); ``gradient_datatype`` absent keeps
#: Calculon's gradients (in ``datatype``, with an fp32 accumulation buffer
#: for the block being computed).
OPTIONAL_SPECS = {
  'context_par': (_INT1, None, 1),
  'context_par_net': (_INT0, None, 0),
  'data_par_sharding': (Spec('str', choices=SHARDING_NAMES), SHARDING_NAMES,
                        None),
  'attention_kernel': (Spec('str', choices=ATTENTION_KERNEL_NAMES),
                       ATTENTION_KERNEL_NAMES, 'standard'),
  'precision_recipe': (Spec('str', choices=PRECISION_RECIPE_NAMES),
                       PRECISION_RECIPE_NAMES, 'uniform'),
  'gradient_datatype': (Spec('str', choices=('float32', 'bfloat16',
                                             'float16')), DATATYPE_NAMES,
                        None),
  'expert_par': (_INT1, None, 1),
  'expert_par_net': (_INT0, None, 0),
  'expert_tensor_par': (_INT1, None, 1),
  'moe_dispatcher': (Spec('str', choices=DISPATCHER_NAMES), DISPATCHER_NAMES,
                     'alltoall'),
  'moe_comm_overlap': (Spec('str', choices=MOE_OVERLAP_NAMES),
                       MOE_OVERLAP_NAMES, 'none'),
  'expert_imbalance': (Spec('number', lo=1), None, 1.0),
  'checkpoint_layout': (Spec('str', choices=CHECKPOINT_LAYOUT_NAMES),
                        CHECKPOINT_LAYOUT_NAMES, 'whole'),
  'param_gather_overlap': (_BOOL, None, False),
  'tensor_par_async_backward': (_BOOL, None, False),
  'tensor_par_overlap_rs_dgrad': (_BOOL, None, True),
  'tensor_par_narrow_all_gather': (_BOOL, None, False),
  'narrow_param_gather': (_BOOL, None, False),
  'pipeline_split_counts_vocab': (_BOOL, None, False),
  'quantization_scaling': (Spec('str', choices=SCALING_NAMES), SCALING_NAMES,
                           'delayed'),
  'recompute_modules': (Spec('list'), RECOMPUTE_MODULE_SETS, 'core_attn'),
  'fsdp_buffer_copies': (_BOOL, None, False),
  'cross_entropy_kernel': (Spec('str', choices=CROSS_ENTROPY_NAMES),
                           CROSS_ENTROPY_NAMES, 'fused'),
  'moe_probs_in_activation': (_BOOL, None, False),
  'wide_saved_inputs': (_BOOL, None, False),
  'pipeline_par_overlap': (_BOOL, None, False),
  'fused_dropout_add': (_BOOL, None, False),
  'optimizer_traffic': (Spec('str', choices=OPTIMIZER_TRAFFIC_NAMES),
                        OPTIMIZER_TRAFFIC_NAMES, 'state_once'),
}
#: Calculon fields that new-style executions may leave out, with what their
#: absence means (attention_type: as the application's kv_heads say;
#: optimizer_sharding: as data_par_sharding says).
RELAXED = ('attention_type', 'optimizer_sharding')
ALL_FIELDS = FIELDS + tuple(OPTIONAL_SPECS)


def sharding_code(optimizer_sharding, data_par_sharding):
  """Sharding level code from Calculon's flag and the new field.

  ``data_par_sharding`` absent (UNSET): Calculon's ``optimizer_sharding``,
  priced exactly as Calculon prices it.  Calculon's accounting shards the
  optimizer state *and* the gradients of the finished blocks (its
  ``block_weight_grad_space`` divides by DP), i.e. ZeRO-2's memory, with the
  reduce-scatter + all-gather communication that ZeRO-1 and ZeRO-2 share
  (Rajbhandari et al. 2020, sections 5 and 7): so ``true`` is the level
  ``gradients`` and ``false`` is ``none``.
  """
  return np.where(data_par_sharding == UNSET,
                  np.where(optimizer_sharding, SHARD_GRADIENTS, SHARD_NONE),
                  data_par_sharding)


@frozen_record
class Execution:
  """One execution strategy, as in Calculon's execution JSON.

  Fields (units): num_procs, tensor_par (TP), pipeline_par (PP), data_par (DP)
  (processors); tensor_par_net, pipeline_par_net, data_par_net (index of the
  system's network tier used by each parallelism); batch_size (global batch,
  samples); microbatch_size (samples); datatype; fused_activation;
  attention_type; activation_recompute; pipeline_interleaving (model chunks
  per processor); optimizer_sharding (sharding over DP, see
  :func:`sharding_code`); tensor_par_comm_type ('ar' all-reduce, 'rs_ag'
  reduce-scatter/all-gather, i.e. sequence parallelism, 'p2p_rs_ag' RS/AG
  only at pipeline edges); tensor_par_overlap ('none', 'ring', 'pipe');
  seq_par_ag_redo; data_par_overlap; weight_offload, activations_offload,
  optimizer_offload (to memory tier 2); training (False: inference, forward
  pass only).

  Optional fields (:data:`OPTIONAL_SPECS`; absent, they mean Calculon):
  context_par (CP, processors; num_procs = TP x PP x DP x CP) and
  context_par_net; data_par_sharding ('none', 'optimizer' = ZeRO-1 /
  Megatron distributed optimizer, 'gradients' = ZeRO-2, 'parameters' =
  ZeRO-3 / FSDP; over DP x CP); attention_kernel ('standard' keeps the
  s x s scores, 'flash' is FlashAttention-2); precision_recipe ('uniform':
  everything in ``datatype``, Calculon; 'transformer_engine': only the
  linear layers' GEMMs in the narrow ``datatype``, the rest in bfloat16);
  gradient_datatype (precision of the gradients kept and reduced; absent:
  Calculon's); Mixture-of-Experts: expert_par (EP, experts split over EP
  ranks folded into TP x DP x CP, Megatron-Core "MoE parallel folding"),
  expert_par_net (its tier), expert_tensor_par (ETP: TP inside an expert;
  absent 1, Megatron-Core's default), moe_dispatcher ('alltoall',
  'allgather', or 'deepep': all-to-all sending each token once per
  destination node across nodes and forwarding it over the node's fast
  tier, DeepEP / Megatron-Core's flex dispatcher), moe_comm_overlap
  ('none', 'shared_experts': the dispatch and combine hide behind the
  shared experts, Megatron-Core --moe-shared-expert-overlap; 'compute':
  behind the rest of the block's compute, as with Megatron-Core
  --overlap-moe-expert-parallel-comm or
  DeepSeek-V3's DualPipe), expert_imbalance (tokens of the busiest expert
  over the average, >= 1: the step waits for the slowest rank),
  checkpoint_layout (``whole``: with full recomputation every TP rank
  stores each block's whole input, as Calculon does; ``as_input``: the
  checkpoint is the input as the rank holds it, sequence-sharded (1/TP)
  with sequence parallelism -- Megatron-LM checkpoints the block input,
  which sequence parallelism scatters along the sequence, Korthikanti et
  al. 2022 section 4.2.2; the same as ``whole`` without it),
  param_gather_overlap (with DP overlap and a sharded optimizer, the
  all-gather of the updated weights hides behind the next step's forward
  pass, as Megatron-Core's distributed optimizer does with
  --overlap-param-gather; absent: false, Calculon's model, where it
  overlaps the backward pass with the reduce-scatter),
  tensor_par_async_backward (with TP > 1 and tensor_par_overlap 'none':
  the input-gradient all-reduce, or reduce-scatter with sequence
  parallelism, of each column-parallel linear layer runs behind its
  weight-gradient GEMM, and sequence parallelism's redone all-gather of
  its input behind its input-gradient GEMM, as Megatron-LM's
  LinearWithGradAccumulationAndAsyncCommunication and Transformer
  Engine's Linear do; absent: false, Calculon's model, all exposed),
  tensor_par_overlap_rs_dgrad (with tensor_par_overlap 'ring' or 'pipe':
  the reduce-scatter, or all-reduce, of each column-parallel layer's input
  gradient is tiled and overlapped with its input-gradient GEMM like every
  other TP transfer of the layer; false: it runs whole after that GEMM,
  exposed, as PyTorch's micro-pipeline TP leaves a reduce-scatter whose
  input sums several GEMMs' outputs (separate Q, K, V or gate and up
  projections); absent: true, Calculon's model),
  tensor_par_narrow_all_gather (with the transformer_engine recipe and
  sequence parallelism: the TP all-gathers that feed a narrow GEMM -- the
  block input before the column-parallel layers, forward and recomputed,
  and the output gradient before the row-parallel layers' backward GEMMs
  -- carry the narrow datatype's bytes, cast on each rank's shard before
  the gather, as torchao's float8 tensor-parallel styles do
  (PrepareFloat8ModuleInput, Float8ColwiseParallel, Float8RowwiseParallel);
  reduce-scatters and all-reduces stay 16-bit; absent: false, every TP
  transfer 16-bit),
  narrow_param_gather (with the transformer_engine recipe and a sharded
  optimizer: the updated weights of the linear layers are all-gathered in
  the narrow datatype, Megatron-Core's --fp8-param-gather, which keeps
  them as FP8 tensors; absent: false, in 16-bit, TE casting its narrow
  copy after the gather; the bytes kept in memory are unchanged, an upper
  bound),
  pipeline_split_counts_vocab (with PP > 1: the pipeline split counts the
  embedding and the LM head with the loss as one block each, so the first
  and the last stage hold one block less, as Megatron-Core's
  --account-for-embedding-in-pipeline-split and
  --account-for-loss-in-pipeline-split do; absent: false, every stage
  holds its share of the blocks and the ends carry the embedding and the
  head on top),
  quantization_scaling (with the Transformer Engine recipe, how the casts
  to the narrow datatype find their scales: 'delayed' from the amax
  history of earlier steps, Transformer Engine's DelayedScaling; 'current'
  from an amax pass over the tensor before the cast, Transformer Engine's
  Float8CurrentScaling and torchao's dynamic tensorwise float8; 'block'
  one scale per 32 (MXFP8) or 16 (NVFP4) elements found in the cast
  kernel; absent: 'delayed'), recompute_modules (with
  activation_recompute 'selective', what is recomputed, as Megatron-Core's
  --recompute-modules: a list among 'core_attn' (the attention core,
  Korthikanti et al.'s selective recomputation; absent: this alone),
  'layernorm' (the two norms; their outputs are not kept), 'mla_up_proj'
  (MLA's up projections and RoPE; the attention inputs are not kept),
  'mlp' (the dense MLP from its input), 'moe' (the MoE layer from its
  input, its all-to-alls too), 'moe_act' (the experts' activation; its
  output is not kept), 'shared_experts', and 'alternate_linears'
  (PyTorch's per-op selective activation checkpointing as torchtitan
  applies it: the second, fourth and sixth linear layers of a dense block
  in forward order -- K, the output projection, the MLP's up half -- and
  every element-wise layer (norms, RoPE, the activation, the first
  residual) recomputed; attention and the other linears' outputs kept)),
  fsdp_buffer_copies (with
  data_par_sharding 'parameters': FSDP copies each gathered block's
  weights out of the all-gather buffer, twice per microbatch, and its
  gradients into the reduce-scatter buffer, on the compute stream, as
  PyTorch FSDP2's per-parameter sharding does; absent: false, flat
  buffers gathered and reduced in place, as Megatron-FSDP and ZeRO-3's
  contiguous buffers), cross_entropy_kernel (the loss over the
  vocabulary: 'fused', one kernel reading the 16-bit logits and writing
  their gradient, as Transformer Engine's and Megatron-Core's
  --cross-entropy-loss-fusion; 'unfused', the logits cast to float32 and
  the softmax cross-entropy taken by separate element-wise kernels, as
  Megatron-LM's vocab_parallel_cross_entropy without that flag and
  PyTorch's cross_entropy on float32 logits; absent: 'fused'),
  moe_probs_in_activation (Mixture-of-Experts: the router probabilities
  scale the experts' activation, before their second GEMM, so the combine
  is a plain sum that keeps nothing for the backward pass, as
  Megatron-Core since April 2025 (commit 2659630721, "Memory efficient
  token permutation": ``activation_func_with_probs``); absent: false, the
  combine scales the expert outputs and keeps them for the probabilities'
  gradient, as Megatron-Core's ``moe_utils.unpermute`` did before and
  GShard's combine; ignored without experts), wide_saved_inputs (only
  with precision_recipe 'transformer_engine': the linear layers keep
  their 16-bit input for the backward pass and cast it again there, as
  torchao's Float8Linear does (``matmul_with_hp_or_float8_args`` saves
  ``input_hp``, since pytorch/ao e76db70ec, October 2024); absent: false,
  the narrow input is kept, as Transformer Engine does),
  pipeline_par_overlap (with PP > 1 and the interleaved schedule, VP > 1:
  the point-to-point transfers of the 1F1B steady state run behind the
  compute of the other chunk of the step, those of the warm-up and the
  flush blocking, as Megatron-Core's --overlap-p2p-communication does
  (the default of Megatron-LM since commit 4eeff55d1f, October 2023;
  NeMo 2 and Megatron-Bridge turn it on with VP > 1); it does nothing
  without interleaving, which Megatron-LM runs without it; absent: false,
  Calculon's model, every transfer exposed), fused_dropout_add (with the
  application's dropout: the dropout of the attention and MLP outputs
  runs inside the residual addition's kernel, Megatron-LM's
  bias_dropout_add_fused_train, on by default since commit 9acc895632,
  January 2021: its forward pass moves only the mask; absent: false,
  Calculon's separate kernel), optimizer_traffic (the memory traffic of
  the optimizer step: 'state_once', Calculon's, the fp32 master weights
  and the two Adam moments moved once, 12 bytes per parameter of the
  shard; 'fused_adam', every pass a framework's mixed-precision Adam step
  makes over its shard: the gradient norm for clipping, the fused Adam
  kernel reading the gradient, master weight and moments and writing the
  last three, the copy of the master weights into the 16-bit weights,
  and with float16 the loss-scale unscaling, 38 bytes per parameter with
  bfloat16 and 46 with float16, as Megatron-LM's mixed-precision
  optimizer, apex's FusedAdam and PyTorch's fused AdamW do (see
  :meth:`calculon.llm.layers.Layer.optimizer_traffic_bytes`); absent:
  'state_once').
  ``attention_type`` and ``optimizer_sharding`` may be left
  out when the application's ``kv_heads`` / ``data_par_sharding`` say.
  """
  num_procs: int
  tensor_par: int
  pipeline_par: int
  data_par: int
  tensor_par_net: int
  pipeline_par_net: int
  data_par_net: int
  batch_size: int
  microbatch_size: int
  datatype: str
  fused_activation: bool
  attention_type: object
  activation_recompute: str
  pipeline_interleaving: int
  optimizer_sharding: object
  tensor_par_comm_type: str
  tensor_par_overlap: str
  seq_par_ag_redo: bool
  data_par_overlap: bool
  weight_offload: bool
  activations_offload: bool
  optimizer_offload: bool
  training: bool
  context_par: int = 1
  context_par_net: int = 0
  data_par_sharding: object = None
  attention_kernel: str = 'standard'
  precision_recipe: str = 'uniform'
  gradient_datatype: object = None
  expert_par: int = 1
  expert_par_net: int = 0
  expert_tensor_par: int = 1
  moe_dispatcher: str = 'alltoall'
  moe_comm_overlap: str = 'none'
  expert_imbalance: float = 1.0
  checkpoint_layout: str = 'whole'
  param_gather_overlap: bool = False
  tensor_par_async_backward: bool = False
  tensor_par_overlap_rs_dgrad: bool = True
  tensor_par_narrow_all_gather: bool = False
  narrow_param_gather: bool = False
  pipeline_split_counts_vocab: bool = False
  quantization_scaling: str = 'delayed'
  recompute_modules: object = 'core_attn'
  fsdp_buffer_copies: bool = False
  cross_entropy_kernel: str = 'fused'
  moe_probs_in_activation: bool = False
  wide_saved_inputs: bool = False
  pipeline_par_overlap: bool = False
  fused_dropout_add: bool = False
  optimizer_traffic: str = 'state_once'

  @classmethod
  def from_dict(cls, cfg, source='<execution>'):
    """Reads and validates one execution.

    Raises:
      ConfigError: a field is missing, unknown, of the wrong type or out of
        range, or the fields contradict each other (see :data:`RULES`).
    """
    reader = Reader(cfg, source)
    values = {}
    for name, (spec, _) in FIELD_SPECS.items():
      if name in RELAXED and isinstance(cfg, dict) and name not in cfg:
        values[name] = None
        continue
      values[name] = reader.get(name, spec)
    for name, (spec, _, default) in OPTIONAL_SPECS.items():
      values[name] = reader.get(name, spec) if name in cfg else default
    values['recompute_modules'] = recompute_modules_label(
      values['recompute_modules'], source)
    reader.meta()
    reader.finish()
    if values['optimizer_sharding'] is None and \
        values['data_par_sharding'] is None:
      reader.get('optimizer_sharding', FIELD_SPECS['optimizer_sharding'][0])
    exe = cls(**values)
    check_rules(ExecutionColumns.from_records([values]), source)
    return exe

  def to_dict(self):
    """The JSON object of this execution: Calculon's 23 fields (those left
    out stay out) and the optional fields that differ from their default."""
    out = {}
    for name in FIELDS:
      value = getattr(self, name)
      if value is not None or name not in RELAXED:
        out[name] = value
    for name, (_, _, default) in OPTIONAL_SPECS.items():
      value = getattr(self, name)
      if value != default:
        out[name] = json_value(name, value)
    return out

  @property
  def local_batch_size(self):
    """Samples per data-parallel replica per batch."""
    return self.batch_size // self.data_par

  @property
  def num_microbatches(self):
    """Microbatches per replica per batch."""
    return self.local_batch_size // self.microbatch_size


def _resolve_sharding_flag(record):
  """A record whose left-out optimizer_sharding follows data_par_sharding."""
  if record.get('optimizer_sharding') is not None:
    return record
  level = record.get('data_par_sharding')
  return dict(record, optimizer_sharding=level not in (None, 'none'))


def _kind_dtype(spec):
  return np.float64 if spec.kind == 'number' else \
    bool if spec.kind == 'bool' else np.int64


def _code(names, value):
  return UNSET if value is None else names.index(value)


class ExecutionColumns:
  """Executions as a struct of numpy arrays (one attribute per field).

  Integer fields are int64 arrays, flags are bool arrays, categorical fields
  are int64 codes into the ``*_NAMES`` tuples (``datatype`` indexes
  :data:`DATATYPE_NAMES`; :data:`UNSET` for an optional categorical field
  left out).  Arrays may have any mutually broadcastable shapes.  The
  optional fields (:data:`OPTIONAL_SPECS`) may be omitted and take their
  "absent" value; ``optimizer_sharding`` left out (None) follows
  ``data_par_sharding``.
  """

  def __init__(self, **columns):
    missing = [f for f in FIELDS if f not in columns]
    if missing:
      raise TypeError(f'missing execution columns: {missing}')
    for name in FIELDS:
      setattr(self, name, columns[name])
    for name, (spec, names, default) in OPTIONAL_SPECS.items():
      value = columns.get(name)
      if value is None:
        value = np.float64(default) if spec.kind == 'number' else \
          np.bool_(default) if spec.kind == 'bool' else \
          np.int64(default if names is None else _code(names, default))
      setattr(self, name, value)
    if self.optimizer_sharding is None:
      self.optimizer_sharding = np.asarray(
        (self.data_par_sharding != UNSET) &
        (self.data_par_sharding != SHARD_NONE))
    if self.attention_type is None:
      self.attention_type = np.int64(ATTENTION_AUTO)

  @property
  def sharding(self):
    """Sharding level codes (see :func:`sharding_code`)."""
    return sharding_code(self.optimizer_sharding, self.data_par_sharding)

  @property
  def shape(self):
    """Broadcast shape of all columns."""
    return np.broadcast_shapes(*(np.shape(getattr(self, f))
                                 for f in ALL_FIELDS))

  @classmethod
  def from_records(cls, records):
    """Builds columns from dicts already checked against the field specs
    (optional fields may be missing or None)."""
    records = [_resolve_sharding_flag(r) for r in records]
    cols = {}
    for name, (spec, names) in FIELD_SPECS.items():
      vals = [r.get(name) for r in records]
      if name in RELAXED and all(v is None for v in vals):
        if name == 'attention_type':
          cols[name] = np.full(len(vals), ATTENTION_AUTO, dtype=np.int64)
        continue
      if names is not None:
        cols[name] = np.array([_code(names, v) for v in vals],
                              dtype=np.int64)
      elif spec.kind == 'bool':
        cols[name] = np.array(vals, dtype=bool)
      else:
        cols[name] = np.array(vals, dtype=np.int64)
    cols.setdefault('optimizer_sharding', None)
    for name, (spec, names, default) in OPTIONAL_SPECS.items():
      vals = [r.get(name, default) for r in records]
      if name == 'recompute_modules':
        vals = [default if v is None else recompute_modules_label(v)
                for v in vals]
      if names is not None:
        cols[name] = np.array([_code(names, v) for v in vals],
                              dtype=np.int64)
      else:
        cols[name] = np.array(vals, dtype=_kind_dtype(spec))
    return cls(**cols)

  @classmethod
  def from_frame(cls, frame, source='<executions>'):
    """Builds columns from a pandas DataFrame with the 23 execution fields
    (and any optional ones).

    Extra columns are ignored.  Values are checked column by column; an
    optional column may hold nulls (absent).

    Raises:
      ConfigError: a column is missing or holds a value its field does not
        accept (the message names the first offending row).
    """
    cols = {}
    n = len(frame)
    specs = [(name, spec, names, False, None)
             for name, (spec, names) in FIELD_SPECS.items()]
    specs += [(name, spec, names, True, default)
              for name, (spec, names, default) in OPTIONAL_SPECS.items()]
    for name, spec, names, optional, default in specs:
      if name not in frame.columns:
        if optional:
          continue
        raise ConfigError(
          f"{source}: missing column '{name}' ({spec.describe()})",
          source=source, field=name, allowed=spec.describe())
      raw = frame[name].to_numpy()
      absent = np.zeros(n, dtype=bool)
      if optional:
        absent = np.array([v is None or (isinstance(v, float) and v != v)
                           for v in raw.astype(object)], dtype=bool)
      if names is not None:
        codes = np.full(n, -2, dtype=np.int64)
        as_str = raw.astype(object)
        allowed = spec.choices if spec.choices is not None else names
        for i, label in enumerate(names):
          if label in allowed:
            codes[as_str == label] = i
        if optional:
          codes[absent] = _code(names, default)
        bad = codes == -2
        arr = codes
      elif spec.kind == 'bool':
        if raw.dtype == bool:
          arr, bad = raw, np.zeros(n, dtype=bool)
        else:
          obj = raw.astype(object)
          is_bool = np.array([isinstance(v, (bool, np.bool_)) for v in obj],
                             dtype=bool)
          arr = np.where(is_bool, obj, False).astype(bool)
          bad = ~is_bool
      elif spec.kind == 'number':
        obj = raw.astype(object)
        if optional:
          obj = np.where(absent, default, obj)
        ok = np.array([spec.accepts(v) for v in obj], dtype=bool)
        arr = np.where(ok, obj, default).astype(np.float64)
        bad = ~ok
      else:
        if raw.dtype.kind in 'iu':
          arr = raw.astype(np.int64)
          bad = np.zeros(n, dtype=bool)
        else:
          obj = raw.astype(object)
          is_int = np.array([isinstance(v, (int, np.integer))
                             and not isinstance(v, (bool, np.bool_))
                             for v in obj], dtype=bool)
          if optional:
            is_int |= absent
            obj = np.where(absent, default, obj)
          arr = np.where(is_int, obj, 0).astype(np.int64)
          bad = ~is_int
        bad |= arr < (spec.lo if spec.lo is not None else -2**62)
      if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise ConfigError(
          f"{source}: row {frame.index[row]!r}: field '{name}' = "
          f'{show(_plain(raw[row]))} is not allowed: {spec.describe()} '
          f'({int(bad.sum())} bad rows)',
          source=source, field=name, value=raw[row], allowed=spec.describe())
      cols[name] = arr
    return cls(**cols)

  def record(self, index=()):
    """The execution at ``index`` as a JSON-ready dict (Calculon format; the
    optional fields only where they differ from their default)."""
    out = {}
    shape = self.shape
    for name, (spec, names) in FIELD_SPECS.items():
      arr = np.broadcast_to(getattr(self, name), shape)
      value = arr[index]
      if names is not None:
        if int(value) == UNSET:
          continue
        out[name] = names[int(value)]
      elif spec.kind == 'bool':
        out[name] = bool(value)
      else:
        out[name] = int(value)
    for name, (spec, names, default) in OPTIONAL_SPECS.items():
      value = np.broadcast_to(getattr(self, name), shape)[index]
      value = float(value) if spec.kind == 'number' else \
        bool(value) if spec.kind == 'bool' else int(value)
      if names is not None:
        value = None if value == UNSET else names[value]
      if value != default:
        out[name] = json_value(name, value)
    return out

  def to_frame(self):
    """All executions as a pandas DataFrame (flattened, Calculon values; an
    optional field is a column only when some execution sets it)."""
    import pandas as pd
    shape = self.shape
    data = {}
    for name, (spec, names) in FIELD_SPECS.items():
      arr = np.broadcast_to(getattr(self, name), shape).reshape(-1)
      if names is not None:
        data[name] = _labels(names, arr)
      else:
        data[name] = arr
    for name, (spec, names, default) in OPTIONAL_SPECS.items():
      arr = np.broadcast_to(getattr(self, name), shape).reshape(-1)
      code = default if names is None else _code(names, default)
      if np.all(arr == code):
        continue
      data[name] = _labels(names, arr) if names is not None else arr
    return pd.DataFrame(data)


def _labels(names, codes):
  """Names of codes (None for UNSET)."""
  table = np.asarray(list(names) + [None], dtype=object)
  return table[np.where(codes == UNSET, len(names), codes)]


@frozen_record
class Rule:
  """One consistency rule between execution fields.

  ``bad(c)`` returns a boolean mask of executions that break the rule;
  ``message(c, i)`` explains the failure of execution ``i`` (an index into the
  broadcast shape) naming the field, its value and what is allowed.
  """
  field: str
  bad: object
  message: object


def _plain(value):
  return value.item() if isinstance(value, np.generic) else value


def _v(c, name, i):
  arr = np.broadcast_to(getattr(c, name), c.shape)
  value = arr[i]
  if isinstance(value, np.generic):
    value = value.item()
  return value


def _only_with(field, names, default, other, other_names, needed, why,
               label=None):
  """A :class:`Rule`: ``field`` other than its ``default`` code is allowed
  only where ``other`` has the code ``needed``; ``label`` shows a value's
  name (default: as is)."""
  def bad(c):
    return (getattr(c, field) != default) & (getattr(c, other) != needed)

  def message(c, i):
    value = names[_v(c, field, i)]
    value = label(value) if label else value
    return (f'= {show(value)} is not allowed with {other} = '
            f'{show(other_names[_v(c, other, i)])}: {why}')
  return Rule(field, bad, message)


def _te_only(field, what):
  """A :class:`Rule`: boolean ``field`` true only with the
  transformer_engine recipe (the only one with ``what`` to gather)."""
  return Rule(field,
              lambda c: np.asarray(getattr(c, field), dtype=bool) & (
                c.precision_recipe != RECIPE_TE),
              lambda c, i: '= true is not allowed: only the '
              f'"transformer_engine" precision recipe has {what} to gather')


def _procs_message(c, i):
  text = (f"= {_v(c, 'num_procs', i)} is not allowed: must equal "
          'tensor_par * pipeline_par * data_par')
  values = (f"{_v(c, 'tensor_par', i)} * {_v(c, 'pipeline_par', i)} * "
            f"{_v(c, 'data_par', i)}")
  if _v(c, 'context_par', i) != 1:
    text += ' * context_par'
    values += f" * {_v(c, 'context_par', i)}"
  return f'{text} = {values}'


RULES = (
  Rule('num_procs',
       lambda c: c.num_procs != c.tensor_par * c.pipeline_par * c.data_par *
       c.context_par, _procs_message),
  Rule('batch_size',
       lambda c: c.batch_size % c.data_par != 0,
       lambda c, i: f"= {_v(c, 'batch_size', i)} is not allowed: must be a "
       f"multiple of data_par = {_v(c, 'data_par', i)}"),
  Rule('microbatch_size',
       lambda c: (c.batch_size // c.data_par) % c.microbatch_size != 0,
       lambda c, i: f"= {_v(c, 'microbatch_size', i)} is not allowed: must "
       f"divide the local batch size batch_size / data_par = "
       f"{_v(c, 'batch_size', i) // _v(c, 'data_par', i)}"),
  Rule('activation_recompute',
       lambda c: (c.activation_recompute != RECOMPUTE_NONE) & ~c.training,
       lambda c, i: f"= {show(RECOMPUTE_NAMES[_v(c, 'activation_recompute', i)])}"
       ' is not allowed: recomputation exists only when training; use '
       '"none" with training = false'),
  Rule('pipeline_interleaving',
       lambda c: (c.pipeline_par == 1) & (c.pipeline_interleaving != 1),
       lambda c, i: f"= {_v(c, 'pipeline_interleaving', i)} is not allowed: "
       "must be 1 when pipeline_par = 1"),
  Rule('optimizer_sharding',
       lambda c: c.optimizer_sharding & (c.data_par * c.context_par <= 1),
       lambda c, i: '= true is not allowed: optimizer sharding needs '
       'data_par > 1' + (' or context_par > 1'
                         if _v(c, 'context_par', i) != 1 else '')),
  Rule('data_par_sharding',
       lambda c: (c.data_par_sharding != UNSET) & (
         c.optimizer_sharding != (c.data_par_sharding != SHARD_NONE)),
       lambda c, i: f"= {show(SHARDING_NAMES[_v(c, 'data_par_sharding', i)])}"
       ' is not allowed with optimizer_sharding = '
       f"{show(bool(_v(c, 'optimizer_sharding', i)))}: leave "
       'optimizer_sharding out, or make it true exactly when the level is '
       'not "none"'),
  Rule('data_par_sharding',
       lambda c: (c.data_par_sharding > SHARD_NONE) & ~c.training,
       lambda c, i: f"= {show(SHARDING_NAMES[_v(c, 'data_par_sharding', i)])}"
       ' is not allowed: sharding over data parallelism exists only when '
       'training; use "none"'),
  Rule('expert_par',
       lambda c: (c.tensor_par * c.data_par * c.context_par) % (
         c.expert_par * c.expert_tensor_par) != 0,
       lambda c, i: f"= {_v(c, 'expert_par', i)} is not allowed: "
       'expert_par * expert_tensor_par = '
       f"{_v(c, 'expert_par', i) * _v(c, 'expert_tensor_par', i)} must divide "
       'tensor_par * data_par * context_par = '
       f"{_v(c, 'tensor_par', i) * _v(c, 'data_par', i) * _v(c, 'context_par', i)}"
       ' (experts are folded onto the TP x DP x CP ranks of a pipeline stage, '
       'Megatron-Core MoE parallel folding)'),
  Rule('precision_recipe',
       lambda c: (c.precision_recipe == RECIPE_TE) & (
         (c.datatype != DATATYPE_NAMES.index('float8')) &
         (c.datatype != DATATYPE_NAMES.index('float4'))),
       lambda c, i: '= "transformer_engine" is not allowed with datatype '
       f"{show(DATATYPE_NAMES[_v(c, 'datatype', i)])}: it needs a narrow "
       'datatype ("float8" or "float4")'),
  Rule('tensor_par_overlap',
       lambda c: (c.tensor_par_overlap != TP_OVERLAP_NONE) & (c.tensor_par <= 1),
       lambda c, i: f"= {show(TP_OVERLAP_NAMES[_v(c, 'tensor_par_overlap', i)])}"
       ' is not allowed: TP communication overlap needs tensor_par > 1; use '
       '"none"'),
  _only_with('quantization_scaling', SCALING_NAMES, SCALING_DELAYED,
             'precision_recipe', PRECISION_RECIPE_NAMES, RECIPE_TE,
             'the casts it scales exist only with "transformer_engine"'),
  _only_with('recompute_modules', RECOMPUTE_MODULE_SETS, _CORE_ATTN_ONLY,
             'activation_recompute', RECOMPUTE_NAMES, RECOMPUTE_SELECTIVE,
             'modules are chosen only with "selective"',
             label=lambda label: label.split(',')),
  Rule('tensor_par_overlap_rs_dgrad',
       lambda c: ~np.asarray(c.tensor_par_overlap_rs_dgrad, dtype=bool) & (
         c.tensor_par_overlap == TP_OVERLAP_NONE),
       lambda c, i: '= false is not allowed: it qualifies a tiled TP '
       'overlap, which needs tensor_par_overlap = "ring" or "pipe"'),
  _te_only('tensor_par_narrow_all_gather', 'narrow GEMM inputs'),
  Rule('wide_saved_inputs',
       lambda c: np.asarray(c.wide_saved_inputs, dtype=bool) & (
         c.precision_recipe != RECIPE_TE),
       lambda c, i: '= true is not allowed: only the "transformer_engine" '
       'precision recipe keeps narrow linear inputs to widen'),
  _te_only('narrow_param_gather', 'narrow weights'),
  Rule('fsdp_buffer_copies',
       lambda c: c.fsdp_buffer_copies & (c.sharding != SHARD_PARAMETERS),
       lambda c, i: '= true is not allowed: the copies are FSDP\'s, which '
       'needs data_par_sharding = "parameters"'),
  Rule('seq_par_ag_redo',
       lambda c: c.seq_par_ag_redo & (c.tensor_par_comm_type != TP_COMM_RS_AG),
       lambda c, i: '= true is not allowed: redoing the all-gather needs '
       'tensor_par_comm_type = "rs_ag" (sequence parallelism)'),
  Rule('seq_par_ag_redo',
       lambda c: c.seq_par_ag_redo & (c.activation_recompute == RECOMPUTE_FULL),
       lambda c, i: '= true is not allowed with activation_recompute = '
       '"full" (full recomputation already redoes the all-gather)'),
  Rule('data_par_overlap',
       lambda c: c.data_par_overlap & ~c.training,
       lambda c, i: '= true is not allowed: DP communication exists only '
       'when training'),
  Rule('data_par_overlap',
       lambda c: c.data_par_overlap & (c.data_par * c.context_par <= 1),
       lambda c, i: '= true is not allowed: DP overlap needs data_par * '
       'context_par > 1 (the gradients are reduced over the DP x CP ranks)'),
  Rule('optimizer_offload',
       lambda c: c.optimizer_offload & ~c.training,
       lambda c, i: '= true is not allowed: the optimizer runs only when '
       'training'),
)


def rule_violations(columns):
  """Boolean mask (broadcast shape) of executions breaking any rule."""
  bad = np.zeros(columns.shape, dtype=bool)
  for rule in RULES:
    bad |= rule.bad(columns)
  return bad


def check_rules(columns, source='<execution>'):
  """Raises ConfigError for the first execution that breaks a rule.

  Raises:
    ConfigError: names the source, the execution (for batches), the field,
      its value and what is allowed.
  """
  shape = columns.shape
  with np.errstate(divide='ignore'):
    for rule in RULES:
      bad = np.broadcast_to(rule.bad(columns), shape)
      if bad.any():
        i = tuple(int(x) for x in np.argwhere(bad)[0])
        where = f' execution {i[0] if len(i) == 1 else i}:' \
          if shape not in ((), (1,)) else ''
        field = rule.field
        raise ConfigError(
          f"{source}:{where} field '{field}' {rule.message(columns, i)}",
          source=source, field=field, value=_v(columns, field, i))

