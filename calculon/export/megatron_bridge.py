"""Export to Megatron-Bridge 0.6.2 (megatron-core 0.19.2): a YAML file of
``ConfigContainer`` overrides.

Megatron-Bridge merges such a YAML into a recipe's ``ConfigContainer``
(``megatron/bridge/training/utils/omegaconf_utils.py``
``process_config_with_overrides(config, config_filepath=...)``: OmegaConf
merge, then the values set back on the dataclasses), which is what its
recipe scripts' ``--config-file`` does.  Every key below is a field of the
release's dataclasses, read in the released packages (megatron-bridge
0.6.2 and megatron-core 0.19.2 from the package index; the mirrored
repositories stop before the releases, NVIDIA-NeMo/Megatron-Bridge at
067f987df and NVIDIA/Megatron-LM at d98e8a64d, 2026-08-22):

* ``model.*`` -- the model provider, a megatron-core ``TransformerConfig``
  (``megatron/core/model_parallel_config.py``: tensor_model_parallel_size,
  pipeline_model_parallel_size, virtual_pipeline_model_parallel_size,
  sequence_parallel, context_parallel_size, expert_model_parallel_size,
  cp_comm_type ('p2p', the ring, or 'all_gather'; written with CP > 1),
  expert_tensor_parallel_size (None means TP there, so it is always
  written), cpu_offloading*; ``megatron/core/transformer/
  transformer_config.py``: pipeline_model_parallel_layout,
  account_for_embedding_in_pipeline_split,
  account_for_loss_in_pipeline_split, recompute_granularity,
  recompute_method, recompute_num_layers, recompute_modules,
  moe_token_dispatcher_type, moe_flex_dispatcher_backend,
  moe_shared_expert_overlap, cuda_graph_impl, cuda_graph_modules,
  attention_backend, cross_entropy_loss_fusion, seq_length);
* ``train.global_batch_size``, ``train.micro_batch_size``
  (``megatron/bridge/training/config.py`` TrainingConfig);
* ``ddp.*`` (DistributedDataParallelConfig: use_distributed_optimizer,
  overlap_grad_reduce, overlap_param_gather, use_megatron_fsdp,
  data_parallel_sharding_strategy), ``optimizer.*`` (OptimizerConfig:
  use_distributed_optimizer, overlap_param_gather, optimizer_cpu_offload,
  optimizer_offload_fraction), ``comm_overlap.tp_comm_overlap`` and
  ``comm_overlap.overlap_moe_expert_parallel_comm`` (CommOverlapConfig),
  ``mixed_precision.*`` (MixedPrecisionConfig: bf16, fp16, fp8,
  fp8_recipe, fp8_param_gather, fp4, fp4_recipe, fp4_param_gather);
  ``checkpoint.ckpt_format`` for Megatron-FSDP.

An execution Megatron cannot express is refused (:func:`refusals`), one
line naming the field.
"""

from calculon.export._common import header_lines, refuse, stage_blocks

NAME = 'megatron-bridge'
TARGET = 'Megatron-Bridge 0.6.2 (megatron-core 0.19.2)'
VERSIONS = {'megatron-bridge': '0.6.2', 'megatron-core': '0.19.2'}
SUFFIX = '.megatron-bridge.yaml'
#: The calculon preset describing this framework.
PRESET = 'megatron-core'

#: calculon recompute modules -> megatron-core recompute_modules names
#: (transformer_config.py recompute_modules: core_attn, moe_act,
#: layernorm, mla_up_proj, mlp, moe, shared_experts).
_MODULES = ('core_attn', 'layernorm', 'mla_up_proj', 'mlp', 'moe', 'moe_act',
            'shared_experts')

#: data_par_sharding -> (use_distributed_optimizer, Megatron-FSDP
#: data_parallel_sharding_strategy or None): megatron-core
#: distributed_data_parallel_config.py data_parallel_sharding_strategy
#: ('no_shard', 'optim', 'optim_grads', 'optim_grads_params').
_SHARDING = {'none': (False, None), 'optimizer': (True, None),
             'gradients': (True, 'optim_grads'),
             'parameters': (True, 'optim_grads_params')}

