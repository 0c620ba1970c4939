"""Checkpoints verified without running their code (rule 7): by hash, by structure, or loaded."""
