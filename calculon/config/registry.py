"""The field registry: every application, execution and system field, once.

Provides :data:`FIELDS` (name -> :class:`Field`, per kind), the categorical
value names the engine codes (``*_NAMES``), and helpers that the rest of the
project derives its tables from:

* validation: :mod:`calculon.config.execution` builds its field specs
  (Calculon's 23 and the optional ones) from here, and
  :mod:`calculon.config.application` its optional fields;
* framework presets (:mod:`calculon.frameworks`) may set only the
  execution fields marked ``behaviour`` or offer the ``option`` ones;
* the reference pages ``docs/reference/{applications,executions,
  systems}.md`` are generated from here (``python -m calculon.docs``);
* the report's listing of a run's fields, the published suite's field lists
  and the conventions' checks read it.

A new behaviour of a framework is one :class:`Field` here (``behaviour=
True``), its physics term in :mod:`calculon.llm.terms`, and its value in the
presets of ``frameworks/``.

Reads nothing of the project but :mod:`calculon.config._schema` (the
``Spec`` of a value).
"""

from calculon.config._schema import Spec

# -- categorical values (the engine works on their integer codes) -------------

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
SCALING_NAMES = ('delayed', 'current', 'block')
CROSS_ENTROPY_NAMES = ('fused', 'unfused', 'compiled', 'eager')
CONTEXT_PAR_COMM_NAMES = ('ring', 'all_gather')
DISPATCHER_NAMES = ('alltoall', 'allgather', 'deepep')
MOE_OVERLAP_NAMES = ('none', 'shared_experts', 'compute')
CHECKPOINT_LAYOUT_NAMES = ('whole', 'as_input')
OPTIMIZER_TRAFFIC_NAMES = ('state_once', 'fused_adam')
#: How a weight gradient reaches the gradient buffer (``wgrad_accumulation``).
WGRAD_ACCUMULATION_NAMES = ('fused', 'separate')
#: ``tiled_gemm_size``: the size at which each tile of a TP-overlapped GEMM
#: is priced.
TILED_GEMM_SIZE_NAMES = ('whole', 'tile')
#: Where the optimizer step runs when the optimizer state is offloaded
#: (``optimizer_offload_step``): on the device, the state streamed through
#: it (Calculon), or on the host with a fused (one-pass) or an unfused
#: (one kernel per operation) Adam.
OPTIMIZER_OFFLOAD_STEP_NAMES = ('device', 'host_fused', 'host_unfused')
#: Where the weight gradients live when the optimizer state is offloaded
#: (``optimizer_offload_gradients``): in memory tier 2 with a
#: double-buffered working set in tier 1 (Calculon), or whole in tier 1,
#: the host holding a copy for its step.
OPTIMIZER_OFFLOAD_GRADIENTS_NAMES = ('host', 'device')
#: Which of a processor's blocks keep their activations in memory tier 2
#: when activations are offloaded (``activation_offload_layers``).
ACTIVATION_OFFLOAD_LAYERS_NAMES = ('all', 'fit')
#: What of an offloaded block's stored activations crosses to memory tier 2
#: (``activation_offload_scope``).
ACTIVATION_OFFLOAD_SCOPE_NAMES = ('block', 'te_marked')
#: Communication buffers a TP-overlapped run allocates outside the
#: framework's allocator (``tp_overlap_buffers``).
TP_OVERLAP_BUFFER_NAMES = ('none', 'te_userbuffers')
#: ``cuda_graphs``: which CUDA graphs a run replays instead of launching
#: its kernels one by one.
CUDA_GRAPH_NAMES = ('none', 'layers', 'full_iteration')
#: ``gradient_shard_reduce``: when sharded gradients are reduce-scattered.
GRADIENT_SHARD_REDUCE_NAMES = ('batch', 'microbatch')
GRADIENT_DATATYPE_NAMES = ('float32', 'bfloat16', 'float16')
#: ``pipeline_schedule``: the pipeline schedules of the schedule table
#: (:mod:`calculon.llm.terms.schedules`), as the frameworks name them.
#: New names go last (a name's index is the engine's code).
PIPELINE_SCHEDULE_NAMES = ('1f1b', 'interleaved-1f1b', 'gpipe', 'looped-bfs',
                           'zb-h1', 'interleaved-zb', 'zbv', 'dualpipe',
                           'dualpipe-v')
#: Megatron-Core's selective-recomputation modules (--recompute-modules;
#: megatron/core/transformer/transformer_config.py ``recompute_modules``),
#: then PyTorch's per-op selective checkpointing as torchtitan sets it
#: ('alternate_linears'; torchtitan models/llama3/infra/parallelize.py,
#: _apply_ac_to_transformer_block, selective_ac_option 'op').  New names go
#: last: a set's code is its bit mask - 1.
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

#: Application values.
MLP_NAMES = ('plain', 'gated')
NORM_NAMES = ('layernorm', 'rmsnorm')
BIAS_NAMES = ('all', 'qkv', 'none')
POSITION_NAMES = ('learned', 'rope')
LAYOUT_NAMES = ('sequential', 'parallel')

#: Groups of fields, in the order the reference pages list them.
GROUPS = {
  'execution': ('parallelism', 'batch', 'schedule', 'memory', 'sharding',
                'communication', 'precision', 'kernels', 'moe', 'framework'),
  'application': ('shape', 'block', 'vocabulary', 'moe', 'mla',
                  'attention'),
  'system': ('processor', 'memory', 'host', 'network', 'overhead',
             'kernels'),
}

#: The value of a field that Calculon requires (no "absent" meaning).
REQUIRED = object()


class Field:
  """One field of an application, execution or system file.

  Attributes:
    name: JSON key (system sub-fields as a dotted path, e.g.
      ``networks[].rails``).
    kind: 'application', 'execution', 'system' or 'deployment'.
    spec: :class:`~calculon.config._schema.Spec` of the JSON value.
    names: categorical value names whose index is the engine's integer
      code (execution fields), or None.
    absent: the value that leaving the field out means, or
      :data:`REQUIRED`.
    absent_doc: what leaving it out means, in words.
    group: one of :data:`GROUPS` [kind].
    doc: one line: what it is.
    source: where its meaning comes from (paper section, framework file
      and commit), '' for plain quantities.
    calculon: one of Calculon's own fields.
    behaviour: (execution) what a framework does, not a choice a user
      makes: framework presets set it (``frameworks/``).
    unit: unit of a number ('' otherwise).
    requires: (field, values, why): a value other than the absent one is
      allowed only where execution field ``field`` takes one of ``values``
      (the rule :mod:`calculon.config.execution` checks), or None.
    bound: why the spec's upper bound (:data:`BOUNDS`) is what it is, or
      ''.
  """

  __slots__ = ('name', 'kind', 'spec', 'names', 'absent', 'absent_doc',
               'group', 'doc', 'source', 'calculon', 'behaviour', 'unit',
               'requires', 'bound')

  def __init__(self, name, kind, spec, group, doc, *, names=None,
               absent=REQUIRED, absent_doc='', source='', calculon=False,
               behaviour=False, unit='', requires=None):
    self.name, self.kind, self.spec = name, kind, spec
    self.names, self.absent, self.absent_doc = names, absent, absent_doc
    self.group, self.doc, self.source = group, doc, source
    self.calculon, self.behaviour, self.unit = calculon, behaviour, unit
    self.requires = requires
    self.bound = ''

  @property
  def required(self):
    """True for a field that must be given."""
    return self.absent is REQUIRED

  # -- the codec: a JSON value <-> the engine's code and column ------------
  #: Code of a categorical value left out (None).
  UNSET = -1

  @property
  def dtype(self):
    """numpy dtype of the field's engine column: bool, float64 for a
    number, int64 for an integer or a categorical code."""
    import numpy as np
    return bool if self.spec.kind == 'bool' else (
      np.float64 if self.spec.kind == 'number' else np.int64)

  def code(self, value):
    """The engine's code of a JSON value: a categorical value's index in
    :attr:`names` (``recompute_modules``: a set's index in
    :data:`RECOMPUTE_MODULE_SETS`, given as its label or its list of
    names), :attr:`UNSET` for None, any other value as is.

    Raises:
      ValueError: a name the field does not have.
    """
    if value is None:
      return self.UNSET
    if self.name == 'recompute_modules':
      if not isinstance(value, str):
        value = ','.join(m for m in RECOMPUTE_MODULES if m in value)
      return RECOMPUTE_MODULE_SETS.index(value)
    if self.names is not None:
      return self.names.index(value)
    return value

  def value(self, code):
    """The JSON value of an engine code (a numpy scalar or a Python
    number): the name (``recompute_modules``: its list of names; None for
    :attr:`UNSET`), a bool, an int or a float."""
    code = code.item() if hasattr(code, 'item') else code
    if self.names is not None:
      if int(code) == self.UNSET:
        return None
      name = self.names[int(code)]
      return name.split(',') if self.name == 'recompute_modules' else name
    if self.spec.kind == 'bool':
      return bool(code)
    if self.spec.kind == 'int':
      # An integer left out (absent None) is coded UNSET.
      return None if self.absent is None and int(code) == self.UNSET \
        else int(code)
    return float(code)

  def allowed(self):
    """Human text of the values allowed (the spec's)."""
    if self.name == 'recompute_modules':
      return ('a non-empty list of distinct names among ' +
              ', '.join(RECOMPUTE_MODULES))
    return self.spec.describe()

  def __repr__(self):
    return f'Field({self.kind}.{self.name})'


_INT1 = Spec('int', lo=1)
_INT0 = Spec('int', lo=0)
_BOOL = Spec('bool')


def _choice(names):
  return Spec('str', choices=names)


def _ex(name, spec, group, doc, **kw):
  return Field(name, 'execution', spec, group, doc, **kw)


def _calc(name, spec, group, doc, **kw):
  return Field(name, 'execution', spec, group, doc, calculon=True, **kw)


def _beh(name, spec, group, doc, **kw):
  return Field(name, 'execution', spec, group, doc, behaviour=True, **kw)


