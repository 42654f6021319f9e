"""The serving suite: measured serving runs against ``calculon serve``.

Every row of ``../shared/measurements/serving_runs.csv`` (or ``--runs``
CSV files in its columns, documented in ``../shared/README.md``) is one
measured figure of one deployment.  :func:`deployment_of` maps a row to a
deployment by the conventions below, the same for every source; a row
whose model, GPU or lengths have no counterpart here is reported
unpriced with the reason.  :func:`run_suite` prices every row;
``error_pct`` = 100 x (predicted / measured - 1).

Conventions (what a row leaves unstated):

* model: the bundled application of the same architecture
  (:data:`MODELS`; Llama 3.1 = Llama 3 shapes, DeepSeek-R1 = DeepSeek-V3);
* GPU: the datasheet system file (:data:`SYSTEMS`), never a calibrated
  one;
* precision: FP4/NVFP4/MXFP4 -> float4 weights and activations (bfloat16
  activations on GPUs without float4 GEMMs), INT4/AWQ/GPTQ/W4A16 -> int4
  weights with bfloat16 activations, FP8 -> float8,
  BF16/FP16 as written, 'not recorded' -> bfloat16; the KV cache in the
  activation datatype unless the notes say an FP8 KV cache;
* framework: the row's (trtllm, vllm, sglang; a vLLM version before 0.6
  in the framework text or the notes -> vllm-v0.5, 0.6-0.7 ->
  vllm-v0.6); unspecified -> trtllm;
  TensorRT-LLM prompts longer than its 8,192-token default budget raise
  ``max_num_tokens`` to the prompt (it takes whole prompts); its preset's
  defaults for what the notes do not state
  (``max_num_tokens``, ``max_num_seqs``, memory fraction, chunked
  prefill); the notes' ``kv_cache_free_gpu_mem_fraction X``,
  ``gpu-mem-util X``, ``mem_frac X``, ``max-num-seqs N``,
  ``max_num_tokens N`` and chunked prefill on or off
  (``chunked prefill True``, ``--enable-chunked-prefill``) are read;
* workload: 'concurrency=N' a closed loop of N users; 'static batch=B'
  a static batch; 'request_rate=R' an open loop; 'offline max-throughput',
  'request_rate=inf' the offline
  maximum (as many sequences as the KV cache and max_num_seqs allow);
  'Server' or 'Interactive' without a rate (MLPerf Inference's
  scenarios) the highest Poisson rate whose mean TTFT and TPOT meet
  MLPerf's targets for the model (:data:`SERVER_TARGETS_MS`; none known:
  the highest rate the deployment sustains;
  :func:`calculon.serving.search.highest_rate`);
  a finite benchmark at an infinite rate ('N prompts at
  request_rate=inf', 'request_rate=inf, N prompts', or 'N requests' in
  the source or notes) ``num_requests`` N: the drain of the batch
  (output tokens / makespan, prefill of all N and the tail as requests
  finish; :func:`calculon.serving.batching.drain`), with
  ``variable_lengths`` for ShareGPT rows (exponential output lengths of
  the mean: the tail runs to the longest of N);
  ShareGPT (variable lengths) -> isl 230, osl 200 (:data:`SHAREGPT`:
  approximate means of the ShareGPT_V3 conversations the benchmark
  scripts sample, not measured here);
* parallelism: tp, pp from the row; num_gpus / (tp x pp) replicas, each
  priced alone and the throughput multiplied; MoE without an EP
  stated: EP = TP (the experts spread over the worker), with
  'moe_ep=N, moe_tp=M' in the notes those; 'attention_dp=True' attention
  DP over the worker;
* vLLM multi-step scheduling: the notes' '--num-scheduler-steps N' or
  'multi-step N' on a vLLM row sets ``scheduler_steps`` N (a flag of
  another framework named in the notes is not that row's); itl_*
  metrics are the gap between streamed bursts (N steps), tpot_* the
  mean per token;
* statistic: mean, median or unstated are all compared with the model's
  steady-state figure (the model has no distribution);
* metric kind: throughput (total_output_tokens_per_s, output_tokens_per_s:
  the whole deployment; output_tokens_per_s_per_gpu; '.../user' the
  rate one user sees, 1 / TPOT; requests, queries or samples per second;
  'total token throughput' input plus output), TPOT/ITL (tpot_*, itl_*,
  token_time_ms), TTFT (ttft_*, prompt_time_ms), latency (a request's
  end to end: 'E2E latency', 'e2el', 'request latency', 'average
  latency', the model's TTFT + (osl - 1) TPOT; ms unless seconds are
  named).

No row of this suite is fitted: the suite prices with the datasheet
files and the presets' values, whose three fitted parameters per
framework come from AIConfigurator silicon runs that no row here cites
(:mod:`calculon.validation.serving_fit`; docs/serving.md, 'Accuracy').

Reads: the CSV, the bundled models and systems, :mod:`calculon.serving`.
"""

