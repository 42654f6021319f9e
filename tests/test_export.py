"""calculon export: the mapping of an execution onto each framework's launch
config (hand-checked values), the refusals with their one-line messages,
the command line through a subprocess, and every execution of small
searches under megatron-core and torchtitan exported with the same degrees,
batch and microbatch.

The frameworks' own config classes accepting these exports is
tests/test_export_frameworks.py (it needs the optional ``export`` extra).
"""

import json
import os

import pytest
import yaml

from conftest import load_json, repo, run_cli
import export_cases as C
from calculon.errors import ConfigError
from calculon.export import deepspeed as DS
from calculon.export import megatron_bridge as MB
from calculon.export import torchtitan as TT


def test_target_names_match_the_cli_help():
  from calculon import export
  from calculon.cli import export as cli
  assert export.TARGET_NAMES == cli._TARGETS


# -- Megatron-Bridge ---------------------------------------------------------------

def test_megatron_degrees_vp_recompute_fp8():
  # 4 x 4 x 2 (CP) x 8 = 256 GPUs; 80 blocks over PP 4 x VP 5 = 4 each:
  # an even split, no layout.
  o = MB.overrides(C.inp(
    'llama3-70B', 'megatron-core', num_procs=256, tensor_par=4,
    pipeline_par=4, pipeline_interleaving=5, data_par=8, context_par=2,
    batch_size=512, microbatch_size=1, activation_recompute='selective',
    recompute_modules=['core_attn', 'mlp'], datatype='float8',
    precision_recipe='transformer_engine', quantization_scaling='current'))
  m = o['model']
  assert (m['tensor_model_parallel_size'], m['pipeline_model_parallel_size'],
          m['virtual_pipeline_model_parallel_size'],
          m['context_parallel_size']) == (4, 4, 5, 2)
  assert m['sequence_parallel'] is True
  assert m['expert_tensor_parallel_size'] == 1  # written: None means TP
  assert m['pipeline_model_parallel_layout'] is None
  assert m['recompute_granularity'] == 'selective'
  assert m['recompute_modules'] == ['core_attn', 'mlp']
  assert m['seq_length'] == 8192
  assert o['train'] == {'global_batch_size': 512, 'micro_batch_size': 1}
  # bf16_with_fp8_current_scaling_mixed: fp8 hybrid, recipe tensorwise.
  assert o['mixed_precision']['fp8'] == 'hybrid'
  assert o['mixed_precision']['fp8_recipe'] == 'tensorwise'
  assert o['mixed_precision']['bf16'] is True
  # megatron-core's distributed optimizer (optimizer_sharding: true), in
  # both the ddp and the optimizer sections (Bridge syncs them).
  assert o['ddp']['use_distributed_optimizer'] is True
  assert o['optimizer']['use_distributed_optimizer'] is True
  assert o['ddp']['use_megatron_fsdp'] is False


def test_megatron_full_recompute_mxfp8_and_fsdp():
  o = MB.overrides(C.inp(
    'llama3-70B', 'megatron-core', activation_recompute='full',
    datatype='float8', precision_recipe='transformer_engine',
    quantization_scaling='block', data_par_sharding='parameters'))
  m = o['model']
  assert (m['recompute_granularity'], m['recompute_method'],
          m['recompute_num_layers']) == ('full', 'uniform', 1)
  assert o['mixed_precision']['fp8'] == 'e4m3'
  assert o['mixed_precision']['fp8_recipe'] == 'mxfp8'
  assert o['ddp']['use_megatron_fsdp'] is True
  assert o['ddp']['data_parallel_sharding_strategy'] == 'optim_grads_params'
  assert o['checkpoint'] == {'ckpt_format': 'fsdp_dtensor'}


def test_megatron_uneven_pipeline_is_a_layout():
  # 80 blocks over PP 6: 80 = 6 x 13 + 2, so ranks 0 and 1 hold 14 and the
  # other four 13 (calculon's split); 82 is no multiple of 6 either, so no
  # account_for_* split: a layout, embedding first, loss last.
  o = MB.overrides(C.inp('llama3-70B', 'megatron-core', num_procs=384,
                         tensor_par=8, pipeline_par=6, data_par=8,
                         batch_size=384, microbatch_size=1))
  layout = o['model']['pipeline_model_parallel_layout']
  stages = layout.split('|')
  assert stages == ['E' + 't' * 14, 't' * 14] + ['t' * 13] * 3 + \
    ['t' * 13 + 'L']
  assert layout.count('t') == 80


