"""``calculon profile-step``: run real training steps and measure them.

The application's blocks (:mod:`calculon.profile.gpt`) run with the
execution's microbatch size, sequence, datatype, recomputation and data
parallelism: DP ranks are local processes over ``torch.distributed`` (gloo
on the CPU, NCCL on GPUs), started with ``torch.multiprocessing`` and a
file rendezvous.  Each rank runs ``warmup`` steps, then ``steps`` timed
steps: per microbatch a forward and a backward pass, then the DP all-reduce
of each block's gradients (one coalesced buffer per block, as calculon
prices it), then Adam.  Every time is kept per step; the report takes the
best (fastest) step, as the profile keeps the best of its runs, so that a
step slowed by another process on the machine does not count.

Per layer, module hooks time the forward and backward of every module
(``time.perf_counter`` on the CPU, where PyTorch runs synchronously, or
``time.process_time`` with ``--clock cpu``; CUDA events on a GPU).  A
forward hook that fires during the backward pass is a recomputation.
After the timed steps one more step runs under ``torch.profiler`` (``profile_memory=True``) with a ``record_function``
range per layer and phase: the memory each layer allocates, the operator
tables (the Anemoi profiler's memory report) and, with a report folder, a
Chrome trace and (CUDA) a memory snapshot.  Step times come from the timed
steps, not the profiled one (the profiler's overhead).
"""

import json
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass

from calculon.errors import ConfigError

#: Execution settings profile-step cannot run, with the reason.
UNSUPPORTED = (
  ('tensor_par', lambda e: e.tensor_par > 1,
   'tensor parallelism is not run (DP only): use tensor_par 1'),
  ('pipeline_par', lambda e: e.pipeline_par > 1,
   'pipeline parallelism is not run: use pipeline_par 1'),
  ('optimizer_sharding', lambda e: e.optimizer_sharding,
   'ZeRO optimizer sharding is not run: use false'),
  ('data_par_overlap', lambda e: e.data_par_overlap,
   'DP communication overlapped with the backward pass is not run: use '
   'false (the all-reduce runs after the backward pass)'),
  ('weight_offload', lambda e: e.weight_offload, 'offloading is not run'),
  ('activations_offload', lambda e: e.activations_offload,
   'offloading is not run'),
  ('optimizer_offload', lambda e: e.optimizer_offload,
   'offloading is not run'),
  ('datatype', lambda e: e.datatype == 'float8',
   'float8 training is not run: use float32, bfloat16 or float16'),
)


@dataclass
class StepPlan:
  """What to run.  Sizes from the application and execution; ``device``
  'cpu' or 'cuda'; ``threads`` per rank on the CPU."""
  num_blocks: int
  hidden: int
  feedforward: int
  seq_size: int
  attn_heads: int
  attn_size: int
  multiquery: bool
  microbatch_size: int
  num_microbatches: int
  data_par: int
  datatype: str
  recompute: str
  training: bool
  fused_activation: bool
  device: str
  steps: int
  warmup: int
  dropout: float
  threads: int
  batch_size: int
  clock: str = 'wall'

  @classmethod
  def from_configs(cls, app, exe, device, steps, warmup, dropout,
                   source='<execution>', threads=None, clock='wall'):
    """A plan from :class:`~calculon.config.Application` and
    :class:`~calculon.config.Execution`.

    Raises:
      ConfigError: a setting profile-step cannot run (named), a dropout
        outside [0, 1), or more DP ranks than CUDA devices.
    """
    for fld, bad, why in UNSUPPORTED:
      if bad(exe):
        raise ConfigError(
          f'{source}: field {fld!r}: value {getattr(exe, fld)!r} cannot be '
          f'run by profile-step: {why}', source=source, field=fld,
          value=getattr(exe, fld), allowed=why)
    if not 0 <= dropout < 1:
      raise ConfigError(f'--dropout {dropout}: must be >= 0 and < 1',
                        field='--dropout', value=dropout)
    from calculon.profile.build import threads_per_proc
    nmb = exe.num_microbatches
    return cls(num_blocks=app.num_blocks, hidden=app.hidden,
               feedforward=app.feedforward, seq_size=app.seq_size,
               attn_heads=app.attn_heads, attn_size=app.attn_size,
               multiquery=exe.attention_type == 'multiquery',
               microbatch_size=exe.microbatch_size, num_microbatches=nmb,
               data_par=exe.data_par, datatype=exe.datatype,
               recompute=exe.activation_recompute, training=exe.training,
               fused_activation=exe.fused_activation, device=device,
               steps=steps, warmup=warmup, dropout=dropout,
               threads=threads_per_proc(exe.data_par, threads),
               batch_size=exe.batch_size, clock=clock)

  def describe(self):
    mode = 'training' if self.training else 'inference (forward only)'
    return (f'{self.steps} {mode} steps (+{self.warmup} warm-up) of '
            f'{self.num_blocks} blocks, hidden {self.hidden}, sequence '
            f'{self.seq_size}, microbatch {self.microbatch_size} x '
            f'{self.num_microbatches}, {self.datatype}, recompute '
            f'{self.recompute}, DP {self.data_par} on {self.device}'
            f'{", CPU-time clock" if self.clock == "cpu" else ""}'
            f'{f" ({self.threads} threads per rank)" if self.device == "cpu" else ""}')


