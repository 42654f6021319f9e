"""Continuous batching's steady state (Orca; Sarathi-Serve).

Iteration-level scheduling (Yu et al. 2022, Orca, OSDI, section 4): every
iteration runs one decode token of each running sequence and, when
prompts wait, prefill tokens: whole prompts up to the iteration's token
budget (``max_num_tokens``), or with chunked prefill chunks of them
(Agrawal et al. 2024, Sarathi-Serve, OSDI, section 4: 'stall-free'
batching, prefill chunks co-scheduled with the decodes).  A framework that
does not mix (SGLang without ``--enable-mixed-chunk``) runs prefill
iterations alone.

Per iteration, ``q`` prefill tokens cost q x tau (tau: a prompt token's
share of a prefill pass, :mod:`calculon.serving.prefill`) plus, when
mixed, the decode step t_dec(C).  Over one cycle of a closed loop (every
user's request served once, all requests the same length):

* the user's group's prefill iterations I_own = ceil(g x isl / q), each
  of min(q, g x isl) tokens, and all groups' I_p = ceil(C / g) x I_own (requests of equal lengths that finished together
  arrive together: g = the framework's ``arrival_burst`` share of the
  users, at least 1);
* iterations I = osl - 1 + I_own (one decode token per iteration);
* cycle W = I_p x t_mix + max(I - I_p, 0) x t_dec when mixed (a
  prefill-bound cycle when I_p > I), I_p x t_mix + (osl - 1) x t_dec when
  prefill iterations run alone;
* TTFT = (I_own + 1) / 2 x t_mix (the group's prompts first come, first
  served); TPOT = (W - TTFT) / (osl - 1) (decodes stalled
  by the other users' prefills, Sarathi-Serve section 3); throughput = C x
  osl / W.

Open loop at a Poisson rate lambda (:func:`open_loop`): prefill takes a
share rho = lambda x isl x tau of the GPU, decode iterations stretch to
t_dec / (1 - rho), a prompt waits an M/D/1 queue rho tau_p / (2 (1 -
rho)) (Kleinrock 1975, Queueing Systems vol. 1, Pollaczek-Khinchine), and
the running batch is Little's law's C = lambda x latency (solved by
fixed-point iteration).

Every iteration adds the host's time: ``overhead_s`` and, where the
framework's host work runs between GPU steps (vLLM before V1),
``host_per_seq_s`` per running (decoding) sequence; an iteration that
carries prefill tokens also adds ``prefill_host_s``, the dispatch of
layers its prefill runs outside a CUDA graph (vLLM).

A finite benchmark (:func:`drain`: N requests sent at once, the request
rate infinite) is not a steady state: its throughput is N x osl over the
makespan, the prefill of the first wave, the steady closed loop while
requests beyond the running limit wait for slots, and the drain of the
last wave; with variable (exponential) output lengths the drain runs to
the longest of them, (osl - 1) H_B steps at shrinking batches.

Reads: nothing (arrays in, arrays out).
"""

import numpy as np


def group_size(concurrency, isl, max_num_tokens):
  """Prompts one iteration takes when they arrive together: floor(budget
  / isl), between 1 and the concurrency."""
  return np.clip(np.floor(max_num_tokens / isl), 1, concurrency)


def prefill_tokens_per_iteration(concurrency, isl, max_num_tokens, chunked,
                                 mixed, chunk):
  """Prefill tokens an iteration takes: with chunked prefill, the chunk
  (at most the budget), less the running decode tokens when mixed (vLLM's
  scheduler serves the decodes first; at least 1 token); without, the
  whole prompts of a group (:func:`group_size`)."""
  if chunked:
    budget = np.minimum(max_num_tokens, chunk)
    left = budget - (np.asarray(concurrency) if mixed else 0)
    return np.maximum(left, 1.0)
  return group_size(concurrency, isl, max_num_tokens) * isl


