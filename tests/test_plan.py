"""calculon plan: a whole training run from the step (calculon.plan).

Numbers asserted come from the cited sources: the Llama 3 405B run (arXiv
2407.21783), its model card's GPU-hours, Young 1974 and Daly 2006.
"""

import copy
import json
import math

import numpy as np
import pytest

from calculon import io
from calculon.config.whole_run import (
  DEFAULT_POWER, DEFAULT_RELIABILITY, LLAMA3_INTERRUPTIONS)
from calculon.hardware import System
from calculon.plan import checkpoint as C
from calculon.plan import objective as O
from calculon.plan import plan as P
from calculon.plan import reliability as R
from calculon.plan import run as RUN
from calculon.plan.framework import checkpoint_saving
from conftest import assert_png, load_json, repo, run_cli

APP_405B = repo('models', 'llama3.1-405B.json')
EXE_405B = repo('examples', 'llama3.1-405b_16384_tp8_pp16_dp128.json')
H100 = repo('systems', 'h100_sxm_80g.json')


def plan_405b(**inputs):
  app = io.load_application(APP_405B)
  system = io.load_system(H100)
  record = P.execution_record(load_json(EXE_405B), EXE_405B)
  # 15.6T tokens: the Llama 3.1 model card (meta-llama/llama-models
  # models/llama3_1/MODEL_CARD.md) and arXiv 2407.21783 section 3.1.
  run_in = RUN.run_inputs(system, 15.6e12, **inputs)
  return P.plan_execution(app, system, record, run_in).rows[0]


def test_llama3_405b_goodput_and_gpu_hours():
  """The paper's layout (arXiv 2407.21783 Table 4: TP 8, PP 16, DP 128 on
  16,384 H100s, 2,048 sequences of 8,192 tokens, BF16) for 15.6T tokens:
  the paper reports more than 90 % effective training time (section
  3.3.4); the model card 30.84M GPU-hours of training."""
  row = plan_405b()
  run = row.run
  assert row.status == 'ok'
  assert run['gpus'] == 16384 and run['batch'] == 2048
  assert run['steps'] == pytest.approx(15.6e12 / (2048 * 8192))
  assert 0.85 <= run['goodput'] <= 0.95, run['goodput']
  assert abs(run['gpu_hours'] / 30.84e6 - 1) <= 0.25, run['gpu_hours']
  # The interruptions the defaults imply for this job are the paper's:
  # 419 unplanned in 54 days (Table 5), one every 3.09 hours.
  assert run['mtbi_s'] == pytest.approx(54 * 86400 / 419, rel=1e-9)
  assert run['interruptions_per_day'] == pytest.approx(419 / 54, rel=1e-9)
  # The checkpoint: 14 bytes per parameter (16-bit weights, fp32 master
  # weights and two Adam moments), 405.85e9 parameters (the model card's
  # 405B; Hugging Face lists 405,853,388,800); 347 MB per GPU, within the
  # paper's "1 MB to 4 GB per GPU" (section 3.3.1).
  assert run['checkpoint_bytes'] == pytest.approx(14 * 405.85e9, rel=0.002)
  per_gpu = run['checkpoint_write_rank_bytes']
  assert 1e6 <= per_gpu <= 4e9
  # Written at the Tectonic file system's sustained 2 TB/s (section 3.3.1).
  assert run['checkpoint_stall_s'] == pytest.approx(
    run['checkpoint_bytes'] / 2e12, rel=0.01)
  # Energy: below the GPUs at their 700 W rating for the whole wall time
  # times the PUE (what model cards count), above idle.
  tdp_mwh = 16384 * 700 * run['wall_s'] * 1.1 / 3.6e9
  assert 0.3 * tdp_mwh < run['gpu_energy_mwh'] * 1.1 < tdp_mwh
  assert DEFAULT_POWER.gpu_idle_w < run['gpu_power_w'] < 700


