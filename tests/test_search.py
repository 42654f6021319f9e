"""The vectorized search against a brute-force loop over the single-run API.

The brute force below is Calculon's ``llm-optimal-execution`` loop written
out independently (nested loops in its order, Llm helpers, the -m break), so
it checks the grid construction, the validity masks, the -m rule, the
counts, the ranking and the tie order.
"""

import copy

import numpy as np
import pytest

from calculon import System
from calculon.config import Application
from calculon.llm import Llm
from calculon.llm import search as S
from calculon.llm.model import ENGINE_ERROR
from conftest import load_json, repo


def tiny_system():
  """One network tier, no tier-2 memory, 24 GiB of tier 1."""
  cfg = load_json(repo('systems', 'a100_80g.json'))
  cfg['networks'] = cfg['networks'][:1]
  cfg['mem2']['GiB'] = 0
  cfg['mem1']['GiB'] = 24
  return cfg


APP = load_json(repo('models', 'megatron-5B.json'))
SYS = tiny_system()
NUM_PROCS, MAX_BATCH = 4, 8
FUSED = [False, True]


#: Sample rate (or None: infeasible) of each execution priced by the
#: single-run API; the -m run prices a subset of the full run's executions.
_RATES = {}


def _single_run_rate(system, app, exe):
  key = tuple(sorted(exe.items()))
  if key not in _RATES:
    try:
      model = Llm(app)
      model.compile(system, Llm.Execution.from_json(exe))
      model.run(system)
      _RATES[key] = model.get_stats_json()['sample_rate']
    except Llm.Error:
      _RATES[key] = None
  return _RATES[key]


def brute_force(mbs_break):
  """Calculon's search loop: (rate, order, execution) of feasible ones, and
  the number of executions evaluated."""
  system = System(SYS)
  app = Llm.Application(APP)
  nets = range(system.num_networks)
  has_mem2 = system.mem2.capacity > 0
  found, evaluated, order = [], 0, 0
  for tp in Llm.get_all_tensor_parallelisms(NUM_PROCS, app.hidden,
                                            app.attn_heads):
    for pp in Llm.get_all_pipeline_parallelisms(NUM_PROCS, tp,
                                                app.num_blocks):
      dp = Llm.get_data_parallelism(NUM_PROCS, tp, pp)
      for ppint in Llm.get_valid_pipeline_interleavings(app.num_blocks, pp):
        if dp > MAX_BATCH:
          continue
        batch = MAX_BATCH // dp * dp
        for recompute in ['full', 'attn_only', 'none']:
          for sharding in ([True, False] if dp > 1 else [False]):
            for comm in ['ar', 'p2p_rs_ag', 'rs_ag']:
              redo_opts = [True, False] if Llm.can_redo_ag(comm, recompute) \
                else [False]
              for redo in redo_opts:
                for dpo in ([True, False] if dp > 1 else [False]):
                  for tpo in (['none', 'ring', 'pipe'] if tp > 1
                              else ['none']):
                    for wo in ([True, False] if has_mem2 else [False]):
                      aos = [False] if recompute == 'full' or not has_mem2 \
                        else [True, False]
                      for ao in aos:
                        for oo in ([True, False] if has_mem2 else [False]):
                          for fused in FUSED:
                            for mbs in Llm.get_valid_microbatch_sizes(
                                app.seq_size, tp, dp, batch, pp):
                              good_before = len(found)
                              for tn in (nets if tp > 1 else [0]):
                                for pn in (nets if pp > 1 else [0]):
                                  for dn in (nets if dp > 1 else [0]):
                                    exe = dict(
                                      num_procs=NUM_PROCS, tensor_par=tp,
                                      pipeline_par=pp, data_par=dp,
                                      tensor_par_net=tn, pipeline_par_net=pn,
                                      data_par_net=dn, batch_size=batch,
                                      microbatch_size=mbs, datatype='float16',
                                      fused_activation=fused,
                                      attention_type='multihead',
                                      activation_recompute=recompute,
                                      pipeline_interleaving=ppint,
                                      optimizer_sharding=sharding,
                                      tensor_par_comm_type=comm,
                                      tensor_par_overlap=tpo,
                                      seq_par_ag_redo=redo,
                                      data_par_overlap=dpo, weight_offload=wo,
                                      activations_offload=ao,
                                      optimizer_offload=oo, training=True)
                                    evaluated += 1
                                    order += 1
                                    rate = _single_run_rate(system, app, exe)
                                    if rate is None:
                                      continue
                                    found.append((rate, order, exe))
                              if mbs_break and len(found) == good_before:
                                break
  found.sort(key=lambda t: (-t[0], t[1]))
  return found, evaluated


