"""Mixture-of-Experts and multi-head latent attention, against cited sources
(issue "Mixture-of-Experts: experts, expert parallelism and all-to-all")."""

import copy

import numpy as np
import pytest

from calculon.config import Application
from calculon.errors import ConfigError
from calculon.hardware import System
from calculon.io import read_json_file
from calculon.llm.flops import model_flops_per_token

from conftest import ROOT
from test_modern import evaluation, value

H100 = read_json_file(f'{ROOT}/systems/h100_80g_nvl8.json')

MIXTRAL = dict(hidden=4096, feedforward=14336, seq_size=4096, attn_heads=32,
               attn_size=128, num_blocks=32, kv_heads=8, mlp='gated',
               norm='rmsnorm', linear_bias='none', vocab_size=32000,
               position_embedding='rope', dropout=False, num_experts=8,
               top_k=2, moe_ffn_hidden=14336)
DEEPSEEK_V3 = dict(hidden=7168, feedforward=18432, seq_size=4096,
                   attn_heads=128, attn_size=192, num_blocks=61, mlp='gated',
                   norm='rmsnorm', linear_bias='none', vocab_size=129280,
                   position_embedding='rope', dropout=False, num_experts=256,
                   top_k=8, moe_ffn_hidden=2048, shared_experts=1,
                   first_dense_blocks=3, q_lora_rank=1536, kv_lora_rank=512,
                   qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128)


def test_parameter_counts_total_and_active():
  """Jiang et al. 2024 (Mixtral, arXiv:2401.04088): 46.7B total, 12.9B
  active; written out: 32 blocks x (attention 2 h^2 + 2 h 8 x 128 = 41.9M,
  router 8 h, 8 experts x 3 h f, two RMSNorms) + embedding and head
  32000 h each + final norm.  DeepSeek-AI 2024 (DeepSeek-V3,
  arXiv:2412.19437): 671B total, 37B active, main model without the MTP
  module; Megatron-LM's count (no router bias: the published 671,026,419,200
  adds 58 x 256 expert biases)."""
  h, f = 4096, 14336
  attn = 2 * h * h + 2 * h * 8 * 128
  block = attn + 8 * h + 8 * 3 * h * f + 2 * h
  total = 32 * block + 2 * 32000 * h + h
  app = Application.from_dict(MIXTRAL)
  assert app.num_parameters() == total == 46_702_792_704
  assert app.num_active_parameters() == total - 32 * 6 * 3 * h * f == \
    12_879_925_248
  ds = Application.from_dict(DEEPSEEK_V3)
  assert ds.num_parameters() == 671_026_419_200 - 58 * 256
  assert ds.num_active_parameters() == pytest.approx(37e9, rel=0.02)


def megatron_moe_mla_flops_per_token(app, causal=True):
  """Megatron-LM ``num_floating_point_operations`` (training.py at
  d98e8a64), MLA and MoE branches, BSHD, no MTP, transcribed: 3 x 2 x
  [ h (f gamma L_dense + f_e k gamma L_moe + f_sh gamma L_moe) + attention
  linear (q_term + kv_lora (h + a (qk + v) + 1) + h qk_pos + a v h) x L +
  h V ] + s x 3 x 2 x (a (qk + pos) / 2 + a v / 2) x L."""
  h, a, L = app.hidden, app.attn_heads, app.num_blocks
  qk, pos, v = app.qk_nope_head_dim, app.qk_rope_head_dim, app.v_head_dim
  q_term = app.q_lora_rank * (h + a * (qk + pos) + 1)
  attn_linear = q_term + app.kv_lora_rank * (h + a * (qk + v) + 1) + \
    h * pos + a * v * h
  gamma = 3
  mlp = h * (app.feedforward * gamma * app.num_dense_blocks +
             app.moe_ffn_hidden * app.top_k * gamma * app.num_moe_blocks +
             app.moe_ffn_hidden * app.shared_experts * gamma *
             app.num_moe_blocks)
  core = 3 * 2 * (a * (qk + pos) / 2 + a * v / 2) * L * app.seq_size
  if not causal:
    core *= 2
  return 3 * 2 * (mlp + attn_linear * L + h * app.vocab_size) + core


