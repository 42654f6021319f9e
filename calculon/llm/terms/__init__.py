"""The engine's terms, one module per concern.

:class:`~calculon.llm.terms.evaluation.Evaluation` is composed of them
(:mod:`calculon.llm.terms.evaluation` lists the modules and what each
holds); :mod:`calculon.llm.model` re-exports it with the names other code
imports.
"""
