"""Framework presets (issue 33): the presets as data, the resolution rule,
what a strict preset refuses, the commands, the search within a
framework's options and the user's constraints, and how ties break."""

import copy
import json

import numpy as np
import pytest

from calculon import frameworks
from calculon.config import Application, Execution, registry
from calculon.errors import ConfigError
from calculon.frameworks import resolve_execution
from calculon.hardware import System
from calculon.search import SearchSpec, count_space, groups, \
  optimal_executions
from calculon.search.exhaustive import Best, TIE_TOLERANCE, sort_key
from calculon.search.grid import execution_record
from conftest import ROOT, load_json, repo, run_cli

LLAMA8 = repo('models', 'llama3-8B.json')
H100 = repo('systems', 'h100_sxm_80g.json')
#: A hand-written execution for Llama 3 8B on 16 H100s (Calculon's 23
#: fields only).
EXE = {
  'num_procs': 16, 'tensor_par': 2, 'pipeline_par': 2, 'data_par': 4,
  'tensor_par_net': 0, 'pipeline_par_net': 0, 'data_par_net': 1,
  'batch_size': 64, 'microbatch_size': 1, 'datatype': 'bfloat16',
  'fused_activation': True, 'activation_recompute': 'none',
  'pipeline_interleaving': 2, 'optimizer_sharding': True,
  'tensor_par_comm_type': 'rs_ag', 'tensor_par_overlap': 'none',
  'seq_par_ag_redo': True, 'data_par_overlap': True,
  'weight_offload': False, 'activations_offload': False,
  'optimizer_offload': False, 'training': True}


def llama8():
  return Application.from_dict(load_json(LLAMA8))


def test_bundled_presets_cover_the_issue():
  """At least Calculon's own, Megatron-LM of the 2021-2022 papers,
  Megatron-DeepSpeed 2022, Megatron-Core as NeMo 2 / Megatron-Bridge run
  it, torchtitan and DeepSpeed ZeRO; every rule and option names its
  source."""
  names = frameworks.names()
  for name in ('calculon', 'megatron-lm-2021', 'megatron-lm-2022',
               'megatron-deepspeed-2022', 'megatron-core', 'torchtitan',
               'deepspeed-zero'):
    assert name in names
  for name in names:
    preset = frameworks.load(name)
    assert preset.source and preset.title and preset.era, name
    for field, rule in preset.rules.items():
      assert rule.source or all(c.source for c in rule.cases), (name, field)
    for con in preset.constraints:
      assert con.source, (name, con.check)
  # Megatron-Core's distributed optimizer shards the optimizer state, not
  # the gradients: ZeRO-2 only through Megatron-FSDP, and not in 2025.
  old = frameworks.load('megatron-core-2025').rules['data_par_sharding']
  assert 'gradients' not in old.all_values
  assert 'gradients' in frameworks.load('deepspeed-zero').rules[
    'data_par_sharding'].all_values


def test_resolution_rule():
  """Written > the execution's framework > the default: calculon for
  Calculon files, megatron-core otherwise."""
  app = llama8()
  exe, sets = resolve_execution(app, Execution.from_dict(EXE))
  assert exe.framework == frameworks.RECOMMENDED == 'megatron-core'
  assert exe.optimizer_traffic == 'fused_adam' and exe.checkpoint_layout \
    == 'as_input' and exe.tensor_par_async_backward is True
  assert sets['optimizer_traffic'] == 'fused_adam'
  # Calculon's optimizer_sharding: true is Megatron-Core's distributed
  # optimizer under its preset.
  assert exe.data_par_sharding == 'optimizer'
  written = dict(EXE, optimizer_traffic='state_once',
                 framework='torchtitan', data_par_overlap=False)
  exe, _ = resolve_execution(app, Execution.from_dict(written))
  assert exe.framework == 'torchtitan'
  assert exe.optimizer_traffic == 'state_once'          # written wins
  assert exe.cross_entropy_kernel == 'eager'            # torchtitan's
  # A framework given to the run (--framework) replaces the execution's.
  exe, _ = resolve_execution(app, Execution.from_dict(written),
                             framework='megatron-core')
  assert exe.framework == 'megatron-core' and \
    exe.cross_entropy_kernel == 'fused'
  # A Calculon application and execution: Calculon's semantics.
  calc_app = Application.from_dict(load_json(repo('models',
                                                  'megatron-1T.json')))
  exe, sets = resolve_execution(calc_app, Execution.from_dict(load_json(
    repo('examples', '3072_t4_p64_d12_mbs4_full.json'))))
  assert exe.framework == 'calculon' and sets == {}
  assert exe.optimizer_traffic == 'state_once'


