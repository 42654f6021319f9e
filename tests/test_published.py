"""``calculon llm-validation --suite published``: any CSV of measured runs,
mapped onto the model by the conventions of validation/conventions.yaml."""

import csv
import filecmp
import json
import os

import pytest

from calculon.config.execution import DATATYPE_NAMES
from calculon.errors import ConfigError
from calculon.validation import conventions as CV
from calculon.validation import mapping as M
from calculon.validation import published as P
from conftest import (ROOT, SHARED, assert_png, repo, run_cli, unknown_source_row,
                      write_csv)


@pytest.fixture(scope='module')
def suite():
  return P.Suite(ROOT)


@pytest.fixture(scope='module')
def results(suite):
  return P.results_frame(P.run_suite(suite))


def case(suite, case_id):
  return next(c for c in suite.cases if c.id == case_id)


def why(c, field):
  """The reason ``c``'s assumptions give for ``field``."""
  return {k: w for k, _, w in c.assumptions}[field]


def resolved(c, field):
  """The value every candidate of ``c`` takes for execution field
  ``field`` (the row and its rules, then its framework's preset)."""
  import numpy as np
  from calculon.frameworks.resolve import value_of
  cols = M.candidate_columns(c)
  values = np.unique(np.broadcast_to(getattr(cols, field), cols.shape))
  assert len(values) == 1, (c.id, field, values)
  return value_of(field, values[0])


def source_of(c, field):
  """The sources ``c``'s framework preset gives for what it sets
  ``field`` to."""
  rule = M.preset_of(c).rules[field]
  return ' '.join([rule.source] + [k.source for k in rule.cases])


def absent(field):
  """What leaving execution field ``field`` out means."""
  from calculon.config import registry
  return registry.field('execution', field).absent


def shared_rows(name='published_runs.csv'):
  with open(repo('validation', name), newline='') as fd:
    return list(csv.DictReader(fd))


def test_bundled_runs_are_the_shared_files():
  assert len(shared_rows()) == 48
  assert len(shared_rows('published_runs_2024_2026.csv')) == 67
  for name in P.DEFAULT_RUNS:
    theirs = os.path.join(SHARED, 'measurements', name)
    if not os.path.exists(theirs):
      pytest.skip('shared measurements absent')
    assert filecmp.cmp(repo('validation', name), theirs, shallow=False), name


def test_conventions_are_checked(tmp_path):
  good = CV.load(CV.default_path(ROOT))
  assert good.first(good.hardware, 'NVIDIA H100 SXM5 80GB')['system'] == \
    'h100_sxm_80g'
  assert 'unsupported' in good.first(good.hardware, 'TPU v5p')
  base = open(CV.default_path(ROOT)).read()
  for bad, needle in (
      ("rules:\n  - name: x\n    match: {source: 'a'}\n    set: "
       "{tensor_par_overlap: sideways}\n", 'tensor_par_overlap'),
      ("rules:\n  - name: x\n    match: {colour: 'a'}\n", 'colour'),
      ("hardware:\n  - match: '(unclosed'\n    system: b200\n",
       'regular expression'),
      ("datatypes:\n  - match: 'fp8'\n    datatype: float7\n", 'float7'),
      ("approximations:\n  - match: {notes: 'x'}\n    unless_model: window\n"
       "    text: 'y'\n", 'unless_model'),
      ("hardware:\n  - match: 'H100'\n    system: h100_sxm_80g\n"
       "    attention_kernels: {fa9: 0.5}\n", 'fa9'),
      ("hardware:\n  - match: 'H100'\n    system: h100_sxm_80g\n"
       "    attention_kernels: {fa2: 1.5}\n", r'\(0, 1\]'),
      ("rules:\n  - name: x\n    match: {source: 'a'}\n    set: "
       "{pipeline_microbatches: dp}\n", "pipeline_microbatches.*one of pp"),
      ("rules:\n  - name: x\n    match: {source: 'a'}\n    set: "
       "{gradient_datatype: float8}\n", 'gradient_datatype.*float32'),
      ("datatypes:\n  - match: 'fp8'\n    datatype: float8\n"
       "    quantization_scaling: amax\n",
       r'datatypes\[0\]\.quantization_scaling.*amax.*delayed, current, block'),
      ("rules:\n  - name: x\n    match: {source: 'a'}\n    set: "
       "{quantization_scaling: rowwise}\n", 'quantization_scaling'),
      ("recompute_modules:\n  - match: 'attn'\n    module: attention\n",
       r'recompute_modules\[0\]\.module.*attention.*core_attn')):
    path = tmp_path / 'conv.yaml'
    path.write_text(bad)
    with pytest.raises(ConfigError, match=needle):
      CV.load(str(path))
  assert base  # the bundled file itself loads (above)


def test_attention_kernel_of_the_framework_on_hopper(suite):
  """FlashAttention-2 on Hopper: 334 TFLOP/s, 34 % of the H100's peak
  (Shah et al. 2024, "FlashAttention-3", figures 5 and 6: 370 forward and
  322 backward at head width 128, weighted 1 : 2.5) against the file's 0.8
  large-GEMM
  efficiency; the file's own value is the FA3/cuDNN class (0.72).  A
  torchtitan row (PyTorch SDPA: FA2) on H100 gets that factor, a Megatron
  row (cuDNN) and an A100 row (FA2 is Ampere's best) keep the file's."""
  h100 = json.load(open(repo('systems', 'h100_sxm_80g_datasheet.json')))
  assert h100['fused_attention_efficiency'] == 0.72
  titan = case(suite, 'torchtitan-04')
  factor = titan.system_set['fused_attention_efficiency']['times']
  eff = suite.system_json(titan)['fused_attention_efficiency']
  assert eff == pytest.approx(0.72 * factor)
  assert eff == pytest.approx(3.5 / (1 / 370 + 2.5 / 322) / 989.5 / 0.8,
                             rel=0.01)
  assert 'fused_attention_efficiency' not in case(suite, 'nemo-12').system_set
  a100 = case(suite, 'torchtitan-19')
  assert 'fused_attention_efficiency' not in a100.system_set
  # ... the A100 file's own: FlashAttention-2 at the middle of its 50-73 %
  # of peak (Dao 2023) over the 0.87 GEMM efficiency.
  assert suite.system_json(a100)['fused_attention_efficiency'] == 0.71
  # A multiplying change: of an absent optional efficiency (1), of a field
  # that exists, and never of a field the file lacks.
  assert M.apply_system_set({}, {'grouped_gemm_efficiency': {'times': 0.5}}) \
    == {'grouped_gemm_efficiency': 0.5}
  assert M.apply_system_set({'mem1': {'GiB': 80}},
                            {'mem1.GiB': {'times': 0.5}}) == \
    {'mem1': {'GiB': 40.0}}
  with pytest.raises(ConfigError, match='mem2.GiB'):
    M.apply_system_set({'mem1': {'GiB': 80}}, {'mem2.GiB': {'times': 2}})


def test_quantization_scaling_from_the_dtype_column_and_rules(suite):
  """The scaling of the FP8/FP4 casts: block for the microscaling formats,
  current for Transformer Engine's current scaling ("fp8-cs") and for
  torchtitan's torchao float8 (dynamic tensorwise by default), absent
  (delayed, Transformer Engine's default) for a plain "fp8"; none for a
  16-bit row."""
  assert resolved(case(suite, 'megatron-bridge-19'), 'quantization_scaling') == 'block'
  assert resolved(case(suite, 'megatron-bridge-02'), 'quantization_scaling') == 'block'
  assert resolved(case(suite, 'torchtitan-22'), 'quantization_scaling') == \
    'current'
  assert resolved(case(suite, 'nemo-07'), 'quantization_scaling') == absent('quantization_scaling')
  assert resolved(case(suite, 'torchtitan-02'), 'quantization_scaling') == absent('quantization_scaling')
  cs = [c for c in suite.cases if 'fp8-cs' in (c.row.get('dtype') or '')]
  assert cs and all(resolved(c, 'quantization_scaling') == 'current'
                    for c in cs)


