"""What the image-API sources share: the key from the environment, retries with backoff, bounded concurrency.

A request ends in one of four ways: an image; a refusal of the prompt (content policy), which
is recorded and skips the prompt; a transient failure (429, 5xx, no whole answer within the
request's deadline, a broken connection or an answer that does not decode), retried after
``backoff·2^k`` seconds (k = 0, 1, ...; at least the server's Retry-After; at most ``max_delay``)
until ``retries`` run out, then counted as failed so a rerun resumes it; or a permanent error
(bad key, unknown model, an answer over the size cap), which stops the run with one line. Each
request has one deadline for the whole of it (``RetryPolicy.timeout``) and a cap on its
answer's bytes (:mod:`.deadline`). Keys are read from the environment only, and scrubbed from
every message; nothing else of them is kept.
"""

from __future__ import annotations

import os
import random
import threading
import time
from abc import abstractmethod
from collections.abc import Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from urllib.parse import urlsplit

from recast_cli.errors import BadInput
from recast_cli.positives.collect import Job, Outcome, PositiveSource, open_image


@dataclass(frozen=True)
class RetryPolicy:
    retries: int = 5
    timeout: float = 300.0
    backoff: float = 1.0
    max_delay: float = 60.0

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        """Seconds before retry ``attempt`` (0-based): exponential with jitter, at least Retry-After."""
        base = self.backoff * 2**attempt * (0.5 + 0.5 * random.random())  # jitter spreads synchronized retries
        return min(self.max_delay, max(base, retry_after or 0.0))


class Refused(Exception):
    """The service declined the prompt (content policy): recorded, not retried."""


class Transient(Exception):
    """Worth retrying: rate limit, server error, timeout, broken answer."""

    def __init__(self, reason: str, retry_after: float | None = None):
        super().__init__(reason)
        self.retry_after = retry_after


class PastDeadline(Transient):
    """No whole answer within the request's deadline (``RetryPolicy.timeout``, :mod:`.deadline`): retried
    like any timeout, the server may answer in time on the next try."""


class AnswerTooLarge(Exception):
    """An answer over :data:`.deadline.MAX_ANSWER_BYTES`: permanent, it stops the run with one line. Not a
    broken connection but a whole answer the server chose to send; the same request would get it again, each
    try costing up to the cap (and a worker's memory), and nothing of that size is one image's answer: the
    endpoint is not the image API it should be. Not a ValueError (BadInput is one), so that the sources' own
    ``except ValueError`` lets it through to :meth:`ApiSource._one`."""


def env_key(*names: str) -> str:
    """The first non-empty environment variable of ``names``; BadInput naming them when none is set."""
    for name in names:
        value = os.environ.get(name, "").strip()
        if value:
            return value
    raise BadInput(f"no API key: set the environment variable {' or '.join(names)}")


def endpoint(url: str | None) -> str | None:
    """A base URL without credentials, query or fragment: safe to record."""
    if not url:
        return None
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}"


def retry_after(headers) -> float | None:
    """Seconds from a Retry-After header given in seconds (dates are ignored)."""
    try:
        return float(headers.get("retry-after")) if headers is not None and headers.get("retry-after") else None
    except (TypeError, ValueError):
        return None


class ApiSource(PositiveSource):
    """An image API called with bounded concurrency; subclasses implement :meth:`request`."""

    #: the environment variables the key may come from, in order
    key_vars: tuple[str, ...] = ()

    def __init__(self, model: str, concurrency: int, retry: RetryPolicy):
        self.model = model
        self.concurrency = concurrency
        self.retry = retry
        self.key = env_key(*self.key_vars)
        self._refused: set[int] = set()
        self._lock = threading.Lock()

    @abstractmethod
    def request(self, prompt: str) -> bytes:
        """One image's encoded bytes; raises Refused, Transient, or BadInput for a permanent error."""

    def scrub(self, text: str) -> str:
        return text.replace(self.key, "***") if self.key else text

    def _one(self, job: Job) -> Outcome:
        for attempt in range(self.retry.retries + 1):
            with self._lock:
                if job.prompt_id in self._refused:  # a sibling job's refusal already skips the prompt
                    return Outcome(job, refused="prompt refused")
            try:
                data = self.request(job.prompt)
                try:
                    return Outcome(job, image=open_image(data))
                except ValueError as exc:
                    raise Transient(f"the image does not decode ({exc})") from None
            except Refused as exc:
                with self._lock:
                    self._refused.add(job.prompt_id)
                return Outcome(job, refused=self.scrub(str(exc)))
            except Transient as exc:
                if attempt == self.retry.retries:
                    return Outcome(job, failed=self.scrub(f"{exc} (after {attempt + 1} attempts)"))
                time.sleep(self.retry.delay(attempt, exc.retry_after))
            except BadInput as exc:
                raise BadInput(self.scrub(str(exc))) from None
            except AnswerTooLarge as exc:
                raise BadInput(self.scrub(f"{self.name}: {exc}")) from None
        raise AssertionError("unreachable: the last attempt returns")

    def produce(self, jobs: Sequence[Job]) -> Iterator[Outcome]:
        pending = list(reversed(jobs))
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            running: set[Future] = set()
            try:
                while pending or running:
                    while pending and len(running) < self.concurrency:  # at most `concurrency` in flight
                        running.add(pool.submit(self._one, pending.pop()))
                    done, running = wait(running, return_when=FIRST_COMPLETED)
                    for future in done:
                        yield future.result()
            finally:
                for future in running:
                    future.cancel()
