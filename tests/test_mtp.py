"""Multi-token prediction (``mtp_layers``): what each module adds to the
last pipeline stage (DeepSeek-AI 2024, DeepSeek-V3 technical report,
arXiv:2412.19437, section 2.2; Megatron-Core
megatron/core/transformer/multi_token_prediction.py)."""

import numpy as np
import pytest

from calculon.config import Application
from calculon.errors import ConfigError
from calculon.hardware import System
from calculon.io import read_json_file
from calculon.llm.block import BlockTotals

from conftest import ROOT
from test_modern import evaluation, value

H100 = System(read_json_file(f'{ROOT}/systems/h100_sxm_80g.json'))
DSV3 = read_json_file(f'{ROOT}/models/deepseek-v3.json')
LLAMA3_70B = read_json_file(f'{ROOT}/models/llama3-70B.json')
#: Llama 3 70B on one DGX H100 node per pipeline stage.
L70 = dict(tensor_par=8, pipeline_par=4, data_par=2, batch_size=32,
           microbatch_size=1, datatype='bfloat16',
           activation_recompute='full', tensor_par_comm_type='rs_ag',
           data_par_sharding='optimizer')


def _app(cfg, **over):
  return Application.from_dict(dict(cfg, **over))


def test_mtp_module_holds_deepseek_v3s_unique_parameters():
  """DeepSeek-V3's MTP module: 11.5B unique parameters beside the shared
  embedding and output head (deepseek-ai/DeepSeek-V3 README_WEIGHTS.md,
  "MTP Modules: 11.5B unique parameters"): one MoE block (the decoder's
  own kind), the 2h x h projection and the two RMSNorms."""
  ev = evaluation(_app(DSV3, mtp_layers=1), H100, tensor_par=1,
                  pipeline_par=2, data_par=1, batch_size=2,
                  microbatch_size=1, datatype='bfloat16')
  assert value(ev.mtp_blocks) == 1
  h = DSV3['hidden']
  block = sum(value(layer.weights) for layer in ev.layers)
  mtp = {layer.name: value(layer.weights) for layer in ev.head_layers
         if layer.name.startswith('MTP1_')}
  assert mtp['MTP1_Proj'] == 2 * h * h
  assert mtp['MTP1_Head_Logits'] == 0       # the shared output head
  # The last stage's copy of the shared embedding (PP > 1).
  assert mtp['MTP1_Embedding'] == DSV3['vocab_size'] * h
  unique = block + mtp['MTP1_Proj'] + mtp['MTP1_ENorm'] + mtp['MTP1_HNorm']
  assert unique == pytest.approx(11.5e9, rel=0.01)
  # With one stage the embedding is the first stage's own.
  one = evaluation(_app(DSV3, mtp_layers=1), H100, tensor_par=1,
                   pipeline_par=1, data_par=1, batch_size=1,
                   microbatch_size=1, datatype='bfloat16')
  assert {layer.name: value(layer.weights) for layer in one.head_layers}[
    'MTP1_Embedding'] == 0


def test_each_module_adds_a_block_and_a_head_pass_to_every_microbatch():
  """With one stage every microbatch runs each module: one more block
  (forward and backward, as the stage's own blocks) and one more pass
  through the head and loss, the 2h -> h projection and the embedding of
  the shifted tokens; nothing else changes."""
  fields = dict(L70, pipeline_par=1, data_par=4, batch_size=16)
  base = evaluation(_app(LLAMA3_70B), H100, **fields)
  for depth in (1, 2):
    ev = evaluation(_app(LLAMA3_70B, mtp_layers=depth), H100, **fields)
    nmb = value(ev.num_microbatches)
    block_s = value(ev.baseblock_fw_time_no_offload_s) + \
      value(ev.baseblock_bw_time_no_offload_s)
    extra = [l for l in ev.head_layers if l.name.startswith('MTP')]
    assert len(extra) == depth * len(
      [l for l in ev.head_layers if l.name.startswith('MTP1_')])
    totals = BlockTotals(extra, True, False)
    head_s = value(totals.fw_time + totals.base_fw_tp_exposed +
                   totals.agrad_time + totals.wgrad_time +
                   totals.base_agrad_tp_exposed)
    assert value(ev.vocab_time_s) - value(base.vocab_time_s) == \
      pytest.approx(nmb * (depth * block_s + head_s), rel=1e-9)
    assert value(ev.fw_time_s) == value(base.fw_time_s)
    assert value(ev.total_time_s) > value(base.total_time_s)


def test_module_on_the_last_stage_unless_the_layout_makes_room():
  """Megatron-Core places the modules on the last pipeline stage when no
  layout is given (multi_token_prediction.py mtp_on_this_rank), so that
  stage's extra paces the 1F1B steady state; NVIDIA's DeepSeek-V3
  layouts give the loss's rank fewer decoder blocks (Megatron-Bridge
  recipes/deepseek/deepseek_v3.py, PP 16: 4 blocks a rank, 1 and the
  module on the last), and then the module's work hides in that rank's
  slack."""
  app0, app1 = _app(LLAMA3_70B), _app(LLAMA3_70B, mtp_layers=1)
  even0 = evaluation(app0, H100, **L70)
  even1 = evaluation(app1, H100, **L70)
  nmb = value(even1.num_microbatches)
  block_s = value(even1.baseblock_fw_time_no_offload_s) + \
    value(even1.baseblock_bw_time_no_offload_s)
  # The steady state runs at the last stage's pace: every microbatch
  # carries the module's block.
  assert value(even1.vocab_time_s) - value(even0.vocab_time_s) > \
    nmb * block_s
  lay = dict(L70, pipeline_last_stage_blocks=14)
  lay0, lay1 = evaluation(app0, H100, **lay), evaluation(app1, H100, **lay)
  assert value(lay1.total_time_s) < value(even1.total_time_s)
  assert value(lay1.total_time_s) - value(lay0.total_time_s) < \
    0.5 * (value(even1.total_time_s) - value(even0.total_time_s))
  # The last rank holds the module's block as one of its own.
  grads = lambda ev: value(ev.last_stage_memory_by_kind['weights'][0])
  assert grads(lay1) > grads(lay0)


