"""The system (processor, memory tiers, network tiers) configuration.

Units follow Calculon's JSON: TFLOP/s and GFLOP thresholds for processors
(SI), GiB (binary) capacity and GB/s (SI) bandwidth and MB (SI) thresholds
for memories, GB/s (SI) bandwidth and seconds of latency for networks.
"""

import dataclasses

from calculon.config._record import frozen_record

from calculon.config._schema import Reader, Spec
from calculon.config.execution import DATATYPE_NAMES
from calculon.errors import ConfigError

PROCESSING_MODES = ('roofline', 'no_overlap')
NETWORK_OPS = ('p2p', 'reduce_scatter', 'all_gather', 'all_reduce',
               'all_to_all')
COLLECTIVES = ('reduce_scatter', 'all_gather', 'all_reduce', 'all_to_all')
#: Operations a tier may leave out, with the (scalar, offset) used then:
#: an all-to-all of n bytes per rank among p ranks sends (p - 1) / p of
#: them over the link (the bus factor of nccl-tests' alltoall_perf,
#: PERFORMANCE.md).
OPTIONAL_OPS = {'all_to_all': (1.0, -1.0)}


@frozen_record
class EfficiencyCurve:
  """A step function size -> efficiency.

  ``points`` is a tuple of (threshold, efficiency) sorted by threshold,
  largest first, ending at threshold 0; an operation of size x gets the
  efficiency of the first point whose threshold is <= x (Calculon's rule).
  Thresholds are in base units (FLOP or bytes).
  """
  points: tuple

  @classmethod
  def read(cls, reader, name, unit_scale, unit):
    """Reads a list of [threshold, efficiency] pairs from field ``name``.

    Raises:
      ConfigError: not a list of pairs, an efficiency outside (0, 1],
        thresholds not strictly decreasing, or no threshold 0 at the end.
    """
    raw = reader.get(name, Spec('list'))
    allowed = (f'a list of [{unit}, efficiency] pairs, {unit} strictly '
               'decreasing and ending at 0, efficiency > 0 and <= 1')
    points = []
    for pair in raw:
      ok = (isinstance(pair, list) and len(pair) == 2
            and Spec('number', lo=0).accepts(pair[0])
            and Spec('number', lo=0, lo_open=True, hi=1).accepts(pair[1]))
      if not ok:
        reader.fail(name, pair, allowed)
      points.append((float(pair[0]) * unit_scale, float(pair[1])))
    if not points:
      reader.fail(name, raw, allowed)
    for (a, _), (b, _) in zip(points, points[1:]):
      if not b < a:
        reader.fail(name, raw, allowed)
    if points[-1][0] != 0:
      reader.fail(name, raw, allowed + ' (sizes below the last threshold '
                  'would have no efficiency)')
    return cls(tuple(points))


@frozen_record
class ProcessorConfig:
  """Peak FLOP/s and efficiency curve per datatype for one engine.

  ``peak_flops[dtype]`` is in FLOP/s (JSON ``tflops`` * 1e12);
  ``efficiency[dtype]`` is an :class:`EfficiencyCurve` over FLOP per
  operation (JSON ``gflops_efficiency`` thresholds * 1e9).
  """
  peak_flops: dict
  efficiency: dict

  @classmethod
  def read(cls, reader, name):
    obj = reader.get(name, Spec('dict'))
    sub = Reader(obj, reader.source, reader.field_path(name))
    peak, eff = {}, {}
    for dtype in obj:
      if dtype not in DATATYPE_NAMES:
        sub.fail(dtype, obj[dtype],
                 'datatype keys must be one of ' +
                 ', '.join(f'"{d}"' for d in DATATYPE_NAMES))
      sub.get(dtype, Spec('dict'))
      dreader = Reader(obj[dtype], reader.source, sub.field_path(dtype))
      peak[dtype] = dreader.get('tflops', Spec('number', lo=0, lo_open=True)) \
        * 1e12
      eff[dtype] = EfficiencyCurve.read(dreader, 'gflops_efficiency', 1e9,
                                        'GFLOP')
      dreader.finish()
    return cls(peak, eff)


