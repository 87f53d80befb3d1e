"""Index versions over time: manifests, bound verdicts, promotions, the writer lock, retention."""