def test_deepseek_v3_flops_equal_megatron():
  """Per-token oracle 2.4981e11 (Megatron-LM HEAD, s = 4096, V = 129280,
  no MTP; NeMo's deepseekv3 formula agrees)."""
  app = Application.from_dict(DEEPSEEK_V3)
  got = model_flops_per_token(app, 'causal')
  assert got == pytest.approx(megatron_moe_mla_flops_per_token(app),
                              rel=1e-12)
  assert got == pytest.approx(2.4981e11, rel=5e-5)
  assert model_flops_per_token(app, 'full') == pytest.approx(
    megatron_moe_mla_flops_per_token(app, causal=False), rel=1e-12)


def test_engine_flops_are_the_model_flops_plus_the_router():
  """The GEMMs the engine prices for a Mixtral microbatch (TP 1, one rank,
  standard attention) are the model FLOP with the whole score matrix plus
  the router GEMM (h x E per token, which Megatron-LM leaves out)."""
  app = Application.from_dict(dict(MIXTRAL, num_blocks=2, seq_size=1024))
  ev = evaluation(app, System(H100), batch_size=1)
  L = app.num_blocks
  per_mb = L * value(ev.block.matrix_fw_flops + ev.block.matrix_bw_flops) + \
    value(ev.head.matrix_fw_flops + ev.head.matrix_bw_flops)
  router = 6 * app.hidden * app.num_experts * L
  assert per_mb == pytest.approx(
    (model_flops_per_token(app, 'full') + router) * 1024, rel=1e-12)


def test_all_to_all_volume_per_layer_and_rank():
  """Token dispatch = combine = tokens x top_k x hidden elements per rank
  per MoE layer (Megatron-Core token_dispatcher: num_out_tokens =
  tokens x topk); each rank routes b s / TP tokens: Mixtral, microbatch 2,
  s 4096, TP 2: 4096 tokens x 2 x 4096 x 2 bytes, twice (dispatch and
  combine)."""
  app = Application.from_dict(MIXTRAL)
  ev = evaluation(app, System(H100), tensor_par=2, data_par=4, batch_size=8,
                  microbatch_size=2, tensor_par_comm_type='rs_ag',
                  expert_par=8, attention_kernel='flash')
  tokens = 2 * 4096 // 2
  assert value(ev.block.ep_bytes) == 2 * tokens * 2 * 4096 * 2
  # On the link: an all-to-all among 8 ranks moves 7/8 of the buffer.
  net = System(H100).networks
  one = 0.0 + net.latency_s[0] + tokens * 2 * 4096 * 2 * 7 / 8 / \
    net.effective_bw[0]
  assert value(ev.block.ep_fw_time) == pytest.approx(2 * one, rel=1e-12)


def _deepseek_ep32(dispatcher):
  """DeepSeek-V3 blocks, EP 32 over 4 nodes of 8 (the EP tier is the
  network), one microbatch of 4096 tokens per rank."""
  app = Application.from_dict(dict(DEEPSEEK_V3, num_blocks=4,
                                   first_dense_blocks=0))
  system = System(read_json_file(f'{ROOT}/systems/b200.json'))
  return system, evaluation(app, system, tensor_par=1, data_par=32,
                            batch_size=32, microbatch_size=1,
                            data_par_net=1, expert_par=32, expert_par_net=1,
                            moe_dispatcher=dispatcher, datatype='bfloat16',
                            attention_kernel='flash')


