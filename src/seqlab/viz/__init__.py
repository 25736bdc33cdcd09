"""Pictures of what the models do: gradient flow, later attention maps and positional encodings."""