_TIER = 'index of the system network tier it uses'

#: Execution fields: Calculon's 23 in the reference's order, then the
#: optional ones (absent, each means exactly what Calculon means).
EXECUTION = (
  _calc('num_procs', _INT1, 'parallelism',
        'processors; TP x PP x DP x CP', unit='processors'),
  _calc('tensor_par', _INT1, 'parallelism', 'tensor parallelism (TP)',
        source='Shoeybi et al. 2019, Megatron-LM, section 3'),
  _calc('pipeline_par', _INT1, 'parallelism', 'pipeline parallelism (PP)',
        source='Narayanan et al. SC21, section 2.2'),
  _calc('data_par', _INT1, 'parallelism', 'data parallelism (DP)'),
  _calc('tensor_par_net', _INT0, 'parallelism', f'TP: {_TIER}'),
  _calc('pipeline_par_net', _INT0, 'parallelism', f'PP: {_TIER}'),
  _calc('data_par_net', _INT0, 'parallelism', f'DP: {_TIER}'),
  _calc('batch_size', _INT1, 'batch',
        'global batch; a multiple of data_par', unit='samples'),
  _calc('microbatch_size', _INT1, 'batch',
        'microbatch; divides batch_size / data_par', unit='samples'),
  _calc('datatype', _choice(DATATYPE_NAMES), 'precision',
        'element datatype of weights, activations and GEMMs',
        names=DATATYPE_NAMES),
  _calc('fused_activation', _BOOL, 'kernels',
        'the MLP activation fused into its GEMM (keeps no activation)'),
  _calc('attention_type', _choice(ATTENTION_NAMES), 'kernels',
        'multihead, multiquery or grouped-query attention',
        names=ATTENTION_NAMES, absent=None,
        absent_doc="as the application's kv_heads say (when it has them)"),
  _calc('activation_recompute', _choice(RECOMPUTE_NAMES), 'memory',
        'activation recomputation in the backward pass (training only)',
        names=RECOMPUTE_NAMES,
        source='Chen et al. 2016 (full); Korthikanti et al. 2022, section '
        '5 (selective)'),
  _calc('pipeline_interleaving', _INT1, 'schedule',
        'model chunks per processor (the interleaved 1F1B schedule); 1 '
        'with PP = 1', source='Narayanan et al. SC21, section 2.2.2'),
  _calc('optimizer_sharding', _BOOL, 'sharding',
        "shard over DP (Calculon's flag: the level 'gradients', see "
        'data_par_sharding)', absent=None,
        absent_doc='as data_par_sharding says'),
  _calc('tensor_par_comm_type', _choice(TP_COMM_NAMES), 'communication',
        "TP communication: 'ar' all-reduce, 'rs_ag' sequence parallelism, "
        "'p2p_rs_ag' RS/AG only at pipeline edges", names=TP_COMM_NAMES,
        source='Korthikanti et al. 2022, section 4.2.2; Narayanan et al. '
        'SC21, section 4.1'),
  _calc('tensor_par_overlap', _choice(TP_OVERLAP_NAMES), 'communication',
        'tiled TP communication overlapped with the GEMMs (needs TP > 1)',
        names=TP_OVERLAP_NAMES,
        source='Wang et al. ASPLOS 2023; Transformer Engine userbuffers'),
  _calc('seq_par_ag_redo', _BOOL, 'communication',
        "redo sequence parallelism's all-gather in the backward pass "
        "instead of keeping its output ('rs_ag', not with full "
        'recomputation)', source='Korthikanti et al. 2022, section 4.2.2'),
  _calc('data_par_overlap', _BOOL, 'sharding',
        'DP communication overlapped with the backward pass (training, '
        'DP x CP > 1)'),
  _calc('weight_offload', _BOOL, 'memory',
        'weights kept in memory tier 2, streamed in per block'),
  _calc('activations_offload', _BOOL, 'memory',
        'activations (checkpoints) kept in memory tier 2'),
  _calc('optimizer_offload', _BOOL, 'memory',
        'optimizer state kept in memory tier 2'),
  _calc('training', _BOOL, 'batch',
        'true: a training step; false: a forward pass only (inference)'),
  # -- beyond Calculon ---------------------------------------------------------
  _ex('framework', Spec('str'), 'framework',
      'the framework preset whose behaviours fill the fields this '
      'execution leaves out (frameworks/NAME.json)', absent=None,
      absent_doc="'calculon' for a Calculon application and execution, "
      "else the recommended modern preset (see calculon frameworks)"),
  _ex('context_par', _INT1, 'parallelism',
      'context parallelism (CP): the sequence split over CP ranks, ring '
      'attention passing K/V chunks; 2 x CP must divide the sequence',
      absent=1, absent_doc='1',
      source='Liu et al. 2023, Ring Attention; Megatron-Core context '
      'parallelism'),
  _ex('context_par_net', _INT0, 'parallelism', f'CP: {_TIER}', absent=0,
      absent_doc='tier 0'),
  _ex('data_par_sharding', _choice(SHARDING_NAMES), 'sharding',
      "what is sharded over DP x CP: 'optimizer' (ZeRO-1, Megatron-Core's "
      "distributed optimizer), 'gradients' (ZeRO-2), 'parameters' "
      '(ZeRO-3, FSDP: weights gathered per block)', names=SHARDING_NAMES,
      absent=None, absent_doc="as optimizer_sharding says (true: "
      "'gradients', Calculon's accounting)",
      source='Rajbhandari et al. SC20, ZeRO, sections 5 and 7'),
  _ex('attention_kernel', _choice(ATTENTION_KERNEL_NAMES), 'kernels',
      "'flash': FlashAttention (no s x s scores kept, recomputed in the "
      'backward pass)', names=ATTENTION_KERNEL_NAMES, absent='standard',
      absent_doc="'standard' (the scores are kept)",
      source='Dao et al. 2022, FlashAttention; Dao 2023, '
      'FlashAttention-2'),
  _ex('precision_recipe', _choice(PRECISION_RECIPE_NAMES), 'precision',
      "'transformer_engine': only the linear layers' GEMMs in the narrow "
      'datatype, the rest in bfloat16, 16-bit weights plus a narrow copy',
      names=PRECISION_RECIPE_NAMES, absent='uniform',
      absent_doc="'uniform': everything in datatype",
      source='NVIDIA Transformer Engine, "Using FP8 with Transformer '
      'Engine"; Micikevicius et al. 2022'),
  _ex('gradient_datatype', _choice(GRADIENT_DATATYPE_NAMES), 'precision',
      'precision of the gradients kept and reduced over DP',
      names=DATATYPE_NAMES, absent=None,
      absent_doc="Calculon's: in datatype, with an fp32 accumulation "
      'buffer for the block being computed',
      source='Megatron-LM --accumulate-allreduce-grads-in-fp32, '
      '--grad-reduce-in-bf16'),
  _ex('expert_par', _INT1, 'parallelism',
      'expert parallelism (EP): divides num_experts; EP x ETP divides TP x '
      'DP x CP', absent=1, absent_doc='1',
      source='Megatron-Core MoE parallel folding (Liu et al. 2025, arXiv '
      '2504.14960)'),
  _ex('expert_par_net', _INT0, 'parallelism', f'EP: {_TIER}', absent=0,
      absent_doc='tier 0'),
  _ex('expert_tensor_par', _INT1, 'parallelism',
      'TP inside an expert (ETP)', absent=1,
      absent_doc="1 (Megatron-Core's default)"),
  _ex('moe_dispatcher', _choice(DISPATCHER_NAMES), 'moe',
      "token dispatch and combine: 'alltoall', 'allgather', or 'deepep' "
      '(DeepEP or HybridEP: each token goes to a rank holding its experts '
      'once, and crosses the network once per destination node)',
      names=DISPATCHER_NAMES, absent='alltoall', absent_doc="'alltoall'",
      source='DeepSeek-V3 technical report, section 3.2.2; DeepEP '
      'deep_ep/buffer.py (is_token_in_rank) and hybrid_ep_buffer.py'),
  _ex('moe_comm_overlap', _choice(MOE_OVERLAP_NAMES), 'moe',
      'dispatch and combine hidden behind the shared experts or the rest '
      "of the block's compute", names=MOE_OVERLAP_NAMES, absent='none',
      absent_doc="'none' (exposed)",
      source='Megatron-Core --moe-shared-expert-overlap, '
      '--overlap-moe-expert-parallel-comm; DeepSeek-V3 DualPipe'),
  _ex('expert_imbalance', Spec('number', lo=1), 'moe',
      'tokens of the busiest expert over the average (the step waits for '
      'it)', absent=1.0, absent_doc='1 (balanced)'),
  _ex('pipeline_schedule', _choice(PIPELINE_SCHEDULE_NAMES), 'schedule',
      "the pipeline schedule (with PP > 1): '1f1b' (VP = 1) and "
      "'interleaved-1f1b' (VP > 1) Narayanan et al.'s; 'gpipe' all "
      "forwards, then all backwards (VP = 1); 'looped-bfs' breadth-first "
      "over VP > 1 chunks; 'zb-h1' zero-bubble 1F1B, the weight gradients "
      "deferred into the bubble (VP = 1); 'interleaved-zb' the same over "
      "VP > 1 chunks; 'zbv' zero-bubble over two chunks a rank in a V "
      "(VP = 2); 'dualpipe' DeepSeek's bidirectional schedule, each rank "
      "holding its stage and the mirrored one, two parameter copies (VP = "
      "1, even PP, microbatches even and >= 2 PP); 'dualpipe-v' its "
      "V-shaped half, two chunks a rank (VP = 2, microbatches >= 2 PP). "
      'Bubble, microbatches in flight and parameter copies of each: the '
      'schedule table, calculon/llm/terms/schedules.py',
      names=PIPELINE_SCHEDULE_NAMES, absent=None,
      absent_doc="'1f1b', or 'interleaved-1f1b' with "
      'pipeline_interleaving > 1 (Calculon)',
      source='Narayanan et al. SC21; Huang et al. 2019 (GPipe); '
      'Lamy-Poirier 2022 (breadth-first); Qi et al. ICLR 2024, arXiv '
      '2401.10241 (ZB-H1, ZB-V); DeepSeek-V3 technical report, arXiv '
      '2412.19437, section 3.2.1, and deepseek-ai/DualPipe README '
      '(3da1bbea5); PyTorch torch/distributed/pipelining/schedules.py '
      '(00722e648b) get_schedule_class'),
  _ex('pipeline_first_stage_blocks', _INT1, 'schedule',
      'uneven pipeline stages: transformer blocks of the first pipeline '
      'rank, the one with the embedding, over its pipeline_interleaving '
      'chunks (a multiple of it); the ranks neither this nor '
      'pipeline_last_stage_blocks sets split the remaining blocks evenly. '
      'Megatron-Core: TransformerConfig num_layers_in_first_pipeline_stage '
      '(Megatron-LM --decoder-first-pipeline-num-layers N), or the '
      'pipeline_model_parallel_layout string: PP x VP stages separated by '
      "'|', stage v PP + r being rank r's chunk v (v = 0 .. VP - 1), each "
      "stage its blocks as 't' (x*n repeats x n times, (...)*n a group, "
      "commas ignored), 'E' opening stage 0 and 'L' closing the last; with "
      'F first-rank, M middle-rank and L last-rank blocks, for each v: '
      "F/VP x 't', then M/VP x 't' for each of the PP - 2 middle ranks, "
      "then L/VP x 't' (Llama 3 70B, PP 8, F = L = 7: "
      "'Et*7|(t*11|)*6t*7L'); torchtitan: "
      'module_fqns_per_model_part, tok_embeddings and N layers in the first '
      "rank's parts", absent=None,
      absent_doc='the even split (Calculon: blocks / PP rounded up, the '
      'later stages one block less where PP does not divide them)',
      unit='blocks',
      source='Megatron-Core megatron/core/transformer/transformer_block.py '
      'get_num_layers_to_build (num_layers_in_first_pipeline_stage // '
      'vp_size a virtual chunk, the middle layers over the middle ranks); '
      'megatron/core/transformer/pipeline_parallel_layer_layout.py '
      '(b1030e9dd) PipelineParallelLayerLayout.__init__ (stage v PP + r '
      'on rank r) and parse_str_to_list; torchtitan '
      'torchtitan/config/configs.py (b5bcd76c6) module_fqns_per_model_part, '
      'pipeline_parallel_first_stage_less_layers'),
  _ex('pipeline_last_stage_blocks', _INT1, 'schedule',
      'uneven pipeline stages: transformer blocks of the last pipeline rank '
      '(the one with the LM head and the loss, but with the V schedules, '
      'zbv and dualpipe-v, which run both ends on the first rank), over its '
      'chunks; see pipeline_first_stage_blocks. Megatron-Core: '
      'num_layers_in_last_pipeline_stage (--decoder-last-pipeline-num-layers '
      "N), or the layout's last rank N/VP x 't' a chunk, 'L' after its "
      "last (see pipeline_first_stage_blocks); torchtitan: "
      "module_fqns_per_model_part, N layers, norm and output in the last "
      "rank's parts", absent=None,
      absent_doc='the even split (Calculon)', unit='blocks',
      source='Megatron-Core transformer_block.py get_num_layers_to_build '
      '(num_layers_in_last_pipeline_stage); torchtitan '
      'pipeline_parallel_last_stage_less_layers'),
  # -- framework behaviours -------------------------------------------------------
  _beh('checkpoint_layout', _choice(CHECKPOINT_LAYOUT_NAMES), 'memory',
       "full recomputation's block-input checkpoint: 'as_input' as the "
       'rank holds the input (sequence-sharded with sequence parallelism)',
       names=CHECKPOINT_LAYOUT_NAMES, absent='whole',
       absent_doc="'whole': every TP rank keeps the whole input (Calculon)",
       source='Korthikanti et al. 2022, section 4.2.2 (Megatron-LM '
       'checkpoints the block input, [s/t, b, h] with '
       '--sequence-parallel)'),
  _beh('param_gather_overlap', _BOOL, 'sharding',
       'with DP overlap and a sharded optimizer, the all-gather of the '
       "updated weights hides behind the next step's forward pass",
       absent=False, absent_doc='false: it overlaps the backward pass '
       'with the reduce-scatter (Calculon)',
       source='Megatron-Core distributed optimizer, --overlap-param-gather'),
  _beh('tensor_par_async_backward', _BOOL, 'communication',
       'with TP > 1 and no tiled overlap: the backward TP all-reduce '
       '(reduce-scatter) of a column-parallel linear runs behind its '
       'weight-gradient GEMM', absent=False,
       absent_doc='false: all exposed (Calculon)',
       source='Megatron-LM LinearWithGradAccumulationAndAsyncCommunication; '
       'Transformer Engine Linear'),
  _beh('tensor_par_overlap_rs_dgrad', _BOOL, 'communication',
       'with a tiled TP overlap: the input-gradient reduce-scatter of a '
       'column-parallel layer is tiled with its GEMM too (false: run whole '
       'after it, exposed)', absent=True,
       absent_doc='true (Calculon)',
       source='torch/_inductor/fx_passes/micro_pipeline_tp.py '
       'fuse_matmul_reduce_scatter (one producing matmul only)',
       requires=('tensor_par_overlap', ('ring', 'pipe'),
                 'it qualifies a tiled TP overlap')),
  _beh('tensor_par_overlap_efficiency', Spec('number', lo=0, hi=1),
       'communication',
       'with a tiled TP overlap: the share of what the tiling hides that '
       "the framework's overlap realizes (each tiled GEMM's time and "
       'exposed communication lie that far from the untiled ones toward '
       "the tiled ones)", absent=1.0,
       absent_doc="1: every tile's transfer behind the neighbouring "
       "tile's GEMM (Calculon's tiling)",
       source='measured A/B speedups of the framework\'s overlap '
       '(validation/tp_overlap_pairs.csv, '
       'validation/fit_overlap_efficiency.py)',
       requires=('tensor_par_overlap', ('ring', 'pipe'),
                 'it qualifies a tiled TP overlap')),
  _beh('context_par_comm', _choice(CONTEXT_PAR_COMM_NAMES), 'communication',
       "with CP > 1, how the CP ranks exchange K and V: 'ring' passes one "
       'K/V chunk a step, each transfer behind the attention of the chunk '
       "before; 'all_gather' gathers every rank's K and V once a layer "
       'behind the attention of the local chunk (and in the backward pass '
       'gathers them again and reduce-scatters their gradients behind the '
       "local chunk's backward)", names=CONTEXT_PAR_COMM_NAMES,
       absent='ring', absent_doc="'ring' (Megatron-Core's --cp-comm-type "
       'p2p default)',
       source="Megatron-Core --cp-comm-type (p2p, the default, or "
       "all_gather: Transformer Engine AttnFuncWithCPAndKVP2P / "
       "AttnFuncWithCPAndKVAllGather); PyTorch's context parallelism, "
       "which torchtitan runs (torch/distributed/tensor/experimental/"
       "_context_parallel/_attention.py: rotate_method ALL_GATHER by "
       "default, _AllGatherRotater); Llama 3 (Grattafiori et al. 2024, "
       "arXiv 2407.21783) section 3.3.2: all-gather based CP, 'the "
       "all-gather communication latency is exposed in the critical "
       "path'"),
  _beh('tiled_gemm_size', _choice(TILED_GEMM_SIZE_NAMES), 'communication',
       "with a tiled TP overlap: 'tile': an overlapped GEMM runs as the "
       "chunk GEMMs Transformer Engine's userbuffers split it into (TP for "
       'a ring-exchange all-gather, 4 for the pipelined reduce-scatter of '
       "a forward pass, one for a bulk overlap), each priced at the matrix "
       'efficiency of its own size', names=TILED_GEMM_SIZE_NAMES,
       absent='whole',
       absent_doc="'whole': every tile at the efficiency of the whole GEMM "
       "(Calculon's tiling)",
       source='Transformer Engine transformer_engine/common/comm_gemm_overlap/'
       'comm_gemm_overlap.cpp (d0067d0da): CommOverlapP2PBase::'
       'split_overlap_ag and split_overlap_rs launch one nvte_cublas_gemm '
       'per chunk of the rows; transformer_engine/pytorch/module/base.py '
       'initialize_ub: num_splits tp_size (ring_exchange: qkv_fprop, '
       'fc1_fprop, proj_dgrad, fc2_dgrad), 4 (pipeline: proj_fprop, '
       'fc2_fprop), bulk for qkv_dgrad and fc1_dgrad',
       requires=('tensor_par_overlap', ('ring', 'pipe'),
                 'it qualifies a tiled TP overlap')),
  _beh('tensor_par_narrow_all_gather', _BOOL, 'communication',
       "with 'transformer_engine' and sequence parallelism: the TP "
       'all-gathers feeding narrow GEMMs move the narrow datatype',
       absent=False, absent_doc='false: every TP transfer in 16 bits',
       source='Transformer Engine module/layernorm_linear.py, '
       'module/base.py grad_output_preprocess; torchao '
       'float8_tensor_parallel.py',
       requires=('precision_recipe', ('transformer_engine',),
                 'only that recipe has narrow GEMM inputs to gather')),
  _beh('narrow_param_gather', _BOOL, 'communication',
       "with 'transformer_engine' and a sharded optimizer or FSDP: the "
       "linear weights are all-gathered in the narrow datatype (the "
       "optimizer's updated weights, FSDP's per-block gathers)",
       absent=False, absent_doc='false: in 16 bits',
       source='Megatron-Core --fp8-param-gather (Megatron-FSDP '
       'fp8_param_gather); torchao Float8LinearConfig '
       'enable_fsdp_float8_all_gather (torchao/float8/fsdp_utils.py)',
       requires=('precision_recipe', ('transformer_engine',),
                 'only that recipe has narrow weights to gather')),
  _beh('pipeline_split_counts_vocab', _BOOL, 'schedule',
       'with PP > 1: the pipeline split counts the embedding and the LM '
       'head with the loss as one block each', absent=False,
       absent_doc='false: the end stages carry them on top of their blocks',
       source='Megatron-Core --account-for-embedding-in-pipeline-split, '
       '--account-for-loss-in-pipeline-split'),
  _ex('quantization_scaling', _choice(SCALING_NAMES), 'precision',
      "with 'transformer_engine': how the casts find their scales: "
      "'delayed' (amax history), 'current' (an amax pass first), 'block' "
      '(MXFP8/NVFP4 block scales)', names=SCALING_NAMES, absent='delayed',
      absent_doc="'delayed'",
      source='Transformer Engine DelayedScaling, Float8CurrentScaling; OCP '
      'Microscaling Formats v1.0',
      requires=('precision_recipe', ('transformer_engine',),
                'the casts it scales exist only with that recipe')),
  _ex('recompute_modules', Spec('list'), 'memory',
      "with 'selective' recomputation, the modules recomputed "
      "(Megatron-Core's --recompute-modules; 'alternate_linears': "
      "torchtitan's per-op selective checkpointing)",
      names=RECOMPUTE_MODULE_SETS, absent='core_attn',
      absent_doc="['core_attn'] (Korthikanti et al.'s selective "
      'recomputation)',
      source='megatron/core/transformer/transformer_config.py '
      'recompute_modules; torchtitan _apply_ac_to_transformer_block',
      requires=('activation_recompute', ('selective',),
                'modules are chosen only for selective recomputation')),
  _beh('fsdp_buffer_copies', _BOOL, 'sharding',
       "with 'parameters' sharding: FSDP copies the gathered weights out of "
       'the all-gather buffer and the gradients into the reduce-scatter '
       'buffer, on the compute stream', absent=False,
       absent_doc='false: gathered and reduced in place (Megatron-FSDP, '
       'ZeRO-3)',
       source='torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py '
       'foreach_all_gather_copy_out, foreach_reduce',
       requires=('data_par_sharding', ('parameters',),
                 "the copies are FSDP's")),
  _beh('cross_entropy_kernel', _choice(CROSS_ENTROPY_NAMES), 'kernels',
       "the loss: 'fused' one kernel on the 16-bit logits; 'unfused' "
       "float32 logits and separate element-wise kernels; 'compiled' "
       'torch.compile of cross_entropy on float32-cast logits (Inductor '
       'keeps the 16-bit logits and per-row max and logsumexp, writes a '
       "16-bit gradient); 'eager' PyTorch's cross_entropy on float32-cast "
       "logits: as 'unfused' at TP 1, and with TP > 1 DTensor's "
       'loss_parallel decomposition, whose backward holds one more float32 '
       'logits buffer and moves 24 more bytes a logit)',
       names=CROSS_ENTROPY_NAMES, absent='fused', absent_doc="'fused'",
       source='Megatron-Core --cross-entropy-loss-fusion; Megatron-LM '
       'vocab_parallel_cross_entropy; PyTorch cross_entropy; torchtitan '
       'torchtitan/components/loss.py build_cross_entropy_loss (since '
       'bbb1b616e, 2025-04-02: torch.compile(loss_fn) with '
       'training.compile); torch/distributed/tensor/parallel/loss.py '
       '_log_softmax and _nll_loss_and_log_softmax_backward (read in '
       '2.13; measured with 2.11 on an H200, benchmarks/'
       'gpu_loss_memory.py)'),
  _beh('fused_activation_keeps_input', _BOOL, 'kernels',
       'a fused MLP activation (GeLU, SwiGLU) keeps its input for the '
       'backward pass', absent=False,
       absent_doc='false: a fused activation keeps nothing (Calculon)',
       source='Megatron-Core megatron/core/fusions/fused_bias_swiglu.py '
       'BiasSwiGLUFunction and fused_bias_gelu.py GeLUFunction: '
       'ctx.save_for_backward(input, bias)'),
  _beh('moe_probs_in_activation', _BOOL, 'moe',
       "the router probabilities scale the experts' activation, so the "
       'combine keeps no expert outputs', absent=False,
       absent_doc='false: the combine scales and keeps them',
       source='Megatron-Core commit 2659630721 (core_v0.13.0), '
       'activation_func_with_probs'),
  _beh('wide_saved_inputs', _BOOL, 'precision',
       "with 'transformer_engine': the linear layers keep their 16-bit "
       'input for the backward pass', absent=False,
       absent_doc='false: the narrow input (Transformer Engine)',
       source='torchao float8_linear.py matmul_with_hp_or_float8_args '
       '(e76db70ec)',
       requires=('precision_recipe', ('transformer_engine',),
                 'only that recipe keeps narrow linear inputs to widen')),
  _beh('pipeline_par_overlap', _BOOL, 'schedule',
       'with PP > 1 and VP > 1: the steady-state pipeline transfers run '
       'behind compute, the warm-up and flush ones block', absent=False,
       absent_doc='false: every transfer exposed (Calculon)',
       source='Megatron-Core --overlap-p2p-communication '
       '(pipeline_parallel/schedules.py)'),
  _beh('pipeline_warmup_capped', _BOOL, 'schedule',
       'with PP > 1 and VP > 1: the warm-up never runs more forwards than '
       'the batch has chunk-microbatches, so a rank keeps at most every '
       'microbatch of its blocks', absent=False,
       absent_doc='false: 1 + (PP - 1) / (VP PP) times min(nmb, PP) '
       'microbatches in flight, uncapped (Calculon)',
       source='Megatron-LM megatron/schedules.py dd88906264 (2020): '
       'min(num_warmup_microbatches, num_microbatches); PyTorch '
       'torch/distributed/pipelining/schedules.py ScheduleInterleaved1F1B '
       'get_rank_warmup_ops'),
  _beh('fused_dropout_add', _BOOL, 'kernels',
       'with dropout: the dropout of the attention and MLP outputs runs '
       "inside the residual addition's kernel", absent=False,
       absent_doc='false: a separate dropout kernel (Calculon)',
       source='Megatron-LM bias_dropout_add_fused_train (default since '
       '9acc895632)'),
  _beh('optimizer_traffic', _choice(OPTIMIZER_TRAFFIC_NAMES), 'kernels',
       "the optimizer step's memory traffic: 'fused_adam' every pass of a "
       'mixed-precision Adam step (38 bytes per parameter with bfloat16, '
       '46 with float16)', names=OPTIMIZER_TRAFFIC_NAMES,
       absent='state_once',
       absent_doc="'state_once': the state read once, 12 bytes (Calculon)",
       source='Megatron-LM MixedPrecisionOptimizer.step; apex '
       'multi_tensor_adam.cu; PyTorch _fused_adamw_'),
  _beh('wgrad_accumulation', _choice(WGRAD_ACCUMULATION_NAMES), 'kernels',
       "how a weight gradient reaches the gradient buffer: 'separate' the "
       'weight-gradient GEMM writes a 16-bit gradient that one more kernel '
       'adds into the accumulation buffer each microbatch (2 + 2 x its '
       'width bytes per weight), or under FSDP copies into the kept '
       'gradients (2 + their width)',
       names=WGRAD_ACCUMULATION_NAMES, absent='fused',
       absent_doc="'fused': the GEMM accumulates into the buffer itself "
       '(Megatron-LM --gradient-accumulation-fusion; Calculon)',
       source='Megatron-Core gradient_accumulation_fusion '
       '(megatron/core/tensor_parallel/layers.py '
       'LinearWithGradAccumulationAndAsyncCommunication: '
       'fused_weight_gradient_mlp_cuda wgrad_gemm_accum_fp32, else the DDP '
       "hook's main_grad.add_, Megatron-FSDP's main_grad.copy_)"),
  _beh('optimizer_offload_step', _choice(OPTIMIZER_OFFLOAD_STEP_NAMES),
       'memory',
       'with the optimizer state offloaded: where its step runs. '
       "'host_fused': on the host, one pass over the shard (DeepSpeedCPUAdam, "
       "PyTorch's fused AdamW on the CPU); 'host_unfused': on the host, "
       "PyTorch's AdamW one operation at a time; either way the gradients "
       'cross the host link to it and the updated weights back, and the '
       'state stays on the host', names=OPTIMIZER_OFFLOAD_STEP_NAMES,
       absent='device',
       absent_doc="'device': the state streamed through the device with "
       'each block (Calculon)',
       source='DeepSpeed ZeRO-Offload (Ren et al. ATC21; csrc/adam/'
       'cpu_adam_impl.cpp); Megatron-Core optimizer/cpu_offloading/'
       'hybrid_optimizer.py (torch.optim.AdamW on the CPU); PyTorch FSDP2 '
       'CPUOffloadPolicy'),
  _beh('optimizer_offload_gradients',
       _choice(OPTIMIZER_OFFLOAD_GRADIENTS_NAMES), 'memory',
       "with the optimizer state offloaded: 'device': the weight-gradient "
       'buffer stays whole in memory tier 1 (the framework reduces into it '
       'as without offload) and tier 2 holds a copy of the shard\'s '
       'gradients that the host step reads',
       names=OPTIMIZER_OFFLOAD_GRADIENTS_NAMES, absent='host',
       absent_doc="'host': the weight gradients live in memory tier 2, a "
       'double-buffered working set in tier 1 (Calculon)',
       source='Megatron-Core megatron/core/optimizer/cpu_offloading/'
       'hybrid_optimizer.py (d98e8a64dd) HybridDeviceOptimizer.'
       '_set_sub_optimizer_grads: each step copies the GPU parameter\'s '
       'grad (the DDP grad buffer, distributed/param_and_grad_buffer.py) '
       'into a pinned CPU tensor; the buffer itself is never freed'),
  _beh('activation_offload_layers', _choice(ACTIVATION_OFFLOAD_LAYERS_NAMES),
       'memory',
       "with activations offloaded: 'fit': only the fewest of the "
       "processor's blocks (at most all but one) whose offloaded activations "
       'make the execution fit its memory, their transfers spread over the '
       "whole forward and backward pass", names=ACTIVATION_OFFLOAD_LAYERS_NAMES,
       absent='all',
       absent_doc="'all': every block's activations in memory tier 2, a "
       'double-buffered working set in tier 1 (Calculon)',
       source='Megatron-Core transformer_config.py cpu_offloading_num_layers '
       '(< num_layers); Transformer Engine pytorch/cpu_offload.py '
       '(layers 0..k-1 offloaded, layer i done by layer L - k + i)'),
  _beh('activation_offload_scope', _choice(ACTIVATION_OFFLOAD_SCOPE_NAMES),
       'memory',
       "with activations offloaded: 'te_marked': only the tensors "
       'Transformer Engine modules mark for CPU offload cross to tier 2 '
       "(the inputs a Linear, LayerNormLinear or LayerNormMLP saves, the "
       "non-context-parallel attention's q, k, v and output); the rest of "
       "an offloaded block's stored activations (a fused activation's "
       'input, MoE routing, permutation and grouped expert GEMM inputs, '
       'context-parallel attention, dropout masks) stays in tier 1',
       names=ACTIVATION_OFFLOAD_SCOPE_NAMES, absent='block',
       absent_doc="'block': all of an offloaded block's stored activations "
       '(Calculon)',
       source='Transformer Engine v2.0-v2.9 pytorch/cpu_offload.py '
       'tensor_need_offloading_checker_activations (only tensors with '
       'activation_offloading, set by mark_activation_offload from '
       'module/linear.py, layernorm_linear.py, layernorm_mlp.py and '
       'attention/dot_product_attention/backends.py outside context '
       'parallelism); v2.10 (c52576053) offloads every saved tensor'),
  _beh('tp_overlap_buffers', _choice(TP_OVERLAP_BUFFER_NAMES), 'memory',
       "with a tiled TP overlap (tensor_par_overlap 'ring' or 'pipe', TP > "
       "1): 'te_userbuffers': Transformer Engine's userbuffers, one "
       'communication buffer per overlapped GEMM of a transformer layer, '
       'each of the layer input\'s shape (sequence x microbatch / CP, '
       'hidden): the 8 all-gather buffers (qkv, proj, fc1, fc2 forward or '
       'gradient GEMMs) in the narrow datatype where the all-gather carries '
       'it (tensor_par_narrow_all_gather), else 16-bit, the 4 '
       'reduce-scatter buffers 16-bit; registered with cuMemCreate or '
       "cudaMalloc, outside PyTorch's allocator",
       names=TP_OVERLAP_BUFFER_NAMES, absent='none',
       absent_doc="'none': the overlap holds no memory beyond the tensors "
       '(Calculon)',
       source='Transformer Engine transformer_engine/pytorch/module/base.py '
       'initialize_ub (layers_all_gather_overlap, '
       'layers_reduce_scatter_overlap, fp8_buf; one add_ub per GEMM name) '
       'and common/comm_gemm_overlap/comm_gemm_overlap.cpp CommOverlapBase:'
       ':initialize, CommOverlapP2PBase::initialize at d0067d0da; '
       'Megatron-LM megatron/training/initialize.py '
       '_initialize_tp_communicators (shape [seq_length x micro_batch_size '
       '/ context_parallel_size, hidden_size]) at d98e8a64dd'),
  _ex('cuda_graphs', _choice(CUDA_GRAPH_NAMES), 'kernels',
       "CUDA graphs the run replays: 'layers': per-layer graphs of some "
       'modules (Megatron-Core cuda_graph_impl transformer_engine or local, '
       'cuda_graph_modules such as attn, moe_router, moe_preprocess), which '
       "leave 0.777 of the MoE blocks' eager host time (the MoE host floor "
       'scaled by the step time measured with and without them, Megatron-'
       'Bridge skills/nemo-mbridge-perf-cuda-graphs/card.yaml, 067f987df); '
       "'full_iteration': one graph of the "
       'whole forward and backward pass, replayed with one launch, so the '
       'MoE blocks never wait for the host (no MoE host floor)',
       names=CUDA_GRAPH_NAMES, absent='none',
       absent_doc="'none': every kernel launched by the host (the MoE host "
       'floor of the system file holds)',
       source='Megatron-Core megatron/core/transformer/transformer_config.py '
       "cuda_graph_impl ('full_iteration': 1 CUDA graph for the whole "
       'forward-backward path excluding the optimizer step) and '
       'cuda_graph_modules (d98e8a64dd); megatron/core/full_cuda_graph.py '
       'FullCudaGraphWrapper'),
  _beh('gradient_shard_reduce', _choice(GRADIENT_SHARD_REDUCE_NAMES),
       'sharding',
       "with 'gradients' sharding (ZeRO-2): 'microbatch': each block's "
       'gradients are reduce-scattered after its backward in every '
       'microbatch (a rank keeps only its shard, so it cannot accumulate '
       'the unreduced gradients), as FSDP reduces them',
       names=GRADIENT_SHARD_REDUCE_NAMES, absent='batch',
       absent_doc="'batch': once at the end of the batch, as ZeRO-1 "
       '(Calculon)',
       source='DeepSpeed deepspeed/runtime/engine.py allreduce_gradients: '
       '"ZeRO stage 2 communicates during non gradient accumulation '
       'boundaries as well"; Rajbhandari et al. 2020, section 5.2'),
)


