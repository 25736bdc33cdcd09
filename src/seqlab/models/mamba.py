"""State-space language models on the shared backbone (``seqlab.models.lm``): Mamba, Mamba-2 and S4D presets.

    tokens -> embedding -> n_layers x [x + mixer(rmsnorm(x))] -> rmsnorm -> head (tied)       # Mamba, Mamba-2
    tokens -> embedding -> n_layers x [x + s4d(rmsnorm(x)); x + mlp(rmsnorm(x))] -> ...          # S4D

Mamba (Gu & Dao 2023, arXiv 2312.00752) has no channel mixer: the block's gated expansion (expand = 2,
so about 3·expand·d² parameters per layer) plays the MLP's part, and the paper stacks twice as many
Mamba blocks as a Transformer has layers at the same width (``d_ff=0`` here). This is also the layout of
Hugging Face's ``MambaForCausalLM`` (``seqlab.interop.from_hf`` converts it: RMSNorm with eps 1e-5). Mamba-2
(Dao & Gu 2024, arXiv 2405.21060) keeps that layout (``Mamba2ForCausalLM``) with its SSD block.
S4D (Gu et al. 2022, arXiv 2206.11893) is an LTI mixer with a small output GLU; it keeps the MLP, as the
S4/S4D language-model blocks do.

Sizes: ``mamba-tiny`` ≈ 1.4M, ``mamba-small`` ≈ 5.3M, ``mamba2-tiny`` ≈ 1.5M, ``mamba2-small`` ≈ 5.3M,
``s4d-tiny`` ≈ 1.5M, ``s4d-small`` ≈ 5.7M parameters at vocab 256 (``seqlab.models.count_parameters`` gives
the exact numbers). The ``test-*`` presets are for CI.

The mixers, both views of the LTI SSM, the selective scan and its derivation: ``seqlab.layers.ssm``,
``seqlab.layers.scan``, docs/scan.md.
"""

from __future__ import annotations

from typing import Any

_MAMBA = {
    "mixer": "mamba",
    "d_ff": 0,
    "norm": "rmsnorm",
    "mixer_config": {"d_state": 16, "d_conv": 4, "expand": 2},
}
# the block norms' eps equal to the gated norm's, as Mamba2ForCausalLM has them (one layer_norm_epsilon)
_MAMBA2 = {**_MAMBA, "mixer": "mamba2", "norm_eps": 1e-5, "mixer_config": {"d_state": 64, "headdim": 16}}
_S4D = {"mixer": "s4d", "mlp": "gelu", "norm": "rmsnorm", "mixer_config": {"d_state": 64}}

PRESETS: dict[str, dict[str, Any]] = {
    "mamba-tiny": {**_MAMBA, "d_model": 128, "n_layers": 12},
    "mamba-small": {**_MAMBA, "d_model": 256, "n_layers": 12},
    "mamba2-tiny": {**_MAMBA2, "d_model": 128, "n_layers": 12},
    "mamba2-small": {**_MAMBA2, "d_model": 256, "n_layers": 12},
    "s4d-tiny": {**_S4D, "d_model": 128, "n_layers": 8},
    "s4d-small": {**_S4D, "d_model": 256, "n_layers": 8},
    "test-mamba": {**_MAMBA, "d_model": 32, "n_layers": 2, "mixer_config": {"d_state": 8}},
    "test-mamba2": {**_MAMBA2, "d_model": 32, "n_layers": 2, "mixer_config": {"d_state": 8, "headdim": 8}},
    "test-s4d": {**_S4D, "d_model": 32, "n_layers": 2, "mixer_config": {"d_state": 8}},
}
"""Family "lm" presets: literal LMConfig fields."""
