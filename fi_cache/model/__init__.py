"""Pure data model of FlashInfer autotune caches: keys, v1 files, v2 stores, fingerprints."""
