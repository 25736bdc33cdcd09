"""Pictures of what the models do: gradient flow, attention maps and positional encodings."""

GRADIENT_CELLS = ("rnn", "lstm", "gru")
"""The recurrent cells whose hidden state the gradient-flow plot reads (through their ``test-{cell}-lm`` presets)."""
