"""``calculon convert`` (result files between formats) and
``calculon compare-measured`` (a measured run against the model)."""

from calculon import outputs
from calculon.cli.main import EXIT_INFEASIBLE, EXIT_OK


def add_parsers(sp):
  p = sp.add_parser('convert', help='convert result files (JSON, CSV, '
                    'Parquet)', description='Convert a result table between '
                    '.json(.gz) (Calculon search output), .csv(.gz) and '
                    '.parquet.')
  p.add_argument('input', help='result file')
  p.add_argument('output', help='result file to write')
  p.set_defaults(func=run_convert)

  q = sp.add_parser(
    'compare-measured', help='compare a measured run with the prediction',
    description='Read a measured run (Cerebras-style performance JSON or a '
    'CSV of step times) and report measured vs predicted throughput.')
  q.add_argument('run_log', help='performance .json(.gz) or step-time '
                 '.csv(.gz)')
  q.add_argument('application', help='application JSON')
  q.add_argument('execution', help='execution JSON of the measured run')
  q.add_argument('system', help='system JSON')
  q.add_argument('--skip', type=int, default=0,
                 help='CSV: warm-up steps to ignore (default 0)')
  q.set_defaults(func=run_compare)


def run_convert(args, log):
  from calculon import io
  outputs.check_output_path(args.output, outputs.TABLE_KINDS,
                            what='converted table')
  frame = io.read_table(args.input)
  io.write_table(frame, args.output)
  log.info(f'{args.input} -> {args.output}: {len(frame)} rows, '
           f'{len(frame.columns)} columns')
  return EXIT_OK


def run_compare(args, log):
  from calculon.cli.llm import run_files
  from calculon.measured import comparison_rows, read_run, SMOOTHING
  model = run_files(args.application, args.execution, args.system, log)
  if model is None:
    return EXIT_INFEASIBLE
  app, exe = model.app, model.exe
  measured = read_run(args.run_log, exe.batch_size, args.skip)
  rate = model.get_stats_json()['sample_rate']
  log.info(f'Measured run: {args.run_log}: {measured.total_samples:g} samples '
           f'in {measured.total_time_s:g} s')
  log.info(f"{'quantity':<40} {'measured':>14} {'predicted':>14} "
           f"{'error':>9}")
  for name, meas, pred, err in comparison_rows(measured, rate, exe.batch_size,
                                               app.seq_size):
    log.info(f'{name:<40} {meas:>14.6g} {pred:>14.6g} {err:>8.2f}%')
  for i, (samples, time_s, wrate) in enumerate(measured.workers):
    log.info(f'  worker {i}: {samples:g} samples, {time_s:g} s, '
             f'{wrate:.6g} samples/s')
  log.info(f'GlobalRate = total samples / total time; Rate = {SMOOTHING} x '
           f'previous Rate + {1 - SMOOTHING:g} x step rate (smoothed); error '
           '= (predicted - measured) / measured.')
  return EXIT_OK
