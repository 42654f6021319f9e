"""Serving: price and search LLM inference deployments with the engine.

A deployment (JSON, fields in :data:`calculon.config.registry.DEPLOYMENT`)
says how a model is served: the framework preset, the parallelism of a
worker, the datatypes, the workload and the batching limits, aggregated or
disaggregated.  The modules, one job each:

* :mod:`~calculon.serving.deployment` reads and checks a deployment and
  resolves it against its framework preset
  (:mod:`~calculon.serving.frameworks`, ``frameworks/serving/*.json``);
* :mod:`~calculon.serving.kv_cache`: KV-cache bytes per token, weights and
  the memory a framework leaves for the cache;
* :mod:`~calculon.serving.forward`: one forward pass of a worker over
  ``batch`` sequences of ``seq`` new tokens, composed from the engine's
  block layers (:mod:`calculon.llm.block`) on the system's engines,
  memory and networks, each layer at the roofline;
  :mod:`~calculon.serving.prefill` and :mod:`~calculon.serving.decode`
  price a prompt and a decode step with it;
* :mod:`~calculon.serving.batching`: continuous batching's steady state
  (Orca, Sarathi-Serve); :mod:`~calculon.serving.disagg`: prefill and decode
  pools (DistServe, Splitwise);
* :mod:`~calculon.serving.price`: one deployment's figures;
  :mod:`~calculon.serving.search`: the best deployment under service
  targets.

Reads: the application, the system and the framework presets; nothing of
the training schedule.
"""
