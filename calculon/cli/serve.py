"""``calculon serve`` and ``calculon serve-search``: price a serving
deployment, or search the best one under service targets.

Every input is checked before any work (one line naming the file, field
and value; exit status 2); an infeasible deployment (its weights and one
sequence's KV cache do not fit, a rate it cannot serve) prints the reason
and exits 1.  The model is imported by the handlers.
"""

from calculon import outputs
from calculon.cli.main import EXIT_INFEASIBLE, EXIT_OK, positive_int
from calculon.errors import ConfigError


def add_parsers(sp):
  p = sp.add_parser(
    'serve', help='price one LLM serving deployment: TTFT, TPOT, '
    'throughput, KV-cache capacity, memory',
    description='Price one serving deployment (docs/serving.md): TTFT, '
    'TPOT, request latency, output tokens/s per GPU and per user, input '
    'tokens/s, the concurrency the KV cache holds, and memory per GPU.')
  p.add_argument('application', help='application JSON (model shape)')
  p.add_argument('deployment', help='deployment JSON '
                 '(docs/reference/deployments.md)')
  p.add_argument('system', help='system JSON')
  p.add_argument('stats', nargs='?', default='-',
                 help='output: - for a readable report (default), or a '
                 '.json file of every figure')
  p.set_defaults(func=_serve)
  s = sp.add_parser(
    'serve-search', help='search serving deployments for the most output '
    'tokens/s per GPU under TTFT/TPOT targets',
    description='Search parallelism, concurrency, aggregated vs '
    'disaggregated and the prefill/decode split for the most output '
    'tokens/s per GPU that meets the targets (docs/serving.md).')
  s.add_argument('application', help='application JSON')
  s.add_argument('system', help='system JSON')
  s.add_argument('--gpus', type=positive_int, required=True, metavar='N')
  s.add_argument('--isl', type=positive_int, required=True, metavar='I',
                 help='input tokens per request')
  s.add_argument('--osl', type=positive_int, required=True, metavar='O',
                 help='output tokens per request')
  s.add_argument('--ttft', type=_positive_ms, default=None, metavar='MS',
                 help='TTFT target (ms)')
  s.add_argument('--tpot', type=_positive_ms, default=None, metavar='MS',
                 help='TPOT target (ms)')
  s.add_argument('--framework', default='trtllm', metavar='F',
                 help='serving framework preset: trtllm (default), vllm, '
                 'sglang')
  s.add_argument('--datatype', default='bfloat16', metavar='D',
                 help='weight datatype: bfloat16 (default), float16, '
                 'float8, float4, int4')
  s.add_argument('--kv-datatype', default=None, metavar='D',
                 help='KV-cache datatype (default: the activations\')')
  s.add_argument('--no-disaggregated', action='store_true',
                 help='aggregated deployments only')
  s.add_argument('-o', '--output', default=None, metavar='DEP.json',
                 help='write the best deployment here')
  s.add_argument('-t', '--top', type=positive_int, default=5, metavar='N',
                 help='list the N best (default 5)')
  s.add_argument('--plot', default=None, metavar='PNG',
                 help='draw tokens/s per GPU against tokens/s per user, '
                 'the Pareto front marked')
  s.set_defaults(func=_search)


def _positive_ms(arg):
  import argparse
  try:
    value = float(arg)
  except ValueError:
    raise argparse.ArgumentTypeError(f'{arg!r} is not a number') from None
  if not value > 0:
    raise argparse.ArgumentTypeError(f'{arg} must be > 0 (milliseconds)')
  return value


def _num(x):
  import numpy as np
  x = np.asarray(x)
  return x.item() if x.size == 1 else x.tolist()


def figures_json(res):
  """The figures of :func:`calculon.serving.price.price` as JSON
  (scalars; the steady state's step functions are left out)."""
  out = {}
  for k, v in res.items():
    if callable(v):
      continue
    if isinstance(v, dict):
      out[k] = figures_json(v)
    elif isinstance(v, (str, bool)):
      out[k] = v
    else:
      out[k] = _num(v)
  return out