@pytest.fixture(scope='module')
def reference_runs():
  return {mb: brute_force(mb) for mb in (False, True)}


def spec(mbs_break):
  return S.SearchSpec(Application.from_dict(APP), System(SYS), NUM_PROCS,
                      MAX_BATCH, 'float16', FUSED, mbs_break=mbs_break)


@pytest.mark.parametrize('mbs_break', [False, True])
@pytest.mark.parametrize('chunk', [64, S.DEFAULT_CHUNK])
def test_search_equals_brute_force(reference_runs, mbs_break, chunk):
  found, evaluated = reference_runs[mbs_break]
  sp = spec(mbs_break)
  top_n = 25
  result = S.optimal_executions(sp, top_n, workers=1, chunk_size=chunk)
  assert result.evaluated == evaluated
  assert result.feasible == len(found)
  assert result.evaluated - result.feasible == sum(result.reasons.values())
  got = [(rate, S.execution_record(sp, result.groups[g], flat))
         for rate, g, flat in result.best]
  want = [(rate, exe) for rate, _, exe in found[:top_n]]
  assert got == want


def test_space_is_large_enough_to_mean_something(reference_runs):
  found, evaluated = reference_runs[False]
  assert evaluated > 1000 and 100 < len(found) < evaluated
  # -m skips executions here.
  assert reference_runs[True][1] < evaluated


def test_parallel_workers_give_the_same_result():
  sp = spec(True)
  one = S.optimal_executions(sp, 10, workers=1, chunk_size=128)
  two = S.optimal_executions(sp, 10, workers=2, chunk_size=128)
  assert one.best == two.best
  assert (one.evaluated, one.feasible, one.reasons) == \
    (two.evaluated, two.feasible, two.reasons)


def test_a_candidate_that_raises_does_not_stop_the_search(monkeypatch):
  """The engine raising for some executions (here: TP 4 with microbatch
  size 2) only removes those executions, counted as 'engine error'."""
  sp = spec(False)
  clean = S.optimal_executions(sp, 50, workers=1)

  class Broken(S.Evaluation):
    def __init__(self, app, system, exe):
      super().__init__(app, system, exe)
      if np.all(exe.tensor_par == 4) and np.any(exe.microbatch_size == 2):
        raise ZeroDivisionError('injected failure')

  from calculon.search import exhaustive
  monkeypatch.setattr(exhaustive, 'Evaluation', Broken)
  result = S.optimal_executions(sp, 50, workers=1)
  n_mbs2 = 0
  for g in result.groups:
    if g.tp == 4 and 2 in g.values['microbatch_size']:
      n_mbs2 += S.valid_count(sp, g) // len(g.values['microbatch_size'])
  assert n_mbs2 > 0
  assert result.reasons[ENGINE_ERROR] == n_mbs2
  assert result.evaluated == clean.evaluated
  def broken(b):
    exe = S.execution_record(sp, result.groups[b[1]], b[2])
    return exe['tensor_par'] == 4 and exe['microbatch_size'] == 2
  kept = [b for b in clean.best if not broken(b)]
  assert len(kept) < len(clean.best)
  assert result.best[:len(kept)] == kept
  assert not any(broken(b) for b in result.best)


def test_all_executions_rows_equal_feasible_set(reference_runs):
  found, _ = reference_runs[False]
  rows = {}
  total = 0
  for cols, n, _ in S.all_executions(spec(False), workers=1, chunk_size=100):
    total += n
    for name, arr in cols.items():
      rows.setdefault(name, []).extend(list(arr))
  assert len(rows['sample_rate']) == len(found)
  # Same executions, in enumeration order.
  by_order = sorted(found, key=lambda t: t[1])
  assert [r for r, _, _ in by_order] == rows['sample_rate']
  assert [e['microbatch_size'] for _, _, e in by_order] == \
    [int(x) for x in rows['microbatch_size']]
  assert set(rows['activation_recompute']) <= {'full', 'attn_only', 'none'}


