#!/usr/bin/env python3
"""Start-up benchmark: whole-process time of short commands, this checkout
against a recorded revision (default: main at 2e903c0, before the lazy
imports), measured in the same run; prints a table.

Usage (from the repository root, after the README's set-up):
  python benchmarks/startup.py [--repeat N] [--baseline REV]

The baseline's ``calculon/`` package is extracted with ``git archive REV``
into a temporary folder.  Both versions run the same commands through
``python -m calculon`` with ``PYTHONPATH`` set to their folder, from a
neutral working folder (the current one is not on the path), in the same
Python and environment, interleaved (baseline, current, baseline, ...)
after two warm-up runs each.  A third row runs this checkout with
``OPENBLAS_NUM_THREADS`` set to the number of cores (what OpenBLAS starts
by default, as the baseline does): the effect of the lazy imports alone.
Byte-code caching is on
(``PYTHONDONTWRITEBYTECODE`` is removed from the children's environment),
as in a normal installation: each version compiles its modules once, in
the warm-up.  Times are wall-clock seconds of the whole process (start-up,
imports, work, exit); the table shows the median and the minimum, and the
median CPU time (user + system, every thread: less sensitive to other
load on the machine).  The
last table times the four commands of issue 12 whose output path is bad
(current version only: the baseline runs their whole work first).
"""

import argparse
import io
import os
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASELINE = '2e903c0'


def repo(*parts):
  return os.path.join(ROOT, *parts)


APP = repo('models', 'megatron-1T.json')
EXE = repo('examples', '3072_t4_p64_d12_mbs4_full.json')
SYS = repo('systems', 'a100_80g.json')
HEAVY = ('pandas', 'pyarrow', 'matplotlib', 'dask', 'distributed', 'psutil',
         'yaml', 'tqdm', 'multiprocessing', 'numpy')


def cases(tmp):
  return [
    ('calculon llm (bundled example, report to stdout)',
     ['llm', APP, EXE, SYS, '-']),
    ('calculon llm (bundled example, stats.json)',
     ['llm', APP, EXE, SYS, os.path.join(tmp, 'stats.json')]),
    ('calculon llm-parameter-calculator gpt3-175B',
     ['llm-parameter-calculator', repo('models', 'gpt3-175B.json')]),
    ('calculon --version', ['--version']),
  ]


BAD_OUTPUTS = [
  ('llm-optimal-execution ... /nonexistent/dir/o.json',
   ['llm-optimal-execution', repo('models', 'gpt3-13B.json'), '8', '8',
    'float16', SYS, '/nonexistent/dir/o.json']),
  ('llm ... /nonexistent/s.json',
   ['llm', APP, EXE, SYS, '/nonexistent/s.json']),
  ('llm-all-executions ... /nonexistent/o.csv',
   ['llm-all-executions', repo('models', 'gpt3-13B.json'), '8', '8',
    'float16', SYS, '/nonexistent/o.csv']),
  ('llm ... - --report /proc/x',
   ['llm', APP, EXE, SYS, '-', '--report', '/proc/x']),
]


def extract_baseline(rev, dest):
  """``calculon/`` of git revision ``rev`` into ``dest``."""
  try:
    data = subprocess.run(['git', '-C', ROOT, 'archive', '--format=tar', rev,
                           'calculon'], check=True, capture_output=True).stdout
  except (OSError, subprocess.CalledProcessError) as err:
    sys.exit(f'startup.py: cannot extract revision {rev} with git archive '
             f'(a clone with its history is needed): {err}')
  with tarfile.open(fileobj=io.BytesIO(data)) as tar:
    tar.extractall(dest)


def env_for(code_root, blas_threads=None):
  """The children's environment: byte-code caching on, ``code_root`` on the
  path, ``OPENBLAS_NUM_THREADS`` unset (or ``blas_threads``)."""
  env = {k: v for k, v in os.environ.items()
         if k not in ('PYTHONDONTWRITEBYTECODE', 'PYTHONPATH',
                      'OPENBLAS_NUM_THREADS')}
  env['PYTHONPATH'] = code_root
  if blas_threads:
    env['OPENBLAS_NUM_THREADS'] = str(blas_threads)
  return env


def _cpu():
  use = resource.getrusage(resource.RUSAGE_CHILDREN)
  return use.ru_utime + use.ru_stime


def run(version, args, cwd, cpu=None):
  """(wall seconds, CompletedProcess) of ``python -m calculon ARGS``;
  ``version`` is (name, code root, OpenBLAS threads or None); appends the
  CPU seconds (user + system, all threads) to the list ``cpu``."""
  _, code_root, blas = version
  env = env_for(code_root, blas)
  cpu_start, start = _cpu(), time.perf_counter()
  res = subprocess.run([sys.executable, '-m', 'calculon', *args], cwd=cwd,
                       env=env, capture_output=True, text=True)
  wall = time.perf_counter() - start
  if cpu is not None:
    cpu.append(_cpu() - cpu_start)
  return wall, res


