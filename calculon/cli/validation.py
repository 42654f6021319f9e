"""``calculon llm-validation``: comparisons with measured runs.

Suites (``--suite``):

* ``seqsel`` (default) -- Korthikanti et al. 2022, Figure 1, Figure 7 and
  Table 5 (:mod:`calculon.validation.seqsel`); exit status 1 when a table
  exceeds its threshold.
* ``published`` -- every row of the measured-runs files (default: both
  bundled ones, validation/published_runs.csv and
  validation/published_runs_2024_2026.csv; ``--runs`` any CSV in their
  columns), mapped by the conventions of validation/conventions.yaml
  (:mod:`calculon.validation.published`): a table with the range the
  unknown settings span, a summary, per source, and the rows not priced
  with the reason; exit status 0.  Rows are priced on the datasheet files
  (``systems/X_datasheet.json`` where one exists, else ``systems/X.json``);
  ``--calibrated`` prices each row on ``systems/CLUSTER.json`` where that
  is a calibrated file.  ``--search``
  then searches each row's framework preset at the row's GPUs, batch,
  sequence and datatype and compares the best with the measured
  throughput and the recipe's price (issue 34,
  :mod:`calculon.validation.search_check`; ``--tuned`` which sources are
  tuned recipes, ``-c`` the worker processes).
* ``whole-runs`` -- complete pretraining runs (default: the bundled
  validation/whole_runs.csv; ``--runs`` one CSV in its columns):
  predicted vs published GPU-hours, days and energy
  (:mod:`calculon.validation.whole_runs`); exit status 0.  Rows are priced
  on the bundled default files (calibrated where a calibration exists, as
  ``calculon plan`` uses them; the calibration is fitted on published
  step rows, none of them a whole run); ``--datasheet`` on the datasheet
  files.
* ``all`` -- the three (``--runs`` then applies to the published suite).
* ``serving`` -- measured serving runs (default:
  ../shared/measurements/serving_runs.csv; ``--runs`` CSV files in its
  columns) priced by ``calculon serve`` (:mod:`calculon.validation.serving`);
  ``--out`` writes serving_results.csv and serving_summary.json; exit 0.

``--plot DIR`` writes PNG charts, ``--out DIR`` the tables as CSV (and the
published summary as JSON; with ``--search`` also search_check.csv,
search_check_summary.json and search_check.md, the table of
docs/search-vs-recipes.md).
"""

import os

from calculon import outputs
from calculon.cli.main import EXIT_OK, positive_int

EXIT_THRESHOLD = 1
SUITES = ('seqsel', 'published', 'whole-runs', 'all', 'serving')


def add_parsers(sp):
  p = sp.add_parser(
    'llm-validation', aliases=['lv'],
    help='compare the model with measured training runs',
    description='Compare predictions with measured runs: the Korthikanti et '
    'al. 2022 figures and table (suite seqsel, default; exits 1 when a table '
    'exceeds its threshold), published runs (suite published) and whole '
    'pretraining runs (suite whole-runs).')
  p.add_argument('-v', '--verbose', action='store_true',
                 help='show each run, the chosen settings and approximations')
  p.add_argument('-s', '--suite', choices=SUITES, default='seqsel',
                 help='which comparison to run (default: seqsel)')
  p.add_argument('--plot', metavar='DIR', default=None,
                 help='write charts (PNG) into DIR')
  p.add_argument('--out', metavar='DIR', default=None,
                 help='write the tables (CSV) and summary (JSON) into DIR')
  p.add_argument('-b', '--base-dir', default=None,
                 help='folder with models/, systems/ and validation/ '
                 '(default: this checkout)')
  p.add_argument('--runs', metavar='CSV', nargs='+', default=None,
                 help='measured-runs file(s) in the columns of '
                 'validation/published_runs.csv (default: '
                 'BASE_DIR/validation/published_runs.csv and '
                 'published_runs_2024_2026.csv); with --suite whole-runs, '
                 'one file in the columns of validation/whole_runs.csv')
  p.add_argument('--conventions', metavar='YAML', default=None,
                 help='conventions mapping a row onto the model (default: '
                 'BASE_DIR/validation/conventions.yaml)')
  p.add_argument('--framework', metavar='NAME', default=None,
                 help='published suite: price every row under this framework '
                 "preset instead of its source's (calculon frameworks lists "
                 'them)')
  which = p.add_mutually_exclusive_group()
  which.add_argument('--calibrated', action='store_true',
                     help='price each row on systems/CLUSTER.json where '
                     'that is a calibrated file (see calculon calibrate); '
                     'without it the published suite prices on the '
                     'datasheet files (systems/X_datasheet.json where one '
                     'exists), whose runs the calibration is fitted on, '
                     'and the whole-runs suite on the bundled default '
                     'files (calibrated where a calibration exists, as '
                     'calculon plan uses them; fitted on none of its rows)')
  which.add_argument('--datasheet', action='store_true',
                     help='price every suite on the datasheet files')
  p.add_argument('--search', action='store_true',
                 help="published suite: also search each row's framework "
                 "preset at the row's GPUs, global batch, sequence and "
                 'datatype, and compare the best with the measured '
                 "throughput and the recipe's price")
  p.add_argument('--tuned', metavar='REGEX', nargs='+', default=None,
                 help='with --search: sources whose rows are tuned recipes '
                 '(regular expressions, case-insensitive; default: '
                 "'performance[ _-]summary' and '\\bmlperf\\b')")
  p.add_argument('-c', '--cpus', type=positive_int, default=None,
                 help='with --search: worker processes (default: the '
                 'physical cores)')
  p.set_defaults(func=run)