def test_batch_size_and_group_space():
  sp = spec(False)
  gs = S.groups(sp)
  assert [(g.tp, g.pp, g.dp, g.batch_size) for g in gs][:3] == [
    (1, 1, 4, 8), (1, 2, 2, 8), (1, 4, 1, 8)]
  assert S.count_space(sp) == sum(S.valid_count(sp, g) for g in gs)


# -- the modern space ------------------------------------------------------------

MODERN_APP = dict(hidden=512, feedforward=1408, seq_size=1024, attn_heads=8,
                  attn_size=64, num_blocks=4, kv_heads=2, mlp='gated',
                  norm='rmsnorm', linear_bias='none', vocab_size=3200,
                  position_embedding='rope', dropout=False)


def _modern_system():
  """Two network tiers and tier-2 memory (every modern axis varies)."""
  cfg = load_json(repo('systems', 'a100_80g.json'))
  cfg['mem1']['GiB'] = 3
  return cfg


@pytest.mark.parametrize('procs,batch,top_n,moe', [
  (8, 16, 25, False), (16, 16, 40, False), (4, 4, 30, True)])
def test_modern_pruned_search_equals_exhaustive(procs, batch, top_n, moe):
  """Branch and bound (calculon.llm.prune) never drops a member of the true
  top-n: the pruned search returns exactly the exhaustive top-n (rates,
  executions and tie order), while pricing a small part of the space."""
  cfg = dict(MODERN_APP, num_experts=4, top_k=2, moe_ffn_hidden=704,
             first_dense_blocks=1) if moe else MODERN_APP
  app = Application.from_dict(cfg)
  system = System(_modern_system())
  spec = dict(app=app, system=system, num_procs=procs, max_batch_size=batch,
              datatype='float16', space='modern')
  full = S.optimal_executions(S.SearchSpec(prune=False, **spec), top_n)
  pruned = S.optimal_executions(S.SearchSpec(prune=True, **spec), top_n)
  assert full.total == pruned.total
  assert full.evaluated == full.total > 100000
  assert len(full.best) == top_n
  assert pruned.best == full.best
  assert pruned.evaluated + pruned.pruned == pruned.total
  assert pruned.evaluated < full.total / 5
  # Every modern axis took part, and the best re-price exactly.
  g = {a for grp in full.groups for a in grp.axes if len(grp.values[a]) > 1}
  assert {'data_par_sharding', 'attention_kernel', 'context_par_net',
          'activation_recompute'} <= g
  if moe:
    assert {'expert_par', 'expert_tensor_par', 'moe_dispatcher',
            'moe_comm_overlap', 'expert_par_net'} <= g
  assert any(grp.cp > 1 for grp in full.groups)
  from calculon.llm.results import best_to_output
  out = best_to_output(S.SearchSpec(prune=True, **spec), pruned)
  assert out['0']['stats']['sample_rate'] == pruned.best[0][0]


def _records_per_value(search, name):
  """For every group of ``search`` with axis ``name`` and every value on
  it, the record of its first valid execution, each checked to read back
  as an execution."""
  from calculon.config import Execution
  for group in S.groups(search):
    if name not in group.axes:
      continue
    axis = group.axes.index(name)
    valid = np.broadcast_to(S.valid_mask(S.columns(search, S.Chunk(group, ())),
                                         search), group.shape)
    for k in range(len(group.values[name])):
      flat = np.flatnonzero(np.take(valid, [k], axis=axis))
      if not len(flat):
        continue
      idx = list(np.unravel_index(flat[0], np.take(valid, [k],
                                                     axis=axis).shape))
      idx[axis] = k
      rec = S.execution_record(search, group,
                               int(np.ravel_multi_index(idx, group.shape)))
      Execution.from_dict(rec)
      yield rec


