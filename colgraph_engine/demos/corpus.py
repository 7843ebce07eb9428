"""A small multimodal corpus for the pipeline demo and tests, written for this project.

Four documents built from scikit-image's bundled photographs (public-domain or freely licensed
images shipped in the ``scikit-image`` package) and one text-only document. Captions, extraction
records (LightRAG's current line format), scene graphs and region matches are ours; region
boxes were placed by eye on the photographs and are approximate (normalised x1, y1, x2, y2).

The corpus is built so that one question separates the visual rankers: the astronaut
portrait's text view is long (caption plus six region labels) and holds the one fine detail
the question asks about (the mission patch), while the rocket photograph's short caption shares
the question's broad words; a pooled vector averages the detail away, MaxSim keeps it.
"""
from __future__ import annotations

import numpy as np

from ..kg.document import DocumentInput, ImageInput, TableInput
from ..kg.segment import Section


def _photo(name: str) -> np.ndarray:
    import skimage.data

    im = getattr(skimage.data, name)()
    return im if im.ndim == 3 else np.repeat(im[:, :, None], 3, axis=2)


ASTRONAUT_RECORDS = """\
entity<|#|>Eileen Collins<|#|>person<|#|>Eileen Collins is a NASA astronaut, the first woman to pilot and later command a Space Shuttle.
entity<|#|>NASA<|#|>organization<|#|>NASA is the United States space agency that ran the Space Shuttle program.
entity<|#|>Space Shuttle<|#|>technology<|#|>The Space Shuttle was NASA's reusable orbiter, flown from 1981 to 2011.
entity<|#|>STS-93<|#|>event<|#|>STS-93 was the 1999 Columbia mission commanded by Eileen Collins; its crew wore the STS-93 mission patch.
relation<|#|>Eileen Collins<|#|>STS-93<|#|>commanded, mission<|#|>Eileen Collins commanded the STS-93 mission in July 1999.
relation<|#|>Eileen Collins<|#|>NASA<|#|>astronaut of<|#|>Eileen Collins flew four Space Shuttle missions as a NASA astronaut.
relation<|#|>STS-93<|#|>Space Shuttle<|#|>flown on<|#|>STS-93 flew on the Space Shuttle Columbia.
<|COMPLETE|>"""

ASTRONAUT_SCENE = """\
<object-1>: woman, (0.04, 0.03, 0.72, 1.00)
<object-2>: flag, (0.00, 0.00, 0.19, 1.00)
<object-3>: mission patch, (0.26, 0.67, 0.41, 0.83)
<object-4>: name tag, (0.54, 0.66, 0.64, 0.74)
<object-5>: helmet, (0.54, 0.67, 1.00, 1.00)
<object-6>: shuttle model, (0.69, 0.00, 0.92, 0.55)
<relation-1>: <object-1> wearing <object-3>"""

ASTRONAUT_MAPPINGS = """\
("mapping"|<image>|EILEEN COLLINS|9)##
("mapping"|<object-1>|EILEEN COLLINS|9)##
("mapping"|<object-3>|STS-93|8)##
("mapping"|<object-6>|SPACE SHUTTLE|7)##
("mapping"|<relation-1>|EILEEN COLLINS|STS-93|8)<|COMPLETE|>"""

ROCKET_RECORDS = """\
entity<|#|>Falcon 9<|#|>technology<|#|>Falcon 9 is a two-stage orbital rocket that launches crews and cargo for NASA.
entity<|#|>NASA<|#|>organization<|#|>NASA buys launches from commercial companies for the space station.
entity<|#|>Launch Complex 39A<|#|>location<|#|>Launch Complex 39A at the Kennedy Space Center sent Apollo and Space Shuttle flights to space.
relation<|#|>Falcon 9<|#|>Launch Complex 39A<|#|>launches from<|#|>Falcon 9 launches from Launch Complex 39A.
relation<|#|>Falcon 9<|#|>NASA<|#|>contracted by<|#|>NASA contracts Falcon 9 launches.
<|COMPLETE|>"""

ROCKET_SCENE = """\
<object-1>: rocket, (0.42, 0.05, 0.52, 0.95)
<object-2>: launch tower, (0.52, 0.00, 0.70, 0.95)
<relation-1>: <object-1> beside <object-2>"""