def test_deepep_sends_each_token_once_per_destination_node():
  """DeepEP (DeepSeek-V3 section 3.2.2): a token crosses the network once
  per node hosting one of its k experts, then NVLink.  EP 32 on 4 nodes,
  256 experts (64 per node), top-8: a given other node hosts none of a
  token's 8 experts with probability C(192, 8) / C(256, 8), so a token
  crosses to 3 (1 - C(192, 8) / C(256, 8)) = 2.711 nodes: 2.711 x 7168 x
  2 bytes per token on the network, against 8 x 7168 x 2 x 24/32 for a
  plain all-to-all (6 of its 8 copies go to the other 3 nodes); NVLink
  carries one copy to each other rank holding one of the token's experts,
  less than 8 x 450 GB/s-class links need.  Inside a node DeepEP still
  sends a token to a rank once, not once per expert there."""
  from math import comb
  system, plain = _deepseek_ep32('alltoall')
  _, deepep = _deepseek_ep32('deepep')
  net = system.networks
  tokens, h = 4096, 7168
  remote = 3 * (1 - comb(192, 8) / comb(256, 8))
  assert remote == pytest.approx(2.711, abs=1e-3)
  per_op = net.latency_s[1] + tokens * remote * h * 2 / net.effective_bw[1]
  assert value(deepep.block.ep_fw_time) == pytest.approx(2 * per_op,
                                                         rel=1e-12)
  all_to_all = net.latency_s[1] + tokens * 8 * h * 2 * 24 / 32 / \
    net.effective_bw[1]
  assert value(plain.block.ep_fw_time) == pytest.approx(2 * all_to_all,
                                                        rel=1e-12)
  # Inside one node (EP 8 on NVLink) DeepEP sends a token once to each
  # other rank holding one of its experts (DeepEP buffer.py
  # is_token_in_rank): another rank holds none of a token's 8 experts with
  # probability C(224, 8) / C(256, 8), so it reaches 7 (1 - C(224, 8) /
  # C(256, 8)) = 4.633 ranks, against 7 of the plain all-to-all's 8 copies.
  app = Application.from_dict(dict(DEEPSEEK_V3, num_blocks=4,
                                   first_dense_blocks=0))
  inside = [value(evaluation(app, system, tensor_par=1, data_par=8,
                             batch_size=8, expert_par=8, expert_par_net=0,
                             moe_dispatcher=d, datatype='bfloat16',
                             attention_kernel='flash').block.ep_fw_time)
            for d in ('alltoall', 'deepep')]
  # The bytes of each go through the file's NCCL all-to-all table, which
  # applies the all-to-all's 7/8.
  ranks = 7 * (1 - comb(224, 8) / comb(256, 8))
  assert ranks == pytest.approx(4.633, abs=1e-3)
  copies = tokens * 8 * h * 2
  for got, sent in zip(inside, (copies, copies * ranks / 8 * 8 / 7)):
    assert got == pytest.approx(
      2 * value(net.time_s('all_to_all', sent, 8, 0)), rel=1e-12)
  assert inside[1] < 0.8 * inside[0]


def test_node_limited_routing_bounds_the_nodes_a_token_reaches():
  """DeepSeek-V3 section 2.1.2: a token's 8 experts come from at most 4
  of 8 groups of 32 experts (n_group 8, topk_group 4).  EP 64 on 8 nodes
  of 8 GPUs: one group per node, so a token reaches at most 4 nodes; a
  given other node is reached when its group is chosen (4/8) and one of
  the 8 experts drawn from the 128 of the chosen groups is among its 32:
  R = 7 x 1/2 x (1 - C(96, 8) / C(128, 8)) = 3.175 other nodes, against
  7 (1 - C(224, 8) / C(256, 8)) = 4.633 without the limit.  EP 32 on 4
  nodes (2 groups per node): the node's chosen groups m are
  hypergeometric (8, 2, 4): R = 3 sum_m P(m) (1 - C(128 - 32 m, 8) /
  C(128, 8)) = 2.196, against 2.711."""
  from math import comb
  from calculon.llm.layers import ExpertComm
  remote = ExpertComm.remote_nodes_per_token
  one_per_node = 7 * 0.5 * (1 - comb(96, 8) / comb(128, 8))
  assert one_per_node == pytest.approx(3.175, abs=1e-3)
  assert remote(8, 256, 8, 8, 4) == pytest.approx(one_per_node, rel=1e-12)
  assert remote(8, 256, 8) == pytest.approx(
    7 * (1 - comb(224, 8) / comb(256, 8)), rel=1e-12)
  two_per_node = 3 * sum(
    comb(2, m) * comb(6, 4 - m) / comb(8, 4) *
    (1 - comb(128 - 32 * m, 8) / comb(128, 8)) for m in (1, 2))
  assert two_per_node == pytest.approx(2.196, abs=1e-3)
  assert remote(4, 256, 8, 8, 4) == pytest.approx(two_per_node, rel=1e-12)
  # A group over 2 nodes (16 nodes): reached when the group is chosen and
  # one expert is among the node's 16 of the 128 drawn from.
  assert remote(16, 256, 8, 8, 4) == pytest.approx(
    15 * 0.5 * (1 - comb(112, 8) / comb(128, 8)), rel=1e-12)
  # Never more nodes than the limit allows, never more than without it.
  for nodes in (2, 4, 8, 16, 32):
    limited = remote(nodes, 256, 8, 8, 4)
    assert limited <= remote(nodes, 256, 8) + 1e-12
  # The engine: DeepEP over 4 nodes sends 2.196 / 2.711 of the bytes.
  system, _ = _deepseek_ep32('alltoall')
  app = Application.from_dict(dict(DEEPSEEK_V3, num_blocks=4,
                                   first_dense_blocks=0,
                                   moe_router_num_groups=8,
                                   moe_router_group_topk=4))
  ev = evaluation(app, system, tensor_par=1, data_par=32, batch_size=32,
                  microbatch_size=1, data_par_net=1, expert_par=32,
                  expert_par_net=1, moe_dispatcher='deepep',
                  datatype='bfloat16', attention_kernel='flash')
  net = system.networks
  per_op = net.latency_s[1] + 4096 * two_per_node * 7168 * 2 / \
    net.effective_bw[1]
  assert value(ev.block.ep_fw_time) == pytest.approx(2 * per_op, rel=1e-9)
  # A plain all-to-all sends every copy: the limit changes nothing.
  plain = evaluation(app, system, tensor_par=1, data_par=32, batch_size=32,
                     microbatch_size=1, data_par_net=1, expert_par=32,
                     expert_par_net=1, moe_dispatcher='alltoall',
                     datatype='bfloat16', attention_kernel='flash')
  assert value(plain.block.ep_fw_time) == value(
    _deepseek_ep32('alltoall')[1].block.ep_fw_time)


