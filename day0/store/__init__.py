"""Identity and storage: one checkpoint's identity and results location (identity), the object
store (s3), where a SOURCE's files come from (sources) and where day0 keeps a user's state
(paths)."""