def test_framework_loss_and_fsdp_copies_from_the_rules(suite):
  """The loss's kernels and FSDP2's copies follow the framework: torchtitan
  (PyTorch cross_entropy on float32 logits; FSDP2 copies, only where FSDP
  shards the parameters: its CP-only run too, DP x CP = 8), Megatron-LM of
  2021-2022 and Megatron-DeepSpeed unfused, Megatron-Core 2024+ fused and
  no copies; a source no rule knows keeps the absent values.  torchtitan
  of 2025 (820504e, e7c0cae: after bbb1b616e) compiles the loss with the
  model: 'compiled'; December 2024's is eager ('eager': DTensor's
  loss_parallel when TP > 1)."""
  for rid in ('torchtitan-02', 'torchtitan-07', 'torchtitan-14',
              'torchtitan-17'):
    c = case(suite, rid)
    assert resolved(c, 'cross_entropy_kernel') == (
      'eager' if rid in ('torchtitan-02', 'torchtitan-07') else 'compiled')
    assert resolved(c, 'fsdp_buffer_copies') is True
  assert 'bbb1b616e' in why(case(suite, 'torchtitan-17'),
                            'cross_entropy_kernel')
  for rid in ('narayanan-01', 'korthikanti-03', 'bigscience-01'):
    assert resolved(case(suite, rid), 'cross_entropy_kernel') == 'unfused'
    assert resolved(case(suite, rid), 'fsdp_buffer_copies') == absent('fsdp_buffer_copies')
  for rid in ('megatron-bridge-09', 'nemo-07'):
    assert resolved(case(suite, rid), 'cross_entropy_kernel') == 'fused'
    assert resolved(case(suite, rid), 'fsdp_buffer_copies') == absent('fsdp_buffer_copies')
  assert resolved(case(suite, 'black-01'), 'cross_entropy_kernel') == absent('cross_entropy_kernel')


def test_torchtitan_async_tp_and_narrow_all_gathers(suite):
  """torchtitan's async TP is read from the model name ('AsyncTP') or from
  the features its notes list ('+ AsyncTP': the 405B runs of its Table 5
  and 6); either way the input-gradient reduce-scatters stay whole
  (PyTorch micro-pipeline TP fuses a reduce-scatter only with a single
  producing matmul; torchtitan's wq/wk/wv and w1/w3 sum first).  A row
  that only mentions another row's async value stays vanilla TP."""
  for rid in ('torchtitan-09', 'torchtitan-10', 'torchtitan-11',
              'torchtitan-12', 'torchtitan-13', 'torchtitan-15',
              'torchtitan-22'):
    c = case(suite, rid)
    assert c.axes['tensor_par_overlap'] == ['ring'], rid
    assert resolved(c, 'tensor_par_overlap_rs_dgrad') is False, rid
  for rid in ('torchtitan-08', 'torchtitan-14', 'torchtitan-16',
              'torchtitan-21'):
    c = case(suite, rid)
    assert c.axes['tensor_par_overlap'] == ['none'], rid
    assert resolved(c, 'tensor_par_overlap_rs_dgrad') == absent('tensor_par_overlap_rs_dgrad'), rid
  assert 'async-TP value' in case(suite, 'torchtitan-16').row['notes']
  # torchao's float8 TP styles gather float8 (float8 rows only).
  for rid in ('torchtitan-08', 'torchtitan-09', 'torchtitan-16',
              'torchtitan-22'):
    assert resolved(case(suite, rid), 'tensor_par_narrow_all_gather') is True
  for rid in ('torchtitan-14', 'torchtitan-15', 'torchtitan-21'):
    assert resolved(case(suite, rid), 'tensor_par_narrow_all_gather') == absent('tensor_par_narrow_all_gather')
  # Transformer Engine gathers the FP8 norm output and the FP8 output
  # gradient too (layernorm_linear.py, base.py grad_output_preprocess).
  for rid in ('nemo-03', 'nvidia-02', 'megatron-bridge-01'):
    assert resolved(case(suite, rid), 'tensor_par_narrow_all_gather') is True
  for rid in ('megatron-moe-modelzoo-04', 'megatron-bridge-14'):
    assert resolved(case(suite, rid), 'tensor_par_narrow_all_gather') == absent('tensor_par_narrow_all_gather')
  # NeMo 2 / Megatron-Bridge FP8 recipes gather FP8 parameters
  # (fp8_param_gather); NVFP4, NeMo 24.07 and Muon rows do not.
  for rid in ('nvidia-02', 'megatron-bridge-01', 'megatron-bridge-19'):
    assert resolved(case(suite, rid), 'narrow_param_gather') is True
  for rid in ('megatron-bridge-02', 'nemo-03'):
    assert resolved(case(suite, rid), 'narrow_param_gather') == absent('narrow_param_gather')
  assert resolved(case(suite, 'megatron-bridge-17'), 'narrow_param_gather') \
    is False


def test_nemo_containers_before_the_expert_overlap(suite):
  """Megatron-Core's overlap of the expert all-to-alls with another
  microbatch's compute arrived in 2025-08/09 (Megatron-Bridge PR #497):
  MoE rows from NeMo 25.02/25.04 containers send them exposed, while a
  26.06 row whose recipe states 'EP A2A overlap' hides them."""
  for rid in ('nvidia-03', 'nvidia-08'):
    assert case(suite, rid).axes['moe_comm_overlap'] == ['none'], rid
  assert case(suite, 'megatron-bridge-19').axes['moe_comm_overlap'] == \
    ['compute']


def test_megatron_bridge_recipes_fix_the_expert_dispatch(suite):
  """Megatron-Bridge's performance configurations at a release fix the
  dispatcher and the expert all-to-all overlap of MoE rows whose notes do
  not quote their recipe (validation/conventions.yaml cites the files):
  DeepSeek-V3 on H100 at 25.09 runs DeepEP with the 1F1B overlap; at 25.11
  on B200 the plain all-to-all with the shared-expert overlap; Qwen3-30B
  at 26.06 HybridEP, overlapped on GB300 and exposed on H100; GPT-OSS on
  B200 at 26.04.01 the plain all-to-all, exposed. A row whose table the
  scripts do not reproduce (25.11 DeepSeek-V3 on GB200) keeps the search."""
  expect = {'megatron-bridge-16': ('deepep', 'compute'),
            'megatron-bridge-15': ('alltoall', 'shared_experts'),
            'megatron-bridge-12': ('deepep', 'none'),
            'megatron-bridge-17': ('deepep', 'none'),
            'megatron-bridge-22': ('deepep', 'compute'),
            'megatron-bridge-25': ('deepep', 'none'),
            'megatron-bridge-21': ('alltoall', 'none')}
  for rid, (dispatcher, overlap) in expect.items():
    c = case(suite, rid)
    assert c.fixed['moe_dispatcher'] == dispatcher, rid
    assert c.axes['moe_comm_overlap'] == [overlap], rid
  searched = case(suite, 'megatron-bridge-14')
  assert searched.fixed['moe_dispatcher'] == 'alltoall'
  assert len(searched.axes['moe_comm_overlap']) == 3


def test_model_zoo_overlaps_the_expert_all_to_all_only_where_stated(suite):
  """The Megatron MoE model zoo's sbatch_benchmarking.sh leaves the expert
  all-to-all overlap off unless A2A_OVERLAP=1: its runs send the dispatch
  exposed (the long-context H100 runs, whose command sets A2A_OVERLAP=0,
  among them), but for the two whose notes name the overlap ('+1f1b
  overlap' on H100, 'A2A overlap' on GB300)."""
  for n in range(1, 10):
    rid = f'megatron-moe-modelzoo-0{n}'
    want = ['compute'] if n in (1, 9) else ['none']
    assert case(suite, rid).axes['moe_comm_overlap'] == want, rid
  assert 'A2A_OVERLAP defaults to 0' in why(
    case(suite, 'megatron-moe-modelzoo-05'), 'moe_comm_overlap')


