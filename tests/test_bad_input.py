"""Bad input: each rule gives ConfigError naming the source, the field, the
value and what is allowed -- never an assert, KeyError or traceback."""

import copy

import pandas as pd
import pytest

from calculon import ConfigError, System
from calculon.config import Application, Execution
from calculon.llm import Llm, evaluate
from conftest import load_json, repo

EXE = load_json(repo('examples', '3072_t4_p64_d12_mbs4_full.json'))
APP = load_json(repo('models', 'megatron-1T.json'))
SYS = load_json(repo('systems', 'a100_80g.json'))


def exe_with(**changes):
  cfg = copy.deepcopy(EXE)
  cfg.update(changes)
  return cfg


def message(fn, *args):
  with pytest.raises(ConfigError) as info:
    fn(*args)
  assert isinstance(info.value, ValueError)
  return str(info.value)


def check_exe(changes, *fragments, drop=None):
  cfg = exe_with(**changes)
  if drop:
    del cfg[drop]
  msg = message(Execution.from_dict, cfg, 'exe.json')
  assert msg.startswith('exe.json: '), msg
  for frag in fragments:
    assert frag in msg, msg
  return msg


@pytest.mark.parametrize('changes,fragments', [
  ({'tensor_par': 0}, ["'tensor_par'", '= 0', 'integer >= 1']),
  ({'tensor_par': 'four'}, ["'tensor_par'", '"four"', 'integer >= 1']),
  ({'tensor_par': 4.0}, ["'tensor_par'", '4.0', 'integer']),
  ({'training': 'yes'}, ["'training'", '"yes"', 'true or false']),
  ({'datatype': 'int4'}, ["'datatype'", '"int4"', '"float16"']),
  ({'activation_recompute': 'partial'},
   ["'activation_recompute'", '"partial"', '"attn_only"']),
  ({'tensor_par_comm_type': 'allreduce'},
   ["'tensor_par_comm_type'", '"allreduce"', '"rs_ag"']),
  ({'tensor_par_overlap': 'yes'}, ["'tensor_par_overlap'", '"ring"']),
  ({'attention_type': 'gqa'}, ["'attention_type'", '"multiquery"']),
  ({'tensor_par_net': -1}, ["'tensor_par_net'", '-1', '>= 0']),
  ({'microbatch_size': 0}, ["'microbatch_size'", '= 0']),
  ({'num_procs': 3000}, ["'num_procs'", '3000',
                         'tensor_par * pipeline_par * data_par']),
  ({'batch_size': 3073}, ["'batch_size'", '3073', 'multiple of data_par']),
  ({'microbatch_size': 5}, ["'microbatch_size'", '5', 'local batch size']),
  ({'training': False}, ["'activation_recompute'", '"full"', 'training']),
  ({'pipeline_par': 1, 'data_par': 768, 'pipeline_interleaving': 2},
   ["'pipeline_interleaving'", '= 2', 'pipeline_par = 1']),
  ({'data_par': 1, 'pipeline_par': 768}, ["'optimizer_sharding'", 'data_par > 1']),
  ({'tensor_par': 1, 'data_par': 48, 'tensor_par_overlap': 'ring'},
   ["'tensor_par_overlap'", '"ring"', 'tensor_par > 1']),
  ({'seq_par_ag_redo': True, 'tensor_par_comm_type': 'ar',
    'activation_recompute': 'attn_only'}, ["'seq_par_ag_redo'", '"rs_ag"']),
  ({'seq_par_ag_redo': True}, ["'seq_par_ag_redo'", '"full"']),
  ({'data_par_overlap': True, 'data_par': 1, 'pipeline_par': 768,
    'optimizer_sharding': False}, ["'data_par_overlap'", 'data_par * context_par > 1']),
  ({'optimizer_offload': True, 'training': False,
    'activation_recompute': 'none'}, ["'optimizer_offload'", 'training']),
])
def test_execution_rules(changes, fragments):
  check_exe(changes, *fragments)


def test_missing_and_unknown_fields():
  check_exe({}, "missing field 'batch_size'", 'integer >= 1', drop='batch_size')
  check_exe({'pipeline_parallel': 2}, "unknown field 'pipeline_parallel'",
            "did you mean 'pipeline_par'?")
  check_exe({'zzz': 2}, "unknown field 'zzz'", 'allowed fields', 'tensor_par')


def test_did_you_mean_over_the_whole_registry():
  # attention_kernel is an optional field the file does not carry: the
  # suggestion comes from the registry, not from the fields read.
  check_exe({'attention_kernal': 'flash'},
            "unknown field 'attention_kernal' (did you mean "
            "'attention_kernel'?)")
  # A typo of a required field is reported as the typo, not as missing.
  msg = check_exe({'tensor_parr': 4}, "unknown field 'tensor_parr' (did you "
                  "mean 'tensor_par'?)", drop='tensor_par')
  assert 'missing' not in msg
  bad = dict(APP, num_experst=8)
  assert "unknown field 'num_experst' (did you mean 'num_experts'?)" in \
    message(Application.from_dict, bad, 'app.json')