def test_young_and_daly_against_hand_computation():
  # Checkpoint 60 s, an interruption every hour, restart 10 minutes.
  delta, m, r = 60.0, 3600.0, 600.0
  # Young 1974: sqrt(2 x 60 x 3600) = 657.27 s.
  assert R.young_interval_s(delta, m) == pytest.approx(657.2670690, rel=1e-9)
  # Daly 2006, first order: sqrt(2 x 60 x (600 + 3600)) = 709.93 s.
  assert R.daly_first_order_s(delta, m, r) == pytest.approx(709.9295739,
                                                            rel=1e-9)
  # Daly's higher order: 657.27 x (1 + sqrt(1/120)/3 + 1/1080) - 60.
  x = 60 / 7200
  hand = math.sqrt(2 * 60 * 3600) * (1 + math.sqrt(x) / 3 + x / 9) - 60
  assert R.daly_higher_order_s(delta, m) == pytest.approx(hand, rel=1e-12)
  # The complete model's wall time per second of work at tau = 600 s:
  # M e^(R/M) (e^((tau + delta)/M) - 1) / tau.
  by_hand = 3600 * math.exp(600 / 3600) * (math.exp(660 / 3600) - 1) / 600
  assert R.wall_factor(600.0, delta, m, r) == pytest.approx(by_hand,
                                                            rel=1e-12)
  # The exact optimum minimizes it (brute force on a 0.1 s grid) and lies
  # within 0.5 % of Daly's higher-order estimate.
  tau = R.optimal_interval_s(delta, m)
  grid = np.arange(100.0, 2000.0, 0.1)
  assert tau == pytest.approx(grid[np.argmin(R.wall_factor(
    grid, delta, m, r))], abs=0.1)
  assert tau == pytest.approx(hand, rel=0.005)
  # (1 - x) e^(x + delta/M) = 1 at the optimum.
  assert (1 - tau / m) * math.exp(tau / m + delta / m) == pytest.approx(1.0)


def test_interval_is_whole_steps_and_at_least_the_persist_time():
  steps, tau, _ = R.interval_steps(7.0, 3.0, 11000.0, 600.0)
  assert steps == round(steps) and tau == pytest.approx(steps * 7.0)
  young = math.sqrt(2 * 3.0 * 11000.0)
  assert abs(tau - young) < 20
  steps, tau, _ = R.interval_steps(7.0, 0.01, 11000.0, 600.0, 100.0)
  assert steps == 15 and tau == 105.0


def test_job_rate_grows_with_the_gpus():
  rel = DEFAULT_RELIABILITY
  # 419 unplanned interruptions / (54 days x 24 h x 16,384 GPUs).
  assert rel.unplanned_per_gpu_hour == pytest.approx(
    419 / (54 * 24 * 16384), rel=1e-12)
  assert sum(LLAMA3_INTERRUPTIONS.values()) == 419
  one, planned = RUN.job_rates_per_s(rel, 1024)
  sixteen, _ = RUN.job_rates_per_s(rel, 16384)
  assert sixteen == pytest.approx(16 * one)       # MTTF ~ 1/N (Kokolis)
  half = dict(interruptions_per_gpu_hour={'gpu': 1e-5}, planned_per_gpu_hour=0,
              job_size_exponent=0.5, reference_gpus=1024, restart_s=0)
  from calculon.config.whole_run import ReliabilityConfig
  assert RUN.job_rates_per_s(ReliabilityConfig(**half), 4096)[0] == \
    pytest.approx(1e-5 * 1024 * 2 / 3600)


def test_checkpoint_policies():
  storage = RUN.run_inputs(io.load_system(H100), 1.0).storage
  kw = dict(num_parameters=1e9, weight_bytes=2e9, optimizer_bytes=12e9 / 64,
            gpus=64, replicas=64, storage=storage, gpus_per_node=8,
            host_bytes_per_s=50e9, network_bytes_per_s=40e9)
  blocking = C.checkpoint_cost(policy=checkpoint_saving(None), **kw)
  assert float(blocking.size_bytes) == 14e9
  assert float(blocking.write_rank_bytes) == pytest.approx(14e9 / 64)
  assert float(blocking.persist_s) == 0
  # NeMo 2's MegatronStrategy saves asynchronously (ckpt_async_save).
  asynchronous = C.checkpoint_cost(
    policy=checkpoint_saving('megatron-core-2025'), **kw)
  assert float(asynchronous.stall_s) < float(blocking.stall_s)
  assert float(asynchronous.persist_s) == pytest.approx(
    float(blocking.write_s))
  # DeepSpeed: data-parallel rank 0 writes the whole weights it holds.
  deepspeed = C.checkpoint_cost(policy=checkpoint_saving('deepspeed-zero'),
                                **kw)
  assert float(deepspeed.write_rank_bytes) == pytest.approx(2e9 + 12e9 / 64)
  assert float(deepspeed.stall_s) > float(blocking.stall_s)
  # Every rank reads all it holds on a restart: 64 replicas of 2 GB.
  assert float(blocking.load_s) >= 64 * (2e9 + 12e9 / 64) / 2000e9