def test_strict_presets_refuse_what_their_framework_lacks():
  app = llama8()
  with pytest.raises(ConfigError, match="field 'data_par_sharding' = "
                     '"gradients" is not allowed with framework '
                     "'megatron-core-2025': it supports"):
    resolve_execution(app, Execution.from_dict(dict(
      EXE, data_par_sharding='gradients', framework='megatron-core-2025')))
  with pytest.raises(ConfigError, match="framework 'deepspeed-zero'"):
    resolve_execution(app, Execution.from_dict(dict(
      EXE, tensor_par_overlap='ring', framework='deepspeed-zero')))
  # Megatron-Core's interleaved schedule: microbatches a multiple of PP
  # (batch 64 / DP 4 / mbs 1 = 16 microbatches: fine; 20 with batch 80).
  with pytest.raises(ConfigError, match='multiple of pipeline_par'):
    resolve_execution(app, Execution.from_dict(dict(
      EXE, batch_size=40, pipeline_par=2, data_par=4, num_procs=16,
      microbatch_size=2)))
  # Megatron-LM of 2021: no interleaving with PP 2.
  with pytest.raises(ConfigError, match='pipeline_par >= 3'):
    resolve_execution(app, Execution.from_dict(dict(
      EXE, tensor_par_comm_type='ar', seq_par_ag_redo=False,
      data_par_overlap=False, optimizer_sharding=False,
      framework='megatron-lm-2021')))
  # Calculon's preset accepts anything written.
  resolve_execution(app, Execution.from_dict(dict(
    EXE, data_par_sharding='gradients', framework='calculon')))


def _searched(spec):
  """(allowed, columns) of every layout group the search enumerates for
  ``spec``: the preset's rules' mask and the execution columns, each
  broadcast to the group's shape by :func:`_at`."""
  from calculon.search.grid import Chunk, columns, valid_mask
  for g in groups(spec):
    cols = columns(spec, Chunk(g, ()))
    yield np.broadcast_to(valid_mask(cols, spec), g.shape), cols


def _at(value, ok):
  """``value`` (a column or an expression of columns) broadcast to the
  shape of the mask ``ok``."""
  return np.broadcast_to(np.asarray(value), ok.shape)


def test_expert_overlap_needs_interleaving_and_no_full_recompute():
  """Megatron-Core's 1F1B expert all-to-all overlap
  (--overlap-moe-expert-parallel-comm, moe_comm_overlap 'compute') needs
  the interleaved schedule when PP > 1 and no full recomputation
  (Megatron-Bridge training/comm_overlap.py at aae82005904,
  megatron/core/transformer/transformer_config.py): refused in a single
  run, and never enumerated by the search."""
  from calculon.config.execution import (
    MOE_OVERLAP_COMPUTE, RECOMPUTE_FULL, RECOMPUTE_SELECTIVE)
  from calculon.config.registry import RECOMPUTE_MODULE_SETS
  app = Application.from_dict(load_json(repo('models', 'mixtral-8x7B.json')))
  moe = dict(EXE, expert_par=4, moe_dispatcher='alltoall',
             moe_comm_overlap='compute')
  resolve_execution(app, Execution.from_dict(moe))              # VP 2
  resolve_execution(app, Execution.from_dict(dict(
    moe, pipeline_par=1, data_par=8, pipeline_interleaving=1)))  # PP 1
  with pytest.raises(ConfigError, match="'moe_comm_overlap' is not "
                     'allowed .* needs pipeline_interleaving > 1'):
    resolve_execution(app, Execution.from_dict(dict(
      moe, pipeline_interleaving=1, framework='megatron-core')))
  # NeMo's 2024 and 2025 containers predate the overlap (first in
  # Megatron-Core core_r0.14.0, tagged 2025-10-08): refused at any VP.
  for name in ('megatron-core-2025', 'megatron-core-2024'):
    with pytest.raises(ConfigError, match="'moe_comm_overlap' = \"compute\" "
                       "is not allowed with framework '" + name +
                       "': it supports \"none\", \"shared_experts\" .*core_r0.14.0"):
      resolve_execution(app, Execution.from_dict(dict(moe, framework=name)))
  with pytest.raises(ConfigError, match='without full recomputation'):
    resolve_execution(app, Execution.from_dict(dict(
      moe, activation_recompute='full', seq_par_ag_redo=False)))
  # Nor with the MoE module among selective recomputation's modules
  # (transformer_config.py since Megatron-LM 45b8eac955, #3917): 'moe' alone
  # or with others is refused; the modules beside it are not.
  for modules in (['moe'], ['layernorm', 'moe']):
    with pytest.raises(ConfigError, match="'moe_comm_overlap' is not "
                       'allowed .* without "moe" among the recompute_modules'
                       '.*45b8eac955'):
      resolve_execution(app, Execution.from_dict(dict(
        moe, activation_recompute='selective', recompute_modules=modules)))
  resolve_execution(app, Execution.from_dict(dict(
    moe, activation_recompute='selective',
    recompute_modules=['layernorm', 'moe_act'])))
  system = System(load_json(H100))
  moe_only = RECOMPUTE_MODULE_SETS.index('moe')
  seen = seen_moe_rc = 0
  for modules in (None, ['moe']):
    spec = SearchSpec(app, system, 16, 64, 'bfloat16',
                      limits={'pp': ((2, 2),), 'tp': ((1, 1),)},
                      recompute_modules=modules)
    for ok, cols in _searched(spec):
      compute = _at(cols.moe_comm_overlap == MOE_OVERLAP_COMPUTE, ok)
      vp1 = _at(cols.pipeline_interleaving <= 1, ok)
      full = _at(cols.activation_recompute == RECOMPUTE_FULL, ok)
      moe_rc = _at((cols.activation_recompute == RECOMPUTE_SELECTIVE) &
                   (np.asarray(cols.recompute_modules) == moe_only), ok)
      seen += int(np.sum(ok & compute))
      seen_moe_rc += int(np.sum(ok & moe_rc))
      assert not np.any(ok & compute & vp1)
      assert not np.any(ok & compute & full)
      assert not np.any(ok & compute & moe_rc)
  assert seen     # the overlap stays searched with interleaving
  assert seen_moe_rc   # and the MoE module's recomputation without it


