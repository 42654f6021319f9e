"""A whole training run: from the step to days, GPU-hours, energy, cost.

* :mod:`calculon.plan.run` -- every term of the run of given executions.
* :mod:`calculon.plan.objective` -- the search's objective, exactly
  (:func:`~calculon.plan.objective.rank`).
* :mod:`calculon.plan.reliability`, :mod:`~calculon.plan.checkpoint`,
  :mod:`~calculon.plan.energy` -- interruptions and Daly's model,
  checkpoint sizes and times, power and energy.
* :mod:`calculon.plan.framework` -- a framework's checkpoint policy.
* :mod:`calculon.plan.plan` -- ``calculon plan``: a run for each GPU count.

Light at import: the submodules load numpy and the engine when used.
"""