def test_megatron_counts_vocab_is_the_account_for_flags():
  # Llama 3.1 405B: 126 blocks; PP 16 divides 126 + 2 = 128 but not 126,
  # so the preset counts the embedding and the loss as a layer each
  # (pipeline_split_counts_vocab): Megatron's account_for_* flags.
  o = MB.overrides(C.inp('llama3.1-405B', 'megatron-core', num_procs=1024,
                         tensor_par=8, pipeline_par=16, data_par=8,
                         batch_size=512, microbatch_size=1))
  m = o['model']
  assert m['account_for_embedding_in_pipeline_split'] is True
  assert m['account_for_loss_in_pipeline_split'] is True
  assert m['pipeline_model_parallel_layout'] is None


def test_megatron_activation_offload_layers_and_optimizer_offload():
  o = MB.overrides(C.inp('llama3-70B', 'megatron-core', offloaded_layers=51,
                         activations_offload=True))
  assert o['model']['cpu_offloading'] is True
  assert o['model']['cpu_offloading_num_layers'] == 51
  o = MB.overrides(C.inp('llama3-70B', 'megatron-core',
                         optimizer_offload=True))
  assert o['optimizer']['optimizer_cpu_offload'] is True
  assert o['optimizer']['optimizer_offload_fraction'] == 1.0


def test_megatron_moe_fields():
  o = MB.overrides(C.inp('mixtral-8x7B', 'megatron-core', num_procs=256,
                         tensor_par=2, data_par=128, expert_par=8,
                         batch_size=512, moe_dispatcher='deepep',
                         moe_comm_overlap='shared_experts'))
  m = o['model']
  assert m['expert_model_parallel_size'] == 8
  assert m['moe_token_dispatcher_type'] == 'flex'
  assert m['moe_flex_dispatcher_backend'] == 'deepep'
  assert m['moe_shared_expert_overlap'] is True
  assert o['comm_overlap']['overlap_moe_expert_parallel_comm'] is False


def test_megatron_file_names_its_versions():
  text = MB.render(C.inp('llama3-70B', 'megatron-core'))
  assert 'Megatron-Bridge 0.6.2 (megatron-core 0.19.2)' in text
  data = yaml.safe_load(text)
  assert data['model']['tensor_model_parallel_size'] == 8


# -- torchtitan --------------------------------------------------------------------

def test_torchtitan_pipeline_batch_and_stages():
  # TP 8 x PP 4 x DP 16 = 512; batch 512 / DP 16 = 32 per replica, one
  # pipeline flush of 16 microbatches of 2; 80 blocks over 4 x 2 = 8
  # stages of 10, stage k on rank k mod 4.
  s = TT.settings(C.inp('llama3-70B', 'torchtitan', tensor_par=8,
                        pipeline_par=4, pipeline_interleaving=2, data_par=16,
                        batch_size=512, microbatch_size=2))
  p, t = s['parallelism'], s['training']
  assert (p['tensor_parallel_degree'], p['pipeline_parallel_degree'],
          p['data_parallel_shard_degree'],
          p['data_parallel_replicate_degree']) == (8, 4, 16, 1)
  assert p['pipeline_parallel_schedule'] == 'Interleaved1F1B'
  assert p['pipeline_parallel_microbatch_size'] == 2
  assert p['fsdp_reshard_after_forward'] == 'never'  # 'optimizer' with PP
  assert (t['local_batch_size'], t['global_batch_size']) == (32, 512)
  parts = p['module_fqns_per_model_part']
  assert len(parts) == 8
  assert parts[0] == ['tok_embeddings'] + [f'layers.{i}' for i in range(10)]
  assert parts[1] == [f'layers.{i}' for i in range(10, 20)]
  assert parts[-1] == [f'layers.{i}' for i in range(70, 80)] + \
    ['norm', 'lm_head']
  assert t['disable_cuda_graphs'] is True  # PP: no CUDA graphs
  assert s['activation_checkpoint'] is None


