#!/usr/bin/env python3
"""Search benchmark: prints a table of executions/s, wall time, peak memory,
and whether the best execution re-priced through the single-run API has the
same statistics.

Usage (from the repository root):
  python benchmarks/search.py [--cpus N] [--only a|b] [--repeat K]

(a) the README search: Turing-530B on 5,128 A100s, batch 2,520, -m;
(b) the full GPT-3 175B search on 1,024 A100s, batch 1,536, float16, no -m
    (11,698,528 executions);
(c) the modern space priced exhaustively (--no-prune): Llama 3 8B on 64
    H100s, batch 256 (64,548,576 executions): the engine's raw speed;
(d) the full modern search of Llama 3.1 405B on 16,384 H100s, batch 2,048
    (16M tokens), float8 with Transformer Engine: every TP, PP, CP, DP,
    sharding level, kernel and the rest (0.9 billion executions), with the
    exact branch and bound;
(e) Mixtral 8x22B on 1,024 H100s, batch 1,024, bfloat16: also every EP,
    ETP, dispatcher, overlap and EP tier (27 billion executions);
(f) DeepSeek-V3 on 2,048 H100s, batch 4,096, float8 (100 billion).

Each runs `python -m calculon llm-optimal-execution` in a subprocess; wall
time is the whole command (start-up included); peak memory is the largest
sum of resident memory over the command's process tree, sampled every 10 ms.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
import threading
import time

import psutil

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CASES = {
  'a': ('README search: Turing-530B, 5,128 A100, batch 2,520, -m',
        ['models/turing-530B.json', '5128', '2520', 'float16',
         'systems/a100_80g.json', '-m', '-t', '5']),
  'b': ('GPT-3 175B, 1,024 A100, batch 1,536, full space',
        ['models/gpt3-175B.json', '1024', '1536', 'float16',
         'systems/a100_80g.json', '-t', '5']),
  'c': ('Llama 3 8B, 64 H100, modern space, no pruning',
        ['models/llama3-8B.json', '64', '256', 'bfloat16',
         'systems/h100_sxm_80g_datasheet.json', '-t', '5', '--no-prune']),
  'd': ('Llama 3.1 405B, 16,384 H100, modern space (pruned)',
        ['models/llama3.1-405B.json', '16384', '2048', 'float8',
         'systems/h100_sxm_80g_datasheet.json', '-t', '5']),
  'e': ('Mixtral 8x22B, 1,024 H100, modern space (pruned)',
        ['models/mixtral-8x22B.json', '1024', '1024', 'bfloat16',
         'systems/h100_sxm_80g_datasheet.json', '-t', '5']),
  'f': ('DeepSeek-V3, 2,048 H100, modern space (pruned)',
        ['models/deepseek-v3.json', '2048', '4096', 'float8',
         'systems/h100_sxm_80g_datasheet.json', '-t', '5']),
}


def peak_rss(proc, stop, out):
  peak = 0
  while not stop.is_set():
    try:
      procs = [proc] + proc.children(recursive=True)
      total = sum(p.memory_info().rss for p in procs if p.is_running())
      peak = max(peak, total)
    except psutil.Error:
      pass
    time.sleep(0.01)
  out.append(peak)


def run(key, cpus):
  label, args = CASES[key]
  with tempfile.TemporaryDirectory() as tmp:
    output = os.path.join(tmp, 'best.json')
    cmd = [sys.executable, '-m', 'calculon', 'llm-optimal-execution',
           args[0], *args[1:5], output, *args[5:], '-q']
    if cpus:
      cmd += ['-c', str(cpus)]
    start = time.perf_counter()
    proc = psutil.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT, text=True)
    stop, peak = threading.Event(), []
    sampler = threading.Thread(target=peak_rss, args=(proc, stop, peak))
    sampler.start()
    log = proc.communicate()[0]
    wall = time.perf_counter() - start
    stop.set()
    sampler.join()
    if proc.returncode != 0:
      raise SystemExit(f'{label} failed:\n{log}')
    same = single_run_matches(args[0], args[4], output)
  total = int(re.search(r'Total executions: (\d+)', log).group(1))
  space = re.search(r'Executions in the space: (\d+)', log)
  if space:
    total = int(space.group(1))
  best = float(re.search(r'Best sample rate: ([\d.e+-]+)', log).group(1))
  inner = float(re.search(r'calcs/sec \(([\d.]+) s\)', log).group(1))
  return dict(label=label, executions=total, wall_s=wall, search_s=inner,
              rate=total / wall, peak_mib=peak[0] / 2 ** 20, best=best,
              same=same)


def single_run_matches(app_path, sys_path, output):
  """The best execution priced again through the single-run API has the
  same statistics as the search wrote."""
  sys.path.insert(0, ROOT)
  from calculon import System
  from calculon.io import read_json_file
  from calculon.llm import Llm
  best = read_json_file(output)['0']
  model = Llm(Llm.Application(read_json_file(os.path.join(ROOT, app_path))))
  system = System(read_json_file(os.path.join(ROOT, sys_path)))
  model.compile(system, Llm.Execution.from_json(best['execution']))
  model.run(system)
  return model.get_stats_json() == best['stats']


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument('--cpus', type=int, default=None,
                  help='worker processes (default: calculon default)')
  ap.add_argument('--only', default=None,
                  help='cases to run, e.g. "ab" or "d" (default: all)')
  ap.add_argument('--repeat', type=int, default=1,
                  help='runs per case; the fastest is reported')
  args = ap.parse_args()
  rows = []
  for key in (list(args.only) if args.only else sorted(CASES)):
    runs = [run(key, args.cpus) for _ in range(args.repeat)]
    rows.append(min(runs, key=lambda r: r['wall_s']))
  cores = psutil.cpu_count(logical=False)
  print(f'machine: {cores} physical cores, {psutil.cpu_count()} logical, '
        f'{psutil.virtual_memory().total / 2 ** 30:.0f} GiB; '
        f'python {sys.version.split()[0]}')
  head = (f"{'search':<52} {'executions':>11} {'wall s':>8} {'search s':>9} "
          f"{'exe/s (wall)':>13} {'peak MiB':>9} {'best rate':>12} "
          f"{'single run':>10}")
  print(head)
  print('-' * len(head))
  for r in rows:
    print(f"{r['label']:<52} {r['executions']:>11,} {r['wall_s']:>8.2f} "
          f"{r['search_s']:>9.2f} {r['rate']:>13,.0f} {r['peak_mib']:>9.0f} "
          f"{r['best']:>12.4f} {'same' if r['same'] else 'DIFFERENT':>10}")


if __name__ == '__main__':
  main()
