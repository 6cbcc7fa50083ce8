"""Settings of `nmt serve`: where it listens, how it batches, and what it accepts. A plain
dataclass without torch or the web framework, so `nmt --help` stays fast; the CLI flags,
their defaults and their help come from these fields. The defaults suit a laptop: loopback
only, and requests small enough that one cannot hold the model for long.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

from nmt.errors import NmtError
from nmt.settings import POSITIVE, Range, check_ranges, setting
from nmt.inference.config import MAX_BEAM


@dataclass
class ServeConfig:
    """How `nmt serve` listens, batches and limits requests."""

    host: str = setting("127.0.0.1", "Address to listen on; 127.0.0.1 serves this machine only, 0.0.0.0 every network it is on.")
    port: int = setting(8000, "TCP port to listen on.")
    batch_window_ms: float = setting(
        10.0, "How long a model call waits for more requests to share it (milliseconds), counted from the first "
              "waiting request's arrival or the end of the previous call, whichever is later; "
              "requests that arrive while the model is busy share the next call.")
    max_batch_sentences: int = setting(
        64, "Sentences per model call at most; a big request is spread over several calls, "
            "taking turns with the other waiting requests, so small requests are not stuck behind it.")
    max_chars: int = setting(20000, "Characters per request at most (its texts, prefixes and constraint phrases "
                                    "together); more gets a 413.")
    max_lines: int = setting(256, "Sentences per request at most; more gets a 413.")
    max_beam: int = setting(16, f"Largest beam a request may ask for (at most {MAX_BEAM}); more gets a 400.")
    max_phrases: int = setting(
        8, "Constraint phrases per sentence at most; more gets a 400. Each unmet phrase adds candidates to every "
           "hypothesis at every step of the constrained search, so phrases add to its work; a glossary rarely puts "
           "more than a few terms in one sentence.")
    max_phrase_chars: int = setting(
        200, "Characters of a sentence's constraint phrases together at most; more gets a 400. "
             "Phrases are terms (8 of 25 characters fit), not sentences.")
    shutdown_grace_s: float = setting(
        30.0, "After SIGTERM or Ctrl-C, how long the requests being translated have to finish (seconds); then they "
              "get a 503, as do at once the requests that have not started. The model stops after the call in "
              "progress (at most --max-batch-sentences sentences), so the server exits within this plus that call.")

    RANGES: ClassVar[dict[str, Range]] = {
        "port": Range(0, 65535),
        # A window longer than a minute is no longer batching, only waiting.
        "batch_window_ms": Range(0.0, 60_000.0),
        "max_batch_sentences": POSITIVE, "max_chars": POSITIVE, "max_lines": POSITIVE, "max_beam": Range(1, MAX_BEAM),
        "max_phrases": POSITIVE, "max_phrase_chars": POSITIVE,
        # Longer than an hour is no longer a graceful shutdown; orchestrators kill far sooner.
        "shutdown_grace_s": Range(0.0, 3600.0),
    }
    """The range of every numeric setting (`nmt.settings`)."""

    def validate(self, beam: Optional[int] = None) -> None:
        """Refuse settings outside their range; with `beam` (the --beam requests default to),
        also a default beam no request could ask for."""
        check_ranges(self)
        if beam is not None and beam > self.max_beam:
            raise NmtError(f"--beam {beam} is more than --max-beam {self.max_beam}, the largest a request may ask for; "
                           f"raise --max-beam (at most {MAX_BEAM}) or lower --beam")

    @property
    def max_body_bytes(self) -> int:
        """The largest request body read: max_chars as JSON escapes (12 bytes for a \\ud83d\\ude00 pair) plus room."""
        return 12 * self.max_chars + 65536
