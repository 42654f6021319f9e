"""One deployment's figures: the serving mode composed in one place.

:func:`price` takes an application, a system and a resolved deployment
(:func:`calculon.serving.deployment.resolve`) and returns its memory per
GPU, the KV cache's capacity, and TTFT, TPOT, request latency and
throughputs, with the parts that add up.  The workload decides the
steady state: a static batch, a closed loop at a concurrency, an open
loop at a request rate, or offline max throughput (as many sequences as
``max_num_seqs`` and the KV cache allow, a closed loop at that
concurrency), or a finite benchmark (``num_requests`` sent at once:
the drain of the batch, :func:`calculon.serving.batching.drain`); with
``scheduler_steps`` n > 1 (vLLM multi-step scheduling) 'itl_ms' is the
gap between bursts of n tokens and TTFT waits (n - 1) / 2 steps more;
the mode decides aggregated (:mod:`~calculon.serving.batching`)
or disaggregated (:mod:`~calculon.serving.disagg`).  ``concurrency`` may
be an array (the search prices a column of them in one pass).

Every iteration adds the framework's host time: ``step_overhead_s`` and,
where the preset states it, ``host_per_sequence_s`` per running sequence
(vLLM v0.5's API server and scheduler ran between GPU steps); an
iteration that carries prefill tokens adds the preset's prefill dispatch
(``prefill_dispatch_s_per_layer`` x the blocks: vLLM).

Reads: :mod:`~calculon.serving.kv_cache`, :mod:`~calculon.serving.prefill`,
:mod:`~calculon.serving.decode`, :mod:`~calculon.serving.batching`,
:mod:`~calculon.serving.disagg`, the framework preset.
"""

from types import SimpleNamespace

import numpy as np

from calculon.serving import batching, disagg, frameworks
from calculon.serving import kv_cache as kvc
from calculon.serving.decode import accepted_tokens, decode_step_s
from calculon.serving.prefill import prefill_s

#: Bytes per activation element kept live by a forward over one token
#: (16-bit): the block input and residual, the attention output, and the
#: MLP's gate and up outputs of a TP shard; what the framework's profiling
#: run sizes its activation reserve by (vLLM gpu_worker.py
#: determine_available_memory runs a forward of max_num_batched_tokens).
ACT_BYTES = 2


def worker(dep, prefix=''):
  """The parallelism and datatypes of a (decode or prefill) worker."""
  return SimpleNamespace(
    tensor_par=getattr(dep, prefix + 'tensor_par'),
    pipeline_par=getattr(dep, prefix + 'pipeline_par'),
    expert_par=getattr(dep, prefix + 'expert_par'),
    expert_tensor_par=dep.expert_tensor_par, attention_dp=dep.attention_dp,
    weight_bytes_per_param=dep.weight_bytes_per_param,
    act_bytes=dep.act_bytes)


def activation_bytes(app, tp, max_num_tokens, max_num_seqs):
  """Peak activations of one forward of ``max_num_tokens`` tokens on one
  GPU (the residual stream, the attention output and the MLP's gate and
  up shards, 16-bit) plus the float32 logits of ``max_num_seqs``
  sequences (vocabulary sharded over TP)."""
  width = app.moe_ffn_hidden * app.top_k if app.is_moe else app.feedforward
  per_token = (3 * app.hidden + 2 * width / tp) * ACT_BYTES
  logits = max_num_seqs * (app.vocab_size or 0) / tp * 4
  return max_num_tokens * per_token + logits


