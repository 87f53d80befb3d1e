"""sourcegate pipeline library: pure steps over Parquet paths, and the search backends."""
