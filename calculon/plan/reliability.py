"""Interruptions, checkpoint intervals and goodput of a whole training run.

All functions take and return numpy arrays (any broadcastable shapes) or
floats, times in seconds.

The run's wall time follows Daly's complete model of a job that saves a
checkpoint every ``tau`` seconds of computation at a cost of ``delta``
seconds, fails as a Poisson process of mean time ``M`` and needs ``R``
seconds to restart, a restart itself being interruptible (J. T. Daly, "A
higher order estimate of the optimum checkpoint interval for restart
dumps", Future Generation Computer Systems 22(3), 2006, section 3, the
expected wall time of the complete model):

    T_w = M exp(R / M) (exp((tau + delta) / M) - 1) T_s / tau

for ``T_s`` seconds of computation.  The goodput (effective training time
ratio, Kokolis et al., arXiv 2410.21680, section II) is ``T_s / T_w``.
"""

import math

import numpy as np

SECONDS_PER_HOUR = 3600.0


def job_rate_per_s(rates_per_gpu_hour, gpus, reference_gpus=16384,
                   exponent=1.0):
  """Interruptions per second of a job of ``gpus`` GPUs.

  rate(N) = r x N_ref x (N / N_ref) ** exponent / 3600, r per GPU-hour
  measured on N_ref GPUs (exponent 1: proportional to N, Kokolis et al.,
  arXiv 2410.21680, section V).

  Args:
    rates_per_gpu_hour: per-GPU-hour rate (float or array).
    gpus: the job's GPUs (>= 1).

  Returns:
    float or array, 1/s.
  """
  r = np.asarray(rates_per_gpu_hour, dtype=float)
  n = np.asarray(gpus, dtype=float)
  out = r * reference_gpus * (n / reference_gpus) ** exponent / \
    SECONDS_PER_HOUR
  return float(out) if np.ndim(out) == 0 else out


def wall_factor(tau_s, delta_s, mtbi_s, restart_s):
  """Daly's complete model: wall time per second of computation,
  M exp(R/M) (exp((tau + delta)/M) - 1) / tau (>= 1).

  Args:
    tau_s: computation between checkpoints (> 0).
    delta_s: cost of one checkpoint (>= 0).
    mtbi_s: mean time between interruptions of the job (> 0; inf: none).
    restart_s: restart time, including the work redone beyond the
      interval's (>= 0).

  Returns:
    array (inf where the job cannot progress).
  """
  tau = np.asarray(tau_s, dtype=float)
  delta = np.asarray(delta_s, dtype=float)
  m = np.asarray(mtbi_s, dtype=float)
  r = np.asarray(restart_s, dtype=float)
  with np.errstate(over='ignore', invalid='ignore', divide='ignore'):
    finite = np.isfinite(m)
    safe_m = np.where(finite, m, 1.0)
    out = safe_m * np.exp(r / safe_m) * np.expm1((tau + delta) / safe_m) / \
      tau
    out = np.where(finite, out, (tau + delta) / tau)
  return out


def optimal_interval_s(delta_s, mtbi_s):
  """The computation between checkpoints that minimizes Daly's complete
  model exactly.

  Setting the derivative of (exp((tau + delta)/M) - 1) / tau to zero gives
  (1 - x) exp(x + delta/M) = 1 for x = tau / M, i.e. x = 1 + W0(-exp(-(1
  + delta/M))) with W0 the principal branch of Lambert's W (Daly 2006
  solves the same equation by perturbation; his higher-order estimate is
  :func:`daly_higher_order_s`).  Solved here by bisection on (0, 1), to
  1e-15 relative.  The restart time does not move the optimum (it only
  scales the wall time by exp(R/M)).

  Args:
    delta_s: checkpoint cost (>= 0; 0 gives 0).
    mtbi_s: mean time between interruptions (> 0; inf gives inf).

  Returns:
    array of seconds.
  """
  delta = np.asarray(delta_s, dtype=float)
  m = np.asarray(mtbi_s, dtype=float)
  shape = np.broadcast_shapes(delta.shape, m.shape)
  delta, m = np.broadcast_to(delta, shape), np.broadcast_to(m, shape)
  with np.errstate(divide='ignore', invalid='ignore'):
    d = np.where(np.isfinite(m), delta / np.where(np.isfinite(m), m, 1.0),
                 0.0)
  lo = np.zeros(shape)
  hi = np.ones(shape)
  for _ in range(64):
    mid = 0.5 * (lo + hi)
    positive = (1.0 - mid) * np.exp(mid + d) - 1.0 > 0
    lo = np.where(positive, mid, lo)
    hi = np.where(positive, hi, mid)
  x = 0.5 * (lo + hi)
  out = np.where(np.isfinite(m), x * np.where(np.isfinite(m), m, 0.0),
                 np.inf)
  out = np.where(delta > 0, out, 0.0)
  return float(out) if out.ndim == 0 else out