def test_uneven_virtual_stages_priced_by_the_largest(suite):
  """DeepSeek-V3's 61 blocks over PP 2 x VP 8 (Megatron-Bridge's layout
  'Et*4|(t*4|)*14tmL'): the stated VP is kept and every stage is priced
  with VP chunks of the largest size, 8 x 4 = 32 blocks (64 in all, as the
  layout's first stage holds: the embedding and 8 chunks of 4); the
  measured figure's conversion keeps the model's 61."""
  c = case(suite, 'megatron-bridge-10')
  assert c.axes['pipeline_interleaving'] == [8]
  assert c.priced_blocks == 64
  assert c.priced_app['num_blocks'] == 64 and c.app['num_blocks'] == 61
  assert any('32 blocks, 4 per virtual stage' in a for a in c.approximations)
  assert not any('blocks over PP' in a for a in c.approximations)
  # VP dividing the stage's blocks: nothing padded.
  assert case(suite, 'megatron-bridge-11').priced_blocks is None


def test_torchtitan_interleaved_schedule_has_two_stages_per_rank(suite,
                                                                results):
  """torchtitan builds two stages per pipeline rank for a multi-stage
  schedule with no split points (generate_split_points at 9dec370): the
  405B run on 512 H100s at PP 8 with interleaved 1F1B (128 tokens/s/GPU)
  is priced at VP 2, not at the fastest VP searched; its 1F1B twin (100
  tokens/s/GPU) at VP 1.  The bubble shrinks from 7/8 to 7/16 of the
  compute: the interleaved run is predicted 1.2-1.4x faster than the 1F1B
  one (measured 1.28x)."""
  inter, plain = case(suite, 'torchtitan-11'), case(suite, 'torchtitan-10')
  assert inter.axes['pipeline_interleaving'] == [2]
  assert plain.axes['pipeline_interleaving'] == [1]
  assert 'generate_split_points' in why(inter, 'pipeline_interleaving')
  t = results.set_index('id')['predicted_s']
  assert 1.2 < t['torchtitan-10'] / t['torchtitan-11'] < 1.4


def test_async_tp_row_without_tensor_parallelism_is_priced(tmp_path):
  """The untiled reduce-scatter qualifies a tiled overlap only: an
  async-TP row run without TP (no TP collective to overlap) is priced
  with plain settings, not refused."""
  r = {k: '' for k in M.FACT_COLUMNS}
  r.update(source='pytorch/torchtitan', model_name='Llama 3 8B (AsyncTP)',
           num_layers='32', seq_len='8192', num_gpus='8',
           gpu_type='H100 80GB', tp='1', pp='1', global_batch_size='16',
           measured_metric_name='tokens_per_sec_per_gpu',
           measured_value='6000', notes='torch.compile + AsyncTP')
  s = P.Suite(ROOT, [write_csv(tmp_path / 'v.csv', [r])])
  res = P.results_frame(P.run_suite(s))
  assert list(res['status']) == ['ok']


def test_megatron_core_rows_count_the_vocabulary_in_an_uneven_split(suite):
  """Megatron-Core splits blocks evenly or stops (get_num_layers_to_build),
  so a Megatron-Core row whose PP x VP divides the blocks plus two but not
  the blocks alone counted the embedding and the loss as blocks: Llama 3.1
  405B (126 blocks) at PP 16 x VP 4 and PP 8 x VP 8, the model zoo's
  Qwen3-235B (94) at PP 32 x VP 3 (its config sets
  --account-for-embedding-in-pipeline-split and
  --account-for-loss-in-pipeline-split).  Llama 3 70B (80 blocks at PP 4),
  DeepSeek-V3 (61: a stated layout instead) and torchtitan's 405B (another
  framework) are split as before."""
  for rid in ('megatron-bridge-01', 'megatron-bridge-08',
              'megatron-moe-modelzoo-03'):
    c = case(suite, rid)
    assert resolved(c, 'pipeline_split_counts_vocab') is True
    assert 'framework=megatron' in c.assumptions_text()
    assert not any('blocks over PP' in a for a in c.approximations)
  for rid in ('megatron-bridge-03', 'megatron-bridge-13', 'torchtitan-15',
              'narayanan-05'):
    assert resolved(case(suite, rid), 'pipeline_split_counts_vocab') == absent('pipeline_split_counts_vocab')


def test_notes_stating_the_vocabulary_split_set_it_for_any_source(tmp_path):
  """A row of any source whose notes name Megatron-Core's
  account_for_embedding/loss_in_pipeline_split flags is priced with the
  split that counts them (L + 2 = 34 slots over PP 2: 17 a stage); the
  same row without the phrase, from a source no rule knows, keeps the
  plain split."""
  def row(notes):
    r = {k: '' for k in M.FACT_COLUMNS}
    r.update(source='Acme Labs 2027', model_name='Llama 3 8B',
             num_layers='32', seq_len='8192', num_gpus='16',
             gpu_type='H100 80GB', tp='4',
             pp='2', global_batch_size='32',
             measured_metric_name='tokens_per_sec_per_gpu',
             measured_value='1000', notes=notes)
    return r
  rows = [row('account_for_embedding_in_pipeline_split=True, '
              'account_for_loss_in_pipeline_split=True'), row('')]
  s = P.Suite(ROOT, [write_csv(tmp_path / 'v.csv', rows)])
  split, plain = s.cases
  assert resolved(split, 'pipeline_split_counts_vocab') is True
  assert split.axes['pipeline_interleaving'] == [1, 17]
  assert resolved(plain, 'pipeline_split_counts_vocab') == absent('pipeline_split_counts_vocab')
  assert plain.axes['pipeline_interleaving'] == [1, 2, 4, 8, 16]


def test_gpt_oss_rows_get_the_banded_window(suite):
  """gpt-oss-120b alternates dense and 128-token banded attention over
  its 36 blocks (OpenAI 2025 model card, section 2.1): the family entry
  sets 18 windowed blocks; other families none."""
  app = case(suite, 'megatron-bridge-19').app
  assert (app['sliding_window'], app['sliding_window_blocks'],
          app['num_blocks']) == (128, 18, 36)
  assert 'sliding_window' not in case(suite, 'megatron-bridge-07').app
  # The model prices the windows, so the notes' 'sliding-window' no longer
  # marks the row approximate (the approximation's unless_model).
  assert not any('sliding-window' in a for a in
                 case(suite, 'megatron-bridge-19').approximations)


def test_recompute_modules_from_the_recompute_column(suite):
  """A selective row naming Megatron-Core modules recomputes those
  (recompute_modules table): the model zoo's Qwen3-235B at 32k tokens with
  --recompute-modules layernorm moe keeps no MoE activation and fits its
  80 GB H100s (priced over memory while selective meant the attention core
  alone); a row naming none keeps Korthikanti et al.'s attention core."""
  c = case(suite, 'megatron-moe-modelzoo-05')
  assert c.fixed['recompute_modules'] == 'layernorm,moe'
  res = P.price(c, suite.system(c))
  assert res.execution['recompute_modules'] == ['layernorm', 'moe']
  assert not res.over_memory
  assert case(suite, 'megatron-bridge-13').fixed['recompute_modules'] == \
    'mla_up_proj,mlp'
  assert case(suite, 'megatron-moe-modelzoo-01').fixed[
    'recompute_modules'] == 'layernorm,moe_act'
  # torchtitan's per-op selective checkpointing; its layer-level option
  # priced the same way and flagged.
  assert case(suite, 'torchtitan-20').fixed['recompute_modules'] == \
    'alternate_linears'
  layer = case(suite, 'torchtitan-19')
  assert layer.fixed['recompute_modules'] == 'alternate_linears'
  assert any('layer-level selective' in a for a in layer.approximations)
  assert case(suite, 'torchtitan-01').fixed['recompute_modules'] == \
    'alternate_linears'