@frozen_record
class MemoryConfig:
  """One memory tier.

  capacity_bytes: JSON ``GiB`` * 2**30 (binary).
  bandwidth_bytes_per_s: JSON ``GBps`` * 1e9 (SI).
  efficiency: curve over bytes per access (JSON ``MB_efficiency`` * 1e6).
  """
  capacity_bytes: float
  bandwidth_bytes_per_s: float
  efficiency: EfficiencyCurve

  @classmethod
  def read(cls, reader, name):
    sub = Reader(reader.get(name, Spec('dict')), reader.source,
                 reader.field_path(name))
    cap = sub.get('GiB', Spec('number', lo=0)) * 1024 ** 3
    bw = sub.get('GBps', Spec('number', lo=0, lo_open=True)) * 1e9
    eff = EfficiencyCurve.read(sub, 'MB_efficiency', 1e6, 'MB')
    sub.finish()
    return cls(cap, bw, eff)


@frozen_record
class NetworkConfig:
  """One network tier.

  bandwidth_bytes_per_s: JSON ``bandwidth`` (GB/s) * 1e9.
  efficiency: fraction of bandwidth achieved, (0, 1].
  size: processors the tier connects.
  latency_s: per operation, seconds.
  ops: op name -> (scalar, offset): an operation of n bytes among p peers
    moves n * scalar * (1 + offset / p) bytes (offset 0 for p2p).
  must_be_filled: a parallelism using it must divide its size.
  processor_usage: fraction of compute used to drive communication, [0, 1).
  rails: optional JSON ``rails`` (integer >= 1; absent: 1, Calculon's
    model): how many processors of one domain of the tier below (a node)
    drive this tier in parallel for one collective, each over its own link
    -- one NIC per GPU on a rail-optimized fabric.  NCCL splits a
    reduce-scatter, all-gather or all-reduce into rings (channels) that
    cross this tier once per node, each on a different NIC, and balances
    the crossing traffic over the node's NICs through NVLink (NVIDIA/nccl
    issue #601, S. Jeaugey: "we can use NVLink to split the operations in
    N parts then balance the traffic onto the N NICs"); two 8-GPU HGX
    H100 nodes reach 360 GB/s of all-reduce bus bandwidth, 8 x 45 GB/s
    (NVIDIA/nccl issue #1277).  See
    :meth:`calculon.hardware.network.Networks.collective_time_s`.
  step_latency_s: optional JSON ``step_latency`` (seconds): one ring or
    tree step across this tier, NCCL's hardware latency per hop; with it
    ``latency_s`` is the operation's base latency (see
    :meth:`calculon.hardware.network.Networks.latency_s_of`).  Absent:
    None, ``latency_s`` per operation (Calculon).
  """
  bandwidth_bytes_per_s: float
  efficiency: float
  size: int
  latency_s: float
  ops: dict
  must_be_filled: bool
  processor_usage: float
  rails: int = 1
  step_latency_s: float = None

  @classmethod
  def read(cls, obj, source, path):
    sub = Reader(obj, source, path)
    bw = sub.get('bandwidth', Spec('number', lo=0, lo_open=True)) * 1e9
    eff = sub.get('efficiency', Spec('number', lo=0, lo_open=True, hi=1))
    from calculon.config.registry import field
    size = sub.get('size', field('system', 'networks[].size').spec)
    latency = sub.get('latency', Spec('number', lo=0))
    ops_obj = sub.get('ops', Spec('dict'))
    ops_reader = Reader(ops_obj, source, sub.field_path('ops'))
    ops = {}
    for op in NETWORK_OPS:
      if op in OPTIONAL_OPS and op not in ops_obj:
        ops[op] = OPTIONAL_OPS[op]
        continue
      pair = ops_reader.get(op, Spec('list'))
      collective = op in COLLECTIVES
      allowed = ('[scalar > 0, offset number]' if collective
                 else '[scalar > 0, null]')
      ok = (len(pair) == 2 and Spec('number', lo=0, lo_open=True)
            .accepts(pair[0]) and (Spec('number').accepts(pair[1])
                                   if collective else pair[1] is None))
      if not ok:
        ops_reader.fail(op, pair, allowed)
      ops[op] = (float(pair[0]), float(pair[1]) if collective else 0.0)
    ops_reader.finish()
    filled = sub.get('must_be_filled', Spec('bool'))
    usage = sub.get('processor_usage', Spec('number', lo=0, hi=1, hi_open=True))
    rails = int(sub.get('rails', Spec('int', lo=1))) if 'rails' in obj else 1
    step = (float(sub.get('step_latency', Spec('number', lo=0)))
            if 'step_latency' in obj else None)
    sub.finish()
    return cls(bw, float(eff), int(size), float(latency), ops, filled,
               float(usage), rails, step)


