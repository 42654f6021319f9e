"""Measured throughput of real training runs, to compare with predictions.

Two record formats are read:

* JSON in the shape of the Cerebras Model Zoo ``performance.json``
  (``total_samples``, ``total_time`` in seconds, ``samples_per_sec``; optional
  per-worker records under ``ordinals`` or ``per_worker``).  Worker records
  are merged as the Model Zoo does: samples add up, the time is the (common)
  wall time, the rate is their quotient.
* CSV of step times: a column of seconds per step (``step_time_s``,
  ``step_time``, ``time_s``, ``duration_s`` or ``seconds``) or of elapsed
  time (``elapsed_s``, ``timestamp``), and optionally ``samples`` per step
  (else the execution's global batch).

Definitions (Cerebras Model Zoo, "Measure throughput of your model"):

* GlobalRate: total samples / total time -- the average over the run.
* Rate: a smoothed local rate: at each step, Rate = 0.4 x previous Rate +
  0.6 x the step's local rate (samples / step time); it follows the recent
  throughput and is what a progress log shows.
"""

from dataclasses import dataclass, field

import numpy as np

from calculon.errors import ConfigError
from calculon.io import is_csv_extension, is_json_extension, read_json_file

#: Weight of the previous Rate in the smoothed rate.
SMOOTHING = 0.4
_STEP_COLUMNS = ('step_time_s', 'step_time', 'time_s', 'duration_s', 'seconds')
_ELAPSED_COLUMNS = ('elapsed_s', 'timestamp')


@dataclass
class MeasuredRun:
  """A run's measured throughput.

  Attributes:
    total_samples, total_time_s: totals (after skipped warm-up steps).
    global_rate: samples/s over the run.
    smoothed_rate: final smoothed Rate (CSV only, else None).
    step_times_s: per-step times (CSV only).
    workers: per-worker (samples, time_s, rate) tuples, if given.
  """
  total_samples: float
  total_time_s: float
  global_rate: float
  smoothed_rate: float = None
  step_times_s: np.ndarray = None
  workers: list = field(default_factory=list)


def smoothed_rates(step_samples, step_times_s, smoothing=SMOOTHING):
  """Rate after each step: r_k = smoothing r_(k-1) + (1 - smoothing) local_k,
  r_0 = local_0."""
  local = np.asarray(step_samples, float) / np.asarray(step_times_s, float)
  out = np.empty_like(local)
  rate = local[0]
  for k, value in enumerate(local):
    rate = value if k == 0 else smoothing * rate + (1 - smoothing) * value
    out[k] = rate
  return out


def read_run(path, batch_size, skip_steps=0):
  """Reads a measured run record.

  Args:
    path: .json / .json.gz (performance record) or .csv / .csv.gz (steps).
    batch_size: samples per step when the CSV has no ``samples`` column.
    skip_steps: CSV: leading (warm-up) steps to ignore.

  Raises:
    ConfigError: unreadable file, missing fields, non-positive times.
  """
  if is_json_extension(path):
    return _read_json(path)
  if is_csv_extension(path):
    return _read_csv(path, batch_size, skip_steps)
  raise ConfigError(f'{path}: run log must be .json, .json.gz, .csv or '
                    '.csv.gz', source=path)


def _number(obj, key, path, where=''):
  value = obj.get(key)
  if isinstance(value, bool) or not isinstance(value, (int, float)):
    raise ConfigError(f"{path}: field '{where}{key}' = {value!r} is not "
                      'allowed: a number', source=path, field=key, value=value)
  return float(value)


def _read_json(path):
  data = read_json_file(path)
  if not isinstance(data, dict):
    raise ConfigError(f'{path}: expected a JSON object with total_samples, '
                      'total_time, samples_per_sec', source=path)
  workers = []
  for key in ('ordinals', 'per_worker'):
    for i, rec in enumerate(data.get(key) or []):
      samples = _number(rec, 'total_samples', path, f'{key}[{i}].')
      time_s = _number(rec, 'total_time', path, f'{key}[{i}].')
      workers.append((samples, time_s, samples / time_s if time_s else 0.0))
  if workers and 'total_samples' not in data:
    samples = sum(w[0] for w in workers)
    time_s = next((w[1] for w in workers if w[1] > 0), 0.0)
  else:
    samples = _number(data, 'total_samples', path)
    time_s = _number(data, 'total_time', path)
  if time_s <= 0:
    if 'samples_per_sec' in data and _number(data, 'samples_per_sec', path):
      time_s = samples / _number(data, 'samples_per_sec', path)
    else:
      raise ConfigError(f"{path}: field 'total_time' must be > 0",
                        source=path, field='total_time')
  return MeasuredRun(samples, time_s, samples / time_s, workers=workers)


def _read_csv(path, batch_size, skip_steps):
  import pandas as pd
  try:
    frame = pd.read_csv(path)
  except (ValueError, OSError) as err:
    raise ConfigError(f'{path}: cannot be read as CSV: {err}',
                      source=path) from None
  step_col = next((c for c in _STEP_COLUMNS if c in frame.columns), None)
  if step_col is not None:
    times = frame[step_col].to_numpy(float)
  else:
    elapsed = next((c for c in _ELAPSED_COLUMNS if c in frame.columns), None)
    if elapsed is None:
      raise ConfigError(
        f'{path}: needs a step-time column ({", ".join(_STEP_COLUMNS)}) or an '
        f'elapsed-time column ({", ".join(_ELAPSED_COLUMNS)}); has '
        f'{", ".join(frame.columns)}', source=path)
    times = np.diff(frame[elapsed].to_numpy(float))
    frame = frame.iloc[1:]
  samples = frame['samples'].to_numpy(float) if 'samples' in frame.columns \
    else np.full(len(times), float(batch_size))
  times, samples = times[skip_steps:], samples[skip_steps:]
  if len(times) == 0:
    raise ConfigError(f'{path}: no steps left after skipping {skip_steps}',
                      source=path)
  if np.any(~np.isfinite(times)) or np.any(times <= 0):
    raise ConfigError(f'{path}: step times must be positive numbers',
                      source=path)
  total_samples, total_time = float(samples.sum()), float(times.sum())
  return MeasuredRun(total_samples, total_time, total_samples / total_time,
                     smoothed_rates(samples, times)[-1], times)


def comparison_rows(measured, predicted_rate, batch_size, seq_size):
  """[(quantity, measured, predicted, error %)] -- error is predicted
  relative to measured."""
  def err(pred, meas):
    return 100.0 * (pred - meas) / meas if meas else float('nan')
  rows = [('samples/s (GlobalRate)', measured.global_rate, predicted_rate,
           err(predicted_rate, measured.global_rate))]
  if measured.smoothed_rate is not None:
    rows.append(('samples/s (Rate, smoothed, last step)',
                 measured.smoothed_rate, predicted_rate,
                 err(predicted_rate, measured.smoothed_rate)))
  meas_batch = batch_size / measured.global_rate
  pred_batch = batch_size / predicted_rate
  rows.append(('batch time s (batch / GlobalRate)', meas_batch, pred_batch,
               err(pred_batch, meas_batch)))
  if measured.step_times_s is not None:
    median = float(np.median(measured.step_times_s))
    rows.append(('median step time s', median, pred_batch,
                 err(pred_batch, median)))
  rows.append(('tokens/s', measured.global_rate * seq_size,
               predicted_rate * seq_size,
               err(predicted_rate, measured.global_rate)))
  return rows
