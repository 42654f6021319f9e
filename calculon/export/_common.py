"""What every export target shares: the input it reads, the one-line
refusal, and the pipeline split in the framework's terms.

Provides :class:`ExportInput` (a resolved execution with the application
quantities an export reads), :func:`refuse` (the ConfigError an export
raises where the framework cannot express a field) and
:func:`stage_blocks` (the transformer blocks of each virtual pipeline
stage, as calculon prices them).  Reads the resolved
:class:`~calculon.config.Execution` (after its framework preset,
:func:`calculon.frameworks.resolve_execution`) and the
:class:`~calculon.config.Application`.
"""

import dataclasses

from calculon.config import parallel
from calculon.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class ExportInput:
  """One execution to export, resolved against its framework preset.

  Attributes:
    exe: the resolved :class:`~calculon.config.Execution` (every field set,
      the preset's behaviours included).
    app: the :class:`~calculon.config.Application` (num_blocks, seq_size,
      experts...).
    source: where the execution came from (a file name), for messages.
    offloaded_layers: with ``activations_offload`` and
      ``activation_offload_layers`` 'fit': the blocks of the busiest
      pipeline stage whose activations go to the host, as the engine found
      them on the system (``act_offload_blocks``); None when unknown (no
      system given).
    system_name: the system file the execution was priced on, or None.
  """
  exe: object
  app: object
  source: str = '<execution>'
  offloaded_layers: object = None
  system_name: object = None

  def field(self, name):
    """The resolved value of execution field ``name`` (its JSON value)."""
    value = getattr(self.exe, name)
    if name == 'recompute_modules' and isinstance(value, str):
      return value.split(',')
    return value

  @property
  def num_procs(self):
    return int(self.exe.num_procs)

  @property
  def local_batch(self):
    """Samples of one data-parallel replica per step: batch_size / DP."""
    return parallel.local_batch(self.exe.batch_size, self.exe.data_par)

  @property
  def num_microbatches(self):
    """Microbatches of one replica per step: (batch / DP) / microbatch."""
    return parallel.num_microbatches(self.exe.batch_size, self.exe.data_par,
                                     self.exe.microbatch_size)


def refuse(inp, target, name, why):
  """The ConfigError of an execution field ``target`` cannot express.

  Args:
    inp: the :class:`ExportInput`.
    target: the target's name and version ('torchtitan 0.3.0').
    name: the execution field.
    why: what the framework lacks or requires (one clause).

  Returns:
    the ConfigError (the caller raises it).
  """
  from calculon.config._schema import show
  value = inp.field(name) if hasattr(inp.exe, name) else None
  return ConfigError(
    f"{inp.source}: field '{name}' = {show(value)} cannot be exported to "
    f'{target}: {why}', source=inp.source, field=name, value=value,
    allowed=why)


def refuse_mtp(inp, target):
  """The ConfigError of an application with multi-token prediction
  modules (``mtp_layers`` > 0) for a target that trains none; None when
  there are none."""
  depth = inp.app.mtp_layers
  if not depth:
    return None
  why = 'it trains no multi-token prediction module'
  return ConfigError(
    f"{inp.source}: application field 'mtp_layers' = {depth} cannot be "
    f'exported to {target}: {why}', source=inp.source, field='mtp_layers',
    value=depth, allowed=why)


def stage_blocks(inp, target):
  """Transformer blocks of each virtual pipeline stage, in the order the
  frameworks list stages (stage ``k`` is chunk ``k // PP`` of pipeline rank
  ``k % PP``: Megatron-Core PipelineParallelLayerLayout, torchtitan's
  looped stage assignment), as calculon prices the split.

  Calculon's split (:mod:`calculon.llm.terms.schedule`, ``_pipeline_split``):
  L blocks (L + 2 slots with ``pipeline_split_counts_vocab``, the
  embedding and the loss one slot each) over PP ranks, the first
  ``L mod PP`` ranks one block more; each rank's blocks split evenly into
  its ``pipeline_interleaving`` chunks.

  Returns:
    (blocks, counts_vocab): ``blocks`` a list of PP x VP ints (the
    decoder blocks of each stage, the embedding and loss slots already
    taken off the first and last stage), ``counts_vocab`` whether the
    embedding and loss took a slot each.

  Raises:
    ConfigError: a rank's blocks do not split evenly into its chunks
      (calculon prices equal chunks).
  """
  exe = inp.exe
  pp, vp = int(exe.pipeline_par), int(exe.pipeline_interleaving)
  counts_vocab = bool(exe.pipeline_split_counts_vocab) and pp > 1
  slots = inp.app.num_blocks + (2 if counts_vocab else 0)
  base, rem = divmod(slots, pp)
  per_rank = [base + (1 if r < rem else 0) for r in range(pp)]
  if any(n % vp for n in per_rank):
    raise refuse(inp, target, 'pipeline_interleaving',
                 f'the {slots} pipeline slots split over PP {pp} as '
                 f"{sorted(set(per_rank), reverse=True)} per rank, which "
                 f'{vp} chunks do not divide evenly')
  stages = [[per_rank[r] // vp for r in range(pp)] for _ in range(vp)]
  flat = [n for chunk in stages for n in chunk]
  if counts_vocab:
    flat[0] -= 1
    flat[-1] -= 1
  if min(flat) < 0 or (pp > 1 and min(flat) < 1 and not counts_vocab):
    raise refuse(inp, target, 'pipeline_par',
                 f'a pipeline stage would hold no transformer block '
                 f'({inp.app.num_blocks} blocks over {pp * vp} stages)')
  return flat, counts_vocab


def header_lines(inp, target, how):
  """The comment lines every export opens with: what wrote it, for which
  framework release, from which execution, and how to use it."""
  exe = inp.exe
  import calculon
  lines = [
    f'Written by calculon {calculon.__version__} (calculon export) for '
    f'{target}.',
    f'Execution: {inp.source} (framework preset {exe.framework}): '
    f'{exe.num_procs} processors, TP {exe.tensor_par}, PP '
    f'{exe.pipeline_par}, VP {exe.pipeline_interleaving}, DP '
    f'{exe.data_par}, CP {exe.context_par}, EP {exe.expert_par}, ETP '
    f'{exe.expert_tensor_par}; batch {exe.batch_size}, microbatch '
    f'{exe.microbatch_size}, {exe.datatype}.',
  ]
  if inp.system_name:
    lines.append(f'Priced on: {inp.system_name}.')
  lines.extend(how)
  return lines
