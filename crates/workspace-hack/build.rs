// Empty: its presence makes cargo resolve this crate's build dependencies (Cargo.toml).
fn main() {}
