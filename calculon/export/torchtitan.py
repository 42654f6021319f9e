"""Export to torchtitan 0.3.0: a Python module whose ``apply(config)``
sets the execution on a recipe's ``Trainer.Config``.

torchtitan 0.3 runs a Python config function (``--module M --config F``,
``torchtitan/config/manager.py`` ConfigManager: F returns a
``Trainer.Config``; the ``--section.option`` flags still override it but
are frozen, ``torchtitan/config/configs.py`` docstring).  The export is
such a function's body: ``apply(recipe())`` in a config_registry module.
Every name below is read in the released package (torchtitan 0.3.0 from
the package index; the mirrored pytorch/torchtitan stops before it, at
b5bcd76c6, 2026-08-21):

* ``torchtitan/config/configs.py`` ParallelismConfig
  (data_parallel_replicate_degree, data_parallel_shard_degree,
  fsdp_reshard_after_forward, tensor_parallel_degree,
  enable_sequence_parallel, pipeline_parallel_degree,
  module_fqns_per_model_part, pipeline_parallel_schedule,
  pipeline_parallel_microbatch_size, context_parallel_degree,
  expert_parallel_degree), TrainingConfig (local_batch_size: per
  data-parallel rank per gradient-accumulation step, split into pipeline
  microbatches of pipeline_parallel_microbatch_size with PP;
  global_batch_size; seq_len; enable_cpu_offload; disable_cuda_graphs;
  mixed_precision_param), CompileConfig (enable, components,
  enable_async_tensor_parallel);
* ``torchtitan/distributed/activation_checkpoint.py`` FullAC,
  SelectiveAC (per-op: every second matmul recomputed) or None;
* ``torchtitan/components/quantization/`` Float8LinearConverter
  (recipe_name 'rowwise'), MXFP8LinearConverter, NVFP4LinearConverter,
  applied to the model config as ``model_registry(converters=...)`` does;
* ``torchtitan/trainer.py``: gradient accumulation steps =
  global_batch_size / (local_batch_size x (dp_replicate x dp_shard)),
  pipeline microbatches = local_batch_size / pipeline_parallel_microbatch_
  size; ``torchtitan/distributed/parallel_dims.py``: dp_replicate x
  dp_shard x cp x tp x pp = world size, and experts over
  efsdp x ep = dp_shard x cp x tp (no expert tensor parallelism).

The execution's batch runs as one pipeline flush per step, as calculon
prices it: with PP, local_batch_size = batch / DP and the microbatches are
the pipeline's; without PP, local_batch_size = microbatch and the
microbatches are gradient-accumulation steps.
"""

from calculon.export._common import (
  header_lines, refuse, refuse_mtp, stage_blocks)

NAME = 'torchtitan'
TARGET = 'torchtitan 0.3.0'
VERSIONS = {'torchtitan': '0.3.0'}
SUFFIX = '.torchtitan.py'
PRESET = 'torchtitan'

#: (datatype, quantization_scaling) -> (converter class, its Config
#: fields): torchtitan/components/quantization/float8.py (recipe_name
#: 'rowwise': a scale per row found at cast time), mx.py, nvfp4.py.
_CONVERTERS = {
  ('float8', 'current'): ('Float8LinearConverter', {'recipe_name': 'rowwise'}),
  ('float8', 'block'): ('MXFP8LinearConverter', {}),
  ('float4', 'block'): ('NVFP4LinearConverter', {}),
}
_CONVERTER_MODULES = {'Float8LinearConverter': 'float8',
                      'MXFP8LinearConverter': 'mx',
                      'NVFP4LinearConverter': 'nvfp4'}


