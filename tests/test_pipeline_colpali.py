"""ColGraphRAG's own setting: one late-interaction model (a tiny random ColQwen2 through
colpali-engine) encodes questions and images, so the pipeline ranks images by MaxSim of the
C_vis tokens against the image and region patches themselves."""
import pytest

pytest.importorskip("colpali_engine")

from colgraph_engine.encoders import HashingTextEncoder  # noqa: E402
from colgraph_engine.encoders.colpali import ColPaliEncoder  # noqa: E402
from colgraph_engine.kg import Encoders, KnowledgeIndex  # noqa: E402
from colgraph_engine.demos import kg_data as demo_data  # noqa: E402
from colgraph_engine.pipeline import Pipeline, PipelineConfig  # noqa: E402

from .tiny_models import tiny_qwen2  # noqa: E402


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    model = ColPaliEncoder(tiny_qwen2(tmp_path_factory.mktemp("models") / "tiny-colqwen2"), batch_size=4)
    enc = Encoders(HashingTextEncoder(128).text_encoder(), model.token_encoder(), model.patch_encoder())
    index = KnowledgeIndex(enc)
    index.add_documents(demo_data.demo_documents())
    return model, enc, index


def test_images_are_ranked_by_their_patches(setup):
    model, enc, index = setup
    # retrieval="graph": E_k's scores are the visual ranker's own (graph+chunks adds graph support)
    pipe = Pipeline(index, enc, PipelineConfig(retrieval="graph", k=20, all_document_images=True))
    assert pipe.image_units == "patches"
    r = pipe.retrieve("Which photo shows the mountain seen from the train window?")
    assert r.images and r.image_units == "patches" and "text views" not in r.context.render()
    q = model.query_vectors([r.visual_phrases.text()])[0].float()
    for h in r.images:
        store = index.stores["image" if h.kind == "image" else "region"]
        uid = int(index.node_uid()[h.node])
        x = store.get(uid).float()
        assert h.score == pytest.approx(float((q @ x.T).max(1).values.sum()), rel=1e-4, abs=1e-4)


def test_text_views_are_not_used_when_patches_share_the_question_space(setup):
    _, enc, index = setup
    assert Pipeline(index, enc, PipelineConfig(visual_units="patches")).image_units == "patches"
    assert Pipeline(index, enc, PipelineConfig(visual_units="text_view")).image_units == "text_view"