import csv
import math
import os
import re

import numpy as np

from calculon.errors import ConfigError

MODELS = {
  'llama-3.1-70b': 'llama3-70B', 'llama-3-70b': 'llama3-70B',
  'llama-3.1-8b': 'llama3-8B', 'llama-3-8b': 'llama3-8B',
  'llama-2-70b': 'llama2-70B', 'llama-2-13b': 'llama2-13B',
  'llama-2-7b': 'llama2-7B', 'llama-3.1-405b': 'llama3.1-405B',
  'mixtral-8x7b': 'mixtral-8x7B', 'mixtral-8x22b': 'mixtral-8x22B',
  'deepseek-r1': 'deepseek-v3', 'deepseek-v3': 'deepseek-v3',
  'qwen3-235b-a22b': 'qwen3-235B-A22B', 'qwen3-30b-a3b': 'qwen3-30B-A3B',
  'qwen2.5-72b': 'qwen2.5-72B', 'qwen3-32b': 'qwen3-32B',
  'gpt-oss-120b': 'gpt-oss-120b', 'llama-4-scout': 'llama4-scout',
  'llama-4-maverick': 'llama4-maverick', 'mistral-7b': 'mistral-7B',
  'gpt-j-6b': 'gpt-j-6B', 'gpt-j': 'gpt-j-6B',
  # Llama 3.3 70B is Llama 3.1 70B's architecture (Meta's model card);
  # so are the checkpoints fine-tuned from it: DeepSeek-R1-Distill-
  # Llama-70B (from Llama-3.3-70B-Instruct, DeepSeek-R1 model card) and
  # Llama-3.1-Nemotron-70B (NVIDIA's model card).
  'llama-3.3-70b': 'llama3-70B', 'deepseek-r1-distill-llama-70b':
  'llama3-70B', 'llama-3.1-nemotron-70b': 'llama3-70B',
  # MLPerf Inference's GPT-J benchmark name ('gptj-99', 'gptj-99.9').
  'gptj': 'gpt-j-6B', 'gptj-6b': 'gpt-j-6B',
  'qwen3-8b': 'qwen3-8B', 'gpt-oss-20b': 'gpt-oss-20b',
  'falcon-180b': 'falcon-180B',
}
#: Checkpoint suffixes that name a variant of the same architecture.
_VARIANTS = ('-instruct', '-chat', '-hf', '-base', '-fp8', '-fp4', '-nvfp4',
             '-awq', '-gptq', '-int4', '-int8', '-dynamic', '-v1', '-it',
             # MLPerf Inference benchmark names: accuracy targets and the
             # interactive variant (mlcommons/inference loadgen/mlperf.conf).
             '-99', '-99.9', '-interactive')


def model_key(name):
  """The bundled application a row's model names (a key of MODELS's
  values), or None: case, spaces and underscores folded to hyphens, an
  organization prefix ('meta-llama/') and checkpoint-variant suffixes
  ('-Instruct', '-chat-hf', '-FP8', MLPerf's '-99.9' and
  '-interactive', ...) dropped, 'llama2' read as 'llama-2' and MLPerf's
  'llama3_1' as 'llama-3.1'."""
  m = name.strip().lower().split('/')[-1]
  m = re.sub(r'llama(\d)_(\d)', r'llama\1.\2', m)
  m = re.sub(r'[\s_]+', '-', m)
  m = re.sub(r'^(meta-)?llama-?(\d(?:\.\d)?)-?', r'llama-\2-', m)
  m = re.sub(r'-+', '-', m).strip('-')
  changed = True
  while changed and m not in MODELS:
    changed = False
    for suffix in _VARIANTS:
      if m.endswith(suffix):
        m, changed = m[:-len(suffix)], True
    # A checkpoint's version or release date: '-v0.1', '-v0.3', '-2407'.
    short = re.sub(r'-(v\d+(\.\d+)*|\d{4})$', '', m)
    if short != m and not changed:
      m, changed = short, True
  return MODELS.get(m)