def refusals(inp):
  """Raises the ConfigError of the first field torchtitan cannot express.

  Raises:
    ConfigError: one line naming the field and why.
  """
  e, t = inp.exe, TARGET
  if not e.training:
    raise refuse(inp, t, 'training', 'the export writes a training launch')
  mtp = refuse_mtp(inp, t)
  if mtp is not None:
    raise mtp
  if e.tensor_par_comm_type == 'p2p_rs_ag':
    raise refuse(inp, t, 'tensor_par_comm_type', 'DTensor tensor parallelism '
                 "all-reduces ('ar') or, with enable_sequence_parallel, "
                 "reduce-scatters and all-gathers ('rs_ag') in every block")
  if e.tensor_par_overlap == 'pipe':
    raise refuse(inp, t, 'tensor_par_overlap', "its async TP (compile."
                 "enable_async_tensor_parallel) is a ring overlap ('ring')")
  if e.tensor_par_overlap == 'ring' and e.tensor_par_comm_type != 'rs_ag':
    raise refuse(inp, t, 'tensor_par_overlap', 'async TP overlaps the '
                 'sequence-parallel all-gathers and reduce-scatters: it '
                 "needs tensor_par_comm_type 'rs_ag'")
  if e.activation_recompute == 'attn_only':
    raise refuse(inp, t, 'activation_recompute', 'activation_checkpoint is '
                 'FullAC, SelectiveAC (per-op), MemoryBudgetAC or none')
  if e.activation_recompute == 'selective' and \
      inp.field('recompute_modules') != ['alternate_linears']:
    raise refuse(inp, t, 'recompute_modules', "SelectiveAC recomputes per "
                 "op, every second matmul ('alternate_linears'); it has no "
                 'module list')
  if e.data_par_sharding == 'gradients':
    raise refuse(inp, t, 'data_par_sharding', 'FSDP2 shards parameters, '
                 "gradients and optimizer state together ('parameters'; with "
                 "PP, weights kept gathered: 'optimizer')")
  if e.data_par_sharding == 'optimizer' and e.pipeline_par == 1:
    raise refuse(inp, t, 'data_par_sharding', "FSDP2 without PP reshards "
                 "the weights after each forward ('parameters'); only with "
                 "PP does it keep them gathered over the step ('optimizer')")
  if e.data_par_sharding == 'none' and e.context_par > 1:
    raise refuse(inp, t, 'data_par_sharding', 'with context parallelism '
                 'FSDP2 shards the weights over the CP ranks '
                 '(parallel_dims.py: the fsdp mesh is dp_shard x cp)')
  if e.context_par > 1 and e.context_par_comm != 'all_gather':
    raise refuse(inp, t, 'context_par_comm', 'its context parallelism '
                 "all-gathers K and V and has no option for the ring "
                 '(torchtitan/distributed/context_parallel/api.py '
                 "apply_cp_to_forward: PyTorch's CP dispatcher, whose "
                 'rotate_method is ALL_GATHER, or flex_cp_allgather)')
  if e.expert_tensor_par != 1:
    raise refuse(inp, t, 'expert_tensor_par', 'its experts are not '
                 'tensor-parallel: EP borrows ranks from FSDP and TP '
                 '(efsdp x ep = dp_shard x cp x tp)')
  shard = _dp_shard(e)
  if e.expert_par > 1 and (shard * e.context_par * e.tensor_par) % \
      e.expert_par:
    raise refuse(inp, t, 'expert_par', f'EP must divide dp_shard x cp x tp '
                 f'= {shard * e.context_par * e.tensor_par}')
  if inp.app.is_moe and e.moe_dispatcher != 'alltoall':
    raise refuse(inp, t, 'moe_dispatcher', "the token dispatcher is part of "
                 "the model's MoE config, which the export does not write "
                 "(its default all-to-all is 'alltoall')")
  if inp.app.is_moe and e.moe_comm_overlap != 'none':
    raise refuse(inp, t, 'moe_comm_overlap', 'its expert parallelism does '
                 'not overlap dispatch with the shared experts or compute')
  kinds = (bool(e.weight_offload), bool(e.activations_offload),
           bool(e.optimizer_offload))
  if kinds not in ((False, False, False), (True, False, True)):
    field = 'activations_offload' if e.activations_offload else (
      'weight_offload' if e.weight_offload else 'optimizer_offload')
    raise refuse(inp, t, field, 'training.enable_cpu_offload (FSDP2 '
                 'CPUOffloadPolicy) offloads weights, gradients and '
                 'optimizer state together, nothing else')
  if e.weight_offload and e.data_par_sharding != 'parameters':
    raise refuse(inp, t, 'weight_offload', 'CPUOffloadPolicy offloads the '
                 "FSDP-sharded parameters: it needs 'parameters' sharding")
  if e.datatype == 'float16':
    raise refuse(inp, t, 'datatype', 'training.mixed_precision_param is '
                 'bfloat16 or float32')
  if e.datatype in ('float8', 'float4'):
    if e.precision_recipe != 'transformer_engine':
      raise refuse(inp, t, 'precision_recipe', f'{e.datatype} converts the '
                   "linear layers only (torchao), the rest in bfloat16 "
                   "('transformer_engine')")
    if (e.datatype, e.quantization_scaling) not in _CONVERTERS:
      allowed = [s for d, s in _CONVERTERS if d == e.datatype]
      raise refuse(inp, t, 'quantization_scaling', f'its {e.datatype} '
                   'converters scale ' + ', '.join(allowed) +
                   ' (torchao has no delayed scaling)')
  if e.cuda_graphs == 'layers':
    raise refuse(inp, t, 'cuda_graphs', 'its CUDA graphs capture the whole '
                 "forward and backward step ('full_iteration')")
  if e.cuda_graphs == 'full_iteration' and e.pipeline_par > 1:
    raise refuse(inp, t, 'cuda_graphs', 'CUDA graphs do not support '
                 'pipeline parallelism (Trainer.Config._validate_cuda_graphs)')
  if e.pipeline_par > 1 and inp.num_microbatches < e.pipeline_par:
    raise refuse(inp, t, 'microbatch_size', f'{inp.num_microbatches} '
                 f'microbatches: the 1F1B schedules need at least PP '
                 f'({e.pipeline_par})')