class StepFailed(RuntimeError):
  """The training ranks failed (an exception, a crash, the timeout)."""


def run_step(plan, timeout_s=3600, quiet=False, report_dir=None):
  """Runs the plan's ranks and gathers their measurements.

  Returns:
    dict: 'ranks' (each rank's measurement dict, see :func:`_rank`),
    'plan' (the plan as a dict).

  Raises:
    ConfigError: CUDA asked for and not available, or too few devices.
    StepFailed: a rank raised or died, or ``timeout_s`` passed (the ranks
      are killed).
  """
  import torch
  import torch.multiprocessing as mp
  if plan.device == 'cuda':
    if not torch.cuda.is_available():
      raise ConfigError('--device cuda: torch sees no CUDA device on this '
                        'machine', field='--device', value='cuda')
    if torch.cuda.device_count() < plan.data_par:
      raise ConfigError(f'data_par {plan.data_par}: only '
                        f'{torch.cuda.device_count()} CUDA devices',
                        field='data_par', value=plan.data_par)
  from calculon.profile.machine import ALLOCATOR_ENV
  tmp = tempfile.mkdtemp(prefix='calculon-step-')
  saved = {k: os.environ.get(k) for k in ALLOCATOR_ENV}
  if plan.device == 'cpu':
    os.environ.update(ALLOCATOR_ENV)   # read by the spawned ranks' malloc
  try:
    ctx = mp.start_processes(_rank, args=(asdict(plan), tmp, report_dir),
                             nprocs=plan.data_par, start_method='spawn',
                             join=False)
    deadline = time.monotonic() + timeout_s
    try:
      while not ctx.join(timeout=1.0):
        if time.monotonic() > deadline:
          raise StepFailed(f'the training ranks did not finish within '
                           f'{timeout_s:g} s (--step-timeout)')
    except mp.ProcessRaisedException as err:
      last = [ln for ln in str(err).strip().splitlines() if ln.strip()]
      raise StepFailed(f'a training rank failed: {last[-1] if last else err}'
                       ) from None
    except mp.ProcessExitedException as err:
      raise StepFailed(f'a training rank died: {err}') from None
    finally:
      for proc in ctx.processes:
        if proc.is_alive():
          proc.kill()
    ranks = []
    for r in range(plan.data_par):
      with open(os.path.join(tmp, f'rank{r}.json')) as fd:
        ranks.append(json.load(fd))
  finally:
    for k, v in saved.items():
      if v is None:
        os.environ.pop(k, None)
      else:
        os.environ[k] = v
    shutil.rmtree(tmp, ignore_errors=True)
  return {'ranks': ranks, 'plan': asdict(plan)}