def resolved(search, rec):
  """A search record as ``calculon llm`` resolves it (its framework's
  preset filling what it leaves out)."""
  from calculon.config import Execution
  from calculon.frameworks import resolve_execution
  return resolve_execution(search.app, Execution.from_dict(rec))[0]


def test_search_with_recompute_modules():
  """--recompute-modules: every selective candidate recomputes the named
  modules (the others leave the field out, so each record is a valid
  execution); the pruned search still equals the exhaustive one; keeping
  fewer activations (layernorm, moe_act, moe) lets a memory-bound MoE
  search reach a rate at least as high as the attention core alone."""
  cfg = dict(MODERN_APP, num_experts=4, top_k=2, moe_ffn_hidden=704,
             first_dense_blocks=1)
  spec = dict(app=Application.from_dict(cfg), system=System(_modern_system()),
              num_procs=4, max_batch_size=4, datatype='float16',
              space='modern')
  mods = ['layernorm', 'moe', 'moe_act']
  full = S.optimal_executions(S.SearchSpec(prune=False, recompute_modules=mods,
                                           **spec), 30)
  pruned = S.optimal_executions(S.SearchSpec(prune=True,
                                             recompute_modules=mods, **spec),
                                30)
  assert pruned.best == full.best
  base = S.optimal_executions(S.SearchSpec(prune=True, **spec), 30)
  assert pruned.best[0][0] >= base.best[0][0]
  search = S.SearchSpec(prune=True, recompute_modules=mods, **spec)
  seen = set()
  for rec in _records_per_value(search, 'activation_recompute'):
    seen.add(rec['activation_recompute'])
    if rec['activation_recompute'] == 'selective':
      assert rec['recompute_modules'] == mods
    else:
      assert 'recompute_modules' not in rec
  assert {'selective', 'none', 'full'} <= seen
  from calculon.errors import ConfigError
  with pytest.raises(ConfigError, match="'recompute_modules' = "
                     r'\["moe", "moe"\] is not allowed'):
    S.SearchSpec(recompute_modules=['moe', 'moe'], **spec)


def test_search_with_fsdp_buffer_copies():
  """fsdp_buffer_copies: FSDP candidates pay PyTorch FSDP2's copies (so no
  rate rises), the others are unchanged and their records leave the field
  out; every record is a valid execution; pruning stays exact."""
  spec = dict(app=Application.from_dict(MODERN_APP),
              system=System(_modern_system()), num_procs=4, max_batch_size=4,
              datatype='float16', space='modern')
  full = S.optimal_executions(S.SearchSpec(prune=False,
                                           fields={'fsdp_buffer_copies': True}, **spec),
                              40)
  pruned = S.optimal_executions(S.SearchSpec(prune=True,
                                             fields={'fsdp_buffer_copies': True},
                                             **spec), 40)
  assert pruned.best == full.best
  base = S.optimal_executions(S.SearchSpec(prune=False, **spec), 40)
  assert full.best[0][0] <= base.best[0][0]
  search = S.SearchSpec(prune=True, fields={'fsdp_buffer_copies': True}, **spec)
  seen = set()
  for rec in _records_per_value(search, 'data_par_sharding'):
    exe = resolved(search, rec)
    seen.add(exe.data_par_sharding)
    if exe.data_par_sharding == 'parameters':
      assert rec['fsdp_buffer_copies'] is True
    else:
      assert 'fsdp_buffer_copies' not in rec
      assert exe.fsdp_buffer_copies is False
  assert {'parameters', 'optimizer'} <= seen