def framework_key(text, notes=''):
  """'trtllm', 'vllm', 'vllm-v0.5', 'vllm-v0.6' or 'sglang' for a row's
  framework text (its name anywhere in it: 'TensorRT-LLM 0.17',
  'vllm-rocm', 'SGLang v0.4'), or None.  A vLLM by the version in the text
  or else the first vLLM version the notes name ('vLLM v0.5.4'): before
  0.6 'vllm-v0.5' (v0.6.0 rebuilt the engine's host side,
  blog.vllm.ai/2024/09/05/perf-update.html), 0.6 and 0.7 'vllm-v0.6'
  (the V0 engine, the default until 0.8.0), later or unstated 'vllm'."""
  t = (text or '').lower()
  for key, names in (('vllm', ('vllm',)), ('sglang', ('sglang',)),
                     ('trtllm', ('trtllm', 'tensorrt', 'trt-llm'))):
    if any(n in t for n in names):
      if key == 'vllm':
        version = VLLM_VERSION.search(t) or VLLM_VERSION.search(
          (notes or '').lower())
        v = (int(version.group(1)), int(version.group(2))) if version \
          else None
        if v is not None and v < (0, 6):
          return 'vllm-v0.5'
        if v is not None and v < (0, 8):
          return 'vllm-v0.6'
      return key
  return None


#: A vLLM version in a row's text ('vllm 0.5.4', 'vLLM v0.6.0').
VLLM_VERSION = re.compile(r'vllm[\s-]*v?(\d+)\.(\d+)')
#: GPU name fragment (lower case, first match wins) -> system file.
SYSTEMS = (
  ('gb300', 'gb300_nvl72_datasheet'), ('gb200', 'gb200_nvl72_datasheet'),
  ('b300', 'b300_datasheet'), ('b200', 'b200_datasheet'),
  ('h200', 'h200_141g_datasheet'), ('h100', 'h100_sxm_80g_datasheet'),
  ('a100', 'a100_sxm_80g_datasheet'), ('mi355', 'mi355x'),
  ('mi325', 'mi325x'), ('mi300', 'mi300x'),
)
#: Approximate mean prompt and output tokens of a ShareGPT benchmark run.
SHAREGPT = (230, 200)
#: MLPerf Inference's Server-scenario targets (TTFT ms, TPOT ms) by
#: bundled model: (server, interactive); mlcommons/inference
#: loadgen/mlperf.conf @001712e9 (``ttft_latency``, ``tpot_latency``, at
#: ``target_latency_percentile`` 99).
SERVER_TARGETS_MS = {
  'llama2-70B': ((2000, 200), (450, 40)),
  'mixtral-8x7B': ((2000, 200), None),
  'llama3.1-405B': ((6000, 175), (4500, 80)),
  'llama3-8B': ((2000, 100), (500, 30)),
  'deepseek-v3': ((2000, 80), (1500, 15)),
}
#: Key of a row's deployment fields carrying Server-scenario targets
#: (TTFT ms or None, TPOT ms or None): the row is priced at the highest
#: request rate that meets them (:func:`run_suite`).
SERVER_KEY = 'server_targets_ms'
KINDS = ('throughput', 'tpot', 'ttft', 'latency')
COLUMNS = ('id', 'source', 'model', 'gpu', 'num_gpus', 'tp', 'pp', 'ep',
           'precision', 'framework', 'isl', 'osl', 'concurrency_or_rate',
           'metric', 'value', 'notes')


def default_runs(base_dir):
  """../shared/measurements/serving_runs.csv next to the checkout."""
  return os.path.join(os.path.dirname(base_dir), 'shared', 'measurements',
                      'serving_runs.csv')


def read_runs(paths):
  """Rows of the CSV files (list of dicts).

  Raises:
    ConfigError: a missing file or a missing column.
  """
  rows = []
  for path in paths:
    if not os.path.isfile(path):
      raise ConfigError(f'{path}: serving runs file not found',
                        source=path)
    with open(path, newline='', encoding='utf-8') as f:
      reader = csv.DictReader(f)
      missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
      if missing:
        raise ConfigError(f"{path}: missing column '{missing[0]}' (the "
                          'serving runs columns: ' + ', '.join(COLUMNS) +
                          ')', source=path, field=missing[0])
      rows.extend(reader)
  return rows


#: Statistic words a metric name may open with ('median TTFT (ms)',
#: 'mean_tpot_ms', 'P99 ITL'); the suite compares every statistic with
#: the model's steady-state figure.
_STATISTICS = ('mean', 'median', 'avg', 'average', 'p50', 'p90', 'p95',
               'p99', 'p99.9')


