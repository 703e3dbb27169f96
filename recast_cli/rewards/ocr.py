"""``ocr``: text-rendering accuracy of the prompt's quoted span, as in Flow-GRPO's OCR reward.

target = the first quoted span of the prompt ("…" or “…”); both the target and the OCR
text (all recognised lines joined in reading order) have spaces removed and are
lower-cased. score = 1 if target ⊆ text, else 1 − min(lev(text, target), |target|) / |target|,
with lev the Levenshtein edit distance. Range [0, 1]; a blank image scores 0.

Backends: ``rapidocr`` (default: the PP-OCRv4 detection and recognition ONNX models bundled
in ``rapidocr-onnxruntime``, fully offline; detection limited to a longest side of 960 and
no angle classifier, PaddleOCR's own defaults in Flow-GRPO) and ``paddleocr`` (optional, PaddleOCR 3.x
``predict`` with ``lang="en"`` and no orientation/unwarping models; its models must already
be in PaddleOCR's local model cache).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from recast_cli.errors import BadInput, shown
from recast_cli.rewards.base import Images, Scorer, as_pil, check_batch

BACKENDS = ("rapidocr", "paddleocr")
_QUOTED = re.compile(r'"([^"]*)"|“([^”]*)”')


def quoted_target(prompt: str) -> str:
    """The first quoted span of ``prompt``, spaces removed, lower-cased; BadInput if there is none."""
    match = _QUOTED.search(prompt)
    target = "" if match is None else (match.group(1) if match.group(1) is not None else match.group(2))
    target = target.replace(" ", "").lower()
    if not target:
        raise BadInput(f"ocr: prompt {shown(prompt)} has no quoted text to look for (put it in double quotes)")
    return target


def levenshtein(a: str, b: str) -> int:
    """Edit distance (insertions, deletions, substitutions of one character each)."""
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def text_accuracy(recognised: str, target: str) -> float:
    """1 if target ⊆ recognised (spaces removed, lower-cased), else 1 − min(lev, |target|)/|target|."""
    text = recognised.replace(" ", "").lower()
    if target in text:
        return 1.0
    return 1.0 - min(levenshtein(text, target), len(target)) / len(target)


class OcrScore(Scorer):
    """Quoted-text accuracy of the OCR reading (formula in the module docstring)."""

    name = "ocr"
    output_range = (0.0, 1.0)

    def __init__(self, backend: str = "rapidocr", device: str = "cpu") -> None:
        if backend not in BACKENDS:
            raise BadInput(f"ocr: backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
        self.backend = backend
        self._read = _rapidocr_reader() if backend == "rapidocr" else _paddleocr_reader(device)
        self.last_texts: list[str] = []

    def score(self, images: Images, prompts: Sequence[str]) -> np.ndarray:
        check_batch(self.name, images, prompts)
        targets = [quoted_target(p) for p in prompts]
        self.last_texts = [self._read(np.asarray(im)) for im in as_pil(images)]
        return np.array([text_accuracy(t, target) for t, target in zip(self.last_texts, targets)], dtype=np.float64)

    def check_prompts(self, prompts: Sequence[str]) -> None:
        for prompt in prompts:
            quoted_target(prompt)

    def extras(self) -> dict[str, list[str]]:
        """The text the OCR read in the last batch, one entry per image."""
        return {"ocr_text": list(self.last_texts)}


def _rapidocr_reader():
    from rapidocr_onnxruntime import RapidOCR

    engine = RapidOCR(det_limit_side_len=960, det_limit_type="max")

    def read(pixels: np.ndarray) -> str:
        result, _ = engine(pixels, use_cls=False)
        return "".join(line[1] for line in result or [])

    return read


def _paddleocr_reader(device: str):
    try:
        from paddleocr import PaddleOCR
    except ImportError:
        raise BadInput("ocr: backend 'paddleocr' needs paddleocr>=3 and paddlepaddle installed") from None
    engine = PaddleOCR(lang="en", device="gpu" if device.startswith("cuda") else "cpu",
                       use_doc_orientation_classify=False, use_doc_unwarping=False, use_textline_orientation=False)

    def read(pixels: np.ndarray) -> str:
        results = engine.predict(np.ascontiguousarray(pixels[..., ::-1]))  # PaddleX reads arrays as BGR
        return "".join(text for res in results for text in res["rec_texts"])

    return read