def _dp_shard(e):
  """data_parallel_shard_degree: DP, or 1 when nothing is sharded (then
  the DP ranks replicate: data_parallel_replicate_degree)."""
  return 1 if e.data_par_sharding == 'none' else int(e.data_par)


def _fqns(inp):
  """module_fqns_per_model_part: the modules of each virtual stage (stage
  k on pipeline rank k mod PP), named as torchtitan's own split names them
  (``torchtitan/distributed/pipeline_parallel.py``
  _generate_llm_fqn_per_model_part: tok_embeddings, layers.i, norm,
  lm_head), holding calculon's split of the blocks."""
  blocks, _ = stage_blocks(inp, TARGET)
  out, layer = [], 0
  for k, n in enumerate(blocks):
    part = ['tok_embeddings'] if k == 0 else []
    part += [f'layers.{i}' for i in range(layer, layer + n)]
    layer += n
    if k == len(blocks) - 1:
      part += ['norm', 'lm_head']
    out.append(part)
  return out


def settings(inp):
  """What the export sets: {'parallelism': {...}, 'training': {...},
  'compile': {...}, 'activation_checkpoint': 'full' | 'selective' | None,
  'converter': (class name, fields) or None} (plain values).

  Raises:
    ConfigError: see :func:`refusals`.
  """
  refusals(inp)
  e = inp.exe
  pp, vp = int(e.pipeline_par), int(e.pipeline_interleaving)
  shard = _dp_shard(e)
  if e.data_par_sharding == 'parameters':
    reshard = 'always' if pp > 1 else 'default'
  elif e.data_par_sharding == 'optimizer':
    reshard = 'never'
  else:
    reshard = 'default'
  par = {
    'data_parallel_replicate_degree': int(e.data_par) // shard,
    'data_parallel_shard_degree': shard,
    'fsdp_reshard_after_forward': reshard,
    'tensor_parallel_degree': int(e.tensor_par),
    'enable_sequence_parallel': e.tensor_par_comm_type == 'rs_ag',
    'pipeline_parallel_degree': pp,
    'pipeline_parallel_schedule': 'Interleaved1F1B' if vp > 1 else '1F1B',
    'pipeline_parallel_microbatch_size': int(e.microbatch_size),
    'module_fqns_per_model_part': _fqns(inp) if pp > 1 else None,
    'context_parallel_degree': int(e.context_par),
    'expert_parallel_degree': int(e.expert_par),
  }
  local = inp.local_batch if pp > 1 else int(e.microbatch_size)
  training = {
    'local_batch_size': local,
    'global_batch_size': int(e.batch_size),
    'seq_len': int(inp.app.seq_size),
    'enable_cpu_offload': bool(e.weight_offload),
    'disable_cuda_graphs': e.cuda_graphs != 'full_iteration',
  }
  if e.datatype == 'float32':
    training['mixed_precision_param'] = 'float32'
  async_tp = e.tensor_par_overlap == 'ring'
  compiled_loss = e.cross_entropy_kernel == 'compiled'
  components = (['model'] if async_tp else []) + \
    (['loss'] if compiled_loss else [])
  comp = {'enable': bool(components), 'enable_async_tensor_parallel': async_tp}
  if components:
    comp['components'] = components
  ac = {'full': 'full', 'selective': 'selective'}.get(e.activation_recompute)
  return {'parallelism': par, 'training': training, 'compile': comp,
          'activation_checkpoint': ac,
          'converter': _CONVERTERS.get((e.datatype, e.quantization_scaling))
          if e.datatype in ('float8', 'float4') else None}