def test_search_gathers_narrow_inputs_with_transformer_engine():
  """The modern space's Transformer Engine candidates all-gather their
  quantized GEMM inputs (TE gathers the FP8 norm output and output
  gradient): their records name the framework, whose preset sets
  tensor_par_narrow_all_gather (the records leave behaviours out); a
  16-bit search's candidates do not gather narrow; pruning stays exact."""
  cfg = load_json(repo('systems', 'h100_sxm_80g.json'))
  spec = dict(app=Application.from_dict(MODERN_APP), system=System(cfg),
              num_procs=4, max_batch_size=4, space='modern')
  narrow = dict(spec, datatype='float8')
  full = S.optimal_executions(S.SearchSpec(prune=False, **narrow), 20)
  pruned = S.optimal_executions(S.SearchSpec(prune=True, **narrow), 20)
  assert pruned.best == full.best
  seen = 0
  search = S.SearchSpec(prune=True, **narrow)
  for rec in _records_per_value(search, 'activation_recompute'):
    assert rec['framework'] == 'megatron-core'
    assert 'tensor_par_narrow_all_gather' not in rec
    exe = resolved(search, rec)
    assert exe.precision_recipe == 'transformer_engine'
    assert exe.tensor_par_narrow_all_gather is True
    seen += 1
  assert seen
  wide = S.SearchSpec(prune=True, **dict(spec, datatype='bfloat16'))
  seen = 0
  for rec in _records_per_value(wide, 'activation_recompute'):
    assert resolved(wide, rec).tensor_par_narrow_all_gather is False
    seen += 1
  assert seen


def test_search_with_unfused_cross_entropy():
  """cross_entropy_kernel 'unfused': every candidate of the modern space
  pays the float32 loss kernels, so the best rate falls and its record
  says so; pruning stays exact; an unknown kernel is a one-line error."""
  from calculon.errors import ConfigError
  spec = dict(app=Application.from_dict(MODERN_APP),
              system=System(_modern_system()), num_procs=4, max_batch_size=4,
              datatype='float16', space='modern')
  base = S.optimal_executions(S.SearchSpec(prune=True, **spec), 5)
  full = S.optimal_executions(S.SearchSpec(
    prune=False, fields={'cross_entropy_kernel': 'unfused'}, **spec), 5)
  pruned = S.optimal_executions(S.SearchSpec(
    prune=True, fields={'cross_entropy_kernel': 'unfused'}, **spec), 5)
  assert pruned.best == full.best
  assert full.best[0][0] < base.best[0][0]
  search = S.SearchSpec(prune=True,
                        fields={'cross_entropy_kernel': 'unfused'}, **spec)
  recs = list(_records_per_value(search, 'activation_recompute'))
  assert recs and all(r['cross_entropy_kernel'] == 'unfused' for r in recs)
  with pytest.raises(ConfigError, match="'cross_entropy_kernel' = \"apex\" "
                     'is not allowed: one of "fused", "unfused"'):
    S.SearchSpec(fields={'cross_entropy_kernel': 'apex'}, **spec)


def test_space_option_keeps_calculon_searches():
  """--space auto gives Calculon's space for a Calculon application and the
  modern one otherwise."""
  calc = S.SearchSpec(Application.from_dict(APP), System(SYS), 4, 8,
                      'float16')
  assert calc.space == 'calculon' and calc.axes == S.AXES
  modern = S.SearchSpec(Application.from_dict(MODERN_APP), System(SYS), 4, 8,
                        'float16')
  assert modern.space == 'modern' and modern.axes == S.MODERN_AXES


def test_modern_search_counts_the_vocabulary_where_only_that_splits_evenly():
  """Where PP divides the blocks plus two and not the blocks alone, the
  modern space prices Megatron-Core's only even split: the embedding and
  the LM head counted as a block each (pipeline_split_counts_vocab; 7
  blocks at PP 3 give 3 slots a stage); elsewhere the field is left out.
  Pruning stays exact and the records read back and re-price exactly."""
  from calculon.llm.results import best_to_output
  app = Application.from_dict(dict(MODERN_APP, num_blocks=7))
  spec = dict(app=app, system=System(_modern_system()), num_procs=6,
              max_batch_size=6, datatype='float16', space='modern')
  search = S.SearchSpec(prune=True, **spec)
  flags = {}
  for group in S.groups(search):
    cols = S.columns(search, S.Chunk(group, ()))
    flags[group.pp] = bool(np.all(cols.pipeline_split_counts_vocab))
  assert flags == {1: False, 2: False, 3: True, 6: False}
  recs = [r for r in _records_per_value(search, 'activation_recompute')
          if r['pipeline_par'] == 3]
  assert recs and all(resolved(search, r).pipeline_split_counts_vocab
                      is True for r in recs)
  full = S.optimal_executions(S.SearchSpec(prune=False, **spec), 60)
  pruned = S.optimal_executions(search, 60)
  assert pruned.best == full.best
  out = best_to_output(search, pruned)
  assert out['0']['stats']['sample_rate'] == pruned.best[0][0]


