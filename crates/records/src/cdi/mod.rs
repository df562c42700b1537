//! Container Device Interface, the format only: the spec types (shared by the generator, the `cdi`
//! allocation dialect and the plan, whose edits have CDI's `containerEdits` shape), qualified names,
//! validation, the minimum `cdiVersion`, and loading spec directories. The generator is
//! `gpufence-cdigen`.

pub mod parse;
pub mod spec;

pub use parse::{CdiError, QualifiedName, load_spec_dirs};
pub use spec::{ContainerEdits, Device, DeviceNodeEdit, HookEdit, LoadedSpec, MountEdit, Spec};

/// The kind of the devices gpufence describes.
pub const KIND: &str = "gpufence.dev/gpu";
