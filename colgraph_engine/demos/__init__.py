"""The demos, in one place; ``colgraph demo`` runs each.

* ``colgraph demo`` (the pipeline demo, :mod:`colgraph_engine.cli.demo`): the bundled documents of
  :mod:`.corpus` into a knowledge index, then the seven-stage pipeline answers their questions.
* ``colgraph demo store`` (:mod:`.store_demo`, also ``colgraph-demo``): a packed MaxSim store
  built, saved, reloaded and searched, with the pooled baseline beside it.
* ``colgraph demo kg`` (:mod:`.kg_demo`, also ``colgraph-kg-demo``): a persisted multimodal index
  from :mod:`.kg_data`, reopened and queried by entity retrieval plus graph expansion.
"""