def test_layer_graphs_refuse_activation_offload():
  """Megatron-Core refuses per-layer CUDA graphs with its activation
  offload (transformer_config.py: 'CUDA graphs not supported with CPU
  offloading' unless cuda_graph_impl is full_iteration): a run with both
  is refused naming the check and its source, the full-iteration graph is
  not, and a search given per-layer graphs never offloads activations."""
  app = llama8()
  off = dict(EXE, pipeline_par=1, data_par=8, pipeline_interleaving=1,
             activations_offload=True)
  resolve_execution(app, Execution.from_dict(off))
  resolve_execution(app, Execution.from_dict(dict(
    off, cuda_graphs='full_iteration')))
  with pytest.raises(ConfigError, match="'activations_offload' is not "
                     'allowed .* not with cuda_graphs "layers" .*CUDA '
                     'graphs not supported with CPU offloading'):
    resolve_execution(app, Execution.from_dict(dict(off,
                                                    cuda_graphs='layers')))
  system = System(load_json(H100))
  seen = {}
  for graphs in ('none', 'layers'):
    spec = SearchSpec(app, system, 8, 64, 'bfloat16',
                      fields={'cuda_graphs': graphs})
    seen[graphs] = 0
    for ok, cols in _searched(spec):
      act = _at(np.asarray(cols.activations_offload, dtype=bool), ok)
      seen[graphs] += int(np.sum(ok & act))
  assert seen['none'] and not seen['layers']


def test_tp_overlap_refuses_float4():
  """Transformer Engine's userbuffers (the tiled TP overlap) take FP8 and
  MXFP8 tensors only ('Unsupported quantizer for Userbuffers' otherwise,
  transformer_engine/pytorch/module/base.py at d0067d0da), and NVIDIA's
  NVFP4 recipes turn the overlap off: a float4 run with the overlap is
  refused naming the check and its source, a float8 one is not, and a
  float4 search never overlaps TP."""
  app = llama8()
  ring = dict(EXE, tensor_par_overlap='ring')
  resolve_execution(app, Execution.from_dict(dict(ring, datatype='float8')))
  resolve_execution(app, Execution.from_dict(dict(EXE, datatype='float4')))
  with pytest.raises(ConfigError, match="'tensor_par_overlap' is not "
                     'allowed .* not with datatype "float4" .*Unsupported '
                     'quantizer for Userbuffers'):
    resolve_execution(app, Execution.from_dict(dict(ring,
                                                    datatype='float4')))
  from calculon.config.execution import TP_OVERLAP_NONE
  system = System(load_json(repo('systems', 'b200.json')))
  seen, valid = {}, {}
  for dtype in ('float8', 'float4'):
    spec = SearchSpec(app, system, 8, 64, dtype)
    seen[dtype] = valid[dtype] = 0
    for ok, cols in _searched(spec):
      tpo = _at(np.asarray(cols.tensor_par_overlap) != TP_OVERLAP_NONE, ok)
      seen[dtype] += int(np.sum(ok & tpo))
      valid[dtype] += int(np.sum(ok))
  assert valid['float4'] and seen['float8'] and not seen['float4']


