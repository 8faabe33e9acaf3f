//! The thread pool kernels run on. TensorFlow's C API offers no handle to its intra-op pool
//! (`TF_OpKernelContext` exposes none), so TF kernels run on kernel-core's default pool
//! (rayon, one thread per core). Partitioning is fixed by kernel-core, so results do not
//! depend on it.

use kernel_core::{default_pool, ThreadPool};

pub(crate) fn pool() -> &'static dyn ThreadPool {
    default_pool()
}