def test_context_parallel_exchange_in_both_exports():
  """The CP exchange as each framework runs it: torchtitan 0.3.0
  all-gathers K and V with no option for the ring (PyTorch's CP dispatcher,
  rotate_method ALL_GATHER), so its preset's executions export as they are
  and a ring is refused; Megatron-Core rings unless told (model.cp_comm_type
  'p2p', or 'all_gather'), not written without CP."""
  cp = dict(num_procs=64, tensor_par=8, pipeline_par=1, data_par=4,
            context_par=2, batch_size=64, microbatch_size=1)
  p = TT.settings(C.inp('llama3-70B', 'torchtitan', **cp))['parallelism']
  assert p['context_parallel_degree'] == 2
  assert 'context_parallel_rotate_method' not in p  # not in 0.3.0's config
  with pytest.raises(ConfigError, match="field 'context_par_comm'"):
    TT.settings(C.inp('llama3-70B', 'torchtitan', context_par_comm='ring',
                      **cp))
  m = MB.overrides(C.inp('llama3-70B', 'megatron-core', **cp))['model']
  assert m['cp_comm_type'] == 'p2p'
  m = MB.overrides(C.inp('llama3-70B', 'megatron-core',
                         context_par_comm='all_gather', **cp))['model']
  assert m['cp_comm_type'] == 'all_gather'
  m = MB.overrides(C.inp('llama3-70B', 'megatron-core', num_procs=64,
                         tensor_par=8, data_par=8, batch_size=64))['model']
  assert m['cp_comm_type'] is None


def test_torchtitan_without_pp_accumulates_gradients():
  # TP 8 x DP 64, batch 512, microbatch 2: local_batch_size 2 and
  # 512 / (2 x 64) = 4 accumulation steps, the execution's 4 microbatches.
  s = TT.settings(C.inp('llama3-70B', 'torchtitan', microbatch_size=2,
                        activation_recompute='full',
                        tensor_par_overlap='ring', datatype='float8'))
  p, t = s['parallelism'], s['training']
  assert (p['data_parallel_shard_degree'], t['local_batch_size'],
          t['global_batch_size']) == (64, 2, 512)
  assert t['global_batch_size'] // (t['local_batch_size'] * 64) == 4
  assert p['fsdp_reshard_after_forward'] == 'default'  # FSDP, parameters
  assert p['module_fqns_per_model_part'] is None
  assert s['activation_checkpoint'] == 'full'
  assert s['compile'] == {'enable': True,
                          'enable_async_tensor_parallel': True,
                          'components': ['model']}
  # float8 with the preset's 'current' scaling: torchao rowwise.
  assert s['converter'] == ('Float8LinearConverter',
                            {'recipe_name': 'rowwise'})


def test_torchtitan_ddp_and_cpu_offload():
  s = TT.settings(C.inp('llama3-70B', 'torchtitan', data_par_sharding='none'))
  assert (s['parallelism']['data_parallel_replicate_degree'],
          s['parallelism']['data_parallel_shard_degree']) == (64, 1)
  s = TT.settings(C.inp('llama3-70B', 'torchtitan', weight_offload=True,
                        optimizer_offload=True))
  assert s['training']['enable_cpu_offload'] is True


def test_torchtitan_flags_and_module():
  text = TT.render(C.inp('llama3-70B', 'torchtitan', pipeline_par=4,
                         data_par=16, microbatch_size=2))
  assert 'torchtitan 0.3.0' in text
  namespace = {}
  exec(compile(text, '<export>', 'exec'), namespace)
  assert namespace['TORCHTITAN_VERSION'] == '0.3.0'
  assert '--parallelism.pipeline_parallel_degree=4' in namespace['FLAGS']
  assert '--training.local_batch_size=32' in namespace['FLAGS']
  assert callable(namespace['apply'])


# -- DeepSpeed ---------------------------------------------------------------------

