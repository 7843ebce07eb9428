"""A small multimodal corpus for the knowledge-graph demo (written for this project).

Three documents: a rail journey past Mount Fuji with a drawn photo, pre-extracted records in
two LightRAG dialects, a scene graph and region matches (the mKG-RAG paper's running example);
and two text-only documents (one with a table) that go through the default offline extractor.
"""
from __future__ import annotations

import numpy as np

from ..kg.document import DocumentInput, ImageInput, TableInput
from ..kg.segment import Section

RIDE_EXTRACTION = """\
entity<|#|>Mount Fuji<|#|>location<|#|>Mount Fuji is the snow-capped volcano that travellers watch for from the right-hand windows on the ride west out of Tokyo.
entity<|#|>Shinkansen<|#|>technology<|#|>The Shinkansen is Japan's high-speed rail network; its Tokaido line links Tokyo with Shizuoka and Osaka.
entity<|#|>Tokyo<|#|>location<|#|>Tokyo is the capital of Japan and the starting point of the journey.
relation<|#|>Shinkansen<|#|>Mount Fuji<|#|>view, scenery<|#|>The train passes the mountain closely enough for passengers to see it fill the window on a clear day.
relation<|#|>Shinkansen<|#|>Tokyo<|#|>departs from, terminus<|#|>The journey on the Shinkansen departs from Tokyo Station.
<|COMPLETE|>"""

RIDE_EXTRACTION_LEGACY = """\
("entity"<|>"Shizuoka"<|>"location"<|>"Shizuoka is the prefecture south of the mountain, crossed by the line about an hour after leaving Tokyo.")##
("entity"<|>"Mount Fuji"<|>"location"<|>"At 3,776 metres it is the highest peak in Japan.")##
("relationship"<|>"Mount Fuji"<|>"Shizuoka"<|>"Mount Fuji stands on the border of Shizuoka and Yamanashi, with its southern slopes in Shizuoka."<|>"located in, border"<|>9)##
("content_keywords"<|>"rail travel, scenery")<|COMPLETE|>"""

RIDE_SCENE = """\
<object-1>: mountain, (0.10, 0.05, 0.90, 0.60)
<object-2>: train, (0.00, 0.55, 0.70, 0.95)
<relation-1>: <object-2> passing in front of <object-1>"""

RIDE_MAPPINGS = """\
("mapping"|<image>|MOUNT FUJI|8)##
("mapping"|<object-1>|MOUNT FUJI|9)##
("mapping"|<object-2>|SHINKANSEN|9)##
("mapping"|<relation-1>|SHINKANSEN|MOUNT FUJI|7)<|COMPLETE|>"""


def ride_photo(height: int = 240, width: int = 320) -> np.ndarray:
    """``[H, W, 3]`` uint8: a drawn snow-capped mountain above a blue train, matching RIDE_SCENE."""
    from PIL import Image, ImageDraw

    im = Image.new("RGB", (width, height), (150, 200, 240))
    draw = ImageDraw.Draw(im)
    draw.polygon([(0.10 * width, 0.60 * height), (0.50 * width, 0.05 * height), (0.90 * width, 0.60 * height)],
                 fill=(90, 100, 130))
    draw.polygon([(0.38 * width, 0.22 * height), (0.50 * width, 0.05 * height), (0.62 * width, 0.22 * height)],
                 fill=(250, 250, 250))
    draw.rectangle([0, 0.62 * height, 0.70 * width, 0.95 * height], fill=(240, 240, 245))
    draw.rectangle([0, 0.75 * height, 0.70 * width, 0.80 * height], fill=(20, 60, 180))
    return np.asarray(im)


def demo_documents() -> list[DocumentInput]:
    ride = DocumentInput(
        "fuji-ride", title="West from Tokyo on the Shinkansen",
        sections=[Section("Leaving Tokyo on the Shinkansen, travellers on the right-hand side wait for Mount Fuji. "
                          "About forty minutes out the mountain fills the window.", images=("ride-photo",)),
                  Section("The line then crosses Shizuoka, south of the mountain, on its way to Osaka.")],
        images=[ImageInput("ride-photo", ride_photo(), RIDE_SCENE, RIDE_MAPPINGS,
                           caption="Mount Fuji seen from a passing Shinkansen")],
        extractions=[RIDE_EXTRACTION, RIDE_EXTRACTION_LEGACY])
    tea = DocumentInput(
        "shizuoka-tea", title="Tea in Shizuoka",
        sections=["Shizuoka Prefecture grows about a third of the green tea of Japan. The Makinohara Plateau "
                  "lies west of the Oi River. Farmers in Shizuoka harvest the first flush in May.",
                  "From the tea fields of Makinohara, Mount Fuji is visible on clear winter mornings."],
        tables=[TableInput("region | share\nShizuoka | 35%\nKagoshima | 33%", "Green tea output by prefecture",
                           section=0)])
    station = DocumentInput(
        "tokyo-station", title="Tokyo Station",
        sections=["Tokyo Station opened in 1914 in the Marunouchi district. The Tokaido Shinkansen leaves "
                  "Tokyo Station for Shin-Osaka every few minutes. The red-brick building was restored in 2012."])
    return [ride, tea, station]
