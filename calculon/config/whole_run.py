"""What a whole training run needs beyond the step: interruptions, storage
for checkpoints, and power.

Three optional top-level sections of a system file, each read here into a
frozen record (:class:`ReliabilityConfig`, :class:`StorageConfig`,
:class:`PowerConfig`) with the same one-line messages as every other
system field (:class:`~calculon.config._schema.Reader`).  A section the
file leaves out is None on :class:`~calculon.config.system.SystemConfig`,
meaning "the documented defaults": :data:`DEFAULT_RELIABILITY`,
:data:`DEFAULT_STORAGE` and :data:`DEFAULT_POWER` below, each with its
primary source.  A field a section leaves out takes its default too.

Units are in the names: ``_s`` seconds, ``_w`` watts, ``GBps`` SI
gigabytes (1e9 bytes) per second, ``per_gpu_hour`` events per GPU-hour.
calculon plan (:mod:`calculon.plan`) prices the run with them; docs/plan.md
lists every field, its default and its source.
"""

from calculon.config._record import frozen_record
from calculon.config._schema import Reader, Spec

#: Causes of unplanned interruptions, in the order reports list them.
CAUSES = ('gpu', 'hbm', 'network', 'host', 'software')

#: Hours of the Llama 3 405B snapshot, times its GPUs: 54 days x 24 h x
#: 16,384 H100s (arXiv 2407.21783 section 3.3.4).
_LLAMA3_GPU_HOURS = 54 * 24 * 16384
#: Unplanned interruptions of that snapshot by cause (arXiv 2407.21783,
#: Table 5: 419 in all), grouped: gpu = faulty GPU 148 + GPU SRAM 19 + GPU
#: system processor 17 + silent data corruption 6 + GPU thermal interface
#: and sensor 6; hbm = GPU HBM3 memory 72; network = switch and cable 35 +
#: NIC 7; host = unplanned host maintenance 32 + SSD 3 + power supply 3 +
#: server chassis 2 + IO expansion board 2 + CPU 2 + system memory 2;
#: software = software bug 54 + NCCL watchdog timeouts 7 + dependency 2.
LLAMA3_INTERRUPTIONS = {'gpu': 196, 'hbm': 72, 'network': 42, 'host': 46,
                        'software': 63}
#: Planned interruptions of the same snapshot (arXiv 2407.21783 section
#: 3.3.4: 466 interruptions, 47 planned: firmware upgrades, configuration
#: or dataset updates).
LLAMA3_PLANNED = 47


@frozen_record
class ReliabilityConfig:
  """Interruptions of a training job and what restarting costs.

  Attributes:
    interruptions_per_gpu_hour: dict cause (:data:`CAUSES`) -> unplanned
      interruptions per GPU-hour, measured at ``reference_gpus`` (a
      section that gives it replaces the whole table: causes left out are
      0).
    planned_per_gpu_hour: planned interruptions per GPU-hour (a checkpoint
      is saved before each: they cost a restart, no lost work).
    job_size_exponent: how the job's rate grows with its GPUs N:
      rate(N) = rate_per_gpu_hour x reference_gpus x (N / reference_gpus)
      ** exponent.  1 (default): proportional to N, i.e. a mean time to
      failure falling as 1/N (Kokolis et al., "Revisiting Reliability in
      Large-Scale Machine Learning Research Clusters", HPCA 2025, arXiv
      2410.21680, section V: their failure model's MTTF is inversely
      proportional to the job's GPUs).
    reference_gpus: the job size the rates were measured at.
    restart_s: time from an interruption to the job running again, not
      counting the checkpoint load (priced from the storage).
  """
  interruptions_per_gpu_hour: dict
  planned_per_gpu_hour: float
  job_size_exponent: float
  reference_gpus: int
  restart_s: float

  @property
  def unplanned_per_gpu_hour(self):
    """Sum over causes (per GPU-hour)."""
    return float(sum(self.interruptions_per_gpu_hour.values()))

  @classmethod
  def read(cls, reader, name):
    """Reads section ``name`` of ``reader``'s object; fields left out take
    :data:`DEFAULT_RELIABILITY`'s values.

    Raises:
      ConfigError: not an object, an unknown field or cause, a value out
        of range.
    """
    sub = Reader(reader.get(name, Spec('dict')), reader.source,
                 reader.field_path(name))
    sub.meta()
    d = DEFAULT_RELIABILITY
    rates = d.interruptions_per_gpu_hour
    if 'interruptions_per_gpu_hour' in sub.obj:
      obj = sub.get('interruptions_per_gpu_hour', Spec('dict'))
      causes = Reader(obj, reader.source,
                      sub.field_path('interruptions_per_gpu_hour'))
      rates = {c: float(causes.get(c, Spec('number', lo=0)))
               for c in CAUSES if c in obj}
      causes.finish()
    values = dict(
      interruptions_per_gpu_hour=rates,
      planned_per_gpu_hour=_number(sub, 'planned_per_gpu_hour',
                                   d.planned_per_gpu_hour, lo=0),
      job_size_exponent=_number(sub, 'job_size_exponent',
                                d.job_size_exponent, lo=0, lo_open=True),
      reference_gpus=int(sub.get('reference_gpus', Spec('int', lo=1)))
      if 'reference_gpus' in sub.obj else d.reference_gpus,
      restart_s=_number(sub, 'restart_s', d.restart_s, lo=0))
    sub.finish()
    return cls(**values)


