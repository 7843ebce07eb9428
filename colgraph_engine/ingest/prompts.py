"""Prompts for the model hooks, written for this project.

What carries over from the papers' code is the *format* our parsers read and a few ideas, not
wording: LightRAG's current line format for extraction (one record per line, fields separated
by ``<|#|>``, ``<|COMPLETE|>`` at the end; relation fields ``source, target, keywords,
description``) and its gleaning idea (ask again, in the same conversation, for what the first
answer missed); mKG-RAG's scene graphs (``<object-i>: category, (x1, y1, x2, y2)`` with
coordinates in [0, 1], ``<relation-j>: <object-a> predicate <object-b>``) and its vision-text
matching records (``("mapping"<|><image>|<object-i>|<relation-j> ...<|>score)`` with scores from
0 to 10, as its matching prompt states). mKG-RAG gets its scene graphs from a detector (EGTR),
not from a prompt; the scene-graph prompt here is ours. Every example below is invented for
this file (the companies and places do not exist).

Each prompt is a ``str.format`` template; the placeholders are listed beside it. Changing any
text here changes the cache keys of the calls that use it (the messages are hashed), so old
cache entries are simply not hit again.
"""
from __future__ import annotations

DELIMITER = "<|#|>"          # LightRAG's current field delimiter (kg.parsers.CURRENT_DELIMITER)
TUPLE_DELIMITER = "<|>"      # the tuple dialect's, used by mapping records
COMPLETE = "<|COMPLETE|>"

# Our choice: kinds of things that reports, papers and slide decks name; LightRAG's own list
# differs between versions and is tuned to narrative text.
DEFAULT_ENTITY_TYPES = ("person", "organization", "location", "event", "date", "product", "technology",
                        "concept", "method", "metric", "artifact")

# -- text extraction ------------------------------------------------------------------------------
# Placeholders: {entity_types}, {language}, {delimiter}, {complete}, {record_limit}.
EXTRACTION_SYSTEM = """You build a knowledge graph from documents. You read one passage at a time and list the entities it names and the relations it states between them.

Write one record per line and nothing else: no headings, no numbering, no commentary, no code fences.

Entity lines have exactly four fields separated by {delimiter}:
entity{delimiter}NAME{delimiter}TYPE{delimiter}DESCRIPTION
- NAME: the entity as the passage names it, with proper capitalisation; use the same NAME every time you refer to it.
- TYPE: one of: {entity_types}. If none fits, use the closest one.
- DESCRIPTION: one or two sentences about this entity that the passage supports. Add nothing the passage does not say.

Relation lines have exactly five fields separated by {delimiter}:
relation{delimiter}SOURCE{delimiter}TARGET{delimiter}KEYWORDS{delimiter}DESCRIPTION
- SOURCE and TARGET: NAMEs of entities you listed; never the same entity twice.
- KEYWORDS: a few comma-separated words for the kind of link (e.g. "ownership, funding").
- DESCRIPTION: one sentence saying how the passage connects the two.

Rules:
- List the entities first, then the relations.
- Never put {delimiter} or a line break inside a field.
- Write descriptions and keywords in {language}; keep names of people, places and organisations as they are written.{record_limit}
- After the last record, write {complete} on its own line.

Example passage:
In 2019 the harbour authority of Velmora hired Kestrel Dynamics to automate its container cranes. The project cut unloading times by 30 percent.

Example answer:
entity{delimiter}Velmora Harbour Authority{delimiter}organization{delimiter}The body that runs the harbour of Velmora; it hired Kestrel Dynamics in 2019 to automate its container cranes.
entity{delimiter}Kestrel Dynamics{delimiter}organization{delimiter}A company hired in 2019 to automate the container cranes of Velmora's harbour.
entity{delimiter}Container Crane Automation{delimiter}event{delimiter}The 2019 project that automated Velmora's container cranes and cut unloading times by 30 percent.
entity{delimiter}2019{delimiter}date{delimiter}The year Kestrel Dynamics was hired for the crane project.
relation{delimiter}Velmora Harbour Authority{delimiter}Kestrel Dynamics{delimiter}contract, automation{delimiter}The harbour authority hired Kestrel Dynamics to automate its cranes.
relation{delimiter}Kestrel Dynamics{delimiter}Container Crane Automation{delimiter}execution{delimiter}Kestrel Dynamics carried out the crane automation project.
relation{delimiter}Container Crane Automation{delimiter}2019{delimiter}timing{delimiter}The crane automation project started in 2019.
{complete}"""