#: (datatype, quantization_scaling) -> MixedPrecisionConfig fields, as
#: megatron/bridge/training/mixed_precision.py's recipes set them
#: (bf16_with_fp8_delayed_scaling_mixed, bf16_with_fp8_current_scaling_mixed
#: 'tensorwise', bf16_with_mxfp8_mixed, bf16_with_nvfp4_mixed).
_NARROW = {
  ('float8', 'delayed'): {'fp8': 'hybrid', 'fp8_recipe': 'delayed'},
  ('float8', 'current'): {'fp8': 'hybrid', 'fp8_recipe': 'tensorwise'},
  ('float8', 'block'): {'fp8': 'e4m3', 'fp8_recipe': 'mxfp8'},
  ('float4', 'block'): {'fp8': None, 'fp4': 'e2m1', 'fp4_recipe': 'nvfp4'},
}


def refusals(inp):
  """Raises the ConfigError of the first field Megatron cannot express.

  Raises:
    ConfigError: one line naming the field and why.
  """
  e = inp.exe
  t = TARGET
  if not e.training:
    raise refuse(inp, t, 'training', 'the export writes a training launch')
  if e.tensor_par_comm_type == 'p2p_rs_ag':
    raise refuse(inp, t, 'tensor_par_comm_type', "Megatron's tensor "
                 "parallelism all-reduces ('ar') or, with sequence_parallel, "
                 "reduce-scatters and all-gathers ('rs_ag') in every block")
  if e.tensor_par_overlap != 'none' and e.tensor_par_comm_type != 'rs_ag':
    raise refuse(inp, t, 'tensor_par_overlap', 'comm_overlap.tp_comm_overlap '
                 '(Transformer Engine userbuffers) needs sequence_parallel')
  if e.activation_recompute == 'attn_only':
    raise refuse(inp, t, 'activation_recompute', 'recompute_granularity is '
                 "'full' or 'selective' (recompute_modules)")
  if e.activation_recompute == 'selective':
    extra = [m for m in inp.field('recompute_modules') if m not in _MODULES]
    if extra:
      raise refuse(inp, t, 'recompute_modules', f'{extra[0]} is not a '
                   'megatron-core recompute module (' + ', '.join(_MODULES)
                   + ')')
  if e.weight_offload:
    raise refuse(inp, t, 'weight_offload', 'megatron-core offloads '
                 'activations (cpu_offloading); Transformer Engine marks '
                 'weight offloading deprecated')
  if e.activations_offload:
    if e.pipeline_par > 1:
      raise refuse(inp, t, 'activations_offload', 'cpu_offloading is not '
                   'supported with pipeline parallelism '
                   '(TransformerConfig.__post_init__)')
    if e.activation_recompute != 'none':
      raise refuse(inp, t, 'activations_offload', 'cpu_offloading does not '
                   'work with activation recomputation '
                   '(TransformerConfig.__post_init__)')
    if e.activation_offload_layers != 'fit':
      raise refuse(inp, t, 'activation_offload_layers', 'cpu_offloading_num_'
                   'layers must be below num_layers: offload all but one '
                   "layer at most ('fit')")
    if inp.offloaded_layers is None:
      raise refuse(inp, t, 'activation_offload_layers', 'how many layers '
                   "'fit' offloads depends on the system: give --system")
  if e.optimizer_offload and e.data_par_sharding == 'none':
    raise refuse(inp, t, 'optimizer_offload', 'optimizer_cpu_offload (the '
                 'hybrid device optimizer) needs the distributed optimizer')
  if e.datatype in ('float8', 'float4'):
    if e.precision_recipe != 'transformer_engine':
      raise refuse(inp, t, 'precision_recipe', f'{e.datatype} runs the linear '
                   "layers' GEMMs through Transformer Engine "
                   "('transformer_engine'), the rest in bfloat16")
    if (e.datatype, e.quantization_scaling) not in _NARROW:
      raise refuse(inp, t, 'quantization_scaling', f'{e.datatype} recipes '
                   'are ' + ', '.join(s for d, s in _NARROW if d == e.datatype))
  if e.moe_comm_overlap == 'compute':
    if e.pipeline_par > 1 and e.pipeline_interleaving == 1:
      raise refuse(inp, t, 'moe_comm_overlap', 'overlap_moe_expert_parallel_'
                   'comm needs virtual_pipeline_model_parallel_size with '
                   'PP > 1 (TransformerConfig.__post_init__)')
    if e.activation_recompute == 'full':
      raise refuse(inp, t, 'moe_comm_overlap', 'overlap_moe_expert_parallel_'
                   'comm does not run with full recomputation')
  if e.moe_comm_overlap == 'shared_experts' and not inp.app.is_moe:
    raise refuse(inp, t, 'moe_comm_overlap', 'the application has no '
                 'experts')


