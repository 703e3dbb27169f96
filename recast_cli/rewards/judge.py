"""The pairwise VLM judge of the paper's Table 3, position-debiased.

Every pair (prompt, image_a, image_b) is shown twice, in the orders (a, b) and (b, a), to a
VLM behind an OpenAI-compatible endpoint, which names the better image ("1", "2" or "tie")
for each rubric criterion (default: faithfulness, aesthetics) and overall. Verdicts are
mapped back to a / b, so a judge that always prefers the first image gives every pair one
win each way. Per criterion c, over n pairs and both orders (2n verdicts):

    win_rate_a(c) = (wins_a(c) + ½·ties(c)) / (2n)

also reported: the agreement of the two orders (share of pairs whose two verdicts agree)
and the first-position preference (share of non-tie verdicts that picked the first image).
Output ``recast.judgements/1``: Parquet, one row per (pair, order) with the verdict of every
criterion and the raw reply; the summary lives in the file metadata.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from recast_cli.artifacts.judgements import Pair, Verdict
from recast_cli.errors import BadInput
from recast_cli.rewards.chat import ChatClient, image_part, text_part

DEFAULT_CRITERIA = ("faithfulness", "aesthetics")
OVERALL = "overall"
ORDERS = ("ab", "ba")

RUBRIC = (
    "You compare two images generated for the same text prompt.\nPrompt: {prompt}\n"
    "For each criterion below decide which image is better: answer 1 (the first image), 2 (the second image) "
    "or tie.\n{criteria}\nReply with one JSON object and nothing else, for example {example}."
)
DESCRIPTIONS = {
    "faithfulness": "how exactly the image shows what the prompt asks for (objects, counts, attributes, text)",
    "aesthetics": "visual quality and appeal: composition, lighting, colour, detail, absence of artefacts",
    OVERALL: "all things considered, which image is better for this prompt",
}


def read_pairs(path: Path) -> list[Pair]:
    """Pairs from a CSV or Parquet file with columns prompt, image_a, image_b (paths relative to the file)."""
    if not path.is_file():
        raise BadInput(f"{path}: no such pairs file")
    if path.suffix == ".parquet":
        try:
            rows = pq.read_table(path).to_pylist()
        except (pa.ArrowException, OSError):
            raise BadInput(f"{path}: not a readable Parquet file") from None
    else:
        try:
            rows = list(csv.DictReader(io.StringIO(path.read_text(encoding="utf-8"))))
        except (UnicodeDecodeError, csv.Error):
            raise BadInput(f"{path}: not a UTF-8 CSV file") from None
    if not rows:
        raise BadInput(f"{path}: no pairs")
    missing = {"prompt", "image_a", "image_b"} - set(rows[0])
    if missing:
        raise BadInput(f"{path}: missing column(s) {', '.join(sorted(missing))}")
    pairs = []
    for row in rows:
        images = [Path(row[k]) if Path(row[k]).is_absolute() else path.parent / row[k] for k in ("image_a", "image_b")]
        for image in images:
            if not image.is_file():
                raise BadInput(f"{path}: image {image} does not exist")
        pairs.append(Pair(str(row["prompt"]), *images))
    return pairs


def parse_verdicts(reply: str, criteria: Sequence[str]) -> dict[str, str] | None:
    """{criterion: "1" | "2" | "tie"} from a reply (a JSON object, else "criterion: answer" lines); None if incomplete."""
    found: dict[str, str] = {}
    match = re.search(r"\{.*\}", reply, re.DOTALL)
    if match:
        try:
            data = json.loads(match.group(0))
        except json.JSONDecodeError:
            data = None
        if isinstance(data, dict):
            for key, value in data.items():
                answer = _answer(str(value))
                if answer and str(key).strip().lower() in criteria:
                    found[str(key).strip().lower()] = answer
    for criterion in criteria:
        if criterion not in found:
            line = re.search(rf"{criterion}\W*[:=]\s*([^\n,;]+)", reply, re.IGNORECASE)
            answer = _answer(line.group(1)) if line else None
            if answer:
                found[criterion] = answer
    return found if all(c in found for c in criteria) else None


def _answer(text: str) -> str | None:
    words = text.strip().strip("\"'*. ").lower()
    if words in ("1", "image 1", "first", "the first image", "first image"):
        return "1"
    if words in ("2", "image 2", "second", "the second image", "second image"):
        return "2"
    if words in ("tie", "equal", "same", "draw", "0"):
        return "tie"
    return None


def unpermute(answers: Mapping[str, str], order: str) -> dict[str, str]:
    """Map "1"/"2" (positions) back to "a"/"b" (systems) for the presentation ``order``."""
    first, second = ("a", "b") if order == "ab" else ("b", "a")
    return {c: {"1": first, "2": second, "tie": "tie"}[v] for c, v in answers.items()}


class PairwiseJudge:
    """Asks a VLM for per-criterion preferences between two images, in both orders."""

    def __init__(self, url: str, model: str, criteria: Sequence[str] = DEFAULT_CRITERIA, api_key: str | None = None,
                 timeout: float = 120.0, retries: int = 3, backoff: float = 1.0, concurrency: int = 8) -> None:
        self.criteria = tuple(c.lower() for c in criteria)
        if not self.criteria or len(set(self.criteria)) != len(self.criteria) or OVERALL in self.criteria:
            raise BadInput(f"judge: criteria must be distinct names other than {OVERALL!r}, got {list(criteria)}")
        if not all(re.fullmatch(r"[a-z_]+", c) for c in self.criteria):
            raise BadInput(f"judge: criteria are lower-case words, got {list(criteria)}")
        self.client = ChatClient(url, model, "judge", api_key, timeout, retries, backoff, 256, concurrency)

    @property
    def asked(self) -> tuple[str, ...]:
        return (*self.criteria, OVERALL)

    def question(self, prompt: str) -> str:
        lines = "\n".join(f"- {c}: {DESCRIPTIONS.get(c, c)}" for c in self.asked)
        example = json.dumps({c: "1" for c in self.asked})
        return RUBRIC.format(prompt=prompt, criteria=lines, example=example)

    def judge_once(self, pair_index: int, pair: Pair, order: str) -> Verdict:
        from recast_cli.rewards.scoring import load_image

        first, second = (pair.image_a, pair.image_b) if order == "ab" else (pair.image_b, pair.image_a)
        content = [text_part("Image 1:"), image_part(load_image(first)), text_part("Image 2:"),
                   image_part(load_image(second)), text_part(self.question(pair.prompt))]
        reply = self.client.ask(content)
        answers = parse_verdicts(reply, self.asked)
        if answers is None:
            excerpt = " ".join(reply.split())[:80]
            raise BadInput(f"judge: no verdict for every criterion ({', '.join(self.asked)}) in the reply "
                           f"for pair {pair_index} ({order}): {excerpt!r}")
        return Verdict(pair_index, order, unpermute(answers, order), reply)

    def judge_pairs(self, pairs: Sequence[Pair], advance: Callable[[], None] = lambda: None) -> list[Verdict]:
        """Both orders of every pair; ``advance()`` after each answer."""
        jobs = [(i, pair, order) for i, pair in enumerate(pairs) for order in ORDERS]

        def run(job: tuple[int, Pair, str]) -> Verdict:
            verdict = self.judge_once(*job)
            advance()
            return verdict

        return self.client.map(run, jobs)


def win_rates(verdicts: Sequence[Verdict], criteria: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Per criterion and overall: wins, ties, the position-debiased win rate of a, order agreement, first-position bias."""
    pairs = sorted({v.pair for v in verdicts})
    summary: dict[str, dict[str, Any]] = {}
    for criterion in (*criteria, OVERALL):
        winners = [v.winners[criterion] for v in verdicts]
        a, b, ties = winners.count("a"), winners.count("b"), winners.count("tie")
        by_pair: dict[int, dict[str, str]] = {}
        for v in verdicts:
            by_pair.setdefault(v.pair, {})[v.order] = v.winners[criterion]
        agree = sum(1 for p in pairs if by_pair[p].get("ab") == by_pair[p].get("ba"))
        decided = [v for v in verdicts if v.winners[criterion] != "tie"]
        first = sum(1 for v in decided if v.winners[criterion] == v.order[0])
        summary[criterion] = {
            "a_wins": a, "b_wins": b, "ties": ties, "verdicts": len(winners),
            "win_rate_a": (a + 0.5 * ties) / len(winners) if winners else None,
            "order_agreement": agree / len(pairs) if pairs else None,
            "first_position_share": first / len(decided) if decided else None,
        }
    return summary
