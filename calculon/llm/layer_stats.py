"""Per-layer statistics of a single run (``calculon llm ... -l``)."""

import math

import numpy as np


def _num(x):
  if isinstance(x, np.ndarray):
    x = x[()]
  if isinstance(x, (int, np.integer)):
    return int(x)
  x = float(x)
  if x.is_integer() and abs(x) < 2 ** 53:
    return int(x)
  return x


def _intensity(flops, mem):
  """FLOP per byte: 0 without FLOP, infinite without memory traffic."""
  if flops == 0:
    return 0
  if mem == 0:
    return math.inf
  return float(flops) / float(mem)


def layer_summary_json(layer):
  """The per-layer statistics the reports' model summary shows
  (:meth:`calculon.report.RunData.layers`): the keys of
  :func:`layer_stats_json` that it reads, with the same values, and none of
  the others (a third of the work: the text report of ``calculon llm``
  computes it for every layer of the block)."""
  out = {'name': layer.name, 'parameters': _num(layer.weights),
         'fw_mem_accessed': _num(layer.mem_bytes('fw'))}
  for stage in ('fw', 'agrad', 'wgrad'):
    out[f'{stage}_flops'] = _num(layer.flops(stage))
    out[f'{stage}_processing_time'] = _num(layer.processing_time_s(stage))
  for stage, comm in (('fw', 'fw_tp_comm'), ('agrad', 'bw_tp_comm')):
    out[f'baseblock_{comm}_time'] = _num(layer.net_time_s(stage, False))
  out['activation'] = _num(layer.activation_bytes())
  return out


def layer_stats_json(layer):
  """Calculon's per-layer statistics dict for one layer of a single run.

  Keys and meanings follow Calculon: sizes in elements (inputs/outputs),
  FLOP, bytes, seconds; 'bw' is the activation-gradient stage and 'recomm'
  the weight-gradient stage's redone communication.
  """
  out = {'name': layer.name,
         'inputs_size': _num(layer.inputs),
         'outputs_size': _num(layer.outputs)}
  for stage, label, comm in (('fw', 'fw', 'fw_tp_comm'),
                             ('agrad', 'agrad', 'bw_tp_comm'),
                             ('wgrad', 'wgrad', 'recomm'),
                             ('optim', 'optim', None)):
    flops, mem = layer.flops(stage), layer.mem_bytes(stage)
    out[f'{label}_flops'] = _num(flops)
    out[f'{label}_mem_accessed'] = _num(mem)
    out[f'{label}_arithmetic_intensity'] = _intensity(flops, mem)
    out[f'{label}_processing_time'] = _num(layer.processing_time_s(stage))
    if comm is None:
      continue
    for kind, fn in (('tile', layer.comm_tile_bytes), ('size', layer.comm_bytes),
                     ('time', layer.net_time_s),
                     ('time_exposed', layer.exposed_net_time_s)):
      for where, edge in (('baseblock', False), ('edgeblock', True)):
        out[f'{where}_{comm}_{kind}'] = _num(fn(stage, edge))
  out['weight'] = _num(layer.weight_bytes())
  out['parameters'] = _num(layer.weights)
  out['activation'] = _num(layer.activation_bytes())
  out['weight_grad'] = _num(layer.weight_grad_bytes())
  out['activation_grad'] = _num(layer.activation_grad_bytes())
  out['optimizer'] = _num(layer.optimizer_bytes())
  return out
