"""Writes the length example's data: `train.jsonl` and `eval.jsonl` next to this file (seeded, so the
checked-in files are what it writes; tests/integration/test_reward_example.py checks that).

Each row is a question asking for a reply of `length` characters and that `length` as its own column;
there is no gold answer (the reward reads `length`). Held-out rows ask for the same lengths (2-12) in
other words, so no question text is shared with training.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).parent
LENGTHS = range(2, 13)
TRAIN_WORDS = ["Reply", "Answer", "Respond", "Write back"]
EVAL_WORDS = ["Say something", "Type a line"]


def rows(words: list[str], n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        length = rng.choice(LENGTHS)
        out.append(
            {
                "qid": f"len-{seed}-{i:04d}",
                "question": f"{rng.choice(words)} in {length} characters.",
                "length": length,
            }
        )
    return out


def main() -> None:
    for name, words, n, seed in (("train", TRAIN_WORDS, 400, 0), ("eval", EVAL_WORDS, 64, 1)):
        text = "".join(json.dumps(r) + "\n" for r in rows(words, n, seed))
        (HERE / f"{name}.jsonl").write_text(text)


if __name__ == "__main__":
    main()
