//! Intentionally empty. Its dependencies (Cargo.toml) give every build of the stock libraries
//! the same features, so cargo builds the crates they share once, not once per build.