def test_hidden_dispatch_still_takes_the_processor_share_of_its_tier():
  """An all-to-all hidden behind compute (moe_comm_overlap) is not free:
  the compute it overlaps runs slower by the processor share of the tier
  driving it (Calculon's processor_usage, as for overlapped DP and TP;
  DeepSeek-V3 section 3.2.2 reserves 20 of 132 SMs for it).  Mixtral on 8
  GPUs of one node (EP 8 on NVLink, usage 0.15), 8 microbatches a step:
  when the dispatch and combine fit in the window, 0.15 of them shows in
  the 7 paired passes and all of them in the one forward Megatron-Core
  runs alone (combined_1f1b.py: "executed alone, no a2a overlapping");
  without overlap, all."""
  app = Application.from_dict(MIXTRAL)
  system = System(H100)
  fields = dict(tensor_par=1, data_par=8, batch_size=64, microbatch_size=1,
                expert_par=8, attention_kernel='flash')
  hidden = evaluation(app, system, moe_comm_overlap='compute', **fields)
  plain = evaluation(app, system, moe_comm_overlap='none', **fields)
  usage = system.networks.usage(0)
  assert usage == 0.15
  fw = value(hidden.block.ep_fw_time)
  assert fw < value(hidden.block.fw_time - hidden.block.experts_fw_time)
  assert value(hidden._unpaired_share) == 1 / 8
  assert value(hidden.block_ep_fw_exposed_s) == pytest.approx(
    7 / 8 * usage * fw + 1 / 8 * fw, rel=1e-12)
  assert value(plain.block_ep_fw_exposed_s) == pytest.approx(fw, rel=1e-12)