def test_expert_overlap_refuses_activation_offload():
  """Megatron-Core's layer-level activation offload (cpu_offloading) is
  entered only in TransformerBlock.forward's own layer loop; the 1F1B
  expert all-to-all overlap runs the layers through build_layer_callables
  instead (transformer_block.py, models/common/model_chunk_schedule_plan.py
  at d98e8a64dd), so with moe_comm_overlap 'compute' no activation is
  offloaded: a run with both is refused naming the check and its source,
  each alone is not, and the search never enumerates the two together
  while it keeps each."""
  from calculon.config.execution import MOE_OVERLAP_COMPUTE
  app = Application.from_dict(load_json(repo('models', 'mixtral-8x7B.json')))
  moe = dict(EXE, expert_par=4, moe_dispatcher='alltoall', pipeline_par=1,
             data_par=8, pipeline_interleaving=1)
  resolve_execution(app, Execution.from_dict(dict(
    moe, moe_comm_overlap='compute')))
  resolve_execution(app, Execution.from_dict(dict(
    moe, activations_offload=True)))
  for name in ('megatron-core', 'megatron-lm'):
    with pytest.raises(ConfigError, match="'activations_offload' is not "
                       "allowed with framework '" + name + "': activations "
                       'offload not with moe_comm_overlap "compute" .*'
                       'build_layer_callables'):
      resolve_execution(app, Execution.from_dict(dict(
        moe, moe_comm_overlap='compute', activations_offload=True,
        framework=name)))
  system = System(load_json(H100))
  spec = SearchSpec(app, system, 8, 64, 'bfloat16',
                    limits={'pp': ((1, 1),), 'tp': ((1, 1),)})
  seen = {'compute': 0, 'offload': 0, 'both': 0}
  for ok, cols in _searched(spec):
    compute = _at(cols.moe_comm_overlap == MOE_OVERLAP_COMPUTE, ok)
    off = _at(np.asarray(cols.activations_offload, dtype=bool), ok)
    seen['compute'] += int(np.sum(ok & compute))
    seen['offload'] += int(np.sum(ok & off))
    seen['both'] += int(np.sum(ok & compute & off))
  assert seen['compute'] and seen['offload'] and not seen['both']


def test_expert_overlap_with_fsdp_needs_pp1():
  """Megatron-Core's 1F1B expert all-to-all overlap refuses a
  Megatron-FSDP model under the interleaved schedule
  (pipeline_parallel/combined_1f1b.py at d98e8a64dd: 'EP overlap 1F1B
  with FSDP is not supported for interleaved pipeline parallelism'), and
  with PP > 1 the overlap needs interleaving: with ZeRO-2 or ZeRO-3
  sharding ('gradients', 'parameters') it runs only at PP 1. The
  distributed optimizer ('optimizer') keeps it at PP 2, VP 2; the search
  never enumerates the refused combination and keeps the others."""
  from calculon.config.execution import MOE_OVERLAP_COMPUTE, SHARD_GRADIENTS
  app = Application.from_dict(load_json(repo('models', 'mixtral-8x7B.json')))
  moe = dict(EXE, expert_par=4, moe_dispatcher='alltoall',
             moe_comm_overlap='compute')
  resolve_execution(app, Execution.from_dict(moe))     # PP 2 VP 2, ZeRO-1
  for sharding in ('gradients', 'parameters'):
    resolve_execution(app, Execution.from_dict(dict(
      moe, pipeline_par=1, data_par=8, pipeline_interleaving=1,
      data_par_sharding=sharding)))
    for name in ('megatron-core', 'megatron-lm'):
      with pytest.raises(ConfigError, match="'moe_comm_overlap' is not "
                         "allowed with framework '" + name + "': .*needs "
                         'pipeline_par = 1 .*EP overlap 1F1B with FSDP'):
        resolve_execution(app, Execution.from_dict(dict(
          moe, data_par_sharding=sharding, framework=name)))
  system = System(load_json(H100))
  spec = SearchSpec(app, system, 16, 64, 'bfloat16',
                    limits={'tp': ((1, 1),)})
  seen = {'pp1': 0, 'pp_zero1': 0, 'pp_fsdp': 0}
  for ok, cols in _searched(spec):
    compute = _at(cols.moe_comm_overlap == MOE_OVERLAP_COMPUTE, ok)
    fsdp = _at(np.asarray(cols.sharding) >= SHARD_GRADIENTS, ok)
    pp = _at(cols.pipeline_par > 1, ok)
    seen['pp1'] += int(np.sum(ok & compute & fsdp & ~pp))
    seen['pp_zero1'] += int(np.sum(ok & compute & ~fsdp & pp))
    seen['pp_fsdp'] += int(np.sum(ok & compute & fsdp & pp))
  assert seen['pp1'] and seen['pp_zero1'] and not seen['pp_fsdp']