def _app(name, spec, group, doc, **kw):
  return Field(name, 'application', spec, group, doc, **kw)


def _app_calc(name, doc, unit):
  return Field(name, 'application', _INT1, 'shape', doc, calculon=True,
               unit=unit)


_APP_OPT_INT = Spec('int', lo=1)
#: Application fields: Calculon's six (the GPT-3 block of 2021), then the
#: optional ones; absent, each means exactly what Calculon means.
APPLICATION = (
  _app_calc('hidden', 'model width h', 'elements'),
  _app_calc('feedforward', 'MLP inner width (4h plain, about 8h/3 gated: '
            'the width of each of the gate and up GEMMs)', 'elements'),
  _app_calc('seq_size', 'sequence length s', 'tokens'),
  _app_calc('attn_heads', 'query heads a', 'count'),
  _app_calc('attn_size', 'width of one head (usually h / a)', 'elements'),
  _app_calc('num_blocks', 'transformer blocks (layers) L', 'count'),
  _app('kv_heads', _APP_OPT_INT, 'attention',
       'K/V heads (grouped-query attention; 1 multi-query, attn_heads '
       'multi-head); must divide attn_heads', absent=None,
       absent_doc="the execution's attention_type decides",
       source='Ainslie et al. 2023, GQA'),
  _app('mlp', _choice(MLP_NAMES), 'block',
       "'plain' (2 GEMMs, GeLU) or 'gated' (SwiGLU/GeGLU: gate and up "
       'GEMMs of width feedforward, then down)', absent='plain',
       absent_doc="'plain'", source='Shazeer 2020, GLU variants'),
  _app('norm', _choice(NORM_NAMES), 'block',
       "'layernorm' or 'rmsnorm' (no mean, no bias)", absent='layernorm',
       absent_doc="'layernorm'", source='Zhang and Sennrich 2019, RMSNorm'),
  _app('linear_bias', _choice(BIAS_NAMES), 'block',
       "biases of the linear layers: 'all', 'qkv' (Qwen2) or 'none'",
       absent='all', absent_doc="'all'"),
  _app('vocab_size', _APP_OPT_INT, 'vocabulary',
       'vocabulary V: input embedding (first stage), LM head and '
       'cross-entropy loss (last stage), vocabulary-parallel over TP',
       absent=None, absent_doc='no embedding, head or loss (Calculon)',
       unit='tokens'),
  _app('tied_embeddings', _BOOL, 'vocabulary',
       'the LM head reuses the embedding table (a copy on the last stage '
       'with PP > 1)', absent=False, absent_doc='false'),
  _app('position_embedding', _choice(POSITION_NAMES), 'vocabulary',
       "'learned' (an s x h table) or 'rope' (rotary)", absent=None,
       absent_doc="'learned' with a vocabulary",
       source='Su et al. 2021, RoFormer'),
  _app('block_layout', _choice(LAYOUT_NAMES), 'block',
       "'parallel': attention and MLP read the same normalized input "
       '(GPT-J, NeoX, PaLM)', absent='sequential',
       absent_doc="'sequential'", source='Chowdhery et al. 2022, PaLM, '
       'section 2'),
  _app('dropout', _BOOL, 'block',
       'dropout layers (their masks kept for the backward pass)',
       absent=True, absent_doc='true'),
  _app('num_experts', _APP_OPT_INT, 'moe',
       'Mixture-of-Experts: routed experts E', absent=None,
       absent_doc='a dense model', source='Shazeer et al. 2017; Fedus et '
       'al. 2021'),
  _app('top_k', _APP_OPT_INT, 'moe', 'experts per token k', absent=None,
       absent_doc='required with num_experts'),
  _app('moe_ffn_hidden', _APP_OPT_INT, 'moe',
       "each expert's MLP width (experts use mlp)", absent=None,
       absent_doc='required with num_experts', unit='elements'),
  _app('shared_experts', _INT0, 'moe',
       'always-on experts (DeepSeek, Qwen2-MoE)', absent=0,
       absent_doc='0'),
  _app('shared_expert_ffn_hidden', _APP_OPT_INT, 'moe',
       'the shared experts\' width', absent=None,
       absent_doc='moe_ffn_hidden', unit='elements'),
  _app('first_dense_blocks', _INT0, 'moe',
       'the first blocks keep a dense MLP of width feedforward '
       '(DeepSeek-V3)', absent=0, absent_doc='0'),
  _app('moe_layer_freq', _APP_OPT_INT, 'moe',
       "every k-th block is MoE (Megatron-LM's --moe-layer-freq)",
       absent=1, absent_doc='1 (every block)'),
  _app('capacity_factor', Spec('number', lo=0, lo_open=True), 'moe',
       'token dropping: each expert takes at most ceil(tokens x k / E x '
       'factor) tokens, padded to that', absent=None,
       absent_doc='no dropping', source='Fedus et al. 2021, Switch '
       'Transformer, section 2.2'),
  _app('moe_router_num_groups', _APP_OPT_INT, 'moe',
       'group-limited routing: the experts form this many groups',
       absent=None, absent_doc='any k of the E experts',
       source='DeepSeek-V3 technical report, section 2.1.2; Megatron-LM '
       '--moe-router-num-groups'),
  _app('moe_router_group_topk', _APP_OPT_INT, 'moe',
       "a token's experts come from at most this many groups", absent=None,
       absent_doc='any k of the E experts',
       source='Megatron-LM --moe-router-group-topk'),
  _app('q_lora_rank', _APP_OPT_INT, 'mla',
       'multi-head latent attention: query compression rank', absent=None,
       absent_doc='no query compression', source='DeepSeek-V2 technical '
       'report, section 2.1'),
  _app('kv_lora_rank', _APP_OPT_INT, 'mla',
       'multi-head latent attention: K/V compression rank', absent=None,
       absent_doc='GQA/MHA attention'),
  _app('qk_nope_head_dim', _APP_OPT_INT, 'mla',
       'MLA: per-head query/key width without RoPE', absent=None,
       absent_doc='GQA/MHA attention'),
  _app('qk_rope_head_dim', _APP_OPT_INT, 'mla',
       'MLA: per-head query/key width with RoPE (attn_size = nope + rope)',
       absent=None, absent_doc='GQA/MHA attention'),
  _app('v_head_dim', _APP_OPT_INT, 'mla', 'MLA: per-head value width',
       absent=None, absent_doc='GQA/MHA attention'),
  _app('sliding_window', _APP_OPT_INT, 'attention',
       'sliding-window attention: each query attends to the w most recent '
       'tokens', absent=None, absent_doc='causal attention over the whole '
       'sequence', source='Jiang et al. 2023, Mistral 7B, section 2',
       unit='tokens'),
  _app('sliding_window_blocks', _INT0, 'attention',
       'blocks that attend over the window', absent=None,
       absent_doc='all blocks (with sliding_window)'),
  _app('mtp_layers', _INT0, 'vocabulary',
       'multi-token prediction modules D, trained with the model on the '
       'last pipeline stage: each one more block of the busiest kind, a '
       '2h x h projection of the normalized hidden state and next-token '
       'embedding, and one more pass through the shared LM head and loss '
       '(needs vocab_size; serving ignores it; the parameter counts stay '
       "the main model's, model FLOP count the modules as Megatron-LM "
       'does)', absent=0,
       absent_doc='0 (none)',
       source='DeepSeek-AI 2024, DeepSeek-V3 technical report '
       '(arXiv:2412.19437), section 2.2; Megatron-Core --mtp-num-layers, '
       'megatron/core/transformer/multi_token_prediction.py'),
)


