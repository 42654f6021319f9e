#!/usr/bin/env python3
"""Closed loop on this machine: profile it, run a real training step, and
compare with calculon's prediction on the profiled system.

Usage (from the repository root; needs torch: pip install -e '.[profile]'):
  python benchmarks/profile_closed_loop.py [--quick-profile] [--steps N]
      [--dp 1,2] [--out DIR] [--update-doc docs/profile.md]

For each DP degree: ``calculon profile --procs DP`` writes a system file,
then ``calculon profile-step`` runs a small GPT (4 blocks, hidden 512,
sequence 512, 8 heads, microbatch 4, float32, no recomputation, dropout 0;
DP ranks over gloo) and compares per layer and per step.  Also times
``calculon profile --quick`` (the under-a-minute goal) and checks that
``calculon llm`` accepts its file.  Prints a markdown table; with
``--update-doc`` it replaces the table between the markers
``<!-- closed-loop:begin -->`` and ``<!-- closed-loop:end -->``.

Goals (docs/profile.md): step time within 20 %, each GEMM layer within
30 %, ``profile --quick`` under 60 s.  Errors are 100 (1 - predicted /
measured) %.  Other processes on the machine slow the measurement: the
load average is printed with the results.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
APP = {'hidden': 512, 'feedforward': 2048, 'seq_size': 512, 'attn_heads': 8,
       'attn_size': 64, 'num_blocks': 4}
MBS = 4
GEMMS = ('AttnBlock_Query', 'AttnBlock_Key', 'AttnBlock_Value',
         'AttnBlock_Multihead_Key_Query', 'AttnBlock_Multihead_Attn',
         'AttnBlock_MLP', 'MlpBlock_Mlp1', 'MlpBlock_Mlp2')
SHORT = {'AttnBlock_Query': 'Q', 'AttnBlock_Key': 'K', 'AttnBlock_Value': 'V',
         'AttnBlock_Multihead_Key_Query': 'QK^T',
         'AttnBlock_Multihead_Attn': 'AV', 'AttnBlock_MLP': 'proj',
         'MlpBlock_Mlp1': 'mlp1', 'MlpBlock_Mlp2': 'mlp2'}


def execution(dp):
  with open(os.path.join(ROOT, 'examples',
                         '3072_t4_p64_d12_mbs4_full.json')) as fd:
    exe = json.load(fd)
  exe.update(num_procs=dp, tensor_par=1, pipeline_par=1, data_par=dp,
             tensor_par_net=0, pipeline_par_net=0, data_par_net=0,
             batch_size=MBS * dp, microbatch_size=MBS, datatype='float32',
             fused_activation=False, activation_recompute='none',
             optimizer_sharding=False, tensor_par_comm_type='ar',
             seq_par_ag_redo=False, data_par_overlap=False)
  return exe


def calculon(*args):
  env = dict(os.environ)
  env['PYTHONPATH'] = ROOT + os.pathsep + env.get('PYTHONPATH', '')
  start = time.perf_counter()
  res = subprocess.run([sys.executable, '-m', 'calculon', *map(str, args)],
                       cwd=ROOT, capture_output=True, text=True, env=env)
  wall = time.perf_counter() - start
  if res.returncode != 0:
    sys.exit(f'calculon {" ".join(map(str, args))} failed '
             f'({res.returncode}):\n{res.stdout}\n{res.stderr}')
  return res, wall


def load():
  return '/'.join(f'{x:.1f}' for x in os.getloadavg())


def main():
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--quick-profile', action='store_true',
                  help='profile with --quick (default: the full profile)')
  ap.add_argument('--steps', type=int, default=5)
  ap.add_argument('--dp', default='1,2')
  ap.add_argument('--out', default=None, help='keep reports here')
  ap.add_argument('--update-doc', default=None)
  ap.add_argument('--clock', default='wall', choices=('wall', 'cpu'),
                  help='clock of both commands (cpu: process CPU time, for a '
                  'machine shared with other jobs; use with --threads 1)')
  ap.add_argument('--threads', type=int, default=None,
                  help='CPU threads per process for both commands (default: '
                  'cores / DP)')
  args = ap.parse_args()
  out = args.out or tempfile.mkdtemp(prefix='calculon-closed-loop-')
  os.makedirs(out, exist_ok=True)
  app_path = os.path.join(out, 'gpt_4x512.json')
  with open(app_path, 'w') as fd:
    json.dump(APP, fd)

  rows = []
  load_start = load()
  quick_sys = os.path.join(out, 'quick.json')
  _, quick_wall = calculon('profile', '--quick', '-q', '-o', quick_sys)
  exe1 = os.path.join(out, 'exe_dp1.json')
  with open(exe1, 'w') as fd:
    json.dump(execution(1), fd)
  llm, _ = calculon('llm', app_path, exe1, quick_sys, '-')
  print(f'calculon profile --quick: {quick_wall:.1f} s; calculon llm accepts '
        f'it: {"batch time" in llm.stdout}', flush=True)

  for dp in [int(x) for x in args.dp.split(',')]:
    exe_path = os.path.join(out, f'exe_dp{dp}.json')
    with open(exe_path, 'w') as fd:
      json.dump(execution(dp), fd)
    sys_path = os.path.join(out, f'system_dp{dp}.json')
    threads = (['--threads', args.threads] if args.threads else []) + \
      ['--clock', args.clock]
    flags = (['--quick'] if args.quick_profile else []) + threads
    _, prof_wall = calculon('profile', '--procs', dp, '-q', '-o', sys_path,
                            '--report', os.path.join(out, f'profile_dp{dp}'),
                            *flags)
    report = os.path.join(out, f'step_dp{dp}')
    calculon('profile-step', app_path, exe_path, sys_path, '--steps',
             args.steps, '--report', report, '-q', *threads)
    with open(os.path.join(report, 'step.json')) as fd:
      c = json.load(fd)
    gemm = {r['layer']: r['err_total_pct'] for r in c['layers']
            if r['layer'] in GEMMS}
    rows.append({'dp': dp, 'profile_s': prof_wall, 'meas': c['step_s'],
                 'pred': c['stats']['total_time'], 'err': c['step_err_pct'],
                 'gemm': gemm, 'max_gemm': max(abs(v) for v in gemm.values()),
                 'threads': c['system_info'].get('threads_per_rank')})
    print(f'DP {dp}: step {c["step_s"]:.3f} s measured, '
          f'{c["stats"]["total_time"]:.3f} s predicted, error '
          f'{c["step_err_pct"]:+.1f}%; max |GEMM error| '
          f'{rows[-1]["max_gemm"]:.1f}%', flush=True)

  mode = 'quick' if args.quick_profile else 'full'
  table = [
    f'Measured {time.strftime("%Y-%m-%d")} on this machine ('
    f'{os.cpu_count()} CPUs; load average {load_start} at the start, '
    f'{load()} at the end), `python benchmarks/profile_closed_loop.py'
    f'{" --quick-profile" if args.quick_profile else ""}'
    f'{f" --threads {args.threads}" if args.threads else ""}'
    f'{" --clock cpu" if args.clock == "cpu" else ""} --steps '
    f'{args.steps}`: `calculon profile --quick` took {quick_wall:.1f} s. '
    f'Each DP row: a {mode} profile with `--procs DP`, then '
    f'`profile-step` (fastest of {args.steps} steps). Error = 1 - '
    'predicted / measured.', '',
    '| DP | threads/rank | profile (s) | step measured (s) | predicted (s) '
    '| step error | ' + ' | '.join(SHORT[g] for g in GEMMS) +
    ' | largest GEMM error |',
    '|---|---|---|---|---|---|' + '---|' * len(GEMMS) + '---|']
  for r in rows:
    table.append(
      f"| {r['dp']} | {r['threads']} | {r['profile_s']:.0f} | "
      f"{r['meas']:.3f} | {r['pred']:.3f} | {r['err']:+.1f}% | " +
      ' | '.join(f"{r['gemm'][g]:+.0f}%" for g in GEMMS) +
      f" | {r['max_gemm']:.0f}% |")
  text = '\n'.join(table)
  print()
  print(text)
  print(f'\nReports: {out}')
  if args.update_doc:
    with open(args.update_doc) as fd:
      doc = fd.read()
    begin, end = '<!-- closed-loop:begin -->', '<!-- closed-loop:end -->'
    head, rest = doc.split(begin)
    _, tail = rest.split(end)
    with open(args.update_doc + '.tmp', 'w') as fd:
      fd.write(head + begin + '\n' + text + '\n' + end + tail)
    os.replace(args.update_doc + '.tmp', args.update_doc)


if __name__ == '__main__':
  main()