def memory(app, system, dep, w, isl, osl):
  """Memory per GPU and the KV cache's capacity (dict): 'weights_bytes'
  (and 'weights' by part), 'activations_bytes', 'runtime_bytes',
  'kv_cache_bytes', 'memory_fraction', 'kv_bytes_per_token',
  'kv_tokens', 'max_concurrency' (sequences of isl + osl tokens the cache
  holds, per attention-DP rank), 'free_bytes' (what is left)."""
  preset = dep.preset
  cap = system.mem1.capacity_bytes
  tp, pp = w.tensor_par, w.pipeline_par
  weights = kvc.weight_bytes_per_gpu(app, tp, pp, w.expert_par,
                                     w.expert_tensor_par,
                                     dep.weight_bytes_per_param)
  act = activation_bytes(app, tp, dep.max_num_tokens, dep.max_num_seqs)
  runtime = kvc.runtime_bytes(system, tp, pp)
  frac = dep.memory_fraction
  if frac is None:
    frac = frameworks.sglang_memory_fraction(
      preset, cap, dep.max_num_tokens, tp, pp)
  kv = kvc.kv_capacity(preset['memory_rule'], frac, cap, weights['total'],
                       act, runtime)
  per_token = kvc.kv_bytes_per_token(app, tp, pp, dep.kv_bytes)
  block = preset['kv_block_tokens']['value']
  tokens = kvc.paged_tokens(kv, per_token, block)
  ctx = isl + osl
  seq_bytes = kvc.kv_bytes_per_sequence(app, tp, pp, dep.kv_bytes, ctx)
  seq_pages = np.ceil(seq_bytes / (per_token * block))
  max_conc = np.floor(tokens / block / np.maximum(seq_pages, 1))
  used = weights['total'] + act + runtime + kv
  return {'weights': weights, 'weights_bytes': weights['total'],
          'activations_bytes': act, 'runtime_bytes': runtime,
          'kv_cache_bytes': kv, 'memory_fraction': frac,
          'kv_bytes_per_token': per_token, 'kv_tokens': tokens,
          'kv_bytes_per_sequence': seq_bytes,
          'max_concurrency': max_conc, 'capacity_bytes': cap,
          'free_bytes': cap - used}


