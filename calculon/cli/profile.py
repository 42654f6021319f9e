"""``calculon profile`` (measure this machine into a system file) and
``calculon profile-step`` (a real training step against the prediction)."""

import os

from calculon.cli.main import EXIT_INFEASIBLE, EXIT_OK, positive_int


def _nonneg_float(arg):
  import argparse
  try:
    value = float(arg)
  except ValueError:
    raise argparse.ArgumentTypeError(f'{arg!r} is not a number') from None
  if not value >= 0:
    raise argparse.ArgumentTypeError(f'{value} must be >= 0')
  return value


def _common(p):
  p.add_argument('--device', default='cpu', choices=('cpu', 'cuda'),
                 help='what to measure: the CPU (default) or CUDA GPUs')
  p.add_argument('--backend', default='auto',
                 choices=('auto', 'torch', 'numpy'),
                 help='torch, or numpy (BLAS) + multiprocessing on the CPU; '
                 'auto: torch when installed (default)')
  p.add_argument('--report', metavar='DIR', default=None,
                 help='write the report (markdown, CSV, PNG, JSON) to DIR')
  p.add_argument('-q', '--quiet', action='store_true',
                 help='no progress bar (shown only on a terminal anyway)')
  p.add_argument('--threads', type=positive_int, default=None,
                 help='CPU threads per process (default: cores / processes)')
  p.add_argument('--clock', default='wall', choices=('wall', 'cpu'),
                 help='wall time (default), or CPU time of the process (CPU '
                 'only; on a machine shared with other jobs, with --threads '
                 '1)')


def _runner_options(p):
  p.add_argument('--timeout', type=_nonneg_float, default=None, metavar='S',
                 help='seconds per benchmark try (default 300; 60 with '
                 '--quick)')
  p.add_argument('--retry-delay', type=_nonneg_float, default=None,
                 metavar='S', help='seconds between tries (default 5; 1 with '
                 '--quick)')
  p.add_argument('--repeats', type=positive_int, default=None,
                 help='independent runs per benchmark, the best kept '
                 '(default 3; 1 with --quick)')
  p.add_argument('--dtypes', default=None,
                 help='comma-separated datatypes to measure (default: those '
                 'the device supports, float32 only with --quick on a CPU)')


def add_parsers(sp):
  p = sp.add_parser(
    'profile', help='measure this machine into a system file',
    description='Run microbenchmarks (GEMM, vector ops, memory bandwidth, '
    'collectives among --procs local processes), each in its own '
    'subprocess with a timeout and three tries, and write a system file '
    'that calculon llm and the searches accept. See docs/profile.md.')
  p.add_argument('-o', '--output', default=None, metavar='SYSTEM.json',
                 help='system file to write (default: print it)')
  p.add_argument('--procs', type=positive_int, default=1,
                 help='local processes (GPUs) of the node; each profiled '
                 'processor is one of them (default 1)')
  p.add_argument('--quick', action='store_true',
                 help='fewer sizes and runs: under a minute on a small CPU')
  p.add_argument('--smoke', action='store_true',
                 help='every benchmark at tiny sizes: checks the setup in '
                 'seconds (the numbers are overheads, not a profile)')
  p.add_argument('--measure-kernels', action='store_true',
                 help="instead: time GEMMs, causal attention and NCCL "
                 "collectives with torch into --system's measured section "
                 '(written to -o; see docs/profile.md)')
  p.add_argument('--system', default=None, metavar='BASE.json',
                 help='with --measure-kernels: the system file whose other '
                 'fields are kept')
  _common(p)
  _runner_options(p)
  p.set_defaults(func=run_profile_cmd)

  q = sp.add_parser(
    'profile-step', help='measure a real training step against the '
    'prediction',
    description='Build the application\'s transformer blocks in PyTorch with '
    'the execution\'s microbatch, sequence, recomputation and data '
    'parallelism, run training steps, measure each layer\'s forward and '
    'backward time and memory, and compare with calculon\'s prediction on '
    'SYSTEM (default: a fresh profile of this machine). Needs torch.')
  q.add_argument('application', help='application JSON (model shape)')
  q.add_argument('execution', help='execution JSON')
  q.add_argument('system', nargs='?', default=None,
                 help='system JSON (default: profile this machine first)')
  q.add_argument('--steps', type=positive_int, default=3,
                 help='measured training steps after the warm-up '
                 '(default 3)')
  q.add_argument('--warmup', type=positive_int, default=1,
                 help='warm-up steps (default 1)')
  q.add_argument('--dropout', type=_nonneg_float, default=0.0,
                 help='dropout probability of the dropout layers (default '
                 '0, as modern LLMs train; see docs/profile.md)')
  q.add_argument('--quick', action='store_true',
                 help='the fresh profile (no SYSTEM given) is a quick one')
  q.add_argument('--step-timeout', type=_nonneg_float, default=3600.0,
                 metavar='S', help='seconds the training ranks may take '
                 '(default 3600); then they are killed')
  q.add_argument('--save-system', default=None, metavar='SYSTEM.json',
                 help='also write the fresh profile\'s system file here')
  _common(q)
  _runner_options(q)
  q.set_defaults(func=run_profile_step_cmd)


