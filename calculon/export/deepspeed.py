"""Export to DeepSpeed 0.19.8: a ``ds_config`` JSON.

Every key is one the release reads, in the released package (deepspeed
0.19.8 from the package index; the mirrored deepspeedai/DeepSpeed stops
before it, at edaa72212, 2026-08-22):

* ``deepspeed/runtime/config.py``: train_batch_size,
  train_micro_batch_size_per_gpu, gradient_accumulation_steps
  (``_batch_assertion``: train_batch_size = micro x accumulation x the
  data-parallel world size), ``bf16``/``fp16`` ``enabled``, ``pipeline``
  (get_pipeline_config: stages, activation_checkpoint_interval;
  the pipeline degree itself is ``PipelineModule(num_stages=...)`` in the
  model code, recorded here in ``pipeline.stages``);
* ``deepspeed/runtime/zero/config.py`` DeepSpeedZeroConfig (stage,
  overlap_comm, offload_optimizer, offload_param) and
  ``zero/offload_config.py`` (device 'cpu');
* ``deepspeed/runtime/activation_checkpointing/config.py``
  (cpu_checkpointing);
* ``deepspeed/runtime/tensor_parallel/config.py`` (``tensor_parallel``
  ``autotp_size``: AutoTP training);
* ``deepspeed/module_inject/auto_ep_config.py`` (``expert_parallel``
  enabled, autoep_size, expert_tensor_parallel_size: AutoEP).

A pipeline with ZeRO stage 2 or 3 is refused, as ``runtime/pipe/engine.py``
asserts ("ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism").
"""

from calculon.export._common import header_lines, refuse, refuse_mtp

NAME = 'deepspeed'
TARGET = 'DeepSpeed 0.19.8'
VERSIONS = {'deepspeed': '0.19.8'}
SUFFIX = '.deepspeed.json'
PRESET = 'deepspeed-zero'

#: data_par_sharding -> ZeRO stage (Rajbhandari et al. SC20, sections 5
#: and 7: stage 1 the optimizer state, 2 also the gradients, 3 also the
#: parameters).
_STAGE = {'none': 0, 'optimizer': 1, 'gradients': 2, 'parameters': 3}


def refusals(inp):
  """Raises the ConfigError of the first field DeepSpeed cannot express.

  Raises:
    ConfigError: one line naming the field and why.
  """
  e, t = inp.exe, TARGET
  if not e.training:
    raise refuse(inp, t, 'training', 'the export writes a training launch')
  mtp = refuse_mtp(inp, t)
  if mtp is not None:
    raise mtp
  if e.tensor_par > 1 and e.tensor_par_comm_type != 'ar':
    raise refuse(inp, t, 'tensor_par_comm_type', "its tensor parallelism "
                 "(AutoTP) all-reduces ('ar')")
  if e.tensor_par_overlap != 'none':
    raise refuse(inp, t, 'tensor_par_overlap', 'it has no tiled TP overlap')
  if e.pipeline_interleaving > 1:
    raise refuse(inp, t, 'pipeline_interleaving', 'its pipeline schedule '
                 '(runtime/pipe/schedule.py TrainSchedule) is 1F1B, not '
                 'interleaved')
  if e.pipeline_par > 1 and _STAGE[e.data_par_sharding] >= 2:
    raise refuse(inp, t, 'data_par_sharding', 'ZeRO-2 and ZeRO-3 are '
                 'incompatible with pipeline parallelism (runtime/pipe/'
                 'engine.py)')
  if e.context_par > 1:
    raise refuse(inp, t, 'context_par', 'its sequence parallelism is '
                 'Ulysses (all-to-all over heads), not ring context '
                 'parallelism')
  if e.activation_recompute in ('attn_only', 'selective'):
    raise refuse(inp, t, 'activation_recompute', 'its activation '
                 "checkpointing recomputes whole layers ('full')")
  if e.weight_offload and e.data_par_sharding != 'parameters':
    raise refuse(inp, t, 'weight_offload', 'offload_param is valid only '
                 "with ZeRO stage 3 ('parameters')")
  if e.optimizer_offload and e.data_par_sharding == 'none':
    raise refuse(inp, t, 'optimizer_offload', 'offload_optimizer needs ZeRO '
                 "stage 1, 2 or 3")
  if e.activations_offload and e.activation_recompute != 'full':
    raise refuse(inp, t, 'activations_offload', 'cpu_checkpointing offloads '
                 "the activation checkpoints: it needs 'full' recomputation")
  if e.datatype in ('float8', 'float4'):
    raise refuse(inp, t, 'datatype', 'ds_config has no narrow-precision '
                 'training recipe (FP8 is the model\'s Transformer Engine '
                 'layers)')
  if e.cuda_graphs != 'none':
    raise refuse(inp, t, 'cuda_graphs', 'ds_config captures no CUDA graphs '
                 'of the training step')
  if inp.app.is_moe and e.expert_par > 1:
    if e.moe_dispatcher != 'alltoall':
      raise refuse(inp, t, 'moe_dispatcher', "AutoEP dispatches with "
                   "all-to-all ('alltoall'); its DeepEP route needs a "
                   'per-rank token capacity calculon does not model')
    if e.pipeline_par > 1 and e.tensor_par > 1:
      raise refuse(inp, t, 'expert_par', 'AutoEP does not support tensor '
                   'model parallelism from an mpu (runtime/engine.py '
                   '_configure_expert_parallel)')
  if inp.app.is_moe and e.moe_comm_overlap != 'none':
    raise refuse(inp, t, 'moe_comm_overlap', 'AutoEP does not overlap '
                 'dispatch with other compute')


