"""``calculon calibrate``: fit a system file to measured runs.

    calculon calibrate RUNS.csv [RUNS.csv ...] SYSTEM.json -o CALIBRATED.json
        [--params matrix,net1,...] [--cv source|run|both|none]
        [--population-prior others|none]

Maps every row of the runs file(s) onto the model (the conventions of
``validation/conventions.yaml``, as ``llm-validation --suite published``
does), keeps those that use SYSTEM (their hardware maps to it; ``--all-rows``
prices every row on it), fits the parameters
(:mod:`calculon.validation.calibrate`), prints them with their standard
errors, the errors before and after, and the cross-validation, and writes
the calibrated system file (atomically).  Exit status 0; 2 for bad input or
parameters the runs cannot determine.
"""

import os

from calculon.cli.main import EXIT_OK

CV_CHOICES = ('source', 'run', 'both', 'none')


def add_parsers(sp):
  p = sp.add_parser(
    'calibrate', help='fit a system file to measured runs',
    description='Fit a few physical parameters of a system file (efficiency '
    'scales of the matrix/vector engines, memory and network tiers, fixed '
    'overheads) to the measured runs that use it, with cross-validation; '
    'writes a calibrated system file.')
  p.add_argument('runs', nargs='+', metavar='RUNS.csv',
                 help='measured runs (the columns of validation/'
                 'published_runs.csv)')
  p.add_argument('system', metavar='SYSTEM.json', help='system file to fit')
  p.add_argument('-o', '--output', required=True, metavar='CALIBRATED.json',
                 help='calibrated system file to write')
  p.add_argument('--params', default='auto',
                 help='comma-separated parameters to fit (matrix, '
                 'matrix_narrow, vector, attention, moe, net0, net1, ..., '
                 'per_step_s, per_microbatch_s) or auto (default: those the '
                 'runs determine, per_step_s aside)')
  p.add_argument('--cv', choices=CV_CHOICES, default='both',
                 help='cross-validation: leave one source out, one run out, '
                 'both (default) or none')
  p.add_argument('--cluster', default=None,
                 help='calibrate the runs of this cluster of the hardware '
                 'table (default: the system file name without .json and '
                 'without a _datasheet or _calibrated suffix)')
  p.add_argument('--all-rows', action='store_true',
                 help='price every row of the runs file(s) on SYSTEM')
  p.add_argument('--prior-sigma', type=float, default=None,
                 help='width of the prior on the scales, in log units '
                 '(default 1.0, and 0.25 for the network tiers, whose file '
                 'values are measured; a value given holds for every '
                 'scale)')
  p.add_argument('--population-prior', choices=('others', 'none'),
                 default='others',
                 help="where the scales' prior is centred: 'others' (the "
                 'default), on the pooled fit of the runs of the other '
                 'clusters in the runs file(s) -- partial pooling: a '
                 'cluster with few runs starts from what the others '
                 "measured; the file's values when there are none -- or "
                 "'none', on the file's values")
  p.add_argument('--refine', type=int, default=2,
                 help='re-linearizations at the fit (default 2)')
  p.add_argument('--conventions', default=None,
                 help='conventions file (default: validation/'
                 'conventions.yaml)')
  p.add_argument('-b', '--base-dir', default=None,
                 help='folder with models/, systems/ and validation/')
  p.add_argument('-v', '--verbose', action='store_true',
                 help='show each run and fold')
  p.set_defaults(func=run)


def _population(suite, ids, cluster, C):
  """The linearized runs of ``suite`` of other clusters than ``cluster``
  (and not among ``ids``): the population prior's runs."""
  return [r for r in C.prepare(suite).runs
          if r.id not in ids and r.system != cluster]


def _parse_params(text):
  from calculon.errors import ConfigError
  if text.strip() == 'auto':
    return None
  names = [n.strip() for n in text.split(',') if n.strip()]
  if not names:
    raise ConfigError(f'--params {text!r} is not allowed: a comma-separated '
                      'list of parameters, or auto', field='params')
  return names


