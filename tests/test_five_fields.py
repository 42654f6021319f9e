"""A newcomer writes five fields (issue 45): an execution naming a
``framework`` needs only its layout, through the real command line.

The fully written execution below is what :mod:`calculon.config.fill`
says a layout-only one means under Megatron-Core on an H100 system
(tiers of 8 and 65,536 processors): TP 4 on tier 0 (4 <= 8), DP 32 and
PP 4 on tier 1 (they span 128 and 512 ranks), sequence parallelism
(TP > 1) with the all-gather redone (the preset dictates it without full
recomputation), the distributed optimizer and overlapped gradient
reduce (DP > 1), FlashAttention, the activation fused, no recomputation,
no interleaving, no offload, training.
"""

import json

import pytest

from conftest import repo, run_cli

APP = repo('models', 'llama3-70B.json')
SYS = repo('systems', 'h100_sxm_80g.json')
FIVE = {'framework': 'megatron-core', 'num_procs': 512, 'tensor_par': 4,
        'pipeline_par': 4, 'data_par': 32, 'batch_size': 1024,
        'microbatch_size': 1, 'datatype': 'bfloat16'}
WRITTEN = dict(FIVE, tensor_par_net=0, pipeline_par_net=1, data_par_net=1,
               fused_activation=True, activation_recompute='none',
               pipeline_interleaving=1, optimizer_sharding=True,
               tensor_par_comm_type='rs_ag', tensor_par_overlap='none',
               seq_par_ag_redo=True, data_par_overlap=True,
               weight_offload=False, activations_offload=False,
               optimizer_offload=False, training=True,
               data_par_sharding='optimizer', attention_kernel='flash')


def _write(tmp_path, name, cfg):
  path = tmp_path / name
  path.write_text(json.dumps(cfg))
  return path


def _stats(tmp_path, name, cfg):
  out = tmp_path / f'{name}.stats.json'
  res = run_cli('llm', APP, _write(tmp_path, name, cfg), SYS, out)
  assert res.returncode == 0, res.stderr
  stats = json.loads(out.read_text())
  stats.pop('framework_settings')    # names what the file did not write
  return stats


def test_the_layout_prices_as_the_fully_written_execution(tmp_path):
  five = _stats(tmp_path, 'five.json', FIVE)
  full = _stats(tmp_path, 'full.json', WRITTEN)
  assert five == full
  assert five['framework'] == 'megatron-core'
  # Llama 3 70B on 512 H100s at this layout: 16.50 s a batch of 1,024
  # sequences of 8,192 tokens (the engine's price on the calibrated
  # default file, measured kernel tables and all, recorded here to catch a change of what the layout
  # means; it moves when the file is refitted).
  assert five['block_fw_flops'] > 0
  assert round(five['total_time'], 2) == 16.50


def test_the_brief_layout_is_an_answer_not_an_error(tmp_path):
  """TP 4 PP 2 DP 64 without recomputation needs more than an H100 holds:
  infeasible (exit 1, Calculon's ERROR line), never bad input."""
  cfg = dict(FIVE, pipeline_par=2, data_par=64)
  res = run_cli('llm', APP, _write(tmp_path, 'e.json', cfg), SYS, '-')
  assert res.returncode == 1, res.stderr
  assert res.stdout.startswith('ERROR: Mem tier1 needs 78.6'), res.stdout


@pytest.mark.parametrize('typo,drop,right', [
  ('attention_kernal', None, 'attention_kernel'),
  ('tensor_parr', 'tensor_par', 'tensor_par'),
  ('microbatch', 'microbatch_size', 'microbatch_size'),
  ('seq_par_ag_redoo', None, 'seq_par_ag_redo'),
])
def test_a_typo_gets_a_did_you_mean(tmp_path, typo, drop, right):
  cfg = dict(FIVE, **{typo: 1})
  cfg.pop(drop, None)
  path = _write(tmp_path, 'e.json', cfg)
  res = run_cli('llm', APP, path, SYS, '-')
  assert res.returncode == 2
  assert res.stderr == (f"calculon: error: {path}: unknown field '{typo}' "
                        f"(did you mean '{right}'?)\n")


def test_all_missing_fields_in_one_message(tmp_path):
  cfg = {k: v for k, v in FIVE.items()
         if k not in ('pipeline_par', 'batch_size', 'datatype')}
  path = _write(tmp_path, 'e.json', cfg)
  res = run_cli('llm', APP, path, SYS, '-')
  assert res.returncode == 2
  assert res.stderr == (
    f"calculon: error: {path}: missing field 'pipeline_par' (an integer "
    ">= 1 and <= 16777216); also missing: 'batch_size' (an integer >= 1 "
    "and <= "
    "1073741824), 'datatype' (one of \"float8\", \"float16\", \"float32\", "
    '"bfloat16", "float4")\n')


def test_a_calculon_file_still_writes_every_field(tmp_path):
  """No framework: Calculon's 23 fields, all missing ones named."""
  cfg = {k: v for k, v in FIVE.items() if k != 'framework'}
  path = _write(tmp_path, 'e.json', cfg)
  res = run_cli('llm', APP, path, SYS, '-')
  assert res.returncode == 2
  line = res.stderr.strip()
  assert line.startswith(f"calculon: error: {path}: missing field "
                         "'tensor_par_net' (an integer >= 0 and <= 1024); "
                         "also missing: 'pipeline_par_net'"), line
  assert line.count("'") == 2 * 14 and '\n' not in line, line


@pytest.mark.parametrize('changes,text', [
  ({'seq_par_ag_redo': False},
   "field 'seq_par_ag_redo' = false is not allowed with framework "
   "'megatron-core': it supports true ("),
  ({'tensor_par_comm_type': 'p2p_rs_ag'},
   "field 'tensor_par_comm_type' = \"p2p_rs_ag\" is not allowed with "
   "framework 'megatron-core': it supports \"ar\", \"rs_ag\" ("),
])
def test_an_unsupported_value_says_how_to_price_it_anyway(tmp_path, changes,
                                                          text):
  path = _write(tmp_path, 'e.json', dict(FIVE, **changes))
  res = run_cli('llm', APP, path, SYS, '-')
  assert res.returncode == 2
  line = res.stderr
  assert line.startswith(f'calculon: error: {path}: {text}'), line
  assert line.endswith('; to price it anyway, use "framework": "common" (or '
                       '--framework common)\n'), line
  assert line.count('\n') == 1
  # ... and the value the preset dictates, written as it dictates it, is
  # fine.
  if 'seq_par_ag_redo' in changes:
    same = _write(tmp_path, 'same.json', dict(FIVE, seq_par_ag_redo=True))
    assert run_cli('llm', APP, same, SYS, '-').returncode == 0
    anyway = _write(tmp_path, 'anyway.json', dict(FIVE, **changes,
                                                  framework='common'))
    assert run_cli('llm', APP, anyway, SYS, '-').returncode == 0
