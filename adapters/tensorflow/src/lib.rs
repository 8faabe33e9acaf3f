//! polyop adapter for tensorflow: not yet implemented.