def _sys(name, spec, group, doc, **kw):
  return Field(name, 'system', spec, group, doc, **kw)


_EFF = Spec('number', lo=0, lo_open=True, hi=1)
#: System fields (sub-fields as dotted paths; ``DTYPE`` stands for each
#: datatype key).  Units follow Calculon's JSON: TFLOP/s and GFLOP (SI),
#: GiB (binary) and GB/s (SI), MB (SI), seconds.
SYSTEM = (
  _sys('matrix', Spec('dict'), 'processor',
       'the matrix (tensor-core) engine: per datatype its peak and '
       'efficiency curve', calculon=True),
  _sys('matrix.DTYPE.tflops', Spec('number', lo=0, lo_open=True),
       'processor', 'peak dense rate', calculon=True, unit='TFLOP/s (SI)'),
  _sys('matrix.DTYPE.gflops_efficiency', Spec('list'), 'processor',
       '[[GFLOP, efficiency], ...], GFLOP strictly decreasing to 0: an '
       'operation of x FLOP runs at the efficiency of the first threshold '
       '<= x', calculon=True, unit='GFLOP (SI)'),
  _sys('vector', Spec('dict'), 'processor',
       'the vector engine, as matrix (the same datatypes)', calculon=True),
  _sys('mem1', Spec('dict'), 'memory',
       'memory tier 1 (HBM): GiB, GBps, MB_efficiency', calculon=True),
  _sys('mem2', Spec('dict'), 'memory',
       'memory tier 2 (host): GiB, GBps, MB_efficiency; 0 GiB: none',
       calculon=True),
  _sys('memN.GiB', Spec('number', lo=0), 'memory', 'capacity',
       calculon=True, unit='GiB (binary)'),
  _sys('memN.GBps', Spec('number', lo=0, lo_open=True), 'memory',
       'bandwidth', calculon=True, unit='GB/s (SI)'),
  _sys('memN.MB_efficiency', Spec('list'), 'memory',
       '[[MB, efficiency], ...] over bytes per access', calculon=True,
       unit='MB (SI)'),
  _sys('processing_mode', Spec('str', choices=('roofline', 'no_overlap')),
       'processor', "an operation takes max(compute, memory) ('roofline') "
       "or their sum ('no_overlap')", calculon=True),
  _sys('networks', Spec('list'), 'network', 'network tiers, fastest first',
       calculon=True),
  _sys('networks[].bandwidth', Spec('number', lo=0, lo_open=True),
       'network', 'bandwidth per processor', calculon=True,
       unit='GB/s (SI)'),
  _sys('networks[].efficiency', _EFF, 'network',
       'fraction of the bandwidth achieved', calculon=True),
  _sys('networks[].size', _INT0, 'network', 'processors the tier joins',
       calculon=True, unit='processors'),
  _sys('networks[].latency', Spec('number', lo=0), 'network',
       'latency per operation', calculon=True, unit='s'),
  _sys('networks[].ops', Spec('dict'), 'network',
       '{op: [scalar, offset]}: n bytes among p peers move n x scalar x '
       '(1 + offset / p) bytes; all_to_all optional, default [1, -1]',
       calculon=True, source="nccl-tests PERFORMANCE.md (bus bandwidth)"),
  _sys('networks[].must_be_filled', _BOOL, 'network',
       'a parallelism on the tier must divide its size', calculon=True),
  _sys('networks[].processor_usage',
       Spec('number', lo=0, hi=1, hi_open=True), 'network',
       'share of compute that drives the tier while it communicates',
       calculon=True),
  _sys('networks[].rails', _INT1, 'network',
       'processors of a node that drive this tier in parallel, one link '
       '(NIC) each, for one collective', absent=1,
       absent_doc="1 (Calculon's model)",
       source='NVIDIA/nccl issues #601 and #1277 (multi-NIC rings)'),
  _sys('networks[].step_latency', Spec('number', lo=0), 'network',
       "latency of one step of a ring (or tree) crossing this tier; with "
       "it, 'latency' is the operation's base latency and a collective "
       'costs base + its steps as NCCL counts them (ring: 2 (p - 1) steps '
       'for all-reduce, p - 1 for all-gather and reduce-scatter, those '
       'between nodes on this tier and the rest on the tier below; '
       'all-reduce: the cheaper of the ring and a tree, 2 ((g - 1) '
       'intra-node + log2(nodes) inter-node steps))', absent=None,
       absent_doc="none: 'latency' per operation (Calculon)", unit='s',
       source='NCCL src/graph/tuning.cc ncclTopoTuneModel: baseLat, '
       'hwLat, nInterSteps (v2.21)'),
  _sys('host', Spec('dict'), 'host',
       "the host side of each processor's link to memory tier 2: what "
       'else crosses that link, and the host memory behind it',
       absent=None,
       absent_doc="none: tier 2 as Calculon prices it (its own link, "
       'nothing else on it)'),
  _sys('host.link_network_tier', _INT0, 'host',
       "network tier whose traffic to and from the processor crosses the "
       'same link as its offload traffic (the NIC behind the GPU\'s PCIe '
       'switch on HGX/DGX nodes; NVLink-C2C to the Grace-attached NICs on '
       'GB200/GB300)', absent=None, absent_doc='none',
       source='NVIDIA/nccl issue #1264 (HGX H100 topology: each GPU PIX to '
       'one NIC); NCCL src/graph/paths.cc (NCCL_NET_GDR_C2C, GPUDirect '
       'RDMA through the CPU on C2C platforms)'),
  _sys('host.bidirectional_efficiency', _EFF, 'host',
       'fraction of its one-way rate each direction of that link keeps '
       'while both carry traffic (ring collectives send and receive at '
       'once)', absent=1.0, absent_doc='1',
       source='measured on H100 PCIe Gen5 (docs/changelog.md); '
       'NVIDIA/nvbandwidth issues #41 (GH200 NVLink-C2C) and #53'),
  _sys('host.memory_GBps', Spec('number', lo=0, lo_open=True), 'host',
       "host memory bandwidth per processor (the node's DRAM peak over its "
       'processors)', absent=None,
       absent_doc="memory tier 2's bandwidth", unit='GB/s (SI)',
       source="the host CPUs' datasheets: memory channels x transfer "
       'rate x 8 bytes'),
  _sys('host.memory_efficiency', _EFF, 'host',
       'fraction of that peak a streaming kernel reaches (STREAM triad)',
       absent=1.0, absent_doc='1',
       source='NVIDIA Grace performance tuning guide (STREAM health check)'),
  _sys('memory_reserve', Spec('dict'), 'memory',
       'memory a real run holds beyond its tensors, and the margin it '
       'leaves free', absent=None,
       absent_doc="none: the tensors alone, up to 100 % of memory tier 1 "
       "(Calculon)"),
  _sys('memory_reserve.context_GiB', Spec('number', lo=0), 'memory',
       'the CUDA context and the kernels a training step loads, outside the '
       "framework's allocator", absent=0.0, absent_doc='0',
       unit='GiB (binary)', source='PyTorch PR #86509 (lazy module '
       'loading); measured on H100 with PyTorch 2.11 (docs/changelog.md)'),
  _sys('memory_reserve.nccl_GiB_per_group', Spec('number', lo=0), 'memory',
       "NCCL's buffers per communicator (each parallel group with "
       'traffic), outside the allocator', absent=0.0, absent_doc='0',
       unit='GiB (binary)',
       source='NCCL src/init.cc, src/include/device.h (4 MiB Simple, '
       '4.69 MiB LL128, 0.5 MiB LL per channel and connection); '
       'NVIDIA/nccl issues #864, #964'),
  _sys('memory_reserve.fragmentation', Spec('number', lo=0), 'memory',
       "what the caching allocator reserves beyond the tensors it holds, "
       'as a fraction of them', absent=0.0, absent_doc='0',
       source='PyTorch CUDA caching allocator (expandable_segments); '
       'measured on H100 (docs/changelog.md)'),
  _sys('memory_reserve.headroom', Spec('number', lo=0, hi=1, hi_open=True),
       'memory', 'fraction of memory tier 1 a run leaves free (transient '
       'buffers the model does not count)', absent=0.0,
       absent_doc="0 (Calculon's 100 % of capacity)",
       source="the driver's reserve (cudaMemGetInfo: 79.18 of 80 GiB on "
       'H100, docs/changelog.md) and transient buffers; below what the '
       'largest measured peak that ran left free (torchtitan '
       'benchmarks/llama3_h100_202412_torchtitan.md)'),
  _sys('overhead', Spec('dict'), 'overhead',
       'fixed host-side costs the accelerators wait for', absent=None,
       absent_doc='none (Calculon)'),
  _sys('overhead.per_step_s', Spec('number', lo=0), 'overhead',
       'once per batch', absent=0.0, absent_doc='0', unit='s'),
  _sys('overhead.per_microbatch_s', Spec('number', lo=0), 'overhead',
       'once per microbatch of a data-parallel replica', absent=0.0,
       absent_doc='0', unit='s'),
  _sys('overhead.per_moe_block_s', Spec('number', lo=0), 'overhead',
       "the host's time to launch one MoE block for one microbatch: a "
       "floor under the stage's GPU work per microbatch", absent=0.0,
       absent_doc='0', unit='s',
       source='Megatron-Core MoE report, arXiv 2603.07685'),
  _sys('fused_attention_efficiency', _EFF, 'kernels',
       'share of the GEMM efficiency a fused attention kernel reaches at '
       'the same FLOP count', absent=None, absent_doc='1 (as a GEMM)',
       source='Shah et al. 2024, FlashAttention-3, figures 5 and 6'),
  _sys('grouped_gemm_efficiency', _EFF, 'kernels',
       "the same for the MoE layers' grouped expert GEMMs", absent=None,
       absent_doc='1 (as a GEMM)'),
  _sys('measured', Spec('dict'), 'kernels',
       'measured kernel tables the engine prices from (calculon '
       'import-kernels): GEMMs at their own shape, fused attention, NCCL '
       'collectives on network tier 0; the curves and the network model '
       'price what they do not cover', absent=None,
       absent_doc='none: the curves and the network model (Calculon)',
       source="NVIDIA AIConfigurator's database (aiconfigurator-core "
       '0.12.0, Apache-2.0)'),
  _sys('measured.source', Spec('dict'), 'kernels',
       'provenance: package and version (or folder), GPU, device',
       absent=None, absent_doc='none'),
  _sys('measured.gemm', Spec('dict'), 'kernels',
       'GEMM latency over m, n, k (x (m, k) @ W (n, k)^T) per datatype '
       '(latency_ms: bfloat16, fp8, fp8_block, nvfp4), with the collecting '
       'framework, version and collection meta; interpolated in log space, '
       'latency proportional beyond the largest size and held below the '
       'smallest', absent=None, absent_doc='GEMMs on the matrix curves',
       unit='ms'),
  _sys('measured.attention', Spec('dict'), 'kernels',
       'causal context attention latency over head_dim, isl and heads '
       '(batch x query heads), bfloat16; the backward is the forward x '
       '2.86 (FlashAttention-2/3 papers) until a measured backward exists',
       absent=None, absent_doc='fused attention on the matrix curves',
       unit='ms', source='Dao 2023 (FlashAttention-2, algorithm 2); Shah '
       'et al. 2024 (FlashAttention-3, sections 1 and 4.1)'),
  _sys('measured.sustained_clock', _EFF, 'kernels',
       'sustained over burst SM clock of the table-priced compute (GEMM '
       'and attention tables): the tables are timed in short bursts at '
       'boost clock, a training step runs at the clock its power limit '
       'sustains; their times are divided by it (calculon calibrate '
       'fits it within [0.8, 1], parameter clock)', absent=None,
       absent_doc='1 (the tables as measured)',
       source='stas00/ml-engineering compute/accelerator/benchmarks/'
       'mamf-finder.py: maximum achievable matmul FLOPS at boost clock '
       'against the steady throughput over a 2 s window'),
  _sys('measured.block_scaled_gemm_ratio', Spec('number', lo=0.5, hi=2),
       'kernels',
       'time of a block-scaled 8-bit GEMM (quantization_scaling "block" '
       'with float8: MXFP8 on Blackwell) over the fp8 table\'s per-tensor '
       'scaled one of the same shape (calculon import-kernels writes 1.051 '
       'for B200, B300, GB200 and GB300)', absent=None,
       absent_doc='1 (block-scaled 8-bit GEMMs at the fp8 table)',
       source='NVIDIA/TransformerEngine docs/examples/gemm_profiling/'
       'gemm_profiling.rst (d0067d0da): B300, pre-quantized operands, '
       'MXFP8 7.161 ms against FP8 current scaling 6.812 ms per layer'),
  _sys('measured.nccl', Spec('dict'), 'kernels',
       'NCCL collective latency over gpus and bytes (the nccl-tests '
       'buffer) per operation (all_gather, reduce_scatter, all_reduce, '
       'alltoall): collectives on network tier 0', absent=None,
       absent_doc="tier 0's network model", unit='ms',
       source='nccl-tests (AIConfigurator collector/network/'
       'collect_nccl.py)'),
)

