"""Moving namespaces between machines: `bundle.py` (export/import of tar.gz bundles with a
manifest and sha256 per file), `transfer.py` (push/pull of bundles through fsspec URLs)."""
