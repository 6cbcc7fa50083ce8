"""Settings of `nmt serve`: where it listens, how it batches, and what it accepts. A plain
dataclass without torch or the web framework, so `nmt --help` stays fast; the CLI flags,
their defaults and their help come from these fields. The defaults suit a laptop: loopback
only, and requests small enough that one cannot hold the model for long.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nmt.errors import NmtError


def _f(default: object, help: str) -> object:
    return field(default=default, metadata={"help": help})


@dataclass
class ServeConfig:
    """How `nmt serve` listens, batches and limits requests."""

    host: str = _f("127.0.0.1", "Address to listen on; 127.0.0.1 serves this machine only, 0.0.0.0 every network it is on.")
    port: int = _f(8000, "TCP port to listen on.")
    batch_window_ms: float = _f(
        10.0, "How long a model call waits for more requests to share it (milliseconds), counted from the first "
              "waiting request's arrival or the end of the previous call, whichever is later; "
              "requests that arrive while the model is busy share the next call.")
    max_batch_sentences: int = _f(
        64, "Sentences per model call at most; a big request is spread over several calls, "
            "taking turns with the other waiting requests, so small requests are not stuck behind it.")
    max_chars: int = _f(20000, "Characters per request at most (all its sentences together); more gets a 413.")
    max_lines: int = _f(256, "Sentences per request at most; more gets a 413.")
    max_beam: int = _f(16, "Largest beam a request may ask for; more gets a 400.")

    def validate(self) -> None:
        if not 0 <= self.port <= 65535:
            raise NmtError(f"--port must be between 0 and 65535, not {self.port}")
        if self.batch_window_ms < 0:
            raise NmtError(f"--batch-window-ms must not be negative, not {self.batch_window_ms}")
        for name in ("max_batch_sentences", "max_chars", "max_lines", "max_beam"):
            if getattr(self, name) < 1:
                raise NmtError(f"--{name.replace('_', '-')} must be at least 1, not {getattr(self, name)}")

    @property
    def max_body_bytes(self) -> int:
        """The largest request body read: max_chars as JSON escapes (12 bytes for a \\ud83d\\ude00 pair) plus room."""
        return 12 * self.max_chars + 65536