def _layout(inp):
  """The pipeline split as megatron-core takes it: {} (even, the default
  split), the account_for_* flags (the embedding and loss counted as a
  layer each, then even), or a pipeline_model_parallel_layout string
  (``pipeline_parallel_layer_layout.py``: stages separated by '|', 'E' the
  embedding, 't' a transformer layer, 'L' the loss, listed in virtual
  stage order)."""
  e = inp.exe
  pp, vp = int(e.pipeline_par), int(e.pipeline_interleaving)
  if pp == 1:
    return {}
  blocks, counts_vocab = stage_blocks(inp, TARGET)
  n = inp.app.num_blocks
  if not counts_vocab and n % (pp * vp) == 0:
    return {}
  if counts_vocab and (n + 2) % (pp * vp) == 0:
    return {'account_for_embedding_in_pipeline_split': True,
            'account_for_loss_in_pipeline_split': True}
  stages = ['t' * b for b in blocks]
  stages[0] = 'E' + stages[0]
  # The multi-token prediction modules with the loss, where Megatron-Core
  # places them without a layout (multi_token_prediction.py
  # mtp_on_this_rank; 'm' in pipeline_parallel_layer_layout.py).
  stages[-1] = stages[-1] + 'm' * int(inp.app.mtp_layers) + 'L'
  return {'pipeline_model_parallel_layout': '|'.join(stages)}