def test_async_saving_shortens_the_stall_and_the_run():
  blocking = plan_405b().run
  asynchronous = plan_405b(framework='megatron-core-2025').run
  assert asynchronous['checkpoint_stall_s'] < 0.1 * \
    blocking['checkpoint_stall_s']
  assert asynchronous['goodput'] > blocking['goodput']


def test_objectives_can_pick_other_executions():
  """Llama 2 7B on 128 H100s, batch 256, on a file system sustaining 5
  GB/s and an interruption rate of 3e-3 per GPU-hour (one every 2.6 hours
  for the job).  The fastest step shards the optimizer and the gradients
  (ZeRO-2, one microbatch of 2): every rank holds the whole 16-bit
  weights, 13.6 GB with its optimizer shard, and a restart reads every
  rank's state back: 128 x 13.6 GB at 5 GB/s, about 350 s.  Fully sharded
  data parallelism holds 1/128 of everything (about 40 s to load) for a
  step about 1.2 % slower: with a restart every 2.6 hours the shorter
  loads win, so the shortest run, and the cheapest at a price per
  GPU-hour, is not the fastest step."""
  app = io.load_application(repo('models', 'llama2-7B.json'))
  cfg = copy.deepcopy(load_json(H100))
  cfg['storage'] = {'read_GBps': 5, 'write_GBps': 5}
  cfg['reliability'] = {'interruptions_per_gpu_hour': {'gpu': 3e-3}}
  cfg['mem2']['GiB'] = 0           # no host offload: a smaller space
  system = System(cfg, 'test system')
  from calculon.llm import search as S
  spec = S.SearchSpec(app, system, 128, 256, 'bfloat16',
                      allow_tp_overlap=False)
  inputs = RUN.run_inputs(system, 1e12, price_gpu_hour=2.5)
  best = {}
  for objective in ('throughput', 'time-to-train', 'cost'):
    result = O.rank(spec, objective, 1, 1, inputs=inputs, exact_batch=256)
    assert result.proven
    best[objective] = result.best[0]
  fast, short, cheap = (best[o] for o in ('throughput', 'time-to-train',
                                          'cost'))
  from calculon.config import Execution
  from calculon.frameworks import resolve_execution

  def sharding(rec):
    return resolve_execution(app, Execution.from_dict(rec))[0]\
      .data_par_sharding
  assert sharding(fast.record) in ('optimizer', 'gradients')
  assert sharding(short.record) == 'parameters'
  assert cheap.record == short.record
  assert fast.run['step_s'] < short.run['step_s']
  assert short.run['wall_s'] < fast.run['wall_s']
  assert short.run['checkpoint_load_s'] < 0.2 * fast.run['checkpoint_load_s']
  assert cheap.run['cost_usd'] < fast.run['cost_usd']


def test_objective_bounds_hold_for_every_priced_execution():
  """The re-ranking is exact only if no execution's objective is below the
  bound of its sample rate: check it on the 64 fastest of a search."""
  app = io.load_application(repo('models', 'llama2-7B.json'))
  cfg = copy.deepcopy(load_json(H100))
  cfg['mem2']['GiB'] = 0
  system = System(cfg, 'test system')
  from calculon.llm import search as S
  spec = S.SearchSpec(app, system, 32, 128, 'bfloat16',
                      allow_tp_overlap=False)
  inputs = RUN.run_inputs(system, 1e12, price_gpu_hour=2.0, price_kwh=0.1)
  result = S.optimal_executions(spec, 64, 1)
  records = [S.execution_record(spec, result.groups[gi], flat)
             for _, gi, flat in result.best]
  terms = RUN.price_runs(app, system, records, inputs)
  per_token = float(terms['model_flops_per_token'][0])
  for objective in O.OBJECTIVES:
    values = O.objective_values(terms, objective, inputs)
    for (rate, _, _), value in zip(result.best, values):
      bound = O.objective_bound(objective, rate, spec, inputs, per_token)
      assert bound <= value * (1 + 1e-9), (objective, bound, value)


