"""Supervised warm-up: base models with partial competence on a builtin task (no Ray, vLLM or DeepSpeed).

RL from verifiable rewards needs a policy that is sometimes right: from a random model every
reward is 0 and every Dr.GRPO advantage r - mean(r) vanishes. `warm_up` makes such a policy on
the spot, deterministically, from a `WarmupSpec`:

1. build the tiny random model of `spec.model` (`models.build_tiny_model`);
2. draw `spec.num_train` questions of the task's **train** split (never the held-out eval part);
   each becomes the sequence `render_prompt(question) + solution_text + <|endoftext|>`, with a
   fraction `spec.label_noise` of the answers replaced once, up front, by a wrong one (one digit
   changed), so the model learns the format, the eos and a noisy mapping;
3. minimise the teacher-forced cross-entropy of the response tokens only,

       L = - (1 / #response tokens) * sum_{i in batch} sum_{t in response_i} log p(y_t | y_<t),

   with AdamW (betas 0.9/0.999, weight decay 0.01), gradient-norm clip 1.0, a linear warm-up of
   `warmup_steps` followed by a cosine decay to `min_lr_ratio * lr`, over `spec.steps` batches of
   `spec.batch_size` sequences taken from a seeded permutation of the train questions
   (a fresh permutation each epoch), the difficulty weighting of `spec.shape_weights` applied by
   drawing with replacement;
4. save float32 safetensors + the char tokenizer + `warmup.json` (spec, fingerprint, losses,
   a hash of the training questions, build seconds).

The same spec gives bit-identical weights (fixed seeds, fixed data order, `spec.threads` torch
threads during training). `evaluate_solve_rate` measures a model the way the RL samplers see it:
`HFEngine` sampling at temperature 1.0 and the project's `Verifier`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from exgrpo.models import TinyModelSpec, build_char_tokenizer, build_tiny_model
from exgrpo.tasks import Task, builtin_task
from exgrpo.templates import TemplateName, render_prompt
from exgrpo.types import Prompt

_WARMUP_FORMAT = 1  # bump when the training procedure changes, so cached warmed models are rebuilt