#: Upper bounds of the counts: (kind, field) -> (largest value, why).
#: Each is far above any model or cluster that exists, and keeps the
#: engine's integer counts (parameters, tokens, activations: products of a
#: few of these) finite; counts that can still exceed int64 at the bounds
#: (attention scores and FLOPs, s^2 terms) are computed in float64.
_BLOCKS = (2**20, '1,048,576 blocks: 4,000x the deepest published model '
           '(Megatron 1T: 128; DeepSeek-V3: 61)')
_WIDTH = (2**20, '1,048,576: 40x the widest published model (Megatron 1T '
          'h = 25,600)')
_FF = (2**22, '4,194,304: 40x the widest published MLP (PaLM 540B: 73,728 '
       'per gate)')
_HEADS = (2**12, '4,096 heads: 25x the most published (Megatron 1T: 160; '
          'DeepSeek-V3: 128)')
_HEAD = (2**12, '4,096 elements per head: 16x the widest published (MLA '
         'DeepSeek-V3: 192 + 64)')
_SEQ = (2**24, '16,777,216 tokens: above the longest published context '
        '(Llama 4 Scout: 10 M)')
_EXPERTS = (2**16, '65,536 experts: 100x the most published routed experts '
            '(Kimi K2: 384)')
_PROCS = (2**24, '16,777,216 processors: 80x the largest cluster reported '
          '(200,000 GPUs, 2025)')