@frozen_record
class OverheadConfig:
  """Fixed costs of a training step the layers do not account for: host
  work (kernel launches, Python, the data loader, logging, the gradient-norm
  and loss reductions) that the accelerators wait for.  In seconds:
  ``per_step_s`` once per batch, ``per_microbatch_s`` once per microbatch
  of a data-parallel replica (its forward and backward schedule), both
  added; ``per_moe_block_s`` the host's time to launch one
  Mixture-of-Experts block's kernels for one microbatch, forward and
  backward, a floor rather than an addition: a stage whose blocks' GPU
  work per microbatch is shorter than its MoE blocks' host time waits for
  the host (host-bound; Megatron-Core's MoE report, arXiv 2603.07685,
  names it among MoE's walls and removes it with CUDA graphs; an execution
  replaying a full-iteration graph, ``cuda_graphs`` 'full_iteration', has
  none).  Absent: 0
  (Calculon).  Usually fitted by ``calculon calibrate``.
  """
  per_step_s: float = 0.0
  per_microbatch_s: float = 0.0
  per_moe_block_s: float = 0.0

  @classmethod
  def read(cls, reader, name):
    sub = Reader(reader.get(name, Spec('dict')), reader.source,
                 reader.field_path(name))
    values = {}
    for key in ('per_step_s', 'per_microbatch_s', 'per_moe_block_s'):
      if key in sub.obj:
        values[key] = float(sub.get(key, Spec('number', lo=0)))
    sub.finish()
    return cls(**values)


@frozen_record
class HostConfig:
  """The host side of each processor's link to memory tier 2 (the JSON's
  optional ``host``; None without it: Calculon's tier 2, alone on its
  link).

  link_network_tier: index of the network tier whose traffic to and from
    the processor crosses the same link as its offload traffic, or None.
    On HGX/DGX nodes each GPU's PCIe Gen5 x16 link reaches the host through
    the PCIe switch that also holds the GPU's NIC, so GPUDirect RDMA and
    host copies share it (NVIDIA/nccl issue #1264: each GPU "PIX" to one
    NIC); on GB200/GB300 the NICs hang off Grace and NCCL sends GPUDirect
    RDMA through NVLink-C2C (NCCL src/graph/paths.cc, NCCL_NET_GDR_C2C).
  bidirectional_efficiency: fraction of its one-way rate each direction of
    the link keeps while both carry traffic, (0, 1] (1: full duplex).
  memory_bytes_per_s: host DRAM bandwidth per processor (JSON
    ``memory_GBps`` * 1e9: the node's DRAM peak over its processors), or
    None (memory tier 2's bandwidth stands for it).
  memory_efficiency: fraction of it a streaming kernel reaches, (0, 1].
  """
  link_network_tier: object = None
  bidirectional_efficiency: float = 1.0
  memory_bytes_per_s: object = None
  memory_efficiency: float = 1.0

  @classmethod
  def read(cls, reader, name):
    sub = Reader(reader.get(name, Spec('dict')), reader.source,
                 reader.field_path(name))
    values = {}
    if 'link_network_tier' in sub.obj:
      values['link_network_tier'] = int(sub.get('link_network_tier',
                                                Spec('int', lo=0)))
    if 'bidirectional_efficiency' in sub.obj:
      values['bidirectional_efficiency'] = float(sub.get(
        'bidirectional_efficiency', Spec('number', lo=0, lo_open=True,
                                         hi=1)))
    if 'memory_GBps' in sub.obj:
      values['memory_bytes_per_s'] = float(sub.get(
        'memory_GBps', Spec('number', lo=0, lo_open=True))) * 1e9
    if 'memory_efficiency' in sub.obj:
      values['memory_efficiency'] = float(sub.get(
        'memory_efficiency', Spec('number', lo=0, lo_open=True, hi=1)))
    sub.finish()
    return cls(**values)


