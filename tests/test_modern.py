"""Modern dense transformers: FLOP, activation memory, bytes per parameter,
GQA, context parallelism, vocabulary and precision, each against a cited
source (issue "Modern dense transformers")."""

import math

import numpy as np
import pytest

from calculon.config import Application, Execution, ExecutionColumns
from calculon.errors import ConfigError
from calculon.hardware import System
from calculon.io import read_json_file
from calculon.llm.engine import evaluate_columns
from calculon.llm.flops import model_flops_per_token
from calculon.validation.system_files import datasheet_path

from conftest import ROOT

A100 = System(read_json_file(f'{ROOT}/systems/a100_80g.json'))
H100 = System(read_json_file(f'{ROOT}/systems/h100_80g_nvl8.json'))
H100_SXM = System(read_json_file(
  f'{ROOT}/systems/h100_sxm_80g_datasheet.json'))

BASE_EXE = dict(
  num_procs=1, tensor_par=1, pipeline_par=1, data_par=1, tensor_par_net=0,
  pipeline_par_net=0, data_par_net=0, batch_size=1, microbatch_size=1,
  datatype='float16', fused_activation=False, activation_recompute='none',
  pipeline_interleaving=1, optimizer_sharding=False,
  tensor_par_comm_type='ar', tensor_par_overlap='none', seq_par_ag_redo=False,
  data_par_overlap=False, weight_offload=False, activations_offload=False,
  optimizer_offload=False, training=True)


def evaluation(app, system=A100, **fields):
  exe = dict(BASE_EXE, **fields)
  if 'optimizer_sharding' not in fields and 'data_par_sharding' in fields:
    exe.pop('optimizer_sharding')
  procs = exe['tensor_par'] * exe['pipeline_par'] * exe['data_par'] * \
    exe.get('context_par', 1)
  exe.setdefault('num_procs', procs)
  exe['num_procs'] = procs
  cfg = Execution.from_dict(exe)
  cols = ExecutionColumns.from_records([cfg.to_dict()])
  return evaluate_columns(app, system, cols)


def value(x):
  return float(np.asarray(x).reshape(-1)[0])


def llama(**over):
  """A Llama-shaped application (Touvron et al. 2023; Llama 3 8B unless
  overridden)."""
  cfg = dict(hidden=4096, feedforward=14336, seq_size=8192, attn_heads=32,
             attn_size=128, num_blocks=32, kv_heads=8, mlp='gated',
             norm='rmsnorm', linear_bias='none', vocab_size=128256,
             position_embedding='rope', dropout=False)
  cfg.update(over)
  return Application.from_dict(cfg)


# -- model FLOP ------------------------------------------------------------------

def megatron_flops_per_batch(b, s, L, h, f, a, g, d, V, swiglu, causal):
  """Megatron-LM ``num_floating_point_operations`` (megatron/training/
  training.py at d98e8a64, dense GQA branch, BSHD: total_real_tokens =
  b s, seqlen_squared_sum = b s^2), transcribed term by term."""
  q = d * a
  kv = d * g
  ffn_expansion = 3 if swiglu else 2
  tokens = b * s
  self_attn_linear = 3 * 2 * (h * (q + kv + kv) + q * h)
  core = 3 * 2 * q / (2 if causal else 1) * 2
  return tokens * (3 * 2 * h * (f * ffn_expansion) * L + L * self_attn_linear
                   + 3 * 2 * h * V) + b * s * s * L * core


@pytest.mark.parametrize('name,cfg,causal_ref,full_ref', [
  # Per-token oracles derived from Megatron-LM HEAD (causal) and commit
  # d737deb362 (full s^2); shapes from Grattafiori et al. 2024 (Llama 3,
  # Table 3) and Brown et al. 2020 (GPT-3, Table 2.1, V padded to 51200).
  ('llama3-8B', dict(), 5.1470e10, 5.7913e10),
  ('llama3-70B', dict(hidden=8192, feedforward=28672, attn_heads=64,
                      num_blocks=80), 4.4922e11, 4.8143e11),
  ('llama3.1-405B', dict(hidden=16384, feedforward=53248, attn_heads=128,
                         num_blocks=126), 2.5240e12, 2.6254e12),
  ('gpt3-175B', dict(hidden=12288, feedforward=49152, seq_size=2048,
                     attn_heads=96, num_blocks=96, kv_heads=96, mlp='plain',
                     vocab_size=51200), 1.0619e12, 1.0764e12),
])
def test_model_flops_equal_megatron(name, cfg, causal_ref, full_ref):
  app = llama(**cfg)
  for conv, ref in (('causal', causal_ref), ('full', full_ref)):
    got = model_flops_per_token(app, conv)
    assert got == pytest.approx(ref, rel=5e-5), (name, conv)
    exact = megatron_flops_per_batch(
      1, app.seq_size, app.num_blocks, app.hidden, app.feedforward,
      app.attn_heads, app.kv_heads, app.attn_size, app.vocab_size,
      app.gated, conv == 'causal') / app.seq_size
    assert got == pytest.approx(exact, rel=1e-12)


@pytest.mark.parametrize('family,over,expected', [
  # NeMo tests/utils/test_flops_formulas.py (NVIDIA/NeMo@8cfedd72): gbs=1,
  # s=128, hs=768, layers=12, ffn=3072, heads=12, groups=12, topk=2; the
  # vocabulary of each family from LLM_VOCAB_SIZE_MAP.
  ('gpt3', dict(mlp='plain', vocab_size=51200), 96334774272),
  ('llama2', dict(vocab_size=32000), 106753425408),
  ('llama3', dict(vocab_size=128256), 163527524352),
  ('nemotron', dict(mlp='plain', vocab_size=256000), 217130729472),
  ('mixtral', dict(vocab_size=32000, num_experts=8, top_k=2,
                   moe_ffn_hidden=3072), 171983241216),
])
def test_nemo_expected_flops(family, over, expected):
  app = llama(hidden=768, feedforward=3072, seq_size=128, attn_heads=12,
              attn_size=64, num_blocks=12, kv_heads=12, **over)
  assert model_flops_per_token(app, 'causal') * 128 == expected


@pytest.mark.parametrize('tp', [1, 2])
def test_engine_gemm_flops_equal_the_full_formula(tp):
  """The GEMMs the engine prices (standard attention kernel, no
  recomputation) are exactly the model FLOP with the whole score matrix:
  Megatron-LM's formula before 2025 (d737deb362)."""
  app = llama(seq_size=2048, num_blocks=4)
  ev = evaluation(app, H100, tensor_par=tp, batch_size=2, microbatch_size=1,
                  tensor_par_comm_type='rs_ag')
  blocks = app.num_blocks * value(ev.num_microbatches)
  per_rank = blocks * value(ev.block.matrix_fw_flops + ev.block.matrix_bw_flops)
  per_rank += value(ev.num_microbatches) * value(
    ev.head.matrix_fw_flops + ev.head.matrix_bw_flops)
  assert per_rank * tp == pytest.approx(
    model_flops_per_token(app, 'full') * 2 * app.seq_size, rel=1e-12)


def test_flash_kernel_skips_masked_tiles():
  """FlashAttention-2 with a causal mask computes n (n + 1) / 2 of n^2
  tiles (Dao 2023, section 3.1.1): 1/2 + 1/(2n) of the full core."""
  app = llama(seq_size=4096, num_blocks=2)
  std = evaluation(app, H100, attention_kernel='standard')
  fl = evaluation(app, H100, attention_kernel='flash')
  n = 4096 // 128
  core_std = value(std.layers[[l.name for l in std.layers].index(
    'AttnBlock_Multihead_Key_Query')].flops('fw')) * 2
  core_fl = value([l for l in fl.layers if l.name ==
                   'AttnBlock_FlashAttention'][0].flops('fw'))
  assert core_fl == pytest.approx(core_std * (n + 1) / (2 * n), rel=1e-12)


# -- activation memory -------------------------------------------------------------

GPT = dict(hidden=4096, feedforward=16384, seq_size=2048, attn_heads=32,
           attn_size=128, num_blocks=8)


@pytest.mark.parametrize('tp', [2, 8])
@pytest.mark.parametrize('seq_par', [False, True])
@pytest.mark.parametrize('mode', ['none', 'selective', 'flash'])
def test_activation_memory_per_layer_equals_korthikanti(tp, seq_par, mode):
  """Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
  Transformer Models", section 4 (eqs. 2-4; Table 2): per layer, 16-bit
  activations, 1-byte dropout masks: TP sbh(10 + 24/t + 5as/(ht)), TP+SP
  sbh/t (34 + 5as/h); selective recomputation drops the 5as/h terms.
  FlashAttention (Dao et al. 2022, section 3.1) stores no s x s tensor,
  only the fp32 log-sum-exp per query and head: the selective row + 4asb/t.
  Sequence parallelism as the paper describes it re-gathers the layer-norm
  output in the backward pass (seq_par_ag_redo)."""
  s, b, h, a = 2048, 1, 4096, 32
  app = Application.from_dict(GPT)
  rec = 'selective' if mode == 'selective' else 'none'
  ev = evaluation(app, A100, tensor_par=tp, activation_recompute=rec,
                  tensor_par_comm_type='rs_ag' if seq_par else 'ar',
                  seq_par_ag_redo=seq_par,
                  attention_kernel='flash' if mode == 'flash' else 'standard')
  quad = 5 * a * s / h if mode == 'none' else 0
  if seq_par:
    ref = s * b * h / tp * (34 + quad)
  else:
    ref = s * b * h * (10 + 24 / tp + quad / tp)
  if mode == 'flash':
    ref += 4 * a * s * b / tp
  assert value(ev.block.act_storage_bytes) == pytest.approx(ref, rel=1e-12)


def test_full_recomputation_keeps_the_layer_input():
  """Korthikanti et al. 2022, section 4.3: full recomputation keeps 2sbh per
  layer (the block input in 16 bits)."""
  app = Application.from_dict(GPT)
  ev = evaluation(app, A100, tensor_par=2, activation_recompute='full')
  assert value(ev.block_act_checkpoint_bytes) == 2 * 2048 * 4096


@pytest.mark.parametrize('comm', ['ar', 'rs_ag', 'p2p_rs_ag'])
def test_checkpoint_layout(comm):
  """With sequence parallelism Megatron-LM's full recomputation checkpoints
  the block input as each TP rank holds it, [s/t, b, h] (Korthikanti et al.
  2022, section 4.2.2: the layer input is scattered along the sequence):
  2sbh/t per layer with checkpoint_layout 'as_input'; Calculon's 2sbh
  ('whole', the default) otherwise, and without sequence parallelism."""
  app = Application.from_dict(GPT)
  whole = evaluation(app, A100, tensor_par=4, activation_recompute='full',
                     tensor_par_comm_type=comm)
  kept = evaluation(app, A100, tensor_par=4, activation_recompute='full',
                    tensor_par_comm_type=comm, checkpoint_layout='as_input')
  assert value(whole.block_act_checkpoint_bytes) == 2 * 2048 * 4096
  sharded = 2 * 2048 * 4096 / (4 if comm != 'ar' else 1)
  assert value(kept.block_act_checkpoint_bytes) == sharded
  assert value(kept.total_time_s) == value(whole.total_time_s)
  with pytest.raises(ConfigError, match="'checkpoint_layout' = \"split\""):
    Execution.from_dict(dict(BASE_EXE, checkpoint_layout='split'))


def test_gated_mlp_and_gqa_activations():
  """Gated MLP keeps the 2f-wide gate/up output and the f-wide down input
  (sb(3h + 6f) for the MLP with its input and dropout mask, vs sb(3h + 4f)
  plain); GQA attention keeps sb(3h + 4q + 4gd) (modern-formulas note c6,
  generalizing Korthikanti et al. 2022 section 4.1)."""
  s, h, f, q, g, d = 2048, 4096, 11008, 4096, 8, 128
  base = dict(GPT, feedforward=f)
  plain = evaluation(Application.from_dict(base), A100)
  gated = evaluation(Application.from_dict(dict(base, mlp='gated')), A100)
  diff = value(gated.block.act_storage_bytes) - \
    value(plain.block.act_storage_bytes)
  assert diff == pytest.approx(s * 2 * f, rel=1e-12)
  gqa = evaluation(Application.from_dict(dict(GPT, kv_heads=g)), A100,
                   attention_kernel='flash')
  mha = evaluation(Application.from_dict(GPT), A100,
                   attention_kernel='flash')
  saved = value(mha.block.act_storage_bytes) - \
    value(gqa.block.act_storage_bytes)
  assert saved == pytest.approx(s * 4 * (q - g * d), rel=1e-12)