def price(app, system, dep, concurrency=None):
  """The figures of deployment ``dep`` (see the module).

  Args:
    concurrency: overrides the deployment's (array allowed: a column of
      concurrencies priced at once).

  Returns:
    dict of arrays: 'feasible' and 'reason' (infeasible: the weights and
    one sequence's KV cache do not fit; a prompt longer than the
    iteration's token budget without chunked prefill; a request rate the
    deployment cannot serve), 'ttft_ms', 'tpot_ms', 'latency_ms',
    'output_tokens_per_s' (whole deployment), '..._per_gpu',
    'output_tokens_per_s_per_user', 'input_tokens_per_s', 'concurrency'
    (running), 'gpus', the memory of :func:`memory`, and the decode
    step's parts ('decode_parts_ms').
  """
  isl, osl = dep.isl, dep.osl
  w = worker(dep)
  mem = memory(app, system, dep, w, isl, osl)
  dtype = dep.activation_datatype
  spec = dep.speculative_tokens
  gain = accepted_tokens(spec, dep.speculative_accept_rate)
  ctx = isl + osl / 2.0
  adp = dep.attention_dp
  max_run = np.minimum(mem['max_concurrency'], dep.max_num_seqs)
  reason = ''
  if np.all(mem['max_concurrency'] < 1):
    reason = ('the weights ({:.1f} GiB) and one sequence\'s KV cache '
              '({:.2f} GiB) do not fit in the memory the framework leaves '
              '({:.1f} GiB of {:.1f} GiB)').format(
                float(np.max(mem['weights_bytes'])) / 2 ** 30,
                float(np.max(mem['kv_bytes_per_sequence'])) / 2 ** 30,
                float(np.max(mem['kv_cache_bytes'] +
                             mem['weights_bytes'])) / 2 ** 30,
                mem['capacity_bytes'] / 2 ** 30)
  chunked = bool(dep.chunked_prefill)
  if not chunked and isl > dep.max_num_tokens and not reason:
    reason = (f'a prompt of {isl} tokens exceeds max_num_tokens '
              f'({dep.max_num_tokens}) without chunked prefill')
  mixed = frameworks.mixes(dep.preset, bool(dep.chunked_prefill))
  overhead = preset_value(dep.preset, 'step_overhead_s', 0.0)
  per_seq = frameworks.host_per_sequence_s(dep.preset, dep.scheduler_steps)
  pre_host = frameworks.prefill_dispatch_s(dep.preset, app.num_blocks)
  eff = preset_value(dep.preset, 'roofline_efficiency', 1.0)
  gpus_worker = w.tensor_par * w.pipeline_par * adp

  def t_dec_of(c):
    t, _ = decode_step_s(app, system, w, np.asarray(c), ctx, dep.kv_bytes,
                         dtype, spec)
    return t / gain / eff

  if dep.static_batch is not None:
    B = np.asarray(dep.static_batch)
    per_rank = np.ceil(B / adp)
    t_pre, _ = prefill_s(app, system, w, per_rank.astype(np.int64), isl,
                         dtype)
    t_pre = t_pre / eff + pre_host
    t_dec = t_dec_of(per_rank)
    out = batching.static_batch(B, osl, t_pre, t_dec, overhead, per_seq)
    running = B
    if np.any(per_rank > mem['max_concurrency']) and not reason:
      reason = (f'a static batch of {int(np.max(B))} sequences exceeds '
                'what the KV cache holds '
                f'({int(np.min(mem["max_concurrency"])) * adp})')
  elif dep.mode == 'disaggregated':
    out, running = _disaggregated(app, system, dep, w, mem, concurrency,
                                  t_dec_of, max_run, per_seq, pre_host)
    gpus_worker = None
  elif dep.request_rate is not None:
    rate = dep.request_rate / adp
    q = batching.prefill_tokens_per_iteration(1, isl, dep.max_num_tokens,
                                              chunked, mixed,
                                              dep.prefill_chunk)
    tau = _tau(app, system, w, isl, dtype, batching.group_size(
      max_run, isl, dep.max_num_tokens), eff)
    out = batching.open_loop(rate, isl, osl, t_dec_of, tau, q, mixed,
                             np.maximum(max_run, 1), overhead,
                             host_per_seq_s=per_seq,
                             prefill_host_s=pre_host,
                             round_steps=dep.scheduler_steps or 1)
    # A queue is stable only below its greatest service rate (Kleinrock
    # 1975, Queueing Systems vol. 1, section 2.1): what the deployment
    # serves with a backlog (the offline figure).
    saturated = _aggregated(app, system, dep, w, np.maximum(max_run, 1),
                            t_dec_of, chunked, mixed, overhead, per_seq,
                            backlog=True, pre_host=pre_host)[
                              'requests_per_s']
    out['overloaded'] = out['overloaded'] | (rate > saturated)
    out['requests_per_s'] = out['requests_per_s'] * adp
    out['output_tokens_per_s'] = out['output_tokens_per_s'] * adp
    running = out['concurrency'] * adp
    if np.any(out['overloaded']) and not reason:
      reason = (f'the request rate {dep.request_rate}/s exceeds what the '
                'deployment serves (prefill share, running sequences or '
                'the rate beyond what it serves with a backlog, '
                f'{float(np.min(saturated)) * adp:.4g}/s)')
  elif dep.num_requests is not None:
    N = np.maximum(np.ceil(dep.num_requests / adp), 1)
    cap = np.maximum(max_run, 1)
    if dep.concurrency is not None:
      cap = np.minimum(cap, np.maximum(np.ceil(dep.concurrency / adp), 1))
    run = np.minimum(N, cap)
    steady = _aggregated(app, system, dep, w, run, t_dec_of, chunked,
                         mixed, overhead, per_seq, backlog=True,
                         pre_host=pre_host)
    st = steady['steady']
    out = batching.drain(N, run, isl, osl, t_dec_of, st['tau'], st['q'],
                         steady, bool(dep.variable_lengths), overhead,
                         per_seq, pre_host)
    out['steady'] = st
    out['requests_per_s'] = out['requests_per_s'] * adp
    out['output_tokens_per_s'] = out['output_tokens_per_s'] * adp
    running = run * adp
  else:
    C = concurrency if concurrency is not None else dep.concurrency
    offline = C is None
    if offline:
      C = np.maximum(max_run, 1) * adp
    C = np.asarray(C, float)
    per_rank = np.maximum(np.ceil(C / adp), 1)
    run = np.minimum(per_rank, np.maximum(max_run, 1))
    out = _aggregated(app, system, dep, w, run, t_dec_of, chunked, mixed,
                      overhead, per_seq, backlog=offline, pre_host=pre_host)
    # Users beyond what runs at once wait for a slot (Little's law).
    X = out['requests_per_s']
    cycle = per_rank / X
    out['ttft_s'] = out['ttft_s'] + (cycle - out['latency_s'])
    out['latency_s'] = cycle
    out['requests_per_s'] = X * adp
    out['output_tokens_per_s'] = out['output_tokens_per_s'] * adp
    running = run * adp
  # Multi-step scheduling: a prompt that arrives during a round of n
  # steps waits its residual beyond the one step already priced, (n - 1)
  # / 2 steps in the mean; tokens reach the client in bursts of n.
  n_round = dep.scheduler_steps
  if n_round > 1:
    out['ttft_s'] = out['ttft_s'] + (n_round - 1) / 2 * out['tpot_s']
    out['latency_s'] = out['latency_s'] + (n_round - 1) / 2 * out['tpot_s']
  gpus = gpus_worker if gpus_worker is not None else out.pop('gpus')
  res = {
    'feasible': reason == '', 'reason': reason, 'gpus': gpus,
    'concurrency': running,
    'ttft_ms': out['ttft_s'] * 1e3, 'tpot_ms': out['tpot_s'] * 1e3,
    'itl_ms': out['tpot_s'] * n_round * 1e3,
    'latency_ms': out['latency_s'] * 1e3,
    'requests_per_s': out['requests_per_s'],
    'output_tokens_per_s': out['output_tokens_per_s'],
    'output_tokens_per_s_per_gpu': out['output_tokens_per_s'] / gpus,
    'output_tokens_per_s_per_user': np.where(
      out['tpot_s'] > 0, 1.0 / np.maximum(out['tpot_s'], 1e-12), 0.0),
    'input_tokens_per_s': out['requests_per_s'] * isl,
  }
  for k in ('prefill_requests_per_s', 'decode_requests_per_s', 'steady'):
    if k in out:
      res[k] = out[k]
  if 'makespan_s' in out:
    res['makespan_ms'] = out['makespan_s'] * 1e3
  res['memory'] = mem
  _, parts = decode_step_s(app, system, w, np.maximum(
    np.asarray(res['concurrency']) / adp, 1), ctx, dep.kv_bytes, dtype,
    spec)
  f = parts['times']
  res['decode_parts_ms'] = {
    'attention_and_norms': f.attention * w.pipeline_par * 1e3,
    'mlp': f.mlp * w.pipeline_par * 1e3,
    'communication': f.comm * w.pipeline_par * 1e3,
    'lm_head': f.head * w.pipeline_par * 1e3,
    'pipeline_sends': f.pp * w.pipeline_par * 1e3,
    'kv_cache_reads': parts['kv'] * 1e3, 'draft': parts['draft'] * 1e3}
  gpu_ms = sum(np.asarray(v) for v in res['decode_parts_ms'].values())
  res['decode_parts_ms']['kernels_below_roofline'] = gpu_ms * (1 / eff - 1)
  res['decode_parts_ms']['host_per_step'] = (overhead + per_seq * np.maximum(
    np.asarray(res['concurrency']) / adp, 1)) * 1e3 + 0 * gpu_ms
  return res


