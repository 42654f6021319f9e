"""The branch and bound's bounds are bounds (calculon.llm.prune).

On random cells of the modern search space, built as the search builds
them (:mod:`calculon.llm.search`: the groups, their reduced grids, the
columns), the level-1 bound :func:`~calculon.llm.prune.rate_bound` of a
group's reduced grid is never below the sample rate of an execution it
covers, and the level-2 bound :func:`~calculon.llm.prune.reduced_bound`
of a cell never below the sample rate of any of the cell's inner
combinations (DP overlap, the three offloads), up to the search's relative
margin :data:`~calculon.llm.prune.PRUNE_MARGIN`.  Sample rates are priced
by fresh Evaluations; the level-2 Evaluation reuses the level-1 totals as
the search does (:meth:`Evaluation.reusing_totals
<calculon.llm.terms.blocks.BlockTerms.reusing_totals>`), and so does a
second pricing that must agree with the fresh one.

Covered: dense and MoE models, two systems with tier-2 memory (every
offload varies) and one with the host overheads of a calibrated file
(the host concern), 16-bit and FP8 datatypes, every axis of the modern
space.  A new time term the bound does not account for (a concern's
block term missing from its batch terms, a bubble computed otherwise)
fails here.

The examples are derandomized (the same in every run, so CI is stable;
~10 s on 2 cores).  A deeper, random run:

    CALCULON_BOUND_EXAMPLES=1000 CALCULON_BOUND_RANDOM=1 \\
      python -m pytest -q tests/test_bound.py
"""

import functools
import os

import numpy as np
from hypothesis import HealthCheck, given, settings, strategies as st

from calculon import System
from calculon.config import Application
from calculon.llm import prune as P
from calculon.llm import search as S
from calculon.llm.model import (
  Evaluation, INTERLEAVING_NOT_FACTOR, INTERLEAVING_TOO_LARGE,
  NETWORK_NOT_FILLED, NETWORK_TOO_SMALL, NON_FINITE, OK)
from conftest import load_json, repo

MODELS = ('llama3-8B', 'llama2-7B', 'qwen3-30B-A3B', 'mixtral-8x7B')
#: Two datasheet systems with tier-2 memory; the calibrated H100 (the
#: default file) adds the host overheads (per microbatch and per MoE
#: block).
SYSTEMS = ('h100_sxm_80g_datasheet', 'gb200_nvl72_datasheet',
           'h100_sxm_80g')
PROCS = (8, 16, 32, 64, 128, 256)
#: Presets: every option and level ('common'), and two that set behaviours
#: conditioned on the options (precision, sharding, TP overlap).
FRAMEWORKS = ('common', 'megatron-core', 'torchtitan')
BATCHES = (16, 64, 256, 1024)
#: Random cells of a group's grid per example (each priced over every
#: inner combination).
CELLS = 64
#: Infeasible before pricing whatever the inner options (the level-2 bound
#: is -inf there).
STRUCTURAL = (NETWORK_TOO_SMALL, NETWORK_NOT_FILLED, INTERLEAVING_TOO_LARGE,
              INTERLEAVING_NOT_FACTOR)