def young_interval_s(delta_s, mtbi_s):
  """Young's first-order optimum, sqrt(2 delta M) (J. W. Young, "A first
  order approximation to the optimum checkpoint interval", Communications
  of the ACM 17(9), 1974)."""
  out = np.sqrt(2.0 * np.asarray(delta_s, float) * np.asarray(mtbi_s, float))
  return float(out) if np.ndim(out) == 0 else out


def daly_first_order_s(delta_s, mtbi_s, restart_s):
  """Daly's first-order optimum with the restart time, sqrt(2 delta (R +
  M)) (Daly 2006, section 2)."""
  out = np.sqrt(2.0 * np.asarray(delta_s, float) *
                (np.asarray(restart_s, float) + np.asarray(mtbi_s, float)))
  return float(out) if np.ndim(out) == 0 else out


def daly_higher_order_s(delta_s, mtbi_s):
  """Daly's higher-order estimate of the optimum (Daly 2006, section 4):
  sqrt(2 delta M) [1 + sqrt(delta/(2M))/3 + delta/(18 M)] - delta for delta
  < 2M, else M."""
  delta = np.asarray(delta_s, float)
  m = np.asarray(mtbi_s, float)
  x = delta / (2.0 * m)
  out = np.where(delta < 2.0 * m,
                 np.sqrt(2.0 * delta * m) * (1.0 + np.sqrt(x) / 3.0 +
                                             x / 9.0) - delta, m)
  return float(out) if out.ndim == 0 else out


def interval_steps(step_s, delta_s, mtbi_s, restart_s, min_interval_s=0.0):
  """The whole number of steps between checkpoints that minimizes the wall
  time: the continuous optimum (:func:`optimal_interval_s`) rounded down
  and up to whole steps (at least one step and ``min_interval_s``), the
  better one kept.

  Returns:
    (steps, tau_s, wall factor): arrays, or floats for scalar inputs.
  """
  step = np.asarray(step_s, dtype=float)
  tau_opt = optimal_interval_s(delta_s, mtbi_s)
  with np.errstate(invalid='ignore', divide='ignore', over='ignore'):
    k_min = np.maximum(1.0, np.ceil(np.asarray(min_interval_s, float) /
                                    step - 1e-9))
    k = np.where(np.isfinite(tau_opt), tau_opt / step, 1e18)
    lo = np.maximum(k_min, np.floor(k))
    hi = np.maximum(k_min, np.ceil(k))
    f_lo = wall_factor(lo * step, delta_s, mtbi_s, restart_s)
    f_hi = wall_factor(hi * step, delta_s, mtbi_s, restart_s)
  use_hi = f_hi < f_lo
  steps = np.where(use_hi, hi, lo)
  factor = np.where(use_hi, f_hi, f_lo)
  if steps.ndim == 0:
    return float(steps), float(steps * step), float(factor)
  return steps, steps * step, factor


def lower_wall_factor(mtbi_s, restart_s, planned_per_s):
  """The least wall time per second of computation any execution can
  reach: checkpoints free and continuous (delta -> 0, tau -> 0) in
  :func:`wall_factor` gives exp(R/M); planned stops add 1 / (1 - lambda_p
  R).  Used to bound the objectives (:mod:`calculon.plan.objective`).
  """
  m = float(mtbi_s)
  base = math.exp(restart_s / m) if math.isfinite(m) else 1.0
  lost = planned_per_s * restart_s
  return base / (1.0 - lost) if lost < 1 else math.inf