def test_frameworks_command():
  res = run_cli('frameworks')
  assert res.returncode == 0, res.stderr
  for name in ('calculon', 'megatron-lm-2021', 'megatron-core', 'torchtitan',
               'deepspeed-zero'):
    assert name in res.stdout
  res = run_cli('frameworks', 'torchtitan')
  assert res.returncode == 0
  assert 'sets (behaviours):' in res.stdout and 'offload:' in res.stdout
  assert 'fsdp_buffer_copies' in res.stdout and 'source:' in res.stdout
  # A field's source is printed once, not once as the field's and again
  # as its single case's.
  assert res.stdout.count('when training.compile is on') == 1
  res = run_cli('frameworks', '--json', 'megatron-core')
  assert json.loads(res.stdout)[0]['name'] == 'megatron-core'


@pytest.mark.parametrize('command', [
  ['frameworks', 'nosuch'],
  ['llm', LLAMA8, repo('examples', '3072_t4_p64_d12_mbs4_full.json'), H100,
   '-', '--framework', 'nosuch'],
  ['llm-optimal-execution', LLAMA8, '8', '16', 'bfloat16', H100,
   '/tmp/calculon-never-written.json', '--framework', 'nosuch'],
  ['llm-all-executions', LLAMA8, '8', '16', 'bfloat16', H100,
   '/tmp/calculon-never-written.csv', '--framework', 'nosuch'],
  ['llm-validation', '-s', 'published', '--framework', 'nosuch'],
])
def test_unknown_framework_is_one_line_exit_2(command):
  res = run_cli(*command)
  assert res.returncode == 2, res.stderr
  lines = res.stderr.strip().splitlines()
  assert len(lines) == 1 and 'Traceback' not in res.stderr
  assert "framework 'nosuch' is not allowed: one of" in lines[0]
  assert 'megatron-core' in lines[0] and 'torchtitan' in lines[0]


def test_search_within_the_frameworks_options_and_limits():
  app, system = llama8(), System(load_json(H100))
  spec = SearchSpec(app, system, 64, 256, 'bfloat16', framework='torchtitan',
                    limits={'tp': ((1, 2),), 'pp': ((1, 1), (4, 4)),
                            'mbs': ((1, 2),)})
  gs = groups(spec)
  assert gs and all(g.tp in (1, 2) and g.pp in (1, 4) for g in gs)
  for g in gs:
    assert set(g.values['microbatch_size']) <= {1, 2}
    # torchtitan: FSDP2 (or DDP); with PP its weights stay gathered.
    assert set(g.values['data_par_sharding']) <= {1, 3, 0}
    assert g.values['tensor_par_overlap'] in ([0], [0, 1])
  # No offload: a smaller space, and no candidate offloads.
  plain = SearchSpec(app, system, 64, 256, 'bfloat16', framework='torchtitan')
  none = SearchSpec(app, system, 64, 256, 'bfloat16', framework='torchtitan',
                    no_offload=True)
  assert count_space(none) < count_space(plain)
  assert all(g.values[k] == [False] for g in groups(none)
             for k in ('weight_offload', 'activations_offload',
                       'optimizer_offload'))
  # Megatron-Core offloads activations or the optimizer, never weights.
  mc = SearchSpec(app, system, 64, 256, 'bfloat16')
  assert mc.framework == 'megatron-core'
  assert all(g.values['weight_offload'] == [False] for g in groups(mc))


