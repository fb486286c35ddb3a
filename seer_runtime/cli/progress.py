"""What a command has done so far, so that Ctrl-C ends it with one accurate line.

``main`` gives every command a :class:`CommandProgress` (``args.progress``); the command says
how many requests it will decode (:meth:`CommandProgress.start`), counts those it finished
(:meth:`CommandProgress.advance`) and names each file it wrote (:meth:`CommandProgress.wrote`).
On ``KeyboardInterrupt`` ``main`` prints :meth:`CommandProgress.interrupted` and exits with 130,
without a traceback. Results are written atomically (``seer_runtime.files``), so a file that
is not listed as written does not exist in a partial form.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class CommandProgress:
    """total: requests the command will decode (None until known); done: requests finished;
    outputs: the files it means to write; written: those written; stage: what it was doing
    when it had not started decoding yet (``"loading the model"``)."""

    total: int | None = None
    done: int = 0
    outputs: list[str] = field(default_factory=list)
    written: list[str] = field(default_factory=list)
    stage: str = "starting"

    def start(self, total: int, *, stage: str = "decoding") -> None:
        self.total, self.done, self.stage = total, 0, stage

    def advance(self, requests: int) -> None:
        self.done += requests

    def wrote(self, path) -> None:
        self.written.append(str(path))

    def interrupted(self) -> str:
        """One line: where the command stopped and what it left on disk."""
        if self.total is None:
            where = f"interrupted while {self.stage}"
        else:
            where = f"interrupted after {self.done} of {self.total} requests"
        if not self.written:
            return f"{where}; nothing written"
        missing = [p for p in self.outputs if p not in self.written]
        return f"{where}; wrote {', '.join(self.written)}" + (f"; not written: {', '.join(missing)}" if missing else "")
