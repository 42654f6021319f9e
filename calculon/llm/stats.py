"""The statistics of a run: Calculon's names, units and where they come from.

:data:`STATS` lists every statistic in Calculon's order (its JSON and CSV
column order) with its unit, the :class:`~calculon.llm.model.Evaluation`
attribute holding it, and a description.  Reporters (text, JSON, CSV,
Parquet) read this table; they never reach into the model.
"""

from collections import namedtuple

import numpy as np

Stat = namedtuple('Stat', 'name attr unit description')

_S = Stat
STATS = (
  _S('block_fw_flops', 'block.fw_flops', 'FLOP', 'forward FLOP, one block, one microbatch'),
  _S('block_fw_flops_time', 'block.fw_flops_time', 's', 'forward compute time, one block'),
  _S('block_fw_mem_accessed', 'block.fw_mem_bytes', 'B', 'forward memory traffic, one block'),
  _S('block_fw_mem_time', 'block.fw_mem_time', 's', 'forward memory time, one block'),
  _S('block_fw_time', 'block.fw_time', 's', 'forward time, one block'),
  _S('baseblock_fw_tp_time', 'block.base_fw_tp_time', 's', 'forward TP communication, base block'),
  _S('edgeblock_fw_tp_time', 'block.edge_fw_tp_time', 's', 'forward TP communication, edge block'),
  _S('baseblock_fw_tp_time_exposed', 'block.base_fw_tp_exposed', 's', 'exposed forward TP communication, base block'),
  _S('edgeblock_fw_tp_time_exposed', 'block.edge_fw_tp_exposed', 's', 'exposed forward TP communication, edge block'),
  _S('block_re_flops', 'block.re_flops', 'FLOP', 'recompute FLOP, one block'),
  _S('block_re_flops_time', 'block.re_flops_time', 's', 'recompute compute time, one block'),
  _S('block_re_mem_accessed', 'block.re_mem_bytes', 'B', 'recompute memory traffic, one block'),
  _S('block_re_mem_time', 'block.re_mem_time', 's', 'recompute memory time, one block'),
  _S('block_re_time', 'block.re_time', 's', 'recompute time, one block'),
  _S('baseblock_recomm_time', 'block.base_recomm_time', 's', 'redone TP communication, base block'),
  _S('edgeblock_recomm_time', 'block.edge_recomm_time', 's', 'redone TP communication, edge block'),
  _S('baseblock_recomm_time_exposed', 'block.base_recomm_exposed', 's', 'exposed redone TP communication, base block'),
  _S('edgeblock_recomm_time_exposed', 'block.edge_recomm_exposed', 's', 'exposed redone TP communication, edge block'),
  _S('block_agrad_flops', 'block.agrad_flops', 'FLOP', 'activation-gradient FLOP, one block'),
  _S('block_agrad_flops_time', 'block.agrad_flops_time', 's', 'activation-gradient compute time'),
  _S('block_agrad_mem_accessed', 'block.agrad_mem_bytes', 'B', 'activation-gradient memory traffic'),
  _S('block_agrad_mem_time', 'block.agrad_mem_time', 's', 'activation-gradient memory time'),
  _S('block_agrad_time', 'block.agrad_time', 's', 'activation-gradient time, one block'),
  _S('baseblock_agrad_tp_time', 'block.base_agrad_tp_time', 's', 'backward TP communication, base block'),
  _S('edgeblock_agrad_tp_time', 'block.edge_agrad_tp_time', 's', 'backward TP communication, edge block'),
  _S('baseblock_agrad_tp_time_exposed', 'block.base_agrad_tp_exposed', 's', 'exposed backward TP communication, base block'),
  _S('edgeblock_agrad_tp_time_exposed', 'block.edge_agrad_tp_exposed', 's', 'exposed backward TP communication, edge block'),
  _S('block_wgrad_flops', 'block.wgrad_flops', 'FLOP', 'weight-gradient FLOP, one block'),
  _S('block_wgrad_flops_time', 'block.wgrad_flops_time', 's', 'weight-gradient compute time'),
  _S('block_wgrad_mem_accessed', 'block.wgrad_mem_bytes', 'B', 'weight-gradient memory traffic'),
  _S('block_wgrad_mem_time', 'block.wgrad_mem_time', 's', 'weight-gradient memory time'),
  _S('block_wgrad_time', 'block.wgrad_time', 's', 'weight-gradient time, one block'),
  _S('block_optim_flops', 'block.optim_flops', 'FLOP', 'optimizer FLOP, one block'),
  _S('block_optim_flops_time', 'block.optim_flops_time', 's', 'optimizer compute time, one block'),
  _S('block_optim_mem_accessed', 'block.optim_mem_bytes', 'B', 'optimizer memory traffic, one block'),
  _S('block_optim_mem_time', 'block.optim_mem_time', 's', 'optimizer memory time, one block'),
  _S('block_optim_time', 'block.optim_time', 's', 'optimizer time, one block'),
  _S('baseblock_fw_tp_size', 'block.base_fw_tp_bytes', 'B', 'forward TP communication size, base block'),
  _S('edgeblock_fw_tp_size', 'block.edge_fw_tp_bytes', 'B', 'forward TP communication size, edge block'),
  _S('baseblock_bw_tp_size', 'block.base_agrad_tp_bytes', 'B', 'backward TP communication size, base block'),
  _S('edgeblock_bw_tp_size', 'block.edge_agrad_tp_bytes', 'B', 'backward TP communication size, edge block'),
  _S('baseblock_recomm_size', 'block.base_recomm_bytes', 'B', 'redone TP communication size, base block'),
  _S('edgeblock_recomm_size', 'block.edge_recomm_bytes', 'B', 'redone TP communication size, edge block'),
  _S('block_fw_pp_size', 'block_fw_pp_bytes', 'B', 'activation sent to the next pipeline stage'),
  _S('block_bw_pp_size', 'block_bw_pp_bytes', 'B', 'gradient sent to the previous pipeline stage'),
  _S('block_dp_size', 'block_dp_bytes', 'B', 'gradients reduced across DP, one block'),
  _S('tp_bw_overlap_req', 'block.tp_bw_overlap_req', 'B/s', 'TP bandwidth needed to hide tiled TP communication'),
  _S('dp_bw_overlap_req_chunk', 'dp_bw_overlap_req_chunk', 'B/s', 'DP bandwidth needed to hide DP in overlappable chunks'),
  _S('dp_bw_overlap_req_tail', 'dp_bw_overlap_req_tail', 'B/s', 'DP bandwidth needed to hide DP in the last chunk'),
  _S('block_weight_space', 'block.weight_bytes', 'B', 'weights, one block'),
  _S('block_act_working_space', 'block.act_working_bytes', 'B', 'activation working space, one block'),
  _S('block_act_storage_space', 'block.act_storage_bytes', 'B', 'activations stored for backward, one block'),
  _S('block_act_checkpoint_size', 'block_act_checkpoint_bytes', 'B', 'activation checkpoint, one block'),
  _S('block_weight_grad_space', 'block.weight_grad_bytes', 'B', 'weight gradients (sharded), one block'),
  _S('block_weight_grad_space_no_sharding', 'block.weight_grad_unsharded_bytes', 'B', 'weight gradients (fp32, unsharded), one block'),
  _S('block_act_grad_space', 'block.act_grad_bytes', 'B', 'activation gradients, one block'),
  _S('block_optimizer_space', 'block.optimizer_bytes', 'B', 'optimizer state, one block'),
  _S('weight_space_with_offload', 'weight_bytes_min', 'B', 'weights kept in tier 1 when offloaded'),
  _S('act_space_with_offload', 'act_bytes_min', 'B', 'activations kept in tier 1 when offloaded'),
  _S('act_checkpoint_size_with_offload', 'act_checkpoint_bytes_min', 'B', 'checkpoints kept in tier 1 when offloaded (null in inference)'),
  _S('act_grad_space_with_offload', 'act_grad_bytes', 'B', 'activation gradients kept in tier 1'),
  _S('weight_grad_space_with_offload', 'weight_grad_bytes_min', 'B', 'weight gradients kept in tier 1 when offloaded'),
  _S('optimizer_space_with_offload', 'optimizer_bytes_min', 'B', 'optimizer state kept in tier 1 when offloaded'),
  _S('weight_space', 'weight_bytes', 'B', 'weights per processor'),
  _S('act_space', 'act_bytes', 'B', 'activations per processor'),
  _S('act_checkpoint_size', 'act_checkpoint_bytes', 'B', 'activation checkpoints per processor'),
  _S('act_grad_space', 'act_grad_bytes', 'B', 'activation gradients per processor'),
  _S('weight_grad_space', 'weight_grad_bytes', 'B', 'weight gradients per processor'),
  _S('optimizer_space', 'optimizer_bytes', 'B', 'optimizer state per processor'),
  _S('fw_time', 'fw_time_s', 's', 'forward compute, whole batch'),
  _S('bw_time', 'bw_time_s', 's', 'backward compute, whole batch'),
  _S('optim_step_time', 'optim_step_time_s', 's', 'optimizer step'),
  _S('recompute_time', 'recompute_time_s', 's', 'activation recomputation'),
  _S('recomm_link_time', 'recomm_link_time_s', 's', 'redone TP communication on the link'),
  _S('recomm_exposed_time', 'recomm_exposed_time_s', 's', 'redone TP communication exposed'),
  _S('bubble_time', 'bubble_time_s', 's', 'pipeline bubble'),
  _S('tp_comm_link_time', 'tp_comm_link_time_s', 's', 'TP communication on the link'),
  _S('pp_comm_link_time', 'pp_comm_link_time_s', 's', 'PP communication on the link'),
  _S('dp_comm_link_time', 'dp_comm_link_time_s', 's', 'DP communication on the link'),
  _S('tp_comm_exposed_time', 'tp_comm_exposed_time_s', 's', 'TP communication exposed'),
  _S('pp_comm_exposed_time', 'pp_comm_exposed_time_s', 's', 'PP communication exposed'),
  _S('dp_comm_exposed_time', 'dp_comm_exposed_time_s', 's', 'DP communication exposed'),
  _S('fw_offload_exposed_time', 'fw_offload_exposed_time_s', 's', 'forward offload exposed'),
  _S('bw_offload_exposed_time', 'bw_offload_exposed_time_s', 's', 'backward offload exposed'),
  _S('total_time', 'total_time_s', 's', 'time of one batch'),
  _S('act_offload_bw_req', 'act_offload_bw_req', 'B/s', 'tier-2 bandwidth to offload activations'),
  _S('weight_offload_bw_req', 'weight_offload_bw_req', 'B/s', 'tier-2 bandwidth to offload weights'),
  _S('optim_offload_bw_req', 'optim_offload_bw_req', 'B/s', 'tier-2 bandwidth to offload optimizer state'),
  _S('offload_mem_bw_req', 'offload_mem_bw_req', 'B/s', 'tier-2 bandwidth for all offloading'),
  _S('proc_mem_tier1_cap_req', 'mem1_bytes', 'B', 'memory tier 1 needed per processor'),
  _S('proc_mem_tier2_cap_req', 'mem2_bytes', 'B', 'memory tier 2 needed per processor'),
  _S('useful_flops', 'useful_flops', 'FLOP', 'model FLOP, one block and microbatch'),
  _S('compute_efficiency', 'compute_efficiency', '1', 'useful FLOP at peak / compute time'),
  _S('system_efficiency', 'system_efficiency', '1', 'compute time / batch time'),
  _S('total_efficiency', 'total_efficiency', '1', 'useful FLOP at peak / batch time'),
  _S('sample_rate', 'sample_rate', '1/s', 'samples per second'),
)
#: Statistics of the features beyond Calculon (0 when unused), appended
#: to Calculon's list.
MODERN_STATS = (
  _S('cp_comm_link_time', 'cp_comm_link_time_s', 's', 'context-parallel communication (ring or all-gather) on the link'),
  _S('cp_comm_exposed_time', 'cp_comm_exposed_time_s', 's', 'context-parallel communication (ring or all-gather) exposed'),
  _S('fsdp_comm_link_time', 'fsdp_comm_link_time_s', 's', 'FSDP (ZeRO-3) all-gathers and reduce-scatters on the link'),
  _S('fsdp_comm_exposed_time', 'fsdp_comm_exposed_time_s', 's', 'FSDP (ZeRO-3) communication exposed'),
  _S('fsdp_copy_time', 'fsdp_copy_time_s', 's', 'FSDP buffer copies on the compute stream (PyTorch FSDP2)'),
  _S('embedding_time', 'embedding_time_s', 's', 'embedding forward + backward, whole batch, first stage'),
  _S('lm_head_time', 'lm_head_time_s', 's', 'LM head and loss forward + backward, whole batch, last stage'),
  _S('embedding_lm_head_time', 'vocab_extra_time_s', 's', 'what the embedding, LM head and loss add to the batch time (compute, optimizer, DP)'),
  _S('embedding_lm_head_dp_time', 'vocab_dp_time_s', 's', 'DP communication of the embedding and LM head weights'),
  _S('embedding_weight_space', 'embed.weight_bytes', 'B', 'embedding weights (unsharded), first stage'),
  _S('lm_head_weight_space', 'head.weight_bytes', 'B', 'LM head weights (unsharded), last stage'),
  _S('lm_head_act_space', 'head_activation_bytes', 'B', 'LM head and loss activations (logits), last stage'),
  _S('ep_comm_link_time', 'ep_comm_link_time_s', 's', 'expert-parallel token dispatch and combine on the link'),
  _S('ep_comm_exposed_time', 'ep_comm_exposed_time_s', 's', 'expert-parallel communication exposed'),
  _S('expert_weight_space', 'expert_weight_bytes', 'B', 'routed-expert weights per processor (unsharded)'),
  _S('overhead_time', 'overhead_time_s', 's', "the system's fixed overheads (per step and per microbatch), whole batch"),
  _S('moe_host_time', 'moe_host_time_s', 's', "time the MoE blocks wait for the host beyond their GPU work (overhead per_moe_block_s), whole batch"),
  _S('host_optimizer_time', 'host_optimizer_time_s', 's', "what the optimizer step on the host adds beyond the device step (the optimizer state offloaded and stepped on the host)"),
  _S('proc_mem_tier1_usable', 'mem1_usable_bytes', 'B', 'memory tier 1 a run may fill per processor (capacity less the memory_reserve headroom and runtime)'),
  _S('tp_overlap_buffer_space', 'tp_overlap_buffer_bytes', 'B', "communication buffers of the tiled TP overlap outside the allocator (Transformer Engine userbuffers), per processor; part of what proc_mem_tier1_usable leaves out"),
  _S('first_stage_mem_tier1_cap_req', 'first_stage_mem1_bytes', 'B', 'memory tier 1 needed by a first-stage processor'),
  _S('last_stage_mem_tier1_cap_req', 'last_stage_mem1_bytes', 'B', 'memory tier 1 needed by a last-stage processor'),
)
#: Calculon's statistics (its JSON order).
CALCULON_STAT_NAMES = tuple(s.name for s in STATS)
STATS = STATS + MODERN_STATS
STAT_NAMES = tuple(s.name for s in STATS)