def test_system_sections_are_read_and_checked(tmp_path):
  cfg = load_json(H100)
  system = System(cfg, 'h100')
  assert system.power.gpu_busy_w == 700 and system.reliability is None
  cfg = copy.deepcopy(cfg)
  cfg['reliability'] = {'restart_s': 120, 'source': 'measured'}
  cfg['storage'] = {'write_GBps': 100}
  assert System(cfg).reliability.restart_s == 120
  assert System(cfg).storage.read_GBps == 2000       # the default
  from calculon.errors import ConfigError
  for section, field, value, allowed in (
      ('reliability', 'restart_s', -1, '>= 0'),
      ('storage', 'write_GBps', 0, '> 0'),
      ('power', 'pue', 0.9, '>= 1'),
      ('power', 'gpu_idle_w', 800, 'at most gpu_busy_w'),
      ('power', 'gpus', 8, 'unknown field')):
    bad = copy.deepcopy(cfg)
    bad.setdefault(section, {})[field] = value
    with pytest.raises(ConfigError) as err:
      System(bad, 'sys.json')
    text = str(err.value)
    assert text.startswith('sys.json: ') and allowed in text, text
    assert f'{section}.{field}' in text and '\n' not in text


# -- the command line ------------------------------------------------------

def test_plan_cli_with_the_paper_layout(tmp_path):
  out, csv, png = (tmp_path / 'plan.json', tmp_path / 'plan.csv',
                   tmp_path / 'plan.png')
  res = run_cli('plan', APP_405B, H100, '--tokens', '15.6T', '--execution',
                EXE_405B, '--price', '2.5', '-o', out, '--plot', png)
  assert res.returncode == 0, res.stderr
  assert 'goodput' in res.stdout and '16384*' in res.stdout
  doc = json.loads(out.read_text())
  run = doc['plans'][0]['run']
  assert 0.85 <= run['goodput'] <= 0.95
  assert run['cost_usd'] == pytest.approx(2.5 * run['gpu_hours'])
  assert doc['inputs']['reliability']['restart_s'] == 600
  assert set(doc['terms']) <= set(run) | {'feasible'}
  assert_png(png, min_bytes=5000)
  res = run_cli('plan', APP_405B, H100, '--tokens', '15.6e12', '--execution',
                EXE_405B, '-o', csv, '--set', 'reliability.restart_s=300')
  assert res.returncode == 0, res.stderr
  import pandas as pd
  frame = pd.read_csv(csv)
  assert frame['restart_s'][0] < run['restart_s'] - 250
  assert frame['exe_tensor_par'][0] == 8


def test_plan_cli_searches_each_gpu_count(tmp_path):
  out = tmp_path / 'plan.json'
  res = run_cli('plan', repo('models', 'megatron-126M.json'),
                repo('systems', 'a100_sxm_80g.json'), '--tokens', '1B',
                '--gpus', '8,16', '--batch', '64', '--objective',
                'time-to-train', '-c', '1', '-o', out)
  assert res.returncode == 0, res.stderr
  plans = json.loads(out.read_text())['plans']
  assert [p['gpus'] for p in plans] == [8, 16]
  for p in plans:
    assert p['status'] == 'ok' and p['execution']['batch_size'] == 64
    assert p['proven']
  assert sum(p['best'] for p in plans) == 1


