"""Building a version: ingest, chunk, embed, validate (what a night turns a corpus into)."""
