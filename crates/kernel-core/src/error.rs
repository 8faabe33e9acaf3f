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
    /// The op's registry namespace (`"polyop"` for the stock ops); empty reads as `polyop`.
    pub namespace: &'static str,
    pub message: String,
}

/// What [`Error::in_op`] and [`catch_panic`] accept: an op name (namespace `polyop`) or an
/// [`crate::OpDef`] (its registry's namespace).
pub trait OpRef {
    fn op_name(&self) -> &str;
    fn op_namespace(&self) -> &'static str;
}

impl OpRef for &str {
    fn op_name(&self) -> &str {
        self
    }
    fn op_namespace(&self) -> &'static str {
        ""
    }
}

/// `(op name, namespace)`.
impl OpRef for (&str, &'static str) {
    fn op_name(&self) -> &str {
        self.0
    }
    fn op_namespace(&self) -> &'static str {
        self.1
    }
}

impl OpRef for &crate::OpDef {
    fn op_name(&self) -> &str {
        self.name
    }
    fn op_namespace(&self) -> &'static str {
        self.namespace
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn invalid(message: impl Into<String>) -> Self {
        Error {
            kind: ErrorKind::InvalidArgument,
            op: String::new(),
            namespace: "",
            message: message.into(),
        }
    }
    pub fn unsupported(message: impl Into<String>) -> Self {
        Error {
            kind: ErrorKind::Unsupported,
            op: String::new(),
            namespace: "",
            message: message.into(),
        }
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Error {
            kind: ErrorKind::Internal,
            op: String::new(),
            namespace: "",
            message: message.into(),
        }
    }
    /// Attach the op (a name, or an [`crate::OpDef`] with its namespace), keeping an
    /// existing one.
    pub fn in_op(mut self, op: impl OpRef) -> Self {
        if self.op.is_empty() {
            self.op = op.op_name().to_string();
            self.namespace = op.op_namespace();
        } else if self.namespace.is_empty() && self.op == op.op_name() {
            self.namespace = op.op_namespace();
        }
        self
    }
    /// Turn a caught panic payload into an internal error.
    pub fn from_panic(op: impl OpRef, payload: Box<dyn std::any::Any + Send>) -> Self {
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
        let ns = if self.namespace.is_empty() {
            crate::op::DEFAULT_NAMESPACE
        } else {
            self.namespace
        };
        if self.op.is_empty() {
            write!(f, "{ns}: {}", self.message)
        } else {
            write!(f, "{ns}.{}: {}", self.op, self.message)
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
pub fn catch_panic<T, O: OpRef + Copy>(op: O, f: impl FnOnce() -> Result<T>) -> Result<T> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r.map_err(|e| e.in_op(op)),
        Err(payload) => Err(Error::from_panic(op, payload)),
    }
}
