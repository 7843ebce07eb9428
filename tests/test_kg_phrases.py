"""The rule-based phrase extractor (kg.extract.PhraseExtractor), its chunker and caption linking.

Sentences are written in the style of the report, paper and manual pages the engine indexes
(flowed PDF text, table rows run together, layout lines); none is copied from a document.
"""
import pytest

from colgraph_engine.graph.kinds import EdgeKind, NodeKind
from colgraph_engine.kg import DocumentInput, ImageInput, PhraseExtractor, Section, build_document_graph
from colgraph_engine.kg.captions import caption_definitions, figure_links
from colgraph_engine.kg.chunker import noun_phrases, tag
from colgraph_engine.kg.extract import split_sentences
from colgraph_engine.kg.parsers import parse_extraction


def run(text, **kw):
    result = parse_extraction(PhraseExtractor(**kw)(text), strict=True)
    assert result.complete
    return result


def names(text, **kw):
    return {e.name: e.type for e in run(text, **kw).entities}


def test_sentence_openers_and_stop_words_are_not_entities():
    got = names("Using the new survey, we found that older adults use tablets. However, older adults rarely "
                "use smartwatches. The survey was run in 2014. Derived weights follow the census.")
    assert "older adults" in got and "survey" in got and got["2014"] == "date"
    for junk in ("Using", "We", "we", "However", "The", "Derived"):
        assert junk not in got


def test_capitalised_opener_is_a_name_only_when_the_text_treats_it_as_one():
    # "Highlights" appears in lower case elsewhere: a common word; "Velmora" is capitalised mid-sentence too
    got = names("Highlights of the year follow. Three highlights stand out. Velmora grew fast. "
                "Exports from Velmora doubled.")
    assert got.get("Highlights") != "name" and got["Velmora"] == "name"


def test_noun_phrases_and_proper_names_with_connectors():
    got = names("The Bank of Japan opened a regional branch in Osaka in 1882. The claim verifier is a central "
                "component of the system.")
    assert got["Bank of Japan"] == "name" and got["Osaka"] == "name" and got["1882"] == "date"
    assert got["regional branch"] == "concept" and got["claim verifier"] == "concept"
    assert got["central component"] == "concept"


def test_acronyms_and_technical_names():
    got = names("We compare GPT-4 with LLaMA and BERT on the HOVER benchmark. QACHECK answers in 3M steps.")
    assert got["GPT-4"] == "acronym" and got["BERT"] == "acronym" and got["QACHECK"] == "acronym"
    assert got["LLaMA"] == "name" and got["HOVER benchmark"] == "name"


def test_numbers_with_units_and_dates():
    got = names("Operating margins were 22.4 percent on December 31, 2018, and revenue reached $ 2,952 million "
                "in Q3 2015. The tank holds 1.8 litres; the survey ran Feb. 1-7, 2021 and 3% of adults answered.")
    assert got["22.4 percent"] == "quantity" and got["$ 2,952 million"] == "quantity"
    assert got["December 31, 2018"] == "date" and got["Q3 2015"] == "date" and got["Feb. 1-7, 2021"] == "date"
    assert got["1.8 litres"] == "quantity" and got["3%"] == "quantity"
    assert not any(n.isdigit() and len(n) < 4 for n in got)  # a bare small number is no entity


def test_table_row_labels_in_flowed_text_and_layout_lines():
    got = names("Organic sales by segment: Industrial 2.5 % (0.1) % Safety and Graphics 3.3 (0.2) "
                "Health Care 4.8 (2.4)")
    assert got["Safety and Graphics"] == "label" and got["Health Care"] == "label"
    lines = names("Human rights\nLack of freedoms\nEconomy\nPopulation size")
    assert lines == {"Human rights": "label", "Lack of freedoms": "label", "Economy": "label",
                     "Population size": "label"}
    header = names("Page 12\nNOTE\nQuarterly revenue by region\nRevenue grew in every region.")
    assert "Page" not in header and "NOTE" not in header and header["Quarterly revenue by region"] == "label"