def run(args, log):
  """Runs the calibration; returns the exit status.

  Raises:
    ConfigError: bad input (exit status 2).
  """
  from calculon.errors import ConfigError
  from calculon.io import read_json_file, write_json_file
  from calculon.config.system import SystemConfig
  from calculon.validation import check_base_dir, default_base_dir
  from calculon.validation import calibrate as C
  from calculon.validation.published import Suite, error_stats
  from calculon.validation.system_files import (DATASHEET, base_name,
                                                is_calibrated)
  base_dir = check_base_dir(args.base_dir or default_base_dir())
  say = log.info if args.verbose else (lambda text: None)
  names = _parse_params(args.params)
  out = args.output
  if os.path.isdir(out) or not os.path.isdir(os.path.dirname(
      os.path.abspath(out))):
    raise ConfigError(f'{out}: cannot write the calibrated file there (not '
                      'a file in an existing folder)', source=out)
  if args.prior_sigma is not None and not args.prior_sigma > 0:
    raise ConfigError(f'--prior-sigma {args.prior_sigma} is not allowed: a '
                      'number > 0', field='prior_sigma')
  cfg = read_json_file(args.system)
  SystemConfig.from_dict(cfg, args.system)
  name = base_name(args.system)
  if is_calibrated(cfg):
    log.info(f'note: {args.system} is already a calibrated file: the fit '
             'multiplies its efficiencies again (systems/'
             f'{name}{DATASHEET}.json, where there is one, is the datasheet '
             'file it was calibrated from)')
  suite = Suite(base_dir, args.runs, args.conventions)
  cluster = args.cluster or name
  cases = C.select_runs(suite, name, args.cluster, args.all_rows)
  if args.all_rows:
    for case in cases:
      case.system_set = {}
  log.info(f'Calibrating {args.system} on {len(cases)} measured run(s) of '
           f"{', '.join(args.runs)} (cluster {cluster})")
  cv = {'both': ('source', 'run'), 'none': ()}.get(args.cv, (args.cv,))
  command = 'calculon calibrate ' + ' '.join(
    list(args.runs) + [args.system, '-o', args.output, '--params',
                       args.params] +
    (['--cluster', args.cluster] if args.cluster else []) +
    (['--all-rows'] if args.all_rows else []) +
    (['--prior-sigma', str(args.prior_sigma)] if args.prior_sigma else []) +
    (['--population-prior', 'none'] if args.population_prior == 'none'
     else []))
  population = []
  if args.population_prior == 'others' and not args.all_rows:
    ids = {c.id for c in cases}
    if 'measured' in cfg:
      # The centres must be relative to the same kind of file: on a
      # measured-kernel file, the other clusters' runs are priced on
      # theirs.
      import tempfile
      from calculon.validation.system_files import measured_view
      with tempfile.TemporaryDirectory() as tmp:
        population = _population(
          Suite(measured_view(base_dir, tmp), args.runs, args.conventions),
          ids, cluster, C)
    else:
      population = _population(suite, ids, cluster, C)
  result = C.calibrate_system(
    suite, cfg, cases, names,
    sigma=args.prior_sigma or C.PRIOR_SIGMA, refine=max(args.refine, 0),
    cv=cv, cluster=cluster, progress=say,
    note=f'Produced by: {command}', population=population)
  fit = result.fit
  prior = C.prior_of(cfg)
  log.info('')
  if result.centre:
    log.info(f'Prior centres from {len(population)} run(s) of other '
             'clusters (their pooled fit): ' + ', '.join(
               f'{k} {v:.4g}' for k, v in result.centre.items()))
  log.info(C.format_fit(fit, prior, result.dropped,
                        centre=result.centre or None))
  pred = result.predictions
  b, a = error_stats(pred['delta_before_pct']), error_stats(
    pred['delta_after_pct'])
  log.info('')
  log.info(f"In sample ({len(pred)} runs): median |delta| "
           f"{b['median_abs_delta_pct']:.1f}% -> "
           f"{a['median_abs_delta_pct']:.1f}%, within 10% "
           f"{100 * b['within_10pct']:.0f}% -> {100 * a['within_10pct']:.0f}%, "
           f"median delta {b['median_delta_pct']:+.1f}% -> "
           f"{a['median_delta_pct']:+.1f}%")
  if args.verbose:
    show = pred[['id', 'source', 'measured_s', 'before_s', 'after_s',
                 'delta_before_pct', 'delta_after_pct']].round(3)
    log.info(show.to_string(index=False))
  titles = {'source': 'Leave one source out (fit on the other sources, '
            'predict the held-out one):',
            'run': 'Leave one run out (fit on the other runs, predict the '
            'held-out one):'}
  for mode, frame in result.cv.items():
    log.info('')
    log.info(C.format_cv(C.cv_summary(frame), titles[mode]))
  if 'measured' in result.calibrated and out.endswith('.json'):
    from calculon import outputs
    from calculon.kernels.import_kernels import system_text
    outputs.write_text(out, system_text(result.calibrated))
  else:
    write_json_file(result.calibrated, out)
  log.info('')
  log.info(f'wrote {out}')
  return EXIT_OK
