"""``retrieval="graph+chunks"`` (the default): the graph adds evidence to the chunk ranking and
re-ranks it; it never narrows it.

**Seeds are entities named in the question.** For query q over its Kd recalled documents D(q):

* terms: lower-cased words and numbers of a text, a trailing plural "s" stripped from words of
  four letters or more, with :data:`STOP_WORDS` (function words, question words and the words
  that open sentences: "using", "derived", "the", "we", ...) removed. An entity whose name has no
  term left can never be a seed, nor can a stop word of the question seed anything.
* rarity: ``idf(t) = ln(1 + N / max(1, df(t)))`` over the text units (segments and tables) of
  D(q): N units, df(t) of them holding t: the units the question is ranked over, so "report" or
  "percentage" (on most pages, rarely a name) weigh little and "pseudocode" (on one page) much.
  A document's units are counted for a term the first time a query asks about it (the terms of
  the names that share a word with the question), and the counts are kept, so the cost grows
  with the recalled documents, never with the corpus. (Ours; until 2026-12-04 the rarity was
  counted over D(q)'s entity names, which rated a common word that is seldom a name as rare and
  let seeds like "report" or "format" take the support; the dev-set figures before and after are
  in ``benchmarks/results/pipeline_quality.md`` and its history.)
* lexical match: ``lex(e) = Σ_{t ∈ T(e) ∩ T(q)} idf(t)² / (‖T(e)‖ · ‖T(q) ∩ V‖)`` with
  ``‖T‖ = sqrt(Σ_{t ∈ T} idf(t)²)`` and V the terms of D(q)'s names: the cosine of idf-weighted
  term sets, so a long run of capitalised words matching one question word scores low.
* token match (``seed_match="names"``): ``tok(e) = (1/|n|) Σ_j max_i <n_j, q_i>``, the MaxSim of
  the entity name's token vectors n (the token encoder, encoded once per document per view)
  against the question's tokens q, per name token. It counts only when ``lex(e) > 0`` or
  ``tok(e) >= TOKEN_MATCH`` (0.9, ours: near-identical token vectors).
* seed score ``σ(e) = ½ lex(e) + ½ tok(e)`` (``seed_match="lexical"``: ``σ(e) = lex(e)``); the
  seeds are the top Kg name groups by σ > 0 (a group scores as its best member). A name group
  is an alias group widened to the entities of D(q) whose names have the same terms ("Latino"
  and "Latinos", "PEW RESEARCH CENTER" and "Pew Research Center").

**Hop path.** A name group (across pages and documents) is one node: group G reaches every
page of D(q) that mentions any member (distance 0); each hop follows
relation edges inside D(q) to other entities (distance h), with the relevance filter of
``filter`` on the entities reached (``"off"``: all; ``"default"``/``"mkg"``: cosine of the
question with the entity's description vector > threshold, at least ``min_keep``), at most
`expansion_budget` entities per group and hop.

**Support and the rule.** For a unit u (a segment or table of D(q); an image or region of the
visual candidates) and a seed group G, with N_h(G) the entity groups first reached at hop h
(after the filter) and M(u) the entities u mentions (an image: those its segment mentions),

    a_G(u) = 1                                            if u mentions a member of G
           = max_{1<=h<=l} γ^h · |N_h(G) ∩ M(u)| / |N_h(G)|  otherwise (γ = 1/2, ours)
    g(u)   = Σ_G σ_G · a_G(u) / Σ_G σ_G                   (0 when no seed reaches u)

so a hop passes a seed's weight on split over its neighbourhood (as personalised PageRank
splits it over out-edges): a page that mentions one of 30 neighbours of a seed gains little, a
page that mentions most of them nearly half of what naming the seed gives.

    score(u) = (m(u) - m_(k)) / (m_(1) - m_(k)) + β · g(u)

with m(u) the unit's own MaxSim (question tokens vs its tokens for text units; the visual
ranker's score for images), m_(1) and m_(k) the best and the k-th best m of the query's units
(k = ``chunks_k`` for text, ``k`` for images; the divisor is 1 where they are equal) and
β = ``graph_weight`` (ours: 1, so full support weighs as much as the spread of the chunk list's
top k: the two signals on one scale, neither tuned above the other; 0.5 until 2026-12-04). The candidates are every segment and table of D(q), the chunk ranking's own
candidates, so a unit the chunks would keep is only ever displaced by a unit with more support,
and one no seed reaches keeps its MaxSim order. The sources are the top ``evidence_k`` by
score; E_k the top ``k`` images. An image's g(x) is the larger of its segment's g and
``Σ σ_G γ^h / Σ_G σ_G`` over the reached entities it depicts (DEPICTS edges; a region: its image's
segment).

**Context.** The subgraph's entities are the seeds and the entities the hops reached, at most
Kg, those of weight (σ, or σ_G γ^h) at least half the best seed's; relations are those among
them. Their descriptions are cut to the sentences about the question (:func:`focus`: two
sentences, 50 words), and one whose description repeats an earlier one is left out.
"""
from __future__ import annotations

