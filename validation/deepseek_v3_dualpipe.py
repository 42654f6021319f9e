"""Prices DeepSeek-V3's published training layout under its pipeline
schedule, DualPipe, and under the others, against the report's figures.

    python validation/deepseek_v3_dualpipe.py

The layout (DeepSeek-AI 2024, "DeepSeek-V3 Technical Report", arXiv
2412.19437): 2,048 H800 GPUs, 8 a node (section 3.1); 16-way pipeline
parallelism with DualPipe, 64-way expert parallelism across 8 nodes and
ZeRO-1 data parallelism, no tensor parallelism (section 3.2); FP8 mixed
precision (section 3.3); recomputation of RMSNorm and the MLA
up-projections (section 3.2.3); batch 15,360 sequences of 4,096 tokens
after the ramp (section 4.2).  The report's cost: 180K H800 GPU hours a
trillion tokens, 2,664K for the 14.8T pre-training tokens (section 1,
table 1).

The H800 is an H100 SXM whose NVLink carries 400 GB/s (both directions;
NVIDIA H800 datasheet) instead of 900: the calibrated H100 file
(systems/h100_sxm_80g.json) with its NVLink tier at 200 GB/s a direction,
built here rather than shipped (the report measures 160 GB/s of NVLink
and 50 GB/s of InfiniBand, section 3.2.2; the file's efficiencies give
165 and 36).  Not modeled: the multi-token-prediction module (one more
MoE block on the last stage, about 2 % of the compute), DeepSeek's
custom kernels' efficiency beyond the file's.

Prints, per schedule, the step time, GPU hours a trillion tokens and the
busiest rank's memory, and the ratio to the report's 180K.
"""

import copy
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

#: The report's layout (see the module).
LAYOUT = {
  'num_procs': 2048, 'tensor_par': 1, 'pipeline_par': 16, 'data_par': 128,
  'tensor_par_net': 0, 'pipeline_par_net': 1, 'data_par_net': 1,
  'batch_size': 15360, 'microbatch_size': 1, 'datatype': 'float8',
  'precision_recipe': 'transformer_engine', 'fused_activation': True,
  'activation_recompute': 'selective',
  'recompute_modules': ['layernorm', 'mla_up_proj'],
  'pipeline_interleaving': 1, 'tensor_par_comm_type': 'ar',
  'tensor_par_overlap': 'none', 'seq_par_ag_redo': False,
  'data_par_overlap': True, 'weight_offload': False,
  'activations_offload': False, 'optimizer_offload': False,
  'training': True, 'data_par_sharding': 'optimizer',
  'attention_kernel': 'flash', 'expert_par': 64, 'expert_par_net': 1,
  'moe_dispatcher': 'deepep', 'moe_comm_overlap': 'compute',
  'framework': 'common',
}
#: The report: H800 GPU hours per trillion tokens (section 1).
PUBLISHED_GPU_HOURS_PER_T = 180e3
#: Schedules priced: (label, fields).
SCHEDULES = (
  ('1F1B', {}),
  ('ZB-H1', {'pipeline_schedule': 'zb-h1'}),
  ('interleaved 1F1B, VP 2', {'pipeline_interleaving': 2}),
  ('DualPipeV, VP 2', {'pipeline_interleaving': 2,
                       'pipeline_schedule': 'dualpipe-v'}),
  ('DualPipe (the report\'s)', {'pipeline_schedule': 'dualpipe'}),
)


def h800(h100):
  """The H800 system JSON from the H100's: NVLink 400 GB/s (200 a
  direction)."""
  cfg = copy.deepcopy(h100)
  cfg['name'] = 'NVIDIA H800 SXM5 80 GB (an H100 with 400 GB/s NVLink)'
  cfg['networks'][0]['bandwidth'] = 200
  return cfg


def price(fields):
  """(step s, GPU hours a trillion tokens, busiest rank's GiB, feasible,
  bubble s) of the layout with ``fields``."""
  from calculon.config import Application, Execution, ExecutionColumns
  from calculon.frameworks import resolve_execution
  from calculon.hardware import System
  from calculon.llm.engine import evaluate_columns
  import numpy as np
  with open(os.path.join(ROOT, 'models', 'deepseek-v3.json')) as f:
    app = Application.from_dict(json.load(f))
  with open(os.path.join(ROOT, 'systems', 'h100_sxm_80g.json')) as f:
    system = System(h800(json.load(f)), '<H800>')
  exe = Execution.from_dict(dict(LAYOUT, **fields), '<DeepSeek-V3>')
  exe, _ = resolve_execution(app, exe, source='<DeepSeek-V3>')
  ev = evaluate_columns(app, system,
                        ExecutionColumns.from_records([exe.to_dict()]))

  def at(x):
    return float(np.asarray(x).reshape(-1)[0])
  step = at(ev.total_time_s)
  tokens = LAYOUT['batch_size'] * app.seq_size
  hours = step * LAYOUT['num_procs'] / 3600 * 1e12 / tokens
  return (step, hours, at(ev.mem1_bytes) / 2 ** 30, bool(at(ev.feasible)),
          at(ev.bubble_time_s))


def main():
  print(f"{'schedule':28s} {'step s':>8s} {'bubble s':>9s} "
        f"{'GPU h / 1T':>11s} {'/ 180K':>7s} {'GiB':>6s}")
  for label, fields in SCHEDULES:
    step, hours, gib, ok, bubble = price(fields)
    print(f'{label:28s} {step:8.2f} {bubble:9.2f} {hours / 1e3:10.0f}K '
          f'{hours / PUBLISHED_GPU_HOURS_PER_T:7.2f} {gib:6.1f}'
          + ('' if ok else '  (does not fit 80 GB)'))


if __name__ == '__main__':
  main()
