"""C_vis(q): deterministic visual phrases (colgraph_engine.pipeline.cvis)."""
import dataclasses

import numpy as np
import pytest

from colgraph_engine.pipeline.cvis import VisualCue, VisualPhrases, extract_visual_phrases


def cues_of(result, kind):
    return [c.text for c in result.cues if c.kind == kind]


# ------------------------------------------------------------------------------- paper example

def test_poster_question_year_poster_and_combined_phrase():
    q = "What sport is associated with the 1976 film shown on this poster?"
    r = extract_visual_phrases(q)
    assert r.cues == (VisualCue("temporal", "1976", q.index("1976")),
                      VisualCue("visual", "poster", q.index("poster")))
    # combined first, then the visual noun phrase, then the temporal phrase with its kind noun
    assert r.phrases == ("1976 film poster", "poster", "1976 film")
    assert r.has_visual_cue
    assert r.text() == "1976 film poster ; poster ; 1976 film"


def test_poster_question_naming_the_film():
    q = "Which sport is associated with the 1976 film poster of Rocky?"
    r = extract_visual_phrases(q)
    assert cues_of(r, "temporal") == ["1976"]
    assert cues_of(r, "entity") == ["Rocky"]
    assert cues_of(r, "visual") == ["poster"]
    # the year is a modifier of the visual noun phrase, so it has no phrase of its own
    assert r.phrases == ("1976 film poster Rocky", "1976 film poster", "Rocky")


def test_combined_phrase_needs_two_kinds():
    # one visual noun phrase that already holds the year: nothing to combine
    assert extract_visual_phrases("What is on the 1976 film poster?").phrases == ("1976 film poster",)
    # two entities only: same kind, no combined phrase
    r = extract_visual_phrases("Did Rocky Balboa fight Apollo Creed?")
    assert r.phrases == ("Rocky Balboa", "Apollo Creed")
    # entity and temporal: combined in question order
    r = extract_visual_phrases("Where was Rocky filmed in 1975?")
    assert r.phrases == ("Rocky 1975", "Rocky", "1975")


# ---------------------------------------------------------------------------------- no cue

@pytest.mark.parametrize("q", ["how does photosynthesis work", "How does photosynthesis work?",
                               "  why is it so  "])
def test_no_cue_falls_back_to_question(q):
    r = extract_visual_phrases(q)
    assert not r.has_visual_cue
    assert r.cues == () and r.phrases == ()
    assert r.text() == q
    assert r.question == q


# -------------------------------------------------------------------------------- temporal

@pytest.mark.parametrize("date", ["March 3, 1976", "March 3rd 1976", "3 March 1976", "3rd of March, 1976",
                                  "1976-03-03", "03/03/1976", "3/3/1976", "Mar. 3, 1976", "Sept 30 2001"])
def test_full_dates_are_one_temporal_cue(date):
    q = f"Which poster was printed on {date} in the city?"
    r = extract_visual_phrases(q)
    assert cues_of(r, "temporal") == [date]
    assert [c.start for c in r.cues if c.kind == "temporal"] == [q.index(date)]


def test_impossible_numeric_date_keeps_only_the_year():
    r = extract_visual_phrases("Was it 13/13/1976 or 2001-13-01?")
    assert cues_of(r, "temporal") == ["1976", "2001"]


def test_months_with_and_without_year_and_may():
    r = extract_visual_phrases("What happened in June, in May 1980, on May 4 and in March of 1976?")
    assert cues_of(r, "temporal") == ["June", "May 1980", "May 4", "March of 1976"]
    # a bare "May" is the modal verb; a lower-case month name is not a month
    assert not extract_visual_phrases("May I see what happened in june?").has_visual_cue


@pytest.mark.parametrize("q, expected", [
    ("Which band was big in the 1970s?", ["1970s"]),
    ("Which band was big in the '80s and the ’90s?", ["'80s", "’90s"]),
    ("Which band was big in the 70s?", ["70s"]),
    ("Which band was big in the mid-1970s?", ["mid-1970s"]),
    ("Which band was big in the late seventies?", ["late seventies"]),
    ("Who painted it in the 19th century?", ["19th century"]),
    ("Who painted it in the twenty-first century?", ["twenty-first century"]),
    ("Who painted it in the summer of 1850 or winter 1851?", ["summer of 1850", "winter 1851"]),
])
def test_decades_centuries_seasons(q, expected):
    assert cues_of(extract_visual_phrases(q), "temporal") == expected