def modules(version, args, cwd):
  """(number of modules imported, heavy packages among them)."""
  _, code_root, blas = version
  env = env_for(code_root, blas)
  res = subprocess.run([sys.executable, '-X', 'importtime', '-m', 'calculon',
                        *args], cwd=cwd, env=env, capture_output=True,
                       text=True)
  names = [line.split('|')[-1].strip() for line in res.stderr.splitlines()
           if line.startswith('import time:') and '|' in line]
  names = [n for n in names if n and n != 'package']
  tops = {n.split('.')[0] for n in names}
  return len(names), [h for h in HEAVY if h in tops]


def check_version(code_root, cwd, want):
  res = subprocess.run([sys.executable, '-c', 'import calculon; '
                        'print(calculon.__file__)'], cwd=cwd,
                       env=env_for(code_root), capture_output=True, text=True)
  got = res.stdout.strip()
  if not got.startswith(want):
    sys.exit(f'startup.py: PYTHONPATH={code_root} imports calculon from '
             f'{got or res.stderr.strip()}, not {want}')


def main():
  ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  ap.add_argument('--repeat', type=int, default=20,
                  help='runs of each command and version (default 20)')
  ap.add_argument('--baseline', default=BASELINE,
                  help=f'git revision compared with (default {BASELINE})')
  args = ap.parse_args()
  with tempfile.TemporaryDirectory(prefix='calculon-startup-') as tmp:
    old_root = os.path.join(tmp, 'baseline')
    work = os.path.join(tmp, 'work')
    os.makedirs(old_root)
    os.makedirs(work)
    extract_baseline(args.baseline, old_root)
    cores = os.cpu_count() or 1
    versions = [(f'main at {args.baseline}', old_root, None),
                ('this checkout', ROOT, None),
                (f'this checkout, OPENBLAS_NUM_THREADS={cores}', ROOT, cores)]
    for _, root, _ in versions[:2]:
      check_version(root, work, os.path.join(root, 'calculon'))
    print(f'Python {sys.version.split()[0]} ({sys.executable}); '
          f'{args.repeat} runs per command and version, interleaved, after 2 '
          'warm-up runs; wall-clock seconds of the whole process.')
    print()
    print('| command | version | median s | min s | CPU s (median) | '
          'modules imported | heavy packages loaded |')
    print('|---|---|---:|---:|---:|---:|---|')
    ratios = []
    for label, cmd in cases(work):
      times = {v[0]: [] for v in versions}
      cpus = {v[0]: [] for v in versions}
      for version in versions:
        for _ in range(2):
          _, res = run(version, cmd, work)
          if res.returncode != 0:
            sys.exit(f'startup.py: {" ".join(cmd)} failed with {version}:\n'
                     f'{res.stderr}')
      for _ in range(args.repeat):
        for version in versions:
          seconds, _ = run(version, cmd, work, cpus[version[0]])
          times[version[0]].append(seconds)
      medians, cpu_medians = [], []
      for version in versions:
        name = version[0]
        n, heavy = modules(version, cmd, work)
        med = statistics.median(times[name])
        medians.append(med)
        cpu_medians.append(statistics.median(cpus[name]))
        print(f'| {label} | {name} | {med:.3f} | {min(times[name]):.3f} | '
              f'{statistics.median(cpus[name]):.3f} | {n} | '
              f'{", ".join(heavy) or "-"} |')
      ratios.append((label, medians[1] / medians[0],
                     cpu_medians[1] / cpu_medians[0],
                     medians[2] / medians[0]))
    print()
    print('| command | this checkout / baseline (wall) | (CPU) | lazy imports '
          'only: OpenBLAS threads as the baseline (wall) |')
    print('|---|---:|---:|---:|')
    for label, ratio, ratio_cpu, ratio_blas in ratios:
      print(f'| {label} | {100 * ratio:.0f} % | {100 * ratio_cpu:.0f} % | '
            f'{100 * ratio_blas:.0f} % |')
    print()
    print('Bad output paths (this checkout): exit status, first line of '
          'stderr, seconds (median of 5)')
    print()
    print('| command | exit | stderr | median s |')
    print('|---|---:|---|---:|')
    for label, cmd in BAD_OUTPUTS:
      runs = [run(versions[1], cmd, work) for _ in range(5)]
      res = runs[0][1]
      line = (res.stderr.strip().splitlines() or [''])[0]
      print(f'| {label} | {res.returncode} | `{line}` | '
            f'{statistics.median(s for s, _ in runs):.3f} |')


if __name__ == '__main__':
  main()
