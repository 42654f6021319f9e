"""A serving deployment: read, checked, and resolved against its preset.

:func:`read_deployment` reads a deployment's JSON through the field
registry (:data:`calculon.config.registry.DEPLOYMENT`: each field's type
and range; unknown fields rejected); :func:`resolve` fills the fields left
out from the serving framework preset
(:mod:`calculon.serving.frameworks`) and checks the deployment against the
application and the system (degrees that divide the model, datatypes the
system has).  Every mistake is a :class:`~calculon.errors.ConfigError`
with one line naming the file, the field, the value and what is allowed.

Reads: the registry, the presets, the application and the system.
"""

from types import SimpleNamespace

from calculon.config._schema import Reader
from calculon.config.registry import FIELDS, REQUIRED, SERVING_DATATYPE_BYTES
from calculon.errors import ConfigError
from calculon.serving import frameworks


def read_deployment(cfg, source='<deployment>'):
  """The deployment's fields as written (a dict: field -> value, None for
  a field left out whose absent value is None).

  Raises:
    ConfigError: a missing or unknown field, a value of the wrong type or
      out of range, or contradicting fields (concurrency with
      request_rate).
  """
  reader = Reader(cfg, source)
  out = {}
  for name, f in FIELDS['deployment'].items():
    if name in cfg or f.absent is REQUIRED:
      out[name] = reader.get(name, f.spec)
    else:
      out[name] = f.absent
  reader.meta()
  reader.finish()
  given = [k for k in ('concurrency', 'request_rate', 'static_batch')
           if cfg.get(k) is not None]
  if len(given) > 1:
    raise ConfigError(
      f"{source}: field '{given[1]}' = {cfg[given[1]]} is not allowed "
      f"with '{given[0]}': give one of concurrency, request_rate, "
      'static_batch (none: offline max throughput)', source=source,
      field=given[1], value=cfg[given[1]])
  if out['weight_datatype'] == 'int4' and out['activation_datatype'] in (
      'float8', 'float4'):
    raise ConfigError(
      f"{source}: field 'activation_datatype' = "
      f"\"{out['activation_datatype']}\" is not allowed with int4 weights: "
      'int4 weights run with bfloat16 or float16 activations (W4A16)',
      source=source, field='activation_datatype')
  out['written'] = frozenset(k for k in cfg if k in FIELDS['deployment'])
  return out


def _fail(source, field, value, allowed):
  raise ConfigError(f"{source}: field '{field}' = {value} is not allowed: "
                    f'{allowed}', source=source, field=field, value=value,
                    allowed=allowed)


def check_worker(app, tp, ep, etp, adp, source, prefix=''):
  """Checks one worker's degrees against the application (TP divides the
  attention heads and the hidden and MLP widths, and is a multiple or a
  divisor of the K/V heads; EP divides the experts; ETP the expert
  width; EP x ETP = TP x attention DP).

  Raises:
    ConfigError: the first degree that does not fit.
  """
  for what, size in (('attn_heads', app.attn_heads), ('hidden', app.hidden),
                     ('feedforward', app.feedforward)):
    if size % tp:
      _fail(source, prefix + 'tensor_par', tp,
            f"it must divide the application's {what} ({size})")
  kv = app.kv_heads
  if kv is not None and not app.is_mla and kv % tp and tp % kv:
    _fail(source, prefix + 'tensor_par', tp, 'it must be a multiple or a '
          f"divisor of the application's kv_heads ({kv})")
  if not app.is_moe:
    if ep > 1:
      _fail(source, prefix + 'expert_par', ep,
            'the application has no experts; use 1')
    return
  if app.num_experts % ep:
    _fail(source, prefix + 'expert_par', ep,
          f"it must divide the application's num_experts "
          f'({app.num_experts})')
  if app.moe_ffn_hidden % etp:
    _fail(source, 'expert_tensor_par', etp, "it must divide the "
          f"application's moe_ffn_hidden ({app.moe_ffn_hidden})")
  if ep * etp != tp * adp:
    _fail(source, prefix + 'expert_par', ep, 'expert_par x '
          f'expert_tensor_par ({ep} x {etp}) must equal tensor_par x '
          f'attention_dp ({tp} x {adp}): the experts are spread over the '
          "worker's GPUs")