_BATCH = (2**30, '1,073,741,824 samples: a batch of 2^30 x 16 M tokens is '
          'still a finite count')
_TIERS = (2**10, '1,024 network tiers: a system has a few (the index must '
          'also name one of its tiers)')
BOUNDS = {
  ('application', 'hidden'): _WIDTH,
  ('application', 'feedforward'): _FF,
  ('application', 'seq_size'): _SEQ,
  ('application', 'attn_heads'): _HEADS,
  ('application', 'attn_size'): _HEAD,
  ('application', 'num_blocks'): _BLOCKS,
  ('application', 'kv_heads'): _HEADS,
  ('application', 'vocab_size'): (2**22, '4,194,304 tokens: 16x the '
                                  'largest published vocabulary (Gemma 3: '
                                  '262,144)'),
  ('application', 'num_experts'): _EXPERTS,
  ('application', 'top_k'): _EXPERTS,
  ('application', 'moe_ffn_hidden'): _FF,
  ('application', 'shared_experts'): _EXPERTS,
  ('application', 'shared_expert_ffn_hidden'): _FF,
  ('application', 'first_dense_blocks'): _BLOCKS,
  ('application', 'mtp_layers'): (64, '64 modules: 64x the depth '
                                  'DeepSeek-V3 trains (D = 1); each module '
                                  'is built layer by layer'),
  ('application', 'moe_layer_freq'): _BLOCKS,
  ('application', 'moe_router_num_groups'): _EXPERTS,
  ('application', 'moe_router_group_topk'): _EXPERTS,
  ('application', 'q_lora_rank'): _WIDTH,
  ('application', 'kv_lora_rank'): _WIDTH,
  ('application', 'qk_nope_head_dim'): _HEAD,
  ('application', 'qk_rope_head_dim'): _HEAD,
  ('application', 'v_head_dim'): _HEAD,
  ('application', 'sliding_window'): _SEQ,
  ('application', 'sliding_window_blocks'): _BLOCKS,
  ('execution', 'num_procs'): _PROCS,
  ('execution', 'tensor_par'): _PROCS,
  ('execution', 'pipeline_par'): _PROCS,
  ('execution', 'data_par'): _PROCS,
  ('execution', 'context_par'): _PROCS,
  ('execution', 'expert_par'): _PROCS,
  ('execution', 'expert_tensor_par'): _PROCS,
  ('execution', 'batch_size'): _BATCH,
  ('execution', 'microbatch_size'): (2**12, '4,096 samples: a microbatch '
                                     'of 4,096 x 16 M tokens x the widest '
                                     'layer (2 x 4 M) is 2^59 elements, '
                                     'an int64 count'),
  ('execution', 'pipeline_interleaving'): _BLOCKS,
  **{('execution', f'{d}_par_net'): _TIERS for d in (
    'tensor', 'pipeline', 'data', 'context', 'expert')},
  ('system', 'networks[].size'): _PROCS,
}