def test_overlapped_dispatch_pairs_with_the_other_microbatch():
  """The 1F1B all-to-all overlap (moe_comm_overlap 'compute') runs one
  microbatch's forward of a block beside another's backward; Megatron-Core
  (models/common/model_chunk_schedule_plan.py TransformerLayerSchedulePlan
  .run at d98e8a64dd) puts, communication against compute, the backward
  combine against the forward's pre-dispatch computation, both dispatches
  against the routed experts' backward and forward, the forward combine
  against the backward's pre-dispatch computation (DeepSeek-V3's DualPipe
  pairs the same pieces, arXiv 2412.19437 figure 4).  DeepSeek-V3 with EP
  32 over four 8-GPU nodes: the exposed transfer is the three phases'
  excess (the processor share of the tier slowing what hides), so the
  routed experts' compute hides the dispatches too, less than the
  overlap behind only the rest of a pass would show.  Of the step's 2
  microbatches the first forward and the last backward run alone, every
  transfer exposed (combined_1f1b.py, "executed alone, no a2a
  overlapping"); with PP 2 and VP 2 the first stage's warm-up is
  2 (PP - 1) + (VP - 1) PP + 1 = 5 of its M x VP chunk passes
  (schedules.py, the interleaved warm-up plus one with the overlap).  A
  forward pass alone (inference) keeps hiding behind the rest of its own
  pass."""
  from calculon.llm.layers import hidden_behind
  app = Application.from_dict(DEEPSEEK_V3)
  system = System(H100)
  fields = dict(tensor_par=1, data_par=32, pipeline_par=1, batch_size=64,
                microbatch_size=1, expert_par=32, expert_par_net=1,
                data_par_net=1, moe_dispatcher='deepep',
                attention_kernel='flash', data_par_sharding='optimizer',
                moe_comm_overlap='compute')
  ev = evaluation(app, system, **fields)
  b, u = ev.block, value(ev.ep_usage)
  ep_f, ep_b = value(b.ep_fw_time), value(b.ep_bw_time + b.ep_re_time)
  e_f, e_b = value(b.experts_fw_time), value(b.experts_bw_time)
  a_f = value(b.fw_time) - e_f
  a_b = value(b.agrad_time + b.wgrad_time) - e_b
  assert ep_f > 0.5 * a_b     # the combines do not all hide
  middle = hidden_behind(ep_f / 2 + ep_b / 2, e_f + e_b, u)
  fw = hidden_behind(ep_f / 2, a_b, u) + middle / 2
  bw = hidden_behind(ep_b / 2, a_f, u) + middle / 2
  assert value(ev._unpaired_share) == 1 / 2
  assert value(ev.block_ep_fw_exposed_s) == pytest.approx(
    (fw + ep_f) / 2, rel=1e-12)
  assert value(ev.block_ep_bw_exposed_s) == pytest.approx(
    (bw + ep_b) / 2, rel=1e-12)
  rest_only = hidden_behind(ep_f, a_f, u) + hidden_behind(ep_b, a_b, u)
  assert fw + bw < rest_only
  piped = evaluation(app, system, **dict(
    fields, data_par=16, pipeline_par=2, pipeline_interleaving=2,
    expert_par=16, batch_size=160))
  assert value(piped._unpaired_share) == pytest.approx(5 / 20)
  none = evaluation(app, system, **dict(fields, moe_comm_overlap='none'))
  assert fw + bw < value(none.block_ep_fw_exposed_s +
                         none.block_ep_bw_exposed_s)
  serve = evaluation(app, system, **dict(fields, training=False,
                                         data_par_sharding='none'))
  sb = serve.block
  assert value(serve.block_ep_fw_exposed_s) == pytest.approx(hidden_behind(
    value(sb.ep_fw_time), value(sb.fw_time - sb.experts_fw_time), u),
    rel=1e-12)


def test_combine_keeps_the_expert_outputs_and_probabilities():
  """Megatron-Core ``moe_utils.unpermute`` multiplies the k expert outputs
  of each token by their router probabilities, then scatter-adds them:
  autograd keeps the expert outputs (for the probabilities' gradient,
  tokens x k x h in 16 bits) and the fp32 probabilities (tokens x k); the
  permutation before the experts (an index select) keeps only indices.
  Mixtral, microbatch 1, s 4096, TP 1: 4096 tokens, k 2."""
  app = Application.from_dict(MIXTRAL)
  ev = evaluation(app, System(H100), data_par=8, batch_size=8,
                  expert_par=8, attention_kernel='flash')
  layer = {l.name: l for l in ev.layers}
  tokens, k, h = 4096, 2, 4096
  assert value(layer['Moe_Unpermute'].activation_bytes()) == \
    tokens * k * h * 2 + tokens * k * 4
  assert not value(layer['Moe_Permute'].activation_stored)


def test_probabilities_in_the_activation_keep_no_expert_outputs():
  """Megatron-Core since commit 2659630721 (April 2025, core_v0.13.0)
  scales the experts' activation by the router probabilities
  (activation_func_with_probs), so the combine keeps only the fp32
  probabilities: a Mixtral block stores tokens x k x h x 2 bytes less
  (4096 x 2 x 4096 x 2 = 64 MiB) per microbatch, and the time is
  unchanged."""
  app = Application.from_dict(MIXTRAL)
  common = dict(data_par=8, batch_size=8, expert_par=8,
                attention_kernel='flash')
  old = evaluation(app, System(H100), **common)
  new = evaluation(app, System(H100), moe_probs_in_activation=True,
                   **common)
  layer = {l.name: l for l in new.layers}
  tokens, k, h = 4096, 2, 4096
  assert value(layer['Moe_Unpermute'].activation_bytes()) == tokens * k * 4
  assert value(old.block.act_storage_bytes - new.block.act_storage_bytes) \
    == tokens * k * h * 2
  assert value(new.total_time_s) == value(old.total_time_s)


