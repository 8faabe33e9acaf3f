//! Errors are values: kernels and shape functions return [`Error`]; each adapter turns it into
//! its framework's error type at the FFI boundary.

use std::fmt;

/// What kind of failure, so an adapter can pick the matching framework error class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// Bad input from the caller: dtype, shape, attribute value, arity.
    InvalidArgument,
    /// A valid request that this op (or this framework surface) does not support.
    Unsupported,
    /// A bug inside polyop (including a caught panic).
    Internal,
}

/// A polyop error: the op it came from and a human-readable message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    pub kind: ErrorKind,
    /// Op name (e.g. `"topk"`); empty until [`Error::in_op`] fills it in.
    pub op: String,
    pub message: String,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn invalid(message: impl Into<String>) -> Self {
        Error {
            kind: ErrorKind::InvalidArgument,
            op: String::new(),
            message: message.into(),
        }
    }
    pub fn unsupported(message: impl Into<String>) -> Self {
        Error {
            kind: ErrorKind::Unsupported,
            op: String::new(),
            message: message.into(),
        }
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Error {
            kind: ErrorKind::Internal,
            op: String::new(),
            message: message.into(),
        }
    }
    /// Attach the op name, keeping an existing one.
    pub fn in_op(mut self, op: &str) -> Self {
        if self.op.is_empty() {
            self.op = op.to_string();
        }
        self
    }
    /// Turn a caught panic payload into an internal error.
    pub fn from_panic(op: &str, payload: Box<dyn std::any::Any + Send>) -> Self {
        let msg = if let Some(s) = payload.downcast_ref::<&str>() {
            (*s).to_string()
        } else if let Some(s) = payload.downcast_ref::<String>() {
            s.clone()
        } else {
            "unknown panic payload".to_string()
        };
        Error::internal(format!(
            "internal error (panic caught at the FFI boundary): {msg}"
        ))
        .in_op(op)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.op.is_empty() {
            write!(f, "polyop: {}", self.message)
        } else {
            write!(f, "polyop.{}: {}", self.op, self.message)
        }
    }
}

impl std::error::Error for Error {}

/// `bail!(invalid, "k={} out of range", k)` style early return.
#[macro_export]
macro_rules! bail {
    ($($arg:tt)*) => {
        return Err($crate::Error::invalid(format!($($arg)*)))
    };
}

/// Run `f`, turning a panic into an [`Error`] of kind `Internal` for `op`. Every adapter calls
/// its kernels through this so no panic ever crosses an FFI boundary.
pub fn catch_panic<T>(op: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r.map_err(|e| e.in_op(op)),
        Err(payload) => Err(Error::from_panic(op, payload)),
    }
}
