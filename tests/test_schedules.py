"""The pipeline schedule table (calculon/llm/terms/schedules.py): each
schedule's bubble, microbatches in flight and parameter copies against
the formula its source publishes, computed by hand in the test from the
block's forward, backward and weight-gradient times; the frameworks'
presets; bad combinations refused with one line."""

import numpy as np
import pytest

from calculon.config import Application
from calculon.errors import ConfigError
from calculon.hardware import System
from calculon.io import read_json_file
from calculon.llm.terms import schedules as S

from conftest import ROOT, run_cli
from test_modern import evaluation, value

H100 = System(read_json_file(f'{ROOT}/systems/h100_sxm_80g.json'))
LLAMA3_70B = Application.from_dict(read_json_file(
  f'{ROOT}/models/llama3-70B.json'))
DEEPSEEK_V3 = Application.from_dict(read_json_file(
  f'{ROOT}/models/deepseek-v3.json'))

#: Llama 3 70B, TP 8, PP 8, 64 microbatches of one sequence.
L70 = dict(tensor_par=8, pipeline_par=8, data_par=1, batch_size=64,
           microbatch_size=1, tensor_par_net=0, pipeline_par_net=1,
           data_par_net=1, datatype='bfloat16', fused_activation=True,
           activation_recompute='full', tensor_par_comm_type='rs_ag',
           attention_kernel='flash')


def test_the_table_is_the_registry_s_schedules_with_their_sources():
  from calculon.config.registry import PIPELINE_SCHEDULE_NAMES, field
  assert tuple(t.name for t in S.TABLE) == PIPELINE_SCHEDULE_NAMES
  f = field('execution', 'pipeline_schedule')
  assert f.names == PIPELINE_SCHEDULE_NAMES and f.absent is None
  for t in S.TABLE:
    assert t.source and t.bubble and t.in_flight
  # PyTorch's get_schedule_class names (schedules.py at 00722e648b).
  torch_names = {t.names.get('torchtitan') for t in S.TABLE} - {None}
  assert torch_names == {'1F1B', 'Interleaved1F1B', 'GPipe', 'LoopedBFS',
                         'InterleavedZeroBubble', 'ZBVZeroBubble',
                         'DualPipeV'}


def test_published_bubbles_at_equal_times():
  """At F = B - W = W (the zero-bubble papers' unit times), the formulas
  give the published bubbles: ZB1P one third of 1F1B's (sail-sg README
  table: B/3), ZB-V none (0), DualPipe (PP/2 - 1)(F&B + B - 3W) with F&B
  = F + B (the DualPipe README's table)."""
  t = 1.0
  f, b, w = t, 2 * t, t          # b: the full backward, input + weight
  p, m = 8, 64
  one = (p - 1) * (f + b)
  assert S.bubble_s(S.ZB_H1, p, m, 1, f, b, w) == pytest.approx(one / 3)
  assert S.bubble_s(S.ZBV, p, m, 2, f, b, w) == 0
  assert S.bubble_s(S.GPIPE, p, m, 1, f, b, w) == pytest.approx(one)
  assert S.bubble_s(S.DUALPIPE, p, m, 1, f, b, w) == pytest.approx(
    (p / 2 - 1) * ((f + b) + b - 3 * w))
  # DualPipeV: 2p stages on p ranks, its chunks half a rank's blocks.
  assert S.bubble_s(S.DUALPIPE_V, p, m, 2, f, b, w) == pytest.approx(
    (2 * p / 2 - 1) * ((f + b) + b - 3 * w))
  # The interleaved zero-bubble schedule waits as the interleaved 1F1B
  # does when PP does not divide the microbatches: (v - 1)(p - m mod p).
  assert S.bubble_s(S.INTERLEAVED_ZB, p, 12, 2, f, b, w) == pytest.approx(
    (p - 1) * (f + b - 2 * w) + (2 - 1) * (p - 12 % p) * (f + b))