def test_host_floor_of_moe_blocks():
  """``overhead.per_moe_block_s``: a stage whose blocks' GPU work per
  microbatch is shorter than its MoE blocks' host time waits for the host
  (host-bound MoE layers; arXiv 2603.07685's "host-boundedness").  Two
  Mixtral blocks on one H100 node, EP 8, 4 microbatches: a floor above the
  GPU time adds (2 x floor - GPU time per microbatch) per microbatch,
  shown as its own line of the time breakdown; a floor below it adds
  nothing; a dense model ignores it."""
  app = Application.from_dict(dict(MIXTRAL, num_blocks=2))
  common = dict(data_par=8, batch_size=32, expert_par=8,
                attention_kernel='flash')
  plain = evaluation(app, System(H100), **common)
  gpu = value(plain.fw_time_s + plain.bw_time_s + plain.recompute_time_s)
  nmb = value(plain.num_microbatches)
  per_mb = gpu / nmb
  for floor in (per_mb, per_mb / 4):   # per block: 2 blocks a stage
    ev = evaluation(app, System(dict(H100, overhead={
      'per_moe_block_s': floor})), **common)
    want = max(0.0, 2 * floor - per_mb) * nmb
    assert value(ev.moe_host_time_s) == pytest.approx(want, rel=1e-9)
    assert value(ev.total_time_s) == pytest.approx(
      value(plain.total_time_s) + want, rel=1e-9)
  assert value(plain.moe_host_time_s) == 0.0
  # A full-iteration CUDA graph replays the whole forward and backward pass
  # with one launch (Megatron-Core cuda_graph_impl 'full_iteration'): the
  # blocks never wait for the host.  Per-layer graphs (attn, moe_router,
  # moe_preprocess) leave the host 484 / 623 of its eager time: NVIDIA's
  # launch-bound Qwen3-30B-A3B step on two H100 nodes, 623 ms eager and
  # 484 ms with them (Megatron-Bridge skills/nemo-mbridge-perf-cuda-graphs/
  # card.yaml, 067f987df): 2 blocks x 0.777 x per_mb - per_mb.
  floored = System(dict(H100, overhead={'per_moe_block_s': per_mb}))
  layers = evaluation(app, floored, cuda_graphs='layers', **common)
  full = evaluation(app, floored, cuda_graphs='full_iteration', **common)
  assert value(layers.moe_host_time_s) == pytest.approx(
    (2 * 484 / 623 - 1) * per_mb * nmb, rel=1e-9)
  assert value(full.moe_host_time_s) == 0.0
  assert value(full.total_time_s) == pytest.approx(
    value(plain.total_time_s), rel=1e-12)
  dense = Application.from_dict({k: v for k, v in MIXTRAL.items()
                                 if k not in ('num_experts', 'top_k',
                                              'moe_ffn_hidden')})
  d0 = evaluation(dense, System(H100), data_par=8, batch_size=32)
  d1 = evaluation(dense, System(dict(H100, overhead={
    'per_moe_block_s': 1.0})), data_par=8, batch_size=32)
  assert value(d1.total_time_s) == value(d0.total_time_s)
  with pytest.raises(ConfigError, match='per_moe_block_s'):
    System(dict(H100, overhead={'per_moe_block_s': -1}))


def test_experts_are_divided_over_ep_and_load_imbalance_slows():
  app = Application.from_dict(dict(MIXTRAL, num_blocks=2))
  sysm = System(H100)
  one = evaluation(app, sysm, data_par=8, batch_size=8, expert_par=1)
  eight = evaluation(app, sysm, data_par=8, batch_size=8, expert_par=8)
  assert value(one.block.expert_weight_elems) == \
    8 * value(eight.block.expert_weight_elems) == 8 * 3 * 4096 * 14336
  # The busiest expert gets 1.5x the tokens: 1.5x the FLOP, slower.
  hot = evaluation(app, sysm, data_par=8, batch_size=8, expert_par=8,
                   expert_imbalance=1.5)
  flops = lambda ev: value([l for l in ev.layers
                            if l.name == 'Moe_Experts_Mlp1'][0].flops('fw'))
  assert flops(hot) == 1.5 * flops(eight)
  assert 1.3 < value(hot.block.experts_fw_time) / value(
    eight.block.experts_fw_time) <= 1.5
  assert value(hot.total_time_s) > value(eight.total_time_s)
  # Expert gradients reduce over the expert data-parallel ranks
  # TP x DP x CP / (EP x ETP) (Megatron-Core MoE parallel folding).
  assert value(eight.edp) == 1 and value(one.edp) == 8


