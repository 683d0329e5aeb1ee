"""The training program: model, precision, inner optimizer steps, footprint, checkpoints."""
