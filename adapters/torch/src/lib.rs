//! polyop adapter for torch: not yet implemented.