@pytest.mark.parametrize('framework,fields,want', [
  # DeepSpeed with PP runs ZeRO-1 only: Calculon's optimizer_sharding
  # alone reads as gradients sharded, which the preset refuses.
  ('megatron-deepspeed-2022', {}, {'data_par_sharding': 'optimizer'}),
  # A quantization scaling needs its precision recipe written.
  ('megatron-core', {'precision_recipe': 'transformer_engine',
                     'quantization_scaling': 'current'},
   {'quantization_scaling': 'current'}),
])
def test_execution_record_is_accepted_and_prices_as_searched(
    framework, fields, want):
  """Every execution the search enumerates is written as a record that
  ``calculon llm`` accepts and resolves to exactly the priced values,
  including where Calculon's short form would read differently."""
  from calculon.config import Execution
  from calculon.frameworks import resolve_execution
  from calculon.search import SearchSpec, grid
  app = Application.from_dict(load_json(repo("models", "gpt3-13B.json")))
  system = System(load_json(repo('systems', 'h100_sxm_80g.json')))
  datatype = 'float8' if 'quantization_scaling' in fields else 'bfloat16'
  spec = SearchSpec(app, system, 16, 64, datatype, framework=framework,
                    limits={'pp': ((2, 2),)},
                    fields={k: v for k, v in fields.items()
                            if k != 'precision_recipe'},
                    precision_recipe=fields.get('precision_recipe'))
  checked = 0
  for g in grid.groups(spec):
    for flat in range(0, int(np.prod(g.shape)), 7):
      idx = np.unravel_index(flat, g.shape)
      cols = grid.columns(spec, grid.Chunk(g, tuple(int(i) for i in idx)))
      if not bool(np.all(grid.valid_mask(cols, spec))):
        continue
      values = grid._values_at(spec, g, flat)
      if any(values.get(k) != v for k, v in want.items()):
        continue
      rec = grid.execution_record(spec, g, flat)
      exe, _ = resolve_execution(app, Execution.from_dict(rec, 't'),
                                 source='t')
      for k, v in want.items():
        assert getattr(exe, k) == v
      checked += 1
      if checked >= 5:
        return
  assert checked, 'no execution with ' + repr(want)


def test_search_choices_restrict_the_axes():
  """choices: only the listed values of an axis are searched (the
  published conventions' era rules), so the best rate cannot rise and
  every record takes a listed value; pruning stays exact; a field that is
  not an axis, an empty list or an unknown value is a one-line error."""
  from calculon.errors import ConfigError
  spec = dict(app=Application.from_dict(MODERN_APP),
              system=System(_modern_system()), num_procs=4, max_batch_size=4,
              datatype='float16', space='modern')
  choices = {'activation_recompute': ['none', 'full'],
             'attention_kernel': ['standard']}
  base = S.optimal_executions(S.SearchSpec(prune=True, **spec), 5)
  full = S.optimal_executions(S.SearchSpec(prune=False, choices=choices,
                                           **spec), 5)
  pruned = S.optimal_executions(S.SearchSpec(prune=True, choices=choices,
                                             **spec), 5)
  assert pruned.best == full.best
  assert full.best[0][0] <= base.best[0][0]
  search = S.SearchSpec(prune=True, choices=choices, **spec)
  seen = set()
  for rec in _records_per_value(search, 'activation_recompute'):
    exe = resolved(search, rec)
    seen.add(exe.activation_recompute)
    assert exe.attention_kernel == 'standard'
  assert seen == {'none', 'full'}
  for bad, match in (({'cross_entropy_kernel': ['unfused']},
                      "choice 'cross_entropy_kernel' is not allowed"),
                     ({'activation_recompute': []},
                      "choice 'activation_recompute' is not allowed"),
                     ({'attention_kernel': ['magic']},
                      "choice 'attention_kernel' = \\['magic'\\] is not")):
    with pytest.raises(ConfigError, match=match):
      S.SearchSpec(choices=bad, **spec)