import math
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch

from ..graph.kinds import EDGE, NODE, EdgeKind, NodeKind
from ..packed import pack
from .scoring import order_desc, score_node_lists

GAMMA = 0.5
MAX_CACHED_DOCS = 4096  # ours: documents whose name tables a view keeps
MAX_CACHED_ENTRIES = 2_000_000  # ours: cached entries of ~100 bytes (names, unit terms, name tokens)
TOKEN_MATCH = 0.9

# Ours: English function words, question words, auxiliaries, and the words that open sentences
# in reports (the offline extractor takes capitalised sentence openers for names).
STOP_WORDS = frozenset("""
a about above according across after again against all almost along also although always am among an and
another any are around as at based be because been before being below between both but by can could did
do does doing done down during each either else even ever every few for from further get given had has
have having he her here hers him his how however i if in into is it its itself just least less let like
many may me might more most much must my near neither no nor not now of off often on once one only or
other others our ours out over own per please rather same shall she should show shown shows since so some
such than that the their theirs them then there these they this those though through thus to too total
toward under until up upon us use used using very via was we were what when where whether which while who
whom whose why will with within without would yes yet you your yours
according based derived following figure figures highlights including note page pages see shown table
tables
""".split())

_TERM = re.compile(r"[0-9]+(?:[.,][0-9]+)*|[a-z]+")


def terms(text: str) -> tuple[str, ...]:
    """Distinct terms of `text` in order of appearance (see the module docstring)."""
    out = []
    for t in _TERM.findall(text.lower()):  # indexing, not str methods: a third of the time per text
        if t[0].isalpha():
            n = len(t)
            if n < 2 or t in STOP_WORDS:
                continue
            if n >= 4 and t[-1] == "s" and t[-2] != "s":
                t = t[:-1]
        out.append(t)
    return tuple(dict.fromkeys(out))


@dataclass
class _DocNames:
    nodes: np.ndarray          # [n] entity nodes with at least one term
    keys: np.ndarray           # [n] alias key (group id, or -(node+1))
    terms: list                # [n] tuples of terms
    segments: list             # [n] int64 arrays: segment nodes of each entity's provenance
    tokens: tuple | None = None  # packed name token vectors (values, offsets), encoded on demand
    unit_df: dict | None = None  # term -> how many of the document's text units hold it (terms asked so far)
    unit_full: bool = False      # unit_df holds every term of the units
    units: np.ndarray | None = None  # the document's text units (segments and tables), graph nodes
    n_units: int = 0             # how many
    weight: int = 1              # cached entries (names, unit terms, name tokens), for the cache bound