def test_no_entity_runs_over_the_word_limit():
    got = names("The Copernicus programme lists: Sentinel Landsat Terra Aqua Suomi Jason Cryosat Envisat Metop were compared.")
    assert "Copernicus programme" in got and all(len(n.split()) <= 6 for n in got)
    text = "Earth observation satellites of the European Space Agency."
    assert names(text, max_words=3) == {"Earth observation satellites": "name", "European Space Agency": "name"}
    assert names(text, max_words=2) == {}


def test_description_is_the_mention_window_not_the_sentence():
    text = ("After a long review of every alternative design that the committee had received over the past "
            "eleven months, the city council finally approved the Orrin Bridge for the northern harbour district.")
    ents = {e.name: e.description for e in run(text, context_words=4).entities}
    assert ents["Orrin Bridge"] == "council finally approved the Orrin Bridge for the northern harbour"
    assert len(set(ents.values())) == len(ents)  # no two entities share one description


def test_relation_labels_come_from_verbs_and_prepositions_never_cooccurs():
    result = run("The claim verifier was built on InstructGPT. Sales margins in Europe rose. "
                 "Tokyo, Osaka, Kyoto.")
    rel = {(r.source, r.target): r.keywords for r in result.relations}
    assert rel[("claim verifier", "InstructGPT")] == "was built on"
    assert rel[("Sales margins", "Europe")] == "in"
    assert ("Tokyo", "Osaka") not in rel and ("Osaka", "Kyoto") not in rel  # only commas between: no relation
    assert all(r.keywords and r.keywords != "co-occurs" for r in result.relations)
    assert rel and all(len(r.description) < 80 for r in result.relations)  # the span between, not the page


def test_figure_captions_and_references_meet_in_one_entity():
    result = run("Accuracy rises with depth, as shown in Fig. 3.\nFigure 3: Accuracy of the three readers on HOVER.")
    figs = [e for e in result.entities if e.type == "figure"]
    assert [(e.name, e.description) for e in figs] == [("Figure 3", "Accuracy of the three readers on HOVER.")]


def test_line_break_hyphens_are_joined_back_and_compounds_kept():
    got = names("The claim verifica-tion process uses in-context learning. The learn-ing rate of the learning "
                "schedule is real-time tuned.")
    assert "claim verification process" in got and "in-context learning" in got and "learning rate" in got


def test_sentence_split_keeps_abbreviations():
    assert split_sentences("See Fig. 2 for U.S. adults. Results follow. J. Smith et al. 2020 agreed.") == [
        "See Fig. 2 for U.S. adults.", "Results follow.", "J. Smith et al. 2020 agreed."]


def test_chunker_tags_and_noun_phrases():
    toks = tag("The increase in sales was driven by Health Care.")
    assert [t.tag for t in toks] == ["DET", "NOUN", "PREP", "NOUN", "AUX", "VERB", "PREP", "PROPN", "PROPN", "PUNCT"]
    assert [" ".join(t.text for t in toks[i:j]) for i, j in noun_phrases(toks)] == ["increase", "sales",
                                                                                   "Health Care"]


def test_output_is_deterministic_and_bad_arguments_are_refused():
    text = "The Shinkansen leaves Tokyo Station every ten minutes."
    assert PhraseExtractor()(text) == PhraseExtractor()(text)
    assert PhraseExtractor()("").strip() == "<|COMPLETE|>"
    with pytest.raises(TypeError, match="text: expected str"):
        PhraseExtractor()(b"bytes")
    for arg in ("window", "context_words", "max_gap", "max_words"):
        with pytest.raises(ValueError, match=arg):
            PhraseExtractor(**{arg: 0})
    assert PhraseExtractor.name == "phrases-v1"


