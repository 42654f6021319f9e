"""Measuring the machine: ``calculon profile`` and ``calculon profile-step``.

* :mod:`~calculon.profile.runner` -- runs each benchmark in its own
  subprocess (timeout, process-group kill, three tries, best of repeats).
* :mod:`~calculon.profile.worker` -- the subprocess side: one benchmark,
  one ``CALCULON_RESULT {json}`` line.
* :mod:`~calculon.profile.bench_compute`, :mod:`~calculon.profile.bench_memory`,
  :mod:`~calculon.profile.bench_network` -- the microbenchmarks (torch, or
  numpy and multiprocessing where torch is absent).
* :mod:`~calculon.profile.fit` -- measurements to efficiency curves, bus
  bandwidths and network fits.
* :mod:`~calculon.profile.build` -- the plan of benchmarks and the system
  file built from their results (documented defaults where one failed).
* :mod:`~calculon.profile.step` and :mod:`~calculon.profile.gpt` -- a real
  training step in PyTorch, measured per layer, against the prediction.

torch is optional (``pip install -e '.[profile]'``); see docs/profile.md.
"""