def test_search_best_written_back_prices_the_same(tmp_path):
  """The search's best, written as Calculon's fields plus `framework` (and
  only the options its preset would not give), prices identically with
  ``calculon llm``: nothing of a framework is hard-coded in the search."""
  out = tmp_path / 'best.json'
  res = run_cli('llm-optimal-execution', LLAMA8, 16, 64, 'float8', H100,
                out, '-q', '-t', '3', '--no-offload', '--framework',
                'megatron-core')
  assert res.returncode == 0, res.stderr
  best = load_json(out)
  behaviours = set(registry.behaviours())
  calculon_fields = {n for n, f in registry.FIELDS['execution'].items()
                     if f.calculon and n != 'attention_type'}
  for key, entry in best.items():
    record = entry['execution']
    assert record['framework'] == 'megatron-core'
    assert calculon_fields <= set(record)
    assert not behaviours & set(record), key
    assert entry['framework']['set']['optimizer_traffic'] == 'fused_adam'
    exe = tmp_path / f'exe{key}.json'
    exe.write_text(json.dumps(record))
    stats = tmp_path / f'stats{key}.json'
    one = run_cli('llm', LLAMA8, exe, H100, stats)
    assert one.returncode == 0, one.stderr
    again = load_json(stats)
    assert again['sample_rate'] == entry['stats']['sample_rate']
    assert again['framework'] == 'megatron-core'


def test_ties_go_to_the_simpler_execution():
  """Equal sample rates: fewer offloads first, then less memory, then
  fewer pipeline stages, then enumeration order (outside Calculon's space,
  which keeps Calculon's order for golden parity).  A tier-2 memory fast
  enough to hide every offload makes offloading and not offloading tie
  exactly; the search puts the execution without offload first."""
  key = sort_key
  a = Best(10.0, 0, 5, (1, 2e9, 2))
  b = Best(10.0, 1, 1, (0, 9e9, 8))      # no offload: first
  c = Best(10.0, 0, 9, (0, 3e9, 8))      # no offload, less memory: first
  d = Best(10.0, 0, 2, (0, 3e9, 4))      # fewer stages: first
  e = Best(11.0, 5, 5, (3, 9e9, 9))      # a higher rate beats everything
  assert sorted([a, b, c, d, e], key=key) == [e, d, c, b, a]
  app = llama8()
  cfg = copy.deepcopy(load_json(H100))
  cfg['mem2'] = {'GiB': 2048, 'GBps': 1e6, 'MB_efficiency': [[0, 1.0]]}
  system = System(cfg)
  spec = SearchSpec(app, system, 8, 16, 'bfloat16', framework='common',
                    limits={'tp': ((1, 1),), 'pp': ((4, 4),),
                            'mbs': ((1, 1),)})
  result = optimal_executions(spec, 40, workers=1, chunk_size=1 << 12)
  best = result.best
  ties = 0
  for x, y in zip(best, best[1:]):
    # Rate order, except near ties (within TIE_TOLERANCE), which go to the
    # simpler execution first.
    assert x.rate > y.rate or (x.rate == y.rate and x.tie <= y.tie) or \
      (y.rate <= x.rate * (1 + TIE_TOLERANCE) and x.tie <= y.tie)
    if x.rate == y.rate and x.tie[0] < y.tie[0]:
      ties += 1
  assert ties, 'no offload tie in the top 40'
  first = execution_record(spec, result.groups[best[0].group], best[0].flat)
  assert not (first['weight_offload'] or first['activations_offload'] or
              first['optimizer_offload'])


def test_top_n_are_distinct_with_margin_and_what_binds():
  """Issue 34: the top N are distinct executions (none prices exactly as
  a better one: same rate, offloads, memory and stages), each with its
  margin to the next and the term that binds it."""
  from calculon.llm.results import best_to_output
  from calculon.report import OVERHEAD_PARTS
  app, system = llama8(), System(load_json(H100))
  spec = SearchSpec(app, system, 8, 32, 'bfloat16', framework='common',
                    limits={'pp': ((1, 2),)})
  result = optimal_executions(spec, 12, workers=1)
  keys = [(b.rate, b.tie) for b in result.best]
  assert len(result.best) == 12 and len(set(keys)) == len(keys)
  out = best_to_output(spec, result)
  labels = {'memory', 'compute'} | {label for label, _ in OVERHEAD_PARTS}
  for i in range(12):
    entry = out[str(i)]
    assert entry['binds']['term'] in labels
    assert 0 < entry['binds']['memory_used'] <= 1
    if i < 11:
      nxt = out[str(i + 1)]['stats']['sample_rate']
      assert entry['margin_to_next_pct'] == pytest.approx(
        100 * (entry['stats']['sample_rate'] / nxt - 1), rel=1e-9)
      # Near ties (within the tolerance of the best) are ordered simplest
      # first, so one may be slower than the next by less than it.
      top = max(b.rate for b in result.best)
      tied = nxt >= top * (1 - result.tie_tolerance) and \
        entry['stats']['sample_rate'] >= top * (1 - result.tie_tolerance)
      assert entry['margin_to_next_pct'] >= (
        -100 * result.tie_tolerance / (1 - result.tie_tolerance)
        if tied else 0)
  assert out['11']['margin_to_next_pct'] is None


