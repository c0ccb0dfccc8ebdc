"""Llama 3's RoPE parameters come back exactly from the `rope_freqs` tensor llama.cpp's converter writes, for the
shapes of the Llama 3.x releases and for tiny test models; a tensor that is not Llama 3's scaling is not fitted."""

from __future__ import annotations

import numpy as np
import pytest

from engines.pytorch.gguf_config import _fit_llama3, llama3_factors


@pytest.mark.parametrize(("base", "dim", "factor", "original"), [
    (500000.0, 128, 8.0, 8192),  # Llama 3.1 8B / 70B / 405B
    (500000.0, 64, 32.0, 8192),  # Llama 3.2 1B
    (500000.0, 128, 32.0, 8192),  # Llama 3.2 3B
    (500000.0, 16, 8.0, 32),  # tests/family_models.py's llama3_rope
    (10000.0, 64, 8.0, 256),
    (10000.0, 64, 4.0, 2048),
])
def test_parameters_recovered_from_the_converters_tensor(base: float, dim: int, factor: float, original: int) -> None:
    factors = llama3_factors(base, dim, factor, 1.0, 4.0, original)
    found = _fit_llama3(factors, base, dim)
    assert found is not None
    assert np.array_equal(llama3_factors(base, dim, found["factor"], found["low_freq_factor"],
                                         found["high_freq_factor"], found["original_max_position_embeddings"]),
                          factors)
    if ((factors > 1) & (factors < factor)).any():  # a smoothed frequency pins the original context down
        assert found == {"factor": factor, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": original}


def test_other_tensors_are_not_fitted() -> None:
    factors = llama3_factors(500000.0, 128, 8.0, 1.0, 4.0, 8192)
    assert _fit_llama3(factors * 1.001, 500000.0, 128) is None  # not the converter's values
    assert _fit_llama3(np.ones(64, dtype=np.float32), 500000.0, 128) is None  # no scaling
    assert _fit_llama3(factors[:32], 500000.0, 128) is None  # the wrong head size
    assert _fit_llama3(llama3_factors(500000.0, 128, 8.0, 2.0, 3.0, 8192), 500000.0, 128) is None  # other factors
