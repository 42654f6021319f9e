"""The frameworks' own config classes accept calculon's exports.

Needs the optional ``export`` extra (torchtitan 0.3.0, megatron-core
0.19.2, deepspeed 0.19.8); each part skips without its package, so the CI's
``.[test,profile]`` install skips them all.

* torchtitan: ``apply(recipe())`` builds a new ``Trainer.Config`` (its
  ``__post_init__`` checks), ``ParallelDims`` validates the degrees against
  the world size, the flags parse through torchtitan's own ConfigManager
  (tyro), and the trainer's batch arithmetic (trainer.py) holds.
* Megatron-Bridge 0.6.2 cannot be imported on a CPU: it imports
  ``transformer_engine.pytorch`` at import time
  (``megatron/bridge/peft/lora_layers.py``, reached from
  ``megatron.bridge.training.config``), and transformer-engine 2.20.2's
  PyTorch part (transformer_engine_torch) is a source distribution that
  builds only with CUDA.  So its sections are checked as megatron-core
  0.19.2 takes them -- ``TransformerConfig`` (``__post_init__``, the
  pipeline layout), ``DistributedDataParallelConfig``, ``OptimizerConfig``,
  the constant microbatch calculator -- and every other key against the
  fields of Bridge's dataclasses read from the installed package's source
  (``megatron/bridge/training/config.py``, ``comm_overlap.py``,
  ``mixed_precision.py``, ``models/gpt_provider.py``).
* DeepSpeed: ``DeepSpeedConfig`` (its batch assertion with the
  data-parallel world size from an mpu, its ZeRO pydantic models) and
  AutoEP's ``validate_autoep_config``.
"""

import ast
import importlib.util
import os

import pytest

import export_cases as C
from calculon.export import ExportInput, offloaded_layers
from calculon.export import deepspeed as DS
from calculon.export import megatron_bridge as MB
from calculon.export import torchtitan as TT



def _search_inputs():
  """(id, ExportInput) of every execution of the shared searches."""
  out = []
  for i in range(len(C.SEARCHES)):
    a, s, exes = C.search(i)
    for k, e in enumerate(exes):
      out.append((f'{C.SEARCHES[i][0]}-{C.SEARCHES[i][2]}-{k}', ExportInput(
        exe=e, app=a, source='<search>',
        offloaded_layers=offloaded_layers(a, e, s))))
  return out


def _hand_inputs():
  return [
    ('70b-pp6-layout', C.inp('llama3-70B', 'megatron-core', num_procs=384,
                             tensor_par=8, pipeline_par=6, data_par=8,
                             batch_size=384)),
    ('405b-pp16-vocab', C.inp('llama3.1-405B', 'megatron-core',
                              num_procs=1024, tensor_par=8, pipeline_par=16,
                              data_par=8, batch_size=512)),
    ('70b-vp5-cp2-fp8', C.inp(
      'llama3-70B', 'megatron-core', num_procs=256, tensor_par=4,
      pipeline_par=4, pipeline_interleaving=5, data_par=8, context_par=2,
      activation_recompute='selective', datatype='float8',
      precision_recipe='transformer_engine')),
    ('70b-full-fsdp', C.inp('llama3-70B', 'megatron-core',
                            activation_recompute='full',
                            data_par_sharding='parameters')),
    ('70b-tt-cp2', C.inp('llama3-70B', 'torchtitan', num_procs=64,
                         tensor_par=8, data_par=4, context_par=2,
                         batch_size=64, microbatch_size=1)),
    ('70b-tt-pp4-vp2', C.inp('llama3-70B', 'torchtitan', pipeline_par=4,
                             pipeline_interleaving=2, data_par=16,
                             microbatch_size=2)),
    ('70b-tt-fsdp-offload', C.inp('llama3-70B', 'torchtitan',
                                  weight_offload=True,
                                  optimizer_offload=True,
                                  activation_recompute='full')),
    ('70b-ds-pp4', C.inp('llama3-70B', 'deepspeed-zero', tensor_par=4,
                         pipeline_par=4, data_par=32,
                         tensor_par_comm_type='ar',
                         data_par_sharding='optimizer')),
    ('8b-ds-zero3', C.inp('llama3-8B', 'deepspeed-zero', num_procs=64,
                          tensor_par=1, data_par=64, microbatch_size=2,
                          tensor_par_comm_type='ar',
                          data_par_sharding='parameters',
                          weight_offload=True, optimizer_offload=True)),
  ]


