"""One forward pass of a serving worker, composed from the engine's block.

:func:`forward_s` prices a forward pass over ``batch`` sequences of
``seq`` new tokens each (a prefill: seq = the prompt, attention inside it;
a decode step: seq = 1, attention over the KV cache priced by
:mod:`calculon.serving.decode`).  The block's attention and dense MLP are
the engine's layers (:func:`calculon.llm.block.build_block`, through the
engine's :class:`~calculon.llm.model.Evaluation` at ``training: false``,
microbatch = the batch, seq_size = the new tokens), each priced at the
roofline, max(FLOP time, bytes time) (Williams, Waterman and Patterson,
'Roofline', CACM 2009): the FLOP time from the system's matrix or vector
engine and its efficiency curve, the bytes time from memory tier 1 and its
curve, with the weight bytes at the deployment's weight datatype.  At a
decode step's small m a GEMM streams its weights: memory-bound.

The MoE MLP is priced here (:func:`moe_mlp_s`) because a decode step
routes a few tokens: the experts a step touches (not all of them) stream
their weights, expected distinct experts E_local x (1 - (1 - k/E)^T) for T
routed tokens under uniform routing.  Communication (TP all-reduces, EP
all-to-alls, PP sends) is :mod:`calculon.serving.comm`'s.

Every priced quantity is one function (:func:`gemm_s`,
:func:`block_layers_s`, :func:`moe_mlp_s`, :func:`block_comm_s`,
:func:`lm_head_s`), so a measured table can replace one later.

Reads: the application, the system and the engine's block layers.
"""

import dataclasses

import numpy as np

from calculon.config import ExecutionColumns
from calculon.config.execution import DATATYPE_NAMES
from calculon.llm.engine import evaluate_columns
from calculon.llm.layers import ExpertComm, Fork, TPComm
from calculon.serving import comm
from calculon.serving.kv_cache import stage_blocks

_SKIP = (TPComm, ExpertComm, Fork)
#: Bytes of the activations that cross the TP all-reduce (16-bit: the
#: GEMM outputs are reduced in bfloat16 even in FP8 deployments).
REDUCE_BYTES = 2


def _record(dtype):
  return dict(
    num_procs=1, tensor_par=1, pipeline_par=1, data_par=1,
    tensor_par_net=0, pipeline_par_net=0, data_par_net=0, batch_size=1,
    microbatch_size=1, datatype=dtype, fused_activation=True,
    activation_recompute='none', pipeline_interleaving=1,
    optimizer_sharding=False, tensor_par_comm_type='ar',
    tensor_par_overlap='none', seq_par_ag_redo=False,
    data_par_overlap=False, weight_offload=False, activations_offload=False,
    optimizer_offload=False, training=False, attention_kernel='flash')


def engine_block(app, system, tp, batch, seq, dtype):
  """The engine's dense block (attention + dense MLP layers) for
  ``batch`` sequences (array) of ``seq`` tokens at TP ``tp`` (array or
  scalar) in datatype ``dtype`` (name), inference.  Returns the layer
  list (:func:`calculon.llm.block.build_block`)."""
  app_s = dataclasses.replace(app, seq_size=int(seq))
  cols = ExecutionColumns.from_records([_record(dtype)])
  shape = np.broadcast_shapes(np.shape(tp), np.shape(batch))
  cols.tensor_par = np.broadcast_to(np.asarray(tp, dtype=np.int64), shape)
  cols.microbatch_size = np.broadcast_to(np.asarray(batch, dtype=np.int64),
                                         shape)
  cols.batch_size = cols.microbatch_size
  cols.num_procs = cols.tensor_par
  ev = evaluate_columns(app_s, system, cols, validate=False)
  return ev.dense_layers


def layer_s(layer, system, weight_scale):
  """Roofline seconds of one engine layer's forward: max(FLOP time,
  bytes time), the layer's weight bytes scaled by ``weight_scale`` (the
  deployment's bytes per weight over the engine datatype's); 0 where the
  layer is absent."""
  if isinstance(layer, _SKIP):
    return 0.0
  flops_t = layer.flops_time_s('fw')
  mem = layer.mem_bytes('fw') + layer.weight_bytes() * (weight_scale - 1)
  with np.errstate(divide='ignore', invalid='ignore'):
    mem_t = np.nan_to_num(system.mem1.time_s(mem))
  t = np.maximum(flops_t, mem_t)
  return np.where(layer.present, t, 0.0)


