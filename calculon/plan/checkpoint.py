"""Checkpoint size and the time to save and load it, from the execution.

A checkpoint holds, for every parameter, the 16-bit weight and the mixed-
precision Adam state: an fp32 master weight and two fp32 moments
(Megatron-LM docs/user-guide/features/dist_optimizer.md: "fp32 main
params, exp_avg, exp_avg_sq"): :data:`CHECKPOINT_BYTES_PER_PARAMETER` = 2
+ 12 bytes.  Each rank holds what the execution gives it (the engine's
weight and optimizer bytes per processor: sharded as the execution
shards them, replicated where it replicates them).

Saving (the framework's :class:`~calculon.plan.framework.CheckpointPolicy`):

* ``parallel_save``: the replicated state is written once, spread over all
  N ranks: each writes unique / N bytes; otherwise the ranks of the first
  data-parallel replica write all they hold (DeepSpeed: the model states
  by data-parallel rank 0).
* a rank's bytes are first copied to host memory over the host link (the
  system's memory tier 2 bandwidth), then written: a node writes its
  ranks' bytes at most at the storage's ``node_GBps``, the job at most at
  the file system's ``write_GBps``.
* 'blocking': training waits for the copy and the write; 'async': for the
  copy only, the write persists in the background.

Loading after a restart: every rank reads all it holds (replicas read the
same bytes again), or with ``parallel_load`` the checkpoint is read once,
spread over the ranks, and the replicas exchange it over the scale-out
network; then it is copied to the GPU over the host link.

All sizes in bytes, bandwidths in bytes per second (SI), times in seconds;
arrays broadcast over executions.
"""

from dataclasses import dataclass

import numpy as np

#: 16-bit weight (2) + fp32 master weight (4) + Adam's two fp32 moments (4
#: + 4), per parameter (see the module docstring).
CHECKPOINT_BYTES_PER_PARAMETER = 14


@dataclass
class CheckpointCost:
  """Checkpoint terms of executions (arrays of one shape).

  Attributes:
    size_bytes: the whole checkpoint (each parameter's state once).
    rank_state_bytes: what one rank holds (weights + optimizer state).
    write_rank_bytes: what the busiest rank writes.
    stage_s: copy of a rank's share to host memory.
    write_s: the write to storage once staged.
    stall_s: what training waits per save (blocking: stage + write;
      async: stage).
    persist_s: the background write of an asynchronous save (0 when
      blocking).
    load_s: reading the checkpoint back after a restart and placing it on
      the GPUs.
  """
  size_bytes: np.ndarray
  rank_state_bytes: np.ndarray
  write_rank_bytes: np.ndarray
  stage_s: np.ndarray
  write_s: np.ndarray
  stall_s: np.ndarray
  persist_s: np.ndarray
  load_s: np.ndarray


def checkpoint_cost(num_parameters, weight_bytes, optimizer_bytes, gpus,
                    replicas, storage, policy, gpus_per_node,
                    host_bytes_per_s, network_bytes_per_s):
  """Checkpoint size and save / load times.

  Args:
    num_parameters: parameters of the model (array or float).
    weight_bytes, optimizer_bytes: per processor, as the execution holds
      them (the engine's ``weight_space`` and ``optimizer_space``).
    gpus: processors of the job.
    replicas: data-parallel replicas of the weights (DP x CP): without a
      parallel save, the first replica's gpus / replicas ranks write.
    storage: :class:`~calculon.config.whole_run.StorageConfig`.
    policy: :class:`~calculon.plan.framework.CheckpointPolicy`.
    gpus_per_node: GPUs sharing one storage link.
    host_bytes_per_s: GPU <-> host memory bandwidth per GPU.
    network_bytes_per_s: scale-out bandwidth per GPU (the replicas'
      exchange after a parallel load).

  Returns:
    :class:`CheckpointCost`.
  """
  n = np.asarray(gpus, dtype=float)
  size = np.asarray(num_parameters, dtype=float) * \
    CHECKPOINT_BYTES_PER_PARAMETER
  held = np.asarray(weight_bytes, float) + np.asarray(optimizer_bytes, float)
  write_bps = storage.write_GBps * 1e9
  read_bps = storage.read_GBps * 1e9
  node_bps = storage.node_GBps * 1e9
  per_node = float(gpus_per_node)
  # Saving.
  if policy.parallel_save:
    rank_bytes, writers = size / n, np.minimum(per_node, n)
  else:
    rank_bytes = held
    writers = np.minimum(per_node, n / np.asarray(replicas, dtype=float))
  stage = rank_bytes / host_bytes_per_s
  write = np.maximum(rank_bytes * writers / node_bps, size / write_bps)
  if policy.mode == 'async':
    stall, persist = stage, write
  else:
    stall, persist = stage + write, np.zeros_like(write)
  # Loading.
  if policy.parallel_load:
    read = np.maximum(size / n * np.minimum(per_node, n) / node_bps,
                      size / read_bps) + held / network_bytes_per_s
  else:
    read = np.maximum(held * np.minimum(per_node, n) / node_bps,
                      held * n / read_bps)
  load = read + held / host_bytes_per_s
  shape = np.broadcast_shapes(np.shape(size), np.shape(held), np.shape(n))

  def b(x):
    return np.broadcast_to(np.asarray(x, dtype=float), shape)
  return CheckpointCost(b(size), b(held), b(rank_bytes), b(stage), b(write),
                        b(stall), b(persist), b(load))