#: More statistics, beyond Calculon's list (reports, DataFrames).
EXTRA_STATS = (
  _S('tokens_per_sec', 'tokens_per_s', '1/s', 'tokens per second'),
  _S('model_flops_per_batch', 'model_flops_per_batch', 'FLOP', 'model FLOP of one batch, whole attention matrix (PaLM, torchtitan)'),
  _S('model_flops_per_batch_causal', 'model_flops_per_batch_causal', 'FLOP', 'model FLOP of one batch, causal half of the attention matrix (Megatron-LM 2025, NeMo)'),
  _S('model_tflops_per_proc', 'model_tflops_per_proc', 'TFLOP/s', 'model TFLOP/s per processor'),
  _S('mfu', 'mfu', '1', 'model FLOP utilization (whole attention matrix)'),
  _S('mfu_causal', 'mfu_causal', '1', 'model FLOP utilization (causal convention)'),
  _S('num_parameters', 'num_parameters', '1', 'trainable parameters'),
  _S('num_active_parameters', 'num_active_parameters', '1', 'parameters a token uses (MoE: top-k experts)'),
  _S('hardware_flops_per_proc', 'hardware_flops_per_proc', 'FLOP', 'FLOP executed per processor per batch'),
  _S('hfu', 'hfu', '1', 'hardware FLOP utilization'),
  _S('blocks_per_proc', 'blocks_per_proc', '1', 'transformer blocks per processor'),
  _S('num_microbatches', 'num_microbatches', '1', 'microbatches per batch per replica'),
) + tuple(
  _S(f'{kind}_tier{t + 1}_bytes', f'memory_by_kind.{kind}.{t}', 'B',
     f"{kind.replace('_', ' ')} in memory tier {t + 1}")
  for kind in ('weights', 'activations', 'checkpoints', 'weight_gradients',
               'optimizer', 'activation_gradients') for t in (0, 1))