BOUND = settings(
  max_examples=int(os.environ.get('CALCULON_BOUND_EXAMPLES', '60')),
  deadline=None, database=None,
  derandomize=not os.environ.get('CALCULON_BOUND_RANDOM'),
  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@functools.lru_cache(maxsize=None)
def _app(name):
  return Application.from_dict(load_json(repo('models', f'{name}.json')))


@functools.lru_cache(maxsize=None)
def _system(name):
  return System(load_json(repo('systems', f'{name}.json')))


@functools.lru_cache(maxsize=None)
def _groups(model, system, procs, batch, datatype, framework='common'):
  spec = S.SearchSpec(app=_app(model), system=_system(system),
                      num_procs=procs, max_batch_size=batch,
                      datatype=datatype, framework=framework)
  return spec, [g for g in S.groups(spec) if g.size]


def _rate_reason(ev, n):
  with np.errstate(all='ignore'):
    rate = np.broadcast_to(ev.sample_rate, (n,)).astype(float)
    reason = np.broadcast_to(ev.reason, (n,))
  return rate, reason


def check_bounds(spec, group, seed):
  """Checks both bounds on ``CELLS`` random cells of ``group``; returns
  how many priced executions the check covered."""
  axes = group.axes
  naxes = len(axes)
  inner = [axes.index(a) for a in P.INNER_AXES]
  reduced = S.reduced_group(group)
  # Level 1, on the whole reduced grid as the search computes it.
  base = S.columns(spec, S.Chunk(reduced, ()))
  with np.errstate(all='ignore'):
    ev1 = Evaluation(spec.app, spec.system, base)
    l1 = np.broadcast_to(P.rate_bound(ev1), reduced.shape)
  # Random cells of the full grid (the inner axes' index is ignored) and
  # every inner combination of each, priced afresh.
  rng = np.random.default_rng(seed)
  cells = rng.integers(0, group.shape, size=(CELLS, naxes))
  full = P.expand(cells, group, axes)
  cols = P.flat_columns(spec, group, full)
  n = len(full)
  with np.errstate(all='ignore'):
    rate, reason = _rate_reason(Evaluation(spec.app, spec.system, cols), n)
  # Where the bound matters: enumerated executions the engine prices
  # (infeasible for memory included: memory changes no time).
  covered = np.broadcast_to(S.valid_mask(cols, spec), (n,)) & np.isfinite(rate) \
    & ~np.isin(reason, STRUCTURAL)
  at = full.copy()
  at[:, inner] = 0
  bound1 = l1[tuple(at.T)]
  bad = covered & (rate > bound1 * (1 + P.PRUNE_MARGIN))
  assert not bad.any(), (
    'level-1 bound below a sample rate', group.tp, group.pp, group.cp,
    {a: group.values[a][i] for a, i in zip(axes, full[np.argmax(bad)])},
    rate[bad][:3], bound1[bad][:3])
  # Level 2, on the cells with the inner axes cut, reusing the level-1
  # totals as the search does.
  red = cells.copy()
  red[:, inner] = 0
  rcols = P.flat_columns(spec, reduced, red)
  with np.errstate(all='ignore'):
    ev2 = Evaluation.reusing_totals(ev1, rcols, list(red.T))
    l2 = np.broadcast_to(P.reduced_bound(
      ev2, len(group.values['data_par_overlap']) > 1), (CELLS,))
  combos = n // CELLS
  bound2 = np.repeat(l2, combos)
  bad = covered & (rate > bound2 * (1 + P.PRUNE_MARGIN))
  assert not bad.any(), (
    'level-2 bound below a sample rate', group.tp, group.pp, group.cp,
    {a: group.values[a][i] for a, i in zip(axes, full[np.argmax(bad)])},
    rate[bad][:3], bound2[bad][:3])
  # A structurally infeasible cell (bound -inf) has no feasible inner
  # combination.
  assert not (np.isneginf(bound2) & (reason == OK)).any()
  # Pricing with the level-1 totals (as the search prices the survivors)
  # gives the fresh rates.
  again, why, _ = P.price_flat(spec, cols, None, ev1, list(full.T))
  same = np.isfinite(rate)
  np.testing.assert_array_equal(again[same], rate[same])
  np.testing.assert_array_equal(why, np.where(
    (reason == OK) & ~np.isfinite(rate), NON_FINITE, reason))
  return int(covered.sum())


@BOUND
@given(model=st.sampled_from(MODELS), system=st.sampled_from(SYSTEMS),
       procs=st.sampled_from(PROCS), batch=st.sampled_from(BATCHES),
       datatype=st.sampled_from(('bfloat16', 'float8')),
       framework=st.sampled_from(FRAMEWORKS), data=st.data())
def test_bounds_never_below_a_priced_rate(model, system, procs, batch,
                                          datatype, framework, data):
  spec, groups = _groups(model, system, procs, batch, datatype, framework)
  if not groups:
    return
  group = data.draw(st.sampled_from(groups), label='group')
  seed = data.draw(st.integers(0, 2 ** 32 - 1), label='seed')
  check_bounds(spec, group, seed)


def test_bounds_on_every_concern():
  """Fixed cells of two groups where every concern the engine sums has
  terms (the host optimizer step, the CP ring, FSDP, the vocabulary,
  expert parallelism, the host overheads), so each is covered whatever
  hypothesis draws."""
  assert [c.name for c in Evaluation.CONCERNS] == [
    'pipeline schedule', 'host optimizer step', 'context parallelism', 'fsdp', 'vocabulary', 'expert parallelism',
    'host overheads']
  spec, groups = _groups('qwen3-30B-A3B', 'h100_sxm_80g', 64,
                         256, 'bfloat16')
  picked = [g for g in groups if g.cp > 1 and g.pp > 1][:1] + \
    [g for g in groups if g.cp == 1 and g.tp > 1 and g.pp > 1][:1]
  assert len(picked) == 2
  for i, g in enumerate(picked):
    assert len(g.values['data_par_sharding']) == len(S.SHARDING_ORDER)
    assert len(g.values['expert_par']) > 1
    assert True in list(g.values['optimizer_offload'])
    assert check_bounds(spec, g, i) > 0


def test_level_one_extra_is_below_the_summed_extra():
  """The level-1 bound reduces the concerns' block terms one by one over
  the axes the block's compute does not depend on (never building the
  grid of all their axes: DeepSeek-V3's search, benchmarks/search.py (f),
  25.5 s -> 14.5 s): the sum of the terms' minima is at most the minimum
  of their sum, which the bound took before, so it stays a bound; on a
  MoE group with CP, FSDP and EP terms over different axes it is never
  above that minimum and, the terms' minima falling on the same options,
  as tight (1.000 of it in every group sampled)."""
  from calculon.search.bound import _smallest_extra
  spec, groups = _groups('qwen3-30B-A3B', 'h100_sxm_80g', 64, 256,
                         'bfloat16')
  picked = [g for g in groups if g.cp > 1 and g.pp > 1][:1] + \
    [g for g in groups if g.cp == 1 and g.tp > 1 and g.pp > 1][:1]
  assert len(picked) == 2
  for g in picked:
    with np.errstate(all='ignore'):
      ev = Evaluation(spec.app, spec.system,
                      S.columns(spec, S.Chunk(S.reduced_group(g), ())))
      b = ev.block
      core = np.shape(b.fw_time + b.re_time + b.agrad_time)
      summed = np.asarray(ev.block_fw_extra_s + ev.block_bw_extra_s)
      shape = (1,) * (summed.ndim - len(core)) + core
      free = tuple(i for i in range(summed.ndim)
                   if summed.shape[i] > 1 and shape[i] == 1)
      exact = summed.min(axis=free, keepdims=True) if free else summed
      lower = np.broadcast_to(_smallest_extra(ev, core), exact.shape)
    assert np.all(lower <= exact * (1 + 1e-12) + 1e-15)
    assert np.any(exact > 0)
    ratio = lower[exact > 0] / exact[exact > 0]
    assert np.median(ratio) > 0.99


def test_bounds_over_every_pipeline_schedule():
  """Every schedule of the schedule table (calculon/llm/terms/schedules.py)
  on the grids of groups with PP > 1 (a dense and a MoE model; the
  schedule axis widened to all of them, whatever a preset ships): the
  level-1 bound, with each schedule's bubble of the blocks' lower bounds
  and their exact weight-gradient time, and the level-2 bound stay above
  every priced rate."""
  import dataclasses
  from calculon.config.registry import PIPELINE_SCHEDULE_NAMES
  from calculon.config.execution import UNSET
  codes = [UNSET] + list(range(len(PIPELINE_SCHEDULE_NAMES)))
  checked = 0
  for model, procs, batch in (('llama3-8B', 64, 256),
                              ('qwen3-30B-A3B', 64, 256)):
    # 'common' allows every option (torchtitan ships neither ZB-H1 nor
    # DualPipe).
    spec, groups = _groups(model, 'h100_sxm_80g', procs, batch, 'bfloat16',
                           'common')
    picked = [g for g in groups if g.pp in (2, 4)][:3]
    assert picked
    for i, g in enumerate(picked):
      values = dict(g.values, pipeline_schedule=codes,
                    pipeline_interleaving=[1, 2])
      wide = dataclasses.replace(g, values=values)
      for seed in range(3):
        checked += check_bounds(spec, wide, 100 + 3 * i + seed)
  assert checked > 0


def test_bounds_with_uneven_stages():
  """A layout (4 blocks on the first and the last rank of Llama 3 8B's
  32, the two middle ranks 12 each: PP 4, where PP 2 would leave 24
  blocks to no rank and is refused) over every schedule: the level-1
  bound keeps the bubble of the other ranks' stages and bounds the end
  stages' vocabulary term by 0."""
  import dataclasses
  from calculon.config.registry import PIPELINE_SCHEDULE_NAMES
  from calculon.config.execution import UNSET
  codes = [UNSET] + list(range(len(PIPELINE_SCHEDULE_NAMES)))
  spec = S.SearchSpec(app=_app('llama3-8B'), system=_system('h100_sxm_80g'),
                      num_procs=64, max_batch_size=256, datatype='bfloat16',
                      framework='common',
                      fields={'pipeline_first_stage_blocks': 4,
                              'pipeline_last_stage_blocks': 4})
  checked = 0
  for g in [g for g in S.groups(spec) if g.size and g.pp == 4][:4]:
    values = dict(g.values, pipeline_schedule=codes,
                  pipeline_interleaving=[1, 2])
    wide = dataclasses.replace(g, values=values)
    for seed in range(3):
      checked += check_bounds(spec, wide, 200 + seed)
  assert checked > 0