def test_deepspeed_zero3_offload_and_batch():
  # TP 1 x DP 512, batch 512? no: 64 GPUs of DP, batch 512, microbatch 2:
  # 512 = 2 x 4 x 64, four accumulation steps.
  cfg = DS.ds_config(C.inp('llama3-8B', 'deepspeed-zero', num_procs=64,
                           tensor_par=1, data_par=64, microbatch_size=2,
                           tensor_par_comm_type='ar',
                           data_par_sharding='parameters',
                           weight_offload=True, optimizer_offload=True))
  assert cfg['train_batch_size'] == 512
  assert cfg['train_micro_batch_size_per_gpu'] == 2
  assert cfg['gradient_accumulation_steps'] == 4
  assert cfg['zero_optimization']['stage'] == 3
  assert cfg['zero_optimization']['offload_param'] == {'device': 'cpu'}
  assert cfg['zero_optimization']['offload_optimizer'] == {'device': 'cpu'}
  assert cfg['bf16'] == {'enabled': True}


def test_deepspeed_pipeline_zero1_autotp():
  cfg = DS.ds_config(C.inp('llama3-70B', 'deepspeed-zero', tensor_par=4,
                           pipeline_par=4, data_par=32,
                           tensor_par_comm_type='ar',
                           data_par_sharding='optimizer',
                           activation_recompute='full'))
  assert cfg['zero_optimization']['stage'] == 1
  assert cfg['tensor_parallel'] == {'autotp_size': 4}
  assert cfg['pipeline'] == {'stages': 4, 'activation_checkpoint_interval': 1}
  assert cfg['gradient_accumulation_steps'] == 512 // 32
  text = DS.render(C.inp('llama3-70B', 'deepspeed-zero', tensor_par=4,
                         pipeline_par=4, data_par=32,
                         tensor_par_comm_type='ar',
                         data_par_sharding='optimizer'))
  assert json.loads(text)['calculon_export']['versions'] == \
    {'deepspeed': '0.19.8'}


# -- refusals ----------------------------------------------------------------------

@pytest.mark.parametrize('module, framework, fields, field, words', [
  (TT, 'megatron-core', dict(data_par_sharding='gradients'),
   'data_par_sharding', 'FSDP2 shards parameters'),
  (TT, 'megatron-core', dict(activation_recompute='selective'),
   'recompute_modules', 'SelectiveAC recomputes per op'),
  (TT, 'megatron-core', dict(datatype='float8',
                             precision_recipe='transformer_engine',
                             quantization_scaling='delayed',
                             data_par_sharding='parameters'),
   'quantization_scaling', 'no delayed scaling'),
  (TT, 'common', dict(tensor_par_overlap='ring',
                      tensor_par_comm_type='ar'),
   'tensor_par_overlap', "needs tensor_par_comm_type 'rs_ag'"),
  (DS, 'megatron-core', dict(pipeline_par=4, data_par=16,
                             tensor_par_comm_type='ar',
                             data_par_sharding='gradients'),
   'data_par_sharding', 'ZeRO-2 and ZeRO-3 are incompatible with pipeline'),
  (DS, 'megatron-core', dict(pipeline_par=4, data_par=16,
                             pipeline_interleaving=2,
                             tensor_par_comm_type='ar'),
   'pipeline_interleaving', 'not interleaved'),
  (DS, 'megatron-core', dict(), 'tensor_par_comm_type', 'AutoTP'),
  (MB, 'calculon', dict(tensor_par_comm_type='p2p_rs_ag'),
   'tensor_par_comm_type', 'sequence_parallel'),
  (MB, 'megatron-core', dict(activations_offload=True),
   'activation_offload_layers', 'give --system'),
  (MB, 'torchtitan', dict(activation_recompute='selective'),
   'recompute_modules', 'alternate_linears is not a megatron-core'),
])
def test_refusals_name_the_field(module, framework, fields, field, words):
  with pytest.raises(ConfigError) as err:
    module.render(C.inp('llama3-70B', framework, **fields))
  msg = str(err.value)
  assert '\n' not in msg
  assert f"field '{field}'" in msg and module.TARGET in msg
  assert words in msg
  assert err.value.field == field