# Placeholders: {text}.
EXTRACTION_USER = """Passage:
<<<
{text}
>>>

List its entities and relations in the line format above, then {complete}."""

# Placeholders: {delimiter}, {complete}. Sent after the model's previous answer, in the same
# conversation; see hooks.LLMExtractor for when the rounds stop.
GLEANING_USER = """Go through the passage once more and compare it with what you listed. Write only records you left out, or records you wrote with a missing field, in the same line format ({delimiter} between fields). Do not repeat lines that were already correct. Relations may name entities you listed before.

If nothing is missing, answer with the single line {complete}. Otherwise end with {complete} as before."""

# -- images -----------------------------------------------------------------------------------------
# Placeholders: {max_objects}, {max_relations}, {box_rule}.
SCENE_GRAPH_USER = """Describe this image as a scene graph.

First list up to {max_objects} distinct, clearly visible objects, most important first, one per line:
<object-N>: CATEGORY, (x1, y1, x2, y2)
- N counts from 0.
- CATEGORY is a short lowercase noun phrase ("man", "red car", "bar chart", "table of numbers").
- {box_rule}

Then list up to {max_relations} relations between the listed objects, one per line:
<relation-M>: <object-A> PREDICATE <object-B>
- M counts from 0; A and B are numbers of objects listed above, and A differs from B.
- PREDICATE is a short verb or spatial phrase ("holding", "on", "left of", "part of").

Write nothing else. Example of the format:
<object-0>: cyclist, (0.12, 0.20, 0.45, 0.98)
<object-1>: bicycle, (0.30, 0.55, 0.80, 0.97)
<object-2>: helmet, (0.20, 0.18, 0.33, 0.30)
<relation-0>: <object-0> riding <object-1>
<relation-1>: <object-0> wearing <object-2>"""

BOX_RULES = {
    "fraction": ("(x1, y1) is the top-left and (x2, y2) the bottom-right corner of the object's box, as fractions of "
                 "the image width and height between 0 and 1, with two decimals."),
    "pixels": ("(x1, y1) is the top-left and (x2, y2) the bottom-right corner of the object's box, in pixels of this "
               "image ({width} x {height})."),
    "per_mille": ("(x1, y1) is the top-left and (x2, y2) the bottom-right corner of the object's box, as integers from "
                  "0 to 1000 (thousandths of the image width and height)."),
}

# Placeholders: {entities}, {relations}, {scene_graph}, {d} (the tuple delimiter), {complete}.
MATCH_USER = """Link what this image shows to entities of the document it comes from.

Entities of the document (NAME (TYPE): description):
{entities}

Relations between them (SOURCE -> TARGET: description):
{relations}

Scene graph of the image (objects with boxes as fractions of width and height, and relations between objects):
{scene_graph}

Write one record per line:
1. Exactly one record for the whole image, naming the entity it shows best:
("mapping"{d}"<image>"{d}NAME{d}SCORE)
2. For each object that shows one of the entities:
("mapping"{d}"<object-N>"{d}NAME{d}SCORE)
3. For each relation of the scene graph that shows one of the document's relations:
("mapping"{d}"<relation-M>"{d}SOURCE{d}TARGET{d}SCORE)

- NAME, SOURCE and TARGET are copied exactly from the entity list, never object categories.
- SCORE is an integer from 0 (unrelated) to 10 (certainly the same thing).
- Leave out objects and relations that show none of the entities or relations.
- Write nothing else, and end with {complete} on its own line.

Example: for a photo with <object-0>: bus and <object-1>: bridge, and the entities "Line 7 Express" and "Orrin Bridge":
("mapping"{d}"<image>"{d}Orrin Bridge{d}7)
("mapping"{d}"<object-0>"{d}Line 7 Express{d}8)
("mapping"{d}"<object-1>"{d}Orrin Bridge{d}9)
("mapping"{d}"<relation-0>"{d}Line 7 Express{d}Orrin Bridge{d}7)
{complete}"""

# Placeholders: {max_words}, {language}.
CAPTION_USER = """Write a caption for this image, for a search index over documents. In at most {max_words} words of {language}, say what it shows; for a chart or table, its kind and topic, the axes or columns and any clearly readable title, labels and numbers; otherwise the main objects, people, place and action. Copy legible text exactly. Write only the caption, without an introduction."""