def test_all_missing_fields_in_one_message():
  cfg = {k: v for k, v in EXE.items()
         if k not in ('tensor_par_net', 'fused_activation', 'training')}
  msg = message(Execution.from_dict, cfg, 'exe.json')
  assert msg == ("exe.json: missing field 'tensor_par_net' (an integer >= "
                 "0 and <= 1024); also missing: 'fused_activation' (true or "
                 "false), 'training' (true or false)"), msg
  # The wrong file (an execution read as an application): what is
  # missing, not a did-you-mean for its fields.
  msg = message(Application.from_dict, EXE, 'app.json')
  assert msg.startswith("app.json: missing field 'hidden' ("), msg
  bad = {k: v for k, v in APP.items() if k not in ('hidden', 'num_blocks')}
  msg = message(Application.from_dict, bad, 'app.json')
  assert "missing field 'hidden'" in msg and "'num_blocks'" in msg, msg


def test_application_errors():
  bad = dict(APP, hidden=-5)
  msg = message(Application.from_dict, bad, 'app.json')
  assert msg.startswith('app.json: ') and "'hidden'" in msg and '-5' in msg
  bad = {k: v for k, v in APP.items() if k != 'num_blocks'}
  assert "missing field 'num_blocks'" in message(Application.from_dict, bad)
  assert 'must be a JSON object' in message(Application.from_dict, [1, 2])


@pytest.mark.parametrize('path,value,fragments', [
  (('processing_mode',), 'fast', ["'processing_mode'", '"roofline"']),
  (('mem1', 'GiB'), -1, ["'mem1.GiB'", '-1', '>= 0']),
  (('mem1', 'MB_efficiency'), [[0, 0.5], [10, 0.9]],
   ["'mem1.MB_efficiency'", 'strictly decreasing']),
  (('matrix', 'float16', 'gflops_efficiency'), [[128, 1.5], [0, 0.1]],
   ["'matrix.float16.gflops_efficiency'", '[128, 1.5]', '<= 1']),
  (('matrix', 'float16', 'gflops_efficiency'), [[128, 0.9], [1, 0.1]],
   ['ending at 0']),
  (('networks',), [], ["'networks'", 'non-empty']),
  (('networks', 0, 'efficiency'), 0, ["'networks[0].efficiency'", '> 0']),
  (('networks', 1, 'processor_usage'), 1.0, ["'networks[1].processor_usage'",
                                             '< 1']),
  (('networks', 0, 'ops', 'p2p'), [1.0, 0], ["'networks[0].ops.p2p'",
                                            'null']),
  (('matrix', 'int4'), {'tflops': 1, 'gflops_efficiency': [[0, 1]]},
   ["'matrix.int4'", 'datatype keys']),
])
def test_system_errors(path, value, fragments):
  cfg = copy.deepcopy(SYS)
  node = cfg
  for key in path[:-1]:
    node = node[key]
  node[path[-1]] = value
  msg = message(System, cfg, 'sys.json')
  assert msg.startswith('sys.json: '), msg
  for frag in fragments:
    assert frag in msg, msg


def test_system_missing_op():
  cfg = copy.deepcopy(SYS)
  del cfg['networks'][0]['ops']['all_reduce']
  assert "missing field 'networks[0].ops.all_reduce'" in message(System, cfg)


def compile_msg(exe_cfg, app_cfg=APP, sys_cfg=SYS):
  model = Llm(Llm.Application(app_cfg))
  return message(model.compile, System(sys_cfg), Llm.Execution.from_json(exe_cfg))


def test_network_index_out_of_range():
  msg = compile_msg(exe_with(data_par_net=2))
  assert "'data_par_net' = 2" in msg and '2 network tier(s)' in msg


def test_datatype_not_in_system():
  msg = compile_msg(exe_with(datatype='bfloat16'))
  assert "'datatype' = \"bfloat16\"" in msg and '"float16"' in msg


def test_tensor_par_must_divide_model():
  app = dict(APP, attn_heads=162, attn_size=158)
  msg = compile_msg(exe_with(), app)
  assert "'tensor_par' = 4" in msg and 'attn_heads (162)' in msg


def test_sequence_parallel_needs_divisible_tokens():
  app = dict(APP, seq_size=2049)
  msg = compile_msg(exe_with(microbatch_size=1, batch_size=3072), app)
  assert "'tensor_par' = 4" in msg and 'microbatch_size * seq_size = 2049' in msg


def test_dataframe_rows_are_validated():
  frame = pd.DataFrame([EXE, exe_with(microbatch_size=5)])
  msg = message(evaluate, APP, SYS, frame)
  assert 'execution 1' in msg and "'microbatch_size'" in msg
  frame = pd.DataFrame([EXE]).drop(columns=['training'])
  assert "missing column 'training'" in message(evaluate, APP, SYS, frame)
  frame = pd.DataFrame([exe_with(datatype='fp16')])
  assert "row 0: field 'datatype' = \"fp16\"" in message(evaluate, APP, SYS, frame)


def test_llm_execution_positional_values():
  values = [EXE[k] for k in Llm.Execution.fields()]
  assert Llm.Execution(*values).get_json() == EXE
  assert 'takes 23 values' in message(Llm.Execution, *values[:5])


def test_system_typo_gets_a_did_you_mean():
  # memory_reserve is optional and absent from the file: the suggestion
  # comes from the registry's system fields.
  cfg = dict(SYS, memory_reserv={})
  assert message(System, cfg, 'sys.json') == (
    "sys.json: unknown field 'memory_reserv' (did you mean "
    "'memory_reserve'?)")
