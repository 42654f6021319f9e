"""What an execution that names a ``framework`` may leave out, and what
leaving it out means.

An execution file that names a framework preset needs only its layout
(:data:`LAYOUT`: the processors, the TP/PP/DP degrees, the batch, the
microbatch and the datatype, and any other degree it uses: ``context_par``,
``expert_par``... whose absence already means 1).  Every other field of
Calculon's 23 is, in this order of precedence:

1. what the execution writes;
2. what its preset dictates (a rule's ``value``: ``seq_par_ag_redo`` in
   every modern preset), applied by :mod:`calculon.frameworks.resolve`;
3. :data:`DEFAULTS` below, what a Megatron-Core performance recipe runs
   (``validation/conventions.yaml``, "Megatron-Core 2024+": sequence
   parallelism with TP, the distributed optimizer, overlapped gradient
   reduce, fused activation) -- or, where the preset does not support that
   value, the first value the preset lists for the field
   (:func:`calculon.frameworks.resolve.resolve_execution`);
4. the network tiers: each degree on the fastest tier that holds the
   ranks it spans, the ranks laid out TP innermost, then CP, DP and PP
   (Megatron-Core's default order ``tp-cp-ep-dp-pp``,
   megatron/core/parallel_state.py ``initialize_model_parallel``; the
   expert groups span EP x ETP), as the published rows are mapped
   (:mod:`calculon.validation.mapping`), placed once the system is known
   (:func:`place_networks`).

An execution naming a framework that writes all 23 of Calculon's fields
is read as before (a field beyond them left out means its absent value,
the network tiers of CP and EP tier 0).  A Calculon file (no
``framework``) still writes all 23 of Calculon's
fields (``attention_type`` and ``optimizer_sharding`` may be left out when
the application's ``kv_heads`` / the execution's ``data_par_sharding``
say): its meaning is Calculon's.

Provides :data:`LAYOUT`, :data:`DEFAULTS`, :func:`defaults_for` and
:func:`place_networks`.  Reads nothing of the project but
:mod:`calculon.config.registry` (field names).
"""

import dataclasses

#: The fields an execution naming a framework must write.
LAYOUT = ('num_procs', 'tensor_par', 'pipeline_par', 'data_par',
          'batch_size', 'microbatch_size', 'datatype')

#: The network-tier fields placed from the system (:func:`place_networks`).
NETWORK_FIELDS = ('tensor_par_net', 'pipeline_par_net', 'data_par_net',
                  'context_par_net', 'expert_par_net')


def _dp_cp(v):
  return v['data_par'] * (v.get('context_par') or 1)


def _trains_over_dp(v):
  return bool(v['training']) and _dp_cp(v) > 1


#: Calculon field (or ``data_par_sharding``, ``attention_kernel``) -> (its
#: value when left out,
#: a constant or a function of the fields read, why).  Ordered: a function
#: reads only the fields before it (and the layout).
DEFAULTS = {
  'training': (True, 'a training step (what the presets describe)'),
  'tensor_par_net': (0, 'placed from the system (the tier that holds the '
                     'ranks it spans)'),
  'pipeline_par_net': (0, 'placed from the system'),
  'data_par_net': (0, 'placed from the system'),
  'fused_activation': (True, 'Megatron-Core bias_activation_fusion '
                       '(fused_bias_swiglu.py, fused_bias_gelu.py) and '
                       "torch.compile fuse it; what it keeps is the "
                       "preset's behaviour for what the fused kernel keeps"),
  'activation_recompute': ('none', 'no recomputation (Megatron-Core '
                           'recompute_granularity None)'),
  'pipeline_interleaving': (1, 'no interleaved schedule (Megatron-Core '
                            'virtual_pipeline_model_parallel_size None)'),
  'tensor_par_comm_type': (lambda v: 'rs_ag' if v['tensor_par'] > 1
                           else 'ar',
                           '"rs_ag" with TP > 1, else "ar": sequence '
                           'parallelism (Megatron-Core recipes '
                           'sequence_parallel = True)'),
  'tensor_par_overlap': ('none', 'no tiled TP overlap (Megatron-Core '
                         'tp_comm_overlap False)'),
  'seq_par_ag_redo': (False, 'every modern preset dictates it'),
  'data_par_overlap': (_trains_over_dp, 'true when training with DP x CP '
                       '> 1, else false: overlapped gradient reduce '
                       '(Megatron-Core overlap_grad_reduce)'),
  'data_par_sharding': (lambda v: 'optimizer' if _trains_over_dp(v)
                        else 'none',
                        '"optimizer" when training with DP x CP > 1, else '
                        '"none": the distributed optimizer (ZeRO-1, '
                        'Megatron-Core use_distributed_optimizer); '
                        'optimizer_sharding follows it'),
  'attention_kernel': ('flash', 'FlashAttention, what every framework '
                       'since 2022 runs (Dao et al. 2022); a preset that '
                       'runs the standard kernel dictates it'),
  'weight_offload': (False, 'no offload'),
  'activations_offload': (False, 'no offload'),
  'optimizer_offload': (False, 'no offload'),
}


def default_text(name):
  """The default of field ``name`` and its reason, in words (docs)."""
  value, why = DEFAULTS[name]
  if callable(value):
    return why
  import json
  return f'{json.dumps(value)}: {why}'


def defaults_for(values, present):
  """{field: value} of the :data:`DEFAULTS` fields not ``present`` in an
  execution naming a framework, from the fields read (``values``: the
  layout and whatever else it wrote).  ``data_par_sharding`` is filled
  only when neither it nor ``optimizer_sharding`` is written."""
  out = {}
  seen = dict(values)
  for name, (value, _) in DEFAULTS.items():
    if name in present:
      continue
    if name == 'data_par_sharding' and 'optimizer_sharding' in present:
      continue
    out[name] = value(seen) if callable(value) else value
    seen[name] = out[name]
  return out


def _tier(networks, ranks):
  """The fastest tier holding ``ranks`` consecutive ranks (and dividing
  its size where it must be filled), else the last."""
  for i, net in enumerate(networks):
    if net.size >= ranks and (not net.must_be_filled or
                              net.size % ranks == 0):
      return i
  return len(networks) - 1


def place_networks(exe, networks):
  """``exe`` with the network tiers it did not write placed on
  ``networks`` (a system's network configs, fastest first), see the module
  docstring; ``exe`` itself when it wrote them all or names no
  framework's layout reading (:attr:`Execution.filled` empty)."""
  todo = [n for n in NETWORK_FIELDS if n in exe.filled]
  if not todo:
    return exe
  tp, cp, dp = exe.tensor_par, exe.context_par, exe.data_par
  spans = {
    'tensor_par_net': (tp, tp),
    'context_par_net': (cp, tp * cp),
    'data_par_net': (dp, tp * cp * dp),
    'pipeline_par_net': (exe.pipeline_par, tp * cp * dp * exe.pipeline_par),
    'expert_par_net': (exe.expert_par,
                       exe.expert_par * exe.expert_tensor_par),
  }
  placed = {}
  for name in todo:
    degree, ranks = spans[name]
    placed[name] = _tier(networks, ranks) if degree > 1 else 0
  return dataclasses.replace(exe, **placed)