class LayerTimer:
  """Module hooks timing each calculon layer's forward, backward and
  recomputation (see the module docstring).

  Totals are seconds summed over everything timed while ``active``;
  ``ranges`` (when set) opens a ``torch.profiler.record_function`` per layer
  and phase.
  """

  def __init__(self, torch, cuda, clock=time.perf_counter):
    self.torch = torch
    self.cuda = cuda
    self.clock = clock
    self.active = False
    self.ranges = False
    self.in_backward = False
    self.open = {}
    self.open_bw = []      # recompute windows nested in open bw windows
    self.pending = []      # CUDA: (step, name, phase, start, end) events
    self.steps = []        # per timed step: {(name, phase): seconds}

  def new_step(self):
    """Starts accumulating a new timed step."""
    self.steps.append({})

  def _now(self):
    if self.cuda:
      ev = self.torch.cuda.Event(enable_timing=True)
      ev.record()
      return ev
    return self.clock()

  def _start(self, key):
    rng = None
    if self.ranges:
      rng = self.torch.profiler.record_function(f'{key[1]}.{key[2]}')
      rng.__enter__()
    nested = []
    if key[2] == 'bw':
      self.open_bw.append(nested)
    self.open.setdefault(key, []).append((self._now(), rng, nested))

  def _stop(self, key):
    stack = self.open.get(key)
    if not stack:
      return
    start, rng, nested = stack.pop()
    end = self._now()
    if key[2] == 'bw':
      self.open_bw = [n for n in self.open_bw if n is not nested]
    if rng is not None:
      rng.__exit__(None, None, None)
    if not self.active:
      return
    _, name, phase = key
    if self.cuda:
      self.pending.append((len(self.steps) - 1, name, phase, start, end,
                           nested))
    else:
      inner = sum(e - s for s, e in nested)
      self._add(len(self.steps) - 1, name, phase, end - start - inner)

  def wrap_recompute(self, owner, attr='_run'):
    """Times ``owner.<attr>`` when it reruns in the backward pass (a
    checkpointed region being recomputed): the time is taken out of the
    backward window of the layer whose backward triggered it, since the
    recomputed layers' own forward hooks count it as recomputation."""
    run = getattr(owner, attr)

    def wrapped(*args):
      if not self.in_backward:
        return run(*args)
      start = self._now()
      try:   # torch stops a recomputation early by raising through here
        return run(*args)
      finally:
        end = self._now()
        for nested in self.open_bw:
          nested.append((start, end))
    setattr(owner, attr, wrapped)

  def _add(self, step, name, phase, seconds):
    totals = self.steps[step]
    totals[(name, phase)] = totals.get((name, phase), 0.0) + seconds

  def resolve(self):
    """CUDA: turns recorded event pairs into seconds (after a sync)."""
    for step, name, phase, start, end, nested in self.pending:
      inner = sum(a.elapsed_time(b) for a, b in nested)
      self._add(step, name, phase, (start.elapsed_time(end) - inner) / 1e3)
    self.pending = []

  def per_step(self):
    """[{'name', 'phase', 'seconds': [per timed step]}]."""
    keys = []
    for totals in self.steps:
      keys += [k for k in totals if k not in keys]
    return [{'name': n, 'phase': p,
             'seconds': [t.get((n, p), 0.0) for t in self.steps]}
            for n, p in keys]

  def attach(self, name, module):
    mid = id(module)

    def fw_phase():
      return 'recompute' if self.in_backward else 'fw'

    module.register_forward_pre_hook(
      lambda m, a: self._start((mid, name, fw_phase())))
    module.register_forward_hook(
      lambda m, a, o: self._stop((mid, name, fw_phase())))
    module.register_full_backward_pre_hook(
      lambda m, g: self._start((mid, name, 'bw')))
    module.register_full_backward_hook(
      lambda m, gi, go: self._stop((mid, name, 'bw')))


def _table(averages, sort_keys, rows=15):
  """``key_averages().table`` sorted by the first key this torch knows
  (the CUDA column names changed across releases)."""
  for key in sort_keys:
    try:
      return averages.table(sort_by=key, row_limit=rows)
    except (AttributeError, KeyError, ValueError):
      continue
  return averages.table(row_limit=rows)