def preset_value(preset, name, default):
  """A number of the serving preset (``{"value": ...}``), or ``default``."""
  entry = preset.get(name)
  return default if entry is None else entry['value']


def _tau(app, system, w, isl, dtype, group, eff=1.0):
  """Seconds of prefill per prompt token, from a pass of ``group``
  prompts."""
  g = np.maximum(np.asarray(group), 1).astype(np.int64)
  t, _ = prefill_s(app, system, w, g, isl, dtype)
  return t / (g * isl) / eff


def _aggregated(app, system, dep, w, run, t_dec_of, chunked, mixed,
                overhead, per_seq, backlog=False, pre_host=0.0):
  """Continuous batching's closed loop at ``run`` running sequences per
  rank (:func:`calculon.serving.batching.closed_loop`).

  ``backlog``: requests wait in the engine's queue (offline max
  throughput, a finite benchmark sent at once), so every slot that frees
  is refilled in the next iteration and each prefill iteration takes as
  many whole waiting prompts as its token budget holds: the prompts
  that arrive together are floor(q / isl) (at least 1), whatever the
  preset's ``arrival_burst`` (the share of a closed loop's *clients*
  that arrive together).  With variable (exponential) output
  lengths the running sequences finish one by one, about run / osl per
  step, so a prefill iteration takes the ceil(run / osl) freed since the
  last (at most the budget's floor(q / isl)).  The schedulers admit
  waiting prompts while the budget allows: vLLM
  ``Scheduler._schedule_prefills`` (vllm/core/scheduler.py, the V0
  engine) and ``Scheduler.schedule`` (vllm/v1/core/sched/scheduler.py,
  V1); TensorRT-LLM
  ``MicroBatchScheduler`` (cpp/tensorrt_llm/batch_manager/
  microBatchScheduler.cpp), up to ``max_num_tokens``.
  """
  isl, osl = dep.isl, dep.osl
  q = batching.prefill_tokens_per_iteration(run, isl, dep.max_num_tokens,
                                            chunked, mixed,
                                            dep.prefill_chunk)
  per_pass = batching.group_size(run, isl, dep.max_num_tokens)
  eff = preset_value(dep.preset, 'roofline_efficiency', 1.0)
  tau = _tau(app, system, w, isl, dep.activation_datatype,
             np.minimum(per_pass, np.maximum(np.floor(q / isl), 1)), eff)
  if backlog:
    group = np.floor(q / isl)
    if dep.variable_lengths:
      group = np.minimum(np.ceil(run / max(osl, 1)), group)
  else:
    group = np.round(preset_value(dep.preset, 'arrival_burst', 0.0) * run)
  group = np.clip(group, 1, run)
  t_dec = t_dec_of(run)

  def t_ride_of(c):
    # Decode tokens fused into a prefill iteration: their GEMM FLOP at
    # the prefill's per-token rate plus their attention over the cache.
    _, parts = decode_step_s(app, system, w, np.asarray(c), isl + osl / 2.0,
                             dep.kv_bytes, dep.activation_datatype,
                             dep.speculative_tokens)
    return np.asarray(c) * tau + parts['kv'] / eff

  out = batching.closed_loop(run, isl, osl, t_dec, tau, q, mixed, group,
                             overhead, t_dec_of, t_ride_of, per_seq,
                             pre_host)
  out['steady'] = {'run': run, 'isl': isl, 'osl': osl, 't_dec': t_dec,
                   'tau': tau, 'q': q, 'mixed': mixed, 'group': group,
                   'prefill_host_s': pre_host,
                   't_dec_of': t_dec_of, 't_ride_of': t_ride_of}
  return out