def flags(s):
  """The same settings as torchtitan's --section.option flags, where a
  flag exists (module_fqns_per_model_part, the activation checkpointing
  policy and the converters are set by :func:`apply` only)."""
  out = []
  for section in ('parallelism', 'training', 'compile'):
    for key, value in s[section].items():
      if value is None or isinstance(value, list) and value and \
          isinstance(value[0], list):
        continue
      if isinstance(value, bool):
        out.append(f'--{section}.{key}' if value else
                   f'--{section}.no-{key}')
      elif isinstance(value, list):
        out.append(f'--{section}.{key}={",".join(value)}')
      else:
        out.append(f'--{section}.{key}={value}')
  return out


_TEMPLATE = '''\
"""{doc}
"""

import dataclasses

TORCHTITAN_VERSION = "0.3.0"

PARALLELISM = {parallelism}

TRAINING = {training}

COMPILE = {compile}

#: "full" (FullAC), "selective" (SelectiveAC) or None (no recomputation).
ACTIVATION_CHECKPOINT = {ac!r}

#: (converter class in torchtitan.components.quantization, its Config
#: fields), applied to the model config; or None.
CONVERTER = {converter!r}

#: The same settings as --section.option flags (those a flag exists for).
FLAGS = {flags}


def apply(config):
    """This execution set on ``config`` (a recipe's Trainer.Config); a new
    Trainer.Config, so its own checks run again."""
    from torchtitan.config import CompileConfig, ParallelismConfig
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC

    changes = {{
        "parallelism": ParallelismConfig(**PARALLELISM),
        "training": dataclasses.replace(config.training, **TRAINING),
        "compile": dataclasses.replace(config.compile, **COMPILE),
        "activation_checkpoint": {{"full": FullAC.Config, "selective": SelectiveAC.Config}}
        .get(ACTIVATION_CHECKPOINT, lambda: None)(),
    }}
    if CONVERTER is not None and config.model_spec is not None:
        import importlib

        name, fields = CONVERTER
        module = importlib.import_module(
            "torchtitan.components.quantization." + {modules!r}[name])
        converter = getattr(module, name).Config(
            model_compile_enabled="model" in COMPILE.get("components", []), **fields)
        model = converter.build().convert(config.model_spec.model)
        changes["model_spec"] = dataclasses.replace(config.model_spec, model=model)
    return dataclasses.replace(config, **changes)
'''


def _py(value, indent=4):
  """A Python literal of ``value`` (dict, list, scalars), laid out one key
  a line."""
  import pprint
  return pprint.pformat(value, indent=1, width=79, sort_dicts=False)


def render(inp):
  """The export file's text (a Python module).

  Raises:
    ConfigError: see :func:`refusals`.
  """
  s = settings(inp)
  how = [
    f'World size: {inp.num_procs}.',
    'Use: in a config_registry module, def my_config(): return '
    'apply(llama3_70b()) (any recipe of the model), then run with --module '
    'THAT_MODULE --config my_config.',
  ]
  doc = '\n'.join(header_lines(inp, TARGET, how))
  return _TEMPLATE.format(
    doc=doc, parallelism=_py(s['parallelism']), training=_py(s['training']),
    compile=_py(s['compile']), ac=s['activation_checkpoint'],
    converter=s['converter'], flags=_py(flags(s)),
    modules=_CONVERTER_MODULES)
