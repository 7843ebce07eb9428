"""The packed multi-vector store and what serves it.

:mod:`.packed_store`: :class:`PackedStore` (values ``[T, d]``, offsets ``[N+1]``, ids ``[N]``:
append, delete, compact, snapshots, the checksummed directory) and its exact MaxSim search;
:mod:`.graphed_search`: :class:`GraphedSearch`, one store's search captured as a CUDA graph.
"""
from .graphed_search import GraphedSearch
from .packed_store import HostCopy, PackedStore, StoreFormatError, StoreSnapshot

__all__ = ["GraphedSearch", "HostCopy", "PackedStore", "StoreFormatError", "StoreSnapshot"]