def _seqsel(args, log, base_dir, say):
  from calculon.validation import seqsel
  log.info('Korthikanti et al. 2022, "Reducing Activation Recomputation in '
           'Large Transformer Models" (arXiv 2205.05198)')
  log.info('delta = 100 * (1 - calculon / paper); thresholds on mean and '
           'max |delta| per table')
  tables = seqsel.compare(base_dir, progress=say)
  for table in tables:
    log.info('')
    log.info(seqsel.format_table(table))
  failed = [t for t in tables if not t.passed]
  log.info('')
  if failed:
    for t in failed:
      log.info(f"FAILED: {t.title}: {'; '.join(t.failures)}")
  else:
    log.info('seqsel: all 4 tables within their thresholds')
  if args.out:
    outputs.ensure_dir(args.out)
    path = os.path.join(args.out, 'seqsel.csv')
    outputs.write_text(path, seqsel.tables_frame(tables).to_csv(index=False))
    say(f'wrote {path}')
  if args.plot:
    from calculon.plots.validation import seqsel_plots
    for path in seqsel_plots(tables, args.plot):
      log.info(f'wrote {path}')
  return EXIT_THRESHOLD if failed else EXIT_OK


def calibrated_systems(base_dir, suite):
  """cluster -> calibrated system JSON for the clusters of ``suite``
  whose ``systems/CLUSTER.json`` is a calibrated file
  (:func:`calculon.validation.system_files.calibrated_path`)."""
  from calculon.io import read_json_file
  from calculon.validation.system_files import calibrated_path
  out, seen = {}, set()
  for case in suite.cases:
    cluster = case.cluster or case.system_name
    if not cluster or cluster in seen:
      continue
    seen.add(cluster)
    path = calibrated_path(base_dir, cluster)
    if path is not None:
      out[cluster] = read_json_file(path)
  return out


def _published(args, log, base_dir, say):
  from calculon.validation import published
  log.info('Published training runs: predicted vs measured batch time')
  if args.framework is not None:
    from calculon import frameworks
    frameworks.load(args.framework, source='--framework')
  suite = published.Suite(base_dir, args.runs, args.conventions,
                          args.framework)
  ignored = published.ignored_columns(suite.frame)
  if ignored:
    log.info(f"(columns not read: {', '.join(ignored)})")
  systems = None
  if args.calibrated:
    systems = calibrated_systems(base_dir, suite)
    log.info('Calibrated systems: ' + (', '.join(
      f'systems/{k}.json' for k in systems) or 'none found'))
  results = published.run_suite(suite, progress=say, systems=systems)
  frame = published.results_frame(results)
  log.info(published.format_report(frame, verbose=args.verbose))
  if args.out:
    _write_tables(args.out, say, frame, 'published_runs_results.csv',
                  published.summary(frame), 'published_summary.json')
  if args.plot:
    from calculon.plots.validation import published_plots
    for path in published_plots(frame, args.plot):
      log.info(f'wrote {path}')
  if args.search:
    _search(args, log, suite, results, say, systems)
  return EXIT_OK


def _search(args, log, suite, results, say, systems=None):
  import time
  from calculon.parallel import default_workers
  from calculon.validation import search_check
  start = time.perf_counter()
  rows = search_check.run(suite, results, args.cpus or default_workers(),
                          args.tuned, progress=say, systems=systems)
  frame = search_check.results_frame(rows)
  log.info('')
  log.info(search_check.format_report(frame, args.tuned))
  log.info(f'(search: {time.perf_counter() - start:.0f} s)')
  if args.out:
    _write_tables(args.out, say, frame, 'search_check.csv',
                  search_check.summary(frame), 'search_check_summary.json',
                  {'search_check.md': search_check.markdown(frame)})
  if args.plot:
    from calculon.plots.validation import search_check_plot
    log.info('wrote ' + search_check_plot(
      frame, os.path.join(args.plot, 'search_check.png')))