EXTRA_STAT_NAMES = tuple(s.name for s in EXTRA_STATS)
STATS_BY_NAME = {s.name: s for s in STATS + EXTRA_STATS}


def time_breakdown(evaluation, index=()):
  """The batch time term by term for the execution at ``index``: an
  ordered dict name -> seconds (float) whose values sum to its
  ``total_time`` (:attr:`~calculon.llm.terms.metrics.MetricsTerms.
  time_breakdown_s`; names are statistics' names, e.g. ``fw_time``,
  ``host_optimizer_time``, ``dp_comm_exposed_time``).

  Raises:
    AssertionError: the terms do not sum to ``total_time`` within 1e-9
      relative (an engine inconsistency, never expected).
  """
  shape = evaluation.exe.shape
  with np.errstate(divide='ignore', invalid='ignore', over='ignore'):
    parts = {name: float(np.broadcast_to(np.asarray(v, dtype=float),
                                         shape)[index])
             for name, v in evaluation.time_breakdown_s.items()}
    total = float(np.broadcast_to(np.asarray(evaluation.total_time_s,
                                             dtype=float), shape)[index])
  summed = sum(parts.values())
  assert not np.isfinite(total) or abs(summed - total) <= \
    1e-9 * abs(total), f'time_breakdown sums to {summed}, not {total}'
  return parts


def stat_value(evaluation, stat):
  """The array of ``stat`` (a :class:`Stat` or name) from an Evaluation."""
  if isinstance(stat, str):
    stat = STATS_BY_NAME[stat]
  obj = evaluation
  for part in stat.attr.split('.'):
    obj = obj[int(part)] if part.isdigit() else (
      obj[part] if isinstance(obj, dict) else getattr(obj, part))
  return obj


def stat_arrays(evaluation, names=STAT_NAMES):
  """dict name -> float64 array broadcast to the executions' shape."""
  shape = evaluation.exe.shape
  with np.errstate(divide='ignore', invalid='ignore', over='ignore'):
    return {n: np.broadcast_to(np.asarray(stat_value(evaluation, n),
                                          dtype=float), shape)
            for n in names}