def _dtypes(args):
  if args.dtypes is None:
    return None
  return [d.strip() for d in args.dtypes.split(',') if d.strip()]


def _profile(args, procs, log):
  from calculon.profile.machine import run_profile
  return run_profile(device=args.device, procs=procs, quick=args.quick,
                     smoke=getattr(args, 'smoke', False),
                     backend=args.backend, dtypes=_dtypes(args),
                     timeout_s=args.timeout, retry_delay_s=args.retry_delay,
                     repeats=args.repeats, quiet=args.quiet, log=log,
                     threads=args.threads, clock=args.clock)


def run_profile_cmd(args, log):
  if args.measure_kernels:
    return run_measure_kernels(args, log)
  if args.system is not None:
    from calculon.errors import ConfigError
    raise ConfigError('--system is read only with --measure-kernels',
                      field='--system', value=args.system)
  from calculon.profile.machine import system_text
  from calculon.profile.outputs import (
    check_output_dir, check_output_file, write_atomic)
  from calculon.profile.profile_report import (
    summary_lines, write_profile_report)
  if args.output is not None:
    check_output_file(args.output, ('.json',), '-o/--output')
  if args.report is not None:
    check_output_dir(args.report)
  result = _profile(args, args.procs, log)
  for line in summary_lines(result):
    log.info(line)
  if args.report is not None:
    write_profile_report(result, args.report)
    log.info(f'Report: {os.path.join(args.report, "profile.md")}')
  if args.output is None:
    print(system_text(result.system), end='')
  else:
    write_atomic(args.output, system_text(result.system))
    log.info(f'System file: {args.output}')
  return EXIT_OK


def run_measure_kernels(args, log):
  """``calculon profile --measure-kernels``: --system with a ``measured``
  section timed on this machine (:mod:`calculon.profile.measure_kernels`)
  written to -o."""
  from calculon.errors import ConfigError
  from calculon.hardware import System
  from calculon.io import read_json_file
  from calculon.kernels import import_kernels
  from calculon.profile.outputs import check_output_file, write_atomic
  if args.system is None:
    raise ConfigError('--measure-kernels needs --system BASE.json (the '
                      'system file whose other fields are kept)',
                      field='--system', value=None)
  if args.output is None:
    raise ConfigError('--measure-kernels needs -o OUT.json (the system file '
                      'to write)', field='-o', value=None)
  for option, given in (('--procs', args.procs != 1), ('--smoke', args.smoke),
                        ('--report', args.report is not None),
                        ('--dtypes', args.dtypes is not None),
                        ('--backend numpy', args.backend == 'numpy'),
                        ('--clock cpu', args.clock == 'cpu'),
                        ('--timeout', args.timeout is not None),
                        ('--retry-delay', args.retry_delay is not None),
                        ('--repeats', args.repeats is not None)):
    if given:
      raise ConfigError(f'{option}: not an option of --measure-kernels (it '
                        'times with torch on --device, NCCL over every '
                        'visible GPU, every datatype the device runs)',
                        field=option.split()[0], value=option)
  check_output_file(args.output, ('.json',), '-o/--output')
  if os.path.exists(args.output) and os.path.exists(args.system) and \
      os.path.samefile(args.output, args.system):
    raise ConfigError(f'{args.output}: -o is the --system file; write the '
                      'measured file elsewhere', source=args.output,
                      field='-o', value=args.output)
  from calculon.profile.timing import have_torch
  if not have_torch():
    raise ConfigError("--measure-kernels needs torch: pip install -e "
                      "'.[profile]'", field='--measure-kernels', value=None)
  if args.device == 'cuda':
    from calculon.profile.machine import check_cuda
    check_cuda(1)
  base = read_json_file(args.system)
  System(base, args.system)  # the base must be a valid system
  base.pop('measured', None)
  from calculon.profile.measure_kernels import measured_section
  section = measured_section(args.device, quick=args.quick, log=log,
                             threads=args.threads)
  src = section['source']
  skipped = src.get('skipped', {})
  parts = [f"GEMM ({', '.join(section['gemm']['latency_ms'])})"]
  if 'attention' in section:
    parts.append('context attention')
  if 'nccl' in section:
    nccl = section['nccl']
    parts.append(f"NCCL ({', '.join(nccl['latency_ms'])}, "
                 f"{min(nccl['gpus'])}-{max(nccl['gpus'])} GPUs)")
  note = (f"Measured kernels (measured): {', '.join(parts)} timed on "
          f"{src['device']} with torch {src['package_version']}"
          + (f", CUDA {src['cuda']}" if src.get('cuda') else '') +
          f" on {src['date']}"
          + ('; skipped: ' + '; '.join(f'{k}: {v}' for k, v in
                                       skipped.items()) if skipped else '') +
          '; the curves and the network model price what the tables do not '
          'cover. Produced by: calculon profile --measure-kernels '
          + ('--quick ' if args.quick else '') +
          f'--device {args.device} --system {args.system} -o {args.output}')
  data = import_kernels.with_measured(base, section, note)
  System(data, args.output)  # what is written reads back
  write_atomic(args.output, import_kernels.system_text(data))
  for key, why in skipped.items():
    log.info(f'Skipped {key}: {why}')
  log.info(f"{args.output}: measured {', '.join(parts)} on {src['device']}")
  return EXIT_OK


