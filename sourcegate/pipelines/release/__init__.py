"""Release policy over index versions: bound verdicts, the served decision, the writer lock, run retention."""