def test_zb_h1_bubble_of_llama3_70b_tp8_pp8():
  """Llama 3 70B, TP 8, PP 8, 64 microbatches: ZB-H1's bubble is (p -
  1)(F + B - 2W) of the stage's F, B, W (Qi et al. ICLR 2024, section
  3.1; the DualPipe README's ZB1P row), 1F1B's (p - 1)(F + B) (Narayanan
  et al. SC21 eq. 1), and the step differs by exactly their difference."""
  one = evaluation(LLAMA3_70B, H100, **L70)
  zb = evaluation(LLAMA3_70B, H100, pipeline_schedule='zb-h1', **L70)
  assert value(one.num_microbatches) == 64
  assert value(one.blocks_per_proc) == 10      # 80 / 8: no uneven stage
  f = value(one.chunk_fw_time_s)
  b = value(one.chunk_bw_time_s)
  w = 10 * value(one.block.wgrad_time)
  assert 0 < w < b
  p = 8
  assert value(one.bubble_time_s) == pytest.approx((p - 1) * (f + b),
                                                   rel=1e-12)
  assert value(zb.bubble_time_s) == pytest.approx(
    (p - 1) * (f + b - 2 * w), rel=1e-12)
  ratio = value(zb.bubble_time_s) / value(one.bubble_time_s)
  assert ratio == pytest.approx((f + b - 2 * w) / (f + b), rel=1e-12)
  assert 0.5 < ratio < 1
  # Only the bubble moves: the step by its difference, memory not at all.
  assert value(one.total_time_s) - value(zb.total_time_s) == pytest.approx(
    value(one.bubble_time_s) - value(zb.bubble_time_s), rel=1e-9)
  for name in ('fw_time_s', 'bw_time_s', 'recompute_time_s',
               'pp_comm_exposed_time_s', 'tp_comm_exposed_time_s',
               'modern_time_s', 'mem1_bytes'):
    assert value(getattr(one, name)) == value(getattr(zb, name)), name


def test_explicit_1f1b_is_calculon_s_schedule():
  """'1f1b' and 'interleaved-1f1b' are what a left-out schedule means:
  the same numbers, bit for bit."""
  for vp, name in ((1, '1f1b'), (2, 'interleaved-1f1b')):
    plain = evaluation(LLAMA3_70B, H100, pipeline_interleaving=vp, **L70)
    named = evaluation(LLAMA3_70B, H100, pipeline_interleaving=vp,
                       pipeline_schedule=name, **L70)
    for stat in ('total_time_s', 'bubble_time_s', 'mem1_bytes'):
      assert value(getattr(plain, stat)) == value(getattr(named, stat))


def test_gpipe_keeps_every_microbatch():
  one = evaluation(LLAMA3_70B, H100, **dict(L70, activation_recompute='none',
                                            batch_size=16))
  gp = evaluation(LLAMA3_70B, H100, pipeline_schedule='gpipe',
                  **dict(L70, activation_recompute='none', batch_size=16))
  assert value(gp.bubble_time_s) == value(one.bubble_time_s)
  assert value(one._inflight_factor) == 8          # min(m, p)
  assert value(gp._inflight_factor) == 16          # m: all forwards first
  assert value(gp.act_bytes) > value(one.act_bytes)


#: DeepSeek-V3 on 256 H100s: TP 1, PP 8, DP 32, EP 8, 16 microbatches.
DSV3 = dict(tensor_par=1, pipeline_par=8, data_par=32, batch_size=512,
            microbatch_size=1, tensor_par_net=0, pipeline_par_net=1,
            data_par_net=1, expert_par=8, expert_par_net=0,
            datatype='bfloat16', fused_activation=True,
            activation_recompute='full', attention_kernel='flash',
            data_par_sharding='optimizer', moe_comm_overlap='compute')


