"""mKG-RAG segmentation: image sections whole, image-free sections merged or split to a budget."""
import pytest

from colgraph_engine.kg.segment import Section, segment_sections


def words(n, tag="w"):
    return " ".join(f"{tag}{i}" for i in range(n))


def test_image_sections_stay_whole_and_block_merging():
    secs = [Section(words(3, "a")), Section(words(50, "b"), images=("fig1.png",)), Section(words(4, "c")),
            Section(words(2, "d"))]
    segs = segment_sections(secs, max_tokens=10)
    assert [s.sections for s in segs] == [(0, 0), (1, 1), (2, 3)]
    assert segs[1].images == ("fig1.png",) and segs[1].n_tokens == 50  # over budget, still whole
    # merged sections keep a paragraph break between them
    assert segs[2].text == words(4, "c") + "\n\n" + words(2, "d") and segs[2].n_tokens == 6


def test_merge_up_to_the_budget_then_start_a_new_segment():
    segs = segment_sections([words(4, "a"), words(4, "b"), words(4, "c"), "", "  "], max_tokens=8)
    assert [(s.sections, s.n_tokens) for s in segs] == [((0, 1), 8), ((2, 2), 4)]


def test_long_section_is_split_on_word_boundaries_with_overlap():
    segs = segment_sections([words(25)], max_tokens=10, overlap_tokens=3)
    assert [s.part for s in segs] == [0, 1, 2, 3]  # stride 7 over 25 words
    assert all(s.n_tokens <= 10 for s in segs)
    assert segs[0].text.split()[-3:] == segs[1].text.split()[:3]  # the overlap
    covered = set(w for s in segs for w in s.text.split())
    assert covered == set(words(25).split())
    no_overlap = segment_sections([words(25)], max_tokens=10)
    assert [s.n_tokens for s in no_overlap] == [10, 10, 5]


def test_custom_token_counter():
    segs = segment_sections(["aaaa bb c", "dddddd"], max_tokens=4, count_tokens=lambda w: len(w) // 2 + 1)
    # costs: aaaa=3, bb=2, c=1 -> 6 > 4: split into [aaaa] [bb c]; dddddd=4 fits alone
    assert [s.text for s in segs] == ["aaaa", "bb c", "dddddd"]


def test_a_word_over_budget_stands_alone():
    segs = segment_sections(["x " + "y" * 50 + " z"], max_tokens=3, count_tokens=len)
    assert [s.text for s in segs] == ["x", "y" * 50, "z"]


@pytest.mark.parametrize("kwargs,exc,needle", [
    (dict(max_tokens=0), ValueError, "max_tokens"),
    (dict(max_tokens=5, overlap_tokens=5), ValueError, "overlap_tokens"),
    (dict(max_tokens=5.0), ValueError, "max_tokens"),
])
def test_bad_budgets(kwargs, exc, needle):
    with pytest.raises(exc, match=needle):
        segment_sections(["a b c"], **kwargs)


def test_bad_sections():
    with pytest.raises(TypeError, match="sections"):
        segment_sections("just a string")
    with pytest.raises(TypeError, match=r"sections\[1\]"):
        segment_sections(["ok", 3])


def test_paragraph_breaks_survive_segmentation_and_cost_no_tokens():
    # a heading kept in its section's text must not run into the next sentence
    sec = Section("The Alps\n\nThe Matterhorn stands above Zermatt.\n  \n\nIt is 4,478 m high.\nLine two.")
    (seg,) = segment_sections([sec, Section("Rail\n\nThe Glacier Express.")], max_tokens=100)
    assert seg.text == ("The Alps\n\nThe Matterhorn stands above Zermatt.\n\nIt is 4,478 m high. Line two."
                        "\n\nRail\n\nThe Glacier Express.")
    assert seg.n_tokens == 18
    # a split never starts or ends a piece with a break, and counts words only
    pieces = segment_sections(["a b\n\nc d\n\ne f"], max_tokens=2)
    assert [p.text for p in pieces] == ["a b", "c d", "e f"] and [p.n_tokens for p in pieces] == [2, 2, 2]