def _disaggregated(app, system, dep, w, mem, concurrency, t_dec_of,
                   max_run, per_seq, pre_host=0.0):
  isl, osl = dep.isl, dep.osl
  pw = worker(dep, 'prefill_')
  x, y = dep.prefill_workers, dep.decode_workers
  C = concurrency if concurrency is not None else dep.concurrency
  if C is None:
    C = np.maximum(max_run, 1) * dep.attention_dp * y
  C = np.asarray(C, float)
  per_dec = np.minimum(np.maximum(np.ceil(C / (y * dep.attention_dp)), 1),
                       np.maximum(max_run, 1))
  group = batching.group_size(C / x, isl, dep.max_num_tokens)
  t_pass, _ = prefill_s(app, system, pw, group.astype(np.int64), isl,
                        dep.activation_datatype)
  t_pass = t_pass / preset_value(dep.preset, 'roofline_efficiency', 1.0)
  p_gpus = pw.tensor_par * pw.pipeline_par
  d_gpus = w.tensor_par * w.pipeline_par * dep.attention_dp
  tier = dep.kv_transfer_net
  if tier is None:
    tier = 0 if (x * p_gpus + y * d_gpus) <= system.networks.size[0] \
      else min(1, system.num_networks - 1)
  transfer = disagg.kv_transfer_s(app, system, isl, dep.kv_bytes, p_gpus,
                                  tier)
  running = per_dec * y * dep.attention_dp
  overhead = preset_value(dep.preset, 'step_overhead_s', 0.0)
  host = overhead + per_seq * per_dec
  out = disagg.pools(running, osl, t_pass + overhead + pre_host, group, x,
                     y * dep.attention_dp, t_dec_of(per_dec) + host,
                     transfer)
  out['gpus'] = x * p_gpus + y * d_gpus
  return out, running
