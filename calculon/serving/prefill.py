"""Prefill: a forward pass over the prompt (compute-bound).

:func:`prefill_s` prices ``batch`` prompts of ``isl`` tokens run together
(one iteration's context requests): the engine's block at seq = the
prompt, attention causal inside it (:mod:`calculon.serving.forward`), the
pipeline's stages in sequence (a prompt crosses every stage once).

Reads: :mod:`calculon.serving.forward`.
"""

import numpy as np

from calculon.serving.forward import forward_s


def prefill_s(app, system, worker, batch, isl, dtype):
  """Seconds to prefill ``batch`` prompts (array) of ``isl`` tokens on
  ``worker``: PP x the stage's forward (TTFT of the batch's last
  prompt).  Returns (seconds, :class:`~calculon.serving.forward.ForwardTimes`
  of one stage)."""
  f = forward_s(app, system, worker, batch, isl, dtype)
  return np.asarray(worker.pipeline_par) * f.stage, f