def test_rows_are_mapped_by_conventions(suite):
  # NeMo 24.07 LLAMA2-70B: GQA from the column, SwiGLU/RMSNorm/vocabulary
  # from the bundled model its name points to, FP8 with Transformer
  # Engine's recipe, Megatron-Core settings from the framework rule.
  c = case(suite, 'nemo-07')
  assert c.app['kv_heads'] == 8 and c.app['mlp'] == 'gated'
  assert c.app['vocab_size'] == 32000 and c.system_name == 'h100_sxm_80g'
  assert c.fixed['datatype'] == 'float8'
  assert c.fixed['precision_recipe'] == 'transformer_engine'
  assert c.axes['tensor_par_comm_type'] == ['rs_ag']
  assert c.axes['pipeline_interleaving'] == [20]
  assert 'vocab_size=32000' in c.assumptions_text()
  # Mixtral 8x22B with CP 8: MoE settings read from the notes.
  c = case(suite, 'nvidia-03')
  assert (c.app['num_experts'], c.app['top_k'], c.app['moe_ffn_hidden']) == \
    (8, 2, 16384)
  assert c.fixed['expert_par'] == 8 and c.fixed['context_par'] == 8
  # DeepSeek-V3: MLA and shared experts from the notes and the model file.
  c = case(suite, 'megatron-bridge-11')
  assert c.app['kv_lora_rank'] == 512 and c.app['first_dense_blocks'] == 3
  assert c.app['shared_experts'] == 1 and c.fixed['expert_par'] == 64
  # Megatron-LM of 2021 (Narayanan et al.): the gradient all-reduce after
  # the backward pass (--DDP-impl local), not a searched overlap, and in
  # float32 with bf16 (accumulate_allreduce_grads_in_fp32).
  c = case(suite, 'narayanan-07')
  assert c.axes['data_par_overlap'] == [False]
  assert 'DDP-impl local' in why(c, 'data_par_overlap')
  assert resolved(c, 'gradient_datatype') == 'float32'
  assert 'accumulate_allreduce_grads_in_fp32' in source_of(c, 'gradient_datatype')
  # Korthikanti et al. 2022: a blank VP is 1 (rule keyed by the source).
  c = case(suite, 'korthikanti-07')
  assert c.axes['pipeline_interleaving'] == [1]
  assert 'Korthikanti' in why(c, 'pipeline_interleaving')
  # torchtitan Llama 3 70B with blank dimensions: the bundled model fills
  # them, each named; FSDP is torchtitan's data parallelism.
  c = case(suite, 'torchtitan-14')
  assert (c.app['num_blocks'], c.app['hidden']) == (80, 8192)
  assert 'num_blocks=80' in c.assumptions_text()
  assert c.axes['data_par_sharding'] == ['parameters']
  assert c.cluster == 'h100_96g_power_capped'
  # Their HBM2e (2.41 TB/s, Ujeniya et al. 2026) and a tensor-core peak
  # midway between the SXM and NVL parts (TorchTitan, arXiv 2410.06511).
  assert c.system_set['mem1.GBps'] == 2410
  assert c.system_set['matrix.bfloat16.tflops'] == {'times': 0.922}
  system = suite.system(c)
  assert system.mem1.bandwidth_bytes_per_s == pytest.approx(2410e9)
  assert system.matrix.peak_flops(DATATYPE_NAMES.index('bfloat16')) == \
    pytest.approx(989.5e12 * 0.922)
  assert 'system.matrix.float8.tflops=x 0.922' in c.assumptions_text()
  # torchtitan's FSDP2 reduces gradients in float32 (its default); a
  # plain 1F1B schedule in the notes means one stage per rank, the
  # interleaved one torchtitan's default of two.
  assert resolved(c, 'gradient_datatype') == 'float32'
  assert case(suite, 'torchtitan-10').axes['pipeline_interleaving'] == [1]
  # ... and, with PP and no stated microbatch, one microbatch per stage
  # (torchtitan build_pipeline_schedule): local batch 32 / PP 8 = 4.
  c10 = case(suite, 'torchtitan-10')
  assert c10.axes['microbatch_size'] == [4]
  assert 'local batch 32 / PP 8' in why(c10, 'microbatch_size')
  assert len(case(suite, 'narayanan-07').axes['microbatch_size']) > 1
  assert case(suite, 'torchtitan-13').axes['pipeline_interleaving'] == [1]
  assert case(suite, 'torchtitan-11').axes['pipeline_interleaving'] == [2]
  rule = next(r for r in suite.mapper.conv.rules
              if r.name == 'plain 1F1B schedule')
  assert rule.applies({'notes': 'Table 5: schedule=1F1B, torch.compile'})
  assert rule.applies({'notes': 'torch.compile + Float8 + 1F1B, local'})
  assert not rule.applies({'notes': 'schedule=Interleaved 1F1B, full AC'})
  assert not rule.applies({'notes': 'DeepEP + 1F1B A2A overlap'})
  # DeepSpeed's pipeline engine reduces gradients after the last backward
  # pass (TrainSchedule: ReduceGrads at the last step), BLOOM's BF16
  # optimizer in float32; GPT-NeoX 2022 runs through the same engine,
  # with synchronous TP and before FlashAttention.
  c = case(suite, 'bigscience-01')
  assert c.axes['data_par_overlap'] == [False]
  assert resolved(c, 'gradient_datatype') == 'float32'
  c = case(suite, 'black-01')
  assert c.axes['pipeline_interleaving'] == [1]
  assert c.axes['data_par_overlap'] == [False]
  assert c.axes['tensor_par_overlap'] == ['none']
  assert c.axes['attention_kernel'] == ['standard']
  rule = next(r for r in suite.mapper.conv.rules if r.name == 'GPT-NeoX 2022')
  assert rule.applies({'source': 'EleutherAI/gpt-neox configs/13B.yml'})
  assert not rule.applies({'source': 'pytorch/torchtitan'})
  # Jean Zay's Omni-Path network is in the hardware table.
  c = case(suite, 'bigscience-01')
  assert c.system_set['networks[1].bandwidth'] == 6.25
  # A100 80 GB rows run on the datasheet file (measured GEMM efficiency
  # 0.87), not on Calculon's a100_80g (0.95).
  assert c.system_name == 'a100_sxm_80g'
  assert case(suite, 'narayanan-05').system_name == 'a100_sxm_80g'


def test_group_limited_routing_from_the_family_or_the_notes(tmp_path):
  """A DeepSeek-V3 row inherits the bundled model's node-limited routing
  (8 groups, 4 per token); notes may state it for any model; a row whose
  experts the family's groups do not fit drops them, and says so."""
  def row(model, notes, **cols):
    r = {k: '' for k in M.FACT_COLUMNS}
    r.update(source='Acme Labs 2027', model_name=model, num_layers='8',
             hidden='7168', attn_heads='128', seq_len='4096', num_gpus='64',
             gpu_type='H100 80GB', tp='1', pp='1', global_batch_size='64',
             measured_metric_name='tokens_per_sec_per_gpu',
             measured_value='1000', notes=notes, **cols)
    return r
  rows = [row('DeepSeek-V3', 'moe: ep=64'),
          row('Acme-MoE', 'moe: num_experts=64; top_k=6; ep=8; '
              'moe_ffn_hidden=1024; router_groups=8; router_group_topk=3'),
          row('DeepSeek-V3', 'moe: num_experts=60; top_k=6; ep=4')]
  s = P.Suite(ROOT, [write_csv(tmp_path / 'g.csv', rows)])
  got = [(c.app.get('moe_router_num_groups'),
          c.app.get('moe_router_group_topk')) for c in s.cases]
  assert got == [(8, 4), (8, 3), (None, None)]
  assert any('group-limited routing' in a for a in s.cases[2].approximations)
  assert all(c.expressible for c in s.cases)


def test_unknown_source_gets_stated_defaults(tmp_path):
  row = unknown_source_row(seq_len='4096', gpu_type='H100 80GB',
                           measured_metric_name='tflops_per_gpu',
                           measured_value='300')
  s = P.Suite(ROOT, [write_csv(tmp_path / 'acme.csv', [row])])
  c = s.cases[0]
  assert c.expressible and c.id == 'acme-01'
  said = dict((k, v) for k, v, _ in c.assumptions)
  assert c.app['feedforward'] == 4 * 2048 and said['feedforward'] == 8192
  assert said['datatype'] == 'bfloat16' and said['dp'] == 8
  assert c.flops_approximate          # no vocabulary, convention unknown
  assert len(c.axes['activation_recompute']) == 3    # searched
  res = P.price(c, s.system(c))
  assert res.status == 'ok' and res.slowest_s >= res.predicted_s