def overrides(inp):
  """The ConfigContainer overrides of one execution: {section: {field:
  value}} (plain YAML values).

  Raises:
    ConfigError: see :func:`refusals`.
  """
  refusals(inp)
  e = inp.exe
  layout = _layout(inp)
  vp = int(e.pipeline_interleaving)
  model = {
    'tensor_model_parallel_size': int(e.tensor_par),
    'pipeline_model_parallel_size': int(e.pipeline_par),
    'virtual_pipeline_model_parallel_size': vp if vp > 1 else None,
    'context_parallel_size': int(e.context_par),
    'cp_comm_type': ('all_gather' if e.context_par_comm == 'all_gather'
                     else 'p2p') if e.context_par > 1 else None,
    'sequence_parallel': e.tensor_par_comm_type == 'rs_ag' and
    e.tensor_par > 1,
    'expert_model_parallel_size': int(e.expert_par),
    'expert_tensor_parallel_size': int(e.expert_tensor_par),
    'seq_length': int(inp.app.seq_size),
  }
  if inp.app.mtp_layers:
    # --mtp-num-layers (megatron/core/transformer/transformer_config.py
    # mtp_num_layers).
    model['mtp_num_layers'] = int(inp.app.mtp_layers)
  model['pipeline_model_parallel_layout'] = layout.get(
    'pipeline_model_parallel_layout')
  model['account_for_embedding_in_pipeline_split'] = layout.get(
    'account_for_embedding_in_pipeline_split', False)
  model['account_for_loss_in_pipeline_split'] = layout.get(
    'account_for_loss_in_pipeline_split', False)
  if e.activation_recompute == 'full':
    model.update(recompute_granularity='full', recompute_method='uniform',
                 recompute_num_layers=1, recompute_modules=None)
  elif e.activation_recompute == 'selective':
    model.update(recompute_granularity='selective', recompute_method=None,
                 recompute_num_layers=None,
                 recompute_modules=list(inp.field('recompute_modules')))
  else:
    model.update(recompute_granularity=None, recompute_method=None,
                 recompute_num_layers=None, recompute_modules=None)
  model['cpu_offloading'] = bool(e.activations_offload)
  model['cpu_offloading_num_layers'] = int(inp.offloaded_layers) \
    if e.activations_offload else 0
  if e.activations_offload:
    model['cpu_offloading_activations'] = True
    model['cpu_offloading_weights'] = False
  if inp.app.is_moe:
    if e.moe_dispatcher == 'deepep':
      model['moe_token_dispatcher_type'] = 'flex'
      model['moe_flex_dispatcher_backend'] = 'deepep'
    else:
      model['moe_token_dispatcher_type'] = e.moe_dispatcher
    model['moe_shared_expert_overlap'] = e.moe_comm_overlap == \
      'shared_experts'
  if e.cuda_graphs == 'none':
    model['cuda_graph_impl'] = 'none'
  elif e.cuda_graphs == 'layers':
    model['cuda_graph_impl'] = 'transformer_engine'
  else:
    model['cuda_graph_impl'] = 'full_iteration'
    model['cuda_graph_modules'] = []
    model['cuda_graph_scope'] = None
  if e.attention_kernel == 'standard':
    model['attention_backend'] = 'unfused'
  model['cross_entropy_loss_fusion'] = e.cross_entropy_kernel == 'fused'

  distopt, fsdp = _SHARDING[e.data_par_sharding]
  ddp = {'use_distributed_optimizer': distopt,
         'overlap_grad_reduce': bool(e.data_par_overlap),
         'overlap_param_gather': bool(distopt and e.data_par_overlap and
                                      e.param_gather_overlap),
         'use_megatron_fsdp': fsdp is not None}
  if fsdp is not None:
    ddp['data_parallel_sharding_strategy'] = fsdp
  optimizer = {'use_distributed_optimizer': distopt,
               'overlap_param_gather': ddp['overlap_param_gather'],
               'optimizer_cpu_offload': bool(e.optimizer_offload),
               'optimizer_offload_fraction':
               1.0 if e.optimizer_offload else 0.0}
  comm = {'tp_comm_overlap': e.tensor_par_overlap != 'none'}
  if inp.app.is_moe:
    comm['overlap_moe_expert_parallel_comm'] = e.moe_comm_overlap == 'compute'
  mp = {'bf16': e.datatype in ('bfloat16', 'float8', 'float4'),
        'fp16': e.datatype == 'float16', 'fp8': None, 'fp4': None}
  narrow = _NARROW.get((e.datatype, e.quantization_scaling))
  if narrow is not None:
    mp.update(narrow)
    gather = bool(e.narrow_param_gather)
    mp['fp4_param_gather' if e.datatype == 'float4' else
       'fp8_param_gather'] = gather
  out = {'model': model,
         'train': {'global_batch_size': int(e.batch_size),
                   'micro_batch_size': int(e.microbatch_size)},
         'ddp': ddp, 'optimizer': optimizer, 'comm_overlap': comm,
         'mixed_precision': mp}
  if fsdp is not None:
    out['checkpoint'] = {'ckpt_format': 'fsdp_dtensor'}
  return out


def render(inp):
  """The export file's text: a comment header, then the YAML overrides.

  Raises:
    ConfigError: see :func:`refusals`.
  """
  import yaml
  data = overrides(inp)
  how = [
    f'World size: {inp.num_procs} (data parallel {inp.exe.data_par} = '
    'world / (TP x PP x CP)).',
    'Use: merge into a recipe ConfigContainer with megatron.bridge.training.'
    'utils.omegaconf_utils.process_config_with_overrides(cfg, '
    'config_filepath=THIS_FILE), as the recipe scripts\' --config-file do.',
  ]
  head = ''.join(f'# {line}\n' for line in header_lines(inp, TARGET, how))
  meta = {'calculon_export': {'framework': 'megatron-bridge',
                              'versions': dict(VERSIONS)}}
  return head + '# ' + yaml.safe_dump(meta, default_flow_style=True, width=1000).strip() \
    + '\n' + yaml.safe_dump(data, sort_keys=False)