ROCKET_MAPPINGS = """\
("mapping"|<image>|FALCON 9|8)##
("mapping"|<object-1>|FALCON 9|9)##
("mapping"|<object-2>|LAUNCH COMPLEX 39A|7)<|COMPLETE|>"""

CAFE_RECORDS = """\
entity<|#|>Chelsea<|#|>animal<|#|>Chelsea is a tabby cat who sleeps on the window sill of the cafe.
entity<|#|>Harbour Cafe<|#|>organization<|#|>Harbour Cafe serves espresso and cappuccino by the harbour.
relation<|#|>Chelsea<|#|>Harbour Cafe<|#|>lives at<|#|>Chelsea the cat lives at the Harbour Cafe.
<|COMPLETE|>"""

CAFE_SCENE_CAT = """\
<object-1>: tabby cat, (0.10, 0.05, 0.95, 1.00)"""
CAFE_MAPPINGS_CAT = """\
("mapping"|<image>|CHELSEA|9)##
("mapping"|<object-1>|CHELSEA|9)<|COMPLETE|>"""
CAFE_SCENE_CUP = """\
<object-1>: coffee cup, (0.18, 0.10, 0.85, 0.80)
<object-2>: saucer, (0.05, 0.45, 0.98, 0.98)
<relation-1>: <object-1> on <object-2>"""
CAFE_MAPPINGS_CUP = """\
("mapping"|<image>|HARBOUR CAFE|7)<|COMPLETE|>"""


def demo_documents() -> list[DocumentInput]:
    """The demo corpus: three documents with photographs and one text-only document."""
    astronaut = DocumentInput(
        "shuttle-commander", title="Eileen Collins, Space Shuttle commander",
        sections=[Section("Eileen Collins joined NASA as an astronaut in 1991. In July 1999 she commanded STS-93 on "
                          "the Space Shuttle Columbia. Her official portrait shows the STS-93 mission patch on her "
                          "orange launch suit.", images=("collins-portrait",))],
        images=[ImageInput("collins-portrait", _photo("astronaut"), ASTRONAUT_SCENE, ASTRONAUT_MAPPINGS,
                           caption="Official portrait of astronaut Eileen Collins in an orange launch and entry suit, "
                                   "with the American flag and a model of the Space Shuttle behind her")],
        extractions=[ASTRONAUT_RECORDS])
    rocket = DocumentInput(
        "falcon-launch", title="Falcon 9 at Launch Complex 39A",
        sections=[Section("Falcon 9 stands at Launch Complex 39A before a NASA cargo launch to the space station.",
                          images=("falcon-pad",))],
        images=[ImageInput("falcon-pad", _photo("rocket"), ROCKET_SCENE, ROCKET_MAPPINGS,
                           caption="NASA launch photo: rocket on the pad")],
        extractions=[ROCKET_RECORDS])
    cafe = DocumentInput(
        "harbour-cafe", title="Harbour Cafe",
        sections=[Section("Chelsea the tabby cat lives at the Harbour Cafe and greets visitors every morning.",
                          images=("chelsea",)),
                  Section("Harbour Cafe serves cappuccino in white cups on matching saucers.", images=("cup",))],
        images=[ImageInput("chelsea", _photo("chelsea"), CAFE_SCENE_CAT, CAFE_MAPPINGS_CAT,
                           caption="Chelsea, a tabby cat"),
                ImageInput("cup", _photo("coffee"), CAFE_SCENE_CUP, CAFE_MAPPINGS_CUP,
                           caption="A cup of coffee on a saucer")],
        extractions=[CAFE_RECORDS, "<|COMPLETE|>"])
    history = DocumentInput(
        "shuttle-history", title="The Space Shuttle program",
        sections=["The Space Shuttle program of NASA flew 135 missions between 1981 and 2011. Columbia was the first "
                  "orbiter; Atlantis flew the last mission, STS-135, in July 2011."],
        tables=[TableInput("orbiter | first flight\nColumbia | 1981\nChallenger | 1983\nDiscovery | 1984\n"
                           "Atlantis | 1985\nEndeavour | 1992", "Space Shuttle orbiters", section=0)])
    return [astronaut, rocket, cafe, history]


DEMO_QUESTIONS = (
    "Which photo shows the mission patch of the STS-93 commander?",
    "Who commanded STS-93 on the Space Shuttle Columbia?",
    "Which orbiter flew the first Space Shuttle mission in 1981?",
)