def _exportable(module, cases):
  out = []
  for name, inp in cases:
    try:
      module.refusals(inp)
    except Exception:
      continue
    out.append((name, inp))
  assert out, f'no case exports to {module.NAME}'
  return out


# -- torchtitan --------------------------------------------------------------------

def _tt_apply(inp, tmp_path):
  text = TT.render(inp)
  path = tmp_path / 'export_tt.py'
  path.write_text(text)
  spec = importlib.util.spec_from_file_location('export_tt', path)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def test_torchtitan_accepts_the_exports(tmp_path):
  pytest.importorskip('torchtitan')
  import importlib
  from torchtitan.config.manager import ConfigManager
  from torchtitan.distributed.parallel_dims import ParallelDims
  for name, inp in _exportable(TT, _hand_inputs() + _search_inputs()):
    mod = _tt_apply(inp, tmp_path)
    # llama3_70b (the 405B recipe converts to float8 itself, which needs
    # torchao and a GPU): the layer check below runs where it has the
    # application's blocks
    module, fn = 'llama3', 'llama3_70b'
    recipe = getattr(importlib.import_module(
      f'torchtitan.models.{module}.config_registry'), fn)
    if mod.CONVERTER is not None:
      mod.CONVERTER = None   # the converters check for a CUDA device
    cfg = mod.apply(recipe())
    par = cfg.parallelism
    dims = ParallelDims.from_config(par, world_size=inp.num_procs)
    batch_degree = dims.dp_replicate * dims.dp_shard
    assert batch_degree == inp.exe.data_par, name
    t = cfg.training
    assert t.global_batch_size % (t.local_batch_size * batch_degree) == 0
    steps = t.global_batch_size // (t.local_batch_size * batch_degree)
    pipe = t.local_batch_size // par.pipeline_parallel_microbatch_size \
      if dims.pp > 1 else 1
    assert steps * pipe == inp.num_microbatches, name
    if dims.ep > 1:
      assert (dims.dp_shard * dims.cp * dims.tp) % dims.ep == 0, name
    if par.module_fqns_per_model_part:
      assert len(par.module_fqns_per_model_part) % dims.pp == 0
      if len(cfg.model_spec.model.layers) == inp.app.num_blocks:
        layers = [x for p in par.module_fqns_per_model_part for x in p
                  if x.startswith('layers.')]
        assert len(layers) == inp.app.num_blocks
    # the same settings as flags, through torchtitan's own parser
    flagged = ConfigManager().parse_args(
      ['--module', module, '--config', fn] + list(mod.FLAGS))
    assert flagged.parallelism.tensor_parallel_degree == \
      par.tensor_parallel_degree
    assert flagged.training.local_batch_size == t.local_batch_size
    assert flagged.compile.enable == cfg.compile.enable


# -- Megatron (megatron-core's classes; Bridge's fields from its source) -----------

def _fields_in_source(path, cls):
  """Annotated field names of class ``cls`` in a Python source file."""
  with open(path) as fd:
    tree = ast.parse(fd.read())
  for node in ast.walk(tree):
    if isinstance(node, ast.ClassDef) and node.name == cls:
      return {n.target.id for n in node.body
              if isinstance(n, ast.AnnAssign) and
              isinstance(n.target, ast.Name)}
  raise AssertionError(f'{cls} not in {path}')


def _bridge_file(*parts):
  spec = importlib.util.find_spec('megatron.bridge')
  if spec is None:
    pytest.skip('megatron-bridge is not installed')
  return os.path.join(os.path.dirname(spec.origin), *parts)


