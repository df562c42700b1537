//! Scheduler pod annotations as dialects: HAMi's `hami.io/vgpu-devices-allocated` (and
//! Volcano's `volcano.sh/vgpu-ids-new` in the same format), the Aliyun
//! gpushare extender's `ALIYUN_COM_GPU_MEM_*` and KAI's NvFractions
//! `nvidia.com/container.<name>.*`. They reach `config.json` through the CRI runtime's pod
//! annotation allow-list (`gpufence runtime configure` writes it), so they are trusted like
//! every annotation; they describe the whole pod, and each reader narrows them to this
//! container (by container name, or by what kubelet recorded for it), agreeing facet by facet
//! with the env dialects like every other pair.

use super::AllocationError;
use super::container_dialects::Part;
use super::input::Inputs;
use crate::config::{Config, Dialect};
use crate::inventory::Inventory;
use crate::kubelet::{ContainerRecord, PodIdentity};

pub mod gpushare_pod;
pub mod hami_mig;
pub mod hami_pod;
pub mod kai_pod;
pub mod koordinator_pod;
mod number;

/// The parts of the enabled scheduler annotation dialects. `record` is kubelet's record of this
/// container (trust-env = "kubelet"), used to tell which container of a pod-wide annotation
/// this one is.
pub fn read(
    inputs: &Inputs,
    inv: &Inventory,
    config: &Config,
    record: Option<&ContainerRecord>,
) -> Result<Vec<Part>, AllocationError> {
    let identity = PodIdentity::from_annotations(&inputs.annotations)
        .ok()
        .flatten();
    let ac = &config.allocation;
    let mut parts = Vec::new();
    if ac.enabled(Dialect::Hami) {
        parts.push(hami_pod::read(inputs, inv, identity.as_ref(), record)?);
    }
    if ac.enabled(Dialect::Gpushare) {
        parts.push(gpushare_pod::read(inputs, inv, config, record)?);
    }
    if ac.enabled(Dialect::Volcano) {
        parts.push(hami_pod::read_volcano(
            inputs,
            inv,
            identity.as_ref(),
            record,
        )?);
    }
    if ac.enabled(Dialect::Kai) {
        parts.push(kai_pod::read(inputs, inv, identity.as_ref())?);
    }
    Ok(parts)
}
