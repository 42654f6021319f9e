"""Serving framework presets: ``frameworks/serving/NAME.json``.

Each preset states, with a source at a named version, the defaults a
deployment's left-out fields take (``defaults``: field -> {value,
source}), how its memory fraction is meant (``memory_rule``: 'total' --
vLLM's share of the whole memory for weights, activations and KV cache;
'free_after_weights' -- TensorRT-LLM's share of the memory left after the
weights and buffers; 'static' -- SGLang's share of the whole memory for
weights and KV cache), its KV block size (``kv_block_tokens``), whether
its iterations mix prefill with decodes (``mixes_prefill``), the modes it
runs (``modes``) and the host time per running sequence it adds to a
step (``host_per_sequence_s``).

Reads: the JSON files only.
"""

import json
import os

from calculon.errors import ConfigError

_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
  os.path.abspath(__file__)))), 'frameworks', 'serving')


def names():
  """Names of the serving presets (sorted)."""
  return sorted(f[:-5] for f in os.listdir(_DIR) if f.endswith('.json'))


def load(name, source='<deployment>'):
  """The preset ``name`` as a dict.

  Raises:
    ConfigError: no such preset.
  """
  path = os.path.join(_DIR, f'{name}.json')
  if name not in names():
    allowed = ', '.join(names())
    raise ConfigError(f"{source}: field 'framework' = \"{name}\" is not "
                      f'allowed: one of {allowed}', source=source,
                      field='framework', value=name, allowed=allowed)
  with open(path, encoding='utf-8') as f:
    return json.load(f)


def modes(preset):
  """The serving modes the framework runs (the preset's ``modes``; both
  'aggregated' and 'disaggregated' when it states none)."""
  entry = preset.get('modes')
  return tuple(entry['value']) if entry else ('aggregated', 'disaggregated')


def mixes(preset, chunked=False):
  """Whether the framework's iterations mix prefill tokens with the
  running decodes (the preset's ``mixes_prefill``, its ``chunked_value``
  with chunked prefill where it has one: TensorRT-LLM's in-flight
  batching and vLLM V1 mix; SGLang without --enable-mixed-chunk runs
  prefill iterations alone, and vLLM v0.5 does unless chunked prefill is
  on)."""
  entry = preset.get('mixes_prefill') or {}
  if chunked and 'chunked_value' in entry:
    return bool(entry['chunked_value'])
  return bool(entry.get('value', True))


def host_per_sequence_s(preset, scheduler_steps=1):
  """Seconds of host time per running sequence per iteration that the
  GPU step waits for (the preset's ``host_per_sequence_s``, 0 when absent:
  a framework whose host work keeps up with the GPU).  A value paid once
  per scheduling round (``per_scheduling_round``: vLLM 0.6's scheduler
  and input preparation) is spread over the round's ``scheduler_steps``
  decode steps.

  The value is derived by ``python -m calculon.validation.host_share``.
  """
  entry = preset.get('host_per_sequence_s')
  if entry is None:
    return 0.0
  value = float(entry['value'])
  if entry.get('per_scheduling_round'):
    value /= max(int(scheduler_steps or 1), 1)
  return value


def prefill_dispatch_s(preset, num_blocks):
  """Seconds of host dispatch an iteration that carries prefill tokens
  adds, for a model of ``num_blocks`` blocks: the preset's
  ``prefill_dispatch_s_per_layer`` x the blocks (0 when absent).  The
  prefill path runs the layers outside a whole-model CUDA graph, so the
  framework's Python dispatch of each layer (tensor creation, kernel
  launches) is paid on the iteration; a prompt crosses every layer."""
  entry = preset.get('prefill_dispatch_s_per_layer')
  if entry is None:
    return 0.0
  return float(entry['value']) * int(num_blocks)


