"""seqlab: sequence models from RNNs to Transformers and state-space models, readable and verified."""

__version__ = "0.1.0"