def test_dualpipe_v_and_dualpipe_deepseek_v3_on_256_h100():
  """DeepSeek-V3, PP 8, EP 8: DualPipeV prices; a rank holds two of the
  16 stages (the DualPipe README's '2x parameters' per PP stage, on PP/2
  devices), so the weights of the interleaved 1F1B over two chunks;
  DualPipe keeps the mirrored stage too (DeepSeek-V3 report section
  3.2.1: "two copies of the model parameters"): twice 1F1B's weights,
  gradients and optimizer state, and the README's PP + 1 microbatches in
  flight."""
  inter = evaluation(DEEPSEEK_V3, H100, pipeline_interleaving=2, **DSV3)
  v = evaluation(DEEPSEEK_V3, H100, pipeline_interleaving=2,
                 pipeline_schedule='dualpipe-v', **DSV3)
  one = evaluation(DEEPSEEK_V3, H100, **DSV3)
  dual = evaluation(DEEPSEEK_V3, H100, pipeline_schedule='dualpipe', **DSV3)
  assert int(value(v.compile_reason)) == 0
  assert np.isfinite(value(v.total_time_s)) and value(v.total_time_s) > 0
  assert value(v.weight_bytes) == value(inter.weight_bytes)
  assert value(dual.weight_bytes) == 2 * value(one.weight_bytes)
  assert value(dual.optimizer_bytes) == 2 * value(one.optimizer_bytes)
  assert value(dual.weight_grad_bytes) > value(one.weight_grad_bytes)
  # Bubbles by the README's formula with F&B = F + B, F, B, W of a chunk.
  for ev, stages in ((v, 16), (dual, 8)):
    f, b = value(ev.chunk_fw_time_s), value(ev.chunk_bw_time_s)
    w = value(ev.blocks_per_chunk) * value(ev.block.wgrad_time)
    assert value(ev.bubble_time_s) == pytest.approx(
      (stages / 2 - 1) * max((f + b) + b - 3 * w, 0), rel=1e-12)
  # In flight (units of a rank's blocks): PP + 1 stages of DualPipe,
  # 2 PP + 1 half-rank chunks of DualPipeV; the V puts the embedding and
  # the loss on the first rank, whose memory holds the LM head too.
  assert value(dual._inflight_factor) == 9
  assert value(v._inflight_factor) == 8.5
  assert value(v.first_stage_memory_by_kind['weights'][0]) > \
    value(inter.first_stage_memory_by_kind['weights'][0])
  # The mirrored copy's gradient all-reduce and optimizer step.
  assert value(dual.pp_mirror_time_s) > 0
  assert value(one.pp_mirror_time_s) == 0


def test_every_schedule_prices_and_the_v_schedules_need_two_chunks():
  for name in S.PIPELINE_SCHEDULE_NAMES:
    t = S.TABLE[S.PIPELINE_SCHEDULE_NAMES.index(name)]
    vp = t.chunks[0]
    ev = evaluation(LLAMA3_70B, H100, pipeline_interleaving=vp,
                    pipeline_schedule=name, **L70)
    assert np.isfinite(value(ev.total_time_s)), name
    assert value(ev.bubble_time_s) >= 0, name


@pytest.mark.parametrize('fields, words', [
  (dict(pipeline_schedule='zbv'), 'needs pipeline_interleaving = 2'),
  (dict(pipeline_schedule='zb-h1', pipeline_interleaving=2),
   'needs pipeline_interleaving = 1'),
  (dict(pipeline_schedule='interleaved-zb'),
   'needs pipeline_interleaving >= 2'),
  (dict(pipeline_schedule='dualpipe', batch_size=15),
   'even'),
  (dict(pipeline_schedule='dualpipe-v', pipeline_interleaving=2,
        batch_size=8), '>= 2 x pipeline_par'),
  (dict(pipeline_schedule='zb-h1', pipeline_par=1, tensor_par=8,
        data_par=8), 'needs pipeline_par > 1'),
])
def test_bad_combinations_refused(fields, words):
  with pytest.raises(ConfigError) as err:
    evaluation(LLAMA3_70B, H100, **dict(L70, **fields))
  text = str(err.value)
  assert "field 'pipeline_schedule'" in text and words in text
  assert '\n' not in text


def test_odd_pipeline_refused_for_dualpipe():
  with pytest.raises(ConfigError, match='even pipeline_par'):
    evaluation(LLAMA3_70B, H100, **dict(L70, pipeline_par=5, tensor_par=1,
                                        pipeline_schedule='dualpipe',
                                        batch_size=40))