@pytest.mark.parametrize('args,fragment', [
  (['--tokens', '0'], "--tokens '0' is not allowed: a positive number"),
  (['--tokens', 'lots'], "--tokens 'lots' is not allowed"),
  (['--tokens', '1e12', '--gpus', '0', '--batch', '8'],
   "--gpus '0' is not allowed: an integer >= 1"),
  (['--tokens', '1e12', '--gpus', '8,x', '--batch', '8'], "--gpus 'x'"),
  (['--tokens', '1e12', '--gpus', '8', '--batch', '-3'], "--batch '-3'"),
  (['--tokens', '1e12', '--gpus', '8', '--batch', '8', '--price', '0'],
   "--price '0' is not allowed: a positive number"),
  (['--tokens', '1e12', '--gpus', '8', '--batch', '8', '--price', 'nan'],
   "--price 'nan'"),
  (['--tokens', '1e12', '--gpus', '8', '--batch', '8', '--energy-price',
    '-1'], "--energy-price '-1'"),
  (['--tokens', '1e12', '--gpus', '7', '--batch', '5'],
   '--batch 5 is not allowed for 7 GPUs: no data-parallel degree'),
  (['--tokens', '1e12', '--gpus', '8', '--batch', '8', '--set',
    'reliability.restart_s=-1'], "'reliability.restart_s' = -1"),
  (['--tokens', '1e12', '--gpus', '8', '--batch', '8', '--set',
    'reliability.interruptions_per_gpu_hour.gpu=-2'],
   "'reliability.interruptions_per_gpu_hour.gpu' = -2"),
  (['--tokens', '1e12', '--gpus', '8', '--batch', '8', '--framework',
    'nosuch'], "framework 'nosuch' is not allowed: one of"),
  (['--tokens', '1e12'], '--gpus and --batch: required without --execution'),
  (['--tokens', '1e12', '--gpus', '8', '--batch', '8', '--price', '2',
    '--node-price', '16'], '--price and --node-price: give one of them'),
  (['--tokens', '1e12', '--gpus', '8', '--batch', '8',
    '--background-slowdown', '1'], "--background-slowdown '1'"),
])
def test_bad_input_one_line_exit_2(tmp_path, args, fragment):
  out = tmp_path / 'plan.json'
  res = run_cli('plan', repo('models', 'megatron-126M.json'),
                repo('systems', 'a100_sxm_80g.json'), *args, '-o', out)
  assert res.returncode == 2, res.stdout + res.stderr
  lines = res.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith('calculon: error: '), lines
  assert fragment in lines[0], lines[0]
  assert not out.exists() and res.stdout == ''


def test_bad_outputs_fail_before_work(tmp_path):
  for option, path in (('-o', tmp_path / 'no' / 'plan.json'),
                       ('-o', tmp_path / 'plan.txt'),
                       ('--plot', tmp_path / 'no' / 'p.png')):
    res = run_cli('plan', APP_405B, H100, '--tokens', '1T', '--gpus', '1024',
                  '--batch', '2048', option, path)
    assert res.returncode == 2 and res.stdout == ''
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_optimal_execution_objective_through_the_cli(tmp_path):
  """llm-optimal-execution --objective: the best entry carries its
  objective and whole run; the ranking is proven by the bound."""
  out = tmp_path / 'best.json'
  res = run_cli('llm-optimal-execution', repo('models', 'llama2-7B.json'),
                8, 32, 'bfloat16', H100, out, '-q', '-t', '2',
                '--objective', 'time-to-train')
  assert res.returncode == 0, res.stderr
  assert 'proven' in res.stdout
  best = load_json(out)
  assert best['0']['objective']['name'] == 'time-to-train'
  assert best['0']['objective']['unit'] == 's'
  assert 0.5 < best['0']['whole_run']['goodput'] <= 1
  assert best['0']['objective']['value'] <= best['1']['objective']['value']


def test_the_plan_table_options_name_offloads_and_degrees():
  """The options column says what a row offloads (issue 45: the searched
  best moved its optimizer to the host and the table never said so)."""
  from calculon.plan.report import _options
  exe = {'microbatch_size': 2, 'pipeline_interleaving': 1,
         'activation_recompute': 'none', 'data_par_sharding': 'gradients',
         'context_par': 2, 'expert_par': 1, 'weight_offload': False,
         'activations_offload': True, 'optimizer_offload': True}
  assert _options(exe) == 'mbs2 vp1 ' + _options(exe).split()[2] + \
    ' zero2 cp2 offload:activations+optimizer'
  plain = dict(exe, context_par=1, activations_offload=False,
               optimizer_offload=False)
  assert 'offload' not in _options(plain) and 'cp' not in _options(plain)
