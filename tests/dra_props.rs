//! Property tests of kubelet's DRA state as an input (bounded; `GPUFENCE_FUZZ_CASES` raises the
//! number of cases):
//! * a state written as kubelet writes it (any shape, any claims) parses back to the same value;
//! * any change to the Data string that leaves the recorded checksum is refused;
//! * changing any one byte of the file never yields a different accepted state;
//! * arbitrary bytes never panic the parser, and its errors are one short line;
//! * a pod's CDI ids are exactly those of the claims that list the pod.

mod prop_support;

use std::collections::BTreeSet;

use gpufence::kubelet::dra::{
    Claim, Device, DraState, DriverDevices, Layout, ListKey, Problem, file_json,
};
use prop_support::cases;
use proptest::prelude::*;

/// Strings kubelet could record: names and UIDs, plus characters Go escapes (`<>&"\`, U+2028)
/// and any printable Unicode.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z0-9][a-z0-9.-]{0,10}",
        Just("p1".to_string()),
        Just("p2".to_string()),
        "[a-z]{1,3}[<>&\"\\\\\u{2028}é]{1,3}",
        "[^\\p{C}]{1,8}",
    ]
}

fn cdi_id() -> impl Strategy<Value = String> {
    (
        "[a-z]{1,5}\\.[a-z]{2,3}",
        "[a-z]{1,6}",
        "[a-zA-Z0-9_.:-]{1,10}",
    )
        .prop_map(|(vendor, class, name)| format!("{vendor}/{class}={name}"))
}

fn list<S: Strategy<Value = String>>(s: S) -> impl Strategy<Value = Option<Vec<String>>> {
    prop::option::of(prop::collection::vec(s, 0..3))
}

fn device(share_id: bool) -> impl Strategy<Value = Device> {
    (
        text(),
        text(),
        prop::option::of("[0-9a-f]{8}"),
        list(text()),
        list(cdi_id()),
    )
        .prop_map(
            move |(pool, device, share, request_names, cdi_device_ids)| Device {
                pool,
                device,
                share_id: share.filter(|_| share_id),
                request_names,
                cdi_device_ids,
            },
        )
}

fn claim(share_id: bool) -> impl Strategy<Value = Claim> {
    (
        text(),
        text(),
        prop::option::of(prop::collection::btree_set(text(), 0..3)),
        prop::option::of(prop::collection::btree_map(
            text(),
            prop::option::of(prop::collection::vec(device(share_id), 0..3)),
            0..3,
        )),
    )
        .prop_map(|(name, namespace, pods, drivers)| Claim {
            uid: String::new(),
            name,
            namespace,
            pod_uids: pods.map(|p| p.into_iter().collect()),
            drivers: drivers.map(|m| {
                m.into_iter()
                    .map(|(driver, devices)| DriverDevices { driver, devices })
                    .collect()
            }),
        })
}

/// A state as kubelet writes it: claims with distinct UIDs and names, maps sorted.
fn state() -> impl Strategy<Value = DraState> {
    (any::<bool>(), any::<bool>()).prop_flat_map(|(claim_list, share_id)| {
        prop::option::of(prop::collection::vec(claim(share_id), 0..4)).prop_map(move |claims| {
            let claims = claims.map(|cs| {
                let mut seen = BTreeSet::new();
                cs.into_iter()
                    .filter(|c| seen.insert((c.namespace.clone(), c.name.clone())))
                    .enumerate()
                    .map(|(i, c)| Claim {
                        uid: format!("uid-{i}"),
                        ..c
                    })
                    .collect::<Vec<_>>()
            });
            let has_device = claims
                .iter()
                .flatten()
                .any(|c| c.devices().next().is_some());
            DraState {
                layout: Layout {
                    list_key: if claim_list {
                        ListKey::ClaimInfoStateList
                    } else {
                        ListKey::Entries
                    },
                    share_id: share_id && has_device,
                },
                claims,
                checksum: 0,
            }
            .seal()
        })
    })
}