def closed_loop(concurrency, isl, osl, t_dec, tau, q, mixed, group,
                overhead_s=0.0, t_dec_of=None, t_ride_of=None,
                host_per_seq_s=0.0, prefill_host_s=0.0):
  """Steady state of ``concurrency`` users, each sending its next request
  when one returns (see the module).  Arrays broadcast.

  Args:
    t_dec: decode step seconds at the running batch.
    tau: seconds of prefill per prompt token.
    q: prefill tokens per iteration.
    group: prompts that arrive together (requests of the same length
      that finished together); they are prefilled first come, first
      served in iterations of ``q`` tokens, so the group's mean TTFT is
      (n + 1) / 2 iterations for n = ceil(group x isl / q).
    overhead_s: host time of every iteration (the framework's
      ``step_overhead_s``).
    t_dec_of: decode step seconds at a batch (vectorized), or None.  When
      given, mixed iterations decode the mean running batch
      C (osl - 1) / max(I, I_p): over a cycle each user decodes osl - 1
      tokens, and when prefill bounds the cycle (I_p > I) users queue for
      their prompt without decoding (Little's law over the cycle).
    t_ride_of: seconds a batch of decode tokens adds to a mixed iteration
      whose GEMMs they share with the prefill tokens (vectorized), or
      None (a mixed iteration then costs the prefill plus a whole decode
      step).  Given, a mixed iteration costs max(prefill + ride, decode
      step): the decodes' weights are read once with the prefill's
      (Agrawal et al. 2024, Sarathi-Serve, OSDI, section 3.3:
      piggybacked decodes).
    host_per_seq_s: host time per decoding sequence of every iteration,
      serialized with the GPU step (the framework's
      ``host_per_sequence_s``; 0 where the host keeps up).
    prefill_host_s: host time of every iteration that carries prefill
      tokens (:func:`calculon.serving.frameworks.prefill_dispatch_s`).

  Returns:
    dict of arrays: 'ttft_s', 'tpot_s', 'latency_s' (W), 'requests_per_s',
    'output_tokens_per_s'.  When prefill bounds a mixed cycle every
    iteration carries a decode token of each running user, so TPOT is
    one iteration and the queue for prefill is TTFT.
  """
  C = np.asarray(concurrency, float)
  group_tokens = group * isl
  i_own = np.ceil(group_tokens / q)
  i_p = np.ceil(C / group) * i_own
  iterations = (osl - 1) + i_own
  decoding = C * np.maximum(osl - 1, 0) / np.maximum(iterations, i_p)
  if mixed and t_dec_of is not None:
    t_dec = np.asarray(t_dec_of(np.maximum(decoding, 1.0)), float)
  prefill = np.minimum(q, group_tokens) * tau
  host_dec = overhead_s + host_per_seq_s * (
    np.maximum(decoding, 1.0) if (mixed and t_dec_of is not None) else C)
  if mixed and t_ride_of is not None:
    # The decodes ride in the prefill's GEMMs (one weight read for both).
    t_mix = np.maximum(prefill + np.asarray(
      t_ride_of(np.maximum(decoding, 1.0)), float), t_dec) + host_dec
  t_dec = t_dec + host_dec
  if not (mixed and t_ride_of is not None):
    t_mix = prefill + (t_dec if mixed else overhead_s)
  t_mix = t_mix + prefill_host_s
  ttft = (i_own + 1) / 2 * t_mix
  if mixed:
    # Other groups' prefill iterations also step this user's decode.
    W = i_p * t_mix + np.maximum(iterations - i_p, 0) * t_dec
    ttft = np.where(i_p > iterations,
                    np.maximum(W - np.maximum(osl - 1, 0) * t_mix, ttft), ttft)
  else:
    # Prefill iterations run alone: every one stalls every decode.
    W = i_p * t_mix + (osl - 1) * t_dec
  tpot = np.where(osl > 1, (W - ttft) / np.maximum(osl - 1, 1), 0.0)
  return {'ttft_s': ttft, 'tpot_s': tpot, 'latency_s': W,
          'requests_per_s': C / W, 'output_tokens_per_s': C * osl / W}


def open_loop(rate, isl, osl, t_dec_of, tau, q, mixed, max_running,
              overhead_s=0.0, iterations=60, host_per_seq_s=0.0,
              prefill_host_s=0.0, round_steps=1):
  """Steady state of Poisson arrivals at ``rate`` requests/s (see the
  module); ``t_dec_of(C)`` gives the decode step at a running batch C
  (vectorized), each iteration with the host's ``overhead_s`` plus
  ``host_per_seq_s`` per running sequence.  An iteration that carries
  prefill adds ``prefill_host_s``; the prompts that arrived since the
  last one share it, n = max(1, rate x the iterations between
  admissions: the stretched step x ``round_steps``, vLLM's scheduler
  steps), so its share of the time is rate / n x ceil(isl / q) x
  ``prefill_host_s`` (with the prompts' own prefill, rho).  Returns the
  dict of :func:`closed_loop` plus 'concurrency' and 'overloaded' (rho
  >= 1 or more running sequences than ``max_running``: the rate exceeds
  what the deployment serves)."""
  rate = np.asarray(rate, float)
  chunks = np.ceil(isl / q)
  rho_gpu = rate * isl * tau
  C = np.maximum(rate * 0 + 1.0, 1.0)
  n = np.ones_like(C)
  for _ in range(iterations):
    rho = rho_gpu + rate / n * chunks * prefill_host_s
    r = np.minimum(rho, 0.999)
    tau_p = isl * tau + chunks * prefill_host_s / n
    c_run = np.clip(np.round(C), 1, max_running)
    t_dec = t_dec_of(c_run) + overhead_s + host_per_seq_s * c_run
    tpot = t_dec / (1 - r)
    own = chunks * (np.minimum(q, isl) * tau + prefill_host_s +
                    (t_dec if mixed else overhead_s))
    ttft = np.maximum(own, tau_p) + t_dec / 2 + r * tau_p / (2 * (1 - r))
    latency = ttft + (osl - 1) * tpot
    C = 0.5 * C + 0.5 * np.maximum(rate * latency, 1.0)
    n = 0.5 * n + 0.5 * np.maximum(rate * tpot * round_steps, 1.0)
  overloaded = (rho >= 1) | (C > max_running)
  return {'ttft_s': ttft, 'tpot_s': np.where(osl > 1, tpot, 0.0),
          'latency_s': latency, 'requests_per_s': rate,
          'output_tokens_per_s': rate * osl, 'concurrency': C,
          'overloaded': overloaded}


