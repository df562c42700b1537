//! kubelet's DRA state (`dra_manager_state`, a host file gpufence trusts for DRA claims): strict
//! parse + CRC-32. Each input is tried twice: as the whole file (the checksum stands in the way
//! of almost every mutation, as it should), and as the `Data` string sealed with its correct
//! checksum, which lets the fuzzer reach the inner parser and the value checks.
//! Invariants: no panic; an accepted state re-serialises (sealed anew) to one that parses to the
//! same value;
//! a pod's CDI ids are exactly those of the claims listing the pod, each `vendor/class=name`;
//! errors are one short line.
#![no_main]

use libfuzzer_sys::fuzz_target;

use gpufence::kubelet::dra::{self, DraState};

fn check(bytes: &[u8]) {
    match DraState::parse(bytes) {
        Ok(s) => {
            // Data need not be byte-canonical (key order, spaces, escapes: the checksum covers
            // the bytes as written), so the re-serialisation is sealed anew.
            let sealed = s.clone().seal();
            let again = DraState::parse(sealed.to_json().as_bytes()).expect("re-serialised state");
            assert_eq!(again, sealed);
            for c in s.claims() {
                for pod in c.pod_uids.iter().flatten() {
                    let ids = s.cdi_ids_for_pod(pod);
                    assert!(c.cdi_ids().iter().all(|id| ids.contains(id)));
                    for id in &ids {
                        assert!(id.contains('/') && id.contains('='), "{id}");
                        assert!(
                            s.claims_for_pod(pod)
                                .iter()
                                .any(|o| o.cdi_ids().contains(id)),
                            "{id} of no claim of {pod}"
                        );
                    }
                }
            }
        }
        Err(p) => {
            let line = p
                .at(std::path::Path::new("/var/lib/kubelet/dra_manager_state"))
                .to_string();
            assert!(!line.contains('\n') && !line.contains('\r'), "{line}");
            assert!(line.chars().count() < 400, "{line}");
        }
    }
}

fuzz_target!(|data: &[u8]| {
    check(data);
    if let Ok(text) = std::str::from_utf8(data) {
        check(dra::file_json(text, dra::checksum(text)).as_bytes());
    }
});