proptest! {
    #![proptest_config(cases(256))]

    #[test]
    fn written_as_kubelet_writes_it_parses_back(s in state()) {
        let json = s.to_json();
        let back = DraState::parse(json.as_bytes());
        prop_assert_eq!(back, Ok(s.clone()), "{}", json);
    }

    #[test]
    fn a_changed_data_byte_with_the_old_checksum_is_refused(
        s in state(),
        at in any::<prop::sample::Index>(),
        to in 0x20u8..0x7f,
    ) {
        let mut data = s.render_data().into_bytes();
        let ascii: Vec<usize> = (0..data.len()).filter(|&i| data[i].is_ascii()).collect();
        let i = ascii[at.index(ascii.len())];
        prop_assume!(data[i] != to);
        data[i] = to;
        let data = String::from_utf8(data).expect("ASCII for ASCII keeps UTF-8");
        let forged = file_json(&data, s.checksum);
        let got = DraState::parse(forged.as_bytes());
        prop_assert!(
            matches!(got, Err(Problem::Checksum { .. })),
            "{:?} for {}", got, forged
        );
    }

    #[test]
    fn a_changed_file_byte_never_yields_another_accepted_state(
        s in state(),
        at in any::<prop::sample::Index>(),
        to in any::<u8>(),
    ) {
        let mut bytes = s.to_json().into_bytes();
        let i = at.index(bytes.len());
        prop_assume!(bytes[i] != to);
        bytes[i] = to;
        if let Ok(other) = DraState::parse(&bytes) {
            prop_assert_eq!(other, s);
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic_and_errors_are_one_short_line(
        bytes in prop_oneof![
            prop::collection::vec(any::<u8>(), 0..200),
            state().prop_map(|s| {
                // Valid JSON of the right shape with anything at all in Data.
                s.to_json().replace("DRACheckpoint", "DRA\\u0000\\n")
                    .into_bytes()
            }),
            "\\{\"Data\":\"[ -~]{0,40}\",\"Checksum\":[0-9]{1,11}\\}".prop_map(String::into_bytes),
        ]
    ) {
        if let Err(p) = DraState::parse(&bytes) {
            let line = p.at(std::path::Path::new("/s")).to_string();
            prop_assert!(!line.contains('\n') && !line.contains('\r'), "{}", line);
            prop_assert!(line.chars().count() < 400, "{}", line);
        }
    }

    #[test]
    fn a_pods_cdi_ids_are_those_of_the_claims_listing_it(s in state(), pod in text()) {
        let want: BTreeSet<&str> = s
            .claims()
            .iter()
            .filter(|c| c.pod_uids.iter().flatten().any(|p| *p == pod))
            .flat_map(|c| c.devices())
            .flat_map(|(_, d)| d.cdi_device_ids.iter().flatten().map(String::as_str))
            .collect();
        let got = s.cdi_ids_for_pod(&pod);
        prop_assert_eq!(got.iter().copied().collect::<BTreeSet<_>>(), want);
        prop_assert!(got.windows(2).all(|w| w[0] < w[1]), "sorted, no repeats");
        for c in s.claims_for_pod(&pod) {
            prop_assert!(c.has_pod(&pod));
            for r in ["", "gpu", "a/b"] {
                let ids = c.cdi_ids_for_request(r);
                prop_assert!(ids.iter().all(|id| got.contains(id)));
            }
        }
    }
}

/// The cargo-fuzz seeds are what their names say; the ShareID seed, written by a separate
/// writer (Python's json, Go's field order), renders back byte for byte.
#[test]
fn fuzz_seeds_are_what_they_say() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/dra_state");
    let mut seen = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let path = e.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let bytes = std::fs::read(&path).unwrap();
        let got = DraState::parse(&bytes);
        if name.starts_with("data-only-") {
            let text = String::from_utf8(bytes).unwrap();
            let sealed = file_json(&text, gpufence::kubelet::dra::checksum(&text));
            let s = DraState::parse(sealed.as_bytes()).unwrap();
            assert_eq!(s.render_data(), text, "{name}");
        } else if name.contains("corrupt") {
            assert!(matches!(got, Err(Problem::Checksum { .. })), "{name}");
        } else if name.starts_with("old-format") {
            assert_eq!(got, Err(Problem::OldFormat), "{name}");
        } else {
            let s = got.unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(s.to_json().as_bytes(), bytes.as_slice(), "{name}");
            if name.contains("shareid") {
                assert!(s.layout.share_id);
                assert_eq!(s.layout.list_key, ListKey::ClaimInfoStateList);
            }
        }
        seen += 1;
    }
    assert!(seen >= 8, "{seen} seeds in {}", dir.display());
}