@frozen_record
class StorageConfig:
  """Where checkpoints go.

  Attributes:
    write_GBps: sustained aggregate write bandwidth of the file system
      (GB/s, SI), shared by every rank of the job.
    read_GBps: sustained aggregate read bandwidth (GB/s).
    node_GBps: one node's link to the storage (GB/s): a node writes or
      reads its ranks' bytes no faster.
  """
  write_GBps: float
  read_GBps: float
  node_GBps: float

  @classmethod
  def read(cls, reader, name):
    """Reads section ``name``; fields left out take
    :data:`DEFAULT_STORAGE`'s values.

    Raises:
      ConfigError: not an object, an unknown field, a value <= 0.
    """
    sub = Reader(reader.get(name, Spec('dict')), reader.source,
                 reader.field_path(name))
    sub.meta()
    d = DEFAULT_STORAGE
    values = {key: _number(sub, key, getattr(d, key), lo=0, lo_open=True)
              for key in ('write_GBps', 'read_GBps', 'node_GBps')}
    sub.finish()
    return cls(**values)


@frozen_record
class PowerConfig:
  """Power of the GPUs, their nodes and the facility.

  A GPU draws ``gpu_idle_w + (gpu_busy_w - gpu_idle_w) x activity``, the
  activity in [0, 1] following what the step does (see
  :func:`calculon.plan.energy.activity`): compute-bound kernels count 1,
  memory-bound kernels ``memory_activity``, communication
  ``network_activity``.

  Attributes:
    gpu_busy_w: a GPU running compute-bound kernels (its power limit).
    gpu_idle_w: a GPU of a running job with nothing to do (bubbles,
      waits, restarts).
    memory_activity, network_activity: weights of the memory-bound and the
      communication time in the activity, (0, 1].
    node_overhead_w: the rest of a node (CPUs, host memory, NICs,
      switches in the node, fans), per node.
    network_w_per_gpu: the scale-out fabric (switches, optics) per GPU.
    gpus_per_node: GPUs per node (node overhead, node-hour prices, the
      per-node storage link).
    pue: power usage effectiveness of the facility (>= 1).
  """
  gpu_busy_w: float
  gpu_idle_w: float
  memory_activity: float
  network_activity: float
  node_overhead_w: float
  network_w_per_gpu: float
  gpus_per_node: int
  pue: float

  @classmethod
  def read(cls, reader, name):
    """Reads section ``name``; fields left out take
    :data:`DEFAULT_POWER`'s values.

    Raises:
      ConfigError: not an object, an unknown field, a value out of range,
        or an idle power above the busy power.
    """
    obj = reader.get(name, Spec('dict'))
    sub = Reader(obj, reader.source, reader.field_path(name))
    sub.meta()
    d = DEFAULT_POWER
    values = {
      'gpu_busy_w': _number(sub, 'gpu_busy_w', d.gpu_busy_w, lo=0,
                            lo_open=True),
      'gpu_idle_w': _number(sub, 'gpu_idle_w', d.gpu_idle_w, lo=0),
      'memory_activity': _number(sub, 'memory_activity', d.memory_activity,
                                 lo=0, hi=1),
      'network_activity': _number(sub, 'network_activity',
                                  d.network_activity, lo=0, hi=1),
      'node_overhead_w': _number(sub, 'node_overhead_w', d.node_overhead_w,
                                 lo=0),
      'network_w_per_gpu': _number(sub, 'network_w_per_gpu',
                                   d.network_w_per_gpu, lo=0),
      'gpus_per_node': int(sub.get('gpus_per_node', Spec('int', lo=1)))
      if 'gpus_per_node' in obj else d.gpus_per_node,
      'pue': _number(sub, 'pue', d.pue, lo=1),
    }
    if values['gpu_idle_w'] > values['gpu_busy_w']:
      sub.fail('gpu_idle_w', obj.get('gpu_idle_w', values['gpu_idle_w']),
               f"at most gpu_busy_w ({values['gpu_busy_w']:g})")
    sub.finish()
    return cls(**values)