def _rank(rank, plan, tmp, report_dir):
  """One DP rank: build, warm up, time, profile; writes rank<r>.json."""
  import datetime
  import resource
  import psutil
  import torch
  import torch.distributed as dist
  from calculon.profile.gpt import BlockStack

  cuda = plan['device'] == 'cuda'
  torch.set_num_threads(plan['threads'])
  torch.manual_seed(1234 + rank)
  if cuda:
    torch.cuda.set_device(rank)
  dev = torch.device('cuda', rank) if cuda else torch.device('cpu')
  world = plan['data_par']
  if world > 1:
    dist.init_process_group('nccl' if cuda else 'gloo',
                            init_method='file://' + os.path.join(tmp, 'rdzv'),
                            rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=1800))
  proc = psutil.Process()
  rss_base = proc.memory_info().rss
  dtype = getattr(torch, plan['datatype'])
  model = BlockStack(plan['num_blocks'], hidden=plan['hidden'],
                     feedforward=plan['feedforward'],
                     heads=plan['attn_heads'], head_size=plan['attn_size'],
                     multiquery=plan['multiquery'], dropout=plan['dropout'],
                     recompute=plan['recompute'] if plan['training']
                     else 'none').to(device=dev, dtype=dtype)
  clock = time.process_time if plan['clock'] == 'cpu' else time.perf_counter
  timer = LayerTimer(torch, cuda, clock)
  for block in model.blocks:
    for name, module in block.layer_modules():
      timer.attach(name, module)
    timer.wrap_recompute(block)
    timer.wrap_recompute(block.core)
  training = plan['training']
  opt = torch.optim.Adam(model.parameters(), lr=1e-4) if training else None
  mbs, s, h = plan['microbatch_size'], plan['seq_size'], plan['hidden']
  inputs = [torch.randn(mbs, s, h, device=dev, dtype=dtype,
                        requires_grad=training)
            for _ in range(plan['num_microbatches'])]
  block_params = [[p for p in b.parameters()] for b in model.blocks]
  sync = torch.cuda.synchronize if cuda else (lambda: None)

  def dp_allreduce():
    for params in block_params:
      grads = [p.grad for p in params]
      flat = torch._utils._flatten_dense_tensors(grads)
      dist.all_reduce(flat)
      flat.div_(world)
      for g, f in zip(grads, torch._utils._unflatten_dense_tensors(flat,
                                                                   grads)):
        g.copy_(f)

  phases = {'fw': [], 'bw': [], 'dp_comm': [], 'optim': []}

  def one_step(record):
    t0 = clock()
    fw = bw = 0.0
    for x in inputs:
      timer.in_backward = False
      a = clock()
      if training:
        out = model(x)
        loss = out.float().square().mean()
      else:
        with torch.no_grad():
          out = model(x)
      sync()
      b = clock()
      fw += b - a
      if training:
        timer.in_backward = True
        loss.backward()
        sync()
        bw += clock() - b
      timer.in_backward = False
    c = clock()
    if training and world > 1:
      dp_allreduce()
      sync()
    d = clock()
    if training:
      opt.step()
      opt.zero_grad(set_to_none=True)
      sync()
    e = clock()
    if record:
      for key, value in (('fw', fw), ('bw', bw), ('dp_comm', d - c),
                         ('optim', e - d)):
        phases[key].append(value)
    return e - t0

  def barrier():
    if world > 1:
      dist.barrier()

  for _ in range(plan['warmup']):
    one_step(False)
  if cuda:
    torch.cuda.reset_peak_memory_stats()
    if report_dir and rank == 0:
      torch.cuda.memory._record_memory_history(max_entries=200000)
  barrier()
  timer.active = True
  step_s = []
  for _ in range(plan['steps']):
    barrier()
    timer.new_step()
    step_s.append(one_step(True))
  timer.active = False
  if cuda:
    timer.resolve()
  peak = {'rss_base_bytes': rss_base,
          'rss_peak_bytes': resource.getrusage(
            resource.RUSAGE_SELF).ru_maxrss * 1024}
  if cuda:
    peak['cuda_max_allocated_bytes'] = torch.cuda.max_memory_allocated()
    if report_dir and rank == 0:
      torch.cuda.memory._dump_snapshot(os.path.join(
        report_dir, 'memory_snapshot.pickle'))
      torch.cuda.memory._record_memory_history(enabled=None)

  # Attribution: one step under torch.profiler with per-layer ranges.
  acts = [torch.profiler.ProfilerActivity.CPU]
  if cuda:
    acts.append(torch.profiler.ProfilerActivity.CUDA)
  timer.ranges = True
  with torch.profiler.profile(activities=acts, profile_memory=True,
                              record_shapes=True) as prof:
    one_step(False)
  timer.ranges = False
  layer_mem = {}
  for ev in prof.key_averages():
    name, _, phase = ev.key.rpartition('.')
    if phase in ('fw', 'bw', 'recompute') and name:
      mem = getattr(ev, 'device_memory_usage', 0) if cuda else \
        ev.cpu_memory_usage
      layer_mem[f'{name}.{phase}'] = {'bytes_total': float(mem),
                                      'calls': int(ev.count)}
  averages = prof.key_averages()
  if cuda:
    table_time = _table(averages, ('self_device_time_total',
                                   'self_cuda_time_total'))
    table_mem = _table(averages, ('self_device_memory_usage',
                                  'self_cuda_memory_usage'))
  else:
    table_time = _table(averages, ('self_cpu_time_total',))
    table_mem = _table(averages, ('self_cpu_memory_usage',))
  if report_dir and rank == 0:
    prof.export_chrome_trace(os.path.join(report_dir, 'trace.json'))
  params = {name: sum(p.numel() for p in mod.parameters())
            for name, mod in model.blocks[0].layer_modules()}
  result = {
    'rank': rank, 'step_s': step_s,
    'phases_s': phases,
    'layers': timer.per_step(),
    'memory': peak, 'layer_memory': layer_mem, 'params': params,
    'profiler_time_table': table_time, 'profiler_memory_table': table_mem,
    'threads': torch.get_num_threads(), 'torch': torch.__version__,
  }
  with open(os.path.join(tmp, f'rank{rank}.json'), 'w') as fd:
    json.dump(result, fd)
  if world > 1:
    dist.barrier()
    dist.destroy_process_group()