def metric_text(metric):
  """A metric name folded for matching: lower case, spaces, slashes,
  hyphens and brackets as underscores, a leading statistic word moved
  to the end ('median TTFT (ms)' -> 'ttft_ms_median')."""
  m = re.sub(r'[\s/\-()]+', '_', metric.lower()).strip('_')
  head, _, rest = m.partition('_')
  if head in _STATISTICS and rest:
    m = f'{rest}_{head}'
  return m


#: Requests (not tokens) per second in a folded metric name: requests,
#: queries or samples per second ('req/s', 'samples/s'), 'qps'.
_REQUEST_RATE = (r'(samples|queries|requests|req)_(per_)?(s|sec|second)'
                 r'(_|$)|qps')
#: A throughput's unit: tokens per second ('tok/s', 'token/s',
#: 'tokens/sec'), 'tps' ('TPS/user'), or a request rate.
_RATE = (r'(tokens|token|tok)_(per_)?(s|sec|second)(_|$)|(^|_)tps(_|$)|'
         + _REQUEST_RATE)


def metric_kind(metric):
  """'throughput', 'tpot', 'ttft' or 'latency' (a request's end-to-end
  latency: 'E2E latency', 'e2el', 'request latency', 'average latency
  (s)') for a metric name, or None."""
  m = metric_text(metric)
  if m.startswith(('ttft', 'prompt_time', 'time_to_first_token',
                   'first_token')):
    return 'ttft'
  if m.startswith(('tpot', 'itl', 'token_time', 'inter_token',
                   'time_per_output_token', 'tbt')):
    return 'tpot'
  if re.search(_RATE, m):
    return 'throughput'
  if re.match(r'(e2el?|end_to_end|request|req)?_?latency|e2el(_|$)', m):
    return 'latency'
  return None


def _int(text):
  try:
    return int(float(text))
  except (TypeError, ValueError):
    return None


def _datatypes(precision, notes):
  p = precision.lower()
  if re.search(r'int4|w4a16|awq|gptq', p):
    w = 'int4'  # 4-bit integer weights, 16-bit activations (W4A16)
  elif 'fp4' in p:
    w = 'float4'
  elif 'fp8' in p:
    w = 'float8'
  elif 'fp16' in p and 'bf16' not in p:
    w = 'float16'
  else:
    w = 'bfloat16'
  kv = {'float4': 'float8', 'int4': 'bfloat16'}.get(w, w)
  if re.search(r'fp8 kv', notes, re.I):
    kv = 'float8'
  return w, kv