def test_uneven_chunks_refused():
  # 80 blocks over PP 6 with VP 2: ranks of 13 blocks split unevenly.
  from calculon.export._common import ExportInput, stage_blocks
  from types import SimpleNamespace
  exe = SimpleNamespace(pipeline_par=6, pipeline_interleaving=2,
                        pipeline_split_counts_vocab=False,
                        pipeline_interleaving_name=None)
  inp = ExportInput(exe=exe, app=C.app('llama3-70B'), source='<t>')
  with pytest.raises(ConfigError, match="field 'pipeline_interleaving'"):
    stage_blocks(inp, 'X')


# -- command line ------------------------------------------------------------------

def test_cli_export_execution_file(tmp_path):
  exe = tmp_path / 'exe.json'
  rec = C.resolved('llama3-70B', 'megatron-core').to_dict()
  exe.write_text(json.dumps(rec))
  res = run_cli('export', repo('models', 'llama3-70B.json'), exe,
                '--to', 'megatron-bridge')
  assert res.returncode == 0, res.stderr
  data = yaml.safe_load(res.stdout)
  assert data['model']['tensor_model_parallel_size'] == 8
  assert data['train']['global_batch_size'] == 512
  exe = tmp_path / 'exe-tt.json'
  exe.write_text(json.dumps(C.resolved('llama3-70B', 'torchtitan')
                            .to_dict()))
  out = tmp_path / 'tt.py'
  res = run_cli('export', repo('models', 'llama3-70B.json'), exe,
                '--to', 'torchtitan', '-o', out)
  assert res.returncode == 0, res.stderr
  assert 'TORCHTITAN_VERSION = "0.3.0"' in out.read_text()


def test_cli_refusal_and_bad_target(tmp_path):
  exe = tmp_path / 'exe.json'
  exe.write_text(json.dumps(C.resolved('llama3-70B', 'megatron-core')
                            .to_dict()))
  res = run_cli('export', repo('models', 'llama3-70B.json'), exe,
                '--to', 'deepspeed')
  assert res.returncode == 2
  assert res.stderr.strip().count('\n') == 0
  assert "field 'tensor_par_comm_type'" in res.stderr
  assert 'Traceback' not in res.stderr
  bad = tmp_path / 'list.json'
  bad.write_text('[1, 2]')
  res = run_cli('export', repo('models', 'llama3-70B.json'), bad,
                '--to', 'torchtitan')
  assert res.returncode == 2 and 'Traceback' not in res.stderr
  assert 'not an execution, a search result or a plan' in res.stderr
  res = run_cli('export', repo('models', 'llama3-70B.json'), exe,
                '--to', 'nemo')
  assert res.returncode == 2
  assert "--to 'nemo' is not an export target" in res.stderr


def test_cli_search_export_beside_and_export_of_result(tmp_path):
  best = tmp_path / 'best.json'
  res = run_cli('loe', repo('models', 'llama3-70B.json'), 512, 512,
                'bfloat16', repo('systems', 'h100_sxm_80g.json'), best,
                '--framework', 'torchtitan', '--tp', '8', '--pp', '4',
                '-t', '2', '-q', '-c', '1', '--export', 'torchtitan')
  assert res.returncode == 0, res.stderr
  beside = tmp_path / 'best.torchtitan.py'
  namespace = {}
  exec(compile(beside.read_text(), str(beside), 'exec'), namespace)
  top = load_json(best)['0']['framework']['resolved']
  par, tr = namespace['PARALLELISM'], namespace['TRAINING']
  assert par['tensor_parallel_degree'] == top['tensor_par'] == 8
  assert par['pipeline_parallel_degree'] == top['pipeline_par'] == 4
  assert par['pipeline_parallel_microbatch_size'] == top['microbatch_size']
  assert tr['global_batch_size'] == top['batch_size']
  # calculon export of the result file takes its best: the same file.
  res = run_cli('export', repo('models', 'llama3-70B.json'), best,
                '--to', 'torchtitan', '--system',
                repo('systems', 'h100_sxm_80g.json'))
  assert res.returncode == 0, res.stderr
  assert res.stdout == beside.read_text()