def _number(sub, key, default, **bounds):
  """Field ``key`` of ``sub`` as a float (``default`` when absent)."""
  if key not in sub.obj:
    return float(default)
  return float(sub.get(key, Spec('number', **bounds)))


# -- the documented defaults ------------------------------------------------

#: Interruptions: the Llama 3 405B pretraining on 16,384 H100s (arXiv
#: 2407.21783, section 3.3.4 and Table 5: 419 unplanned and 47 planned
#: interruptions in a 54-day snapshot, i.e. 1.97e-5 unplanned per
#: GPU-hour, one every 3.1 hours for the job), growing in proportion to
#: the job's GPUs (Kokolis et al., arXiv 2410.21680).  Restart: 600 s,
#: the default collective timeout of PyTorch's NCCL process group
#: (torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp,
#: kProcessGroupNCCLDefaultTimeout = 10 minutes): the time the surviving
#: ranks of a job whose peer died or hung wait before the job is torn down
#: and relaunched; rescheduling and initialization beyond it are taken as
#: overlapped, the checkpoint load is priced from the storage.
DEFAULT_RELIABILITY = ReliabilityConfig(
  interruptions_per_gpu_hour={c: n / _LLAMA3_GPU_HOURS
                              for c, n in LLAMA3_INTERRUPTIONS.items()},
  planned_per_gpu_hour=LLAMA3_PLANNED / _LLAMA3_GPU_HOURS,
  job_size_exponent=1.0,
  reference_gpus=16384,
  restart_s=600.0)

#: Storage: Meta's Tectonic file system behind the Llama 3 cluster
#: "supports a sustainable throughput of 2 TB/s and a peak throughput of
#: 7 TB/s" (arXiv 2407.21783, section 3.3.1): 2,000 GB/s sustained, read
#: and write.  Per node: one 400 Gb/s storage link (50 GB/s): a DGX H100
#: has two dual-port ConnectX-7 adapters (up to 400 Gb/s) for storage and
#: in-band management (NVIDIA DGX H100 datasheet, "Networking").
DEFAULT_STORAGE = StorageConfig(write_GBps=2000.0, read_GBps=2000.0,
                                node_GBps=50.0)