@frozen_record
class MemoryReserveConfig:
  """Memory a real run holds beyond its tensors, and the margin it leaves
  free (the JSON's optional ``memory_reserve``; None without it: the
  tensors alone, up to the whole capacity, as Calculon).

  context_bytes: the CUDA context and the kernels a step loads, outside the
    framework's caching allocator (JSON ``context_GiB`` * 2**30).
  nccl_bytes_per_group: NCCL's buffers per communicator, outside the
    allocator (JSON ``nccl_GiB_per_group`` * 2**30).
  fragmentation: what the caching allocator reserves beyond the tensors it
    holds, as a fraction of them (>= 0).
  headroom: fraction of memory tier 1 a run leaves free, [0, 1).
  """
  context_bytes: float = 0.0
  nccl_bytes_per_group: float = 0.0
  fragmentation: float = 0.0
  headroom: float = 0.0

  @classmethod
  def read(cls, reader, name):
    sub = Reader(reader.get(name, Spec('dict')), reader.source,
                 reader.field_path(name))
    values = {}
    for key, attr, scale in (('context_GiB', 'context_bytes', 1024 ** 3),
                             ('nccl_GiB_per_group', 'nccl_bytes_per_group',
                              1024 ** 3),
                             ('fragmentation', 'fragmentation', 1.0)):
      if key in sub.obj:
        values[attr] = float(sub.get(key, Spec('number', lo=0))) * scale
    if 'headroom' in sub.obj:
      values['headroom'] = float(sub.get('headroom', Spec(
        'number', lo=0, hi=1, hi_open=True)))
    sub.finish()
    return cls(**values)

#: Tables of a system's ``measured`` section: name -> (axes, the keys of its
#: ``latency_ms``: any, or the allowed ones).
MEASURED_TABLES = {
  'gemm': (('m', 'n', 'k'), ('bfloat16', 'fp8', 'fp8_block', 'nvfp4')),
  'attention': (('head_dim', 'isl', 'heads'), ('bfloat16',)),
  'nccl': (('gpus', 'bytes'), ('all_gather', 'reduce_scatter', 'all_reduce',
                               'alltoall')),
}


