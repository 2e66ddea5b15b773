"""`python -m exgrpo.evaluate --save-completions`: every sampled completion of an evaluation, one JSON line each."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import IO

from actors.sampling import Samples
from exgrpo.core.records import Prompt


class CompletionWriter:
    """`--save-completions`: one JSON line per sampled completion, written to `<path>.tmp` as the
    evaluation goes and moved to `path` when it ends, so a failed evaluation leaves no partial file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tmp = path.with_name(path.name + ".tmp")
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] = self.tmp.open("w")

    def __call__(self, prompt: Prompt, samples: Samples) -> None:
        for j, (text, reward) in enumerate(zip(samples.texts, samples.rewards, strict=True)):
            row = {
                "qid": prompt.qid,
                "data_source": prompt.data_source,
                "prompt": prompt.question,
                "completion": text,
                "reward": reward,
                "sample": j,
            }
            self._file.write(json.dumps(row) + "\n")

    def close(self) -> None:
        self._file.close()
        os.replace(self.tmp, self.path)