def _bounded(fields):
  """``fields`` with the :data:`BOUNDS` applied to their specs."""
  from calculon.config._schema import Spec as _Spec
  for f in fields:
    bound = BOUNDS.get((f.kind, f.name))
    if bound is None:
      continue
    sp = f.spec
    f.spec = _Spec(sp.kind, lo=sp.lo, hi=bound[0], lo_open=sp.lo_open,
                   choices=sp.choices, nullable=sp.nullable)
    f.bound = bound[1]
  return fields


APPLICATION = _bounded(APPLICATION)
EXECUTION = _bounded(EXECUTION)
SYSTEM = _bounded(SYSTEM)

#: kind -> {name: Field}, in file order.
FIELDS = {
  'application': {f.name: f for f in APPLICATION},
  'execution': {f.name: f for f in EXECUTION},
  'system': {f.name: f for f in SYSTEM},
}


def _dep(name, spec, group, doc, **kw):
  if kw.get('absent', REQUIRED) is not REQUIRED and not kw.get('absent_doc'):
    value = kw['absent']
    kw['absent_doc'] = (f'"{value}"' if isinstance(value, str) else
                        str(value))
  return Field(name, 'deployment', spec, group, doc, **kw)


#: Datatypes of a serving deployment's weights, activations and KV cache
#: (``int4``: 4-bit integer weights with 16-bit activations, AWQ/GPTQ).
SERVING_DATATYPE_BYTES = {'bfloat16': 2, 'float16': 2, 'float8': 1,
                          'float4': 0.5, 'int4': 0.5}
