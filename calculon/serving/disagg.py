"""Disaggregated serving: prefill workers and decode workers (DistServe;
Splitwise).

Prompts run on ``x`` prefill workers, their KV caches cross the network
to ``y`` decode workers, which run only decode steps (Zhong et al. 2024,
DistServe, OSDI, section 3; Patel et al. 2024, Splitwise, ISCA, section
4: no prefill stalls the decodes, each pool with its own parallelism).
The pools pipeline: the deployment serves min(prefill capacity, decode
capacity) requests per second.

KV transfer (:func:`kv_transfer_s`): the prompt's whole KV cache (every
block, every K/V head) leaves the prefill worker's GPUs in parallel, each
at its link rate on the tier the transfer crosses (Splitwise section 4.3:
layer-by-layer transfer overlapped with the prefill; priced here
unoverlapped, after it).

Reads: the system's network tiers, :mod:`calculon.serving.kv_cache`.
"""

import numpy as np

from calculon.serving.kv_cache import kv_bytes_per_token_layer


def kv_transfer_s(app, system, isl, kv_bytes, prefill_gpus, tier):
  """Seconds to move one prompt's KV cache (isl tokens, all blocks, K/V
  of every head at TP 1) from ``prefill_gpus`` GPUs over ``tier``."""
  total = kv_bytes_per_token_layer(app, 1, kv_bytes) * app.num_blocks * isl
  per_gpu = total / np.asarray(prefill_gpus)
  return system.networks.time_s('p2p', per_gpu, 2, tier)


def pools(concurrency, osl, prefill_pass_s, group, prefill_workers,
          decode_workers, t_dec, transfer_s):
  """Steady state of a closed loop of ``concurrency`` users over the two
  pools.  Prefill workers run passes of ``group`` prompts
  (``prefill_pass_s`` each); decode workers hold concurrency /
  decode_workers sequences each and step them every ``t_dec``.

  Returns the dict of :func:`calculon.serving.batching.closed_loop`
  plus 'prefill_requests_per_s' and 'decode_requests_per_s' (the pools'
  capacities)."""
  C = np.asarray(concurrency, float)
  x_p = prefill_workers * group / prefill_pass_s
  per_dec = C / decode_workers
  x_d = decode_workers * per_dec / np.maximum((osl - 1) * t_dec, 1e-12)
  ttft = prefill_pass_s + transfer_s
  W = ttft + (osl - 1) * t_dec
  x = np.minimum(np.minimum(C / W, x_p), x_d)
  W = C / x
  tpot = np.where(osl > 1, t_dec, 0.0)
  ttft = W - (osl - 1) * tpot
  return {'ttft_s': ttft, 'tpot_s': tpot, 'latency_s': W,
          'requests_per_s': x, 'output_tokens_per_s': x * osl,
          'prefill_requests_per_s': x_p, 'decode_requests_per_s': x_d}
