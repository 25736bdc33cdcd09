"""Model-agnostic training: the loop, optimizer groups and schedule, checkpoints."""

from seqlab.training.trainer import TrainConfig, Trainer

__all__ = ["TrainConfig", "Trainer"]
