"""Sharded retrieval on Ray: documents spread over shard actors, results identical to the
single-process pipeline (see :mod:`.retrieval`). Needs the ``distributed`` extra (``ray``).

Modules: :mod:`.shard_map` (document -> shard, global order, placement, rebalancing),
:mod:`.shard` (one shard's index and its stage-1 scores), :mod:`.corpus` (the sharded index:
directories, actors, writes), :mod:`.fusion` (global stage-1 fusion), :mod:`.gather` (stages 2-7
on the gathered documents, ids mapped to global), :mod:`.retrieval` (the query path).
"""
from .corpus import ShardedIndex, ShardUnavailableError
from .retrieval import ShardedPipeline
from .shard_map import Move, Placement, ShardMap

__all__ = ["Move", "Placement", "ShardMap", "ShardUnavailableError", "ShardedIndex", "ShardedPipeline"]
