"""Training answer models: the data and pairs they learn from, the training loop, the export, their evaluation, retraining by recipe."""