def deployment_of(row, base_dir):
  """(application path, system path, deployment fields, assumptions,
  replicas, metric kind) for a row, or a str: why it is not priced."""
  kind = metric_kind(row['metric'])
  if kind is None:
    return f"metric '{row['metric']}' is not a serving figure"
  model = model_key(row['model'])
  if model is None:
    return f"no bundled application for model '{row['model']}'"
  gpu = row['gpu'].lower()
  system = next((f for k, f in SYSTEMS if k in gpu), None)
  if system is None:
    return f"no system file for GPU '{row['gpu']}'"
  notes = row.get('notes') or ''
  assumptions = []
  tail = re.search(r'(^|_)(p9\d(\.\d)?)($|_)', metric_text(row['metric']))
  if tail and kind != 'throughput':
    assumptions.append(f'the {tail.group(2)} compared with the model\'s '
                       'steady-state mean (the model prices no tail)')
  if re.search(r'pcie|\bnvl\b|\b40\s*gb|gh200', gpu):
    assumptions.append(f"GPU '{row['gpu']}' priced as {system}.json (no "
                       'file of that variant)')
  isl, osl = _int(row['isl']), _int(row['osl'])
  variable = False
  if isl is None or osl is None:
    if 'sharegpt' in (row['isl'] + row['osl']).lower():
      isl, osl = SHAREGPT
      variable = True
      assumptions.append(f'ShareGPT lengths: isl {isl}, osl {osl}')
    else:
      return f"lengths isl '{row['isl']}', osl '{row['osl']}' not known"
  fw = framework_key(row['framework'], notes) if row['framework'] else \
    'trtllm'
  if fw == 'vllm-v0.5':
    assumptions.append('vLLM before 0.6: the vllm-v0.5 preset (host work '
                       'between GPU steps)')
  if fw == 'vllm-v0.6':
    assumptions.append('vLLM 0.6-0.7: the vllm-v0.6 preset (the V0 '
                       'engine\'s scheduling between GPU steps)')
  if fw is None:
    assumptions.append(f'framework {row["framework"]!r} priced as trtllm')
    fw = 'trtllm'
  w, kv = _datatypes(row['precision'], notes)
  app_path = os.path.join(base_dir, 'models', f'{model}.json')
  sys_path = os.path.join(base_dir, 'systems', f'{system}.json')
  if 'not recorded' in row['precision'].lower():
    assumptions.append('precision not recorded: bfloat16')
  tp = _int(row['tp'])
  pp = _int(row['pp']) or 1
  if tp is None:
    tp = _smallest_tp(app_path, base_dir, row, w, pp)
    assumptions.append(f'TP not stated: TP {tp}, the smallest power of two '
                       'whose weights take at most half of each GPU')
  f = {'framework': fw, 'tensor_par': tp, 'pipeline_par': pp,
       'weight_datatype': w, 'kv_cache_datatype': kv, 'isl': isl,
       'osl': osl}
  from calculon import io
  app = io.load_application(app_path)
  adp = 1
  m_adp = re.search(r'attention_dp=(\d+|true)', notes, re.I)
  if m_adp and app.is_moe:
    adp = tp if m_adp.group(1).lower() == 'true' else int(m_adp.group(1))
    if m_adp.group(1).lower() == 'true':
      f['tensor_par'] = 1
    if adp > 1:
      f['attention_dp'] = adp
  if app.is_moe:
    m_ep = re.search(r'moe_ep=(\d+)', notes)
    m_tp = re.search(r'moe_tp=(\d+)', notes)
    width = f['tensor_par'] * adp
    ep = int(m_ep.group(1)) if m_ep else (_int(row['ep']) or width)
    etp = int(m_tp.group(1)) if m_tp else max(1, width // ep)
    f['expert_par'], f['expert_tensor_par'] = ep, etp
    if not m_ep and not row['ep']:
      assumptions.append(f'EP not stated: EP {ep}')
  for pattern, field, conv in (
      (r'kv_cache_free_gpu_mem_fraction (0\.\d+)', 'memory_fraction', float),
      (r'gpu-mem-util (0\.\d+)', 'memory_fraction', float),
      (r'mem_frac (0\.\d+)', 'memory_fraction', float),
      (r'max-num-seqs (\d+)', 'max_num_seqs', int),
      (r'max_num_tokens[ =](\d+)', 'max_num_tokens', int)):
    m = re.search(pattern, notes, re.I)
    if m and field not in f:
      f[field] = conv(m.group(1))
  m_chunk = re.search(r'(--no-)?enable[-_]chunked[-_]prefill|chunked[ _-]'
                      r'prefill\s*[=:]?\s*(on|off|true|false|enabled|'
                      r'disabled)', notes, re.I)
  if m_chunk:
    f['chunked_prefill'] = not m_chunk.group(1) and (
      m_chunk.group(2) is None or m_chunk.group(2).lower() in (
        'on', 'true', 'enabled'))
  m_steps = re.search(r'(?:--num-scheduler-steps|multi-step) (\d+)', notes)
  if m_steps and fw in ('vllm', 'vllm-v0.6') and int(m_steps.group(1)) > 1:
    f['scheduler_steps'] = int(m_steps.group(1))
    assumptions.append(f'vLLM multi-step scheduling: {m_steps.group(1)} '
                       'steps a round (ITL = the gap between bursts)')
  load = row['concurrency_or_rate'].strip().lower()
  m_conc = re.search(r'(?:concurrency|users|clients)\s*[=:]?\s*(\d+)',
                     load) or re.search(
    r'(\d+)\s*(?:concurrent|parallel|simultaneous)?\s*(?:users|clients|'
    r'concurrent requests|concurrent)\b', load)
  m_static = re.match(r'static batch\s*[=:]?\s*(\d+)', load)
  m_batch = re.match(r'(?:batch(?:[ _]size)?|bs)\s*[=:]?\s*(\d+)$', load)
  m_prompts = re.match(r'(?:num[_ -]prompts\s*[=:]?\s*(\d+)|(\d+) '
                       r'(?:prompts|requests))$', load)
  m_rate = re.search(r'(?:request[_ ]rate|qps)\s*[=:]?\s*([\d.]+)', load) \
    or re.search(r'([\d.]+)\s*(?:req(?:uests)?|queries|qps)\s*/\s*s', load)
  m_silicon = re.search(r'silicon_concurrency=(\d+)', notes)
  if m_conc:
    f['concurrency'] = int(m_conc.group(1))
    if m_silicon and int(m_silicon.group(1)) != f['concurrency']:
      f['concurrency'] = int(m_silicon.group(1))
      assumptions.append('concurrency: the notes\' silicon_concurrency '
                         f"{f['concurrency']} (the whole deployment)")
  elif m_static:
    f['static_batch'] = int(m_static.group(1))
  elif m_batch:
    f['static_batch'] = int(m_batch.group(1))
    assumptions.append(f"'{row['concurrency_or_rate']}' read as a static "
                       'batch (a latency benchmark of one batch)')
  elif m_rate:
    f['request_rate'] = float(m_rate.group(1))
  elif _finite(load, row) is not None:
    f['num_requests'] = _finite(load, row)
    if variable:
      f['variable_lengths'] = True
    assumptions.append(
      f"{f['num_requests']} requests at once: the drain of the batch "
      '(output tokens / makespan)' +
      (', exponential output lengths' if variable else ''))
  elif m_prompts:
    f['num_requests'] = int(m_prompts.group(1) or m_prompts.group(2))
    if variable:
      f['variable_lengths'] = True
    assumptions.append(
      f"{f['num_requests']} requests, no rate stated: sent at once (the "
      'request rate of vLLM\'s and SGLang\'s serving benchmarks defaults '
      'to inf), the drain of the batch')
  elif re.search(r'\b(server|interactive)\b', load):
    text = ' '.join((load, row['model'], row.get('source') or '', notes))
    interactive = re.search(r'interactive', text, re.I) is not None
    pair = SERVER_TARGETS_MS.get(model)
    targets = pair[1 if interactive else 0] if pair else None
    f[SERVER_KEY] = targets or (None, None)
    assumptions.append(
      'server scenario without a rate: the highest request rate whose '
      'mean TTFT and TPOT meet ' +
      (f'MLPerf\'s {"interactive " if interactive else ""}targets, '
       f'{targets[0]} / {targets[1]} ms (loadgen/mlperf.conf; its 99th '
       'percentiles read as means)' if targets else
       'no target (none known for this model): the highest rate it '
       'sustains'))
  elif 'inf' in load or 'offline' in load:
    assumptions.append('offline: as many sequences as the KV cache and '
                       'max_num_seqs hold')
  else:
    return f"load '{row['concurrency_or_rate']}' not understood"
  size = f['tensor_par'] * pp * adp
  matrix = io.read_json_file(sys_path).get('matrix', {})
  if w == 'float4' and 'float4' not in matrix:
    f['activation_datatype'] = 'bfloat16'
    assumptions.append('float4 weights on a GPU without float4 GEMMs: '
                       'bfloat16 activations (weight-only, as MXFP4 on '
                       'Hopper)')
  text = (row.get('source') or '') + ' ' + notes
  if fw == 'trtllm' and 'trtllm-bench' in text and 'static_batch' not in f \
      and 'max_num_tokens' not in f and 'max_num_seqs' not in f:
    from calculon.config.registry import SERVING_DATATYPE_BYTES
    from calculon.serving.frameworks import trtllm_bench_limits
    kv_dtype = kv or f.get('activation_datatype') or w
    bs, tokens = trtllm_bench_limits(
      sum(app.parameter_breakdown().values()), app.num_blocks,
      app.kv_heads_for(), app.attn_size,
      io.load_system(sys_path).mem1.capacity_bytes, f['tensor_par'], pp,
      isl, osl, SERVING_DATATYPE_BYTES[w], SERVING_DATATYPE_BYTES[kv_dtype],
      f.get('memory_fraction', 0.95))
    f['max_num_seqs'], f['max_num_tokens'] = bs, max(tokens, isl)
    assumptions.append(f'trtllm-bench limits: max_batch_size {bs}, '
                       f'max_num_tokens {tokens} (its build heuristic, '
                       'tensorrt_llm/bench/build/tuning.py)' +
                       (f', raised to the prompt ({isl})' if isl > tokens
                        else ''))
  if fw == 'trtllm' and isl > 8192 and 'max_num_tokens' not in f and \
      'static_batch' not in f:
    f['max_num_tokens'] = isl
    assumptions.append(f'max_num_tokens raised to the prompt ({isl}): '
                       'TensorRT-LLM takes a whole prompt per iteration '
                       'without chunked prefill')
  gpus = _int(row['num_gpus']) or size
  replicas = max(1, gpus // size)
  if replicas > 1:
    # The row's load is the whole fleet's: each replica takes its share.
    for name in ('concurrency', 'num_requests'):
      if name in f:
        f[name] = max(1, math.ceil(f[name] / replicas))
    if 'request_rate' in f:
      f['request_rate'] = f['request_rate'] / replicas
    assumptions.append(f'{replicas} replicas of {size} GPUs, the load '
                       'split evenly')
  return (app_path, sys_path, f, assumptions, replicas, kind)


def _smallest_tp(app_path, base_dir, row, weight_dtype, pp):
  """The smallest power of two TP, at most the row's GPUs / PP (8 when
  blank), whose weights (bytes per parameter of ``weight_dtype``) take at
  most half of one GPU's memory, the rest left to the KV cache."""
  from calculon import io
  from calculon.config.registry import SERVING_DATATYPE_BYTES
  app = io.load_application(app_path)
  gpu = row['gpu'].lower()
  system = next((f for k, f in SYSTEMS if k in gpu))
  cap = io.load_system(os.path.join(base_dir, 'systems', f'{system}.json')
                       ).mem1.capacity_bytes
  weights = sum(app.parameter_breakdown().values()) * \
    SERVING_DATATYPE_BYTES[weight_dtype] / pp
  top = max(1, (_int(row['num_gpus']) or 8) // pp)
  tp = 1
  while tp * 2 <= top and weights / tp > 0.5 * cap:
    tp *= 2
  return tp


def _finite(load, row):
  """Requests of a finite benchmark sent at once (request rate
  infinite): 'N prompts at request_rate=inf', 'request_rate=inf, N
  prompts', or an infinite rate with 'N requests' in the source or
  notes; None otherwise."""
  if 'inf' not in load:
    return None
  m = re.search(r'(\d+) prompts', load) or re.search(
    r'(\d+) requests\b', (row.get('source') or '') + ' ' +
    (row.get('notes') or ''))
  return int(m.group(1)) if m else None


def predicted(res, row, kind, replicas):
  """The model's figure for the row's metric."""
  m = metric_text(row['metric'])
  # Latencies in ms unless the metric names seconds ('ttft_s',
  # 'latency in seconds').
  to_unit = 1e-3 if re.search(r'_(s|sec|secs|seconds?)(_|$)', m) and \
    '_ms' not in m else 1.0
  if kind == 'ttft':
    return float(np.ravel(res['ttft_ms'])[0]) * to_unit
  if kind == 'tpot' and m.startswith('itl'):
    return float(np.ravel(res['itl_ms'])[0]) * to_unit
  if kind == 'tpot':
    return float(np.ravel(res['tpot_ms'])[0]) * to_unit
  if kind == 'latency':
    return float(np.ravel(res['latency_ms'])[0]) * to_unit
  if re.search(r'(^|_)user(_|$)', m):
    return float(np.ravel(res['output_tokens_per_s_per_user'])[0])
  per_gpu = re.search(r'(^|_)gpu(_|$)', m) is not None
  scale = 1.0 / float(np.ravel(res['gpus'])[0]) if per_gpu else replicas
  out = float(np.ravel(res['output_tokens_per_s'])[0])
  inp = float(np.ravel(res['input_tokens_per_s'])[0])
  if re.search(_REQUEST_RATE, m):
    return float(np.ravel(res['requests_per_s'])[0]) * scale
  if 'input' in m or 'prompt' in m:
    return inp * scale
  if 'total_token' in m or 'in_out' in m:
    return (inp + out) * scale
  if per_gpu:
    return float(np.ravel(res['output_tokens_per_s_per_gpu'])[0])
  return out * replicas


def run_suite(rows, base_dir, progress=None):
  """Prices every row; list of dicts: id, source, metric, kind, measured,
  predicted, error_pct, status ('priced', 'infeasible', 'unpriced'),
  assumptions (or the reason)."""
  from calculon import io
  from calculon.serving import deployment as D
  from calculon.serving.price import price
  apps, systems, out = {}, {}, []
  for row in rows:
    rec = {'id': row['id'], 'source': row['source'], 'metric':
           row['metric'], 'kind': metric_kind(row['metric']),
           'measured': float(row['value']), 'predicted': math.nan,
           'error_pct': math.nan, 'status': 'unpriced', 'assumptions': ''}
    got = deployment_of(row, base_dir)
    if isinstance(got, str):
      rec['assumptions'] = got
      out.append(rec)
      continue
    app_path, sys_path, fields, assumptions, replicas, kind = got
    try:
      app = apps.get(app_path) or io.load_application(app_path)
      apps[app_path] = app
      system = systems.get(sys_path) or io.load_system(sys_path)
      systems[sys_path] = system
      if SERVER_KEY in fields:
        from calculon.serving.search import highest_rate
        targets = fields.pop(SERVER_KEY)
        rate, res = highest_rate(app, system, fields, *targets)
        if rate is None:
          rec['status'] = 'infeasible'
          rec['assumptions'] = '; '.join(assumptions + [
            'no request rate meets the server targets'])
          out.append(rec)
          continue
        assumptions.append(f'{rate:.3g} requests/s a replica')
      else:
        dep = D.resolve(D.read_deployment(fields, row['id']), app, system,
                        row['id'])
        res = price(app, system, dep)
    except ConfigError as err:
      rec['assumptions'] = f'not priced: {err}'
      out.append(rec)
      continue
    rec['assumptions'] = '; '.join(assumptions)
    if not res['feasible']:
      rec['status'] = 'infeasible'
      rec['assumptions'] = (rec['assumptions'] + '; ' if assumptions
                            else '') + res['reason']
      out.append(rec)
      continue
    value = predicted(res, row, kind, replicas)
    rec.update(predicted=value, status='priced',
               error_pct=100.0 * (value / rec['measured'] - 1))
    out.append(rec)
    if progress:
      progress(f"{row['id']}: {rec['error_pct']:+.1f} %")
  return out


def source_label(source):
  """A short label of a row's source (repository and file)."""
  return ' '.join(source.split()[:2])[:60]


def summary(results):
  """Median |error| by kind and by source, rows priced and not (dict)."""
  priced = [r for r in results if r['status'] == 'priced']
  out = {'rows': len(results), 'priced': len(priced),
         'infeasible': sum(r['status'] == 'infeasible' for r in results),
         'unpriced': sum(r['status'] == 'unpriced' for r in results),
         'median_abs_error_pct': {}, 'by_source': {},
         'fitted': 'step_overhead_s, roofline_efficiency, arrival_burst per '
                   'framework preset, on AIConfigurator silicon runs that '
                   'no row here cites (calculon/validation/serving_fit.py)'}
  for kind in KINDS:
    errs = [abs(r['error_pct']) for r in priced if r['kind'] == kind]
    out['median_abs_error_pct'][kind] = (
      {'rows': len(errs), 'median': float(np.median(errs))} if errs
      else {'rows': 0, 'median': None})
  for r in priced:
    key = source_label(r['source'])
    out['by_source'].setdefault(key, {}).setdefault(r['kind'], []).append(
      abs(r['error_pct']))
  out['by_source'] = {
    s: {k: {'rows': len(v), 'median': float(np.median(v))}
        for k, v in kinds.items()} for s, kinds in out['by_source'].items()}
  return out


def format_report(results, verbose=False):
  """The suite's text report."""
  s = summary(results)
  lines = [f"{s['rows']} rows: {s['priced']} priced, {s['infeasible']} "
           f"infeasible, {s['unpriced']} not priced; no row here fitted "
           'anything (the presets\' three parameters are fitted on '
           'other AIConfigurator silicon runs)']
  lines.append('median |error| by metric kind:')
  for kind, v in s['median_abs_error_pct'].items():
    med = 'n/a' if v['median'] is None else f"{v['median']:.1f} %"
    lines.append(f'  {kind:10s} {v["rows"]:4d} rows  {med}')
  lines.append('by source:')
  for src, kinds in s['by_source'].items():
    parts = ', '.join(f"{k} {v['median']:.1f} % ({v['rows']})"
                      for k, v in kinds.items())
    lines.append(f'  {src}: {parts}')
  if verbose:
    lines.append('')
    lines.append(f'{"id":8s}{"metric":34s}{"measured":>11s}'
                 f'{"predicted":>11s}{"error %":>9s}  status')
    for r in results:
      lines.append(f"{r['id']:8s}{r['metric'][:33]:34s}{r['measured']:11.2f}"
                   f"{r['predicted']:11.2f}{r['error_pct']:9.1f}  "
                   f"{r['status']} {r['assumptions']}")
  return '\n'.join(lines)


def results_csv(results):
  """serving_results.csv text: id, metric, measured, predicted,
  error_pct, status, assumptions."""
  import io as _io
  buf = _io.StringIO()
  w = csv.writer(buf)
  w.writerow(['id', 'metric', 'measured', 'predicted', 'error_pct',
              'status', 'assumptions'])
  for r in results:
    w.writerow([r['id'], r['metric'], r['measured'],
                '' if math.isnan(r['predicted']) else f"{r['predicted']:.6g}",
                '' if math.isnan(r['error_pct']) else f"{r['error_pct']:.2f}",
                r['status'], r['assumptions']])
  return buf.getvalue()