def test_measured_conversions():
  app = {'hidden': 2048, 'feedforward': 8192, 'seq_size': 2048,
         'attn_heads': 16, 'attn_size': 128, 'num_blocks': 24,
         'vocab_size': 51200}
  b, s, l, h, v = 64, 2048, 24, 2048, 51200
  # Narayanan et al. 2021 eq. 3 (with the recomputed forward pass) for a
  # GPT block: 96 B s l h^2 (1 + s / 6h + V / 16 l h).
  eq3 = 96 * b * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))
  assert M.convention_flops(app, b, 'megatron_eq3') == pytest.approx(
    eq3, rel=1e-12)
  model = 72 * b * s * l * h * h * (1 + s / (6 * h) + v / (12 * l * h))
  assert M.convention_flops(app, b, 'model_full') == pytest.approx(
    model, rel=1e-12)
  row = {'measured_metric_name': 'tokens_per_sec_per_gpu',
         'measured_value': '1000', 'num_gpus': '8',
         'global_batch_size': '64'}
  c = M.Case(row=row, app=app)
  assert M.measured_time_s(c) == pytest.approx(64 * 2048 / 8000)
  row.update(measured_metric_name='tflops_per_gpu', measured_value='100')
  c.flops_convention = 'megatron_eq3'
  assert M.measured_time_s(c) == pytest.approx(eq3 / (100e12 * 8))
  # MFU counts model FLOP even when the source's TFLOP/s count eq. 3.
  row.update(measured_metric_name='mfu_pct', measured_value='50')
  assert M.measured_time_s(c, 312e12) == pytest.approx(
    model / (0.5 * 312e12 * 8))



def test_measured_metric_aliases():
  """Names as logs and papers write them read as the five metrics, their
  values converted; an unknown name is not priced, with the known ones."""
  row = {'measured_value': '', 'num_gpus': '8', 'seq_len': '4096',
         'global_batch_size': '64'}
  for name, value, metric, converted in (
      ('Step time (ms)', '2500', 'iteration_time_s', 2.5),
      ('Elapsed time per iteration (ms)', '2500', 'iteration_time_s', 2.5),
      ('step_time_s', '2.5', 'iteration_time_s', 2.5),
      ('tokens/sec', '80000', 'tokens_per_sec_per_gpu', 10000),
      ('Tokens/s/GPU', '10000', 'tokens_per_sec_per_gpu', 10000),
      ('TGS', '10000', 'tokens_per_sec_per_gpu', 10000),
      ('samples/sec', '20', 'tokens_per_sec_per_gpu', 20 * 4096 / 8),
      ('TFLOP/s/GPU', '400', 'tflops_per_gpu', 400),
      ('MFU', '0.42', 'mfu_pct', 42), ('MFU', '42', 'mfu_pct', 42),
      ('mfu_pct', '42', 'mfu_pct', 42),
      # A throughput whose name says it is the whole job's (issue 34).
      ('global_tokens_per_sec', '80000', 'tokens_per_sec_per_gpu', 10000),
      ('tokens_per_sec_total', '80000', 'tokens_per_sec_per_gpu', 10000),
      ('Tokens/s (per job)', '80000', 'tokens_per_sec_per_gpu', 10000),
      ('TFLOP/s total', '3200', 'tflops_per_gpu', 400),
      ('global_samples_per_sec', '20', 'tokens_per_sec_per_gpu',
       20 * 4096 / 8)):
    c = M.Case(row=dict(row, measured_metric_name=name,
                        measured_value=value))
    assert (c.metric, c.measured_value) == (metric, pytest.approx(
      converted)), name
  # Marked as the job's but per GPU or a time: not a rate of the job.
  for name in ('bogus', 'tokens_per_sec_per_gpu_total', 'TGS total',
               'iteration_time_total', 'MFU total'):
    c = M.Case(row=dict(row, measured_metric_name=name, measured_value='1'))
    assert c.metric == name and c.measured_value is None, name


def test_bad_cells_of_a_runs_file_are_not_priced_with_the_reason(tmp_path):
  base = {k: '' for k in M.FACT_COLUMNS}
  base.update(source='Acme Labs 2027', model_name='Acme-7', num_layers='16',
              hidden='2048', attn_heads='16', seq_len='4096', num_gpus='16',
              gpu_type='H100 80GB', tp='2', pp='1', global_batch_size='64',
              measured_metric_name='Step time (ms)', measured_value='900')
  rows = [base, dict(base, measured_value='-3'),
          dict(base, measured_value='n/a'), dict(base, num_layers='0'),
          dict(base, tp='two'), dict(base, pp='1.5'),
          dict(base, recompute='sometimes', seq_parallel='maybe',
               dtype='fp7'),
          dict(base, global_batch_size='1000', micro_batch_size='3'),
          dict(base, dp='inf'), dict(base, num_gpus=''),
          dict(base, measured_metric_name='tokens/sec', measured_value='9',
               num_gpus='')]
  s = P.Suite(ROOT, [write_csv(tmp_path / 'acme.csv', rows)])
  res = {r.case.id: r for r in P.run_suite(s)}
  P.results_frame(list(res.values()))      # the report's table too
  ok = res['acme-01']
  assert ok.status == 'ok' and ok.case.measured_s == pytest.approx(0.9)
  assert why(ok.case, 'measured_metric_name') == \
    "'Step time (ms)' read as iteration_time_s (the value x 0.001)"
  for rid, needle in (
      ('acme-02', "measured value '-3' is not a positive number"),
      ('acme-03', "measured value 'n/a' is not a number"),
      ('acme-04', "column 'num_layers' = '0' is not allowed"),
      ('acme-05', "column 'tp' = 'two' is not allowed"),
      ('acme-06', "column 'pp' = '1.5' is not allowed"),
      # The grid index of the execution is not part of the reason.
      ('acme-08', "field 'microbatch_size' = 3 is not allowed: must divide "
       'the local batch size'),
      ('acme-09', "column 'dp' = 'inf' is not allowed"),
      ('acme-10', 'GPU count (num_gpus) not stated'),
      ('acme-11', 'GPU count (num_gpus) not stated')):
    assert res[rid].status == 'not priced' and \
      res[rid].reason.startswith(needle), (rid, res[rid].reason)
  odd = res['acme-07'].case
  assert res['acme-07'].status == 'ok'
  assert why(odd, 'activation_recompute') == \
    "recompute column 'sometimes' not understood (recompute table): searched"
  assert why(odd, 'datatype') == \
    "dtype column 'fp7' not understood (datatypes table): the default"
  assert any("seq_parallel column 'maybe' not understood" in a
             for a in odd.approximations)

# The suite's accuracy with the bundled (uncalibrated) systems.  A model or
# conventions change that moves these moves accuracy: update
# docs/accuracy.md with them.
SUMMARY = {'rows': 115, 'predicted': 112, 'infeasible': 0, 'not_priced': 3}


def test_published_summary(results):
  s = P.summary(results)
  for key, value in SUMMARY.items():
    assert s[key] == value, key
  no = results[results['status'] == 'not priced']
  assert sorted(no['id']) == ['chowdhery-01', 'rae-01', 'zhang-01']
  assert (no['reason'] != '').all()
  ok = results[results['status'] == 'ok']
  assert (ok['slowest_s'] >= ok['predicted_s'] * (1 - 1e-12)).all()
  assert s['median_abs_delta_pct'] == pytest.approx(DOC_MEDIAN, abs=0.1)


#: docs/accuracy.md, "Before calibration": median |delta| over the priced
#: rows.
DOC_MEDIAN = 9.2


def test_cli_unseen_sources_are_priced(tmp_path):
  """A CSV in the shared columns from sources the conventions never heard
  of: at least 85 % of its rows are priced and nothing that ran is called
  infeasible."""
  rows = shared_rows('published_runs_2024_2026.csv')
  picks = [rows[i] for i in (0, 3, 5, 12, 14, 29, 36, 54, 58, 49)]
  for i, row in enumerate(picks):
    row['source'] = f'Unseen Lab {i % 3} benchmark table'
    row['notes'] = row['notes'] if i % 2 else ''
  path = write_csv(tmp_path / 'unseen.csv', picks)
  out = tmp_path / 'out'
  res = run_cli('llm-validation', '--suite', 'published', '--runs', path,
                '--out', out)
  assert res.returncode == 0, res.stderr
  with open(out / 'published_summary.json') as fd:
    summary = json.load(fd)
  assert summary['predicted'] >= 0.85 * summary['rows']
  assert summary['infeasible'] == 0
  assert 'Unseen' in res.stdout