def report_lines(res, dep):
  """A readable report of one deployment's figures."""
  m = res['memory']
  g = 2 ** 30
  lines = [
    f'framework {dep.framework} ({dep.preset["version"]}), mode {dep.mode}'
    f', TP {dep.tensor_par} PP {dep.pipeline_par} EP {dep.expert_par} '
    f'attention DP {dep.attention_dp}; weights {dep.weight_datatype}, '
    f'activations {dep.activation_datatype}, KV cache '
    f'{dep.kv_cache_datatype}',
    f'workload: isl {dep.isl}, osl {dep.osl}, running sequences '
    f'{_num(res["concurrency"]):.0f} on {_num(res["gpus"])} GPU(s)',
    '',
    f'TTFT                      {_num(res["ttft_ms"]):10.2f} ms',
    f'TPOT (ITL)                {_num(res["tpot_ms"]):10.3f} ms'
    if dep.scheduler_steps == 1 else
    f'TPOT                      {_num(res["tpot_ms"]):10.3f} ms\n'
    f'ITL ({dep.scheduler_steps}-step bursts)      '
    f'{_num(res["itl_ms"]):10.3f} ms',
    f'request latency           {_num(res["latency_ms"]):10.1f} ms',
    f'output tokens/s           {_num(res["output_tokens_per_s"]):10.1f}',
    f'output tokens/s per GPU   '
    f'{_num(res["output_tokens_per_s_per_gpu"]):10.1f}',
    f'output tokens/s per user  '
    f'{_num(res["output_tokens_per_s_per_user"]):10.1f}',
    f'input tokens/s            {_num(res["input_tokens_per_s"]):10.1f}',
    f'max concurrency (KV)      '
    f'{_num(m["max_concurrency"]) * dep.attention_dp:10.0f} sequences of '
    f'{dep.isl + dep.osl} tokens',
  ]
  if 'makespan_ms' in res:
    lines.append(f'{dep.num_requests} requests at once: makespan '
                 f'{_num(res["makespan_ms"]) / 1e3:.2f} s (the drain of '
                 'the batch)')
  lines += [
    '',
    'memory per GPU (GiB):',
    f'  weights                 {_num(m["weights_bytes"]) / g:10.2f}',
    f'  KV cache                {_num(m["kv_cache_bytes"]) / g:10.2f} '
    f'({_num(m["kv_bytes_per_token"]):.0f} B/token, '
    f'{_num(m["kv_tokens"]):.0f} tokens)',
    f'  activations, workspace  {_num(m["activations_bytes"]) / g:10.2f}',
    f'  runtime (CUDA, NCCL)    {_num(m["runtime_bytes"]) / g:10.2f}',
    f'  left free               {_num(m["free_bytes"]) / g:10.2f}',
    f'  capacity                {m["capacity_bytes"] / g:10.2f} '
    f'(memory fraction {_num(m["memory_fraction"]):.3f})',
    '',
    'decode step (ms):']
  parts = res['decode_parts_ms']
  total = 0.0
  for k, v in parts.items():
    lines.append(f'  {k:24s}{_num(v):10.3f}')
    total += _num(v)
  lines.append(f'  {"total":24s}{total:10.3f}')
  return lines


def _serve(args, log):
  from calculon import io
  from calculon.serving import deployment as D
  from calculon.serving.price import price
  if args.stats != '-':
    outputs.check_output_path(args.stats, outputs.JSON_KINDS,
                              what='serve output')
  app = io.load_application(args.application)
  system = io.load_system(args.system)
  dep = D.resolve(D.load(args.deployment), app, system, args.deployment)
  res = price(app, system, dep)
  if not res['feasible']:
    log.info(f'infeasible: {res["reason"]}')
    if args.stats != '-':
      io.write_json_file(figures_json(res), args.stats)
    return EXIT_INFEASIBLE
  if args.stats == '-':
    for line in report_lines(res, dep):
      log.info(line)
  else:
    io.write_json_file(figures_json(res), args.stats)
  return EXIT_OK


