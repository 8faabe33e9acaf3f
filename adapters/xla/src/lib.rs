//! polyop adapter for xla: not yet implemented.
