"""The bundled examples price, and their reports add up (issue 45).

Every execution in ``examples/`` is priced on its application and a
bundled system: its ``time_breakdown`` sums to its ``total_time`` (the
batch time term by term, host optimizer step included), every term but
the vocabulary's net one is >= 0, and the one memory figure of a feasible run -- what the busiest
stage's GPU needs -- is within what it may fill (the usable tier 1:
capacity less the system's headroom and runtime memory)."""

import glob
import os

import pytest

from calculon import System
from calculon.llm import Llm
from calculon.report import (
  COMPUTE_BOUND_OVERHEADS, COMPUTE_TERMS, RunData, binding, text_report)
from conftest import load_json, repo, run_cli

#: example execution -> (application, system) it is priced on.
EXAMPLES = {
  '3072_t4_p64_d12_mbs4_full.json': ('megatron-1T.json', 'a100_80g.json'),
  'llama3.1-405b_16384_tp8_pp16_dp128.json': ('llama3.1-405B.json',
                                              'h100_sxm_80g.json'),
  'llama3-70B_512xh100.json': ('llama3-70B.json', 'h100_sxm_80g.json'),
  'llama3-70B_512xh100_tp4_pp2_dp64.json': ('llama3-70B.json',
                                            'h100_sxm_80g.json'),
  'mixtral-8x22B_256xh100_tp8_pp4_cp4_ep8.json': ('mixtral-8x22B.json',
                                                  'h100_sxm_80g.json'),
  'llama3.1-8B-128k_64xh100_tp4_cp4_dp4.json': ('llama3.1-8B-128k.json',
                                                'h100_sxm_80g.json'),
}


def price(exe_cfg, app_name, sys_name):
  system = System(load_json(repo('systems', sys_name)))
  model = Llm(Llm.Application(load_json(repo('models', app_name))))
  model.compile(system, Llm.Execution.from_json(exe_cfg))
  model.run(system)
  return model, system


def test_every_bundled_example_is_listed():
  found = {os.path.basename(p) for p in glob.glob(repo('examples', '*.json'))}
  assert found == set(EXAMPLES)


@pytest.mark.parametrize('name', sorted(EXAMPLES))
def test_example_breakdown_sums_to_the_batch_time_and_fits(name):
  app_name, sys_name = EXAMPLES[name]
  model, system = price(load_json(repo('examples', name)), app_name,
                        sys_name)
  stats = model.get_stats_json()
  tb = stats['time_breakdown']
  assert sum(tb.values()) == pytest.approx(stats['total_time'], rel=1e-9)
  # Every term is a time spent, but the embedding, LM head and loss: with
  # pipeline_split_counts_vocab the end stages build one block fewer, so
  # their net addition can be negative (calculon.llm.terms.vocab).
  assert min(v for k, v in tb.items() if k != 'embedding_lm_head_time') >= 0
  # The terms Calculon's stats carry are those stats, unchanged.
  for key in ('fw_time', 'bw_time', 'optim_step_time', 'bubble_time',
              'dp_comm_exposed_time'):
    assert tb[key] == stats[key]
  usable = stats.get('proc_mem_tier1_usable', system.mem1.capacity_bytes)
  assert stats['proc_mem_tier1_cap_req'] <= usable
  # The report's rows are the breakdown; its memory rows add up to the
  # one memory figure.
  data = RunData.from_model(model)
  assert sum(s for _, s, _ in data.time_breakdown()) == pytest.approx(
    stats['total_time'], rel=1e-9)
  assert sum(t1 for _, t1, _ in data.memory()) == pytest.approx(
    stats['proc_mem_tier1_cap_req'], rel=1e-9)


def test_host_optimizer_step_is_a_term():
  """The issue's search best: Llama 3 70B on 512 H100s offloading the
  optimizer, whose step runs on the host.  The report's rows summed to
  the batch time less the host step (13.090 of 13.366 s); the host step
  is its own term now, and the bind follows the overheads' share."""
  exe = load_json(repo('examples', 'llama3-70B_512xh100_tp4_pp2_dp64.json'))
  # Megatron-Core's optimizer offload keeps the gradient buffer on the
  # device (optimizer_offload_gradients 'device'), so the ZeRO-1
  # layout no longer fits: the gradients sharded too, it does.
  exe.update(optimizer_offload=True, pipeline_interleaving=41)
  model, system = price(exe, 'llama3-70B.json', 'h100_sxm_80g.json')
  stats = model.get_stats_json()
  tb = stats['time_breakdown']
  host = tb['host_optimizer_time']
  assert host == stats['host_optimizer_time'] > 0.1
  rest = sum(v for k, v in tb.items() if k != 'host_optimizer_time')
  assert rest + host == pytest.approx(stats['total_time'], rel=1e-9)
  # Overheads: every term but the computation's, by hand.
  over = sum(v for k, v in tb.items() if k not in COMPUTE_TERMS)
  b = binding(stats)
  assert b['overheads_share'] == pytest.approx(over / stats['total_time'])
  want = 'compute' if over / stats['total_time'] < \
    COMPUTE_BOUND_OVERHEADS else b['largest_overhead']
  assert b['term'] == want
  assert b['memory_needed_bytes'] == stats['proc_mem_tier1_cap_req']
  assert b['memory_usable_bytes'] == stats['proc_mem_tier1_usable']
  text = text_report(RunData.from_model(model), layers=False)
  assert 'host optimizer step' in text
  gib = 2 ** 30
  assert (f"needed {stats['proc_mem_tier1_cap_req'] / gib:.1f} GiB of "
          f"{stats['proc_mem_tier1_usable'] / gib:.1f} GiB usable") in text


def test_cli_prices_the_dense_example(tmp_path):
  """``calculon llm`` on the README's dense example: exit 0, the stats
  JSON carries the breakdown, and the text names the one memory
  figure."""
  out = tmp_path / 'stats.json'
  res = run_cli('llm', repo('models', 'llama3-70B.json'),
                repo('examples', 'llama3-70B_512xh100_tp4_pp2_dp64.json'),
                repo('systems', 'h100_sxm_80g.json'), out)
  assert res.returncode == 0, res.stderr
  stats = load_json(out)
  assert sum(stats['time_breakdown'].values()) == pytest.approx(
    stats['total_time'], rel=1e-9)
  assert stats['proc_mem_tier1_cap_req'] <= stats['proc_mem_tier1_usable']