def test_year_boundaries():
    r = extract_visual_phrases("Costs 1,976 or $1999 or 12345 or 999 or 2100 units, not 1000 or 2099?")
    assert cues_of(r, "temporal") == ["1000", "2099"]
    # documented choice: an unseparated number in the year range is a year, not a count
    r = extract_visual_phrases("Are 2000 people in the photo?")
    assert cues_of(r, "temporal") == ["2000"]
    assert "2,000 people" in cues_of(extract_visual_phrases("Are 2,000 people in the photo?"), "visual")


# ---------------------------------------------------------------------------------- visual

def test_colours_with_intensity_and_pairs():
    r = extract_visual_phrases("Is the dark blue building next to a red and white jersey or a black-and-white photo?")
    assert cues_of(r, "visual") == ["dark blue", "building", "red and white", "jersey", "black-and-white", "photo"]
    assert r.phrases == ("dark blue building", "red and white jersey", "black-and-white photo")


def test_counts():
    r = extract_visual_phrases("Two people stand beside 3 cars, two red flags and 1,500 fans; one of them waves.")
    assert cues_of(r, "visual") == ["Two people", "3 cars", "two red flags", "1,500 fans"]
    # counts whose noun is a visual noun become visual noun phrases (listed before plain cues)
    assert r.phrases == ("3 cars", "two red flags", "Two people", "1,500 fans")


def test_positions():
    r = extract_visual_phrases("Who stands in front of the sign at the top left corner, in the background?")
    assert cues_of(r, "visual") == ["in front of", "sign", "top left corner", "background"]
    r = extract_visual_phrases("What is on the left side and to the right of the bottom-right logo?")
    assert cues_of(r, "visual") == ["left side", "right", "bottom-right", "logo"]
    assert r.phrases[0] == "bottom-right logo"


def test_left_and_right_need_positional_context():
    assert not extract_visual_phrases("why the drummer left and what rights he had").has_visual_cue
    assert cues_of(extract_visual_phrases("what is at the left"), "visual") == ["left"]


def test_visual_noun_phrase_takes_adjacent_modifiers():
    r = extract_visual_phrases("Which team wore Rocky's red jersey in the film poster image?")
    # possessive dropped; "poster image" is one phrase headed by "image"
    assert r.phrases[:3] == ("Rocky red jersey film poster image", "Rocky red jersey", "film poster image")
    r = extract_visual_phrases("Which Beatles album cover shows four people?")
    assert r.phrases == ("Beatles album cover", "four people")


def test_plural_and_hyphenated_visual_nouns():
    r = extract_visual_phrases("Which posters, logos, T-shirts and diagrams show trophies?")
    assert cues_of(r, "visual") == ["posters", "logos", "T-shirts", "diagrams", "trophies"]


# -------------------------------------------------------------------------------- entities

@pytest.mark.parametrize("q", ["What is on the poster?", "Which poster is red?", "Who made the logo?",
                               "In the photo, what is shown?", "The photo shows what?", "How red is the flag?",
                               "Is the sign blue?", "What's on the map?", "Describe the chart.",
                               "According to the figure, which is larger?"])
def test_sentence_initial_question_words_are_not_entities(q):
    r = extract_visual_phrases(q)
    assert cues_of(r, "entity") == []
    assert r.has_visual_cue  # every one of them has a visual cue


def test_entity_runs_connectors_and_acronyms():
    r = extract_visual_phrases("Which NASA logo is on the U.S. flag of the Bank of America near "
                               "The Lord of the Rings, or Barnes & Noble?")
    assert cues_of(r, "entity") == ["NASA", "U.S.", "Bank of America", "Lord of the Rings", "Barnes & Noble"]
    assert r.phrases[0] == "NASA logo U.S. flag Bank of America Lord of the Rings Barnes & Noble"


def test_capitalised_lexicon_words_alone_are_not_entities():
    r = extract_visual_phrases("Red cars are parked by the Red Bull logo near the Statue of Liberty.")
    assert cues_of(r, "entity") == ["Red Bull", "Statue of Liberty"]
    assert cues_of(r, "visual") == ["Red", "cars", "logo"]
    assert r.phrases[1:3] == ("Red cars", "Red Bull logo")


def test_all_caps_question():
    r = extract_visual_phrases("WHAT IS THE NASA LOGO?")
    assert cues_of(r, "entity") == ["NASA LOGO"]


