"""sourcegate: nightly indexing and evaluation for retrieval that knows when it has no source."""