def _write_tables(out_dir, say, frame, csv_name, summary, json_name,
                  extra=None):
  """Writes ``frame`` as ``csv_name``, ``summary`` as ``json_name`` and
  each ``extra`` {file name: text} in ``out_dir`` (created), atomically."""
  import json
  outputs.ensure_dir(out_dir)
  files = {csv_name: frame.to_csv(index=False),
           json_name: json.dumps(summary, indent=2) + '\n'}
  files.update(extra or {})
  for name, text in files.items():
    outputs.write_text(os.path.join(out_dir, name), text)
  say(f"wrote {', '.join(os.path.join(out_dir, n) for n in files)}")


def run(args, log):
  """Runs the chosen suite(s); returns the exit status (0, or 1 when a
  seqsel table exceeds its threshold).

  Raises:
    ConfigError: a missing or invalid input file, or an output folder that
      cannot be written (exit status 2, before anything runs).
  """
  from calculon.errors import ConfigError
  from calculon.validation import check_base_dir, default_base_dir
  for option, path, what in (('--out', args.out, 'tables folder'),
                             ('--plot', args.plot, 'charts folder')):
    if path is not None:
      outputs.check_output_path(path, want_dir=True, what=what,
                                option=option)
  if args.search and args.suite not in ('published', 'all'):
    raise ConfigError(f'--search: not allowed with --suite {args.suite}: it '
                      'searches the rows of the published suite (--suite '
                      'published or all)', field='--search')
  if args.suite == 'seqsel':
    for option, value, suites in (
        ('--runs', args.runs, 'published, whole-runs, all or serving'),
        ('--conventions', args.conventions, 'published, whole-runs or all'),
        ('--framework', args.framework, 'published or all'),
        ('--tuned', args.tuned, 'published or all, with --search')):
      if value is not None:
        raise ConfigError(f'{option}: not allowed with --suite seqsel (the '
                          'default), which reads no measured runs: it '
                          f'applies to --suite {suites}', field=option)
  if args.tuned is not None:
    from calculon.validation.search_check import tuned_patterns
    tuned_patterns(args.tuned)
  base_dir = check_base_dir(args.base_dir or default_base_dir())
  say = log.info if args.verbose else (lambda text: None)
  status = EXIT_OK
  if args.suite in ('seqsel', 'all'):
    status = max(status, _seqsel(args, log, base_dir, say))
  if args.suite in ('published', 'all'):
    if args.suite == 'all':
      log.info('')
    status = max(status, _published(args, log, base_dir, say))
  if args.suite in ('whole-runs', 'all'):
    if args.suite == 'all':
      log.info('')
    status = max(status, _whole_runs(args, log, base_dir, say))
  if args.suite == 'serving':
    status = max(status, _serving(args, log, base_dir, say))
  return status


def _serving(args, log, base_dir, say):
  from calculon.validation import serving
  paths = args.runs or [serving.default_runs(base_dir)]
  rows = serving.read_runs(paths)
  log.info(f'Measured serving runs ({", ".join(paths)}): predicted vs '
           'measured; error_pct = 100 x (predicted / measured - 1)')
  results = serving.run_suite(rows, base_dir, progress=say)
  log.info(serving.format_report(results, verbose=args.verbose))
  if args.out:
    import json
    outputs.ensure_dir(args.out)
    outputs.write_text(os.path.join(args.out, 'serving_results.csv'),
                       serving.results_csv(results))
    outputs.write_text(os.path.join(args.out, 'serving_summary.json'),
                       json.dumps(serving.summary(results), indent=2) + '\n')
    log.info(f"wrote {os.path.join(args.out, 'serving_results.csv')}")
  return EXIT_OK


def _whole_runs(args, log, base_dir, say):
  from calculon.validation import whole_runs
  log.info('Whole pretraining runs: predicted vs published GPU-hours, days '
           'and energy')
  path = None
  if args.runs and args.suite == 'whole-runs':
    if len(args.runs) != 1:
      from calculon.errors import ConfigError
      raise ConfigError('--runs: the whole-runs suite reads one CSV file',
                        field='--runs', value=args.runs)
    path = args.runs[0]
  suite = whole_runs.Suite(base_dir, path, args.conventions)
  if not getattr(args, 'datasheet', False):
    # The default files: calibrated on the published suite's rows, none of
    # which is a whole run.
    suite.systems = calibrated_systems(base_dir, suite)
    log.info('Calibrated systems (the defaults): ' + (', '.join(
      f'systems/{k}.json' for k in suite.systems) or 'none found'))
  else:
    log.info('Datasheet systems (systems/X_datasheet.json where one '
             'exists)')
  from calculon.parallel import default_workers
  results = whole_runs.run_suite(suite, progress=say,
                                 workers=default_workers())
  frame = whole_runs.results_frame(results)
  log.info(whole_runs.format_report(frame, verbose=args.verbose))
  if args.out:
    _write_tables(args.out, say, frame, 'whole_runs_results.csv',
                  whole_runs.summary(frame), 'whole_runs_summary.json')
  if args.plot:
    for path in whole_runs.plot(frame, args.plot):
      log.info(f'wrote {path}')
  return EXIT_OK
