"""The packed multi-vector store and what serves it.

:mod:`.packed_store`: :class:`PackedStore` (values ``[T, d]``, offsets ``[N+1]``, ids ``[N]``:
append, delete, compact, snapshots, the checksummed directory) and its exact MaxSim search;
:mod:`.snapshot`: :class:`StoreSnapshot`, the immutable version every reader works on, and the
growing columns appends cut new versions from; :mod:`.checks`: the store's argument checks (devices,
ids); :mod:`.graphed_search`: :class:`GraphedSearch`, one store's search captured as a CUDA graph.
"""
from .graphed_search import GraphedSearch
from .packed_store import PackedStore, StoreFormatError
from .snapshot import HostCopy, StoreSnapshot

__all__ = ["GraphedSearch", "HostCopy", "PackedStore", "StoreFormatError", "StoreSnapshot"]
