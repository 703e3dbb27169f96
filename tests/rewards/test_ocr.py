"""The OCR reward through the real PP-OCRv4 models bundled in rapidocr-onnxruntime, on rendered text."""

from __future__ import annotations

import pytest
from PIL import Image

from recast_cli.errors import BadInput
from recast_cli.rewards import build_scorer
from recast_cli.rewards.ocr import levenshtein, quoted_target, text_accuracy
from tests.rewards.conftest import text_image


@pytest.fixture(scope="module")
def ocr():
    return build_scorer("ocr")


def test_exactly_rendered_text_scores_at_least_0_9(ocr):
    scores = ocr.score([text_image("Hello World"), text_image("RECAST")],
                       ['a sign that says "Hello World"', 'a logo reading "recast" in bold'])
    assert scores.min() >= 0.9


def test_a_misspelled_rendering_scores_one_minus_edit_distance_over_target_length(ocr):
    score = ocr.score([text_image("Helo Wrld")], ['a sign that says "Hello World"'])
    assert ocr.extras()["ocr_text"] == ["Helo Wrld"]
    assert score[0] == pytest.approx(1 - 2 / 10)


def test_a_blank_image_scores_zero(ocr):
    assert ocr.score([Image.new("RGB", (320, 96), "white")], ['a sign that says "Hello"'])[0] == 0.0


def test_a_prompt_without_quoted_text_is_bad_input(ocr):
    with pytest.raises(BadInput, match="no quoted text"):
        ocr.score([text_image("Hello")], ["a sign that says Hello"])


def test_the_target_is_the_first_quoted_span_without_spaces_lower_cased():
    assert quoted_target('a poster "Big Sale" and "other"') == "bigsale"
    assert quoted_target("a mug with “Good Morning” on it") == "goodmorning"
    with pytest.raises(BadInput):
        quoted_target('an empty quote ""')


def test_levenshtein_counts_insertions_deletions_and_substitutions():
    assert levenshtein("kitten", "sitting") == 3
    assert levenshtein("", "abc") == 3
    assert levenshtein("abc", "abc") == 0


def test_text_accuracy_is_one_for_a_substring_and_never_below_zero():
    assert text_accuracy("Big Sale Today", "bigsale") == 1.0
    assert text_accuracy("completely different words", "abc") == 0.0
    assert text_accuracy("abd", "abc") == pytest.approx(2 / 3)


def test_an_unknown_backend_is_bad_input():
    with pytest.raises(BadInput, match="backend must be one of"):
        build_scorer("ocr", backend="tesseract")


def test_paddleocr_backend_adapter_feeds_bgr_and_joins_recognised_lines(monkeypatch):
    """PaddleOCR's engine downloads its models at run time, so it cannot run here; this checks the
    adapter around it (construction options, BGR input, how recognised lines become the text)."""
    import sys
    import types

    from PIL import Image

    from recast_cli.rewards.ocr import OcrScore

    seen: dict = {}

    class Engine:
        def __init__(self, **options):
            seen["options"] = options

        def predict(self, pixels):
            seen["pixels"] = pixels
            return [{"rec_texts": ["HELLO", " World"]}]

    module = types.ModuleType("paddleocr")
    module.PaddleOCR = Engine
    monkeypatch.setitem(sys.modules, "paddleocr", module)
    scorer = OcrScore(backend="paddleocr")
    score = scorer.score([Image.new("RGB", (8, 8), (255, 0, 0))], ['a sign that says "hello world"'])
    assert score.tolist() == [1.0] and scorer.extras() == {"ocr_text": ["HELLO World"]}
    assert seen["pixels"][0, 0].tolist() == [0, 0, 255]  # PaddleX reads arrays as BGR
    assert seen["options"]["lang"] == "en" and seen["options"]["device"] == "cpu"


def test_paddleocr_backend_without_the_package_is_bad_input(monkeypatch):
    import sys

    import pytest

    from recast_cli.errors import BadInput
    from recast_cli.rewards.ocr import OcrScore

    monkeypatch.setitem(sys.modules, "paddleocr", None)
    with pytest.raises(BadInput, match="needs paddleocr>=3"):
        OcrScore(backend="paddleocr")