def block_layers_s(layers, system, weight_scale):
  """Seconds of the attention part ('AttnBlock_*' layers) and of the dense
  MLP part ('MlpBlock_*') of one block: (attention_s, mlp_s)."""
  attn = mlp = 0.0
  for layer in layers:
    t = layer_s(layer, system, weight_scale)
    if layer.name.startswith('MlpBlock'):
      mlp = mlp + t
    else:
      attn = attn + t
  return attn, mlp


def gemm_s(system, dtype_code, m, n, k, weight_bytes, act_bytes,
           efficiency=1.0):
  """Roofline seconds of a GEMM (m x n) (n x k): max(2mnk FLOP on the
  matrix engine at its efficiency for that size / ``efficiency``, bytes
  of the input, output and weights over memory tier 1)."""
  flops = 2.0 * m * n * k
  with np.errstate(divide='ignore', invalid='ignore'):
    flops_t = np.nan_to_num(system.matrix.time_s(dtype_code, flops)) / \
      efficiency
    nbytes = (m * n + m * k) * act_bytes + n * k * weight_bytes
    mem_t = np.nan_to_num(system.mem1.time_s(nbytes))
  return np.maximum(flops_t, mem_t)


def experts_touched(num_experts, top_k, tokens):
  """Expected share of the experts that at least one of ``tokens`` routed
  tokens picks, under uniform routing: 1 - (1 - k/E)^T."""
  return 1.0 - (1.0 - top_k / num_experts) ** np.asarray(tokens, float)


def moe_mlp_s(app, system, dtype_code, tokens, tp, ep, etp, adp,
              weight_bytes, act_bytes):
  """Seconds of one MoE block's MLP on one GPU for ``tokens`` tokens per
  attention-DP rank: the router, the routed experts as a grouped GEMM
  over the tokens routed to the GPU's E/EP experts (each expert GEMM at
  its own size, the system's ``grouped_gemm_efficiency``; the experts
  touched stream their weights), the shared experts (dense, over TP).

  Tokens of the EP group: T x attention DP; balanced routing sends each
  local expert T x DP x k / E tokens (Megatron-Core's MoE layer,
  Lepikhin et al. 2021 GShard)."""
  h, E, k = app.hidden, app.num_experts, app.top_k
  f = app.moe_ffn_hidden
  width = (2 if app.gated else 1) * f
  routed = tokens * adp * k / ep
  local = E / ep
  eff = system.grouped_gemm_efficiency or 1.0
  per_expert_flops = 2.0 * routed / local * h * (width + f) / etp
  with np.errstate(divide='ignore', invalid='ignore'):
    flops_t = np.nan_to_num(system.matrix.time_s(
      dtype_code, per_expert_flops)) * local / eff
  touched = local * experts_touched(E, k, tokens * adp)
  nbytes = touched * h * (width + f) / etp * weight_bytes + \
    routed * (h + width + f + h) * act_bytes
  with np.errstate(divide='ignore', invalid='ignore'):
    mem_t = np.nan_to_num(system.mem1.time_s(nbytes))
  experts = np.maximum(flops_t, mem_t)
  router = gemm_s(system, dtype_code, tokens, h, E, 2, act_bytes)
  shared = 0.0
  if app.shared_ffn:
    sw = app.shared_ffn // tp
    shared = gemm_s(system, dtype_code, tokens, h,
                    (2 if app.gated else 1) * sw, weight_bytes, act_bytes) + \
      gemm_s(system, dtype_code, tokens, sw, h, weight_bytes, act_bytes)
  return router + experts + shared