def test_nemo_2025_runs_fsdp_with_tp_without_tp_overlap():
  """NeMo 25.04's performance scripts turn TP communication overlap off
  with Megatron-FSDP and TP > 1 ("TP overlap performance is poor when
  FSDP is used because of jitters", scripts/performance/utils.py at
  v2.3.0; removed in f56c560854 before NeMo 25.07): the megatron-core-2025
  preset refuses that combination and offers it otherwise; the current
  Megatron-Core preset keeps it."""
  app = llama8()
  fsdp = dict(EXE, data_par_sharding='parameters', tensor_par_overlap='ring',
              framework='megatron-core-2025')
  fsdp.pop('optimizer_sharding')
  with pytest.raises(ConfigError, match="'tensor_par_overlap' = \"ring\" is "
                     "not allowed with framework 'megatron-core-2025'.*"
                     'TP overlap performance is poor'):
    resolve_execution(app, Execution.from_dict(fsdp))
  resolve_execution(app, Execution.from_dict(dict(
    fsdp, tensor_par_overlap='none')))
  resolve_execution(app, Execution.from_dict(dict(
    EXE, tensor_par_overlap='ring', framework='megatron-core-2025')))
  resolve_execution(app, Execution.from_dict(dict(
    fsdp, framework='megatron-core')))


def test_nemo_2025_gathers_sixteen_bit_parameters_under_fsdp():
  """NeMo 25.04's performance scripts turn FP8 parameter gathers off under
  Megatron-FSDP ("Currently FSDP does not support FP8 param gather",
  scripts/performance/utils.py at v2.3.0): the megatron-core-2025 preset
  gathers FP8 parameters with the distributed optimizer only."""
  app = llama8()
  fp8 = dict(EXE, datatype='float8', precision_recipe='transformer_engine',
             framework='megatron-core-2025')
  exe, _ = resolve_execution(app, Execution.from_dict(fp8))
  assert exe.narrow_param_gather is True
  fsdp = dict(fp8, data_par_sharding='parameters')
  fsdp.pop('optimizer_sharding')
  exe, _ = resolve_execution(app, Execution.from_dict(fsdp))
  assert exe.narrow_param_gather is False


def test_nemo_2025_accumulates_weight_gradients_separately_under_fsdp():
  """NeMo 25.04's performance scripts turn gradient accumulation fusion
  off under Megatron-FSDP (scripts/performance/utils.py at v2.3.0): the
  megatron-core-2025 preset adds each weight gradient into the buffer in
  a kernel of its own there, and fuses it elsewhere (absent: 'fused')."""
  app = llama8()
  exe, _ = resolve_execution(app, Execution.from_dict(dict(
    EXE, framework='megatron-core-2025')))
  assert exe.wgrad_accumulation == 'fused'
  fsdp = dict(EXE, data_par_sharding='parameters',
              framework='megatron-core-2025')
  fsdp.pop('optimizer_sharding')
  exe, _ = resolve_execution(app, Execution.from_dict(fsdp))
  assert exe.wgrad_accumulation == 'separate'
  exe, _ = resolve_execution(app, Execution.from_dict(dict(
    fsdp, framework='megatron-core')))
  assert exe.wgrad_accumulation == 'fused'