def test_quoted_titles():
    q = "Is the 'Jaws' poster like the book \"The Old Man and the Sea\" or “Rocky II” or 'Don't Look Back'?"
    r = extract_visual_phrases(q)
    ents = [c for c in r.cues if c.kind == "entity"]
    assert [c.text for c in ents] == ["Jaws", "The Old Man and the Sea", "Rocky II", "Don't Look Back"]
    assert [c.start for c in ents] == [q.index(t) for t in ("Jaws", "The Old", "Rocky II", "Don't")]
    assert r.phrases[1] == "Jaws poster"


def test_quotes_are_not_reread_and_apostrophes_do_not_open_quotes():
    r = extract_visual_phrases("What does the 'Red Poster 1999' show?")
    assert [(c.kind, c.text) for c in r.cues] == [("entity", "Red Poster 1999")]
    r = extract_visual_phrases("Is Rocky's poster from the '70s, like the players' flag?")
    assert [(c.kind, c.text) for c in r.cues] == [("entity", "Rocky"), ("visual", "poster"),
                                                   ("temporal", "'70s"), ("visual", "flag")]


# ----------------------------------------------------------------- composition and contract

def test_dedup_is_case_insensitive_and_cap_keeps_priority_prefix():
    r = extract_visual_phrases("Is the poster the same as the Poster?")
    assert r.phrases == ("poster",) and len(r.cues) == 2
    q = "Which NASA logo on the red flag in the 1976 photo at the top left shows two people?"
    full = extract_visual_phrases(q)
    assert len(full.phrases) == 6
    for k in range(1, 8):
        assert extract_visual_phrases(q, max_phrases=k).phrases == full.phrases[:k]
    assert extract_visual_phrases(q, max_phrases=np.int64(2)).phrases == full.phrases[:2]


QUESTIONS = [
    "What sport is associated with the 1976 film shown on this poster?",
    "Which NASA logo on the red flag in the 1976 photo at the top left shows two people?",
    "Who stands in front of the sign at the top left corner, in the background?",
    "What happened on March 3, 1976 in Paris near the Bank of America building?",
    "Is the 'Jaws' poster like the book \"The Old Man and the Sea\"?",
]


@pytest.mark.parametrize("q", QUESTIONS)
def test_cues_point_at_their_text_in_order_and_output_is_deterministic(q):
    r = extract_visual_phrases(q)
    assert [c.start for c in r.cues] == sorted(c.start for c in r.cues)
    for c in r.cues:
        assert q[c.start:c.start + len(c.text)] == c.text
    again = [extract_visual_phrases(q) for _ in range(3)]
    assert all(a == r for a in again)
    assert len({p.casefold() for p in r.phrases}) == len(r.phrases)


def test_whitespace_is_normalised_in_texts_but_offsets_index_the_question():
    q = "What  is on the\t1976\n film   poster of  Rocky   Balboa ?"
    r = extract_visual_phrases(q)
    assert r.phrases == ("1976 film poster Rocky Balboa", "1976 film poster", "Rocky Balboa")
    ent = next(c for c in r.cues if c.kind == "entity")
    assert ent.text == "Rocky Balboa" and ent.start == q.index("Rocky")
    assert r.question == q


def test_results_are_frozen():
    r = extract_visual_phrases("What is on the poster?")
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.phrases = ()
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.cues[0].text = "x"


# ---------------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("bad", [None, b"what poster", 42, ["poster"]])
def test_question_must_be_str(bad):
    with pytest.raises(TypeError, match="^question"):
        extract_visual_phrases(bad)


@pytest.mark.parametrize("bad", ["", "   ", "\n\t"])
def test_question_must_not_be_blank(bad):
    with pytest.raises(ValueError, match="^question"):
        extract_visual_phrases(bad)


@pytest.mark.parametrize("bad, exc", [(0, ValueError), (-3, ValueError), (True, TypeError), (2.0, TypeError),
                                      ("3", TypeError), (None, TypeError)])
def test_max_phrases_must_be_positive_int(bad, exc):
    with pytest.raises(exc, match="^max_phrases"):
        extract_visual_phrases("What is on the poster?", max_phrases=bad)


def test_max_phrases_is_keyword_only():
    with pytest.raises(TypeError):
        extract_visual_phrases("What is on the poster?", 3)


def test_data_classes_check_their_fields():
    with pytest.raises(ValueError, match="^kind"):
        VisualCue("colour", "red", 0)
    with pytest.raises(ValueError, match="^start"):
        VisualCue("visual", "red", -1)
    with pytest.raises(TypeError, match="^cues"):
        VisualPhrases("q", [VisualCue("visual", "red", 0)], ("red",))
