"""Sequence-level knowledge distillation (Kim and Rush, 2016) and back-translation (Edunov et
al., 2018): a teacher translates a corpus into a student's training data (`nmt distill`)."""