class NameTable:
    """Per view: each document's entity names as terms and provenance segments, built the
    first time a query recalls the document (never for the whole corpus at once). At most
    `max_docs` documents and `max_entries` cached entries (names plus distinct unit terms) are
    kept, least recently recalled dropped first (the most recent always stays), so a long-lived
    service's memory is bounded whatever the corpus and its documents' sizes."""

    def __init__(self, view, max_docs: int = MAX_CACHED_DOCS, max_entries: int = MAX_CACHED_ENTRIES):
        self.view = view
        self.max_docs, self.max_entries = int(max_docs), int(max_entries)
        self.docs: OrderedDict[int, _DocNames] = OrderedDict()
        self.entries = 0  # Σ weight of the kept documents
        self._lock = threading.Lock()

    def doc(self, number: int) -> _DocNames:
        number = int(number)
        with self._lock:
            got = self.docs.get(number)
            if got is not None:
                self.docs.move_to_end(number)
                return got
        built = self._build(number)
        with self._lock:  # a racing query may have built it too: keep the first
            got = self.docs.get(number)
            if got is None:
                got = self.docs[number] = built
                self.entries += built.weight
                self._evict()
        return got

    def _grown(self, number: int, d: _DocNames, added: int) -> None:
        with self._lock:
            d.weight += added
            if self.docs.get(number) is d:
                self.entries += added
                self._evict()

    def _evict(self) -> None:
        while len(self.docs) > 1 and (len(self.docs) > self.max_docs or self.entries > self.max_entries):
            _, old = self.docs.popitem(last=False)
            self.entries -= old.weight

    def _build(self, number: int) -> _DocNames:
        view = self.view
        nodes = view.nodes_of_docs(np.asarray([number], np.int64), NodeKind.ENTITY)
        names = view.graph.node_names
        keep, ts, segs = [], [], []
        first_seg = int(view.node_first[int(np.searchsorted(view.numbers, number))]) + 1
        provs = view.index.document_node_segments(nodes)
        for v, prov in zip(nodes.tolist(), provs):
            t = terms(names[v]) if names is not None else terms(view.index.describe_node(v)["name"])
            if not t:
                continue  # a name of stop words and openers only: never a seed
            keep.append(v)
            ts.append(t)
            segs.append(prov.astype(np.int64) + first_seg)
        keep = np.asarray(keep, np.int64)
        a = view.alias_of[keep] if keep.size else np.zeros(0, np.int64)
        return _DocNames(keep, np.where(a >= 0, a, -(keep + 1)), ts, segs, weight=len(ts) + 1)

    def unit_frequencies(self, number: int, vocab=None) -> tuple[dict, int]:
        """``(df, n)``: for each term of `vocab` (None: every term), how many of the document's
        text units (segments and tables) hold it, and the number of units. Counts are kept per
        document as they are asked for. A unit can hold term t only if t occurs in its
        lower-cased text (a term is a lower-cased word, or a word less its plural "s", so a
        prefix of a word of the text): only units holding some asked term as a substring are
        split into terms, and what is counted is the same as splitting every unit."""
        d = self.doc(number)
        if d.units is None:
            view = self.view
            d.units = np.concatenate([view.nodes_of_docs(np.asarray([number], np.int64), k) for k in TEXT_UNITS])
            d.n_units = int(d.units.size)
        if d.unit_df is None:
            d.unit_df = {}
        if d.unit_full:
            return d.unit_df, d.n_units
        text = self.view.index.node_text
        if vocab is None:
            df: dict[str, int] = {}
            for v in d.units.tolist():
                for t in terms(text(v) or ""):
                    df[t] = df.get(t, 0) + 1
            added = len(df.keys() - d.unit_df.keys())
            d.unit_df, d.unit_full = df, True
        else:
            missing = [w for w in vocab if w not in d.unit_df]
            if not missing:
                return d.unit_df, d.n_units
            counts = dict.fromkeys(missing, 0)
            for v in d.units.tolist():
                low = (text(v) or "").lower()
                if any(w in low for w in missing):
                    for t in terms(low):
                        if t in counts:
                            counts[t] += 1
            d.unit_df.update(counts)
            added = len(missing)
        self._grown(number, d, added)
        return d.unit_df, d.n_units

    def name_tokens(self, number: int, encoder) -> tuple[torch.Tensor, torch.Tensor]:
        """Packed token vectors of the document's entity names (one encoder call per document,
        so a name's vectors never depend on the batch it was asked in)."""
        d = self.doc(number)
        if d.tokens is None:
            names = [" ".join(t) for t in d.terms]
            d.tokens = pack(encoder(names) if names else [], dtype=torch.float32) if names else \
                (torch.zeros((0, encoder.dim)), torch.zeros(1, dtype=torch.int64))
            # a float32 row of d values weighs as much as 4d/100 entries of ~100 bytes
            self._grown(number, d, int(d.tokens[0].shape[0]) * max(1, 4 * encoder.dim // 100))
        return d.tokens


def name_table(view) -> NameTable:
    """The view's :class:`NameTable`, kept on the view itself: it lives and dies with that index
    version, and two pipelines (or two views) never share or evict each other's tables."""
    table = view.__dict__.get("_name_table")
    if table is None:  # dict.setdefault is atomic: racing queries keep one table
        table = view.__dict__.setdefault("_name_table", NameTable(view))
    return table


@dataclass
class NameSeeds:
    """Per query: seed entities (best member of each alias group, best first), their σ, and the
    per-query candidate table used for support (entity node -> (alias key, segments))."""
    entities: list[np.ndarray]
    scores: list[np.ndarray]
    candidates: list[int]
    members: list[list[np.ndarray]] | None = None  # per query, per seed: the entities of its name group


def name_seeds(view, questions: list[str], text_q, docs: list[np.ndarray], kg: int, match: str,
               token_encoder=None) -> NameSeeds:
    """Seeds by entity names (module docstring) for every query. `text_q` is the packed
    question tokens ``(values [T, d], offsets [Nq+1])``; `token_encoder` the token encoder
    (needed for ``match="names"``)."""
    table = name_table(view)
    qv, qo = text_q
    ents, scores, ncand, groups = [], [], [], []
    for i, q in enumerate(questions):
        per = [table.doc(n) for n in docs[i].tolist()]
        qt = set(terms(q))
        nodes = np.concatenate([p.nodes for p in per]) if per else np.zeros(0, np.int64)
        ncand.append(int(nodes.size))
        if not nodes.size or not qt:
            ents.append(np.zeros(0, np.int64))
            scores.append(np.zeros(0, np.float32))
            groups.append([])
            continue
        keys = np.concatenate([p.keys for p in per])
        tlist = [t for p in per for t in p.terms]
        # only names sharing a term with the question can score: rarity for their terms alone
        hits = [j for j, t in enumerate(tlist) if not qt.isdisjoint(t)]
        vocab = {w for j in hits for w in tlist[j]}
        idf2 = _unit_idf2(table, docs[i], vocab) if vocab else {}  # no name matches: nothing to count
        qnorm = math.sqrt(sum(idf2[w] for w in qt if w in idf2))
        lex = np.zeros(nodes.size, np.float32)
        if qnorm > 0:
            for j in hits:
                t = tlist[j]
                lex[j] = sum(idf2[w] for w in t if w in qt) / (math.sqrt(sum(idf2[w] for w in t)) * qnorm)
        sigma = lex
        if match == "names" and token_encoder is not None:
            tok = np.concatenate([_name_maxsim(table.name_tokens(num, token_encoder), qv[qo[i]:qo[i + 1]])
                                  for num in docs[i].tolist()])
            counted = (lex > 0) | (tok >= TOKEN_MATCH)
            sigma = np.where(counted, 0.5 * lex + 0.5 * tok, 0.0).astype(np.float32)
        # a name group: the alias group, widened to every entity of D(q) with the same terms
        # ("Latino" and "Latinos", "PEW RESEARCH CENTER" and "Pew Research Center")
        name_key: dict[tuple, int] = {}
        group = np.asarray([name_key.setdefault(t, len(name_key)) for t in tlist], np.int64)
        by_alias: dict[int, int] = {}
        for j, k in enumerate(keys.tolist()):  # alias members share the group of the first seen
            group[j] = by_alias.setdefault(k, int(group[j]))
        pos = np.flatnonzero(sigma > 0)
        order = pos[order_desc(sigma[pos], nodes[pos])]
        _, first = np.unique(group[order], return_index=True)
        top = order[np.sort(first)][:kg]
        ents.append(nodes[top])
        scores.append(sigma[top])
        groups.append([nodes[group == group[j]] for j in top.tolist()])
    return NameSeeds(ents, scores, ncand, groups)


def _unit_idf2(table: NameTable, numbers: np.ndarray, vocab: set) -> dict[str, float]:
    """``{t: idf(t)²}`` for the terms `vocab`, counted over the text units of documents `numbers`."""
    freq = [table.unit_frequencies(n, vocab) for n in numbers.tolist()]
    n_units = sum(n for _, n in freq)
    return {w: math.log(1.0 + n_units / max(1, sum(df.get(w, 0) for df, _ in freq))) ** 2 for w in vocab}


def _name_maxsim(packed, q: torch.Tensor) -> np.ndarray:
    """``[n]`` mean over each name's tokens of the best cosine with the question's tokens
    (token vectors are unit-normalised by the token encoders; normalised here to be sure)."""
    v, o = packed
    if not v.shape[0] or not q.shape[0]:
        return np.zeros(max(int(o.numel()) - 1, 0), np.float32)
    vn = torch.nn.functional.normalize(v.float(), dim=1)
    qn = torch.nn.functional.normalize(q.float(), dim=1)
    best = (vn @ qn.T).max(dim=1).values  # [T_names]
    lens = (o[1:] - o[:-1]).clamp(min=1)
    sums = torch.zeros(o.numel() - 1, dtype=torch.float32).index_add_(
        0, torch.repeat_interleave(torch.arange(o.numel() - 1), o[1:] - o[:-1]), best)
    return (sums / lens).numpy().astype(np.float32)


@dataclass
class Support:
    """Per query: ``segment_support`` ({segment or table node: Σ_G σ_G a_G(u)}, before
    dividing by the mass), the total seed mass Σσ_G, and the entities reached
    ({node: (hop, σ_G γ^hop)}, first reach kept)."""
    segment_support: list[dict[int, float]]
    mass: list[float]
    reached: list[dict[int, tuple[int, float]]]


def graph_support(view, scorer, seeds: NameSeeds, docs: list[np.ndarray], hops: int, *, filter: str,
                  threshold: float, min_keep: int, budget: int) -> Support:
    """``a_G(u)`` and ``g(u)`` of every segment a seed group reaches within `hops` (module docstring)."""
    table = name_table(view)
    roff, redges = view.relation_csr

    def neighbours(frontier: list[int], seen: set, allowed: set) -> list[int]:
        """Entities one relation edge from `frontier`, inside `allowed` documents, not in `seen`
        (added to it), in discovery order."""
        nxt = []
        for v in frontier:
            for r in redges[roff[v]:roff[v + 1]].tolist():
                x = int(view.edge_dst[r]) if int(view.edge_src[r]) == v else int(view.edge_src[r])
                if x not in seen and int(view.node_doc[x]) in allowed and view.node_kind[x] == NODE.ENTITY:
                    seen.add(x)
                    nxt.append(x)
        return nxt

    # Each seed group's members and first hop, for every query first: the filter then scores the
    # first hops of all seeds of all queries in one call (it caches per query and item, so the
    # per-seed calls below find their scores; the items scored are those one call per seed scores).
    starts = []
    ranges = [view.document_node_ranges(d) for d in docs]  # D(q)'s nodes: groups are read inside them only
    for i in range(len(docs)):
        allowed = set(docs[i].tolist())
        per_seed = []
        for j, e in enumerate(seeds.entities[i].tolist()):
            g = int(view.alias_of[e])
            members = view.alias_members_in(g, ranges[i]) if g >= 0 else np.asarray([e], np.int64)
            if seeds.members is not None:
                members = np.union1d(members, seeds.members[i][j])
            members = members[np.isin(view.node_doc[members], docs[i])]
            frontier = [int(v) for v in members.tolist()]
            seen = set(frontier)
            per_seed.append((frontier, seen, neighbours(frontier, seen, allowed) if hops > 0 else []))
        starts.append((allowed, per_seed))
    if filter != "off" and hops > 0:
        scorer.entities([np.unique(np.asarray([x for _, _, nxt in per_seed for x in nxt], np.int64))
                         for _, per_seed in starts])
    out_seg, out_mass, out_reached = [], [], []
    for i in range(len(docs)):
        allowed, per_seed = starts[i]
        segs_of = {}
        for num in docs[i].tolist():
            d = table.doc(num)
            segs_of.update(zip(d.nodes.tolist(), d.segments))
        support: dict[int, float] = {}
        reached: dict[int, tuple[int, float]] = {}
        mass = float(seeds.scores[i].sum()) if seeds.scores[i].size else 0.0
        for (frontier, seen, first_hop), s in zip(per_seed, seeds.scores[i].tolist()):
            share: dict[int, float] = {}  # unit -> a_G(u)
            for v in frontier:
                reached.setdefault(v, (0, s))
            for h in range(hops + 1):
                # a_G(u) at hop h: γ^h times the share of the groups first reached at hop h
                # that u mentions (1 at hop 0: u names the seed group itself)
                keys = {v: _key(view, v) for v in frontier}
                n_groups = len(set(keys.values()))
                mentioned: dict[int, set] = {}
                for v in frontier:
                    for u in segs_of[v].tolist() if v in segs_of else _segments(view, v):
                        mentioned.setdefault(u, set()).add(keys[v])
                for u, ks in mentioned.items():
                    a = 1.0 if h == 0 else GAMMA ** h * len(ks) / n_groups
                    if a > share.get(u, 0.0):
                        share[u] = a
                if h == hops:
                    break
                nxt = first_hop if h == 0 else neighbours(frontier, seen, allowed)
                if filter != "off" and nxt:
                    nx = np.asarray(nxt, np.int64)
                    sc = _scores_for(scorer, i, nx, len(docs))
                    order = order_desc(sc, nx)
                    passed = order[sc[order] > threshold]
                    if passed.size < min_keep:
                        passed = order[np.isfinite(sc[order])][:min_keep]
                    nxt = nx[passed].tolist()
                nxt = nxt[:budget]
                # an entity reached is its alias group: its members in other pages and documents
                # are reached at the same hop (the cross-document hop path)
                wider = []
                for x in nxt:
                    a = int(view.alias_of[x])
                    for y in (view.alias_members_in(a, ranges[i]).tolist() if a >= 0 else ()):
                        if y not in seen:
                            seen.add(y)
                            wider.append(y)
                nxt = nxt + wider
                for x in nxt:
                    reached.setdefault(x, (h + 1, s * GAMMA ** (h + 1)))
                frontier = nxt
                if not frontier:
                    break
            for u, a in share.items():
                support[u] = support.get(u, 0.0) + s * a
        out_seg.append(support)
        out_mass.append(mass)
        out_reached.append(reached)
    return Support(out_seg, out_mass, out_reached)


def _key(view, v: int) -> int:
    a = int(view.alias_of[v])
    return a if a >= 0 else -(v + 1)


def _segments(view, v: int) -> list[int]:
    first = int(view.node_first[int(np.searchsorted(view.numbers, view.node_doc[v]))]) + 1
    return [first + int(o) for o in view.index.node_segments(v)]


def _scores_for(scorer, i: int, nodes: np.ndarray, nq: int) -> np.ndarray:
    """Filter scores of `nodes` for query i alone (the scorer caches per query)."""
    lists = [np.zeros(0, np.int64)] * nq
    lists[i] = nodes
    return scorer.entities(lists)[i]


TEXT_UNITS = {NodeKind.SEGMENT: "segment", NodeKind.TABLE: "table"}


def normalise(m: np.ndarray, k: int) -> np.ndarray:
    """``(m - m_(k)) / (m_(1) - m_(k))`` with m_(1), m_(k) the best and k-th best finite values
    (divisor 1 where equal); -inf stays -inf."""
    fin = np.sort(m[np.isfinite(m)])[::-1]
    if not fin.size:
        return m.astype(np.float64)
    top, kth = float(fin[0]), float(fin[min(k, fin.size) - 1])
    div = top - kth if top > kth else 1.0
    return (m.astype(np.float64) - kth) / div


def rank_text_units(view, text_q, docs: list[np.ndarray], support: Support, k: int, beta: float):
    """Per query: ``(units [n], score [n], maxsim [n], g [n])`` over every segment and table of
    the query's documents, by the rule of the module docstring (best first)."""
    lists = []
    for d in docs:
        parts = [view.nodes_of_docs(d, kind) for kind in TEXT_UNITS]
        lists.append(np.concatenate(parts) if parts else np.zeros(0, np.int64))
    m = score_node_lists(view, TEXT_UNITS, text_q, lists, "maxsim")
    out = []
    for i, units in enumerate(lists):
        g = _g(units, support.segment_support[i], support.mass[i])
        s = normalise(m[i], k) + beta * g
        ok = np.isfinite(m[i])
        units, s, mi, g = units[ok], s[ok], m[i][ok], g[ok]
        o = order_desc(s, units)
        out.append((units[o], s[o], mi[o], g[o]))
    return out


def _g(units: np.ndarray, support: dict[int, float], mass: float) -> np.ndarray:
    if mass <= 0 or not support:
        return np.zeros(units.size, np.float64)
    return np.asarray([support.get(int(u), 0.0) for u in units.tolist()], np.float64) / mass


def image_support(view, nodes: np.ndarray, support: dict[int, float], mass: float,
                  reached: dict[int, tuple[int, float]]) -> np.ndarray:
    """``[n]`` g(x) of images and regions: the best support of a segment containing the image
    (a region: its image), or the seed mass of the entities it depicts, whichever is larger."""
    if mass <= 0 or not nodes.size:
        return np.zeros(nodes.size, np.float64)
    parent = _parents(view)
    out = np.zeros(nodes.size, np.float64)
    for j, x in enumerate(nodes.tolist()):
        best = 0.0
        img = parent["image_of"].get(x, x)
        for sgm in parent["segments_of"].get(img, ()):
            best = max(best, support.get(sgm, 0.0))
        dep = sum(reached[e][1] for e in parent["depicts"].get(x, ()) if e in reached)
        out[j] = max(best, dep) / mass
    return out


_PARENTS: dict = {}


def _parents(view) -> dict:
    got = _PARENTS.get(id(view))
    if got is not None and got[0] is view:
        return got[1]
    src, dst, kind, nk = view.edge_src, view.edge_dst, view.edge_kind, view.node_kind
    c = kind == EDGE.CONTAINS
    segments_of: dict[int, list[int]] = {}
    image_of: dict[int, int] = {}
    for u, v in zip(src[c].tolist(), dst[c].tolist()):
        if nk[u] == NODE.SEGMENT and nk[v] == NODE.IMAGE:
            segments_of.setdefault(v, []).append(u)
        elif nk[u] == NODE.IMAGE and nk[v] == NODE.REGION:
            image_of[v] = u
    depicts: dict[int, list[int]] = {}
    dmask = np.isin(kind, (EdgeKind.DEPICTS, EdgeKind.DEPICTS_RELATION))
    for u, v in zip(src[dmask].tolist(), dst[dmask].tolist()):
        depicts.setdefault(u, []).append(v)
    table = {"segments_of": segments_of, "image_of": image_of, "depicts": depicts}
    _PARENTS.clear()
    _PARENTS[id(view)] = (view, table)
    return table




def _of_seeds(seeds) -> NameSeeds:
    """``seed_match="descriptions"`` under ``"graph+chunks"``: mKG-RAG's entity seeds, σ = their
    cosine (seeds with σ <= 0 dropped)."""
    ents, scores = [], []
    for e, s in zip(seeds.entities, seeds.entity_scores):
        ok = s > 0
        ents.append(e[ok])
        scores.append(s[ok].astype(np.float32))
    return NameSeeds(ents, scores, list(seeds.candidates.get("entity_candidates", [0] * len(ents))))


NameSeeds.of = staticmethod(_of_seeds)


def seeds_from_names(seeds, named: NameSeeds, view, nq: int):
    """A :class:`~.graph_retrieval.Seeds` whose entity seeds are the name seeds (relation and
    image seeds kept when `seeds` has them): what stage 4 of ``"graph"`` expands from."""
    from .graph_retrieval import Seeds

    empty = [np.zeros(0, np.int64) for _ in range(nq)]
    if seeds is None:
        seeds = Seeds(empty, [np.zeros(0, np.float32)] * nq, empty, [np.zeros(0, np.float32)] * nq, empty, empty,
                      empty, {})
    nodes = []
    for i in range(nq):
        r = seeds.relations[i]
        ends = np.stack([view.edge_src[r], view.edge_dst[r]], 1).reshape(-1)
        allv = np.concatenate([named.entities[i], ends, seeds.image_linked[i]]).astype(np.int64)
        _, first = np.unique(allv, return_index=True)
        nodes.append(allv[np.sort(first)])
    cands = dict(seeds.candidates)
    cands["entity_candidates"] = named.candidates
    return Seeds(named.entities, named.scores, seeds.relations, seeds.relation_scores, seeds.image_hits,
                 seeds.image_linked, nodes, cands)


def added_subgraph(view, scorer, ranked, support: Support, named: NameSeeds, docs: list[np.ndarray], k: int,
                   kg: int):
    """The ``"graph+chunks"`` subgraph: per query the top `k` text units by the combined rule
    (hop 0), the seed entities (hop 0) and further entities the hops reached (best weight
    first) up to `kg` entities in all, those of weight at least half the best seed's, and the
    relations among those entities (the `kg` best: summed endpoint weights, then cosine with
    the question). An entity or relation whose description repeats
    one kept before it is left out (the offline extractor gives many entities one sentence)."""
    from .graph_retrieval import Subgraph

    sub = Subgraph([], [], [], [], [], [])
    rel_lists, weights = [], []
    roff, redges = view.relation_csr
    for i, (units, score, _, _) in enumerate(ranked):
        reached = support.reached[i]
        seed_set = set(named.entities[i].tolist())
        others = sorted((v for v in reached if v not in seed_set), key=lambda v: (-reached[v][1], v))
        others = others[:max(kg - len(seed_set), 0)]  # at most kg entities in all
        # the context names the strong matches: weight at least half the best seed's (ours), and
        # an entity whose description repeats one kept before it adds no text to the context
        floor = 0.5 * float(named.scores[i].max()) if named.scores[i].size else 0.0
        wt = dict(zip(named.entities[i].tolist(), named.scores[i].tolist()))
        ents, said = [], set()
        for v in named.entities[i].tolist() + others:
            if wt.get(v, reached.get(v, (0, 0.0))[1]) < floor:
                continue
            text = view.index.describe_node(v)["text"]
            if text and text in said:
                continue
            said.add(text)
            ents.append(v)
        w = {v: reached.get(v, (0, 0.0))[1] for v in ents}
        w.update(zip(named.entities[i].tolist(), named.scores[i].tolist()))
        nodes = np.asarray(units[:k].tolist() + ents, np.int64)
        hop = np.asarray([0] * min(k, units.size) + [reached.get(v, (0, 0.0))[0] for v in ents], np.int32)
        sc = np.asarray(score[:k].tolist() + [w[v] for v in ents], np.float32)
        sub.nodes.append(nodes)
        sub.hop.append(hop)
        sub.score.append(sc)
        # relations with both ends among the kept entities' alias groups
        keyset = {}
        for v in ents:
            g = int(view.alias_of[v])
            keyset.setdefault(g if g >= 0 else -(v + 1), 0.0)
            keyset[g if g >= 0 else -(v + 1)] = max(keyset[g if g >= 0 else -(v + 1)], w[v])
        # the groups' members inside D(q) only (the kept entities are D(q)'s too): a relation
        # edge never leaves its document (kg.document builds them per document), so members
        # elsewhere could end no candidate
        members = set()
        ranges = view.document_node_ranges(docs[i])
        for key in keyset:
            members.update(view.alias_members_in(key, ranges).tolist() if key >= 0 else [-key - 1])
        cand = set()
        for v in members:
            for r in redges[roff[v]:roff[v + 1]].tolist():
                a, b = int(view.edge_src[r]), int(view.edge_dst[r])
                if a in members and b in members:
                    cand.add(r)
        rel = np.asarray(sorted(cand), np.int64)
        rel_lists.append(rel)

        def key_of(v):
            g = int(view.alias_of[v])
            return g if g >= 0 else -(v + 1)
        weights.append(np.asarray([keyset[key_of(int(view.edge_src[r]))] + keyset[key_of(int(view.edge_dst[r]))]
                                   for r in rel.tolist()], np.float64))
    cos = scorer.relations(rel_lists)
    for i, (rel, wt, c) in enumerate(zip(rel_lists, weights, cos)):
        o = np.lexsort((rel, -np.nan_to_num(c.astype(np.float64), nan=-np.inf), -wt))
        said = {view.index.describe_node(int(v))["text"] for v in sub.nodes[i][sub.nodes[i] >= 0].tolist()
                if view.node_kind[v] == NODE.ENTITY}
        keep = []
        for j in o.tolist():  # as for entities: a relation whose description is already said is left out
            text = view.index.describe_edge(int(rel[j]))["text"]
            if text and text in said:
                continue
            said.add(text)
            keep.append(j)
            if len(keep) == kg:
                break
        o = np.asarray(keep, np.int64)
        sub.relations.append(rel[o])
        sub.relation_scores.append(c[o].astype(np.float32))
        sub.edges.append(np.sort(rel[o]))
    sub.judged = scorer.scored.copy()
    return sub


def rerank_visual(view, visual, support: Support, k: int, beta: float):
    """E_k under ``"graph+chunks"``: every ranked candidate's visual score normalised as the text
    units' MaxSim (k-th best = `k`), plus β · g(x); the top `k` kept, with the combined score."""
    from .visual import Visual

    nodes, scores = [], []
    for i in range(len(visual.nodes)):
        n, s = visual.nodes[i], visual.scores[i]
        g = image_support(view, n, support.segment_support[i], support.mass[i], support.reached[i])
        c = normalise(s, k) + beta * g
        o = order_desc(c, n)[:k]
        nodes.append(n[o])
        scores.append(c[o].astype(np.float32))
    return Visual(visual.candidates, nodes, scores, visual.units, visual.used_question)


_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")


def focus(text: str, question_terms: set, max_sentences: int = 2, max_words: int = 50) -> str:
    """The sentences of `text` that share most terms with the question (at most `max_sentences`,
    in their order in `text`; the first sentence when none shares a term), then at most
    `max_words` words of them (ours: 2 sentences, 50 words). An entity's
    description from the offline extractor is every sentence it occurs in (hundreds of tokens
    for a frequent name); the context keeps the ones about the question."""
    parts = [p.strip() for p in _SENTENCE.split(text or "") if p and p.strip()]
    if len(parts) > max_sentences:
        hits = [(len(set(terms(p)) & question_terms), j) for j, p in enumerate(parts)]
        best = sorted((h for h in hits if h[0] > 0), key=lambda h: (-h[0], h[1]))[:max_sentences]
        text = " ".join(parts[j] for j in (sorted(j for _, j in best) or [0]))
    words = text.split()
    if len(words) <= max_words:
        return text
    # a run-on "sentence" (page text without stops): the window of max_words words holding the
    # most question terms, the first such window on ties
    hit = np.asarray([bool(set(terms(w)) & question_terms) for w in words], np.int64)
    sums = np.convolve(hit, np.ones(max_words, np.int64), "valid")
    start = int(np.argmax(sums))
    return " ".join(words[start:start + max_words])


def focus_evidence(evidence, questions: list[str]) -> None:
    """``"graph+chunks"``: each entity's and relation's description in the evidence (and so in
    the context) cut to its sentences about the question (:func:`focus`)."""
    for ev, q in zip(evidence, questions):
        qt = set(terms(q))
        for e in ev.entities:
            e["description"] = focus(e["description"], qt)
        for r in ev.relations:
            r["description"] = focus(r["description"], qt)



__all__ = ["NameSeeds", "STOP_WORDS", "Support", "added_subgraph", "graph_support", "image_support", "name_seeds",
           "focus", "focus_evidence", "normalise", "rank_text_units", "rerank_visual", "seeds_from_names",
           "terms"]