@frozen_record
class MeasuredConfig:
  """Measured kernel tables (the JSON's optional ``measured``; None
  without it: every kernel priced by the curves and the network model).

  Built by ``calculon import-kernels`` (:mod:`calculon.kernels.
  import_kernels`); priced by :mod:`calculon.kernels.tables`.  Each of
  ``gemm``, ``attention``, ``nccl`` is None or a dict: its axes (ascending
  positive numbers), ``latency_ms`` {key: nested lists of positive
  latencies in ms over the axes, in axis order}, and its provenance
  (``framework``, ``version``, ``collection_meta``, ``kernel_source``, ...,
  kept as written).  ``source``: where the tables come from (package,
  version, GPU, device).
  """
  source: object = dataclasses.field(default=None, hash=False, repr=False)
  gemm: object = dataclasses.field(default=None, hash=False, repr=False)
  attention: object = dataclasses.field(default=None, hash=False,
                                        repr=False)
  nccl: object = dataclasses.field(default=None, hash=False, repr=False)
  #: Sustained over burst SM clock of the table-priced compute, (0, 1];
  #: None: 1 (the tables' times as measured).
  sustained_clock: object = None
  #: Time of a block-scaled 8-bit GEMM (MXFP8) over the 'fp8' table's
  #: per-tensor scaled one; None: 1.
  block_scaled_gemm_ratio: object = None

  @classmethod
  def read(cls, reader, name):
    import numpy as np
    sub = Reader(reader.get(name, Spec('dict')), reader.source,
                 reader.field_path(name))
    values = {}
    if 'source' in sub.obj:
      values['source'] = sub.get('source', Spec('dict'))
    from calculon.config.registry import field
    for scalar in ('sustained_clock', 'block_scaled_gemm_ratio'):
      if scalar in sub.obj:
        values[scalar] = sub.get(
          scalar, field('system', f'measured.{scalar}').spec)
    for table, (axes, keys) in MEASURED_TABLES.items():
      if table not in sub.obj:
        continue
      tsub = Reader(sub.get(table, Spec('dict')), reader.source,
                    sub.field_path(table))
      shape = []
      for axis in axes:
        vals = tsub.get(axis, Spec('list'))
        if not vals or not all(Spec('number', lo=0, lo_open=True).accepts(v)
                               for v in vals) or \
            any(b <= a for a, b in zip(vals, vals[1:])):
          tsub.fail(axis, vals, 'a non-empty list of positive numbers, '
                    'strictly ascending')
        shape.append(len(vals))
      lat = tsub.get('latency_ms', Spec('dict'))
      if not lat:
        tsub.fail('latency_ms', lat, 'an object {' + ', '.join(keys) +
                  ': latencies}')
      for key, grid in lat.items():
        where = f'latency_ms.{key}'
        if key not in keys:
          tsub.fail(where, key, 'one of ' + ', '.join(keys))
        try:
          arr = np.asarray(grid, dtype=float)
        except (TypeError, ValueError):
          arr = None
        if arr is None or arr.shape != tuple(shape) or \
            not np.all(np.isfinite(arr)) or np.any(arr <= 0):
          tsub.fail(where, grid, 'nested lists of positive latencies (ms) '
                    'of shape ' + ' x '.join(str(n) for n in shape) +
                    ' (' + ', '.join(axes) + ')')
      tsub._used.update(tsub.obj)   # provenance fields, kept as written
      values[table] = dict(tsub.obj)
    sub.finish()
    return cls(**values)


#: Optional sections of a whole training run (:mod:`calculon.config.
#: whole_run`, read only when a file has one).
WHOLE_RUN_SECTIONS = ('reliability', 'storage', 'power')

#: Optional efficiency fields of a system, (0, 1]; absent means 1 (priced
#: as a dense GEMM): fused attention kernels, grouped expert GEMMs.
OPTIONAL_EFFICIENCIES = ('fused_attention_efficiency',
                         'grouped_gemm_efficiency')