#: H100 SXM board power: "up to 700 W" (NVIDIA H100 Tensor Core GPU
#: datasheet, max thermal design power).
H100_TDP_W = 700.0
#: DGX H100 / HGX H100 8-GPU node: "~10.2 kW max" (NVIDIA DGX H100
#: datasheet, system power usage).
DGX_H100_MAX_W = 10200.0
#: Measured: compute-intensive AI training on 8-GPU H100 nodes draws 76 %
#: of the node's 10.2 kW rating (Newkirk et al., "Empirically-Calibrated
#: H100 Node Power Models for Reducing Uncertainty in AI Training Energy
#: Estimation", arXiv 2506.14551, abstract and section 4; the peak seen
#: training Llama 2 13B was 8.4 kW: Latif et al., arXiv 2412.08602).
MEASURED_NODE_FRACTION = 0.76
#: GenZ's split of a GPU's power (GenZ-LLM-Analyzer, GenZ/power.py,
#: get_power: Static 30, Compute 40, Memory 20, Network 10 percent of the
#: board power, each scaled by its utilization).
GENZ_STATIC, GENZ_COMPUTE, GENZ_MEMORY, GENZ_NETWORK = 0.30, 0.40, 0.20, 0.10

#: Power (code defaults: an H100 SXM in a DGX H100):
#:
#: * gpu_busy_w 700: compute-bound training holds the GPU at its power
#:   limit, the datasheet's 700 W; the measured node power below is
#:   consistent with it (8 x 700 W + the node overhead = 76 % of 10.2 kW).
#: * gpu_idle_w 210: GenZ's static share, 30 % of 700 W.
#: * memory_activity 0.5, network_activity 0.25: GenZ's memory (20) and
#:   network (10) shares relative to its compute share (40).
#: * node_overhead_w 2,152: the measured node power under compute-
#:   intensive training (76 % of 10.2 kW, Newkirk et al.) less its eight
#:   GPUs at 700 W.
#: * network_w_per_gpu 0: the scale-out fabric is not counted unless given
#:   (the published energies calculon compares with count GPUs only).
#: * gpus_per_node 8 (DGX/HGX H100).
#: * pue 1.1: the power usage effectiveness Meta's model cards and papers
#:   assume (Touvron et al. 2023, "LLaMA", arXiv 2302.13971, section 6.1;
#:   Llama 2, arXiv 2307.09288, Table 2 caption); the Uptime Institute's
#:   2024 survey average is 1.56.
DEFAULT_POWER = PowerConfig(
  gpu_busy_w=H100_TDP_W,
  gpu_idle_w=GENZ_STATIC * H100_TDP_W,
  memory_activity=GENZ_MEMORY / GENZ_COMPUTE,
  network_activity=GENZ_NETWORK / GENZ_COMPUTE,
  node_overhead_w=MEASURED_NODE_FRACTION * DGX_H100_MAX_W - 8 * H100_TDP_W,
  network_w_per_gpu=0.0,
  gpus_per_node=8,
  pue=1.1)

#: Where each section's defaults come from (short; the comments above and
#: docs/plan.md give the details).
DEFAULT_SOURCES = {
  'reliability': 'interruptions: Llama 3 405B, 16,384 H100s, 54 days: 419 '
  'unplanned (by cause) and 47 planned (arXiv 2407.21783 section 3.3.4, '
  'Table 5), proportional to the GPUs (Kokolis et al., arXiv 2410.21680); '
  'restart 600 s: PyTorch ProcessGroupNCCL default timeout',
  'storage': "Meta Tectonic's sustained 2 TB/s (arXiv 2407.21783 section "
  '3.3.1); one 400 Gb/s storage link per node (DGX H100 datasheet)',
  'power': 'H100 SXM 700 W (datasheet); idle 30 % and the memory / network '
  "weights from GenZ's power split (GenZ/power.py); node overhead: 76 % of "
  'the DGX H100 10.2 kW measured under training (arXiv 2506.14551) less '
  '8 x 700 W; PUE 1.1 (LLaMA arXiv 2302.13971, section 6.1)',
}

#: Section name -> record class, in the order the system file lists them.
SECTIONS = {'reliability': ReliabilityConfig, 'storage': StorageConfig,
            'power': PowerConfig}
