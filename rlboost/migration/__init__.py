"""Records and codecs for moving in-flight samples between engines (no engine imports)."""