@frozen_record
class SystemConfig:
  """A whole system: matrix and vector engines, two memory tiers, networks,
  and (optional) fixed overheads (:class:`OverheadConfig`; None when the
  file has no ``overhead``)."""
  matrix: ProcessorConfig
  vector: ProcessorConfig
  mem1: MemoryConfig
  mem2: MemoryConfig
  processing_mode: str
  networks: tuple
  overhead: object = None
  fused_attention_efficiency: object = None
  grouped_gemm_efficiency: object = None
  host: object = None
  memory_reserve: object = None
  reliability: object = None
  storage: object = None
  power: object = None
  measured: object = None

  @classmethod
  def from_dict(cls, cfg, source='<system>'):
    """Reads and validates a system.

    Optional ``overhead``: {"per_step_s": s, "per_microbatch_s": s,
    "per_moe_block_s": s}
    (:class:`OverheadConfig`).  Optional ``fused_attention_efficiency``
    (0, 1]: the share of the matrix engine's GEMM efficiency a fused
    attention kernel (FlashAttention) reaches at the same FLOP count
    (absent: 1, priced as a GEMM).  Optional ``grouped_gemm_efficiency``
    (0, 1]: the same for the grouped GEMMs of Mixture-of-Experts layers
    (absent: 1).  Optional ``reliability``, ``storage``, ``power``: what a
    whole training run needs beyond the step (interruptions, checkpoint
    storage, power; :mod:`calculon.config.whole_run`; absent: None, the
    documented defaults).  Optional ``host`` (:class:`HostConfig`: what
    shares the link to memory tier 2, the host memory behind it) and
    ``memory_reserve`` (:class:`MemoryReserveConfig`: memory beyond the
    tensors, the headroom a run leaves); absent: None, Calculon's model.
    Optional ``measured`` (:class:`MeasuredConfig`: measured GEMM,
    attention and NCCL tables the engine prices from); absent: None.

    Raises:
      ConfigError: any field missing, unknown, or out of range; a datatype
        given for only one of matrix/vector.
    """
    from calculon.config.registry import FIELDS
    top = {n.split('.')[0].split('[')[0] for n in FIELDS['system']}
    reader = Reader(cfg, source, known=tuple(top) + WHOLE_RUN_SECTIONS +
                    Reader.META_FIELDS)
    reader.meta()
    matrix = ProcessorConfig.read(reader, 'matrix')
    vector = ProcessorConfig.read(reader, 'vector')
    mem1 = MemoryConfig.read(reader, 'mem1')
    mem2 = MemoryConfig.read(reader, 'mem2')
    mode = reader.get('processing_mode', Spec('str', choices=PROCESSING_MODES))
    nets = reader.get('networks', Spec('list'))
    if not nets:
      reader.fail('networks', nets, 'a non-empty list of network tiers')
    networks = tuple(NetworkConfig.read(n, source, f'networks[{i}]')
                     for i, n in enumerate(nets))
    overhead = OverheadConfig.read(reader, 'overhead') \
      if 'overhead' in cfg else None
    fused, grouped = (
      float(reader.get(name, Spec('number', lo=0, lo_open=True, hi=1)))
      if name in cfg else None for name in OPTIONAL_EFFICIENCIES)
    host = HostConfig.read(reader, 'host') if 'host' in cfg else None
    if host is not None and host.link_network_tier is not None and \
        host.link_network_tier >= len(networks):
      reader.fail('host', cfg['host'], 'link_network_tier: the index of one '
                  f'of the {len(networks)} network tiers')
    reserve = MemoryReserveConfig.read(reader, 'memory_reserve') \
      if 'memory_reserve' in cfg else None
    measured = MeasuredConfig.read(reader, 'measured') \
      if 'measured' in cfg else None
    whole_run = {}
    if any(name in cfg for name in WHOLE_RUN_SECTIONS):
      from calculon.config.whole_run import SECTIONS  # only when used
      whole_run = {name: kind.read(reader, name) for name, kind in
                   SECTIONS.items() if name in cfg}
    reader.finish()
    if set(matrix.peak_flops) != set(vector.peak_flops):
      diff = sorted(set(matrix.peak_flops) ^ set(vector.peak_flops))
      raise ConfigError(
        f"{source}: field 'matrix'/'vector': datatype \"{diff[0]}\" must be "
        'given for both the matrix and the vector engine',
        source=source, field='matrix', value=diff[0],
        allowed='the same datatypes in matrix and vector')
    return cls(matrix, vector, mem1, mem2, mode, networks, overhead, fused,
               grouped, host, reserve, measured=measured, **whole_run)