def static_batch(batch, osl, t_prefill, t_dec, overhead_s=0.0,
                 host_per_seq_s=0.0):
  """A static batch (no continuous batching): all prompts prefilled in one
  pass, then osl - 1 decode steps of the whole batch, each iteration with
  the host's ``overhead_s`` (and each decode step ``host_per_seq_s`` per
  sequence)."""
  t_prefill = t_prefill + overhead_s
  t_dec = t_dec + overhead_s + host_per_seq_s * np.asarray(batch, float)
  W = t_prefill + (osl - 1) * t_dec
  return {'ttft_s': t_prefill, 'tpot_s': np.where(osl > 1, t_dec, 0.0),
          'latency_s': W, 'requests_per_s': batch / W,
          'output_tokens_per_s': batch * osl / W}


def drain(requests, run, isl, osl, t_dec_of, tau, q, steady, variable,
          overhead_s=0.0, host_per_seq_s=0.0, prefill_host_s=0.0):
  """A finite benchmark: ``requests`` sent at once (request rate
  infinite), at most ``run`` running; the batch drains to the last
  request.  Arrays broadcast (``requests`` and ``run`` per rank).

  Phases (B = min(requests, run)):

  * prefill of the first B prompts, first come first served in
    iterations of ``q`` tokens: T_pre = B isl tau + I (overhead +
    prefill host),
    I = ceil(B isl / q); the wave's mean TTFT = T_pre (I + 1) / (2 I)
    (schedulers take waiting prompts first: vLLM ``Scheduler._schedule``,
    TensorRT-LLM's in-flight batching; Sarathi-Serve section 2.3);
  * the requests beyond B enter as slots free, at the steady closed
    loop's rate X of B users (``steady``: the dict of
    :func:`closed_loop` at B): T_mid = (requests - B) / X; each waits
    T_pre + its place in line / X, then the steady TTFT;
  * the drain of the last B: equal lengths finish together after
    osl - 1 steps of t_dec(B); variable lengths (``variable``:
    i.i.d. exponential decode lengths of mean osl - 1, memoryless, so
    the same for the last B whenever they started) finish one by one:
    while r run, the next finish comes after (osl - 1) / r steps in
    expectation (the minimum of r exponentials), so T_drain =
    sum_{r=1..B} (osl - 1) / r x t_dec(r) and the last request ends
    after (osl - 1) H_B steps (H_B the harmonic number).

  Throughput = requests x osl / (T_pre + T_mid + T_drain); TPOT the
  token-weighted mean step (the drain's: t_dec(B) equal, the mean of
  t_dec(r) over r = 1..B variable); TTFT the mean over all requests.

  Args:
    t_dec_of: decode step seconds at a running batch (vectorized).
    tau: seconds of prefill per prompt token; q: prefill tokens per
      iteration.
    overhead_s: host time of every iteration; host_per_seq_s: host time
      per running sequence of every decode iteration; prefill_host_s:
      host time of every iteration that carries prefill tokens.

  Returns:
    dict of arrays as :func:`closed_loop` plus 'makespan_s'.
  """
  N = np.asarray(requests, float)
  B = np.maximum(np.floor(np.minimum(N, np.asarray(run, float))), 1)
  i_pre = np.ceil(B * isl / q)
  t_pre = B * isl * tau + i_pre * (overhead_s + prefill_host_s)
  ttft_wave = t_pre * (i_pre + 1) / (2 * i_pre)
  X = np.asarray(steady['requests_per_s'], float)
  rest = np.maximum(N - B, 0)
  t_mid = rest / X
  steps = max(osl - 1, 0)
  if variable:
    top = int(np.max(B))
    r = np.arange(1, top + 1, dtype=float)
    t_r = np.asarray(t_dec_of(r), float) * np.ones_like(r) + overhead_s + \
      host_per_seq_s * r
    by_r = np.concatenate([[0.0], np.cumsum(t_r / r)])
    mean_r = np.concatenate([[0.0], np.cumsum(t_r)])
    idx = B.astype(np.int64)
    t_drain = steps * by_r[idx]
    tpot_drain = mean_r[idx] / B
  else:
    tpot_drain = t_dec_of(B) + overhead_s + host_per_seq_s * B
    t_drain = steps * tpot_drain
  makespan = t_pre + t_mid + t_drain
  ttft = (B * ttft_wave + rest * (t_pre + rest / (2 * X) +
                                  steady['ttft_s'])) / N
  tpot = np.where(osl > 1, (B * tpot_drain + rest * steady['tpot_s']) / N,
                  0.0)
  return {'ttft_s': ttft, 'tpot_s': tpot,
          'latency_s': ttft + steps * tpot, 'makespan_s': makespan,
          'requests_per_s': N / makespan,
          'output_tokens_per_s': N * osl / makespan}
