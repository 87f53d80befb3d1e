"""A version's records: manifests, stamps, the promotions log, the code version, the object store, lock holders."""