def test_cli_plan_export_beside(tmp_path):
  exe = tmp_path / 'exe.json'
  exe.write_text(json.dumps(C.resolved('llama3-70B', 'megatron-core')
                            .to_dict()))
  plan = tmp_path / 'plan.json'
  res = run_cli('plan', repo('models', 'llama3-70B.json'),
                repo('systems', 'h100_sxm_80g.json'), '--tokens', '1T',
                '--execution', exe, '-o', plan, '-q',
                '--export', 'megatron-bridge')
  assert res.returncode == 0, res.stderr
  data = yaml.safe_load((tmp_path / 'plan.megatron-bridge.yaml').read_text())
  assert data['model']['tensor_model_parallel_size'] == 8
  res = run_cli('plan', repo('models', 'llama3-70B.json'),
                repo('systems', 'h100_sxm_80g.json'), '--tokens', '1T',
                '--execution', exe, '--export', 'megatron-bridge')
  assert res.returncode == 2
  assert '--export megatron-bridge: needs -o' in res.stderr


# -- every searched execution exports, with the same degrees ----------------------

def _check_megatron(e, o):
  m = o['model']
  assert m['tensor_model_parallel_size'] == e.tensor_par
  assert m['pipeline_model_parallel_size'] == e.pipeline_par
  assert (m['virtual_pipeline_model_parallel_size'] or 1) == \
    e.pipeline_interleaving
  assert m['context_parallel_size'] == e.context_par
  assert m['expert_model_parallel_size'] == e.expert_par
  assert o['train'] == {'global_batch_size': e.batch_size,
                        'micro_batch_size': e.microbatch_size}
  dp = e.num_procs // (e.tensor_par * e.pipeline_par * e.context_par)
  assert dp == e.data_par
  layout = m['pipeline_model_parallel_layout']
  if layout:
    assert len(layout.split('|')) == e.pipeline_par * e.pipeline_interleaving


def _check_torchtitan(e, s, num_blocks):
  p, t = s['parallelism'], s['training']
  assert p['tensor_parallel_degree'] == e.tensor_par
  assert p['pipeline_parallel_degree'] == e.pipeline_par
  assert p['context_parallel_degree'] == e.context_par
  assert p['expert_parallel_degree'] == e.expert_par
  batch_degree = p['data_parallel_replicate_degree'] * \
    p['data_parallel_shard_degree']
  assert batch_degree == e.data_par
  assert batch_degree * e.tensor_par * e.pipeline_par * e.context_par == \
    e.num_procs
  assert t['global_batch_size'] == e.batch_size
  # one step = the execution's microbatches: accumulation x pipeline
  steps = t['global_batch_size'] // (t['local_batch_size'] * batch_degree)
  mbs = p['pipeline_parallel_microbatch_size'] if e.pipeline_par > 1 \
    else t['local_batch_size']
  pipe = t['local_batch_size'] // mbs
  assert mbs == e.microbatch_size
  assert steps * pipe == e.batch_size // e.data_par // e.microbatch_size
  if e.pipeline_par > 1:
    parts = p['module_fqns_per_model_part']
    assert len(parts) == e.pipeline_par * e.pipeline_interleaving
    layers = [x for part in parts for x in part if x.startswith('layers.')]
    assert layers == [f'layers.{i}' for i in range(num_blocks)]


@pytest.mark.parametrize('index', range(len(C.SEARCHES)))
def test_every_searched_execution_exports(index):
  from calculon import export
  from calculon.export import ExportInput
  app, system, exes = C.search(index)
  assert exes
  framework = C.SEARCHES[index][2]
  own = {'megatron-core': MB, 'torchtitan': TT}[framework]
  for e in exes:
    layers = export.offloaded_layers(app, e, system)
    inp = ExportInput(exe=e, app=app, source='<search>',
                      offloaded_layers=layers)
    # its own framework takes it
    if own is MB:
      _check_megatron(e, MB.overrides(inp))
    else:
      _check_torchtitan(e, TT.settings(inp), app.num_blocks)
    # the other framework takes it with the same degrees, or refuses it in
    # one line naming the field
    for other in (MB, TT):
      if other is own:
        continue
      try:
        out = other.overrides(inp) if other is MB else other.settings(inp)
      except ConfigError as err:
        assert "field '" in str(err) and '\n' not in str(err)
        assert err.field
        continue
      if other is MB:
        _check_megatron(e, out)
      else:
        _check_torchtitan(e, out, app.num_blocks)