def run_profile_step_cmd(args, log):
  from calculon import io
  from calculon.hardware import System
  from calculon.llm import Llm
  from calculon.profile.machine import resolve_backend, system_text
  from calculon.profile.outputs import (
    check_output_dir, check_output_file, write_atomic)
  from calculon.profile import step
  from calculon.profile.step_report import (
    compare, report_lines, write_step_report)
  if args.report is not None:
    check_output_dir(args.report)
  if args.save_system is not None:
    check_output_file(args.save_system, ('.json',), '--save-system')
  app = Llm.Application(io.read_json_file(args.application), args.application)
  exe = Llm.Execution.from_json(io.read_json_file(args.execution),
                                args.execution)
  plan = step.StepPlan.from_configs(app.config, exe.config, args.device,
                                    args.steps, args.warmup, args.dropout,
                                    source=args.execution,
                                    threads=args.threads, clock=args.clock)
  from calculon.profile.machine import check_clock
  check_clock(args.clock, args.device)
  if resolve_backend(args.backend, args.device, log) != 'torch':
    from calculon.errors import ConfigError
    raise ConfigError('profile-step needs torch: pip install -e '
                      "'.[profile]'", field='--backend', value=args.backend)
  if args.device == 'cuda':
    from calculon.profile.machine import check_cuda
    check_cuda(exe.num_procs)
  if args.system is not None:
    system_cfg = io.read_json_file(args.system)
    system = System(system_cfg, args.system)
    system_source = args.system
  else:
    log.info(f'No system file given: profiling this machine first '
             f'({exe.num_procs} process(es){", quick" if args.quick else ""})')
    result = _profile(args, exe.num_procs, log)
    for line in summary_lines_short(result):
      log.info(line)
    system_cfg = result.system
    system = System(system_cfg, '<fresh profile>')
    system_source = 'a fresh profile of this machine'
    if args.save_system is not None:
      write_atomic(args.save_system, system_text(system_cfg))
  model = Llm(app, log)
  try:
    model.compile(system, exe)
    model.run(system)
  except Llm.Error as err:
    print(f'ERROR: {err}')
    return EXIT_INFEASIBLE
  log.info(f'Running {plan.describe()}')
  try:
    measured = step.run_step(plan, timeout_s=args.step_timeout,
                             quiet=args.quiet, report_dir=args.report)
  except step.StepFailed as err:
    print(f'ERROR: {err}')
    return EXIT_INFEASIBLE
  comparison = compare(model, measured, plan, system_source)
  for line in report_lines(comparison):
    log.info(line)
  if args.report is not None:
    write_step_report(comparison, args.report)
    log.info(f'Report: {os.path.join(args.report, "step.md")}')
  return EXIT_OK


def summary_lines_short(result):
  from calculon.profile.profile_report import summary_lines
  return [ln for ln in summary_lines(result)
          if not ln.startswith(('all_', 'reduce_', 'p2p', 'op ', 'Collect'))]
