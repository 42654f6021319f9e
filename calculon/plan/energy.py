"""Power from what the step does, and the energy of a whole run.

A GPU's power while training follows its activity, not its rating
(Newkirk et al., arXiv 2506.14551: a power model driven by the FLOP a
workload runs erred by 11.4 % where a TDP-based estimate erred by 27-37
%):

    P_gpu = P_idle + (P_busy - P_idle) x activity

    activity = min(1, f_compute + k_mem f_memory + k_net f_network),
    at least F_model / (peak x t_step)

* ``f_compute``: the share of the step the matrix engine is busy at its
  best achievable rate: the FLOP one processor runs per step (recomputation
  included, the engine's ``hardware_flops_per_proc``) over the peak times
  the best efficiency of the system's GEMM curve times the step time;
* ``f_memory``: the rest of the kernels' time (forward, backward,
  recomputation and optimizer time, less the compute share): memory-bound
  work;
* ``f_network``: the time the step's communication occupies the links
  (TP, PP, DP, CP, EP and FSDP link times) over the step time, at most 1;
* ``k_mem``, ``k_net``: :class:`~calculon.config.whole_run.PowerConfig`'s
  ``memory_activity`` and ``network_activity`` (GenZ's split of a GPU's
  power, GenZ/power.py);
* the floor: a processor is busy at least the time its share of the
  model's FLOP takes at the best GEMM rate (this keeps the objective's
  bound exact, :mod:`calculon.plan.objective`).

The node adds ``node_overhead_w`` per node and the fabric
``network_w_per_gpu`` for the whole wall time; the facility multiplies the
IT power by the PUE.
"""

from dataclasses import dataclass

import numpy as np

J_PER_MWH = 3.6e9
J_PER_KWH = 3.6e6

#: Statistics (calculon.llm.stats names) the activity reads.
ACTIVITY_STATS = ('total_time', 'fw_time', 'bw_time', 'recompute_time',
                  'optim_step_time', 'hardware_flops_per_proc',
                  'model_flops_per_batch', 'tp_comm_link_time',
                  'pp_comm_link_time', 'dp_comm_link_time',
                  'cp_comm_link_time', 'fsdp_comm_link_time',
                  'ep_comm_link_time')


@dataclass
class Activity:
  """What a step keeps a GPU doing (arrays of one shape; shares of the
  step time)."""
  compute: np.ndarray
  memory: np.ndarray
  network: np.ndarray
  floor: np.ndarray
  activity: np.ndarray


def activity(stats, gpus, peak_flops, best_efficiency, power):
  """The activity of each execution (see the module docstring).

  Args:
    stats: dict of arrays with :data:`ACTIVITY_STATS` (seconds, FLOP).
    gpus: processors of the job.
    peak_flops: the matrix engine's peak FLOP/s for the datatype.
    best_efficiency: the largest efficiency of its GEMM curve, (0, 1].
    power: :class:`~calculon.config.whole_run.PowerConfig`.

  Returns:
    :class:`Activity`.
  """
  with np.errstate(divide='ignore', invalid='ignore'):
    t = np.asarray(stats['total_time'], dtype=float)
    compute = np.minimum(1.0, np.asarray(stats['hardware_flops_per_proc'],
                                         float) /
                         (peak_flops * best_efficiency * t))
    kernels = (np.asarray(stats['fw_time'], float) + stats['bw_time'] +
               stats['recompute_time'] + stats['optim_step_time']) / t
    memory = np.clip(kernels - compute, 0.0, 1.0 - compute)
    links = sum(np.asarray(stats[k], float) for k in (
      'tp_comm_link_time', 'pp_comm_link_time', 'dp_comm_link_time',
      'cp_comm_link_time', 'fsdp_comm_link_time', 'ep_comm_link_time'))
    network = np.minimum(1.0, links / t)
    floor = np.minimum(1.0, np.asarray(stats['model_flops_per_batch'],
                                       float) / gpus /
                       (peak_flops * best_efficiency * t))
    act = np.minimum(1.0, compute + power.memory_activity * memory +
                     power.network_activity * network)
    act = np.maximum(act, floor)
  return Activity(compute, memory, network, floor, act)


def gpu_power_w(act, power):
  """P_idle + (P_busy - P_idle) x activity (W)."""
  return power.gpu_idle_w + (power.gpu_busy_w - power.gpu_idle_w) * \
    np.asarray(act, dtype=float)


def nodes_of(gpus, gpus_per_node):
  """Nodes a job of ``gpus`` GPUs occupies (whole nodes)."""
  return np.ceil(np.asarray(gpus, dtype=float) / gpus_per_node)


@dataclass
class RunEnergy:
  """Energy of a whole run, joules (arrays of one shape).

  gpu_j: the GPUs (training power while computing or redoing lost work,
  idle power while stalled on checkpoints or restarting); node_j: the
  nodes' other parts; network_j: the scale-out fabric; it_j: their sum;
  facility_j: it_j x PUE.
  """
  gpu_j: np.ndarray
  node_j: np.ndarray
  network_j: np.ndarray
  it_j: np.ndarray
  facility_j: np.ndarray


def run_energy(gpus, train_power_w, busy_s, idle_s, wall_s, power):
  """Energy of a run.

  Args:
    gpus: processors.
    train_power_w: a GPU's power while training (:func:`gpu_power_w`).
    busy_s: wall time spent computing (useful and redone work).
    idle_s: wall time stalled (checkpoint saves, restarts).
    wall_s: the whole wall time.
    power: :class:`~calculon.config.whole_run.PowerConfig`.

  Returns:
    :class:`RunEnergy`.
  """
  n = np.asarray(gpus, dtype=float)
  gpu = n * (np.asarray(train_power_w, float) * busy_s +
             power.gpu_idle_w * np.asarray(idle_s, float))
  node = nodes_of(n, power.gpus_per_node) * power.node_overhead_w * \
    np.asarray(wall_s, float)
  net = n * power.network_w_per_gpu * np.asarray(wall_s, float)
  it = gpu + node + net
  return RunEnergy(gpu, node, net, it, it * power.pue)