def test_recompute_modules_moe():
  """Megatron-Core's 'moe' module recomputes the whole MoE layer from its
  input in the backward pass, its all-to-alls too, and keeps nothing
  inside it; 'moe_act' recomputes the experts' activation and drops its
  output (the second expert GEMM's input)."""
  app = Application.from_dict(dict(MIXTRAL, num_blocks=2))
  sysm = System(H100)
  run = lambda **kw: evaluation(app, sysm, data_par=8, batch_size=8,
                                expert_par=8, attention_kernel='flash',
                                activation_recompute='selective', **kw)
  core = run()
  moe = run(recompute_modules=['core_attn', 'moe'])
  act = run(recompute_modules=['core_attn', 'moe_act'])
  layers = {l.name: l for l in core.layers}
  inner = [n for n in layers if n.startswith('Moe_') and n != 'Moe_Fork']
  fw = lambda ev, n: value([l for l in ev.layers if l.name == n][0]
                           .processing_time_s('fw'))
  assert value(moe.block.re_time) == pytest.approx(
    value(core.block.re_time) + sum(fw(moe, n) for n in inner), rel=1e-12)
  assert value(core.block.ep_re_time) == 0
  assert value(moe.block.ep_re_time) == pytest.approx(
    value(moe.block.ep_fw_time), rel=1e-12) and value(moe.block.ep_fw_time) > 0
  kept = sum(value(layers[n].activation_bytes()) for n in inner
             if value(layers[n].activation_stored))
  assert kept > 0
  assert value(moe.block.act_storage_bytes) == pytest.approx(
    value(core.block.act_storage_bytes) - kept, rel=1e-12)
  assert value(act.block.re_time) == pytest.approx(
    value(core.block.re_time) + fw(act, 'Moe_Experts_SwiGLU'), rel=1e-12)
  assert value(act.block.act_storage_bytes) == pytest.approx(
    value(core.block.act_storage_bytes) -
    value(layers['Moe_Experts_Mlp2'].activation_bytes()), rel=1e-12)
  assert value(moe.mem1_bytes) < value(act.mem1_bytes) < value(core.mem1_bytes)


def test_capacity_factor_pads_every_expert():
  """With a capacity factor every expert computes exactly its capacity
  ceil(tokens x k / E x factor) (Fedus et al. 2022, Switch Transformers,
  section 2.2)."""
  sysm = System(H100)
  app = Application.from_dict(dict(MIXTRAL, num_blocks=2,
                                   capacity_factor=1.25))
  ev = evaluation(app, sysm, data_par=8, batch_size=8, expert_par=8)
  mlp1 = [l for l in ev.layers if l.name == 'Moe_Experts_Mlp1'][0]
  tokens = 4096
  per_expert = np.ceil(tokens * 2 * 8 / 8 * 1.25)
  assert value(mlp1.flops('fw')) == 2 * per_expert * 4096 * 2 * 14336