def _search(args, log):
  import time
  from calculon import io
  from calculon.config.registry import FIELDS
  from calculon.serving import frameworks
  from calculon.serving.search import pareto, search
  for name, value in (('--framework', args.framework),):
    if value not in frameworks.names():
      raise ConfigError(f'{name} {value!r} is not allowed: one of ' +
                        ', '.join(frameworks.names()))
  allowed = FIELDS['deployment']['weight_datatype'].spec.choices
  if args.datatype not in allowed:
    raise ConfigError(f'--datatype {args.datatype!r} is not allowed: one '
                      'of ' + ', '.join(allowed))
  if args.output:
    outputs.check_output_path(args.output, outputs.JSON_KINDS,
                              what='deployment output', option='--output')
  if args.plot:
    outputs.check_output_path(args.plot, ('.png', '.pdf', '.svg'),
                              what='chart', option='--plot')
  app = io.load_application(args.application)
  system = io.load_system(args.system)
  base = {'framework': args.framework, 'weight_datatype': args.datatype,
          'isl': args.isl, 'osl': args.osl}
  if args.kv_datatype:
    base['kv_cache_datatype'] = args.kv_datatype
  start = time.perf_counter()
  best, points = search(app, system, base, args.gpus, args.ttft, args.tpot,
                        args.top, not args.no_disaggregated)
  took = time.perf_counter() - start
  if args.plot:
    _plot(points, best, args.plot)
  if not best:
    log.info(f'infeasible: no deployment of {args.gpus} GPU(s) meets the '
             f'targets ({len(points)} priced, {took:.1f} s)')
    return EXIT_INFEASIBLE
  log.info(f'{len(points)} deployments priced in {took:.1f} s; best '
           f'{len(best)}:')
  log.info(f'{"mode":14s}{"TP":>4s}{"PP":>4s}{"ADP":>4s}{"P/D":>6s}'
           f'{"conc":>6s}{"TTFT ms":>10s}{"TPOT ms":>9s}{"tok/s/GPU":>11s}'
           f'{"tok/s/user":>11s}')
  for row in best:
    f, r = row['fields'], row['figures']
    pd = (f'{f["prefill_workers"]}/{f["decode_workers"]}'
          if f.get('mode') == 'disaggregated' else '-')
    log.info(f'{f.get("mode", "aggregated"):14s}{f["tensor_par"]:4d}'
             f'{f["pipeline_par"]:4d}{f["attention_dp"]:4d}{pd:>6s}'
             f'{f["concurrency"]:6d}{r["ttft_ms"]:10.1f}{r["tpot_ms"]:9.2f}'
             f'{r["output_tokens_per_s_per_gpu"]:11.1f}'
             f'{r["output_tokens_per_s_per_user"]:11.1f}')
  if args.output:
    out = dict(best[0]['fields'])
    out['name'] = (f'serve-search best for {args.gpus} GPUs, isl '
                   f'{args.isl}, osl {args.osl}')
    out['notes'] = [f'replicas: {best[0]["figures"]["replicas"]}; '
                    f'predicted {best[0]["figures"]["output_tokens_per_s_per_gpu"]:.1f} '
                    'output tokens/s per GPU']
    io.write_json_file(out, args.output)
    log.info(f'wrote {args.output}')
  return EXIT_OK


def _plot(points, best, path):
  import matplotlib
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  from calculon.serving.search import pareto
  fig, ax = plt.subplots(figsize=(6.4, 4.6))
  ok = [(a, b) for a, b, m in points if m]
  no = [(a, b) for a, b, m in points if not m]
  if no:
    ax.scatter([b for _, b in no], [a for a, _ in no], s=8, c='#bbbbbb',
               label='misses the targets')
  if ok:
    ax.scatter([b for _, b in ok], [a for a, _ in ok], s=10, c='#4477aa',
               label='meets the targets')
  front = pareto(points)
  ax.plot([b for _, b in front], [a for a, _ in front], c='#cc3311',
          lw=1.5, label='Pareto front')
  if best:
    r = best[0]['figures']
    ax.scatter([r['output_tokens_per_s_per_user']],
               [r['output_tokens_per_s_per_gpu']], marker='*', s=120,
               c='#ee7733', label='best', zorder=5)
  ax.set_xlabel('output tokens/s per user')
  ax.set_ylabel('output tokens/s per GPU')
  ax.legend(fontsize=8)
  fig.tight_layout()
  import io as _io
  buf = _io.BytesIO()
  fig.savefig(buf, format=path.rsplit('.', 1)[-1])
  plt.close(fig)
  outputs.write_bytes(path, buf.getvalue())