def block_comm_s(app, system, tokens, tp, ep, adp, moe):
  """Seconds of one block's communication for ``tokens`` tokens per
  attention-DP rank: the TP all-reduce after the attention and after the
  dense MLP (Shoeybi et al. 2019, Megatron-LM section 3: two all-reduces
  per block in the forward), or, in an MoE block with EP > 1, the token
  dispatch and combine all-to-alls over the EP group (each GPU sends its
  tokens' k copies of the hidden state, 16-bit), on tier 1 when the group
  spans more than one tier-0 domain."""
  msg = tokens * app.hidden * REDUCE_BYTES
  attn = comm.all_reduce_time_s(system, msg, tp)
  if not moe:
    return attn + comm.all_reduce_time_s(system, msg, tp)
  a2a = comm.all_to_all_time_s(system, msg * app.top_k, ep)
  if system.num_networks > 1:
    # An EP group beyond one tier-0 domain crosses tier 1.
    a2a = np.where(np.asarray(ep) > system.networks.size[0],
                   comm.all_to_all_time_s(system, msg * app.top_k, ep, 1),
                   a2a)
  return attn + np.where(np.asarray(ep) > 1, 2 * a2a,
                         comm.all_reduce_time_s(system, msg, tp))


def lm_head_s(app, system, dtype_code, seqs, tp):
  """Seconds of the LM head for ``seqs`` sequences (one position each:
  only the last token's logits are computed), 16-bit weights sharded over
  TP (vocabulary-parallel)."""
  if not app.vocab_size:
    return 0.0
  code = DATATYPE_NAMES.index('bfloat16') if system.matrix.supports(
    DATATYPE_NAMES.index('bfloat16')) else dtype_code
  return gemm_s(system, code, seqs, app.hidden, app.vocab_size / tp, 2, 2)


@dataclasses.dataclass
class ForwardTimes:
  """Seconds of one forward pass on one GPU of the largest pipeline
  stage, by part (arrays): ``attention`` (projections, norms, the
  attention inside the new tokens), ``mlp`` (dense and MoE), ``comm``
  (TP/EP collectives), ``head`` (LM head), ``pp`` (sends between stages)
  and ``stage`` (their sum, one stage), ``blocks`` (the stage's blocks)."""
  attention: object
  mlp: object
  comm: object
  head: object
  pp: object
  stage: object
  blocks: object


def forward_s(app, system, w, batch, seq, dtype):
  """One forward of worker ``w`` (attributes ``tensor_par``,
  ``pipeline_par``, ``expert_par``, ``expert_tensor_par``,
  ``attention_dp``, ``weight_bytes_per_param``, ``act_bytes``) over
  ``batch`` sequences (array, per attention-DP rank) of ``seq`` new
  tokens, in engine datatype ``dtype`` (name).  Returns
  :class:`ForwardTimes` for one pipeline stage."""
  tp, pp = np.asarray(w.tensor_par), np.asarray(w.pipeline_par)
  ep, etp, adp = w.expert_par, w.expert_tensor_par, w.attention_dp
  code = DATATYPE_NAMES.index(dtype)
  from calculon.config.registry import DATATYPE_BYTES
  scale = w.weight_bytes_per_param / DATATYPE_BYTES[dtype]
  layers = engine_block(app, system, tp, batch, seq, dtype)
  attn, dense_mlp = block_layers_s(layers, system, scale)
  tokens = np.asarray(batch) * seq
  blocks = stage_blocks(app, pp)
  n_moe = np.minimum(-(-app.num_moe_blocks // pp), blocks) if app.is_moe \
    else 0
  n_dense = blocks - n_moe
  mlp = n_dense * dense_mlp
  comm_s = n_dense * block_comm_s(app, system, tokens, tp, ep, adp, False)
  if app.is_moe:
    mlp = mlp + n_moe * moe_mlp_s(app, system, code, tokens, tp, ep, etp,
                                  adp, w.weight_bytes_per_param, w.act_bytes)
    comm_s = comm_s + n_moe * block_comm_s(app, system, tokens, tp, ep, adp,
                                           True)
  attention = blocks * attn
  head = lm_head_s(app, system, code, batch, tp)
  # A worker within one tier-0 domain sends over tier 0, else tier 1.
  size = tp * pp * adp
  tier = np.where(size <= system.networks.size[0], 0,
                  min(1, system.num_networks - 1))
  pp_s = np.where(pp > 1, comm.p2p_time_s(
    system, tokens * app.hidden * REDUCE_BYTES, tier), 0.0)
  stage = attention + mlp + comm_s + head + pp_s
  return ForwardTimes(attention, mlp, comm_s, head, pp_s, stage,
                      attention + mlp + comm_s)