def test_frameworks_torchtitan_lists_its_schedules():
  proc = run_cli('frameworks', 'torchtitan')
  assert proc.returncode == 0, proc.stderr
  line = next(ln for ln in proc.stdout.splitlines()
              if 'pipeline_schedule:' in ln)
  for name in ('1f1b', 'interleaved-1f1b', 'gpipe', 'looped-bfs',
               'interleaved-zb', 'zbv', 'dualpipe-v'):
    assert name in line.split(':', 1)[1].replace(',', ' ').split()
  assert 'zb-h1' not in line and ' dualpipe,' not in line


def test_a_preset_refuses_a_schedule_it_does_not_ship(tmp_path):
  import json
  exe = dict(L70, num_procs=128, data_par=2, batch_size=128,
             pipeline_interleaving=1, optimizer_sharding=True,
             data_par_sharding='optimizer', tensor_par_overlap='none',
             seq_par_ag_redo=False, data_par_overlap=False,
             weight_offload=False, activations_offload=False,
             optimizer_offload=False, training=True,
             framework='megatron-core', pipeline_schedule='zb-h1')
  path = tmp_path / 'exe.json'
  path.write_text(json.dumps(exe))
  proc = run_cli('llm', f'{ROOT}/models/llama3-70B.json', path,
                 f'{ROOT}/systems/h100_sxm_80g.json', '-')
  assert proc.returncode == 2
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and "'pipeline_schedule' = \"zb-h1\"" in lines[0]
  assert 'megatron-core' in lines[0] and 'interleaved-1f1b' in lines[0]


# -- uneven stages -----------------------------------------------------------

def test_uneven_stages_of_llama3_70b():
  """Llama 3 70B over PP 8 with 7 blocks on the first and the last stage
  (Megatron-Core --decoder-first/last-pipeline-num-layers 7): the other
  six hold (80 - 14) / 6 = 11, the busiest; the bubble is the other ranks'
  stage times, (p - 1) edge blocks and 80 - 11 - 7 = 62 base blocks (each
  of the 7 others' stages ends in one edge block); the first stage keeps
  7 blocks' weights and activations, and the middle rank binds memory."""
  even = evaluation(LLAMA3_70B, H100, **L70)
  ev = evaluation(LLAMA3_70B, H100, pipeline_first_stage_blocks=7,
                  pipeline_last_stage_blocks=7, **L70)
  assert value(ev.blocks_per_proc) == 11
  base = value(ev.baseblock_fw_time_s) + value(ev.baseblock_bw_time_s)
  edge = value(ev.edgeblock_fw_time_s) + value(ev.edgeblock_bw_time_s)
  assert value(ev.bubble_time_s) == pytest.approx(7 * edge + 62 * base,
                                                  rel=1e-12)
  assert value(ev.first_stage_memory_by_kind['weights'][0]) < \
    value(even.first_stage_memory_by_kind['weights'][0])
  assert value(ev.mem1_tensor_bytes) > value(ev.first_stage_mem1_bytes)
  assert value(ev.mem1_tensor_bytes) > value(ev.last_stage_mem1_bytes)
  # Left out, both mean the even split, bit for bit.
  assert value(evaluation(LLAMA3_70B, H100, **L70).total_time_s) == \
    value(even.total_time_s)


def test_uneven_stages_refused_with_one_line():
  with pytest.raises(ConfigError) as err:
    evaluation(LLAMA3_70B, H100, pipeline_first_stage_blocks=9,
               pipeline_last_stage_blocks=9, **L70)
  text = str(err.value)
  assert "field 'pipeline_first_stage_blocks' = 9" in text
  assert 'must split the 62 blocks left' in text and '\n' not in text
  with pytest.raises(ConfigError, match='dualpipe'):
    evaluation(LLAMA3_70B, H100, pipeline_first_stage_blocks=12,
               pipeline_last_stage_blocks=8, pipeline_schedule='dualpipe',
               **L70)
  with pytest.raises(ConfigError, match='pipeline_par > 1'):
    evaluation(LLAMA3_70B, H100, pipeline_last_stage_blocks=8,
               **dict(L70, pipeline_par=1))