def resolve(fields, app, system, source='<deployment>'):
  """The deployment with every field filled (a SimpleNamespace).

  Fields left out take the framework preset's default, GPU-size branches
  included (:func:`calculon.serving.frameworks.default`); the activation
  datatype defaults to the weights' (bfloat16 for int4) and the KV cache's
  to the activations'; ``expert_par`` to TP x attention DP / ETP.

  Raises:
    ConfigError: a degree that does not divide the model, a datatype the
      system's matrix engine has no throughput for, more sequences than
      ``max_num_seqs`` in a static batch, a mode the framework does not
      run.
  """
  d = dict(fields)
  preset = frameworks.load(d['framework'], source)
  d['preset'] = preset
  cap_gib = system.mem1.capacity_bytes / 2 ** 30
  is_a100 = system.mem1.bandwidth_bytes_per_s < 2.5e12
  for name in ('max_num_seqs', 'max_num_tokens', 'chunked_prefill',
               'cuda_graphs', 'memory_fraction'):
    if d.get(name) is None:
      d[name] = frameworks.default(preset, name, cap_gib, is_a100=is_a100)
  budget = preset.get('defaults', {}).get('max_num_tokens', {})
  if d['chunked_prefill'] and 'chunked_value' in budget and \
      fields.get('max_num_tokens') is None:
    # The token budget a V0 vLLM takes with chunked prefill on.
    d['max_num_tokens'] = budget['chunked_value']
  if d['activation_datatype'] is None:
    d['activation_datatype'] = 'bfloat16' if d['weight_datatype'] == \
      'int4' else d['weight_datatype']
  if d['kv_cache_datatype'] is None:
    d['kv_cache_datatype'] = d['activation_datatype']
  if d['prefill_chunk'] is None:
    d['prefill_chunk'] = d['max_num_tokens']
  adt = d['activation_datatype']
  have = sorted(system.config.matrix.peak_flops)
  if adt not in have:
    _fail(source, 'activation_datatype', f'"{adt}"', "the system's matrix "
          'engine has throughput for: ' + ', '.join(f'"{x}"' for x in have))
  for prefix in ('', 'prefill_'):
    tp = d[prefix + 'tensor_par'] if d.get(prefix + 'tensor_par') else \
      d['tensor_par']
    pp = d[prefix + 'pipeline_par'] if d.get(prefix + 'pipeline_par') else \
      d['pipeline_par']
    if pp > app.num_blocks:
      _fail(source, prefix + 'pipeline_par', pp, 'it must be <= the '
            f"application's num_blocks ({app.num_blocks})")
    etp = d['expert_tensor_par']
    ep = d.get(prefix + 'expert_par') or d['expert_par']
    if ep is None:
      ep = max(1, tp * d['attention_dp'] // etp) if app.is_moe else 1
    check_worker(app, tp, ep, etp, d['attention_dp'], source,
                 '' if not prefix or d.get(prefix + 'tensor_par') is None
                 else prefix)
    d[prefix + 'tensor_par'], d[prefix + 'pipeline_par'] = tp, pp
    d[prefix + 'expert_par'] = ep
  allowed_modes = frameworks.modes(preset)
  if d['mode'] not in allowed_modes:
    _fail(source, 'mode', f'"{d["mode"]}"', f"the {preset['name']} preset "
          'runs only ' + ', '.join(f'"{m}"' for m in allowed_modes) + ' (' +
          preset['modes']['source'] + ')')
  if d['mode'] == 'aggregated' and {'prefill_workers', 'decode_workers',
                                    'prefill_tensor_par'} & d['written']:
    name = sorted({'prefill_workers', 'decode_workers',
                   'prefill_tensor_par'} & d['written'])[0]
    _fail(source, name, d[name], 'it needs mode "disaggregated"')
  if d['static_batch'] is not None and d['mode'] != 'aggregated':
    _fail(source, 'static_batch', d['static_batch'],
          'a static batch is an aggregated run')
  if d['num_requests'] is not None and (
      d['mode'] != 'aggregated' or d['request_rate'] is not None or
      d['static_batch'] is not None):
    _fail(source, 'num_requests', d['num_requests'],
          'a finite benchmark (all requests sent at once) is an aggregated '
          'run without request_rate or static_batch')
  d['weight_bytes_per_param'] = SERVING_DATATYPE_BYTES[d['weight_datatype']]
  d['act_bytes'] = SERVING_DATATYPE_BYTES[adt]
  d['kv_bytes'] = SERVING_DATATYPE_BYTES[d['kv_cache_datatype']]
  return SimpleNamespace(**d)


def load(path):
  """Reads a deployment file (fields as written; see
  :func:`read_deployment`)."""
  from calculon import io
  return read_deployment(io.read_json_file(path), path)
