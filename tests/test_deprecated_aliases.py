"""Old import paths kept as deprecated aliases after the redesign: they warn, and they resolve to
the very same objects as the new paths (not copies)."""
import importlib
import sys
import warnings

import pytest


def _fresh_import(name: str):
    for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
        del sys.modules[key]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(name)
    return module, caught


def test_index_package_is_an_alias_of_prefilter():
    import colgraph_engine.prefilter as new
    from colgraph_engine.prefilter import adaptive, prefilter_index

    old, caught = _fresh_import("colgraph_engine.index")
    assert any(issubclass(w.category, DeprecationWarning) and "colgraph_engine.prefilter" in str(w.message)
               for w in caught)
    assert old.PrefilterIndex is new.PrefilterIndex
    assert old.AutoSearcher is new.AutoSearcher
    assert sorted(old.__all__) == sorted(new.__all__)
    assert importlib.import_module("colgraph_engine.index.prefilter") is prefilter_index
    assert importlib.import_module("colgraph_engine.index.adaptive") is adaptive
    from colgraph_engine.index.persist import FormatError
    from colgraph_engine.prefilter.persist import FormatError as new_error
    assert FormatError is new_error


def test_top_level_names_unchanged():
    import colgraph_engine as cg
    from colgraph_engine.prefilter import AutoSearcher, PrefilterIndex
    assert cg.PrefilterIndex is PrefilterIndex and cg.AutoSearcher is AutoSearcher
    with pytest.raises(ImportError):
        importlib.import_module("colgraph_engine.index.no_such_module")