def test_cli_published_report_and_plots(tmp_path):
  plots, out = tmp_path / 'plots', tmp_path / 'out'
  res = run_cli('llm-validation', '--suite', 'published', '--plot', plots,
                '--out', out, '-v')
  assert res.returncode == 0, res.stderr
  for needle in ('Conversions of the measured figures', 'megatron_eq3',
                 'Summary: 112 of 115 rows predicted', 'within 10%',
                 'Not priced (reason)', 'TPU', 'By source:', 'slowest',
                 'assumptions:'):
    assert needle in res.stdout, needle
  assert_png(plots / 'published_scatter.png')
  assert_png(plots / 'published_residuals.png')
  with open(out / 'published_runs_results.csv') as fd:
    assert len(list(csv.DictReader(fd))) == 115


def test_cli_bad_runs_file(tmp_path):
  path = tmp_path / 'bad.csv'
  path.write_text('model_name,hidden\nx,1\n')
  res = run_cli('llm-validation', '--suite', 'published', '--runs', path)
  assert res.returncode == 2
  assert 'missing column' in res.stderr and 'source' in res.stderr


def test_hardware_variants_of_bundled_gpus(tmp_path):
  """Export and PCIe variants map onto the bundled die's file with their
  datasheet differences, each a calibration unit of its own: H800 is the
  H100 with NVLink at 200 GB/s a direction (DeepSeek-V3 section 3.2.2
  measures 160 GB/s, the file's 0.8 of it), A800 the A100 likewise;
  H100 PCIe runs at 0.7645 of the SXM's rates with NVLink pairs; GH200
  is an H100 with its own memory (not the H200, which its name
  contains).  The same Llama 2 70B run at TP 8 is slower on H800 than on
  H100 (its tensor-parallel collectives ride the cut NVLink) but by less
  than the 2.25x link ratio."""
  def row(gpu):
    r = {k: '' for k in M.FACT_COLUMNS}
    r.update(source='Acme Labs 2027', model_name='Llama 2 70B',
             num_layers='80', hidden='8192', ffn_hidden='28672',
             attn_heads='64', kv_heads='8', seq_len='4096', vocab='32000',
             num_gpus='64', gpu_type=gpu, tp='8', pp='1',
             global_batch_size='64', micro_batch_size='1', dtype='bf16',
             measured_metric_name='tokens_per_sec_per_gpu',
             measured_value='400')
    return r
  gpus = ['H100 SXM 80GB', 'H800 SXM 80GB', 'A800 80GB', 'H100 PCIe 80GB',
          'GH200 96GB', 'GH200 144GB HBM3e']
  s = P.Suite(ROOT, [write_csv(tmp_path / 'v.csv', [row(g) for g in gpus])])
  h100, h800, a800, pcie, gh, gh144 = s.cases
  assert (h100.system_name, h100.cluster) == ('h100_sxm_80g', None)
  assert h800.system_name == 'h100_sxm_80g'
  assert h800.system_set == {'networks[0].bandwidth': 200}
  assert h800.cluster == 'h800_sxm_80g' and '2412.19437' in why(
    h800, 'system.networks[0].bandwidth')
  assert a800.system_name == 'a100_sxm_80g' and a800.cluster == 'a800_sxm_80g'
  assert a800.system_set == {'networks[0].bandwidth': 200}
  assert pcie.cluster == 'h100_pcie'
  assert pcie.system_set['networks[0].size'] == 2
  assert pcie.system_set['matrix.bfloat16.tflops'] == {'times': 0.7645}
  assert any('NVLink-bridged pair' in a for a in pcie.approximations)
  for c, gib in ((gh, 96), (gh144, 144)):
    assert c.system_name == 'h100_sxm_80g' and c.cluster == 'gh200'
    assert c.system_set['mem1.GiB'] == gib
    assert any('GH200 systems priced' in a for a in c.approximations)
  t = {c.id: P.price(c, s.system(c)).predicted_s for c in (h100, h800)}
  assert 1.0 < t[h800.id] / t[h100.id] < 2.25


def _plain_row(**kw):
  r = {k: '' for k in M.FACT_COLUMNS}
  r.update(source='Acme Labs', model_name='GPT 20B', num_layers='44',
           hidden='6144', attn_heads='48', seq_len='2048', vocab='50432',
           num_gpus='64', gpu_type='A100 80GB', tp='4', pp='4',
           global_batch_size='512', measured_metric_name='iteration_time_s',
           measured_value='10')
  r.update(kw)
  return r


def test_runs_reported_before_may_2022_use_no_later_technique(tmp_path):
  """A run whose source cites an arXiv identifier up to 2204 or "et al.
  2021" cannot have used FlashAttention (arXiv 2205.14135), sequence
  parallelism or selective recomputation (arXiv 2205.05198), or tiled TP
  overlap; any such source is searched without them.  A 2024 report (the
  Llama 3 paper, arXiv 2407.21783) and an undated one still search them."""
  rows = [_plain_row(source='Smith et al. 2022 (arXiv 2201.11990)'),
          _plain_row(source='Doe et al. 2021, a training report'),
          _plain_row(source='Grattafiori et al. 2024 (arXiv 2407.21783)'),
          _plain_row(source='Acme Labs 2027')]
  s = P.Suite(ROOT, [write_csv(tmp_path / 'v.csv', rows)])
  old, old2, new, undated = s.cases
  for c in (old, old2):
    assert c.axes['attention_kernel'] == ['standard']
    assert c.axes['activation_recompute'] == ['none', 'full']
    assert c.axes['tensor_par_comm_type'] == ['ar', 'p2p_rs_ag']
    assert c.axes['tensor_par_overlap'] == ['none']
    assert '2205.14135' in why(c, 'attention_kernel')
  for c in (new, undated):
    assert 'flash' in c.axes['attention_kernel']
    assert 'selective' in c.axes['activation_recompute']
    assert 'rs_ag' in c.axes['tensor_par_comm_type']


def test_framework_facts_in_the_notes_of_any_source(tmp_path):
  """Notes naming DeepSeek-V3's DualPipe price the expert all-to-all
  hidden behind the other chunk's compute with node-deduplicated
  dispatch (DeepSeek-V3 sections 3.2.1-3.2.2); notes naming DeepSpeed's
  pipeline engine price no interleaving and the gradient reduction after
  the backward pass -- for a source no rule names."""
  moe = _plain_row(model_name='DeepSeek-V3', num_layers='61', hidden='7168',
                   ffn_hidden='18432', attn_heads='128', seq_len='4096',
                   vocab='129280', num_gpus='2048', gpu_type='H800', tp='1',
                   pp='16', global_batch_size='15360', dtype='fp8',
                   notes='DualPipe. moe: num_experts=256; top_k=8; ep=64; '
                   'moe_ffn_hidden=2048')
  ds = _plain_row(notes="Megatron-DeepSpeed: DeepSpeed's pipeline engine")
  s = P.Suite(ROOT, [write_csv(tmp_path / 'v.csv', [moe, ds])])
  a, b = s.cases
  assert a.fixed['moe_dispatcher'] == 'deepep'
  assert a.axes['moe_comm_overlap'] == ['compute']
  assert '2412.19437' in why(a, 'moe_comm_overlap')
  assert b.axes['pipeline_interleaving'] == [1]
  assert b.axes['data_par_overlap'] == [False]


def test_all_gather_context_parallelism_in_the_notes(tmp_path):
  """Notes saying the CP is all-gather based (Llama 3, arXiv 2407.21783
  section 3.3.2: K and V all-gathered, then the local queries' attention)
  price the all-gather exchange instead of Megatron-Core's default ring
  (--cp-comm-type p2p); notes that say nothing keep the ring.  The
  all-gather leaves more of the CP exchange exposed, so the row prices
  slower."""
  ag = _plain_row(cp='2', notes='the CP is all-gather based')
  ring = _plain_row(cp='2')
  s = P.Suite(ROOT, [write_csv(tmp_path / 'v.csv', [ag, ring])])
  a, b = s.cases
  value = lambda c: c.fixed.get('context_par_comm',
                                (c.axes.get('context_par_comm') or [None])[0])
  assert value(a) == 'all_gather'
  assert value(b) in (None, 'ring')
  fast_a, fast_b = (r.predicted_s for r in P.run_suite(s))
  assert fast_a > fast_b