def test_torchtitan_async_tp_efficiency_is_the_fit_of_its_own_ab_runs():
  """torchtitan's tensor_par_overlap_efficiency is what
  validation/fit_overlap_efficiency.py fits to torchtitan's A/B runs
  of PyTorch's async TP outside the published suite
  (validation/tp_overlap_pairs.csv: Llama 3 70B float8 tensorwise
  809.8 -> 942.4 and Llama 3 8B bfloat16 4,378 -> 4,809.4 tokens/s/GPU,
  benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md): measured
  speedups 1.164 and 1.099 that Calculon's tiling (efficiency 1) prices
  at 1.39.  The preset applies it to a tiled overlap only; Megatron-Core's
  (Transformer Engine's userbuffers) keeps the absent 1 below TP 8."""
  import importlib.util
  from calculon.validation.published import Suite
  spec = importlib.util.spec_from_file_location(
    'fit_tp', repo('validation', 'fit_overlap_efficiency.py'))
  fit_tp = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(fit_tp)
  eff, rows = fit_tp.fit(Suite(ROOT, [repo('validation',
                                            'tp_overlap_pairs.csv')]))
  preset = frameworks.load('torchtitan').rules[
    'tensor_par_overlap_efficiency']
  assert preset.cases[0].value == pytest.approx(eff, abs=0.01)
  measured = {name: m for name, m, _, _ in rows}
  assert measured == pytest.approx({'70b-float8-tensorwise': 942.4 / 809.8,
                                    '8b-bf16': 4809.4 / 4378})
  for _, m, full, fitted in rows:
    assert full > 1.3 and abs(np.log(fitted / m)) < 0.05
  app = llama8()
  ring = dict(EXE, framework='torchtitan', data_par_overlap=False,
              tensor_par_overlap='ring')
  exe, _ = resolve_execution(app, Execution.from_dict(ring))
  assert exe.tensor_par_overlap_efficiency == preset.cases[0].value
  exe, _ = resolve_execution(app, Execution.from_dict(
    dict(ring, tensor_par_overlap='none')))
  assert exe.tensor_par_overlap_efficiency == 1.0
  exe, _ = resolve_execution(app, Execution.from_dict(
    dict(ring, framework='megatron-core')))
  assert exe.tensor_par_overlap_efficiency == 1.0


def test_tp8_overlap_share_from_nvidias_llama3_70b_layouts():
  """validation/fit_overlap_efficiency.py --layouts fits the share of the
  tiled overlap's gain that Transformer Engine realizes at TP 8 from
  NVIDIA's Llama 3 70B layouts outside the published suite
  (validation/layout_ab_runs.csv, Megatron-Bridge 067f987df
  skills/nemo-mbridge-perf-memory-tuning/card.yaml): TP 4 PP 4 at 704
  and TP 8 PP 4 at 508.7 TFLOP/s a GPU, the same model, batch and 32
  GPUs, so TP 8 takes 704 / 508.7 = 1.384 times as long.  On the
  datasheet H100 file the whole overlap gives 1.120 and none of its gain
  1.528, so the share is about (1.528 - 1.384) / (1.528 - 1.120) = 0.35
  (the fit is on the logarithm, the model not exactly linear in it).
  TP 4 PP 8 has no TP 8 partner."""
  import importlib.util
  from calculon.validation.published import Suite
  spec = importlib.util.spec_from_file_location(
    'fit_tp', repo('validation', 'fit_overlap_efficiency.py'))
  fit_tp = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(fit_tp)
  eff, rows, unpaired = fit_tp.fit_layouts(
    Suite(ROOT, [repo('validation', 'layout_ab_runs.csv')]))
  assert unpaired == ['megatron-bridge-02']
  (_, measured, full, fitted, zero, _), = rows
  assert measured == pytest.approx(704 / 508.7, rel=1e-3)
  assert full < 1.2 < measured < zero
  assert fitted == pytest.approx(measured, rel=2e-3)
  assert eff == pytest.approx((zero - measured) / (zero - full), abs=0.05)
  assert 0.3 < eff < 0.4


@pytest.mark.parametrize('name', ['common', 'megatron-core',
                                  'megatron-core-2024', 'megatron-core-2025',
                                  'megatron-lm'])
def test_tp8_overlap_share_is_what_the_presets_price(name):
  """Transformer Engine's userbuffers overlap realizes 0.352 of the
  tiling's gain at TP 8 (the layouts' fit above): the Megatron-Core
  presets price it there, and a framework without a preset (common)
  realizes no more than the best measured framework.  Below TP 8, and
  without a tiled overlap, the absent 1 (the fit's TP 4 partner)."""
  app = llama8()
  ring = dict(EXE, num_procs=32, tensor_par=8, data_par=2, framework=name,
              tensor_par_overlap='ring', data_par_overlap=False)
  exe, _ = resolve_execution(app, Execution.from_dict(ring))
  assert exe.tensor_par_overlap_efficiency == 0.352
  exe, _ = resolve_execution(app, Execution.from_dict(
    dict(ring, num_procs=16, tensor_par=4)))
  assert exe.tensor_par_overlap_efficiency == 1.0
  exe, _ = resolve_execution(app, Execution.from_dict(
    dict(ring, tensor_par_overlap='none')))
  assert exe.tensor_par_overlap_efficiency == 1.0