def ds_config(inp):
  """The ds_config of one execution (a JSON-ready dict).

  Raises:
    ConfigError: see :func:`refusals`.
  """
  refusals(inp)
  e = inp.exe
  stage = _STAGE[e.data_par_sharding]
  out = {
    'train_batch_size': int(e.batch_size),
    'train_micro_batch_size_per_gpu': int(e.microbatch_size),
    'gradient_accumulation_steps': inp.num_microbatches,
  }
  if e.datatype == 'bfloat16':
    out['bf16'] = {'enabled': True}
  elif e.datatype == 'float16':
    out['fp16'] = {'enabled': True}
  zero = {'stage': stage, 'overlap_comm': bool(e.data_par_overlap)}
  if e.optimizer_offload:
    zero['offload_optimizer'] = {'device': 'cpu'}
  if e.weight_offload:
    zero['offload_param'] = {'device': 'cpu'}
  out['zero_optimization'] = zero
  if e.activation_recompute == 'full':
    out['activation_checkpointing'] = {
      'partition_activations': False,
      'cpu_checkpointing': bool(e.activations_offload)}
  if e.tensor_par > 1:
    out['tensor_parallel'] = {'autotp_size': int(e.tensor_par)}
  if e.pipeline_par > 1:
    out['pipeline'] = {
      'stages': int(e.pipeline_par),
      'activation_checkpoint_interval':
      1 if e.activation_recompute == 'full' else 0}
  if inp.app.is_moe and e.expert_par > 1:
    out['expert_parallel'] = {
      'enabled': True, 'autoep_size': int(e.expert_par),
      'expert_tensor_parallel_size': int(e.expert_tensor_par)}
  return out


def render(inp):
  """The export file's text (JSON, which has no comments: what wrote it
  and for which release is its ``calculon_export`` key, which DeepSpeed
  does not read).

  Raises:
    ConfigError: see :func:`refusals`.
  """
  import json
  cfg = ds_config(inp)
  how = [f'World size: {inp.num_procs}; data-parallel world size '
         f'{inp.exe.data_par} (the batch assertion divides by it).',
         'Use: deepspeed.initialize(model=..., config=THIS_FILE); with PP, '
         f'PipelineModule(layers, num_stages={inp.exe.pipeline_par}).']
  cfg = {'calculon_export': {
    'framework': 'deepspeed', 'versions': dict(VERSIONS),
    'notes': header_lines(inp, TARGET, how)}, **cfg}
  return json.dumps(cfg, indent=2) + '\n'
