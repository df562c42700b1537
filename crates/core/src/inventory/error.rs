//! Why the inventory could not be taken: [`InventoryError`], one line naming the library or file.

use std::path::PathBuf;

/// Why the inventory could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum InventoryError {
    /// NVML could not be loaded, initialised or queried.
    #[error("NVML {library}: {message}")]
    Nvml { library: String, message: String },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a character device")]
    NotCharDevice { path: PathBuf },
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
}

impl From<InventoryError> for crate::exit::Exit {
    fn from(e: InventoryError) -> Self {
        // Every inventory failure is the driver's or the node's, not the caller's input.
        crate::exit::Exit::env(e)
    }
}
