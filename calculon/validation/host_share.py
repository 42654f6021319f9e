"""Derive a serving preset's host time per sequence from a profiled GPU
busy share.

Provides :func:`busy_share` (the share of a benchmark's makespan the GPU
works, as the engine prices it) and :func:`derive` (the
``host_per_sequence_s`` at which that share equals a profiled one).

The uses: vLLM v0.5 and v0.6 (``frameworks/serving/vllm-v0.5.json``,
``vllm-v0.6.json``).
The vLLM team profiled v0.5.3 serving Llama 3 8B on one H100 and found
the GPU executing 38 % of the time, the HTTP API server taking 33 % and
scheduling and input preparation 29 % (blog.vllm.ai/2024/09/05/
perf-update.html, 'Performance Diagnosis'; the workload of the post's
benchmarks: 500 ShareGPT prompts).  In v0.5 that host work ran in the
engine's process between GPU steps and grows with the running
sequences, so the preset prices it as a time per running sequence of
every iteration, serialized with the step; this module finds the value
that reproduces the profile.  It is derived from the profile, not fitted
to any measured run.  vLLM 0.6 moved the API server into its own
process and runs the scheduler once per round of ``scheduler_steps``
decode steps, so its value is the scheduling share of v0.5's,
:data:`SCHEDULING_SHARE`, paid once a round.

Run: ``python -m calculon.validation.host_share [--busy 0.38] [--write]``
prints the values and the share they give; ``--write`` stores them in
the two presets.

Reads: the bundled model and system files, the serving engine
(:func:`calculon.serving.price.price`).
"""

import argparse
import copy
import os
import sys

import numpy as np

#: The profiled workload (blog.vllm.ai/2024/09/05/perf-update.html):
#: Llama 3 8B, bfloat16, one H100 SXM, 500 ShareGPT prompts sent at once
#: (the mean ShareGPT lengths of :data:`calculon.validation.serving.
#: SHAREGPT`, exponential output lengths), the framework's defaults.
PROFILE = {
  'model': 'models/llama3-8B.json',
  'system': 'systems/h100_sxm_80g_datasheet.json',
  'deployment': {'framework': 'vllm-v0.5', 'tensor_par': 1,
                 'weight_datatype': 'bfloat16', 'num_requests': 500,
                 'variable_lengths': True},
}
#: GPU busy share of the profile: 1 - 0.33 (API server) - 0.29
#: (scheduling).
PROFILED_BUSY = 0.38
#: The scheduling share of the profile's host time: 29 / (33 + 29).  vLLM
#: 0.6 keeps it in the engine's loop, once per scheduling round (its API
#: server runs in its own process).
SCHEDULING_SHARE = 0.29 / (0.33 + 0.29)


def _root():
  return os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def _load(profile):
  from calculon import io
  from calculon.serving import deployment as D
  from calculon.validation.serving import SHAREGPT
  root = _root()
  app = io.load_application(os.path.join(root, profile['model']))
  system = io.load_system(os.path.join(root, profile['system']))
  fields = dict(profile['deployment'])
  fields.setdefault('isl', SHAREGPT[0])
  fields.setdefault('osl', SHAREGPT[1])
  dep = D.resolve(D.read_deployment(fields, '<host_share>'), app, system,
                  '<host_share>')
  return app, system, dep


def _with(dep, step_overhead_s, host_per_sequence_s, gpu_only=False):
  d = copy.copy(dep)
  preset = copy.deepcopy(dep.preset)
  preset['step_overhead_s'] = {'value': step_overhead_s}
  preset['host_per_sequence_s'] = {'value': host_per_sequence_s}
  if gpu_only:
    # The prefill iterations' dispatch is host time too.
    preset.pop('prefill_dispatch_s_per_layer', None)
  d.preset = preset
  return d


def busy_share(host_per_sequence_s, profile=PROFILE):
  """GPU busy share of ``profile``'s benchmark: the makespan with no host
  time (no step overhead, no prefill dispatch) over the makespan with the
  preset's ``step_overhead_s``, its prefill dispatch and
  ``host_per_sequence_s`` (seconds per running sequence per iteration).
  A float in (0, 1]."""
  from calculon.serving.price import price, preset_value
  app, system, dep = _load(profile)
  gpu = price(app, system, _with(dep, 0.0, 0.0, gpu_only=True))[
    'makespan_ms']
  step = preset_value(dep.preset, 'step_overhead_s', 0.0)
  total = price(app, system, _with(dep, step, host_per_sequence_s))
  return float(np.ravel(np.asarray(gpu) / np.asarray(total['makespan_ms']))[0])


def derive(busy=PROFILED_BUSY, profile=PROFILE, hi_s=1e-3, steps=60):
  """The ``host_per_sequence_s`` (seconds) at which
  :func:`busy_share` equals ``busy``, by bisection on [0, hi_s].

  Raises:
    ValueError: ``busy`` is not reached inside [0, hi_s] (the step
      overhead alone already idles the GPU more, or hi_s is too small).
  """
  lo, hi = 0.0, hi_s
  if not busy_share(hi, profile) <= busy <= busy_share(lo, profile):
    raise ValueError(f'a GPU busy share of {busy} is not reached for a '
                     f'host time per sequence in [0, {hi_s}] s')
  for _ in range(steps):
    mid = 0.5 * (lo + hi)
    if busy_share(mid, profile) > busy:
      lo = mid
    else:
      hi = mid
  return 0.5 * (lo + hi)


def write_presets(h_v05_s):
  """Stores the derived values in ``frameworks/serving/vllm-v0.5.json``
  (``h_v05_s``) and ``vllm-v0.6.json`` (its scheduling share), rounded
  to 0.1 us."""
  import json
  from calculon import io
  for name, value in (('vllm-v0.5', h_v05_s),
                      ('vllm-v0.6', h_v05_s * SCHEDULING_SHARE)):
    path = os.path.join(_root(), 'frameworks', 'serving', f'{name}.json')
    with open(path, encoding='utf-8') as f:
      preset = json.load(f)
    preset['host_per_sequence_s']['value'] = round(value, 7)
    from calculon import outputs
    outputs.write_text(path, io.json_text(preset, path) + '\n')


def main(argv=None):
  ap = argparse.ArgumentParser(
    prog='python -m calculon.validation.host_share',
    description='host time per running sequence (vLLM v0.5 and v0.6) '
                'from a profiled GPU busy share')
  ap.add_argument('--busy', type=float, default=PROFILED_BUSY,
                  help='profiled GPU busy share (default: 0.38, the vLLM '
                       "team's profile of v0.5.3)")
  ap.add_argument('--write', action='store_true',
                  help='store the values in frameworks/serving/'
                       'vllm-v0.5.json and vllm-v0.6.json')
  args = ap.parse_args(argv)
  if not 0 < args.busy < 1:
    print(f'--busy {args.busy} is not allowed: a share in (0, 1)',
          file=sys.stderr)
    return 2
  h = derive(args.busy)
  print(f'vllm-v0.5 host_per_sequence_s = {h:.3e} s ({h * 1e6:.1f} us per '
        f'running sequence per iteration): GPU busy {busy_share(h):.3f}; '
        f'{busy_share(0.0):.3f} without it')
  print(f'vllm-v0.6 host_per_sequence_s = {h * SCHEDULING_SHARE:.3e} s '
        f'({h * SCHEDULING_SHARE * 1e6:.1f} us per running sequence per '
        'scheduling round)')
  if args.write:
    write_presets(h)
    print('wrote frameworks/serving/vllm-v0.5.json and vllm-v0.6.json')
  return 0


if __name__ == '__main__':
  sys.exit(main())
