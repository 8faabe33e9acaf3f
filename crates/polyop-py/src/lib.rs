//! polyop Python core: not yet implemented.