def test_megatron_core_accepts_the_exports():
  pytest.importorskip('megatron.core')
  import dataclasses
  import torch
  from megatron.core.distributed import DistributedDataParallelConfig
  from megatron.core.num_microbatches_calculator import \
    ConstantNumMicroBatchesCalculator
  from megatron.core.optimizer import OptimizerConfig
  from megatron.core.transformer.transformer_config import TransformerConfig
  tc_fields = {f.name for f in dataclasses.fields(TransformerConfig)}
  if importlib.util.find_spec('megatron.bridge') is None:
    provider = {'seq_length'}   # GPTModelProvider's, in its source
  else:
    provider = _fields_in_source(_bridge_file('models', 'gpt_provider.py'),
                                 'GPTModelProvider')
  for name, inp in _exportable(MB, _hand_inputs() + _search_inputs()):
    o = MB.overrides(inp)
    model = dict(o['model'])
    extra = set(model) - tc_fields
    assert extra <= provider, (name, extra - provider)
    a = inp.app
    kw = {k: v for k, v in model.items() if k in tc_fields}
    kw.update(num_layers=a.num_blocks, hidden_size=a.hidden,
              num_attention_heads=a.attn_heads, ffn_hidden_size=a.feedforward,
              pipeline_dtype=torch.bfloat16, bf16=True)
    if a.is_moe:
      kw.update(num_moe_experts=a.num_experts, moe_router_topk=a.top_k)
    mp = o['mixed_precision']
    # (not for experts: megatron-core then asks for transformer-engine's
    # version, which a CPU cannot install)
    for k in ('fp8', 'fp8_recipe', 'fp4', 'fp4_recipe'):
      if mp.get(k) is not None and not a.is_moe:
        kw[k] = mp[k]
    cfg = TransformerConfig(**kw)   # __post_init__: megatron-core's checks
    assert cfg.tensor_model_parallel_size == inp.exe.tensor_par
    assert (cfg.virtual_pipeline_model_parallel_size or 1) == \
      inp.exe.pipeline_interleaving, name
    DistributedDataParallelConfig(**o['ddp'])
    OptimizerConfig(**o['optimizer'])
    calc = ConstantNumMicroBatchesCalculator(
      o['train']['global_batch_size'], o['train']['micro_batch_size'],
      inp.exe.data_par, decrease_batch_size_if_needed=False, rank=0)
    assert calc.get() == inp.num_microbatches, name


def test_megatron_bridge_sections_are_its_fields():
  pytest.importorskip('megatron.core')
  from megatron.core.distributed import DistributedDataParallelConfig
  from megatron.core.optimizer import OptimizerConfig
  from megatron.training.config import CheckpointConfig, TrainingConfig
  import dataclasses
  container = _fields_in_source(_bridge_file('training', 'config.py'),
                                'ConfigContainer')
  sections = {
    'train': {f.name for f in dataclasses.fields(TrainingConfig)},
    'ddp': {f.name for f in dataclasses.fields(DistributedDataParallelConfig)},
    'optimizer': {f.name for f in dataclasses.fields(OptimizerConfig)},
    'checkpoint': {f.name for f in dataclasses.fields(CheckpointConfig)},
    'comm_overlap': _fields_in_source(
      _bridge_file('training', 'comm_overlap.py'), 'CommOverlapConfig'),
    'mixed_precision': _fields_in_source(
      _bridge_file('training', 'mixed_precision.py'), 'MixedPrecisionConfig'),
  }
  for name, inp in _exportable(MB, _hand_inputs() + _search_inputs()):
    o = MB.overrides(inp)
    assert set(o) <= container, name
    for section, keys in o.items():
      if section in sections:
        assert set(keys) <= sections[section], (name, section,
                                                set(keys) - sections[section])


# -- DeepSpeed ---------------------------------------------------------------------

class _Mpu:
  """The data-parallel world size DeepSpeedConfig divides the batch by."""

  def __init__(self, dp):
    self.dp = dp

  def get_data_parallel_world_size(self):
    return self.dp


def test_deepspeed_accepts_the_exports(monkeypatch):
  pytest.importorskip('deepspeed')
  import json
  from deepspeed.runtime import config as dsc
  from deepspeed.runtime.config import DeepSpeedConfig
  # Without torch.distributed started DeepSpeedConfig ignores the mpu and
  # takes a world of 1; rank 0 makes it ask the mpu for the DP size.
  monkeypatch.setattr(dsc.dist, 'get_rank', lambda *a, **k: 0)
  cases = _exportable(DS, _hand_inputs() + _search_inputs())
  for name, inp in cases:
    cfg = json.loads(DS.render(inp))
    ds = DeepSpeedConfig(cfg, mpu=_Mpu(inp.exe.data_par))
    assert ds.train_batch_size == inp.exe.batch_size
    assert ds.gradient_accumulation_steps == inp.num_microbatches
    assert int(ds.zero_optimization_stage) == cfg['zero_optimization']['stage']
    if inp.exe.pipeline_par > 1:
      assert ds.pipeline['stages'] == inp.exe.pipeline_par
      assert int(ds.zero_optimization_stage) < 2
    if 'expert_parallel' in cfg:
      from deepspeed.module_inject.auto_ep_config import (
        parse_autoep_config, validate_autoep_config)
      ep = parse_autoep_config(cfg['expert_parallel'])
      validate_autoep_config(ep, inp.num_procs, inp.exe.pipeline_par,
                             inp.exe.tensor_par, 1)