def test_unseen_runs_file_is_priced():
  """validation/unseen_runs.csv (Llama 3 405B, MT-NLG 530B and
  DeepSeek-V3 from their papers; never used by a calibration or a
  source's rule): every row priced, none called infeasible."""
  s = P.Suite(ROOT, [repo('validation', 'unseen_runs.csv')])
  res = P.results_frame(P.run_suite(s))
  assert len(res) == 7 and set(res['status']) == {'ok'}


def test_unseen_tuned_runs_file():
  """validation/unseen_tuned_runs.csv: NVIDIA's tuned MoE configurations
  of the Megatron-Bridge skill cards (067f987df; never used by a
  calibration), every row priced on the default (calibrated) files.  Its
  Qwen3 30B-A3B pair on 16 H100 (BF16, EP 16, microbatch 1) measured the
  1F1B expert all-to-all overlap at 24,713.8 -> 20,992.03 ms per step
  (moe-optimization-workflow card; 244.039 -> 287.305 TFLOP/s in the
  expert-parallel-overlap card: the same 1.177x); the calibrated DGX H100
  file prices each step within 5 % (24.71 -> 25.72 s, 20.99 -> 20.96 s:
  per-layer CUDA graphs of the router and MoE preprocessing leave the
  blocks GPU-bound) and the gain within 5 % of it (1.227x: the dispatch
  and combine paired with the other microbatch's compute as Megatron-
  Core's layer schedule runs them, the first forward and the last
  backward alone).  Without the overlap priced the ratio would be 1."""
  from calculon.cli.validation import calibrated_systems
  s = P.Suite(ROOT, [repo('validation', 'unseen_tuned_runs.csv')])
  res = P.run_suite(s, systems=calibrated_systems(ROOT, s))
  assert len(res) == 11 and {r.status for r in res} == {'ok'}
  off, on = res[-2], res[-1]
  assert off.case.axes['moe_comm_overlap'] == ['none']
  assert on.case.axes['moe_comm_overlap'] == ['compute']
  measured = off.case.measured_s / on.case.measured_s
  assert measured == pytest.approx(287.305 / 244.039, rel=1e-3)
  for r in (off, on):
    assert r.predicted_s == pytest.approx(r.case.measured_s, rel=0.05)
  assert off.predicted_s / on.predicted_s == pytest.approx(measured,
                                                           rel=0.05)


def test_unseen_mlperf_runs_file():
  """validation/unseen_mlperf_runs.csv: NVIDIA's MLPerf Training v4.0-v5.1
  GPT-3 175B, Llama 3.1 405B and 8B submissions (mlcommons/
  training_results_v4.0 .. v5.1; never used by a calibration), every row
  priced on the default (calibrated) files.  Each step time is the median
  of its log's per-step timings: the v5.0 H100 405B run on 64 nodes,
  241 'train_step_time' entries of result_0.txt, 55.103 s.  The
  launcher's TP_COMM_OVERLAP switch sets the TP overlap (False in every
  NVFP4 config, v5.1 config_common_fp4.sh: "TP overlap not supported
  yet").  NVIDIA's GB200 FP8 405B runs, which the issue found +19 to +21 %
  optimistic on the datasheet-calibrated files, are within 10 %."""
  from calculon.cli.validation import calibrated_systems
  s = P.Suite(ROOT, [repo('validation', 'unseen_mlperf_runs.csv')])
  res = P.run_suite(s, systems=calibrated_systems(ROOT, s))
  assert len(res) == 20 and {r.status for r in res} == {'ok'}
  by_id = {r.case.id: r for r in res}
  h100 = by_id['training-results-v5-0-01']
  assert h100.case.measured_s == pytest.approx(55.103, rel=1e-6)
  assert h100.case.axes['tensor_par_overlap'] == ['ring']
  assert by_id['training-results-v5-1-01'].case.axes[
    'tensor_par_overlap'] == ['none']
  for rid in ('training-results-v5-0-04', 'training-results-v5-0-05'):
    r = by_id[rid]
    assert r.predicted_s == pytest.approx(r.case.measured_s, rel=0.10)


def test_megatron_core_013_applies_the_probabilities_in_the_activation(suite):
  """Megatron-Bridge and the model zoo run Megatron-Core with commit
  2659630721 (core_v0.13.0): their MoE rows keep no expert outputs in the
  combine; NeMo 25.02's Mixtral rows (Megatron-Core 0.11) and dense rows
  keep the field's default."""
  for rid in ('megatron-bridge-11', 'megatron-moe-modelzoo-01'):
    c = case(suite, rid)
    assert resolved(c, 'moe_probs_in_activation') is True
    assert '2659630721' in source_of(c, 'moe_probs_in_activation')
  for rid in ('nvidia-03', 'megatron-bridge-01'):
    assert resolved(case(suite, rid), 'moe_probs_in_activation') == absent('moe_probs_in_activation')


def test_torchtitan_with_pipeline_keeps_fsdp_weights_gathered(suite):
  """torchtitan with PP does not reshard FSDP2's weights after the forward
  pass (9dec370 apply_fsdp) and PyTorch's pipelining reduces the gradients
  once after the last microbatch (stage.py perform_reduce_grad): priced as
  a sharded optimizer.  Its Llama 3.1 405B run at FSDP 8 x TP 8 x PP 8
  peaks at 82.5 GiB (benchmarks/llama3_h100_202412_torchtitan.md, 1F1B);
  priced per-microbatch FSDP, the model needed 37 GiB; now within 20 %.
  The same source without PP keeps FSDP."""
  c = case(suite, 'torchtitan-10')
  assert c.axes['data_par_sharding'] == ['optimizer']
  assert 'reshard_after_forward' in why(c, 'data_par_sharding')
  assert case(suite, 'torchtitan-08').axes['data_par_sharding'] == \
    ['parameters']
  from calculon.llm import Llm
  r = P.price(c, suite.system(c))
  model = Llm(c.priced_app)
  model.compile(suite.system(c), r.execution)
  need_gib = float(model.evaluation.mem1_bytes) / 2**30
  assert abs(need_gib / 82.5 - 1) < 0.2


def test_measured_memory_from_the_notes(results):
  """A row's notes may state its measured peak memory per GPU
  (``peak_mem_GiB=83.9``); the suite compares it with the memory the
  chosen execution needs.  torchtitan's benchmark files give 15 (its
  logged peak reserved memory), all within 20 %; its two 2025 H200 runs
  (e7c0cae) within 5 % once the compiled loss keeps no float32 logits
  (cross_entropy_kernel 'compiled': 16 GiB less than the eager loss of
  its 2024 runs at 2 x 8,192 tokens); its 70B runs at TP 8 (Table 4) within
  1 % once DTensor's loss-parallel backward holds its fourth float32
  logits buffer (7.8 GiB at 16 x 8,192 tokens, 16,032 words a rank; they
  were 10.4 and 11.8 % under); issue 34's 80 % within 10 % holds."""
  assert M.measured_memory_gib('also: peak_mem_GiB=83.9.') == 83.9
  assert M.measured_memory_gib('mem_GiB=46.97') == 46.97
  assert M.measured_memory_gib('80 GB HBM3') is None
  mem = results.dropna(subset=['delta_mem_pct'])
  assert len(mem) == 15 and set(mem['source']) == {'pytorch/torchtitan'}
  h200 = mem['id'].isin(['torchtitan-17', 'torchtitan-18'])
  assert (mem['delta_mem_pct'].abs() < 20).all()
  assert (mem.loc[h200, 'delta_mem_pct'].abs() < 5).all()
  assert 0 < mem['delta_mem_pct'].median() < 10
  by_id = mem.set_index('id')['delta_mem_pct']
  assert by_id[['torchtitan-08', 'torchtitan-09']].abs().max() < 1
  assert (mem['delta_mem_pct'].abs() <= 10).mean() >= 0.8
  s = P.summary(results)
  assert s['memory']['n'] == 15


