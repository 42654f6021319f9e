"""How a training framework saves and loads checkpoints: the one place the
whole-run model reads a framework.

:func:`checkpoint_saving` maps a framework preset (``frameworks/``,
``--framework``) to a :class:`CheckpointPolicy`: what its ``run`` section
says of checkpoints, with its source.  Nothing else in :mod:`calculon.plan`
knows a framework.
"""

from dataclasses import dataclass

from calculon.errors import ConfigError


@dataclass(frozen=True)
class CheckpointPolicy:
  """What a framework does when it saves and loads a checkpoint.

  Attributes:
    mode: 'blocking' (training waits until the checkpoint is written) or
      'async' (training waits only for the copy of its state to host
      memory; the write to storage runs in the background and the
      checkpoint counts once it is complete).
    parallel_save: the replicated state (weights under data parallelism,
      an unsharded optimizer) is written once, its shards spread over
      every rank (True), or each replica group's first rank writes what it
      holds (False).
    parallel_load: on a restart every rank reads a disjoint share of the
      checkpoint and the replicas exchange it over the network (True), or
      every rank reads all the state it holds from storage (False).
    background_slowdown: fraction of the training throughput lost while
      an asynchronous save persists in the background, [0, 1) (0: not
      measured in a primary source).
    source: where the policy comes from.
  """
  mode: str = 'blocking'
  parallel_save: bool = True
  parallel_load: bool = False
  background_slowdown: float = 0.0
  source: str = ''


def framework_names():
  """Names :func:`checkpoint_saving` knows: the framework presets."""
  from calculon import frameworks
  return frameworks.names()


def _policy_of(name):
  """The checkpoint policy the preset ``name`` states (its ``run``
  section's ``checkpoint``), else Megatron-LM's defaults."""
  from calculon import frameworks
  preset = frameworks.load(name, source='--framework')
  facts = dict(preset.run.get('checkpoint') or {})
  if not facts:
    return CheckpointPolicy(source=f'{name}: no checkpoint facts in its '
                            'preset, the defaults')
  keys = ('mode', 'parallel_save', 'parallel_load', 'background_slowdown',
          'source')
  return CheckpointPolicy(**{k: facts[k] for k in keys if k in facts})


def checkpoint_saving(framework=None, *, mode=None, background_slowdown=None):
  """The checkpoint policy of a framework.

  Args:
    framework: a framework preset's name (or path), or None for the
      recommended preset's.
    mode: 'async' or 'blocking' to override the framework's saving mode.
    background_slowdown: a measured fraction [0, 1) of the throughput lost
      while an asynchronous save persists, overriding the framework's.

  Returns:
    :class:`CheckpointPolicy`.

  Raises:
    ConfigError: an unknown framework or mode, a slowdown outside [0, 1)
      (one line).
  """
  from calculon import frameworks
  name = frameworks.RECOMMENDED if framework is None else \
    str(framework).strip()
  policy = _policy_of(name)
  if mode is not None:
    if mode not in ('async', 'blocking'):
      raise ConfigError(f"checkpoint mode {mode!r} is not allowed: 'async' "
                        "or 'blocking'", field='checkpoint_mode', value=mode)
    policy = CheckpointPolicy(mode, policy.parallel_save,
                              policy.parallel_load,
                              policy.background_slowdown,
                              policy.source + f'; mode {mode} given')
  if background_slowdown is not None:
    ok = isinstance(background_slowdown, (int, float)) and \
      0 <= background_slowdown < 1
    if not ok:
      raise ConfigError(f'--background-slowdown {background_slowdown!r} is '
                        'not allowed: a number >= 0 and < 1',
                        field='background_slowdown',
                        value=background_slowdown)
    policy = CheckpointPolicy(policy.mode, policy.parallel_save,
                              policy.parallel_load,
                              float(background_slowdown),
                              policy.source + '; background slowdown '
                              f'{background_slowdown:g} given')
  return policy
