"""The transport refuses a vLLM whose trainer-side weight-transfer API it was not written against."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.vllm


def test_only_the_supported_vllm_is_accepted() -> None:
    vllm_api = pytest.importorskip("exgrpo.transport.vllm_api")
    vllm_api.check_vllm_version("0.32.0")
    vllm_api.check_vllm_version("0.32.0+cpu")  # a local build tag is the same release
    for other in ("0.31.2", "0.33.0", "0.11.0"):
        with pytest.raises(ImportError, match=r"vllm==0\.32\.0.*constraints/gpu\.txt"):
            vllm_api.check_vllm_version(other)