def test_torchtitan_interleaved_warmup_is_capped(suite, results):
  """torchtitan's interleaved 405B run (Table 5: PP 8, two stages per
  rank, 8 microbatches by default) measured 72.7 GiB, less than its 1F1B
  twin's 82.5.  PyTorch's ScheduleInterleaved1F1B caps the first rank's
  warm-up, 8 + 2 x 7 = 22 chunk-forwards, at 8 x 2 = 16 (get_rank_warmup_ops:
  min(warmup_ops, n_microbatches * n_local_stages)): it keeps the 8
  microbatches of its blocks that 1F1B keeps, not 11.5, so the two runs'
  first stages need the same memory (80.3 GiB, 10.5 % over, before).  The
  interleaved run's last rank, which also holds a middle chunk's
  microbatches and the LM head with DTensor's loss-parallel buffer, now
  binds, 1.4 GiB above: -11 comes within 3 %."""
  c = case(suite, 'torchtitan-11')
  assert resolved(c, 'pipeline_warmup_capped') is True
  assert 'get_rank_warmup_ops' in source_of(c, 'pipeline_warmup_capped')
  mem = results.set_index('id')
  extra = mem.loc['torchtitan-11', 'predicted_mem_gib'] - \
    mem.loc['torchtitan-10', 'predicted_mem_gib']
  assert 0 <= extra < 1.5
  assert abs(mem.loc['torchtitan-11', 'delta_mem_pct']) < 3


def test_torchao_float8_keeps_sixteen_bit_inputs(suite, results):
  """torchtitan's float8 linears are torchao's, which keep the 16-bit
  input for the backward pass: its Llama 3.1 8B on 128 H100s peaks at
  62.0 GiB in bf16 and 61.8 GiB with Float8 (the benchmark's own A/B);
  the model prices the two within 2 % of each other (16 % apart with
  Transformer Engine's float8 inputs)."""
  c = case(suite, 'torchtitan-03')
  assert resolved(c, 'wide_saved_inputs') is True
  assert 'e76db70ec' in source_of(c, 'wide_saved_inputs')
  assert resolved(case(suite, 'torchtitan-02'), 'wide_saved_inputs') == absent('wide_saved_inputs')
  mem = results.set_index('id')['predicted_mem_gib']
  assert abs(mem['torchtitan-03'] / mem['torchtitan-02'] - 1) < 0.02


def test_megatron_bridge_nvfp4_llama_runs_without_tp_overlap(suite):
  """Megatron-Bridge's Llama 3 / 3.1 performance configs turn TP
  communication overlap off for NVFP4 (llama31_llm_pretrain.py at
  63b08b397: tp_comm_overlap = False if precision == "nvfp4"): its Llama
  3.1 405B NVFP4 row on GB200 (TP 4) is priced without it; the FP8 twin
  still searches it."""
  c = case(suite, 'megatron-bridge-02')
  assert c.axes['tensor_par_overlap'] == ['none']
  assert '63b08b397' in why(c, 'tensor_par_overlap')
  assert len(case(suite, 'megatron-bridge-01').axes['tensor_par_overlap']) > 1


def test_megatron_core_rows_overlap_the_pipeline_transfers(suite, results):
  """Megatron-Core's interleaved schedule overlaps the steady state's
  pipeline transfers (overlap_p2p_comm: Megatron-LM's default since
  4eeff55d1f; NeMo and Megatron-Bridge set it with VP > 1); the 2021-2022
  Megatron-LM papers and torchtitan keep every transfer exposed.  NeMo
  24.07's Llama 2 13B (PP 4, VP 10, 32 microbatches over a node boundary)
  is priced within a few percent once its transfers hide (-12.4 % with
  all of them exposed)."""
  for rid in ('nemo-06', 'nvidia-01', 'megatron-bridge-02',
              'megatron-moe-modelzoo-01'):
    c = case(suite, rid)
    assert resolved(c, 'pipeline_par_overlap') is True
    assert '4eeff55d1f' in source_of(c, 'pipeline_par_overlap')
  for rid in ('narayanan-07', 'korthikanti-05', 'torchtitan-11',
              'bigscience-01'):
    assert resolved(case(suite, rid), 'pipeline_par_overlap') == absent('pipeline_par_overlap')
  row = results.set_index('id').loc['nemo-06']
  assert abs(row['delta_pct']) < 5


def test_megatron_lm_rows_fuse_the_hidden_dropout(suite, results):
  """Megatron-LM (since 9acc895632, January 2021) and the
  Megatron-DeepSpeed it forked apply the hidden dropout inside the
  residual addition's kernel; Korthikanti et al.'s single-layer baseline
  (Table 4: 19.6 ms without sequence parallelism, 19.0 ms with) is then
  priced within 4 % (-3.5 %, NCCL's latencies of its TP 8 collectives
  included)."""
  for rid in ('narayanan-01', 'korthikanti-12', 'bigscience-01'):
    c = case(suite, rid)
    assert resolved(c, 'fused_dropout_add') is True
    assert '9acc895632' in source_of(c, 'fused_dropout_add')
  for rid in ('black-01', 'nemo-01', 'torchtitan-01'):
    assert resolved(case(suite, rid), 'fused_dropout_add') == absent('fused_dropout_add')
  row = results.set_index('id').loc['korthikanti-12']
  assert -4.0 < row['delta_pct'] < 0


_JUNK = ('', '0', '-1', 'abc', '2.5', 'nan', 'inf', ' ', '1e12', 'None')


@pytest.mark.parametrize('seed', range(3))
def test_fuzzed_runs_file_cells_never_raise(tmp_path, seed):
  """Any cell of a runs file may hold anything: a row is priced or not
  priced with a reason, never a traceback (a malformed override column is
  the one ConfigError, exit 2).  Derandomized: 8 rows a seed, each with
  one to four cells of a bundled row replaced by junk."""
  import random
  rng = random.Random(seed)
  base = [r for r in shared_rows() if r['model_name'].startswith('GPT 22B')]
  rows = []
  for i in range(8):
    row = dict(rng.choice(base))
    for _ in range(rng.randint(1, 4)):
      key = rng.choice(M.FACT_COLUMNS)
      row[key] = rng.choice(_JUNK)
    rows.append(row)
  s = P.Suite(ROOT, [write_csv(tmp_path / 'junk.csv', rows)])
  frame = P.results_frame(P.run_suite(s))
  assert len(frame) == 8
  no = frame[frame['status'] == 'not priced']
  assert (no['reason'].str.len() > 0).all()


def test_mxfp8_no_faster_than_fp8_current_scaling(suite):
  """Megatron-Bridge's performance tables give Llama 3 both ways on the
  same layout, FP8 current scaling and, in parentheses, MXFP8
  (docs/performance-summary-archive.md @067f987df, the rows' notes): 8B
  on 8 GB300 37,556 and 36,108 tokens/s/GPU, on 8 GB200 31,508 and
  29,789, on 8 B200 30,624 and 29,521; 405B on 128 B200 661 and 624:
  MXFP8 3.6-5.6 % slower.  On the default (calibrated) files, with MXFP8
  GEMMs at Transformer Engine's measured 1.051 x the per-tensor kernel
  (kernels.tables.MXFP8_GEMM_RATIO), the model prices MXFP8 no faster
  (pricing only the casts it had it 0.7-2.8 % faster: block scales need
  no amax pass) and within 6 % of each measured ratio."""
  import copy
  from calculon.cli.validation import calibrated_systems
  systems = calibrated_systems(ROOT, suite)
  pairs = {'megatron-bridge-05': 36108 / 37556,
           'megatron-bridge-06': 29789 / 31508,
           'megatron-bridge-07': 29521 / 30624,
           'megatron-bridge-08': 624 / 661}
  for rid, measured in pairs.items():
    current = case(suite, rid)
    assert current.fixed['quantization_scaling'] == 'current'
    block = copy.deepcopy(current)
    block.fixed['quantization_scaling'] = 'block'
    system = suite.system(current, systems[current.cluster or
                                           current.system_name], key='cal')
    rate = P.price(current, system).predicted_s / \
      P.price(block, system).predicted_s
    assert rate <= 1.005, rid
    assert rate == pytest.approx(measured, abs=0.06), rid
