"""``calculon sweep SPEC OUTPUT``: co-design sweeps (see calculon.sweep).

Exit status: 0 every point done; 1 no point has a feasible execution, or
some points failed (a re-run retries them); 2 bad input (spec, output
folder, scheduler address), or a part that could not be written (saved
elsewhere, the message says where); 130 interrupted (Ctrl-C or SIGTERM; what
completed is written, a re-run resumes).
"""

import argparse

from calculon.cli.main import (
  EXIT_INFEASIBLE, EXIT_INTERRUPTED, EXIT_OK, positive_int)




def _positive_float(arg):
  try:
    value = float(arg)
  except ValueError:
    raise argparse.ArgumentTypeError(f'{arg!r} is not a number') from None
  if not value > 0:
    raise argparse.ArgumentTypeError(f'{value} must be > 0')
  return value


def add_parsers(sp):
  from calculon.sweep import DEFAULT_BATCH_POINTS, DEFAULT_BATCH_S
  p = sp.add_parser(
    'sweep', help='run a co-design sweep (many searches) on dask',
    description='Run the optimal-execution search for every point of a '
    'sweep spec (applications x systems x system variations x processor '
    'counts x batch sizes x datatypes) and write one row per best execution '
    'to a Parquet dataset folder, as points complete. Re-running the same '
    'command skips the points already written. Runs on a local dask cluster '
    'by default, or on an existing one with --scheduler. See docs/sweep.md.')
  p.add_argument('spec', help='sweep spec (.yaml, .yml or .json)')
  p.add_argument('output', help='output folder (e.g. results.parquet): '
                 'part-*.parquet files; read with pandas.read_parquet')
  p.add_argument('--scheduler', metavar='ADDRESS', default=None,
                 help='address of a running dask scheduler '
                 '(tcp://host:8786); default: a local cluster')
  p.add_argument('-w', '--workers', type=positive_int, default=None,
                 metavar='N',
                 help='local worker processes (default: physical cores; '
                 '1 runs in this process); not with --scheduler')
  p.add_argument('--batch-points', type=positive_int,
                 default=DEFAULT_BATCH_POINTS, metavar='N',
                 help='write a part every N completed points (default '
                 f'{DEFAULT_BATCH_POINTS}) ...')
  p.add_argument('--batch-seconds', type=_positive_float,
                 default=DEFAULT_BATCH_S, metavar='S',
                 help=f'... or when a result has waited S seconds (default '
                 f'{DEFAULT_BATCH_S:g})')
  p.add_argument('--framework', metavar='NAME', default=None,
                 help="search every point under this framework preset (as "
                 "the spec's search.framework; calculon frameworks lists "
                 'them)')
  p.add_argument('-n', '--dry-run', action='store_true',
                 help='validate the spec and count the points (total, done, '
                 'to run, executions) without running anything')
  p.add_argument('-q', '--quiet', action='store_true',
                 help='no progress bar (shown only on a terminal)')
  p.set_defaults(func=run)


def run(args, log):
  from calculon import outputs
  from calculon.errors import ConfigError
  from calculon.sweep import load_spec, plan, run_sweep
  outputs.check_output_path(args.output, want_dir=True, what='sweep output')
  if args.scheduler and args.workers:
    raise ConfigError('--workers sets the size of the local cluster; with '
                      '--scheduler the workers are those of that cluster',
                      source='--workers', value=args.workers)
  spec = load_spec(args.spec)
  if args.framework is not None:
    import dataclasses
    from calculon import frameworks
    frameworks.load(args.framework, source='--framework')
    spec.search = dataclasses.replace(spec.search, framework=args.framework)
  if args.dry_run:
    from calculon.sweep.runner import space_sizes
    points, done = plan(spec, args.output)
    todo = [p for p in points if p.id not in done]
    log.info(f'Sweep {spec.source}: {len(points)} points '
             f'({spec.shape_text()})')
    log.info(f'Already done in {args.output}: {len(points) - len(todo)}')
    log.info(f'To run: {len(todo)} points, '
             f'{sum(space_sizes(todo).values())} executions')
    return EXIT_OK
  summary = run_sweep(spec, args.output, scheduler=args.scheduler,
                      workers=args.workers, batch_points=args.batch_points,
                      batch_s=args.batch_seconds, progress=not args.quiet,
                      log=log)
  for line in summary.lines(args.output):
    log.info(line)
  if summary.write_error is not None:
    log.warning('Stopped: a part could not be written; move the saved part '
                f'into {args.output} and run the same command again to '
                'finish')
    raise summary.write_error
  if summary.interrupted:
    log.warning('Interrupted: the points completed are written; run the '
                'same command again to finish')
    return EXIT_INTERRUPTED
  if summary.failed:
    log.error(f'{summary.failed} points failed (see above); run the same '
              'command again to retry them')
    return EXIT_INFEASIBLE
  if summary.computed and summary.computed == summary.infeasible \
      and summary.skipped == 0:
    log.info('No point has a feasible execution :(')
    return EXIT_INFEASIBLE
  return EXIT_OK