def test_layout_field_round_trips_as_json():
  """Left out it stays out of the JSON an execution writes."""
  from calculon.config import Execution, ExecutionColumns
  from test_modern import BASE_EXE
  exe = Execution.from_dict(dict(BASE_EXE))
  assert 'pipeline_first_stage_blocks' not in exe.to_dict()
  cols = ExecutionColumns.from_records([exe.to_dict()])
  assert 'pipeline_last_stage_blocks' not in cols.record(0)
  assert 'pipeline_last_stage_blocks' not in cols.to_frame().columns
  given = Execution.from_dict(dict(BASE_EXE, pipeline_par=2, num_procs=2,
                                   pipeline_last_stage_blocks=3))
  cols = ExecutionColumns.from_records([given.to_dict()])
  assert cols.record(0)['pipeline_last_stage_blocks'] == 3
  frame = cols.to_frame()
  frame['attention_type'] = 'multihead'
  frame = frame.loc[[0, 0]].reset_index(drop=True)
  import pandas as pd
  frame['pipeline_last_stage_blocks'] = pd.Series([3, None], dtype=object)
  back = ExecutionColumns.from_frame(frame)
  assert list(back.pipeline_last_stage_blocks) == [3, -1]   # -1: left out
  assert 'pipeline_first_stage_blocks' not in frame.columns


def test_uneven_stages_are_per_rank_over_its_chunks():
  """With VP 2 the fields count a rank's blocks, as Megatron-Core's
  num_layers_in_first/last_pipeline_stage do (transformer_block.py
  get_num_layers_to_build: a rank's layers // VP a chunk): 4 + 4 on the
  end ranks leave (80 - 8) / 6 = 12 to each middle rank, 6 a chunk; 7 is
  refused, not a multiple of VP."""
  ev = evaluation(LLAMA3_70B, H100, pipeline_first_stage_blocks=4,
                  pipeline_last_stage_blocks=4,
                  **dict(L70, pipeline_interleaving=2))
  assert value(ev.blocks_per_proc) == 12
  assert value(ev.blocks_per_chunk) == 6
  assert value(ev.pipeline_layout.first_blocks) == 4
  assert value(ev.pipeline_layout.last_blocks) == 4
  with pytest.raises(ConfigError) as err:
    evaluation(LLAMA3_70B, H100, pipeline_first_stage_blocks=7,
               pipeline_last_stage_blocks=7,
               **dict(L70, pipeline_interleaving=2))
  assert 'multiple of pipeline_interleaving = 2' in str(err.value)


def test_layout_string_the_registry_documents():
  """The registry's Megatron-Core pipeline_model_parallel_layout example
  for Llama 3 70B, PP 8, 7 blocks on each end rank, unrolled as
  PipelineParallelLayerLayout.parse_str_to_list does (b1030e9dd: '(..)*n'
  then 'x*n', stages split at '|', stage v PP + r on rank r), holds the
  blocks per rank the engine prices: 7, six times 11, 7."""
  import re
  from calculon.config.registry import EXECUTION
  doc = next(f for f in EXECUTION
             if f.name == 'pipeline_first_stage_blocks').doc
  layout = re.search(r"'(Et\*7[^']*)'", doc).group(1)
  s = layout.replace(',', '')
  s = re.sub(r'\(([^)]+)\)\*(\d+)', lambda m: m.group(1) * int(m.group(2)), s)
  s = re.sub(r'(.)\*(\d+)', lambda m: m.group(1) * int(m.group(2)), s)
  stages = s.split('|')
  assert stages[0][0] == 'E' and stages[-1][-1] == 'L'
  counts = [st.count('t') for st in stages]
  assert counts == [7] + [11] * 6 + [7]
  ev = evaluation(LLAMA3_70B, H100, pipeline_first_stage_blocks=7,
                  pipeline_last_stage_blocks=7, **L70)
  assert sum(counts) == LLAMA3_70B.num_blocks
  assert value(ev.blocks_per_proc) == max(counts)
  assert value(ev.pipeline_layout.first_blocks) == counts[0]
  assert value(ev.pipeline_layout.last_blocks) == counts[-1]
