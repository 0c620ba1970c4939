"""The instance's side of a sweep kept in an object store (`storage: s3://...`)."""
