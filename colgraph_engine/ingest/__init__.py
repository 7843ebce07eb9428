"""From raw files to the knowledge index: readers (PDF, images, text, record files) that produce
:class:`~colgraph_engine.kg.DocumentInput`, optional model hooks (LLM extraction, vision scene
graphs and region matching, captions) and the folder ingest that drives them."""
