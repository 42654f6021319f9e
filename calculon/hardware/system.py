"""The system: engines, memory tiers, networks and how compute overlaps memory.
"""

import numpy as np

from calculon.config.execution import DATATYPE_BYTES, DATATYPE_NAMES
from calculon.config.system import SystemConfig
from calculon.errors import ConfigError
from calculon.hardware.memory import Memory
from calculon.hardware.network import Networks
from calculon.hardware.processor import Processor


class System:
  """A processor with a matrix and a vector engine, two memory tiers and
  network tiers.

  Calculon-compatible: ``System(cfg_dict)``.

  Args:
    cfg: the system JSON object (dict) or a :class:`SystemConfig`.
    source: file name or label used in error messages.

  Raises:
    ConfigError: the configuration is invalid.
  """

  #: Calculon-compatible table of bytes per element.
  TypeSizes = dict(DATATYPE_BYTES)

  def __init__(self, cfg, source='<system>'):
    if not isinstance(cfg, SystemConfig):
      self.cfg = cfg
      cfg = SystemConfig.from_dict(cfg, source)
    else:
      self.cfg = None
    self.config = cfg
    self.matrix = Processor(cfg.matrix)
    self.vector = Processor(cfg.vector)
    self.mem1 = Memory(cfg.mem1)
    self.mem2 = Memory(cfg.mem2)
    self.proc_mode = cfg.processing_mode
    self.networks = Networks(cfg.networks)
    #: Measured kernel tables (:class:`~calculon.kernels.tables.
    #: MeasuredKernels`) of the file's ``measured`` section, or None: the
    #: curves and the network model price everything (Calculon).
    self.measured = None
    if cfg.measured is not None:
      from calculon.kernels.tables import MeasuredKernels
      self.measured = MeasuredKernels(cfg.measured)
      self.networks.measured = self.measured if self.measured.has_nccl \
        else None
    self.datatype = None
    #: Fixed overheads (s) of the system file's ``overhead``; None without
    #: (the engine then adds nothing: Calculon).
    overhead = cfg.overhead
    self.overhead_per_step_s = None if overhead is None else \
      overhead.per_step_s
    self.overhead_per_microbatch_s = None if overhead is None else \
      overhead.per_microbatch_s
    #: Host time per MoE block and microbatch (s; a floor, see
    #: :class:`~calculon.config.system.OverheadConfig`); 0 without one.
    self.overhead_per_moe_block_s = 0.0 if overhead is None else \
      overhead.per_moe_block_s
    #: Share of the GEMM efficiency fused attention kernels reach (None:
    #: the file does not say; priced as GEMMs).
    self.fused_attention_efficiency = cfg.fused_attention_efficiency
    #: Share of the GEMM efficiency the grouped expert GEMMs reach (None:
    #: priced as one GEMM per expert).
    self.grouped_gemm_efficiency = cfg.grouped_gemm_efficiency
    #: The host side of the link to memory tier 2
    #: (:class:`~calculon.config.system.HostConfig`), or None (Calculon:
    #: tier 2 alone on its link).
    self.host = cfg.host
    #: Memory beyond the tensors and the headroom a run leaves
    #: (:class:`~calculon.config.system.MemoryReserveConfig`), or None
    #: (Calculon: the tensors alone, up to the whole capacity).
    self.memory_reserve = cfg.memory_reserve
    #: A whole run's inputs (:mod:`calculon.config.whole_run` records, or
    #: None: the documented defaults): interruptions, checkpoint storage,
    #: power.
    self.reliability = cfg.reliability
    self.storage = cfg.storage
    self.power = cfg.power

  @staticmethod
  def supported_datatypes():
    """Datatype names the model knows."""
    return list(DATATYPE_NAMES)

  @property
  def num_networks(self):
    return len(self.networks)

  def get_network(self, tier):
    """The :class:`~calculon.hardware.network.Network` of tier ``tier``.

    Raises:
      ConfigError: no such tier.
    """
    if not 0 <= tier < len(self.networks):
      raise ConfigError(
        f'network tier {tier} does not exist: the system has '
        f'{len(self.networks)} tiers (0 to {len(self.networks) - 1})',
        field='network', value=tier)
    return self.networks.tiers[tier]

  def set_datatype(self, datatype):
    """Calculon-compatible: remembers a datatype (checked here)."""
    self.check_datatype(datatype)
    self.datatype = datatype

  def check_datatype(self, datatype):
    """Raises ConfigError unless both engines support ``datatype`` (name)."""
    have = sorted(self.config.matrix.peak_flops)
    allowed = ('the system\'s processors give throughput for: ' +
               ', '.join(f'"{d}"' for d in have))
    if datatype not in DATATYPE_BYTES or not (
        self.matrix.supports(DATATYPE_NAMES.index(datatype)) and
        self.vector.supports(DATATYPE_NAMES.index(datatype))):
      raise ConfigError(f'datatype "{datatype}" is not allowed: {allowed}',
                        field='datatype', value=datatype, allowed=allowed)

  def processing_time_s(self, flops_time_s, mem_time_s):
    """Time of an operation given its compute and memory times.

    'roofline': max of the two (perfect overlap); 'no_overlap': their sum.
    """
    if self.proc_mode == 'roofline':
      return np.maximum(flops_time_s, mem_time_s)
    return flops_time_s + mem_time_s

  def offload_time_s(self, size_bytes):
    """Seconds to move ``size_bytes`` to or from memory tier 2: at tier 2's
    bandwidth (Calculon), and no faster than the host memory behind the
    link can take them when the system file says what it is
    (``host.memory_GBps`` x ``host.memory_efficiency``: on GB200 one
    Grace's LPDDR5X serves two GPUs' NVLink-C2C links; NVIDIA
    Megatron-Bridge docs/performance-guide.md: offload efficiency
    "depends on both the interconnect bandwidth between the GPU and host
    and the host memory bandwidth")."""
    link = self.mem2.time_s(size_bytes)
    rate = self.host_memory_bytes_per_s
    if self.host is None or self.host.memory_bytes_per_s is None:
      return link
    return np.maximum(link, size_bytes / rate)

  @property
  def host_memory_bytes_per_s(self):
    """Bytes per second one processor's share of the host memory streams
    (``host.memory_GBps`` x ``host.memory_efficiency``); without them,
    memory tier 2's peak bandwidth."""
    host = self.host
    if host is None or host.memory_bytes_per_s is None:
      return self.mem2.bandwidth_bytes_per_s
    return host.memory_bytes_per_s * host.memory_efficiency

  @property
  def host_link_network_tier(self):
    """Index of the network tier sharing the link to memory tier 2, or
    None (``host.link_network_tier``)."""
    return None if self.host is None else self.host.link_network_tier