def test_more_expert_bandwidth_never_slows_a_run():
  """Property: raising the bandwidth of the tier the experts use never
  makes any execution slower (a grid of EP degrees, tiers, overlaps and
  dispatchers)."""
  from calculon.config import ExecutionColumns
  from calculon.llm.engine import evaluate_columns
  from calculon.config.execution import Execution
  app = Application.from_dict(dict(MIXTRAL, num_blocks=4))
  base = dict(num_procs=16, tensor_par=2, pipeline_par=1, data_par=8,
              tensor_par_net=0, pipeline_par_net=0, data_par_net=1,
              batch_size=16, microbatch_size=1, datatype='float16',
              fused_activation=True, activation_recompute='none',
              pipeline_interleaving=1, optimizer_sharding=False,
              tensor_par_comm_type='rs_ag', tensor_par_overlap='none',
              seq_par_ag_redo=False, data_par_overlap=True,
              weight_offload=False, activations_offload=False,
              optimizer_offload=False, training=True)
  records = []
  for ep in (2, 4, 8):
    for tier in (0, 1):
      for disp in ('alltoall', 'allgather', 'deepep'):
        for ov in ('none', 'shared_experts', 'compute'):
          for imb in (1.0, 1.3):
            records.append(Execution.from_dict(dict(
              base, expert_par=ep, expert_par_net=tier, moe_dispatcher=disp,
              moe_comm_overlap=ov, expert_imbalance=imb)).to_dict())
  cols = ExecutionColumns.from_records(records)
  times = []
  for scale in (0.5, 1.0, 2.0, 8.0):
    cfg = copy.deepcopy(H100)
    for net in cfg['networks']:
      net['bandwidth'] *= scale
    times.append(np.asarray(evaluate_columns(app, System(cfg),
                                             cols).total_time_s))
  for slow, fast in zip(times, times[1:]):
    assert np.all(fast <= slow * (1 + 1e-12))
  assert np.any(times[-1] < times[0])


def test_moe_bad_inputs():
  with pytest.raises(ConfigError, match="'top_k' = 9 is not allowed"):
    Application.from_dict(dict(MIXTRAL, top_k=9))
  for extra, message in (
      (dict(moe_router_num_groups=8), "'moe_router_group_topk'.*needs both"),
      (dict(moe_router_num_groups=3, moe_router_group_topk=1),
       "'moe_router_num_groups' = 3 is not allowed: it must divide "
       r'num_experts \(256\)'),
      (dict(moe_router_num_groups=8, moe_router_group_topk=9),
       "'moe_router_group_topk' = 9 is not allowed: it must be <= "
       r'moe_router_num_groups \(8\)'),
      (dict(moe_router_num_groups=64, moe_router_group_topk=1),
       "its 1 group\\(s\\) of 4 experts must hold top_k \\(8\\)")):
    with pytest.raises(ConfigError, match=message):
      Application.from_dict(dict(DEEPSEEK_V3, **extra))
  dense = {k: v for k, v in MIXTRAL.items()
           if k not in ('num_experts', 'top_k', 'moe_ffn_hidden')}
  with pytest.raises(ConfigError, match='needs num_experts'):
    Application.from_dict(dict(dense, shared_experts=1))
  sysm = System(H100)
  with pytest.raises(ConfigError, match="must divide the application's "
                     'num_experts'):
    evaluation(Application.from_dict(MIXTRAL), sysm, data_par=3,
               batch_size=3, expert_par=3)
  with pytest.raises(ConfigError, match='has no experts'):
    evaluation(Application.from_dict(dense), sysm, data_par=2, batch_size=2,
               expert_par=2)
  with pytest.raises(ConfigError, match='must divide tensor_par'):
    evaluation(Application.from_dict(MIXTRAL), sysm, data_par=2,
               batch_size=2, expert_par=4)


def test_deepep_sends_a_token_to_a_rank_once():
  """DeepEP and HybridEP send a token to each destination rank once, the
  copies per local expert made after the transfer (DeepEP deep_ep/buffer.py:
  is_token_in_rank [num_tokens, num_ranks]; hybrid_ep_buffer.py: dispatch
  -> local_permute -> expert_mlp).  Qwen3-30B-A3B on EP 8 (128 experts,
  top-8, 16 per rank): another rank holds none of a token's experts with
  probability C(112, 8) / C(128, 8), so a token reaches 7 (1 - C(112, 8) /
  C(128, 8)) = 4.672 other ranks, 4.672 / 8 of the k copies the all-to-all
  dispatcher sends; with one expert per rank (E = p) nothing is saved
  beyond the distinct experts: k (p - 1) / p."""
  from math import comb
  from calculon.llm.layers import ExpertComm
  ranks = 7 * (1 - comb(112, 8) / comb(128, 8))
  assert ranks == pytest.approx(4.672, abs=1e-3)
  assert ExpertComm.rank_dedup_bytes(8.0, 8, 128, 8) == pytest.approx(
    ranks, rel=1e-12)
  assert ExpertComm.rank_dedup_bytes(1.0, 16, 16, 2) == pytest.approx(
    15 / 16, rel=1e-12)
