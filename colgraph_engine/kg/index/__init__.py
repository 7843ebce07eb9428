"""The knowledge index: every document's graph and vectors, in memory and in one directory.

Directory layout (format version 3)::

    index/
      manifest.json          format, version, generation, encoders (name, dim), vector dtype,
                             next document number, parts (in document order: file name, sha256 of
                             its header, document count, counts by kind), vectors (per store: file
                             name, committed rows), totals (the parts' sums); optionally
                             prefilter (settings, and per store its base folder with that
                             folder's manifest sha256 and its appended pieces with theirs, or
                             null while deferred), or prefilter_declined (true: turned off by
                             disable_prefilter, so nothing carries them again unasked)
      parts/<name>.part      one batch of whole documents in ONE file (see kg/parts.py): graph
                             columns, UTF-8 string blobs and item tables behind a header that holds
                             each array's sha256, and per store the row count and sha256 of the rows
                             its documents own
      vectors/<store>.<tag>.bin
                             one append-only file of raw rows ``[T, d]`` per store: the rows of
                             every document in document order (the parts' order, then each part's)
      prefilter/<store>.<tag>/   only for stores that carry a centroid prefilter
      prefilter/<store>.<tag>.piece
                             (:meth:`KnowledgeIndex.enable_prefilter`; see kg/index/prefilters.py): a
                             base folder in the layout of prefilter/persist.py, keyed by uids, plus
                             one appended piece file per later commit (merged, and compacted
                             into a new base when they outgrow it)

Each part's documents are one contiguous run of the document order, so each part owns one
contiguous row range of every vector file; the range's sha256 sits in the part's header (whose
own sha256 sits in the index manifest): a chain of checksums from the manifest to every byte.
Only the first ``rows`` rows of a vector file are committed; bytes past them are the leftovers of
an interrupted append, ignored by readers and cut off by the next writer. The manifest lists
parts, not documents (document ids, numbers and per-document columns live in the parts): a commit
rewrites a manifest whose size grows with the number of parts, not of documents; and an added part
absorbs the parts at the end of the list that hold no more documents than it has gathered (a
binary counter), so an index grown one document at a time keeps about log2(documents) + 1 parts,
each document's graph rewritten O(log documents) times amortised (vector rows never move).

``manifest.json`` is the commit point. Adding documents appends their rows to the vector files
and writes a new part file under a name no manifest lists yet; then the change replaces the
manifest (temporary file, fsync, ``os.replace``, fsync of the folder). The appended files, the
part, the parts folder and the manifest's temporary file are fsync'ed together (concurrently)
before the rename: a constant number of fsyncs per commit (one per store that got rows, plus
four) in two rounds, however many documents and arrays. A store that carries a prefilter and
gets rows (or loses them) has its next prefilter computed before anything is written; what
changed is saved as a new piece file ``prefilter/<store>.<tag>.piece`` (O(the change); a build,
rebuild or compaction writes a new base folder instead), fsync'ed before the manifest that names
it replaces the old one, so the manifest commits the rows and the prefilter together. Removing one
writes new, compacted vector files for the stores it had rows in (a new tag, never the file a
reader maps) and a new part for the documents that shared its part, in that part's place of the
order. Only after the manifest is replaced are parts the new manifest no longer names deleted. A
crash at any point leaves either the previous or the new manifest, and every part that manifest
names is complete; parts and vector files no manifest names are removed by the next change.
Writers take an exclusive
lock on ``.lock`` (``flock``) for the whole change, and a change is refused with
:class:`IndexConflictError` when another writer holds it or when the manifest's generation is
not the one this object read (someone else committed since): nothing is overwritten unseen.

Readers (:meth:`KnowledgeIndex.open`) hold a shared ``flock`` on the index folder itself while
they read the manifest and then its parts, so they see one committed generation whole. Vector
files and part files are memory-mapped, never read whole: pages load on first touch, and a mapping
stays valid after a later commit deletes the file (POSIX keeps it alive) or appends to it (rows
past the mapped ones are never looked at). Strings stay UTF-8 in the mapped part
(:class:`~colgraph_engine.kg.strings.StringColumn`, decoded when read) and a document's graph is
cut out of its part's columns when asked for, so an open index holds no per-document objects
beyond a small entry. A writer deletes the parts and vector files its new manifest no longer names
only when it can take that lock exclusively
without waiting; while a reader holds it, the old parts stay (a later commit removes them), and a
writer never waits for readers. Where the file system has no ``flock``, a reader whose parts
vanish retries with the new manifest when its generation changed.

The manifest is untrusted input: part names must be plain file names (letters, digits,
``._-``, not starting with a dot: no separators, no ``..``, not absolute) listed once, a part's
header must have the sha256 the manifest lists and its document count and counts must match,
document ids and numbers must be unique (numbers below 2^31), counts are bounded and the totals
are their sums, vector file names are ``<store>.<hex tag>.bin`` and a vector file must hold at
least its committed rows; a carried prefilter's base folder and pieces must have the listed
sha256 and sizes and together hold exactly its store's live uids with their token counts (a
disagreement is refused unless opened with ``repair_prefilter=True``, which rebuilds it from the
store and commits it); anything else
raises :class:`IndexFormatError`. The ``prefilter`` field keeps the format at version 3: an index
without it opens as before, and an older writer that does not know the field drops it (its
folders are then unlisted files, removed by the next change of a writer that knows it). Version-1 directories
(vectors inside the parts) and version-2 directories (a folder of array files per part, every
document listed in the manifest) are read as before; the first change rewrites such a directory
as version 3 (one commit of the same contents) before applying itself.

In memory, the documents' graphs are kept per document and the vectors in one
:class:`~colgraph_engine.store.PackedStore` per store (over the mapped file when the index has a
directory), keyed by a stable item id ``uid = doc_number << 32 | local_id`` (node ids; relation
edges use edge ids). The merged :class:`~colgraph_engine.graph.KnowledgeGraph` over all documents
(``graph``) is assembled on first use: documents in insertion order, ``node_doc`` = document number,
aliases grouping entities with equal normalised names across documents (the query-time merge is a
view over it); an alias group's id is its first member's node id. Once assembled it grows in
place: adding documents appends their nodes and edges (native append, O(new edges)), their
uids, and alias entries for their entities only; the result equals a full re-assembly array for
array. Removing a document removes its nodes, edges, aliases, vectors and strings; the merged
graph is then re-assembled on next use (node ids after it shift), and in a directory the
vector files it had rows in are rewritten without them (both O(index), the honest cost of exact
removal); no other document is rebuilt, re-extracted or re-encoded."""
from . import prefilters as _pf  # noqa: F401  (tests patch its functions through this name)
from .assembly import make_uid
from .commit import IndexConflictError
from .facade import KnowledgeIndex, check_new_documents
from .format import (INDEX_FORMAT, INDEX_VERSION, UID_SHIFT, IndexFormatError, _read_manifest,  # noqa: F401
                     _readers_lock, read_documents)
from ...graph.kinds import EdgeKind  # noqa: F401  (named here before the package split)

__all__ = ["INDEX_FORMAT", "INDEX_VERSION", "IndexConflictError", "IndexFormatError", "KnowledgeIndex", "make_uid",
           "read_documents", "EdgeKind"]