# -- bytes per parameter -----------------------------------------------------------

def _states_per_param(level, n, datatype='float16', grads='float16'):
  app = Application.from_dict(dict(GPT, num_blocks=1))
  fields = dict(datatype=datatype, gradient_datatype=grads, data_par=n,
                batch_size=n)
  if level != 'none':
    fields['data_par_sharding'] = level
  ev = evaluation(app, A100, **fields)
  params = value(ev.block.weight_elems)
  kinds = ev.memory_by_kind
  states = sum(value(kinds[k][0]) for k in ('weights', 'weight_gradients',
                                           'optimizer'))
  return states / params, value(ev.block.weight_bytes) / params


@pytest.mark.parametrize('level,formula', [
  # Rajbhandari et al. 2020 (ZeRO), section 5, Figure 1: mixed-precision
  # Adam, K = 12: (2 + 2 + K), 2 + 2 + K/N, 2 + (2 + K)/N, (2 + 2 + K)/N.
  ('none', lambda n: 16),
  ('optimizer', lambda n: 4 + 12 / n),
  ('gradients', lambda n: 2 + 14 / n),
  ('parameters', lambda n: 16 / n),
])
def test_bytes_per_parameter_equal_zero(level, formula):
  """One block per processor: the steady-state model states of the ZeRO
  paper, plus the working set the paper leaves out: ZeRO-2/3 hold the
  block's gradients unsharded until they are reduce-scattered, ZeRO-3 the
  gathered 16-bit weights of the block being computed."""
  n = 64
  got, _ = _states_per_param(level, n)
  working = {'none': 0, 'optimizer': 0, 'gradients': 2 - 2 / n,
             'parameters': 2 + 2 - 2 / n}[level]
  assert got == pytest.approx(formula(n) + working, rel=1e-12)
  # ZeRO Figure 1 (7.5B parameters, 64 GPUs): 120, 31.4, 16.6, 1.9 GB.
  fig1 = {'none': 120, 'optimizer': 31.4, 'gradients': 16.6,
          'parameters': 1.9}[level]
  assert formula(n) * 7.5 == pytest.approx(fig1, abs=0.06)


@pytest.mark.parametrize('datatype,grads,none,dist', [
  # Megatron-LM docs/user-guide/features/dist_optimizer.md: bf16 parameters
  # with fp32 gradients 18 / 6 + 12/d; fp32 parameters and gradients
  # 16 / 8 + 8/d.
  ('bfloat16', 'float32', lambda d: 18, lambda d: 6 + 12 / d),
  ('float32', 'float32', lambda d: 16, lambda d: 8 + 8 / d),
])
def test_bytes_per_parameter_equal_megatron_distributed_optimizer(
    datatype, grads, none, dist):
  sysm = System(read_json_file(f'{ROOT}/systems/a100_80g.json'))
  for d in (2, 8, 64):
    cfg = sysm.cfg
    for level, ref in (('none', none), ('optimizer', dist)):
      app = Application.from_dict(dict(GPT, num_blocks=1))
      fields = dict(datatype=datatype, gradient_datatype=grads, data_par=d,
                    batch_size=d)
      if level != 'none':
        fields['data_par_sharding'] = level
      ev = evaluation(app, _with_dtypes(cfg), **fields)
      params = value(ev.block.weight_elems)
      kinds = ev.memory_by_kind
      states = sum(value(kinds[k][0]) for k in (
        'weights', 'weight_gradients', 'optimizer'))
      assert states / params == pytest.approx(ref(d), rel=1e-12)


def _with_dtypes(cfg):
  """The A100 system with bfloat16 and float32 throughput too."""
  import copy
  cfg = copy.deepcopy(cfg)
  for engine in ('matrix', 'vector'):
    for dt in ('bfloat16', 'float32'):
      cfg[engine].setdefault(dt, cfg[engine]['float16'])
  return System(cfg)


def test_calculon_optimizer_sharding_is_priced_as_before():
  """optimizer_sharding = true keeps Calculon's numbers: the level
  'gradients' with Calculon's gradient precision (the golden parity covers
  the values; here the equivalence)."""
  app = Application.from_dict(GPT)
  calc = evaluation(app, A100, data_par=8, batch_size=8,
                    optimizer_sharding=True)
  new = evaluation(app, A100, data_par=8, batch_size=8,
                   data_par_sharding='gradients')
  for attr in ('total_time_s', 'mem1_bytes'):
    assert value(getattr(calc, attr)) == value(getattr(new, attr))


# -- GQA, CP, vocabulary -----------------------------------------------------------

@pytest.mark.parametrize('tp,width', [(1, 8 * 128), (4, 2 * 128), (8, 128),
                                      (16, 128), (32, 128)])
def test_gqa_kv_width_per_rank(tp, width):
  """K and V projections have g d outputs split over TP; with TP > g each
  rank keeps one replicated K/V head (Megatron-Core: num_query_groups a
  multiple or a divisor of TP)."""
  app = llama(num_blocks=2, seq_size=1024, attn_heads=32)
  ev = evaluation(app, H100, tensor_par=tp)
  key = [l for l in ev.layers if l.name == 'AttnBlock_Key'][0]
  assert value(key.weights) == 4096 * width


def test_gqa_tp_must_divide_or_be_divided_by_kv_heads():
  app = llama(num_blocks=2, seq_size=1024, attn_heads=48, kv_heads=8,
              hidden=6144)
  with pytest.raises(ConfigError, match="multiple or a divisor of the "
                     "application's kv_heads"):
    evaluation(app, H100, tensor_par=3)


def test_attention_type_must_agree_with_kv_heads():
  app = llama(num_blocks=2, seq_size=1024)
  with pytest.raises(ConfigError, match='"grouped"'):
    evaluation(app, H100, attention_type='multihead')
  evaluation(app, H100, attention_type='grouped')
  with pytest.raises(ConfigError, match="needs the application's kv_heads"):
    evaluation(Application.from_dict(GPT), A100, attention_type='grouped')


