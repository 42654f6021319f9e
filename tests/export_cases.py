"""Executions the export tests share (tests/test_export.py and
tests/test_export_frameworks.py): hand-written ones and the top executions
of small searches, resolved as ``calculon llm`` resolves them."""

import functools

from conftest import repo


def app(name):
  from calculon import io
  return io.load_application(repo('models', f'{name}.json'))


def system(name):
  from calculon import io
  return io.load_system(repo('systems', f'{name}.json'))


def resolved(model, framework, **fields):
  """A hand-written execution of ``model`` (fields over a small default),
  resolved under ``framework``."""
  from calculon.config import Execution
  from calculon.frameworks import resolve_execution
  base = dict(num_procs=512, tensor_par=8, pipeline_par=1, data_par=64,
              tensor_par_net=0, pipeline_par_net=1, data_par_net=1,
              batch_size=512, microbatch_size=1, datatype='bfloat16',
              fused_activation=True, activation_recompute='none',
              pipeline_interleaving=1, tensor_par_comm_type='rs_ag',
              tensor_par_overlap='none', seq_par_ag_redo=False,
              data_par_overlap=True, weight_offload=False,
              activations_offload=False, optimizer_offload=False,
              training=True, framework=framework)
  base.update(fields)
  if 'data_par_overlap' not in fields and base['pipeline_par'] > 1 and \
      framework in ('torchtitan', 'deepspeed-zero'):
    base['data_par_overlap'] = False   # their pipelines reduce at the end
  if 'seq_par_ag_redo' not in fields:   # what the modern presets require
    base['seq_par_ag_redo'] = base['tensor_par_comm_type'] == 'rs_ag' and \
      base['activation_recompute'] != 'full'
  if 'data_par_sharding' not in fields and 'optimizer_sharding' not in fields:
    base['optimizer_sharding'] = True
  exe = Execution.from_dict(base, '<test>')
  return resolve_execution(app(model), exe, framework, '<test>')[0]


def inp(model, framework, offloaded_layers=None, **fields):
  """An ExportInput of :func:`resolved`."""
  from calculon.export import ExportInput
  return ExportInput(exe=resolved(model, framework, **fields),
                     app=app(model), source='<test>',
                     offloaded_layers=offloaded_layers)


#: (model, system, framework preset, GPUs, batch, datatype, limits):
#: modern dense and MoE models on H100 and GB200 under the two presets,
#: narrowed to a few seconds each.
SEARCHES = (
  ('llama3-70B', 'h100_sxm_80g', 'megatron-core', 512, 512, 'bfloat16',
   {'tp': ((4, 8),), 'pp': ((1, 4),), 'mbs': ((1, 2),)}),
  ('llama3-70B', 'gb200_nvl72', 'torchtitan', 512, 512, 'bfloat16',
   {'tp': ((4, 4),), 'pp': ((1, 4),), 'mbs': ((1, 2),)}),
  ('mixtral-8x7B', 'h100_sxm_80g', 'torchtitan', 256, 512, 'bfloat16',
   {'tp': ((1, 2),), 'pp': ((1, 2),), 'mbs': ((1, 1),)}),
  ('mixtral-8x7B', 'gb200_nvl72', 'megatron-core', 256, 512, 'float8',
   {'tp': ((1, 2),), 'pp': ((1, 2),), 'mbs': ((1, 1),)}),
)


@functools.lru_cache(maxsize=None)
def search(index, top=3):
  """(app, system, [resolved Execution of each of the top executions]) of
  search :data:`SEARCHES` [index] (narrowed to a few seconds)."""
  from calculon.config import Execution
  from calculon.frameworks import resolve_execution
  from calculon.llm import search as S
  from calculon.llm.results import best_to_output
  from calculon.search import SearchSpec
  model, sysname, fw, n, batch, dt, limits = SEARCHES[index]
  a, s = app(model), system(sysname)
  spec = SearchSpec(a, s, n, batch, dt, [True], framework=fw,
                    space='modern', limits=limits)
  result = S.optimal_executions(spec, top, 1, None, None)
  out = best_to_output(spec, result)
  exes = []
  for key, entry in out.items():
    exe = Execution.from_dict(dict(entry['framework']['resolved']),
                              f'<search {index} #{key}>')
    exes.append(resolve_execution(a, exe, None, f'<search {index}>')[0])
  return a, s, exes
