"""The reward of the length example: how close a reply comes to the number of characters its row asks for.

A reward function takes the question text, the completion and the row's fields (its dataset columns plus
`answer`, `qid` and `data_source`) and returns a float; this one reads the row's `length` column:

    reward = max(0, 1 - |len(completion) - length| / length)

so an exact reply scores 1 and one off by half the length scores 0.5. The run names it with
`reward.fn: docs/examples/length/reward.py:reward` (configs/length-cpu.yaml).
"""


def reward(prompt: str, completion: str, fields: dict) -> float:
    target = int(fields["length"])
    return max(0.0, 1.0 - abs(len(completion.strip()) - target) / target)