def test_context_parallelism_divides_work_and_rings_kv():
  """CP splits the sequence: linear FLOP and activations per rank / CP;
  the ring sends the local K and V (2 b (s / c) g d 16-bit elements per
  step, cp - 1 steps forward; Megatron-Core CP with TransformerEngine
  AttnFuncWithCPAndKVP2P)."""
  app = llama(num_blocks=2)
  one = evaluation(app, H100, attention_kernel='flash')
  cp4 = evaluation(app, H100, attention_kernel='flash', context_par=4,
                   data_par=1)
  mlp = lambda ev: value([l for l in ev.layers if l.name ==
                          'MlpBlock_Mlp1'][0].flops('fw'))
  assert mlp(cp4) == mlp(one) / 4
  core = lambda ev: value([l for l in ev.layers if l.name ==
                           'AttnBlock_FlashAttention'][0].flops('fw'))
  assert core(cp4) == pytest.approx(core(one) / 4, rel=1e-12)
  assert value(cp4.block_cp_bytes) == 2 * (8192 // 4) * 8 * 128 * 2
  assert value(cp4.cp_comm_link_time_s) > 0
  # CP joins DP for the optimizer shards.
  sharded = evaluation(app, H100, attention_kernel='flash', context_par=4,
                       data_par_sharding='optimizer')
  assert value(sharded.optimizer_shards) == 4


def test_context_parallel_all_gather_gathers_once_a_layer():
  """context_par_comm 'all_gather' (Llama 3, arXiv 2407.21783 section
  3.3.2; torchtitan's default context_parallel_rotate_method 'allgather';
  Megatron-Core --cp-comm-type all_gather): the forward pass all-gathers
  the cp K/V chunks once a layer (a buffer of cp chunks), behind the
  attention of the local chunk only; the backward gathers them again and
  reduce-scatters their gradients (twice the buffer).  Over the batch the
  link carries that instead of the ring's cp - 1 steps each way."""
  app = llama(num_blocks=2, seq_size=32768)
  ring = evaluation(app, H100, attention_kernel='flash', context_par=8,
                    data_par=1, context_par_net=1)
  gather = evaluation(app, H100, attention_kernel='flash', context_par=8,
                      data_par=1, context_par_net=1,
                      context_par_comm='all_gather')
  kv = 2 * (32768 // 8) * 8 * 128 * 2            # one rank's K/V, bytes
  assert value(gather.block_cp_bytes) == kv
  net = H100.networks
  ag = value(net.collective_time_s('all_gather', 8 * kv, 8, 1, 1))
  rs = value(net.collective_time_s('reduce_scatter', 16 * kv, 8, 1, 1))
  fw, bw = (value(x) for x in gather._cp_gather_s)
  assert fw == pytest.approx(ag) and bw == pytest.approx(ag + rs)
  window = value(gather.block.core_fw_time) / 8
  usage = value(net.usage(1))
  assert value(gather.block_cp_fw_exposed_s) == pytest.approx(
    max(ag - window, 0) + min(ag, window) * usage)
  # One gather is exposed where the ring's seven steps hide behind seven
  # attention steps: the all-gather exchange costs more on this tier.
  assert value(gather.cp_comm_exposed_time_s) > \
    value(ring.cp_comm_exposed_time_s)
  assert value(gather.cp_comm_link_time_s) == pytest.approx(
    value(gather.block_microbatches) * (2 * ag + rs))
  # Without CP nothing is exchanged either way.
  none = evaluation(app, H100, attention_kernel='flash',
                    context_par_comm='all_gather')
  assert value(none.cp_comm_link_time_s) == 0


def test_context_parallel_merge_passes_over_memory():
  """Each ring step's partial output is merged outside the attention
  kernel (Transformer Engine flash_attn_fwd_out_correction_init / _correction:
  the first step reads the partial output and writes the running one, each
  later step reads both and writes the running one), so the forward pass
  moves o x (3 cp - 1) 16-bit elements; the backward pass accumulates dQ
  and the chunk's dK, dV the same way.  Absent without CP."""
  app = llama(num_blocks=2)
  one = evaluation(app, H100, attention_kernel='flash')
  assert not [l for l in one.layers if l.name == 'AttnBlock_CP_Merge']
  cp4 = evaluation(app, H100, attention_kernel='flash', context_par=4)
  merge = [l for l in cp4.layers if l.name == 'AttnBlock_CP_Merge'][0]
  q = 32 * (8192 // 4) * 128             # local queries = local output
  kv = 2 * (8192 // 4) * 8 * 128         # local K and V chunk (GQA, 8)
  assert value(merge.mem_bytes('fw')) == q * (3 * 4 - 1) * 2
  assert value(merge.mem_bytes('agrad')) == (q + kv) * (3 * 4 - 1) * 2
  assert value(merge.processing_time_s('fw')) > 0
  # It is priced: the block's forward time includes it.
  assert value(cp4.block.fw_time) == pytest.approx(sum(
    value(l.processing_time_s('fw')) for l in cp4.layers
    if np.all(l.present)))


def test_context_parallel_must_split_the_sequence_evenly():
  with pytest.raises(ConfigError, match='2 x context_par must divide'):
    evaluation(llama(num_blocks=2, seq_size=8192 + 4), H100, context_par=4)


def test_vocabulary_on_first_and_last_stage():
  """Vocabulary-parallel embedding and LM head (Megatron-LM): V / TP rows per
  rank; the last stage keeps the fp32 softmax of its logits (b s V / TP x 4
  bytes); untied embeddings put one table on each end of the pipeline."""
  app = llama(num_blocks=4)
  tp = 2
  ev = evaluation(app, H100, tensor_par=tp, pipeline_par=2, batch_size=4)
  table = 128256 // tp * 4096
  assert value(ev.embed.weight_elems) == table
  assert value(ev.head.weight_elems) == table + 4096   # + the final norm
  logits = 8192 * 128256 // tp * 4
  assert value(ev.head_activation_bytes) >= logits
  assert value(ev.vocab_extra_time_s) > 0
  assert value(ev.total_time_s) > value(ev.total_time_s -
                                        ev.vocab_extra_time_s)
  # Tied embeddings on one stage share the table.
  tied = llama(num_blocks=4, tied_embeddings=True)
  one = evaluation(tied, H100, tensor_par=tp)
  assert value(one.head.weight_elems) == 4096
  two = evaluation(tied, H100, tensor_par=tp, pipeline_par=2, batch_size=4)
  assert value(two.head.weight_elems) == table + 4096


def test_transformer_engine_recipe():
  """Transformer Engine FP8: only the linear layers' GEMMs run in FP8; the
  attention core and norms stay 16-bit; weights keep a 16-bit copy plus an
  FP8 copy (3 bytes per linear weight)."""
  app = llama(num_blocks=2, seq_size=2048)
  uni = evaluation(app, H100, datatype='float8')
  te = evaluation(app, H100, datatype='float8',
                  precision_recipe='transformer_engine')
  by = lambda ev, n: [l for l in ev.layers if l.name == n][0]
  assert value(by(te, 'MlpBlock_Mlp1').weight_bytes()) == \
    3 * value(by(te, 'MlpBlock_Mlp1').weights)
  assert value(by(uni, 'MlpBlock_Mlp1').weight_bytes()) == \
    value(by(uni, 'MlpBlock_Mlp1').weights)
  core_te = by(te, 'AttnBlock_Multihead_Key_Query').flops_time_s('fw')
  core_uni = by(uni, 'AttnBlock_Multihead_Key_Query').flops_time_s('fw')
  assert value(core_te) == pytest.approx(2 * value(core_uni), rel=1e-9)
  assert value(by(te, 'MlpBlock_Mlp1').flops_time_s('fw')) == \
    value(by(uni, 'MlpBlock_Mlp1').flops_time_s('fw'))
  with pytest.raises(ConfigError, match='needs a narrow datatype'):
    evaluation(app, H100, precision_recipe='transformer_engine')


def test_fp8_casts_are_priced():
  """Transformer Engine FP8 casts (Layer.quantize_bytes): each narrow
  linear layer casts its 16-bit input in the forward pass and its output
  gradient in the backward pass, reading 2 bytes and writing 1 byte twice
  (row-wise and column-wise copies: FP8 GEMMs take only the TN layout;
  Transformer Engine, "Using FP8 with Transformer Engine"): 4 bytes per
  element, a separate memory-bound kernel added to the layer's time.  Keys
  and values share the query projection's cast (one fused QKV GEMM); the
  router, the LM head and the uniform recipe cast nothing."""
  app = llama(num_blocks=2, seq_size=2048)
  te = evaluation(app, H100, datatype='float8',
                  precision_recipe='transformer_engine')
  uni = evaluation(app, H100, datatype='float8')
  by = lambda ev, n: [l for l in ev.layers if l.name == n][0]
  m, h, up = 2048, 4096, 2 * 14336
  mlp1 = by(te, 'MlpBlock_Mlp1')
  assert value(mlp1.quantize_bytes('fw')) == 4 * m * h
  assert value(mlp1.quantize_bytes('agrad')) == 4 * m * up
  assert mlp1.quantize_bytes('wgrad') == 0.0
  assert value(by(te, 'MlpBlock_Mlp2').quantize_bytes('fw')) == 4 * m * 14336
  assert value(by(te, 'AttnBlock_Query').quantize_bytes('fw')) == 4 * m * h
  assert value(by(te, 'AttnBlock_Key').quantize_bytes('fw')) == 0.0
  assert value(by(te, 'AttnBlock_Key').quantize_bytes('agrad')) == \
    4 * m * 8 * 128
  cast_s = H100.mem1.time_s(4.0 * m * h)
  assert value(mlp1.processing_time_s('fw')) == pytest.approx(
    value(H100.processing_time_s(mlp1.flops_time_s('fw'),
                                 mlp1.kernel_mem_time_s('fw'))) + cast_s,
    rel=1e-12)
  assert value(mlp1.mem_bytes('fw')) == value(
    mlp1.kernel_mem_bytes('fw')) + 4 * m * h
  assert value(by(uni, 'MlpBlock_Mlp1').quantize_bytes('fw')) == 0.0
  moe = evaluation(Application.from_dict(dict(
    llama(num_blocks=2, seq_size=2048).to_dict(), num_experts=8, top_k=2,
    moe_ffn_hidden=14336)), H100, datatype='float8',
    precision_recipe='transformer_engine')
  assert by(moe, 'Moe_Router').quantize_bytes('fw') == 0.0
  experts = by(moe, 'Moe_Experts_Mlp1')
  assert value(experts.quantize_bytes('fw')) == 4 * value(experts.inputs)


def test_quantization_scaling_bytes():
  """Bytes per element cast: 2 read + 2 x 1 written for FP8 with delayed
  scaling; + 2 for current scaling's amax read; + one 1-byte scale per 32
  elements per copy for MXFP8 (OCP MX v1.0) and per 16 for NVFP4."""
  from calculon.config.execution import SCALING_NAMES
  from calculon.llm.model import quantize_bytes_per_element as q
  code = SCALING_NAMES.index
  assert q(2.0, 1.0, code('delayed')) == 4.0
  assert q(2.0, 1.0, code('current')) == 6.0
  assert q(2.0, 1.0, code('block')) == 4.0 + 2 / 32
  assert q(2.0, 0.5, code('block')) == 3.0 + 2 / 16
  # Inference writes only the row-wise copy.
  assert q(2.0, 1.0, code('delayed'), training=False) == 3.0
  app = llama(num_blocks=2, seq_size=2048)
  times = {s: value(evaluation(app, H100, datatype='float8',
                               precision_recipe='transformer_engine',
                               quantization_scaling=s).total_time_s)
           for s in SCALING_NAMES}
  assert times['delayed'] < times['block'] < times['current']
  with pytest.raises(ConfigError, match="field 'quantization_scaling' = "
                     '"amax" is not allowed'):
    Execution.from_dict(dict(BASE_EXE, quantization_scaling='amax'))
  with pytest.raises(ConfigError, match="field 'quantization_scaling' = "
                     '"current" is not allowed with precision_recipe = '
                     '"uniform": it needs precision_recipe = '
                     '"transformer_engine" \\(the casts it scales exist '
                     'only with that recipe\\)'):
    Execution.from_dict(dict(BASE_EXE, quantization_scaling='current'))


def test_fused_attention_head_width():
  """Fused attention's FLOP rate goes as d / (d + 39) in the head width d
  (softmax work per score does not grow with d): 0.81 of the width-128
  rate at 64 (FlashAttention-3 and cuDNN on H100, Shah et al. 2024,
  figures 5-6, from which 39 comes) and, out of that sample, 1.13x at 256
  (the paper's forward: 740 against 648 TFLOP/s, 1.14x)."""
  from calculon.llm.layers import head_dim_factor
  assert head_dim_factor(128, 128) == 1.0
  assert head_dim_factor(64, 64) == pytest.approx(0.81, abs=0.005)
  assert head_dim_factor(256, 256) == pytest.approx(740 / 648, rel=0.02)
  # The layer's time at width 64 over width 128 (same FLOP: twice the
  # heads), with the H100 file's fused-attention efficiency.
  by = lambda ev, n: [l for l in ev.layers if l.name == n][0]
  t = {}
  for d in (64, 128):
    app = llama(num_blocks=2, seq_size=4096, attn_size=d,
                attn_heads=4096 // d, kv_heads=4096 // d)
    ev = evaluation(app, H100_SXM, attention_kernel='flash')
    layer = by(ev, 'AttnBlock_FlashAttention')
    t[d] = value(layer.flops_time_s('fw')) / value(layer.flops('fw'))
  assert t[128] / t[64] == pytest.approx(head_dim_factor(64, 64), rel=1e-9)


def test_fused_attention_sequence_factor():
  """Fused attention slows below 16k tokens: a query tile visiting T key
  tiles runs at T / (T + 9.7) of its long-sequence rate, capped at the 16k
  rate.  Against the H100 measurements (docs/profile.md, "A GPU run"):
  FlashAttention-2 and cuDNN ran at 0.88/0.94, 0.74/0.74 and 0.52/0.52 of
  their 16k rates at 8k, 4k and 2k, and at 0.98/1.01 at 32k."""
  from calculon.llm.layers import (
    causal_tile_fraction, sequence_factor, window_tile_fraction)
  f = lambda s: float(sequence_factor(s, causal_tile_fraction(s)))
  measured = {2048: (0.52, 0.52), 4096: (0.74, 0.74), 8192: (0.88, 0.94),
              32768: (0.98, 1.01)}
  assert f(16384) == pytest.approx(1.0)
  for seq, (flash, cudnn) in measured.items():
    for m in (flash, cudnn):
      assert f(seq) == pytest.approx(m, rel=0.1), seq
  assert f(65536) == 1.0
  # A 128-token window leaves each query tile two key tiles.
  assert float(sequence_factor(4096, window_tile_fraction(4096, 128))) < 0.2
  # With context parallelism the kernel's local queries set T.
  assert float(sequence_factor(8192, causal_tile_fraction(65536))) < \
    f(65536)
  # The layer's time per FLOP at 4k over 16k, with the H100 file's
  # fused-attention efficiency: 1 / the factor.
  by = lambda ev, n: [l for l in ev.layers if l.name == n][0]
  rate = {}
  for seq in (4096, 16384):
    ev = evaluation(llama(num_blocks=2, seq_size=seq), H100_SXM,
                    attention_kernel='flash')
    layer = by(ev, 'AttnBlock_FlashAttention')
    rate[seq] = value(layer.flops_time_s('fw')) / value(layer.flops('fw'))
  assert rate[4096] / rate[16384] == pytest.approx(1 / f(4096), rel=1e-9)
  # A file without a fused-attention efficiency (the GEMMs' rate at 16k)
  # applies the factor too, as its calibration at an attention scale of 1
  # does (calculon/validation/calibrate.py, ScaledSystem).
  cfg = read_json_file(f'{ROOT}/systems/b300_datasheet.json')
  assert 'fused_attention_efficiency' not in cfg
  for seq in (4096, 16384):
    ev = evaluation(llama(num_blocks=2, seq_size=seq), System(cfg),
                    attention_kernel='flash')
    layer = by(ev, 'AttnBlock_FlashAttention')
    rate[seq] = value(layer.flops_time_s('fw')) / value(layer.flops('fw'))
  assert rate[4096] / rate[16384] == pytest.approx(1 / f(4096), rel=1e-9)


def test_recompute_modules_dense():
  """Megatron-Core's --recompute-modules (selective recomputation):
  'layernorm' recomputes both norms and keeps neither output (the QKV and
  MLP1 inputs); leaving 'core_attn' out keeps the attention core's inputs
  and does not recompute it; 'mlp' recomputes MLP1, SwiGLU and MLP2 from
  the MLP input, keeping neither the SwiGLU input nor the MLP2 input.
  Absent, the modules are ['core_attn']: Korthikanti et al.'s selective
  recomputation, unchanged."""
  app = llama(num_blocks=2, seq_size=2048)
  run = lambda **kw: evaluation(app, H100_SXM, activation_recompute='selective',
                                attention_kernel='flash', **kw)
  by = lambda ev, n: [l for l in ev.layers if l.name == n][0]
  fw = lambda ev, n: value(by(ev, n).processing_time_s('fw'))
  act = lambda ev, n: value(by(ev, n).activation_bytes())
  core = run()
  assert value(core.total_time_s) == value(
    run(recompute_modules=['core_attn']).total_time_s)
  assert value(core.block.re_time) == pytest.approx(
    fw(core, 'AttnBlock_FlashAttention'), rel=1e-12)
  norm = run(recompute_modules=['layernorm'])
  assert value(norm.block.re_time) == pytest.approx(
    fw(norm, 'AttnBlock_RMSNorm') + fw(norm, 'MlpBlock_RMSNorm'), rel=1e-12)
  assert value(norm.block.act_storage_bytes) == pytest.approx(
    value(core.block.act_storage_bytes) - act(core, 'AttnBlock_Multihead_Fork')
    - act(core, 'MlpBlock_Mlp1') + act(core, 'AttnBlock_FlashAttention'),
    rel=1e-12)
  mlp = run(recompute_modules=['core_attn', 'mlp'])
  assert value(mlp.block.re_time) == pytest.approx(
    fw(mlp, 'AttnBlock_FlashAttention') + fw(mlp, 'MlpBlock_Mlp1') +
    fw(mlp, 'MlpBlock_SwiGLU') + fw(mlp, 'MlpBlock_Mlp2'), rel=1e-12)
  assert value(mlp.block.act_storage_bytes) == pytest.approx(
    value(core.block.act_storage_bytes) - act(core, 'MlpBlock_SwiGLU') -
    act(core, 'MlpBlock_Mlp2'), rel=1e-12)
  assert value(mlp.total_time_s) > value(core.total_time_s)
  with pytest.raises(ConfigError, match="field 'recompute_modules' = "
                     r'\["moe"\] is not allowed with activation_recompute = '
                     '"full"'):
    evaluation(app, H100, activation_recompute='full',
               recompute_modules=['moe'])
  with pytest.raises(ConfigError, match="field 'recompute_modules' = "
                     r'\["attn"\] is not allowed: a non-empty list of '
                     'distinct names among core_attn, layernorm'):
    evaluation(app, H100, activation_recompute='selective',
               recompute_modules=['attn'])


def test_recompute_alternate_linears():
  """PyTorch's per-op selective checkpointing as torchtitan applies it
  (torchtitan models/llama3/infra/parallelize.py, selective_ac_option
  'op': mm, SDPA, reduce_scatter and max outputs saved except every second
  mm): of a Llama block's linears wq, wk, wv, wo, w1, w3, w2 the second,
  fourth and sixth (wk, wo, w3: K, the output projection and half the
  fused gate/up GEMM) are recomputed with every element-wise layer (both
  norms, RoPE, SwiGLU, the first residual); the attention core is not.
  For Llama 3 8B that is 8.4 + 33.5 + 117.4 = 159.4 M of the 436.2 M
  linear FLOP per token (2 x the weights), 36.5 %."""
  app = llama(num_blocks=2, seq_size=2048)
  run = lambda **kw: evaluation(app, H100_SXM, activation_recompute='selective',
                                attention_kernel='flash', **kw)
  by = lambda ev, n: [l for l in ev.layers if l.name == n][0]
  fw = lambda ev, n: value(by(ev, n).processing_time_s('fw'))
  flops = lambda ev, n: value(by(ev, n).flops('fw'))
  alt = run(recompute_modules=['alternate_linears'])
  linears = ('AttnBlock_Query', 'AttnBlock_Key', 'AttnBlock_Value',
             'AttnBlock_MLP', 'MlpBlock_Mlp1', 'MlpBlock_Mlp2')
  tokens = 2048  # microbatch 1
  assert sum(flops(alt, n) for n in linears) / tokens == pytest.approx(
    2 * (4096 * 4096 * 2 + 4096 * 1024 * 2 + 3 * 4096 * 14336), rel=1e-12)
  elementwise = ('AttnBlock_RMSNorm', 'AttnBlock_RoPE', 'AttnBlock_Residual',
                 'MlpBlock_RMSNorm', 'MlpBlock_SwiGLU')
  redone = [flops(alt, 'AttnBlock_Key'), flops(alt, 'AttnBlock_MLP'),
            flops(alt, 'MlpBlock_Mlp1') / 2]
  assert sum(redone) / tokens == pytest.approx(
    2 * (4096 * 1024 + 4096 * 4096 + 4096 * 14336), rel=1e-12)
  assert value(alt.block.re_flops) == pytest.approx(
    sum(redone) + sum(flops(alt, n) for n in elementwise), rel=1e-12)
  assert value(alt.block.re_time) == pytest.approx(
    fw(alt, 'AttnBlock_Key') + fw(alt, 'AttnBlock_MLP') +
    fw(alt, 'MlpBlock_Mlp1') / 2 + sum(fw(alt, n) for n in elementwise),
    rel=1e-12)
  # More recomputed than the attention core alone, less than everything.
  core, full = run(), evaluation(app, H100_SXM, activation_recompute='full',
                                 attention_kernel='flash')
  assert value(core.block.re_flops) < value(alt.block.re_flops) < value(
    full.block.re_flops)
  # The norm outputs are not kept (as with 'layernorm'), nor SwiGLU's
  # input: the saved w1 output (14,336 per token) is what recomputes the
  # product, which stands in the count as w2's input; w3's is recomputed.
  norm = run(recompute_modules=['layernorm'])
  assert value(alt.block.act_storage_bytes) == pytest.approx(
    value(norm.block.act_storage_bytes) - 2 * 14336 * tokens * 2, rel=1e-12)


def test_dp_overlap_over_context_parallel_ranks():
  """Gradients are reduced over the DP x CP ranks, so DP overlap is valid
  with data_par 1 and context_par 2 (the modern search emits such
  executions; they must read back), and not with both 1."""
  Execution.from_dict(dict(BASE_EXE, num_procs=2, context_par=2,
                           batch_size=1, data_par_overlap=True))
  with pytest.raises(ConfigError, match='data_par \\* context_par > 1'):
    Execution.from_dict(dict(BASE_EXE, data_par_overlap=True))


def test_calculon_files_mean_calculon():
  """No optional field: every statistic as before (the golden parity test
  covers Calculon's cases; here a modern-looking but Calculon-expressible
  execution gives the same numbers spelled both ways)."""
  app = Application.from_dict(GPT)
  old = evaluation(app, A100, tensor_par=2, data_par=4, batch_size=8,
                   optimizer_sharding=True, attention_type='multiquery')
  new = evaluation(Application.from_dict(dict(GPT, kv_heads=1)), A100,
                   tensor_par=2, data_par=4, batch_size=8,
                   data_par_sharding='gradients', attention_kernel='standard',
                   context_par=1, precision_recipe='uniform')
  assert value(old.total_time_s) == value(new.total_time_s)
  assert value(old.mem1_bytes) == value(new.mem1_bytes)


def test_bad_modern_fields_are_one_line_errors():
  with pytest.raises(ConfigError, match="field 'kv_heads' = 5 is not allowed"):
    Application.from_dict(dict(GPT, kv_heads=5))
  with pytest.raises(ConfigError, match="'mlp' = \"swiglu\" is not allowed"):
    Application.from_dict(dict(GPT, mlp='swiglu'))
  with pytest.raises(ConfigError, match='tied_embeddings.*needs vocab_size'):
    Application.from_dict(dict(GPT, tied_embeddings=True))
  with pytest.raises(ConfigError, match='data_par_sharding'):
    evaluation(Application.from_dict(GPT), A100, data_par=2, batch_size=2,
               optimizer_sharding=False, data_par_sharding='optimizer')
  with pytest.raises(ConfigError, match="field 'context_par' = 0 is not "
                     'allowed: an integer >= 1'):
    Execution.from_dict(dict(BASE_EXE, context_par=0))


@pytest.mark.parametrize('system', ['h100_sxm_80g', 'h100_80g_nvl8'])
def test_mlperf_gpt3_175b_fits_in_80_gb(system):
  """MLPerf Training GPT-3 175B as NVIDIA ran it on H100 (TP 4, PP 8,
  interleaving 12, microbatch 1, sequence parallelism, no recomputation,
  FlashAttention, distributed optimizer, FP8 with Transformer Engine; 512
  GPUs, global batch 2048): it ran, so it must fit in 80 GB.  Storing the
  s x s scores instead (Calculon's attention) does not."""
  app = Application.from_dict(read_json_file(
    f'{ROOT}/models/gpt3-175B-vocab.json'))
  sysm = System(read_json_file(f'{ROOT}/systems/{system}.json'))
  fields = dict(tensor_par=4, pipeline_par=8, data_par=16, batch_size=2048,
                microbatch_size=1, datatype='float8', fused_activation=True,
                pipeline_interleaving=12, data_par_sharding='optimizer',
                tensor_par_comm_type='rs_ag', tensor_par_overlap='pipe',
                data_par_overlap=True, tensor_par_net=0, pipeline_par_net=1,
                data_par_net=1, attention_kernel='flash',
                precision_recipe='transformer_engine',
                gradient_datatype='float32')
  ev = evaluation(app, sysm, **fields)
  assert bool(ev.feasible)
  assert value(ev.mem1_bytes) < 80 * 2 ** 30
  old = evaluation(app, sysm, **dict(fields, attention_kernel='standard'))
  assert not bool(old.feasible)


# -- rails: data-parallel collectives over the NICs of a node ---------------------
def _system(name, rails='file'):
  """A bundled system's datasheet file (systems/NAME_datasheet.json where
  the default is calibrated) without NCCL's per-step latencies;
  ``rails``: the file's, None (left out) or a value."""
  cfg = read_json_file(datasheet_path(ROOT, name))
  # The bandwidth model alone: one latency per operation (no NCCL steps).
  for net in cfg['networks']:
    net.pop('step_latency', None)
  if rails is None:
    cfg['networks'][1].pop('rails', None)
  elif rails != 'file':
    cfg['networks'][1]['rails'] = rails
  return System(cfg)


def _dp_transfer_s(system, tp, dp, sharding='optimizer'):
  """Seconds of one block's DP collectives minus their latencies."""
  ev = evaluation(llama(), system=system, tensor_par=tp, data_par=dp,
                  tensor_par_net=0, data_par_net=1, batch_size=dp,
                  datatype='bfloat16', data_par_sharding=sharding)
  lat = 2 * system.networks.latency_s[1]
  return value(ev.block_dp_time_s) - lat


@pytest.mark.parametrize('tp,share', [(1, 1 / 8), (2, 1 / 4), (4, 1 / 2),
                                      (8, 1.0)])
def test_rails_spread_dp_collectives_over_the_nodes_nics(tp, share):
  """An 8-GPU H100 node with one 400 Gb/s NIC per GPU (rails 8): a DP
  group with 8 / TP ranks per node crosses the network over 8 / TP NICs
  at once (NCCL rings cross each node once per channel, one NIC each:
  NVIDIA/nccl #601; two nodes reach 8 x 45 GB/s of all-reduce bus
  bandwidth, #1277): 1 / (8 / TP) of the time of Calculon's model, in
  which every rank sends its whole share over its own NIC.  NVLink
  (450 GB/s x 0.8) is faster than 8 NICs (8 x 50 GB/s x 0.75) here, so it
  does not bind; TP 8 leaves one rank per node: Calculon's time exactly."""
  flat = _dp_transfer_s(_system('h100_sxm_80g', rails=None), tp, 32)
  railed = _dp_transfer_s(_system('h100_sxm_80g'), tp, 32)
  assert railed == pytest.approx(share * flat, rel=1e-12)
  if tp == 8:
    assert railed == flat


def test_rails_are_capped_by_the_ring_hops_inside_the_domain():
  """GB200 NVL72: 64 DP ranks in one 72-GPU NVLink domain, DP on the
  network tier: 64 NICs would move 64 x 37.5 GB/s, but every ring hop
  inside the rack runs over NVLink at 900 x 0.8 GB/s, which binds."""
  flat = _dp_transfer_s(_system('gb200_nvl72', rails=None), 1, 64)
  railed = _dp_transfer_s(_system('gb200_nvl72'), 1, 64)
  assert railed == pytest.approx(flat * (50e9 * 0.75) / (900e9 * 0.8),
                                 rel=1e-12)


def test_rails_apply_to_fsdp_gathers_and_never_slow_a_run():
  """FSDP all-gathers / reduce-scatters use the same rule; more rails (or
  more ranks per node) never make a collective slower."""
  times = []
  for rails in (None, 1, 2, 4, 8, 16):
    ev = evaluation(llama(), system=_system('h100_sxm_80g', rails),
                    tensor_par=1, data_par=16, tensor_par_net=0,
                    data_par_net=1, batch_size=16, datatype='bfloat16',
                    data_par_sharding='parameters')
    times.append((value(ev.block_fsdp_fw_s), value(ev.block_fsdp_bw_s),
                  value(ev.total_time_s)))
  assert times[0] == times[1]                   # rails 1: Calculon's model
  for slower, faster in zip(times, times[1:]):
    assert all(f <= s for s, f in zip(slower, faster))
  assert times[4][0] < times[0][0] / 4          # 8 NICs (latency aside)


def test_fsdp_gathers_narrow_linear_weights_with_narrow_param_gather():
  """torchao's float8 linears with enable_fsdp_float8_all_gather cast each
  shard to float8 before FSDP2's all-gather (torchao/float8/fsdp_utils.py,
  fsdp_pre_all_gather), as Megatron-FSDP does with fp8_param_gather: with
  narrow_param_gather a block's all-gather carries its linear weights in
  1 byte and its norms in 2 -- the bytes the sharded optimizer's gather
  carries (DataTerms._param_gather_bytes).  Hand count for a Llama 3 8B
  block: 218,103,808 linear weights (4096 x (4096 + 2 x 1024) + 4096 x
  4096 + 3 x 4096 x 14336) and 8,192 norm weights; the gather time is the
  collective's for those bytes, the reduce-scatter unchanged."""
  system = _system('h100_sxm_80g')
  common = dict(tensor_par=1, data_par=16, tensor_par_net=0, data_par_net=1,
                batch_size=16, datatype='float8',
                precision_recipe='transformer_engine',
                data_par_sharding='parameters')
  wide = evaluation(llama(), system=system, **common)
  narrow = evaluation(llama(), system=system, narrow_param_gather=True,
                      **common)
  linear = 4096 * (4096 + 2 * 1024) + 4096 * 4096 + 3 * 4096 * 14336
  assert linear == 218103808
  b = narrow.block
  assert value(b.weight_elems) == linear + 2 * 4096
  g = narrow._dp_peers_per_domain(16, False)
  ag = system.networks.collective_time_s(
    'all_gather', linear * 1 + 2 * 4096 * 2, 16, 1, g)
  assert value(narrow.block_fsdp_fw_s) == pytest.approx(value(ag), rel=1e-12)
  ag16 = system.networks.collective_time_s(
    'all_gather', (linear + 2 * 4096) * 2, 16, 1, g)
  assert value(wide.block_fsdp_fw_s) == pytest.approx(value(ag16),
                                                      rel=1e-12)
  rs = value(wide.block_fsdp_bw_s) - value(wide.block_fsdp_fw_s)
  assert value(narrow.block_fsdp_bw_s) - value(narrow.block_fsdp_fw_s) == \
    pytest.approx(rs, rel=1e-12)


def test_fsdp_backward_hides_behind_the_recomputed_forward_too():
  """With full recomputation a block's backward starts with its
  recomputed forward; the all-gather prefetched for it and the reduce-
  scatter after it overlap all of that, slowed by the tier's processor
  share: exposed = max(0, comm - window) + min(comm, window) x usage,
  window = recompute + backward (PyTorch FSDP backward prefetch)."""
  system = _system('h100_sxm_80g')
  for recompute in ('none', 'full'):
    ev = evaluation(llama(), system=system, tensor_par=1, data_par=16,
                    tensor_par_net=0, data_par_net=1, batch_size=16,
                    datatype='bfloat16', data_par_sharding='parameters',
                    activation_recompute=recompute)
    b = ev.block
    comm = value(ev.block_fsdp_bw_s)
    window = value(b.agrad_time + b.wgrad_time + b.re_time)
    if recompute == 'none':
      assert value(b.re_time) == 0
    else:
      assert value(b.re_time) > 0
    usage = system.networks.usage(1)
    assert value(ev.block_fsdp_bw_exposed_s) == pytest.approx(
      max(0.0, comm - window) + min(comm, window) * usage, rel=1e-12)


def test_sliding_window_tiles_and_time():
  """A causal kernel computes n (n + 1) / 2 of the n^2 score tiles
  (n = s / 128); with a 128-token window each query tile needs its
  diagonal tile and the one before: (1 + 2 (n - 1)) / n^2 (63/1024 at
  4k tokens); a window as long as the sequence is causal.  gpt-oss
  windows half its blocks: the fused attention's FLOP is the mean of
  the two; standard attention computes the whole matrix either way."""
  from calculon.llm.layers import (attention_tile_fraction,
                                   causal_tile_fraction, window_tile_fraction)
  assert causal_tile_fraction(4096) == 33 / 64
  assert window_tile_fraction(4096, 128) == 63 / 1024
  assert window_tile_fraction(4096, 4096) == causal_tile_fraction(4096)
  assert window_tile_fraction(8192, 4096) == pytest.approx(
    sum(min(i, 32) + 1 for i in range(64)) / 64 ** 2)
  full = llama(seq_size=4096)
  half = llama(seq_size=4096, sliding_window=128, sliding_window_blocks=16)
  assert attention_tile_fraction(half) == pytest.approx(
    (63 / 1024 + 33 / 64) / 2)
  common = dict(data_par=8, batch_size=8, datatype='bfloat16',
                data_par_sharding='optimizer', attention_kernel='flash')

  def attn(app, **kw):
    ev = evaluation(app, system=H100_SXM, **dict(common, **kw))
    name = 'AttnBlock_' + ('FlashAttention' if kw.get(
      'attention_kernel', 'flash') == 'flash' else 'Multihead_Key_Query')
    layer = [x for x in ev.layers if x.name == name][0]
    return ev, value(layer.fw_flops)
  ev_full, f_full = attn(full)
  ev_half, f_half = attn(half)
  assert f_half / f_full == pytest.approx(attention_tile_fraction(half) /
                                          (33 / 64), rel=1e-12)
  assert value(ev_half.total_time_s) < value(ev_full.total_time_s)
  _, s_full = attn(full, attention_kernel='standard')
  _, s_half = attn(half, attention_kernel='standard')
  assert s_full == s_half
  with pytest.raises(ConfigError, match="'sliding_window_blocks' = 40 is "
                     r'not allowed: it must be <= num_blocks \(32\)'):
    llama(sliding_window=128, sliding_window_blocks=40)
  with pytest.raises(ConfigError, match="'sliding_window_blocks' = 2 is "
                     'not allowed: it needs sliding_window'):
    llama(sliding_window_blocks=2)


def test_fsdp2_buffer_copies_hand_count():
  """PyTorch FSDP2 copies each block's gathered weights out of the
  all-gather buffer before its forward and again before its backward
  (read + write, 16-bit), and its 16-bit gradients into the float32
  reduce-scatter input (read 2 B, write 4 B), on the compute stream
  (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py): Llama 3 8B's
  block has 218,112,000 weights (4096 x (4096 + 2 x 1024 + 4096) + 3 x
  4096 x 14336 + 2 x 4096), so 2 x 2 x W bytes forward, 4 W + 6 W
  backward, each at tier-1 bandwidth, added to the batch time once per
  block and microbatch."""
  system = _system('h100_sxm_80g')
  common = dict(tensor_par=1, data_par=16, tensor_par_net=0, data_par_net=1,
                batch_size=32, microbatch_size=1, datatype='bfloat16',
                data_par_sharding='parameters', gradient_datatype='float32')
  plain = evaluation(llama(), system=system, **common)
  copies = evaluation(llama(), system=system, fsdp_buffer_copies=True,
                      **common)
  w = 4096 * (4096 + 2 * 1024 + 4096) + 3 * 4096 * 14336 + 2 * 4096
  assert value(copies.block.weight_elems) == w
  mem = system.mem1
  fw = mem.time_s(4.0 * w)
  bw = mem.time_s(4.0 * w) + mem.time_s(6.0 * w)
  fw_s, bw_s = copies.block_fsdp_copy_s
  assert value(fw_s) == pytest.approx(fw, rel=1e-12)
  assert value(bw_s) == pytest.approx(bw, rel=1e-12)
  mult = 32 * 2                                 # blocks x microbatches
  assert value(copies.fsdp_copy_time_s) == pytest.approx(mult * (fw + bw),
                                                         rel=1e-12)
  assert value(copies.total_time_s - plain.total_time_s) == pytest.approx(
    mult * (fw + bw), rel=1e-9)
  assert value(plain.fsdp_copy_time_s) == 0
  # ~1.3 ms per block at 3.35 TB/s: a few % of a 8B block's ~45 ms.
  assert 0.5e-3 < fw + bw < 2e-3


def test_unfused_cross_entropy_hand_count():
  """cross_entropy_kernel 'unfused' (Megatron-LM vocab_parallel_cross_
  entropy without --cross-entropy-loss-fusion): per logit, forward the cast
  to float32 (2 + 4), max (4), subtract (4 + 4), exp (4 + 4), sum (4) and
  divide (4 + 4) = 38 bytes; backward the saved softmax scaled (4 + 4) and
  cast back (4 + 2) = 14; the fused kernel 4 + 6.  Llama 3 8B, 8,192
  tokens x 128,256 logits per microbatch: the loss's stage time grows by
  the memory time of the difference; float32 logits skip the casts."""
  common = dict(data_par=8, batch_size=8, datatype='bfloat16',
                data_par_sharding='optimizer')
  fused = evaluation(llama(), system=H100_SXM, **common)
  unfused = evaluation(llama(), system=H100_SXM,
                       cross_entropy_kernel='unfused', **common)
  logits = 8192 * 128256

  def loss(ev):
    return [x for x in ev.head_layers if x.name == 'Head_CrossEntropy'][0]
  for ev, fw, bw in ((fused, 4, 6), (unfused, 38, 14)):
    ce = loss(ev)
    assert value(ce.inputs) == logits
    assert value(ce.fw_mem_bytes()) == fw * logits
    assert value(ce.agrad_mem_bytes()) == bw * logits
  mem = H100_SXM.mem1
  extra = (mem.time_s(38.0 * logits) - mem.time_s(4.0 * logits) +
           mem.time_s(14.0 * logits) - mem.time_s(6.0 * logits))
  assert value(unfused.lm_head_time_s - fused.lm_head_time_s) == \
    pytest.approx(extra, rel=1e-9)
  assert 0.01 < extra < 0.02                    # ~13 ms at 3.35 TB/s
  ce = loss(unfused)
  ce.bpe = 4.0                                  # float32 logits
  assert value(ce.fw_mem_bytes()) == 32 * logits
  assert value(ce.agrad_mem_bytes()) == 8 * logits
  with pytest.raises(ConfigError, match='cross_entropy_kernel.* = "apex" '
                     'is not allowed: one of "fused", "unfused", "compiled", '
                     '"eager"'):
    Execution.from_dict(dict(BASE_EXE, cross_entropy_kernel='apex'))


def test_eager_cross_entropy_under_loss_parallel():
  """cross_entropy_kernel 'eager' (torchtitan's loss: PyTorch's
  cross_entropy on float32-cast logits, inside DTensor's loss_parallel()
  when TP > 1).  At TP 1 it is 'unfused' to the byte and the second.  At
  TP 8 its backward (torch/distributed/tensor/parallel/loss.py
  _nll_loss_and_log_softmax_backward: zeros_like(x), then (grad_input +
  exp(x)) * grad_output) holds four float32 logits buffers where PyTorch's
  own backward holds three: measured on an H200 with PyTorch 2.11
  (benchmarks/gpu_loss_memory.py, 16 x 8,192 x 16,032 logits, Llama 3 70B's
  per-rank vocabulary at TP 8), the backward peaked 3.000 and 4.001 float32
  logits buffers above the 16-bit logits.  The head's working set, what it
  keeps and its gradients grow by exactly one buffer; backward traffic per
  logit 4 + 8 + 12 + 8 + (4 + 2) = 38 bytes, against 14."""
  app = llama(hidden=8192, feedforward=28672, attn_heads=64, num_blocks=80)
  logits_tp1 = 8192 * 128256
  for tp in (1, 8):
    common = dict(tensor_par=tp, tensor_par_net=0, batch_size=1,
                  datatype='bfloat16')
    unfused = evaluation(app, system=H100_SXM, cross_entropy_kernel='unfused',
                         **common)
    eager = evaluation(app, system=H100_SXM, cross_entropy_kernel='eager',
                       **common)
    ce = [x for x in eager.head_layers if x.name == 'Head_CrossEntropy'][0]
    logits = logits_tp1 // tp
    assert value(ce.inputs) == logits
    assert value(ce.fw_mem_bytes()) == 38 * logits
    grew = value(eager.head_activation_bytes + eager.head.act_grad_bytes -
                 unfused.head_activation_bytes - unfused.head.act_grad_bytes)
    if tp == 1:
      assert grew == 0
      assert value(ce.agrad_mem_bytes()) == 14 * logits
      assert value(eager.total_time_s) == value(unfused.total_time_s)
      assert value(eager.mem1_bytes) == value(unfused.mem1_bytes)
    else:
      assert grew == 4 * logits                 # one float32 logits buffer
      assert value(ce.agrad_mem_bytes()) == 38 * logits
      assert value(eager.lm_head_time_s) > value(unfused.lm_head_time_s)


def test_separate_wgrad_accumulation_hand_count():
  """wgrad_accumulation 'separate' (Megatron-Core without
  gradient_accumulation_fusion: the weight-gradient GEMM writes a 16-bit
  gradient and the DDP hook adds it into the fp32 main gradient): per
  weight element of every layer with weights, 2 bytes read, 4 read and 4
  written each microbatch, a separate memory-bound kernel in the
  weight-gradient stage; nothing else moves.  With a bfloat16 gradient
  buffer (gradient_datatype), 2 + 2 + 2; under FSDP, which copies the
  gradient into the kept gradients (Megatron-FSDP main_grad.copy_), 2 + 2
  (kept in the datatype when gradient_datatype is absent)."""
  common = dict(data_par=8, batch_size=8, datatype='bfloat16',
                data_par_sharding='optimizer')
  fused = evaluation(llama(), system=H100_SXM, **common)
  separate = evaluation(llama(), system=H100_SXM,
                        wgrad_accumulation='separate', **common)
  mem = H100_SXM.mem1
  extra = 0.0
  for layer in separate.layers:
    if value(layer.weight_grads) and value(layer.present):
      assert value(layer.accumulate_bytes('wgrad')) == \
        10 * value(layer.weight_grads)
      extra += value(mem.time_s(10.0 * layer.weight_grads))
    assert value(layer.accumulate_bytes('fw')) == 0
  assert extra > 0
  assert value(separate.block.wgrad_time - fused.block.wgrad_time) == \
    pytest.approx(extra, rel=1e-9)
  assert value(separate.block.fw_time) == value(fused.block.fw_time)
  assert value(separate.mem1_bytes) == value(fused.mem1_bytes)
  narrow = evaluation(llama(), system=H100_SXM, wgrad_accumulation='separate',
                      gradient_datatype='bfloat16', **common)
  qkv = [x for x in narrow.layers if x.weight_grads is not None
         and value(x.weight_grads)][0]
  assert value(qkv.accumulate_bytes('wgrad')) == 6 * value(qkv.weight_grads)
  fsdp = evaluation(llama(), system=H100_SXM, wgrad_accumulation='separate',
                    data_par=8, batch_size=8, datatype='bfloat16',
                    data_par_sharding='parameters')
  qkv = [x for x in fsdp.layers if x.weight_grads is not None
         and value(x.weight_grads)][0]
  assert value(qkv.accumulate_bytes('wgrad')) == 4 * value(qkv.weight_grads)


def test_compiled_cross_entropy_keeps_sixteen_bit_logits():
  """cross_entropy_kernel 'compiled' (torchtitan since bbb1b616e:
  torch.compile of cross_entropy on float32-cast logits): Inductor keeps
  the 16-bit logits and writes a 16-bit gradient, the LM head's output
  gradient.  Llama 3 8B, 8,192 tokens x 128,256 logits: the head keeps
  one 16-bit logits tensor (no working copy) where the eager loss keeps a
  float32 softmax twice (working and stored), and the loss's own gradient
  is the LM head's; traffic 4 bytes per logit each way."""
  common = dict(data_par=8, batch_size=8, datatype='bfloat16',
                data_par_sharding='optimizer')
  unfused = evaluation(llama(), system=H100_SXM,
                       cross_entropy_kernel='unfused', **common)
  compiled = evaluation(llama(), system=H100_SXM,
                        cross_entropy_kernel='compiled', **common)
  logits = 8192 * 128256
  ce = [x for x in compiled.head_layers if x.name == 'Head_CrossEntropy'][0]
  assert value(ce.activation_bytes()) == 2 * logits
  assert value(ce.activation_grad_bytes()) == 0
  assert value(ce.fw_mem_bytes()) == 4 * logits
  assert value(ce.agrad_mem_bytes()) == 4 * logits
  saved = value(unfused.head_activation_bytes -
                compiled.head_activation_bytes)
  assert saved == 2 * 4 * logits - 2 * logits
  grads = value(unfused.head.act_grad_bytes - compiled.head.act_grad_bytes)
  assert grads == 2 * logits


def test_fsdp_buffer_copies_need_fsdp():
  exe = dict(BASE_EXE, num_procs=8, data_par=8, batch_size=8,
             data_par_sharding='optimizer', fsdp_buffer_copies=True)
  exe.pop('optimizer_sharding')
  with pytest.raises(ConfigError, match='fsdp_buffer_copies.*"parameters"'):
    Execution.from_dict(exe)
  exe['data_par_sharding'] = 'parameters'
  assert Execution.from_dict(exe).fsdp_buffer_copies is True


def test_param_gather_hides_behind_the_next_forward():
  """Megatron-Core's distributed optimizer with --overlap-param-gather
  gathers each bucket of updated weights just before its first forward
  use: the all-gather leaves the backward windows (where Calculon's model
  puts it with the reduce-scatter) and hides behind the forward, the first
  block's showing: exposed = g + max(0, (n-1) g - (n-1) f) + min(...) u
  per stage of n blocks without interleaving.  The traffic on the link is
  the same; absent (false), the model is Calculon's."""
  from calculon.llm.model import _hidden_behind
  system = _system('h100_sxm_80g', rails=None)    # one NIC: DP-bound
  common = dict(tensor_par=1, data_par=16, tensor_par_net=0,
                data_par_net=1, batch_size=16, datatype='bfloat16',
                data_par_sharding='optimizer', data_par_overlap=True)
  calc = evaluation(llama(), system=system, **common)
  meg = evaluation(llama(), system=system, param_gather_overlap=True,
                   **common)
  assert value(calc._dp_gather_forward_s) == 0.0
  assert value(meg.dp_comm_link_time_s) == pytest.approx(
    value(calc.dp_comm_link_time_s), rel=1e-12)
  g = value(meg._dp_gather_forward_s)
  assert 0 < g < value(meg.block_dp_time_s)
  n, f = value(meg.blocks_per_chunk), value(meg.block.fw_time)
  usage = system.networks.usage(1)
  assert value(meg._dp_gather_exposed_s) == pytest.approx(
    g + value(_hidden_behind((n - 1) * g, (n - 1) * f, usage)), rel=1e-12)
  assert value(meg.dp_comm_exposed_time_s) < value(
    calc.dp_comm_exposed_time_s)
  # Without DP overlap the field changes nothing.
  plain = dict(common, data_par_overlap=False)
  assert value(evaluation(llama(), system=system, param_gather_overlap=True,
                          **plain).total_time_s) == value(
    evaluation(llama(), system=system, **plain).total_time_s)
  # The field round-trips through the execution JSON.
  from calculon.config import Execution
  exe = dict(BASE_EXE, **common, param_gather_overlap=True)
  exe.pop('optimizer_sharding', None)
  exe['num_procs'] = 16
  assert Execution.from_dict(exe).param_gather_overlap is True


def test_bad_rails_is_a_one_line_error():
  cfg = read_json_file(f'{ROOT}/systems/h100_sxm_80g.json')
  cfg['networks'][1]['rails'] = 0
  with pytest.raises(ConfigError, match=r"networks\[1\]\.rails' = 0 .*>= 1"):
    System(cfg, 'h100.json')


def test_tp_async_backward_hides_input_gradient_communication():
  """Megatron-LM's column-parallel linear (LinearWithGradAccumulationAnd-
  AsyncCommunication.backward, on unless --no-async-tensor-model-parallel-
  allreduce) issues the all-reduce of its input gradient and then computes
  its weight gradient: f's backward all-reduce shows only past the
  weight-gradient GEMMs of the layers it feeds (Q, K, V; the MLP's first
  GEMM), which it slows by the tier's processor share.  With sequence
  parallelism the redone all-gather of the input hides behind the
  input-gradient GEMMs the same way.  The forward pass and the traffic on
  the link are unchanged; absent (false), the model is Calculon's."""
  from calculon.llm.layers import hidden_behind
  common = dict(tensor_par=8, tensor_par_net=0, batch_size=1)
  calc = evaluation(llama(), **common)
  meg = evaluation(llama(), tensor_par_async_backward=True, **common)
  usage = A100.networks.usage(0)
  layers = {layer.name: layer for layer in meg.block._layers}
  # Hand count of one weight-gradient GEMM: 2 m n k FLOP, m = 8192 tokens.
  assert value(layers['MlpBlock_Mlp1'].flops('wgrad')) == \
    2 * 8192 * 4096 * (2 * 14336 // 8)
  exposed = 0.0
  for f, gemms in (('AttnBlock_F', ('AttnBlock_Query', 'AttnBlock_Key',
                                    'AttnBlock_Value')),
                   ('MlpBlock_F', ('MlpBlock_Mlp1',))):
    comm = value(layers[f].net_time_s('agrad', False))
    window = sum(value(layers[g].processing_time_s('wgrad')) for g in gemms)
    assert comm > 0 and window > 0
    exposed += value(hidden_behind(comm, window, usage))
  calc_exposed = value(calc.block.base_agrad_tp_exposed)
  assert value(meg.block.base_agrad_tp_exposed) == pytest.approx(
    calc_exposed - sum(value(layers[f].net_time_s('agrad', False))
                       for f in ('AttnBlock_F', 'MlpBlock_F')) + exposed,
    rel=1e-12)
  assert value(meg.block.fw_time) == value(calc.block.fw_time)
  assert value(meg.block.base_agrad_tp_time) == value(
    calc.block.base_agrad_tp_time)
  assert value(meg.total_time_s) < value(calc.total_time_s)
  # Sequence parallelism: the redone all-gather hides behind the input
  # gradients; a recomputed forward pass's all-gather does not.
  sp = dict(common, tensor_par_comm_type='rs_ag', seq_par_ag_redo=True)
  calc_sp = evaluation(llama(), **sp)
  meg_sp = evaluation(llama(), tensor_par_async_backward=True, **sp)
  assert value(meg_sp.block.base_recomm_time) == value(
    calc_sp.block.base_recomm_time) > 0
  assert value(meg_sp.block.base_recomm_exposed) < value(
    calc_sp.block.base_recomm_exposed)
  full = dict(common, tensor_par_comm_type='rs_ag',
              activation_recompute='full')
  assert value(evaluation(llama(), tensor_par_async_backward=True, **full)
               .block.base_recomm_exposed) == value(
    evaluation(llama(), **full).block.base_recomm_exposed)
  # Without TP there is nothing to hide.
  assert value(evaluation(llama(), tensor_par_async_backward=True,
                          batch_size=1).total_time_s) == value(
    evaluation(llama(), batch_size=1).total_time_s)


def test_untiled_rs_dgrad_exposes_the_input_gradient_reduce_scatter():
  """PyTorch's micro-pipeline TP decomposes a reduce-scatter only when one
  matmul produces its input (torch/_inductor/fx_passes/micro_pipeline_tp.py,
  fuse_matmul_reduce_scatter / _find_producer_matmul); torchtitan's Llama
  sums the input gradients of wq, wk, wv (and of w1, w3) before the
  sequence-parallel reduce-scatter, which then runs whole.  With
  tensor_par_overlap_rs_dgrad false, the backward reduce-scatter of the two
  column-parallel layers (QKV, the MLP's first GEMM) is exposed in full and
  their input-gradient GEMMs run untiled; the forward pass, the traffic
  and the row-parallel layers' backward all-gathers are unchanged."""
  common = dict(tensor_par=8, tensor_par_net=0, batch_size=1,
                tensor_par_comm_type='rs_ag', tensor_par_overlap='ring')
  tiled = evaluation(llama(), **common)
  untiled = evaluation(llama(), tensor_par_overlap_rs_dgrad=False, **common)
  t = {layer.name: layer for layer in tiled.block._layers}
  u = {layer.name: layer for layer in untiled.block._layers}
  column = ('AttnBlock_QKV_AG', 'MlpBlock_Mlp1_AG')
  row = ('AttnBlock_MLP_RS', 'MlpBlock_Mlp2_RS')
  for name in column:
    rs = value(u[name].net_time_s('agrad', False))
    # The reduce-scatter of the whole input gradient: 8192 tokens x 4096 x 2 B.
    assert value(u[name].comm_bytes('agrad', False)) == 8192 * 4096 * 2
    assert value(u[name].exposed_time_for_stage_s('agrad')) == rs > 0
    assert value(t[name].exposed_time_for_stage_s('agrad')) < rs
    assert value(u[name].processing_time_s('agrad')) == pytest.approx(
      value(A100.processing_time_s(u[name].flops_time_s('agrad'),
                                   u[name].kernel_mem_time_s('agrad'))),
      rel=1e-12)
  for name in row:
    assert value(u[name].exposed_time_for_stage_s('agrad')) == value(
      t[name].exposed_time_for_stage_s('agrad'))
  for name in column + row:
    assert value(u[name].exposed_time_for_stage_s('fw')) == value(
      t[name].exposed_time_for_stage_s('fw'))
  assert value(untiled.block.fw_time) == value(tiled.block.fw_time)
  assert value(untiled.block.base_agrad_tp_time) == value(
    tiled.block.base_agrad_tp_time)
  assert value(untiled.block.base_agrad_tp_exposed) > value(
    tiled.block.base_agrad_tp_exposed)
  assert value(untiled.total_time_s) > value(tiled.total_time_s)
  # It qualifies a tiled overlap only.
  exe = dict(BASE_EXE, num_procs=8, tensor_par=8, batch_size=1,
             tensor_par_overlap_rs_dgrad=False)
  with pytest.raises(ConfigError, match='tensor_par_overlap_rs_dgrad.*"ring"'):
    Execution.from_dict(exe)
  exe['tensor_par_overlap'] = 'ring'
  assert Execution.from_dict(exe).tensor_par_overlap_rs_dgrad is False


def test_tp_overlap_efficiency_runs_between_plain_and_tiled_tp():
  """tensor_par_overlap_efficiency e places a tiled GEMM's time and its
  exposed communication at e of the way from the plain TP layers' (the
  same GEMM run whole, then Megatron's g: its reduce-scatter and that
  layer's own pass) to Calculon's tiling.  At 0 the row-parallel
  attention projection costs its GEMM untiled (in the forward pass
  exactly the plain TP block's 'AttnBlock_MLP') plus what 'AttnBlock_G'
  costs and exposes; at 1 it is the tiled layer; at 0.5 midway; and the
  step time grows as e falls."""
  common = dict(tensor_par=8, tensor_par_net=0, batch_size=1,
                tensor_par_comm_type='rs_ag')
  plain = evaluation(llama(), **common)
  runs = {e: evaluation(llama(), tensor_par_overlap='ring',
                        tensor_par_overlap_efficiency=e, **common)
          for e in (0.0, 0.5, 1.0)}
  tiled = evaluation(llama(), tensor_par_overlap='ring', **common)
  p = {layer.name: layer for layer in plain.block._layers}
  layer = {e: {x.name: x for x in ev.block._layers}['AttnBlock_MLP_RS']
           for e, ev in runs.items()}
  t = {x.name: x for x in tiled.block._layers}['AttnBlock_MLP_RS']
  for stage in ('fw', 'agrad'):
    # The GEMM untiled, as the layer counts its traffic (in the forward
    # pass the plain block's 'AttnBlock_MLP' exactly).
    gemm = value(A100.processing_time_s(layer[0.0].flops_time_s(stage),
                                        layer[0.0].kernel_mem_time_s(stage)))
    if stage == 'fw':
      assert gemm == value(p['AttnBlock_MLP'].processing_time_s(stage))
    comm = p['AttnBlock_G']
    assert value(layer[0.0].processing_time_s(stage)) == pytest.approx(
      gemm + value(comm.processing_time_s(stage)), rel=1e-12)
    assert value(layer[0.0].exposed_time_for_stage_s(stage)) == \
      pytest.approx(value(comm.net_time_s(stage, False)), rel=1e-12)
    assert value(layer[1.0].processing_time_s(stage)) == value(
      t.processing_time_s(stage))
    assert value(layer[1.0].exposed_time_for_stage_s(stage)) == value(
      t.exposed_time_for_stage_s(stage))
    for get in (lambda x: x.processing_time_s(stage),
                lambda x: x.exposed_time_for_stage_s(stage)):
      assert value(get(layer[0.5])) == pytest.approx(
        (value(get(layer[0.0])) + value(get(layer[1.0]))) / 2, rel=1e-12)
  totals = [value(runs[e].total_time_s) for e in (0.0, 0.5, 1.0)]
  assert totals[0] > totals[1] > totals[2] == value(tiled.total_time_s)
  # It qualifies a tiled overlap only.
  exe = dict(BASE_EXE, num_procs=8, tensor_par=8, batch_size=1,
             tensor_par_overlap_efficiency=0.5)
  with pytest.raises(ConfigError,
                     match='tensor_par_overlap_efficiency.*"ring"'):
    Execution.from_dict(exe)
  exe['tensor_par_overlap'] = 'ring'
  assert Execution.from_dict(exe).tensor_par_overlap_efficiency == 0.5


def test_narrow_all_gather_moves_float8_bytes():
  """torchao's float8 tensor-parallel styles, which torchtitan applies
  with float8 and TP (PrepareFloat8ModuleInput, Float8ColwiseParallel,
  Float8RowwiseParallel), cast the block input to float8 before its
  sequence-parallel all-gather and a row-parallel layer's output gradient
  before its backward all-gather: those move 1 byte per element, the
  reduce-scatters 2.  Hand count for TP 8, 8192 tokens x 4096: f's
  forward all-gather and its recomputation 32 MiB (64 MiB in 16-bit), g's
  backward all-gather 32 MiB, every reduce-scatter 64 MiB."""
  common = dict(tensor_par=8, tensor_par_net=0, batch_size=1,
                datatype='float8', precision_recipe='transformer_engine',
                tensor_par_comm_type='rs_ag', activation_recompute='full')
  wide = evaluation(llama(), H100, **common)
  narrow = evaluation(llama(), H100, tensor_par_narrow_all_gather=True,
                      **common)
  w = {layer.name: layer for layer in wide.block._layers}
  n = {layer.name: layer for layer in narrow.block._layers}
  act = 8192 * 4096
  for f in ('AttnBlock_F', 'MlpBlock_F'):
    assert value(w[f].comm_bytes('fw', False)) == 2 * act
    assert value(n[f].comm_bytes('fw', False)) == act
    assert value(n[f].comm_bytes('wgrad', False)) == act
    assert value(n[f].comm_bytes('agrad', False)) == 2 * act
  for g in ('AttnBlock_G', 'MlpBlock_G'):
    assert value(n[g].comm_bytes('fw', False)) == 2 * act
    assert value(n[g].comm_bytes('agrad', False)) == act
    assert value(n[g].comm_bytes('wgrad', False)) == 2 * act
  assert value(narrow.block.fw_flops) == value(wide.block.fw_flops)
  assert value(narrow.total_time_s) < value(wide.total_time_s)
  # Tiled overlap: the column-parallel layers gather narrow, the
  # row-parallel ones' backward all-gather too; reduce-scatters 16-bit.
  ring = dict(common, tensor_par_overlap='ring')
  n = {layer.name: layer for layer in evaluation(
    llama(), H100, tensor_par_narrow_all_gather=True, **ring).block._layers}
  assert value(n['MlpBlock_Mlp1_AG'].comm_bytes('fw', False)) == act
  assert value(n['MlpBlock_Mlp1_AG'].comm_bytes('agrad', False)) == 2 * act
  assert value(n['MlpBlock_Mlp2_RS'].comm_bytes('fw', False)) == 2 * act
  assert value(n['MlpBlock_Mlp2_RS'].comm_bytes('agrad', False)) == act
  # Only the narrow recipe has narrow GEMM inputs to gather.
  exe = dict(BASE_EXE, num_procs=8, tensor_par=8, batch_size=1,
             tensor_par_narrow_all_gather=True)
  with pytest.raises(ConfigError,
                     match='tensor_par_narrow_all_gather.*transformer_engine'):
    Execution.from_dict(exe)


def test_wide_saved_inputs_keep_sixteen_bit_linear_inputs():
  """torchao's Float8Linear saves the 16-bit input for the backward pass
  (matmul_with_hp_or_float8_args: save_for_backward(input_hp, ...), since
  pytorch/ao e76db70ec), Transformer Engine the float8 one: a Llama 3 8B
  block at 8192 tokens, TP 1, keeps one more byte per element of the
  inputs the linear layers keep themselves -- the output projection's
  (8192 x 4096), the MLP's gate/up (8192 x 4096) and down projection's
  (8192 x 14336); Q, K and V read the norm output, which the attention's
  fork keeps in 16 bits either way -- and nothing else changes (the
  time, the float8 TP all-gathers)."""
  common = dict(datatype='float8', precision_recipe='transformer_engine',
                batch_size=1, attention_kernel='flash')
  te = evaluation(llama(), H100, **common)
  ao = evaluation(llama(), H100, wide_saved_inputs=True, **common)
  extra = 8192 * (4096 + 4096 + 14336)
  assert value(ao.block.act_storage_bytes - te.block.act_storage_bytes) \
    == extra
  assert value(ao.total_time_s) == value(te.total_time_s)
  exe = dict(BASE_EXE, wide_saved_inputs=True)
  with pytest.raises(ConfigError,
                     match='wide_saved_inputs.*transformer_engine'):
    Execution.from_dict(exe)


def test_sharded_optimizer_gathers_parameters_not_narrow_copies():
  """Under Transformer Engine the DP reduce-scatter moves the gradients of
  the 16-bit weights, and Megatron-Core's distributed optimizer all-gathers
  its parameter
  buffer (megatron/core/distributed/param_and_grad_buffer.py): the 16-bit
  weights, Transformer Engine casting its FP8 copy after the gather (the
  FP8 copy is kept, not sent); with --fp8-param-gather (narrow_param_gather)
  the linear layers' weights travel in FP8.  Hand count for one Llama 3 8B
  block: linear weights 4096 x (4096 + 2 x 1024) + 4096 x 4096 + 3 x 4096
  x 14336, two RMSNorm weights of 4096."""
  linear = 4096 * (4096 + 2 * 1024) + 4096 * 4096 + 3 * 4096 * 14336
  other = 2 * 4096
  common = dict(data_par=8, batch_size=8, datatype='float8',
                precision_recipe='transformer_engine',
                data_par_sharding='optimizer')
  te = evaluation(llama(), H100, **common)
  b = te.block
  assert value(b.weight_elems) == linear + other
  # Kept: 2 + 1 bytes per linear weight, 2 per norm weight.
  assert value(b.weight_bytes) == 3 * linear + 2 * other
  assert value(te._param_gather_bytes(b.weight_bytes, b.weight_elems)) == \
    2 * (linear + other)
  # The gradients are those of the 16-bit weights: 2 bytes each.
  assert value(te._grad_reduce_bytes(b)) == 2 * (linear + other)
  fp8 = evaluation(llama(), H100, narrow_param_gather=True, **common)
  assert value(fp8._param_gather_bytes(b.weight_bytes, b.weight_elems)) == \
    linear + 2 * other
  assert value(fp8.total_time_s) <= value(te.total_time_s)
  # Calculon's recipes gather what they keep (unchanged).
  uni = evaluation(llama(), H100, **dict(common, datatype='float16',
                                         precision_recipe='uniform'))
  ub = uni.block
  assert value(uni._param_gather_bytes(ub.weight_bytes, ub.weight_elems)) \
    == value(ub.weight_bytes) == 2 * (linear + other)
  exe = dict(BASE_EXE, num_procs=8, data_par=8, batch_size=8,
             narrow_param_gather=True)
  with pytest.raises(ConfigError, match='narrow_param_gather.*transformer'):
    Execution.from_dict(exe)


def test_pipeline_split_counting_vocab_moves_a_block_off_each_end():
  """Megatron-Core's --account-for-embedding-in-pipeline-split and
  --account-for-loss-in-pipeline-split (transformer_block.py,
  get_num_layers_to_build) split L + 2 slots evenly and build one block
  less on the first and the last stage, whose embedding and LM head take
  the slot: the Llama 3.1 405B recipes of Megatron-Bridge (126 blocks, PP
  16: 128 / 16 = 8 slots a stage) and the Qwen3-235B-A22B ones (94 blocks)
  set both.  Hand count: the end stages add E - b and H - b (E, H the
  embedding's and the head's forward + backward seconds of a microbatch, b
  a block's), the steady state max(E - b, H - b, 0) per microbatch; the
  blocks' compute is unchanged and the split no longer has the two
  one-block-short stages that shortened the bubble."""
  app = llama(num_blocks=30, vocab_size=128256)
  common = dict(pipeline_par=8, pipeline_par_net=0, batch_size=16)
  plain = evaluation(app, **common)
  split = evaluation(app, pipeline_split_counts_vocab=True, **common)
  # 30 blocks: ceil(30 / 8) = 4 a stage either way; 32 slots split evenly.
  assert value(plain.blocks_per_proc) == value(split.blocks_per_proc) == 4
  assert value(plain.bubble_reduction_blocks) == 2
  assert value(split.bubble_reduction_blocks) == 0
  e = value(split._stage_time_s(split.embed))
  h = value(split._stage_time_s(split.head))
  b = value(split.baseblock_fw_time_no_offload_s +
            split.baseblock_bw_time_no_offload_s)
  nmb = 16
  assert value(split.vocab_time_s) == pytest.approx(
    (nmb - 1) * max(e - b, h - b, 0) + (e - b) + (h - b), rel=1e-12)
  assert value(plain.vocab_time_s) == pytest.approx(
    (nmb - 1) * max(e, h) + e + h, rel=1e-12)
  # Llama 3 8B's head (4096 x 128256) costs more than one of its blocks.
  assert h > b > e
  assert value(split.fw_time_s) == value(plain.fw_time_s)
  assert value(split.total_time_s) < value(plain.total_time_s)
  # With PP = 1 there is no split: the flag means nothing.
  one = dict(common, pipeline_par=1)
  assert value(evaluation(app, pipeline_split_counts_vocab=True, **one)
               .total_time_s) == value(evaluation(app, **one).total_time_s)


def test_pipeline_overlap_hides_the_steady_state_transfers():
  """Megatron-Core's interleaved schedule with overlap_p2p_comm
  (pipeline_parallel/schedules.py): the first stage's warm-up runs
  w = 2 (PP - 1) + (VP - 1) PP forward chunk steps and its flush as many
  backward ones, their transfers blocking; each of the other m VP - w
  steps sends a chunk's activation and a gradient behind a forward and a
  backward chunk's compute.  Hand count: PP 4, VP 2, 16 microbatches:
  w = 6 + 4 = 10 of 32 chunk steps exposed, 22 hidden (processor share
  slowing the compute they overlap).  Without interleaving, or not
  training, or absent, every transfer shows, as Calculon prices it."""
  from calculon.llm.model import _hidden_behind
  app = llama(num_blocks=32)
  system = _system('h100_sxm_80g')
  common = dict(pipeline_par=4, pipeline_par_net=1, pipeline_interleaving=2,
                batch_size=16, datatype='bfloat16')
  calc = evaluation(app, system=system, **common)
  meg = evaluation(app, system=system, pipeline_par_overlap=True, **common)
  link = value(calc.pp_comm_link_time_s)
  assert value(calc.pp_comm_exposed_time_s) == link > 0
  assert value(meg.pp_comm_link_time_s) == link
  assert value(meg.pp_warmup_chunks) == 10
  step = value(meg.chunk_fw_pp_time_s + meg.chunk_bw_pp_time_s)
  assert link == pytest.approx(32 * step, rel=1e-12)
  window = value(meg.chunk_fw_time_s + meg.chunk_bw_time_s)
  usage = system.networks.usage(1)
  assert value(meg.pp_comm_exposed_time_s) == pytest.approx(
    10 * step + value(_hidden_behind(22 * step, 22 * window, usage)),
    rel=1e-12)
  assert value(meg.total_time_s) < value(calc.total_time_s)
  # The plain 1F1B schedule runs without it (Megatron-LM turns it off).
  flat = dict(common, pipeline_interleaving=1)
  assert value(evaluation(app, system=system, pipeline_par_overlap=True,
                          **flat).total_time_s) == value(
    evaluation(app, system=system, **flat).total_time_s)
  # The forward-only schedule is all warm-up.
  infer = dict(common, training=False)
  assert value(evaluation(app, system=system, pipeline_par_overlap=True,
                          **infer).pp_comm_exposed_time_s) == value(
    evaluation(app, system=system, **infer).pp_comm_exposed_time_s)


def test_fused_dropout_add_moves_only_the_mask_forward():
  """Megatron-LM's bias_dropout_add_fused_train (on by default since
  9acc895632, January 2021) applies the hidden dropout inside the
  residual addition's kernel: the dropout's own forward kernel, which read
  s elements and wrote s elements and an s-byte mask, is left with the
  mask (s bytes); its backward (gradient times mask) is unchanged.  Hand
  count for Megatron 22B at TP 8, microbatch 4, sequence 2048, float16:
  s = 4 x 2048 x 6144 elements per dropout, two dropouts a block.
  Absent, Calculon's separate kernel; without dropout it changes
  nothing."""
  app = Application.from_dict(
    read_json_file(f'{ROOT}/models/megatron-22B.json'))
  common = dict(tensor_par=8, batch_size=4, microbatch_size=4,
                tensor_par_comm_type='ar')
  calc = evaluation(app, **common)
  fused = evaluation(app, fused_dropout_add=True, **common)
  s = 4 * 2048 * 6144
  from calculon.config.execution import DATATYPE_NAMES
  fp16 = DATATYPE_NAMES.index('float16')
  unfused = A100.processing_time_s(A100.vector.time_s(fp16, s),
                                   A100.mem1.time_s(2 * s * 2 + s))
  saved = 2 * (value(unfused) - value(A100.processing_time_s(
    0.0, A100.mem1.time_s(s))))
  assert value(calc.block.fw_time) - value(fused.block.fw_time) == \
    pytest.approx(saved, rel=1e-9)
  assert value(fused.block.agrad_time) == value(calc.block.agrad_time)
  assert value(fused.total_time_s) < value(calc.total_time_s)
  nodrop = Application.from_dict(dict(read_json_file(
    f'{ROOT}/models/megatron-22B.json'), dropout=False))
  assert value(evaluation(nodrop, fused_dropout_add=True, **common)
               .total_time_s) == value(evaluation(nodrop, **common)
                                       .total_time_s)


def test_fused_adam_traffic_counts_every_pass_of_the_step():
  """A framework's mixed-precision Adam step moves, per parameter of its
  shard: the gradient norm's read (4 bytes), the fused Adam kernel's
  reads of gradient, master weight and two moments and writes of the last
  three (28: apex multi_tensor_adam.cu, PyTorch _fused_adamw_), the copy
  of the fp32 master weights into the 16-bit weights (4 + 2: Megatron-LM
  _copy_main_params_to_model_params) and, with float16, the loss scale's
  unscaling (8: _unscale_main_grads_and_check_for_nan): 46 bytes against
  Calculon's 12 (master weights and moments once).  Hand count for
  Megatron 22B at TP 8 in float16: 48 blocks of 12 h^2 / 8 weights plus
  the biases and norms."""
  app = Application.from_dict(
    read_json_file(f'{ROOT}/models/megatron-22B.json'))
  common = dict(tensor_par=8, batch_size=4, microbatch_size=4,
                tensor_par_comm_type='ar')
  calc = evaluation(app, **common)
  full = evaluation(app, optimizer_traffic='fused_adam', **common)
  ratio = value(full.block.optim_mem_bytes) / value(calc.block.optim_mem_bytes)
  assert ratio == pytest.approx(46 / 12, rel=1e-9)
  h = 6144
  assert value(full.block.optim_mem_bytes) == pytest.approx(
    46 * 12 * h * h / 8, rel=0.01)
  assert value(full.optim_step_time_s) > 3 * value(calc.optim_step_time_s)
  # Only the optimizer step moves; the rest of the batch is Calculon's.
  assert value(full.total_time_s) - value(calc.total_time_s) == \
    pytest.approx(value(full.optim_step_time_s) -
                  value(calc.optim_step_time_s) + value(
                    full.vocab_extra_time_s) - value(calc.vocab_extra_time_s),
                  rel=1e-9)
  # bfloat16: no unscaling, 38 bytes.
  bf = dict(common, datatype='bfloat16',
            system=System(read_json_file(
              f'{ROOT}/systems/a100_sxm_80g_datasheet.json')))
  ratio = value(evaluation(app, optimizer_traffic='fused_adam', **bf)
                .block.optim_mem_bytes) / value(evaluation(app, **bf)
                                                .block.optim_mem_bytes)
  assert ratio == pytest.approx(38 / 12, rel=1e-9)
  # A sharded optimizer moves its shard only.
  dist = dict(common, data_par=8, batch_size=32, data_par_sharding='optimizer')
  assert value(evaluation(app, optimizer_traffic='fused_adam', **dist)
               .block.optim_mem_bytes) == pytest.approx(
    value(full.block.optim_mem_bytes) / 8, rel=1e-9)


def test_pipeline_warmup_capped_keeps_at_most_every_microbatch():
  """``pipeline_warmup_capped``: an interleaved schedule's warm-up never
  runs more forwards than the batch has chunk-microbatches (Megatron-LM
  megatron/schedules.py dd88906264, min(num_warmup_microbatches,
  num_microbatches); PyTorch ScheduleInterleaved1F1B get_rank_warmup_ops,
  min(warmup_ops, n_microbatches * n_local_stages)).  Hand count, PP 4, VP
  2, 4 microbatches: the first rank's warm-up is (2 - 1) x 4 + 2 x 3 = 10
  chunk-forwards, capped at 4 x 2 = 8, i.e. all 4 microbatches of its
  blocks (Calculon: 4 x (1 + 3 / 8) = 5.5).  With 16 microbatches the cap
  does not bind (5.5 < 16)."""
  app = llama(num_blocks=32)
  common = dict(pipeline_par=4, pipeline_interleaving=2, batch_size=4,
                datatype='bfloat16', activation_recompute='full')
  calc = evaluation(app, system=H100_SXM, **common)
  cap = evaluation(app, system=H100_SXM, pipeline_warmup_capped=True,
                   **common)
  per_mb = value(calc.blocks_per_proc * calc.block_act_checkpoint_bytes)
  assert value(calc.act_checkpoint_bytes) == pytest.approx(5.5 * per_mb,
                                                           rel=1e-12)
  assert value(cap.act_checkpoint_bytes) == pytest.approx(4 * per_mb,
                                                          rel=1e-12)
  many = dict(common, batch_size=16)
  assert value(evaluation(app, system=H100_SXM, pipeline_warmup_capped=True,
                          **many).act_checkpoint_bytes) == value(
    evaluation(app, system=H100_SXM, **many).act_checkpoint_bytes)


def test_tiled_gemm_size_prices_each_tile_at_its_own_size():
  """``tiled_gemm_size`` 'tile': Transformer Engine runs an overlapped TP
  GEMM as chunk GEMMs (comm_gemm_overlap.cpp: one nvte_cublas_gemm per
  chunk), as many as its default userbuffers configuration splits it into
  (module/base.py initialize_ub): TP for the ring-exchange all-gathers
  (qkv_fprop, proj_dgrad), 4 for the pipelined reduce-scatter of the
  forward (proj_fprop), one for the bulk overlap (qkv_dgrad).  Llama 3
  8B's attention projection at TP 8, one 8,192-token sequence, on the DGX
  H100 datasheet file: the whole forward GEMM is 2 x 8192 x 512 x 4096 =
  34.4 GFLOP (the file's bfloat16 efficiency 0.76 at >= 16 GFLOP), a
  chunk 8.6 GFLOP (0.51 at >= 1 GFLOP): 4 chunks at 0.51 instead of the
  whole at 0.76, and the step is slower.  The field qualifies a tiled
  overlap: refused without one."""
  common = dict(tensor_par=8, tensor_par_net=0, batch_size=1,
                tensor_par_comm_type='rs_ag', datatype='bfloat16')
  runs = {g: evaluation(llama(), H100_SXM, tensor_par_overlap='ring',
                        tiled_gemm_size=g, **common)
          for g in ('whole', 'tile')}
  layer = {g: {x.name: x for x in ev.block._layers}['AttnBlock_MLP_RS']
           for g, ev in runs.items()}
  flops = value(layer['tile'].flops('fw'))
  assert flops == 2 * 8192 * 512 * 4096
  peak = 989.5e12
  assert value(layer['whole'].flops_time_s('fw')) == pytest.approx(
    flops / (peak * 0.76))
  assert value(layer['tile']._tile_flops_time_s('fw')) == pytest.approx(
    4 * (flops / 4) / (peak * 0.51))
  qkv = {x.name: x for x in runs['tile'].block._layers}['AttnBlock_QKV_AG']
  assert [layer['tile'].gemm_chunks(st) for st in ('fw', 'agrad')] == [4, 8]
  assert [qkv.gemm_chunks(st) for st in ('fw', 'agrad')] == [8, 1]
  assert value(layer['tile'].processing_time_s('fw')) > \
    value(layer['whole'].processing_time_s('fw'))
  assert value(runs['tile'].total_time_s) > value(runs['whole'].total_time_s)
  with pytest.raises(ConfigError, match='tiled_gemm_size'):
    evaluation(llama(), H100_SXM, tiled_gemm_size='tile', **common)