SERVING_FRAMEWORK_NAMES = ('trtllm', 'vllm', 'sglang', 'vllm-v0.5',
                           'vllm-v0.6')
SERVING_MODE_NAMES = ('aggregated', 'disaggregated')
_DT = Spec('str', choices=tuple(SERVING_DATATYPE_BYTES))
_ACT_DT = Spec('str', choices=('bfloat16', 'float16', 'float8', 'float4'))
_KV_DT = Spec('str', choices=('bfloat16', 'float16', 'float8', 'float4'))
_POS = Spec('number', lo=0, lo_open=True)
#: Deployment fields (``calculon serve``): how a model is served.  Fields
#: left out take the serving framework preset's value
#: (``frameworks/serving/NAME.json``), else the absent value.
DEPLOYMENT = (
  _dep('framework', Spec('str', choices=SERVING_FRAMEWORK_NAMES),
       'framework', 'serving framework preset whose defaults fill the '
       'fields left out', absent='trtllm', absent_doc='"trtllm"',
       source='frameworks/serving/*.json'),
  _dep('mode', Spec('str', choices=SERVING_MODE_NAMES), 'mode',
       'aggregated (one pool, continuous batching) or disaggregated '
       '(prefill and decode workers)', absent='aggregated',
       source='Zhong et al. 2024, DistServe (OSDI); Patel et al. 2024, '
       'Splitwise (ISCA)'),
  _dep('tensor_par', _INT1, 'parallelism', 'tensor parallelism of a '
       'worker (attention and dense MLP)', absent=1, unit='GPUs'),
  _dep('pipeline_par', _INT1, 'parallelism', 'pipeline parallelism of a '
       'worker', absent=1, unit='GPUs'),
  _dep('expert_par', _INT1, 'parallelism', 'expert parallelism (EP) of '
       'the MoE layers; EP x expert TP = TP x attention DP', absent=None,
       absent_doc='TP x attention DP / expert TP'),
  _dep('expert_tensor_par', _INT1, 'parallelism', 'tensor parallelism '
       'inside each expert', absent=1),
  _dep('attention_dp', _INT1, 'parallelism', 'attention data '
       'parallelism: attention replicas per worker, each with its own '
       'batch and KV cache (dense models: plain replicas)', absent=1,
       source='SGLang --enable-dp-attention; TensorRT-LLM '
       'enable_attention_dp'),
  _dep('weight_datatype', _DT, 'precision', 'datatype of the weights',
       absent='bfloat16'),
  _dep('activation_datatype', _ACT_DT, 'precision', 'datatype the GEMMs '
       'run in', absent=None, absent_doc='the weight datatype (bfloat16 '
       'for int4 weights)'),
  _dep('kv_cache_datatype', _KV_DT, 'precision', 'datatype of the KV '
       'cache', absent=None, absent_doc='the activation datatype'),
  _dep('isl', _INT1, 'workload', 'input (prompt) tokens per request',
       unit='tokens'),
  _dep('osl', _INT1, 'workload', 'output tokens per request',
       unit='tokens'),
  _dep('concurrency', _INT1, 'workload', 'requests in flight (closed '
       'loop: a user sends the next request when one returns)',
       absent=None, absent_doc='request_rate, else as many as fit '
       '(offline max throughput)'),
  _dep('request_rate', _POS, 'workload', 'Poisson arrival rate (open '
       'loop)', absent=None, absent_doc='concurrency', unit='requests/s'),
  _dep('static_batch', _INT1, 'workload', 'a static batch: every '
       'request starts and ends together (no continuous batching)',
       absent=None, absent_doc='continuous batching'),
  _dep('num_requests', _INT1, 'workload', 'a finite benchmark: this '
       'many requests sent at once (request rate infinite), priced as '
       'the drain of the batch: output tokens / makespan, with the '
       'prefill of every request and the tail as requests finish '
       '(with concurrency: at most that many in flight)',
       absent=None, absent_doc='a steady state', unit='requests'),
  _dep('variable_lengths', _BOOL, 'workload', 'output lengths vary '
       'about osl (a ShareGPT-like mix): with num_requests, i.i.d. '
       'exponential of mean osl, so the drain runs to the longest',
       absent=False),
  _dep('max_num_seqs', _INT1, 'batching', 'most sequences in one '
       'iteration (vLLM max_num_seqs, TensorRT-LLM max_batch_size, '
       'SGLang max_running_requests)', absent=None,
       absent_doc="the framework's", unit='sequences'),
  _dep('max_num_tokens', _INT1, 'batching', 'most tokens in one '
       'iteration (vLLM max_num_batched_tokens, TensorRT-LLM '
       'max_num_tokens, SGLang chunked_prefill_size)', absent=None,
       absent_doc="the framework's", unit='tokens'),
  _dep('chunked_prefill', _BOOL, 'batching', 'prompts split in chunks '
       'that share iterations with decode steps', absent=None,
       absent_doc="the framework's",
       source='Agrawal et al. 2024, Sarathi-Serve (OSDI), section 4'),
  _dep('prefill_chunk', _INT1, 'batching', 'prefill tokens per '
       'iteration with chunked prefill', absent=None,
       absent_doc='max_num_tokens', unit='tokens'),
  _dep('scheduler_steps', _INT1, 'batching', 'decode steps per '
       'scheduling round (vLLM multi-step scheduling, '
       '--num-scheduler-steps, default 1): tokens stream in bursts of n '
       '(the client\'s inter-token latency is n steps) and new prompts '
       'join between rounds', absent=1,
       source='vllm-project/vllm vllm/engine/arg_utils.py v0.6.0 '
       'EngineArgs.num_scheduler_steps = 1 ("Maximum number of forward '
       'steps per scheduler call")'),
  _dep('cuda_graphs', _BOOL, 'batching', 'decode steps replayed as CUDA '
       'graphs (no per-kernel launch cost)', absent=None,
       absent_doc="the framework's"),
  _dep('memory_fraction', Spec('number', lo=0, lo_open=True, hi=1),
       'memory', "the framework's memory fraction (its own meaning: "
       'TensorRT-LLM of the free memory after the weights, vLLM and '
       'SGLang of the whole memory)', absent=None,
       absent_doc="the framework's"),
  _dep('speculative_tokens', _INT0, 'speculative', 'draft tokens per '
       'step (speculative decoding or MTP)', absent=0,
       source='Leviathan et al. 2023, ICML, section 3'),
  _dep('speculative_accept_rate', Spec('number', lo=0, hi=1, hi_open=True),
       'speculative', 'probability that a draft token is accepted',
       absent=0.0, source='Leviathan et al. 2023, ICML, equation 1'),
  _dep('prefill_workers', _INT1, 'disaggregated', 'prefill workers',
       absent=1),
  _dep('decode_workers', _INT1, 'disaggregated', 'decode workers',
       absent=1),
  _dep('prefill_tensor_par', _INT1, 'disaggregated', 'TP of a prefill '
       'worker', absent=None, absent_doc='tensor_par'),
  _dep('prefill_pipeline_par', _INT1, 'disaggregated', 'PP of a prefill '
       'worker', absent=None, absent_doc='pipeline_par'),
  _dep('prefill_expert_par', _INT1, 'disaggregated', 'EP of a prefill '
       'worker', absent=None, absent_doc='expert_par'),
  _dep('kv_transfer_net', _INT0, 'disaggregated', 'network tier the KV '
       'cache crosses from prefill to decode workers', absent=None,
       absent_doc='tier 0 when both pools fit in one tier-0 domain, else '
       'tier 1'),
)
GROUPS['deployment'] = ('framework', 'mode', 'parallelism', 'precision',
                        'workload', 'batching', 'memory', 'speculative',
                        'disaggregated')
FIELDS['deployment'] = {f.name: f for f in DEPLOYMENT}


def field(kind, name):
  """The :class:`Field` ``name`` of ``kind``.

  Raises:
    KeyError: no such field.
  """
  return FIELDS[kind][name]


def behaviours():
  """Names of the execution fields a framework preset sets, in order."""
  return tuple(n for n, f in FIELDS['execution'].items() if f.behaviour)


def options():
  """Names of the execution fields that are choices (not a behaviour, not
  the framework), in order."""
  return tuple(n for n, f in FIELDS['execution'].items()
               if not f.behaviour and n != 'framework')