def test_without_modules_nothing_changes():
  base = evaluation(_app(LLAMA3_70B), H100, **L70)
  zero = evaluation(_app(LLAMA3_70B, mtp_layers=0), H100, **L70)
  assert value(zero.total_time_s) == value(base.total_time_s)
  assert value(zero.mem1_tensor_bytes) == value(base.mem1_tensor_bytes)


def test_mtp_bad_inputs_name_the_field():
  cfg = dict(LLAMA3_70B)
  cfg.pop('vocab_size')
  cfg.pop('position_embedding', None)
  cfg.pop('tied_embeddings', None)
  with pytest.raises(ConfigError) as err:
    Application.from_dict(dict(cfg, mtp_layers=1), 'app.json')
  text = str(err.value)
  assert text.startswith("app.json: field 'mtp_layers' = 1 is not allowed")
  assert 'vocab_size' in text and '\n' not in text
  with pytest.raises(ConfigError, match="'mtp_layers' = -1 .*>= 0"):
    Application.from_dict(dict(LLAMA3_70B, mtp_layers=-1), 'app.json')


def test_model_flops_count_the_modules_as_megatron_does():
  """Megatron-LM ``num_floating_point_operations`` (megatron/training/
  training.py at d98e8a64dd) with ``mtp_num_layers`` D: D more layers of
  the last layer's kind (num_moe_layers += D for DeepSeek-V3), the logits
  x (D + 1) and 3 x 2 x D (3h + 2h^2) for the norms and the projection;
  the model's FLOP leave the norms out (:mod:`calculon.llm.flops`)."""
  from calculon.llm.flops import model_flops_per_token
  from test_moe import megatron_moe_mla_flops_per_token
  h, V = DSV3['hidden'], DSV3['vocab_size']
  cfg = {k: v for k, v in DSV3.items() if k not in ('name', 'source',
                                                    'notes')}
  for depth in (1, 2):
    deeper = _app(cfg, num_blocks=61 + depth)
    megatron = megatron_moe_mla_flops_per_token(deeper) + \
      6 * depth * h * V + 6 * depth * (3 * h + 2 * h * h)
    ours = model_flops_per_token(_app(cfg, mtp_layers=depth), 'causal')
    assert ours == pytest.approx(megatron - 6 * depth * 3 * h, rel=1e-12)
  assert model_flops_per_token(_app(cfg, mtp_layers=1)) > \
    model_flops_per_token(_app(cfg))


def test_cli_refuses_too_many_modules_in_one_line(tmp_path):
  """Through a real subprocess: exit 2, one line naming file, field, value
  and the bound."""
  import json
  import os
  import subprocess
  import sys
  path = tmp_path / 'app.json'
  path.write_text(json.dumps(dict(LLAMA3_70B, mtp_layers=65)))
  res = subprocess.run([sys.executable, os.path.join(ROOT, 'bin', 'calculon'),
                        'llm-parameter-calculator', str(path)],
                       capture_output=True, text=True, timeout=120)
  assert res.returncode == 2
  err = res.stderr.strip()
  assert f"{path}: field 'mtp_layers' = 65 is not allowed: an integer >= 0 " \
    'and <= 64' in err
  assert len(err.splitlines()) == 1 and 'Traceback' not in err


def test_exports_carry_or_refuse_the_modules():
  """Megatron-Bridge: ``mtp_num_layers`` and the modules in the layout
  beside the loss ('m', Megatron-Core pipeline_parallel_layer_layout.py);
  torchtitan and DeepSpeed train none: refused, naming the field."""
  import dataclasses
  import export_cases as C
  from calculon.export import deepspeed as DS
  from calculon.export import megatron_bridge as MB
  from calculon.export import torchtitan as TT
  inp = C.inp('llama3-70B', 'megatron-core', num_procs=384, tensor_par=8,
              pipeline_par=6, data_par=8, batch_size=384, microbatch_size=1)
  inp = dataclasses.replace(inp, app=_app(LLAMA3_70B, mtp_layers=1))
  model = MB.overrides(inp)['model']
  assert model['mtp_num_layers'] == 1
  assert model['pipeline_model_parallel_layout'].endswith('t' * 13 + 'mL')
  assert 'mtp_num_layers' not in MB.overrides(C.inp(
    'llama3-70B', 'megatron-core', num_procs=384, tensor_par=8,
    pipeline_par=6, data_par=8, batch_size=384, microbatch_size=1))['model']
  for module, fw in ((TT, 'torchtitan'), (DS, 'deepspeed-zero')):
    one = C.inp('llama3-70B', fw, num_procs=8, tensor_par=1, pipeline_par=1,
                data_par=8, batch_size=8, microbatch_size=1,
                tensor_par_comm_type='ar')
    one = dataclasses.replace(one, app=_app(LLAMA3_70B, mtp_layers=1))
    with pytest.raises(ConfigError) as err:
      module.refusals(one)
    assert "application field 'mtp_layers' = 1 cannot be exported" in \
      str(err.value)