def test_caption_definitions_and_their_images():
    text = ("Results appear in Figure 3, below. Figure 3: The architecture of the checker. It has five parts.\n"
            "Table 2. Accuracy on HOVER\nsee Table 2 for details 0.51 Figure 4: Examples of claims")
    assert caption_definitions(text) == [("figure", "Figure 3", "The architecture of the checker."),
                                         ("table", "Table 2", "Accuracy on HOVER"),
                                         ("figure", "Figure 4", "Examples of claims")]
    links = figure_links([text], [["page-3", "page-3-image-1", "page-3-image-2"]])
    assert links == {"page-3-image-1": [("Figure 3", "The architecture of the checker.", 0)],
                     "page-3-image-2": [("Figure 4", "Examples of claims", 0)],
                     "page-3": [("Table 2", "Accuracy on HOVER", 0)]}
    # three embedded images for two captions is ambiguous: the page render takes both figures
    amb = figure_links([text], [["page-3", "a", "b", "c"]])
    assert [label for label, _, _ in amb["page-3"]] == ["Figure 3", "Figure 4", "Table 2"] and "a" not in amb
    with pytest.raises(ValueError, match="texts, images"):
        figure_links(["x"], [])


def test_build_captions_an_embedded_image_and_links_it_to_its_figure():
    doc = DocumentInput("d", [Section("The checker has five modules. Figure 3: The architecture of the checker "
                                      "with five modules.", images=("page-1", "page-1-image-1"))],
                        images=[ImageInput("page-1", caption="the page"), ImageInput("page-1-image-1")])
    g = build_document_graph(doc)
    img = next(v for v in g.nodes_of(NodeKind.IMAGE) if g.node_name[v] == "page-1-image-1")
    assert g.node_text[img] == "Figure 3: The architecture of the checker with five modules."
    fig = g.entity("Figure 3")
    dep = [e for e in g.edges_of(EdgeKind.DEPICTS) if g.edge_src[e] == img]
    assert [int(g.edge_dst[e]) for e in dep] == [fig] and g.edge_keywords[dep[0]] == "caption"
    page = next(v for v in g.nodes_of(NodeKind.IMAGE) if g.node_name[v] == "page-1")
    assert g.node_text[page] == "the page"  # a given caption is kept


def test_captions_pick_the_largest_images_and_read_the_section_lines():
    from colgraph_engine.kg import segment_sections
    from colgraph_engine.kg.captions import box_area, caption_texts

    assert box_area("r.pdf page 5, box (0.100, 0.200, 0.600, 0.600)") == pytest.approx(0.2)
    assert box_area("photo.jpg") is None
    text = "Figure 4: The user interface of the checker."
    refs = [["page-5", "logo", "shot", "icon"]]
    areas = {"logo": 0.004, "shot": 0.208, "icon": 0.003}
    assert figure_links([text], refs, areas) == {"shot": [("Figure 4", "The user interface of the checker.", 0)]}
    # only small images: none is the figure; the page render takes it
    assert list(figure_links([text], refs, {"logo": 0.004, "shot": 0.01, "icon": 0.003})) == ["page-5"]
    # a segment joins its lines ("2 Fig. 1. ..."); the section it comes from keeps them
    sections = [Section("Intro text.", page=1),
                Section("2\nFig. 1. Technology tree of the field.\nMore text.", images=("page-2", "page-2-image-1"),
                        page=2)]
    segments = segment_sections(sections, max_tokens=50)
    assert caption_definitions(segments[-1].text) == []
    assert caption_texts(sections, segments)[-1] == sections[1].text
    g = build_document_graph(DocumentInput("d", sections, images=[ImageInput("page-2"), ImageInput("page-2-image-1")]))
    img = next(v for v in g.nodes_of(NodeKind.IMAGE) if g.node_name[v] == "page-2-image-1")
    assert g.node_text[img] == "Figure 1: Technology tree of the field."