def default(preset, field, capacity_gib=80.0, tp=1, pp=1, is_a100=False):
  """The preset's default for deployment field ``field`` on a GPU of
  ``capacity_gib`` (the GPU-size branches vLLM and SGLang take; see each
  preset's source), or None when it has none."""
  entry = preset.get('defaults', {}).get(field)
  if entry is None:
    return None
  value = entry.get('value')
  name = preset['name']
  if name == 'vllm' and field in ('max_num_seqs', 'max_num_tokens') and (
      capacity_gib < 70 or is_a100):
    value = entry['small_gpu_value']
  if name == 'sglang' and field == 'max_num_tokens':
    mem_gb = capacity_gib * 2 ** 30 / 1e9
    if mem_gb >= 160:
      value = entry['large_gpu_value']
    elif mem_gb < 60:
      value = entry['mid_gpu_value']
  return value


def sglang_memory_fraction(preset, capacity_bytes, chunk_tokens, tp, pp):
  """SGLang's mem_fraction_static for a GPU of ``capacity_bytes``
  (python/sglang/srt/server_args.py ``_handle_gpu_memory_settings``):
  (gpu_mem - reserved) / gpu_mem with reserved (MB) = 512 + 1.5 x
  max(chunk, 2048) + 2 x cuda_graph_max_bs + 1024 x TP x PP / 8, at least
  10,240 MB above 60 GB.  Scalars or arrays."""
  import numpy as np
  gpu_mb = capacity_bytes / 2 ** 20
  graph = preset['cuda_graph_max_bs']
  graph_bs = np.where(np.asarray(tp) < 4, graph['small_tp_value'],
                      graph['value'])
  reserved = 512 + 1.5 * np.maximum(chunk_tokens, 2048) + 2 * graph_bs + \
    1024 * np.asarray(tp) * np.asarray(pp) / 8
  reserved = np.where(gpu_mb > 60 * 1024, np.maximum(reserved, 10 * 1024),
                      reserved)
  return np.round((gpu_mb - reserved) / gpu_mb, 3)


#: trtllm-bench's caps (tensorrt_llm/bench/build/tuning.py
#: ``finetune_setting``, NVIDIA/TensorRT-LLM @a7e572fb): the batch at most
#: 4,096 sequences, the token budget at most 32,768.
TRTLLM_BENCH_MAX_BATCH = 4096
TRTLLM_BENCH_MAX_TOKENS = 32768


def trtllm_bench_limits(params, num_layers, kv_heads, head_size,
                        capacity_bytes, tp, pp, isl, osl, weight_bytes,
                        kv_bytes, fraction=0.95):
  """(max_batch_size, max_num_tokens) that ``trtllm-bench`` builds an
  engine with when a run states neither (NVIDIA/TensorRT-LLM
  tensorrt_llm/bench/build/tuning.py @a7e572fb, ``calc_engine_setting``
  and ``finetune_setting``): the tool's own estimate of the requests the
  KV cache holds, R = fraction x (GPU GiB x TP x PP - params / 1e9 x
  bytes per weight) / (2 L max(TP, kv_heads) head_size x KV bytes / GiB)
  / (isl + osl); then raw_bs = min(R, 4096) / PP, raw_tokens =
  min(raw_bs (1 + isl / osl), 32768), each rounded up to the tool's steps
  (batch: at least 64, multiples of 32 below 256, 128 below 1024, else
  256; tokens: at least 2048, multiples of 256 below 4096, 512 below
  8192, else 1024).  Scalars (Python numbers)."""
  per_token_gib = 2 * num_layers * max(tp, kv_heads) * head_size * \
    kv_bytes / 2 ** 30
  available = capacity_bytes / 2 ** 30 * tp * pp - params / 1e9 * \
    weight_bytes
  requests = max(available * fraction / per_token_gib / (isl + osl), 0.0)
  raw_bs = min(requests, TRTLLM_BENCH_MAX_BATCH) / pp
  raw_tokens = min(raw_bs * (1 + isl / osl), TRTLLM_BENCH_MAX_TOKENS)
  bs = _round_up_in_steps(raw_bs, 64, ((256, 32), (1024, 128)), 256)
  tokens = _round_up_in_steps(raw_tokens, 2048, ((4096, 256), (8192, 512)),
                              1024)
  return int(bs), int(tokens)


def _round_up_in_steps(x, least, bands, last_step):
  """``x`` rounded up to the step of the first (below, step) band it is
  below (``last_step`` above them all), at least ``least``."""
  import math
  step = next((st for below, st in bands if x < below), last_step)
  return max(least, step * math.ceil(x / step))
